"""Issue 38: one run plan behind the four entry points (minibert_spec.suite.plan).  Its refusals
are one validation, each naming the argument as the entry point spells it (the command line's
flag, the plugin's option, the Python name); an implementation that does not load is the plan's
``load_error`` -- a report that could not run, never a refusal nor a verdict; a plan for the
worker processes imports no implementation that declares no ops of its own."""

from __future__ import annotations

import sys

import pytest

from minibert_spec.cli.check import _flag as cli_flag
from minibert_spec.protocol import ImplLoadError
from minibert_spec.suite.plan import execute, plan_run
from minibert_spec.suite.plugin import _flag as plugin_flag

# arguments -> (the refusal's start through the Python API, through minibert check)
REFUSALS = [
    ({"timeout": 0}, "timeout: expected a positive number of seconds, got 0",
     "--timeout: expected a positive number of seconds, got 0"),
    ({"max_examples": 0}, "max_examples: expected a positive integer, got 0",
     "--max-examples: expected a positive integer, got 0"),
    ({"quick": True, "max_examples": 2}, "quick runs the fixed examples alone: max_examples",
     "--quick runs the fixed examples alone: --max-examples"),
    ({"quick": True, "deep": True}, "quick and deep: expected one tier, got both",
     "--quick and --deep: expected one tier, got both"),
    ({"model": True, "ops": ["gelu"]}, "model: runs the whole_model row alone; not with ops",
     "--model: runs the whole_model row alone; not with --ops"),
    ({"ops": ["nope"]}, "ops: unknown ['nope']", "--ops: unknown ['nope']"),
    ({"kinds": ["nope"]}, "kinds: unknown ['nope']", "--kinds: unknown ['nope']"),
    ({"expected_failed_checks": {"fd[nope]": "x"}}, "expected_failed_checks: no check 'fd[nope]'",
     "--xfail: no check 'fd[nope]'"),
    ({"thin_rows": {"nope": "x"}}, "thin_rows: unknown op 'nope'", "--thin: unknown op 'nope'"),
    ({"match": "("}, "selection: missing )", "selection: missing )"),
    ({"durations": "d.json"}, "durations: applies to shard only",
     "--durations: applies to --shard only"),
]


@pytest.mark.parametrize("kwargs, python, command", REFUSALS,
                         ids=[",".join(k) for k, _, _ in REFUSALS])
def test_each_refusal_names_the_argument_as_its_entry_point_spells_it(kwargs, python, command):
    for flag, said in ((str, python), (cli_flag, command)):
        with pytest.raises(ValueError) as refusal:
            plan_run(None, flag=flag, **kwargs)  # None: no implementation (--list)
        assert str(refusal.value).startswith(said), (flag, str(refusal.value))


def test_the_plugin_s_refusals_name_its_options():
    with pytest.raises(ValueError, match=r"^--minibert-quick and --minibert-deep: expected one"):
        plan_run(None, flag=plugin_flag, quick=True, deep=True)
    with pytest.raises(ValueError, match=r"^--minibert-xfail: no check 'fd\[nope\]'"):
        plan_run(None, flag=plugin_flag, expected_failed_checks={"fd[nope]": "x"})


def test_an_implementation_that_does_not_load_is_the_plan_s_load_error():
    plan = plan_run("tests.examples.hostile_import_sysexit", oracle="off", ops=["gelu"])
    assert isinstance(plan.load_error, ImplLoadError) and plan.proxy is None
    report = execute(plan)
    assert report.exit_code() == 2 and report.results == []
    assert "raised SystemExit" in report.load_error


def test_a_plan_for_the_workers_imports_no_implementation_without_ops(tmp_path, monkeypatch):
    (tmp_path / "plan_unimported_impl.py").write_text(
        "import numpy as np\n\ndef gelu_forward(x):\n    return x\n")
    monkeypatch.chdir(tmp_path)
    plan = plan_run("plan_unimported_impl", oracle="off", ops=["gelu"], isolated=True)
    assert plan.load_error is None and plan.proxy is None and str(tmp_path) in plan.paths
    assert "plan_unimported_impl" not in sys.modules  # the workers import it, not this process
    here = plan_run("minibert_reference", oracle="off", ops=["gelu"])
    assert [c.id for c in plan.checks] == [c.id for c in here.checks]  # one selection
