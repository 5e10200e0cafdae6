"""What `minibert check` and the commands beside it (`--many`, `report merge`) share: the
one-line refusal, the HTML output check, the atomic write. Below both, so neither imports the
other (tests/test_architecture.py finds import circles)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from minibert_spec.suite.report import EXIT_NOT_RUN

# the console colour of each cell and row verdict (minibert_spec.suite.report's words)
STYLE = {"ok": "green", "FAIL": "red", "n/a": "dim", "error": "red", "not run": "yellow",
         "not judged": "red", "thin": "yellow"}


def _fail(msg: str, code: int = EXIT_NOT_RUN) -> int:
    print(f"minibert check: {msg}", file=sys.stderr)
    return code


def html_refused(output: str | None) -> str | None:
    """Why an HTML report cannot be written to ``-o`` (no folder given, the report extra
    missing, a folder that is not ours), said before any work; None when it can."""
    if not output:
        return "--format html: expected -o DIR, the folder to write the report into"
    from minibert_spec.report import check_output, require

    try:
        require()
        check_output(Path(output))
    except ValueError as e:
        return str(e)
    return None


def _write(path: str, text: str) -> None:
    from minibert_reference.train.fileio import atomic_write

    target = Path(path)
    if target.parent and not target.parent.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(str(target), text + "\n")


def emit(args, data: dict, show, html) -> None:
    """A report as ``--format`` and ``-o`` ask (minibert check, ``--many``, report merge):
    json, the JSON to ``-o`` or stdout; else ``show()`` (the table), then html, ``html()``
    (the page into ``-o``), or table, the JSON to ``-o`` if given."""
    text = json.dumps(data, indent=1)
    if args.format == "json":
        if args.output:
            _write(args.output, text)
        else:
            print(text)
        return
    show()
    if args.format == "html":
        html()
    elif args.output:
        _write(args.output, text)


def database_refused(flag: str, path: str, *, write: bool) -> str | None:
    """Why ``path`` cannot be the example-database directory ``flag`` names, said before any
    check runs (a run that could not save its failures must not read as one that did); None
    when it can.  ``write`` (``--database``): it is created if missing, and a file is written
    and removed there -- the one test that holds for root, read-only mounts and immutable
    directories alike.  Read only (``--replay``): a missing directory is nothing to replay
    (a first CI run, before the cache exists), a file or a path through a file is refused."""
    import os
    import tempfile

    target = Path(path)
    if target.exists() and not target.is_dir():
        return f"{flag} {path}: is a file, not a directory (Hypothesis's example database)"
    if _under_a_file(target):
        return f"{flag} {path}: {_under_a_file(target)}"
    if not write:
        if target.is_dir():
            try:
                os.listdir(target)
            except OSError as e:
                return f"{flag} {path}: cannot be read ({e.strerror})"
        return None
    try:
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target, prefix=".minibert-write-test-"):
            pass
    except OSError as e:
        return f"{flag} {path}: cannot be written ({e.strerror or e}): its failures would be lost"
    return None


def databases_refused(args) -> str | None:
    """The first of ``--database`` and ``--replay`` that cannot be used (minibert check and
    ``--many`` alike), in one line; None when all can."""
    said = [database_refused("--database", args.database, write=True)] if args.database else []
    said += [database_refused("--replay", d, write=False) for d in args.replay]
    return next((s for s in said if s), None)


def file_refused(flag: str, path: str) -> str | None:
    """Why ``path`` cannot be the file ``flag`` writes -- a directory (``-o .``), a path under
    a file --, said before the work whose result it would hold; None when it can be."""
    target = Path(path)
    if target.is_dir():
        return f"{flag} {path}: is a directory; expected the path of a file to write"
    if _under_a_file(target):
        return f"{flag} {path}: {_under_a_file(target)}"
    return None


def _under_a_file(target: Path) -> str | None:
    """'lies under F, which is a file' where the nearest existing folder above ``target`` is
    a file (nothing can be created there); else None."""
    up = next((p for p in target.absolute().parents if p.exists()), None)
    if not target.exists() and up is not None and not up.is_dir():
        return f"lies under {up}, which is a file, not a directory"
    return None
