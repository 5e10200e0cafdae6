"""tests/benchmarks/compare_verdicts.py, the script that says whether two `minibert check`
reports agree (issue 29's "verdicts identical"): a changed outcome or failing tensor is a
difference, a new index or value of the same failure is not, and a check one report did not
run is not compared."""

from __future__ import annotations

from minibert_spec.suite.compare import compare, failing_tensor, not_compared

FD = ("gradient check failed for 1 of 3 tensors (d/dx); worst FAIL: layernorm d/dx "
      "[elementwise] error 1.00e+00 (rtol 1e-06) at index (0,): analytic -0.0, finite "
      "difference -1.06")
INV = ("layernorm: dx sums to 0 per row (shift invariance) (worst at index (0, 0): got 2.6, "
       "expected 0.0; ...); layernorm: dx is orthogonal to x - mean (scale invariance) (worst "
       "at index (1, 0): got -1.75, expected 0.0)")


def report(*results, verdicts=None, exit_code=1):
    rs = [{"id": i, "outcome": o, "message": m} for i, o, m in results]
    return {"results": rs, "exit_code": exit_code,
            "ops": [{"op": op, "verdict": v} for op, v in (verdicts or {}).items()]}


def test_the_failing_tensor_is_what_failed_not_where():
    assert failing_tensor(FD) == "gradient check failed for 1 of 3 tensors (d/dx)"
    assert failing_tensor(INV) == ("layernorm: dx sums to 0 per row (shift invariance); "
                                   "layernorm: dx is orthogonal to x - mean (scale invariance)")
    assert failing_tensor(FD.replace("(0,)", "(2,)").replace("-1.06", "-0.5")) == \
        failing_tensor(FD)


def test_outcomes_and_tensors_are_compared_not_the_example():
    a = report(("fd[ln]", "failed", FD), ("fd[relu]", "passed", ""))
    same = report(("fd[ln]", "failed", FD.replace("(0,)", "(1,)")), ("fd[relu]", "passed", ""))
    assert compare(a, same) == []
    assert compare(a, same, messages=True)  # the first line changed
    other = report(("fd[ln]", "failed", FD.replace("d/dx", "d/dgamma")),
                   ("fd[relu]", "failed", FD))
    diffs = compare(a, other)
    assert any("fd[ln]: fails on" in d for d in diffs) and "fd[relu]: passed -> failed" in diffs


def test_a_check_not_run_is_neither_a_difference_nor_an_agreement():
    a = report(("fd[ln]", "failed", FD), ("fd[relu]", "failed", FD),
               verdicts={"ln": "FAIL", "relu": "FAIL"})
    b = report(("fd[ln]", "failed", FD), ("fd[relu]", "not run", "stopped"),
               verdicts={"ln": "FAIL", "relu": "not run"})
    assert compare(a, b) == [] and not_compared(a, b) == ["fd[relu]"]
