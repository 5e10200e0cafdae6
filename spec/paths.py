"""Where the project's files are, computed once.

``HOME`` is the directory that holds the ``minibert_spec`` and ``minibert_reference`` packages: the
repository in a checkout, ``site-packages`` in an installed wheel.  The judging suite, the CLI and
the equations need nothing else; the project's own tests (``tests/``), the mutation runner and the
bench's torch side live only in a checkout, and the commands that need them say so in one line
(:func:`need_checkout`) instead of failing on a missing file.
"""

from __future__ import annotations

from pathlib import Path

HOME = Path(__file__).resolve().parents[1]
TESTS = HOME / "tests"
# shipped with the package (the mutation matrix, results): beside this module, whatever the
# folder is called (spec/ in a checkout, minibert_spec/ in site-packages)
RESULTS = Path(__file__).resolve().parent / "results"


def in_checkout() -> bool:
    """A source checkout (its tests and pyproject beside the packages), not an installed wheel."""
    return TESTS.is_dir() and (HOME / "pyproject.toml").is_file()


def need_checkout(what: str) -> Path:
    """``HOME`` when it is a checkout, else a ValueError saying what needs one."""
    if not in_checkout():
        raise ValueError(f"{what} needs the project's source checkout (its tests/); this is the "
                         f"installed package at {HOME}: git clone the repository and run it there")
    return HOME
