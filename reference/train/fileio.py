"""Files of a run directory: atomic writes, content hashes, the run lock, strict JSON.

Every file the trainer writes goes through ``atomic_write`` (a temporary file in the same
directory, flushed and fsync'ed, then renamed over the target, then the directory fsync'ed): a
kill -9 at any moment leaves either the old file or the new one, never a truncated one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile

LOCK_NAME = ".minibert.lock"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_text(text: str) -> str:
    return sha256_bytes(text.encode("utf-8"))


def _fsync_dir(directory: str) -> None:
    """Make the rename itself durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str):
    """Yields a temporary path beside ``path``; on normal exit the file written there is fsync'ed
    and renamed to ``path``, on an exception it is removed (``path`` untouched)."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                               dir=directory)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    _fsync_dir(directory)


def atomic_write(path: str, data: bytes | str) -> None:
    if isinstance(data, str):
        data = data.encode("utf-8")
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(data)


def atomic_write_json(path: str, obj) -> None:
    # allow_nan=False: a NaN in a history would make the file unreadable by strict parsers
    atomic_write(path, json.dumps(obj, allow_nan=False))


def loads_json(name: str, text, *, expect=dict):
    """json.loads with a named ValueError (never a bare JSONDecodeError / TypeError)."""
    if not isinstance(text, (str, bytes)):
        raise ValueError(f"{name}: expected a JSON string, got {type(text).__name__}")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{name}: expected valid JSON, got {e.msg} at line {e.lineno} "
                         f"column {e.colno}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{name}: expected UTF-8 JSON, got undecodable bytes ({e.reason} "
                         f"at offset {e.start})") from None
    if expect is not None and not isinstance(obj, expect):
        raise ValueError(f"{name}: expected a JSON {expect.__name__}, got "
                         f"{type(obj).__name__}")
    return obj


def read_text(name: str, path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except UnicodeDecodeError as e:
        raise ValueError(f"{name}: expected a UTF-8 text file, got undecodable bytes in "
                         f"{path!r} at offset {e.start}") from None


def stale_temporaries(directory: str, names) -> list[str]:
    """The temporary files ``atomic_path`` leaves beside each of ``names`` in ``directory`` when
    the process is killed mid-write (``.<name>.<random>.tmp``): the checkpoint's is 54 MB.
    Only their owner, holding the run lock, may remove them."""
    if not os.path.isdir(directory):
        return []
    prefixes = tuple(f".{n}." for n in names)
    return sorted(os.path.join(directory, f) for f in os.listdir(directory)
                  if f.startswith(prefixes) and f.endswith(".tmp"))


class RunLocked(ValueError):
    """Another live process holds the run directory (a user's situation, not a bug: the CLI
    prints it as one line, exit 2)."""


def _describe_process(pid: str) -> str:
    """``pid N (its command line)`` where /proc shows it, else ``pid N``."""
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as fh:
            argv = [a.decode("utf-8", "replace") for a in fh.read().split(b"\0") if a]
    except (OSError, ValueError):
        return f"pid {pid}"
    return f"pid {pid}: {' '.join(argv)[:200]}" if argv else f"pid {pid}"


class RunLock:
    """An exclusive ``flock`` on ``run_dir/.minibert.lock``: the kernel releases it when the
    holder dies (kill -9 included), so a stale lock never blocks a resume."""

    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, LOCK_NAME)
        self._fh = None

    def acquire(self) -> RunLock:
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock rather than no training
            return self
        fh = open(self.path, "a+")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip()
            fh.close()
            who = _describe_process(holder) if holder else "its pid not yet recorded"
            raise RunLocked(f"run-dir: another training ({who}) is using "
                            f"{os.path.dirname(self.path)!r}; wait for it to finish (or stop "
                            f"it) or choose another --run-dir") from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        if self._fh is not None:
            self._fh.close()  # closing drops the flock
            self._fh = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
