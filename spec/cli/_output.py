"""What `minibert check` and the commands beside it (`--many`, `report merge`) share: the
one-line refusal, the HTML output check, the atomic write. Below both, so neither imports the
other (tests/test_architecture.py finds import circles)."""

from __future__ import annotations

import sys
from pathlib import Path

from minibert_spec.suite.report import EXIT_NOT_RUN


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
