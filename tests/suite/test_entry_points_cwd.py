"""``pytest --minibert-impl=mybert`` finds a mybert.py in the current directory, as ``minibert
check mybert`` does (issue 41), run as the ``pytest`` script runs it: its sys.path holds the
script's folder, not the current directory (``python -m pytest`` would add it and hide the
bug)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests import ROOT

MYBERT = '''\
import numpy as np


def relu_forward(x):
    return np.maximum(x, 0), x


def relu_backward(dout, x):
    return (dout * (x > 0),)
'''
# the pytest script's sys.path: without the current directory
PYTEST_SCRIPT = ("import sys, pytest; sys.path[:] = [p for p in sys.path if p not in ('', '.')]"
                 "; sys.exit(pytest.main(sys.argv[1:]))")


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_the_plugin_finds_a_module_in_the_current_directory(tmp_path):
    (tmp_path / "mybert_here.py").write_text(MYBERT)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "MINIBERT_", "HYPOTHESIS"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    got = subprocess.run([sys.executable, "-c", PYTEST_SCRIPT, "-q", "-p", "no:cacheprovider",
                          "-p", "no:xdist", "--minibert-impl=mybert_here",
                          "--minibert-oracle=off", "--minibert-quick", "-k", "fd and relu"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    assert "1 passed" in got.stdout, got.stdout[-3000:]
