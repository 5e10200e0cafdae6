"""Under pytest (the plugin, parametrize_with_checks) a red reads as the check's message first,
not as ~30 lines of the suite's own ``BoundCheck.__call__`` source before it (issue 41): the
suite's frames are hidden (``__tracebackhide__``); the user's test line stays."""

from __future__ import annotations

import os
import subprocess
import sys

from tests import ROOT


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
