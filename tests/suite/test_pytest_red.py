"""Under pytest (the plugin, parametrize_with_checks) a red reads as the check's message first,
not as ~30 lines of the suite's own ``BoundCheck.__call__`` source before it (issue 41): the
suite's frames are hidden (``__tracebackhide__``); the user's test line stays."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests import ROOT


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_a_red_under_pytest_shows_the_checks_message_first(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "MINIBERT_", "HYPOTHESIS"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    got = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                          "no:xdist", "--minibert-impl=tests.examples.broken_impl",
                          "--minibert-oracle=off", "--minibert-quick", "-k", "fd and layernorm"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert got.returncode == 1, got.stdout[-3000:] + got.stderr[-3000:]
    failure = got.stdout.split("test_check[fd[layernorm]]", 1)[1]
    lines = failure.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("E "))
    assert "AssertionError: fd[layernorm]: gradient check failed" in lines[first], failure
    assert first < 10, "\n".join(lines[:first + 1])  # the header and the user's `check()`
    assert "faulthandler" not in failure and "def __call__" not in failure, failure


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_a_session_the_implementation_ends_is_not_exit_0(tmp_path):
    """``os._exit(0)`` in a forward ended ``pytest --minibert-impl`` with status 0 and half a
    report (issue 41): the session runs in a forked child, and one that did not reach its end
    is one line and a non-zero status."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "MINIBERT_", "HYPOTHESIS"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["MINIBERT_HOSTILE"] = "forward:os_exit"
    got = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                          "no:xdist", "--minibert-impl=tests.examples.hostile_anywhere",
                          "--minibert-oracle=off", "--minibert-quick", "-k", "relu"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert got.returncode == 1, got.stdout[-2000:] + got.stderr[-2000:]
    assert "the session ended with exit status 0 before it finished" in got.stderr, got.stderr
    # it names the check that ran, and blames the implementation
    assert "while running " in got.stderr and "relu" in got.stderr.split("while running ")[1]
    assert "a check of the suite: the implementation ended the process" in got.stderr


@pytest.mark.slow  # the slow tier: a pytest session in a subprocess
def test_a_session_the_users_own_test_ends_names_that_test(tmp_path):
    """The plugin adds the suite to the user's own session: a test of theirs collected beside
    it that ends the process is still red, and named as theirs, not the implementation's."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "MINIBERT_", "HYPOTHESIS"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    (tmp_path / "test_mine.py").write_text("import os\n\n\ndef test_leaves():\n"
                                           "    os._exit(0)\n")
    got = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                          "no:xdist", "--minibert-impl=tests.examples.broken_impl",
                          "--minibert-oracle=off", "--minibert-quick", "-k",
                          "leaves or (fd and layernorm)", "test_mine.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert got.returncode == 1, got.stdout[-2000:] + got.stderr[-2000:]
    assert "before it finished" in got.stderr, got.stderr
    assert "while running test_mine.py::test_leaves, a test of your own" in got.stderr, \
        got.stderr
    assert "the implementation ended" not in got.stderr
