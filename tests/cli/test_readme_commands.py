"""Every command the README and the docs show still runs as written: each `minibert ...` line of
a fenced shell block parses with the CLI's own parser (a renamed option or subcommand fails
here), and each `--minibert-*` / `pytest` option named is one pytest offers with the plugin
loaded.  The README's Python snippet is the one tests/wheel_user_repo.py runs from a wheel."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from minibert_spec.cli import build_parser
from tests import ROOT

README = ROOT / "README.md"
# read at collection; a scratch copy of spec/ and tests/ alone (tests/report/blueprint_site.py)
# has none, and collecting must not fail there: the README's own test below says it is missing
DOCS = [p for p in (README, *sorted((ROOT / "docs").glob("*.md"))) if p.exists()]
FENCE = re.compile(r"```(bash|sh|yaml)\n(.*?)```", re.S)
# where a shell command line ends for argparse: redirections, pipes, a second command
STOP = {">", ">>", "|", "&&", ";", "2>&1"}


def _shell_lines(path):
    text = path.read_text(encoding="utf-8")
    for m in FENCE.finditer(text):
        for raw in m.group(2).splitlines():
            line = raw.strip().removeprefix("- run:").strip()
            if line and not line.startswith("#"):
                yield line


def _argv(line: str) -> list[str]:
    # a shell variable ("$NIGHT") stands for a value the job supplies: a number fits every option
    words = [re.sub(r"^\$\{?\w+\}?$", "1", w) for w in shlex.split(line, comments=True)]
    for i, w in enumerate(words):
        if w in STOP:
            return words[:i]
    return words


def _commands(program: str):
    out = []
    for path in DOCS:
        for line in _shell_lines(path):
            argv = _argv(line)
            if argv and argv[0] == program:
                out.append(pytest.param(argv[1:], id=f"{path.name}:{line[:60]}"))
    return out


MINIBERT = _commands("minibert")


def test_the_readme_shows_the_main_commands():
    """The extraction finds what it is meant to check (an empty list would pass anything)."""
    assert README.exists(), README
    readme = [p.values[0][0] for p in MINIBERT if p.id.startswith("README.md:")]
    assert {"check", "audit", "train", "adapter", "gradcheck"} <= set(readme), readme


@pytest.mark.parametrize("argv", MINIBERT)
def test_minibert_command_parses(argv, capsys):
    try:
        build_parser().parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"minibert {shlex.join(argv)}: refused by the parser (exit {e.code}): "
                    f"{capsys.readouterr().err.strip()}")


def test_a_renamed_option_is_caught():
    """The check itself can fail: an option the parser does not know is refused."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["check", "mybert", "--first-redd"])


@pytest.fixture(scope="module")
def pytest_help():
    proc = subprocess.run([sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_pytest_options_named_in_the_docs_exist(pytest_help):
    named = set()
    for path in DOCS:
        named |= set(re.findall(r"--minibert-[a-z-]+", path.read_text(encoding="utf-8")))
    assert "--minibert-impl" in named
    missing = sorted(o for o in named if o not in pytest_help)
    assert not missing, f"pytest options the docs name but pytest does not offer: {missing}"
