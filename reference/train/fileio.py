"""Files of a run directory: atomic writes, content hashes, the run lock; and the one guarded
reader of the files a user hands over (``read_user_text``, ``read_user_json``: size, encoding
and JSON-depth limits, every problem one line naming the file).

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


# What a file the user hands over may be (a Hugging Face config.json or sharded index,
# tokenizer_config.json, vocab.txt, a tokenizer.json, a checkpoint's JSON metadata): far above
# any real one -- bert-base's tokenizer.json is 0.7 MB, a multilingual vocab.txt 1 MB, and
# their JSON nests under 10 levels -- and far below what exhausts memory or Python's JSON
# decoder, whose recursion ends in a RecursionError near 1000 levels.
MAX_TEXT_BYTES = 64 * 2**20
MAX_JSON_DEPTH = 100
_JSON_NAMES = {dict: "object", list: "array", str: "string"}


def read_user_text(path, what: str, *, max_bytes: int | None = MAX_TEXT_BYTES,
                   empty_ok: bool = False) -> str:
    """The UTF-8 text of a file the user hands over, ``what`` naming what it should be.  Every
    problem is one ValueError naming the file: unreadable (missing, a directory...), larger
    than ``max_bytes`` (None: no limit, for a corpus), empty or blank (unless ``empty_ok``),
    not UTF-8.  The one reader of such files: ``read_user_json`` parses through it."""
    path = os.fspath(path)
    limit = "" if max_bytes is None else f" (the limit is {max_bytes} bytes)"
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if max_bytes is not None and size > max_bytes:
                raise ValueError(f"{path}: expected {what}, got a file of {size} bytes{limit}")
            data = fh.read() if max_bytes is None else fh.read(max_bytes + 1)
    except OSError as e:
        raise ValueError(f"{path}: expected {what}, got an unreadable file "
                         f"({e.strerror or type(e).__name__})") from None
    if max_bytes is not None and len(data) > max_bytes:  # a file that grew, a device
        raise ValueError(f"{path}: expected {what}, got more than {max_bytes} bytes{limit}")
    if not empty_ok and not data.strip():
        raise ValueError(f"{path}: expected {what}, got an empty file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: expected {what} in UTF-8, got undecodable bytes at offset "
                         f"{e.start}") from None


def read_user_json(path, what: str, *, expect=dict):
    """A JSON document (a JSON ``expect``, None: any) from a file the user hands over: the
    limits of ``read_user_text`` and ``loads_json``, every problem one ValueError naming the
    file."""
    return loads_json(os.fspath(path), read_user_text(path, what), expect=expect, what=what)


def loads_json(name: str, text, *, expect=dict, what: str | None = None):
    """json.loads where every failure is one ValueError naming ``name`` (a file, or a field of
    one) and ``what`` was expected: not text, not valid JSON, nested deeper than
    MAX_JSON_DEPTH, not a JSON ``expect`` (None: any) -- never a bare JSONDecodeError,
    TypeError or RecursionError."""
    what = what or "JSON"
    if not isinstance(text, (str, bytes)):
        raise ValueError(f"{name}: expected {what} as JSON text, got {type(text).__name__}")
    too_deep = f"{name}: expected {what} nested at most {MAX_JSON_DEPTH} levels deep, got "
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{name}: expected {what} in valid JSON, got {e.msg} at line "
                         f"{e.lineno} column {e.colno}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{name}: expected {what} in UTF-8 JSON, got undecodable bytes "
                         f"({e.reason} at offset {e.start})") from None
    except RecursionError:
        raise ValueError(too_deep + "more than the JSON decoder can follow") from None
    depth = json_depth(obj)
    if depth > MAX_JSON_DEPTH:
        raise ValueError(too_deep + f"{depth}")
    if expect is not None and not isinstance(obj, expect):
        raise ValueError(f"{name}: expected {what} (a JSON {_JSON_NAMES.get(expect, expect)}), "
                         f"got a JSON {_JSON_NAMES.get(type(obj), type(obj).__name__)}")
    return obj


def json_depth(obj, stop: int = MAX_JSON_DEPTH) -> int:
    """How deep ``obj``'s arrays and objects nest (a scalar 0, ``{}`` 1), iteratively; counting
    stops just past ``stop``."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, (dict, list)):
            deepest = max(deepest, d)
            if deepest > stop:
                break
            stack.extend((v, d + 1) for v in (o.values() if isinstance(o, dict) else o))
    return deepest


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
