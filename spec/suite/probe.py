"""Importing an implementation in a child process before anything imports it in-process.

An implementation's import runs the user's code.  In-process, an import that raises is one line
(``minibert_spec.protocol.load_impl``), but one that ends the process (``os._exit(0)``, an exit from
a thread), crashes it (a signal) or never returns takes the caller down with it: ``pytest
--minibert-impl`` used to end with status 0 and no output, a verdict of nothing.  The plugin,
``minibert check``, ``check_implementation`` and ``parametrize_with_checks`` (given
``"pkg.mod[:obj]"``) therefore import it in a fresh interpreter first, under a time limit, and
refuse it with the reason :func:`probe_import` returns.

The child imports nothing of this package (it starts in ~0.1 s): it only runs the import and
says that it finished.  An import that *raises* finishes: naming that exception is left to the
in-process load, which has the one-line message.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence

# The child: sys.path as the parent's, the import (and the attribute path), then a word in the
# result file ("finished", "finished OPS" when the object declares ops of its own: the caller then
# reads them in-process, minibert_spec.ops); os._exit skips the implementation's atexit hooks (not
# the import's business).
_CHILD = """\
import importlib, os, sys
spec, result, path = sys.argv[1], sys.argv[2], sys.argv[3]
import json
sys.path[:] = json.loads(path)
module, _, attr = spec.partition(":")
word = "finished"
try:
    obj = importlib.import_module(module)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    if getattr(obj, "OPS", None) is not None:
        word = "finished OPS"
except BaseException:  # raised: the in-process load names it
    pass
with open(result, "w") as f:
    f.write(word)
os._exit(0)
"""


def probe_import(spec: str, timeout: float | None, *, paths: Sequence[str] = ()) -> str | None:
    """Import ``minibert_spec`` (``package.module[:object]``) in a child interpreter with this
    process's ``sys.path`` (``paths`` first); None when the import finishes within ``timeout``
    seconds
    (None: no limit) -- returning or raising --, else the reason it did not, one line."""
    return probe(spec, timeout, paths=paths)[0]


def probe(spec: str, timeout: float | None, *, paths: Sequence[str] = ()
          ) -> tuple[str | None, bool]:
    """:func:`probe_import`'s reason, and whether the imported object has an ``OPS`` (ops of
    its own, minibert_spec.ops: ``minibert check`` then reads them in-process, and an
    implementation without one is never imported by the parent)."""
    module = spec.partition(":")[0]
    path = [os.path.abspath(p or os.curdir) for p in [*paths, *sys.path]]
    with tempfile.TemporaryDirectory(prefix="minibert-probe-") as tmp:
        result = os.path.join(tmp, "result")
        # a session of its own: a hang's children are killed with it
        child = subprocess.Popen([sys.executable, "-c", _CHILD, spec, result,
                                  json.dumps(list(dict.fromkeys(path)))],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            code = child.wait(timeout)
        except subprocess.TimeoutExpired:
            _kill_group(child)
            return f"impl: importing {module!r} did not finish within {timeout:g} s", False
        if os.path.exists(result):
            with open(result) as f:
                return None, f.read().strip() == "finished OPS"
    return ended(f"importing {module!r}", code, "before the import finished"), False


def ended(what: str, code: int, before: str, then: str = "nothing could be checked") -> str:
    """The one-line reason of a child that ended without saying it finished: ``what`` (e.g.
    "importing 'mybert'") killed it (a signal) or ended it with exit status ``code``."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"impl: {what} killed the process ({name})"
    return (f"impl: {what} ended the process with exit status {code} {before} (os._exit, or "
            f"an exit from another thread): {then}")


def _kill_group(child: subprocess.Popen) -> None:
    """The child (still running: its group exists) and whatever it started."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    child.wait()
