"""The four entry points -- ``pytest --minibert-impl`` (the plugin), ``minibert check``,
``check_implementation`` and ``parametrize_with_checks`` -- agree on what they refuse, and
none of them ends in exit 0 when nothing was checked:

* an implementation whose import ends the process (``os._exit(0)``, ``sys.exit(0)``), kills it
  (SIGKILL) or never returns (tests/examples/hostile_import_*.py): each is imported in a child
  process first (minibert_spec.suite.probe), and refused with its reason in one line;
* an ``expected_failed_checks`` id (``--minibert-xfail``, ``--xfail``) that names no check:
  one rule (minibert_spec.suite.registry.resolve_expected_failures), the closest known ids named;
* a ``CAPABILITIES`` the protocol cannot take (tests/examples/hostile_declaration*.py: reading
  it raises, a rank of 0): one reader validates it before any check runs
  (minibert_spec.protocol.capabilities.capabilities), and each entry point prints its one line.

Each entry point runs in a subprocess outside the checkout (no project conftest), as a user
runs it: an exit at import must not end the test process itself.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from minibert_spec.suite import check_implementation, parametrize_with_checks
from minibert_spec.suite.probe import probe_import
from tests import ROOT

TIMEOUT = 3  # seconds for the hanging import (and for each check)
# hostile module -> what its one-line reason says
HOSTILE = {"hostile_import_exit0": "ended the process with exit status 0",
           "hostile_import_sysexit": "raised SystemExit",
           "hostile_import_sigkill": "killed the process (SIGKILL)",
           "hostile_import_hang": f"did not finish within {TIMEOUT} s"}
PARAMETRIZED = '''\
from minibert_spec.suite import parametrize_with_checks


@parametrize_with_checks({impl!r}, {expected!r}, oracle="off", timeout={timeout}, ids={ids!r})
def test_impl(check):
    check()
'''
CHECK_IMPLEMENTATION = '''\
import sys
from minibert_spec.suite import check_implementation
report = check_implementation({impl!r}, oracle="off", timeout={timeout}, ids={ids!r},
                              expected_failed_checks={expected!r})
print(report.summary())
sys.exit(report.exit_code())
'''


def _env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "MINIBERT_", "HYPOTHESIS"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _run(cmd, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=300)


def _pytest(cwd, *args):
    return _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                 "no:xdist", *args], cwd)


# ``only``: one check id, the whole run otherwise (a run the entry point should refuse costs
# one check where it does not)
def run_plugin(cwd, impl, expected, only=None):
    xfails = [f"--minibert-xfail={i}={r}" for i, r in expected.items()]
    return _pytest(cwd, f"--minibert-impl={impl}", f"--minibert-timeout={TIMEOUT}",
                   "--minibert-oracle=off", *xfails, *(["-k", _keyword(only)] if only else []))


def run_check_command(cwd, impl, expected, only=None):
    xfails = [f"--xfail={i}={r}" for i, r in expected.items()]
    return _run([sys.executable, "-m", "minibert_spec.cli", "check", impl, "--timeout",
                 str(TIMEOUT),
                 "--oracle", "off", *xfails,
                 *(["-k", f"^{re.escape(only)}$"] if only else [])], cwd)


def run_check_implementation(cwd, impl, expected, only=None):
    code = CHECK_IMPLEMENTATION.format(impl=impl, expected=expected, timeout=TIMEOUT,
                                       ids=[only] if only else None)
    return _run([sys.executable, "-c", code], cwd)


def run_parametrize_with_checks(cwd, impl, expected, only=None):
    (cwd / "test_user.py").write_text(PARAMETRIZED.format(impl=impl, expected=expected,
                                                          timeout=TIMEOUT,
                                                          ids=[only] if only else None))
    return _pytest(cwd, "test_user.py")


def _keyword(check_id: str) -> str:
    """A ``pytest -k`` expression selecting ``check_id`` (-k takes no brackets)."""
    return " and ".join(w for w in re.split(r"\W+", check_id) if w)


ENTRY_POINTS = {"plugin": run_plugin, "minibert check": run_check_command,
                "check_implementation": run_check_implementation,
                "parametrize_with_checks": run_parametrize_with_checks}


@pytest.mark.slow  # four entry points per module, 8-10 s each; the hang waits out its timeout
@pytest.mark.parametrize("module", sorted(HOSTILE))
def test_an_import_that_exits_crashes_or_hangs_is_refused_everywhere(tmp_path, module):
    outcomes = {name: run(tmp_path, f"tests.examples.{module}", {})
                for name, run in ENTRY_POINTS.items()}
    for name, proc in outcomes.items():
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, f"{name} on {module}: exit 0\n{out[-2000:]}"
        assert HOSTILE[module] in out, f"{name} on {module}: no reason\n{out[-2000:]}"
    # the scripting API's report says it could not check (2), like minibert check
    assert outcomes["check_implementation"].returncode == 2
    assert outcomes["minibert check"].returncode == 2


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_an_unknown_expected_failure_is_refused_alike_everywhere(tmp_path):
    impl, expected = "tests.examples.classy_adapter", {"fd[layernrom]": "a typo"}
    outcomes = {name: run(tmp_path, impl, expected) for name, run in ENTRY_POINTS.items()}
    reasons = set()
    for name, proc in outcomes.items():
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, f"{name}: exit 0\n{out[-2000:]}"
        line = next((x for x in out.splitlines() if "no check 'fd[layernrom]'" in x), None)
        assert line is not None, f"{name}: no refusal\n{out[-2000:]}"
        reasons.add(line[line.index("no check"):])
    assert len(reasons) == 1, reasons  # one rule, one message
    assert "closest: fd[layernorm]" in reasons.pop()


# hostile declarations: reading it raises (the plugin's INTERNALERROR, a traceback from
# check_implementation), it raises AttributeError (judged with the defaults: exit 0 from all
# four), a rank of 0 (an op red on correct code).  The other malformed declarations take the
# same path: tests/suite/test_declarations.py refuses each in process
DECLARATIONS = ("tests.examples.hostile_declaration_getattr",
                "tests.examples.hostile_declarations:property_raises",
                "tests.examples.hostile_declarations:ranks_zero")


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("impl", DECLARATIONS)
def test_a_declaration_the_protocol_cannot_take_is_refused_alike_everywhere(tmp_path, impl):
    """None of the four returns 0 and each prints the reader's one line (computed here, in
    process, by the one validation): the same refusal everywhere, before any check runs."""
    from minibert_spec.protocol import capabilities, load_impl

    with pytest.raises(ValueError) as refusal:
        capabilities(load_impl(impl))
    line = str(refusal.value)
    assert line.startswith("CAPABILITIES") and "\n" not in line, line
    outcomes = {name: run(tmp_path, impl, {}, only="fd[linear_nobias]")
                for name, run in ENTRY_POINTS.items()}
    for name, proc in outcomes.items():
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, f"{name} on {impl}: exit 0\n{out[-2000:]}"
        assert line in out, f"{name} on {impl}: not refused with {line!r}\n{out[-2000:]}"
        assert "passed" not in out.splitlines()[-1], f"{name} on {impl}: a check ran\n{out}"
    assert outcomes["check_implementation"].returncode == 2
    assert outcomes["minibert check"].returncode == 2


def test_the_python_entry_points_raise_on_an_unknown_id():
    import tests.examples.classy_adapter as impl

    for call in (lambda: parametrize_with_checks(impl, {"fd[nope]": "x"}),
                 lambda: check_implementation(impl, expected_failed_checks={"fd[nope]": "x"})):
        with pytest.raises(ValueError, match=r"expected_failed_checks: no check 'fd\[nope\]' "
                                             r"\(closest: "):
            call()


def test_probe_import_lets_an_importable_or_raising_module_through():
    """A module that imports, or raises at import (the in-process load names the exception),
    is no reason to refuse; a missing module neither (same)."""
    assert probe_import("tests.examples.classy_adapter", TIMEOUT, paths=[str(ROOT)]) is None
    assert probe_import("tests.examples.hostile_import", TIMEOUT, paths=[str(ROOT)]) is None
    assert probe_import("tests.examples.no_such_module", TIMEOUT, paths=[str(ROOT)]) is None


def test_probe_import_names_each_way_an_import_fails_to_finish():
    for module, reason in HOSTILE.items():
        got = probe_import(f"tests.examples.{module}", TIMEOUT, paths=[str(ROOT)])
        if module == "hostile_import_sysexit":  # raised: the in-process load names it
            assert got is None
        else:
            assert got is not None and reason in got and "\n" not in got, (module, got)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_hanging_import_leaves_nothing_running(tmp_path):
    """The hang is killed with whatever it started (its own session)."""
    marker = tmp_path / "child.pid"
    (tmp_path / "spawner.py").write_text(textwrap.dedent(f'''\
        import subprocess, sys, time
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        open({str(marker)!r}, "w").write(str(p.pid))
        time.sleep(3600)
        '''))
    reason = probe_import("spawner", 2, paths=[str(tmp_path)])
    assert reason is not None and "did not finish within 2 s" in reason
    pid = int(marker.read_text())
    deadline = time.monotonic() + 10
    while _running(pid):
        assert time.monotonic() < deadline, f"the hanging import's child {pid} still runs"
        time.sleep(0.1)


def _running(pid: int) -> bool:
    """The process exists and is not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
