"""The pytest plugin (``minibert_spec._pytestplugin``, the ``pytest11`` entry point) is inert at
import: a pytest session that does not use the suite loads the plugin module and its
import-free parent package ``minibert_spec``, and nothing else, because the plugin is installed.
Its option defaults are literals that must equal the suite's own constants.
(tests/wheel_user_repo.py checks the same from the wheel.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import minibert_spec._pytestplugin as plugin
from minibert_spec.suite import run

# what loading the plugin adds: the module and its parent package, whose __init__ imports nothing
PLUGIN_MODULES = {"minibert_spec", "minibert_spec._pytestplugin"}

CONFTEST = '''\
import json, os, sys


def pytest_sessionfinish(session):
    with open(os.environ["MODULES_OUT"], "w") as f:
        json.dump(sorted(sys.modules), f)
'''


def test_option_literals_are_the_suite_constants():
    assert plugin.ORACLE_MODES == run.ORACLE_MODES
    assert plugin.DEFAULT_TIMEOUT == run.DEFAULT_TIMEOUT


def session_modules(repo, *args) -> set[str]:
    """sys.modules at the end of a pytest session of ``repo``'s own test, run with ``args``."""
    out = repo / f"modules{len(args)}.json"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "MINIBERT_", "HYPOTHESIS"))}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *args], cwd=repo, env={**env, "MODULES_OUT": str(out)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return set(json.loads(out.read_text()))


@pytest.mark.slow  # the slow tier: >= 4.5 s of the default run (issue 40)
def test_an_unrelated_session_loads_nothing_of_the_project(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_other.py").write_text("def test_other():\n    assert True\n")
    enabled = session_modules(tmp_path)
    disabled = session_modules(tmp_path, "-p", "no:minibert")
    assert "minibert_spec._pytestplugin" in enabled and "minibert_spec" not in disabled
    assert enabled - disabled == PLUGIN_MODULES, sorted(enabled - disabled)
