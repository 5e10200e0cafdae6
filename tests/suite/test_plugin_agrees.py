"""`pytest --minibert-impl X` and `minibert check X` give one verdict: the same checks fail, on
the example implementations of tests/examples (a wrong LayerNorm backward, ops that mutate
their inputs).  Both run outside the checkout (no project conftest: no Hypothesis profile, so
both use the suite's own derandomized settings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from tests import ROOT


def _env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "MINIBERT_", "HYPOTHESIS"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _pytest_failed(tmp_path, impl) -> set[str]:
    junit = tmp_path / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         f"--minibert-impl={impl}", "--minibert-oracle=off", "--minibert-quick",
         f"--junitxml={junit}"], cwd=tmp_path, env=_env(), capture_output=True, text=True,
        timeout=600)
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
    failed = set()
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            name = case.attrib["name"]
            failed.add(name[name.index("[") + 1:-1])
    return failed


def _check_failed(tmp_path, impl) -> tuple[int, set[str]]:
    out = tmp_path / "check.json"
    proc = subprocess.run(
        [sys.executable, "-m", "minibert_spec.cli", "check", impl, "--oracle", "off", "--quick",
         "--format", "json", "-o", str(out)], cwd=tmp_path, env=_env(), capture_output=True,
        text=True, timeout=600)
    data = json.loads(out.read_text())
    return proc.returncode, {r["id"] for r in data["results"] if r["outcome"] == "failed"}


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("impl", ["tests.examples.broken_impl", "tests.examples.hostile_mutate",
                                  "tests.examples.classy_adapter"])
def test_pytest_plugin_and_minibert_check_fail_the_same_checks(tmp_path, impl):
    failed_pytest = _pytest_failed(tmp_path, impl)
    code, failed_check = _check_failed(tmp_path, impl)
    assert failed_pytest == failed_check
    assert code == (1 if failed_check else 0)
    if impl != "tests.examples.classy_adapter":
        assert failed_check, f"{impl}: nothing failed"
