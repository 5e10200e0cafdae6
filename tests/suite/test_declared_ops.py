"""Ops a user declares (minibert_spec.ops, issue 38): each gets a row of checks with stable ids
-- FD, the oracle against its torch twin, the generic invariants and bad inputs -- through every
entry point, with the messages and exit statuses of the built-in ops; a malformed declaration
is refused in one line (exit 2).  The README's worked example (a user's ReGLU) runs: in process
here, and from a directory outside the checkout through ``minibert check`` (slow tier)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import minibert_spec
from minibert_spec import ops
from minibert_spec.builtin import declarations
from minibert_spec.protocol import DeclarationError
from minibert_spec.suite import check_implementation, parametrize_with_checks
from minibert_spec.suite.declared import checks_of
from minibert_spec.suite.probe import probe
from tests import ROOT
from tests.examples import declared_reglu

BUILTIN = declarations()
REGLU_IDS = ["fd[reglu]", "oracle.forward[reglu-f64]", "oracle.forward[reglu-f32]",
             "oracle.backward[reglu-f64]", "oracle.backward[reglu-f32]",
             "invariant[reglu.inputs_untouched]", "invariant[reglu.float32_kept]",
             "invariant[reglu.finite]", "bad_input[reglu.rank]", "bad_input[reglu.dtype]",
             "bad_input[reglu.nan]", "bad_input[reglu.shape]"]


def outcomes(report) -> dict[str, str]:
    return {r.id: r.outcome for r in report.results}


def messages(report) -> dict[str, str]:
    return {r.id: r.message for r in report.results}


# --------------------------------------------------------------------------- the row
def test_a_declared_op_gets_its_row_of_checks_with_stable_ids():
    assert [c.id for c in checks_of(declared_reglu)] == REGLU_IDS
    assert {c.ops for c in checks_of(declared_reglu)} == {("reglu",)}
    mark = parametrize_with_checks(declared_reglu, match="reglu", bad_input=True)
    assert [p.id for p in mark.args[1]] [1:] == sorted(REGLU_IDS, key=[
        p.id for p in mark.args[1]].index)
    assert set(p.id for p in mark.args[1]) == {"protocol[provides]", *REGLU_IDS}


def test_the_correct_reglu_is_green_in_every_column():
    report = check_implementation(declared_reglu, match="reglu", bad_input=True)
    assert outcomes(report) == dict.fromkeys(REGLU_IDS, "passed"), messages(report)
    assert report.verdicts() == {"reglu": "ok"} and report.exit_code() == 0


def test_the_planted_backward_bug_is_red_in_fd_and_the_oracle_naming_tensor_index_values():
    report = check_implementation(declared_reglu.buggy, match="reglu")
    got = outcomes(report)
    red = {i for i, o in got.items() if o == "failed"}
    assert red == {"fd[reglu]", "oracle.backward[reglu-f64]", "oracle.backward[reglu-f32]"}, got
    assert report.verdicts() == {"reglu": "FAIL"} and report.exit_code() == 1
    fd = messages(report)["fd[reglu]"]
    assert re.search(r"d/dx \[elementwise\].* at index \(\d+, \d+\): analytic -?\d\.\d+e[-+]\d+"
                     r", finite difference -?\d\.\d+e[-+]\d+", fd), fd
    oracle = messages(report)["oracle.backward[reglu-f64]"]
    assert re.search(r"reglu dx \(float64\) differs from torch: worst at index \(\d+, \d+\): "
                     r"ours -?[\d.e-]+, torch -?[\d.e-]+", oracle), oracle
    assert "rerun: minibert check" in fd and "DeclaredCase(sizes=" in fd


def _module(forward, backward=None, **kw):
    """A namespace declaring one op ``op1``: x (n, d) -> forward(x); backward default 2x."""
    return types.SimpleNamespace(OPS=[ops.declare(
        "op1", forward=forward, backward=backward or (lambda dout, c: (2 * dout,)),
        args={"x": ops.array("n", "d")}, sizes={"n": (1, 2), "d": (1, 3)}, **kw)])


def _validating(x):
    if x.dtype.kind != "f" or x.ndim != 2 or not np.all(np.isfinite(x)):
        raise ValueError(f"x: expected a finite float (n, d) array, got {x.dtype} {x.shape}")
    return 2 * x, None


def test_the_generic_invariants_are_red_on_what_they_name():
    def writes(x):
        out = 2 * x
        x[...] = 0
        return out, None

    def casts(x):
        return (2 * x).astype(np.float64), None

    def infinite(x):
        return 2 * x / 0.0, None

    cases = {"invariant[op1.inputs_untouched]": writes, "invariant[op1.float32_kept]": casts,
             "invariant[op1.finite]": infinite}
    for check_id, forward in cases.items():
        report = check_implementation(_module(forward), ids=[check_id])
        assert outcomes(report) == {check_id: "failed"}, messages(report)
    green = check_implementation(_module(_validating), kinds=["invariant"], ops=["op1"])
    assert set(outcomes(green).values()) == {"passed"}, messages(green)


def test_the_generic_bad_inputs_want_a_value_error_naming_the_argument():
    bad = ["bad_input[op1.rank]", "bad_input[op1.dtype]", "bad_input[op1.nan]"]
    lax = check_implementation(_module(lambda x: (2 * x, None)), ids=bad)
    assert set(outcomes(lax).values()) == {"failed"}, messages(lax)
    assert "expected ValueError" in messages(lax)["bad_input[op1.nan]"]
    strict = check_implementation(_module(_validating), ids=bad)
    assert set(outcomes(strict).values()) == {"passed"}, messages(strict)
    # nothing one argument fixes for another: the shape check says so instead of guessing
    shape = check_implementation(_module(_validating), ids=["bad_input[op1.shape]"])
    assert outcomes(shape) == {"bad_input[op1.shape]": "n/a"}


def test_the_smooth_filter_keeps_the_draws_off_a_kink():
    """|x|'s kink at 0: a filter that refuses every draw leaves nothing checked (n/a, never a
    pass); one that refuses none lets the draws through."""
    def absolute(x):
        return np.abs(x), np.sign(x)

    def backward(dout, sign):
        return (dout * sign,)

    none = _module(absolute, backward, smooth=lambda x: False)
    report = check_implementation(none, ids=["fd[op1]"])
    assert outcomes(report)["fd[op1]"] != "passed", messages(report)
    every = _module(absolute, backward, smooth=lambda x: bool(np.all(np.abs(x) > 1e-3)))
    assert outcomes(check_implementation(every, ids=["fd[op1]"])) == {"fd[op1]": "passed"}


def test_declared_ops_keep_their_rows_in_the_class_table_and_the_shared_causes():
    from minibert_spec.suite.many import class_table
    from minibert_spec.suite.report import in_table_order

    assert in_table_order(["reglu", "linear", "reglu", "alibi"]) == ["linear", "reglu", "alibi"]
    report = {"ops": [{"op": "reglu", "verdict": "ok"}, {"op": "linear", "verdict": "ok"}]}
    row = {"name": "a", "exit_code": 0, "reason": "", "seconds": 1.0, "report": report}
    assert class_table([row])["ops"] == ["linear", "reglu"]


def test_an_expected_failure_may_name_a_declared_check():
    report = check_implementation(declared_reglu.buggy, match=r"^fd\[reglu",
                                  expected_failed_checks={"fd[reglu]": "the planted bug"})
    assert outcomes(report) == {"fd[reglu]": "xfailed"} and report.exit_code() == 0


def test_a_users_op_and_a_builtin_op_are_one_type():
    """One declaration type (issue 38): ``declare`` makes the OpDeclaration a module of
    spec/builtin/ writes; a user's brings its functions and is no row, a built-in one the
    reverse."""
    (reglu,) = declared_reglu.OPS
    assert {type(reglu)} == {type(d) for d in BUILTIN} == {ops.OpDeclaration}
    assert reglu.after is None and reglu.inputs == ("x",) and reglu.differentiable == ("x",)
    assert all(d.after and d.forward is None for d in BUILTIN)


# --------------------------------------------------------------------------- refusals
def _f(*a, **k):
    return None


MALFORMED = [
    (dict(name="ReGLU"), r"OPS\['ReGLU'\]\.name: expected a lower-case identifier"),
    (dict(name="layernorm"), r"OPS\['layernorm'\]\.name: expected a name that is not a "
                             r"built-in op"),
    # a declaration in spec/builtin/ (GeGLU) is a built-in op as much as a hand row is
    (dict(name="geglu"), r"OPS\['geglu'\]\.name: expected a name that is not a built-in op"),
    (dict(forward=3), r"OPS\['g'\]\.forward: expected a function, got 3"),
    (dict(args={}), r"OPS\['g'\]\.args: expected a non-empty dict"),
    (dict(args={"x": (2, 3)}), r"OPS\['g'\]\.args\['x'\]: expected ops\.array"),
    (dict(args={"x": ops.array("n", "e")}), r"args\['x'\]\.shape: expected a symbol of sizes "
                                            r"\['n'\], got 'e'"),
    (dict(args={"x": ops.array("n", "0*n")}), r"args\['x'\]\.shape: expected sizes that are"),
    (dict(sizes={"n": (0, 3)}), r"OPS\['g'\]\.sizes\['n'\]: expected a pair \(low, high\)"),
    (dict(sizes={"n": (1, 3), "m": (1, 2)}), r"OPS\['g'\]\.sizes: expected symbols that some "
                                             r"argument's shape uses, got \['m'\]"),
    (dict(args={"i": ops.ints("n")}), r"OPS\['g'\]\.args: expected at least one ops\.array"),
    (dict(torch="F.gelu"), r"OPS\['g'\]\.torch: expected a function, or None"),
]


@pytest.mark.parametrize("change,message", MALFORMED, ids=[m[1][:40] for m in MALFORMED])
def test_a_malformed_declaration_is_refused_in_one_line(change, message):
    kw = dict(name="g", forward=_f, backward=_f, args={"x": ops.array("n")},
              sizes={"n": (1, 3)})
    kw.update(change)
    with pytest.raises(DeclarationError, match=message) as e:
        ops.declare(kw.pop("name"), **kw)
    assert "\n" not in str(e.value)


def test_a_malformed_ops_list_is_refused_by_every_entry_point():
    one = ops.declare("g", forward=_f, backward=_f, args={"x": ops.array(2)})
    for declared, message in (("nope", r"OPS: expected a list"),
                              ([one, 3], r"OPS\[1\]: expected minibert_spec\.ops\.declare"),
                              ([one, one], r"OPS\[1\]: the name 'g' is declared twice"),
                              # a built-in op's declaration (no functions of its own) is no
                              # user's, though it is the same type
                              ([one, BUILTIN[0]], r"OPS\[1\]: expected minibert_spec\.ops\.d")):
        impl = types.SimpleNamespace(OPS=declared)
        report = check_implementation(impl)
        assert report.exit_code() == 2 and re.search(message, report.load_error), \
            report.load_error
        with pytest.raises(DeclarationError, match=message):
            parametrize_with_checks(impl)
    family = types.SimpleNamespace(OPS=[ops.declare("gelu_erf", forward=_f, backward=_f,
                                                    args={"x": ops.array(2)})])
    with pytest.raises(DeclarationError, match=r"not a built-in case family's"):
        checks_of(family)


def test_reading_ops_that_raises_is_refused_and_the_probe_says_who_declares():
    class Hostile:
        @property
        def OPS(self):
            raise RuntimeError("not built yet")

    report = check_implementation(Hostile())
    assert report.exit_code() == 2
    assert report.load_error == "OPS: reading it raised RuntimeError: not built yet"
    # minibert check imports in-process only what declares ops (the probe's child says)
    assert probe("tests.examples.declared_reglu", 60, paths=[str(ROOT)]) == (None, True)
    assert probe("tests.examples.classy_adapter", 60, paths=[str(ROOT)]) == (None, False)


def _cli(*args, cwd, pythonpath) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath)}
    return subprocess.run([sys.executable, "-m", "minibert_spec.cli", "check", *args],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


def test_minibert_check_refuses_a_malformed_ops_in_one_line(tmp_path):
    (tmp_path / "badops.py").write_text(
        "from minibert_spec import ops\n"
        "OPS = [ops.declare('g', forward=print, backward=print, args={'x': ops.array(2)}),\n"
        "       'not a declaration']\n")
    proc = _cli("badops", "-k", "g", cwd=tmp_path, pythonpath=[str(tmp_path), SUITE_ROOT])
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "minibert check: could not run: OPS[1]: expected minibert_spec.ops.declare(...), got "
        "str"], proc.stderr


def test_minibert_check_lists_and_selects_the_declared_ops(tmp_path):
    proc = _cli("tests.examples.declared_reglu", "--list", "--ops", "reglu", "--bad-input",
                cwd=ROOT, pythonpath=[SUITE_ROOT])
    assert proc.returncode == 0, proc.stderr[-2000:]
    listed = [line.split("\t") for line in proc.stdout.splitlines()]
    assert [row[0] for row in listed] == REGLU_IDS
    assert {row[2] for row in listed} == {"reglu"}
    assert all(row[3].startswith(str(Path("spec", "suite", "declared.py"))) or
               "declared.py:" in row[3] for row in listed), listed


@pytest.mark.slow
def test_the_pytest_plugin_runs_the_declared_checks(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SUITE_ROOT, str(ROOT)])}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--minibert-impl",
         "tests.examples.declared_reglu:buggy", "-k", "reglu", "--minibert-xfail",
         "fd[reglu]=the planted bug"], capture_output=True, text=True, cwd=tmp_path, env=env,
        timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert re.search(r"2 failed, 5 passed, \d+ deselected, 1 xfailed", proc.stdout), \
        proc.stdout[-3000:]
    assert "FAILED ::test_check[oracle.backward[reglu-f64]]" in proc.stdout


# --------------------------------------------------------------------------- the README
# the directory this process imports minibert_spec from: a subprocess uses the same suite
SUITE_ROOT = str(Path(minibert_spec.__file__).parent.parent)
BUG = ("(a > 0)", "(a < 0)")


def readme_example() -> str:
    """The README's worked example: the fenced Python block that starts ``# myreglu.py``."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(# myreglu\.py.*?)```", text, re.S)
    assert len(blocks) == 1, "the README's ReGLU example (```python, # myreglu.py) is gone"
    return blocks[0]


def test_the_readme_example_is_short_and_plants_its_bug_where_the_text_says():
    source = readme_example()
    assert len(source.strip().splitlines()) <= 25
    assert source.count(BUG[0]) == 1


def _load(source: str, name: str = "myreglu"):
    module = types.ModuleType(name)
    exec(compile(source, f"{name}.py", "exec"), module.__dict__)
    return module


def test_the_readme_example_is_green_and_its_planted_bug_red():
    source = readme_example()
    green = check_implementation(_load(source), match="reglu")
    assert green.exit_code() == 0 and green.verdicts() == {"reglu": "ok"}, messages(green)
    red = check_implementation(_load(source.replace(*BUG)), match="reglu")
    failed = {i for i, o in outcomes(red).items() if o == "failed"}
    assert {"fd[reglu]", "oracle.backward[reglu-f64]"} <= failed and red.exit_code() == 1


@pytest.mark.slow
def test_minibert_check_judges_a_user_module_outside_the_checkout(tmp_path):
    """The README's example as a user runs it: a module of its own in a directory outside the
    checkout, ``minibert check`` (workers, probe) with nothing installed for it."""
    assert ROOT not in tmp_path.parents
    (tmp_path / "myreglu.py").write_text(readme_example())
    proc = _cli("myreglu", "-k", "reglu", "--format", "json", "-o", "green.json",
                cwd=tmp_path, pythonpath=[SUITE_ROOT])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    (tmp_path / "myreglu.py").write_text(readme_example().replace(*BUG))
    proc = _cli("myreglu", "-k", "reglu", cwd=tmp_path, pythonpath=[SUITE_ROOT])
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    out = " ".join(proc.stdout.split())
    assert re.search(r"FAIL fd\[reglu\] \(reglu\): .*d/dx \[elementwise\].* at index", out), out
    assert re.search(r"FAIL oracle\.backward\[reglu-f64\] \(reglu\): reglu dx \(float64\) "
                     r"differs from torch: worst at index \(\d+, \d+\): ours", out), out
