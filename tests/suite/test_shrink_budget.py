"""Failing checks cost little (issue 29): one shrink budget for the whole run, each cause of red
shrunk once, the reds of one cause grouped in the report, and no false Hypothesis warning.

The warning: the suite used to bound shrinking by lowering Hypothesis's engine limit
(``MAX_SHRINKING_SECONDS``, 300 s) to 5 s; the engine then ends shrinking through its "very
slow shrinking" abort, which prints "spent more than five minutes ... PLEASE REPORT THIS" --
once per failing check, false.  Shrinking now stops through the shrinker's own stall stop
(spec/suite/shrink.py), and the engine's limit is left alone."""

from __future__ import annotations

import time

import numpy as np
import pytest

from minibert_spec.suite import check_implementation
from minibert_spec.suite.registry import get
from minibert_spec.suite.run import run_check
from minibert_spec.suite.shrink import ShrinkBudget, cause_of
from tests.examples import classy_adapter

PROMOTION = "dtype promotion: float32 in, float64 out"


class SlowUpcast:
    """relu in float64 whatever it is given when the input is not 3-D (a promotion: the float32
    checks of relu are red on drawn examples, while the checks' fixed-seed examples, all 3-D,
    pass -- an explicit example that fails is reported as it is, without shrinking), each call a
    little slow, so that shrinking costs what it costs on real code."""

    calls = 0
    relu_backward = staticmethod(classy_adapter.relu_backward)

    @classmethod
    def relu_forward(cls, x):
        cls.calls += 1
        time.sleep(0.002)
        out, cache = classy_adapter.relu_forward(x)
        return (out if np.ndim(x) == 3 else np.asarray(out, dtype=np.float64)), cache


def _calls_of(check_id, budget):
    SlowUpcast.calls = 0
    r = run_check(get(check_id), SlowUpcast(), shrink=budget)
    return r, SlowUpcast.calls


def test_a_cause_shrunk_once_is_not_shrunk_again():
    budget = ShrinkBudget(60.0)
    first, shrinking = _calls_of("invariant[relu.float32_vs_float64]", budget)
    assert first.outcome == "failed" and first.cause == PROMOTION
    assert budget.shrunk == {PROMOTION} and budget.seconds < 60.0
    second, again = _calls_of("invariant[relu.float32_vs_float64]", budget)
    assert second.outcome == "failed" and second.cause == PROMOTION
    # the second red shows the example found: no shrinking calls beyond the examples
    unshrunk, bare = _calls_of("invariant[relu.float32_vs_float64]", ShrinkBudget(0.0))
    assert again <= bare + 2 < shrinking, (again, bare, shrinking)


def test_the_budget_is_the_runs_not_each_checks():
    budget = ShrinkBudget(0.0)  # spent: every later red shows the example found
    r, calls = _calls_of("oracle.forward[relu-f32]", budget)
    assert r.outcome == "failed" and r.cause == PROMOTION
    _, shrunk_calls = _calls_of("oracle.forward[relu-f32]", ShrinkBudget(60.0))
    assert calls < shrunk_calls
    assert budget.seconds == 0.0


def test_no_false_five_minutes_warning_reaches_the_user(capfd):
    from hypothesis.internal.conjecture import engine

    r, _ = _calls_of("invariant[relu.float32_vs_float64]", ShrinkBudget(0.05))
    assert r.outcome == "failed"
    assert engine.MAX_SHRINKING_SECONDS == 300  # Hypothesis's own limit, untouched
    out = capfd.readouterr()
    assert "PLEASE REPORT" not in out.out + out.err
    assert "five minutes" not in out.out + out.err


def test_the_old_mechanism_printed_the_false_warning(capfd, monkeypatch):
    """The cause, shown: with the engine's limit lowered (what the suite did), Hypothesis
    aborts shrinking through its very-slow path and prints the five-minutes warning."""
    from hypothesis import reporting
    from hypothesis.internal.conjecture import engine

    printed = []
    # 0: the very-slow abort at its first check, however few calls this shrink needs (how many
    # depends on the examples drawn, and Hypothesis mixes the project's own constants into them)
    monkeypatch.setattr(engine, "MAX_SHRINKING_SECONDS", 0.0)
    with reporting.with_reporter(printed.append):
        _calls_of("invariant[relu.float32_vs_float64]", ShrinkBudget(60.0))
    assert any("five minutes" in str(p) and "PLEASE REPORT" in str(p) for p in printed)


@pytest.mark.slow  # the slow tier: >= 4.5 s of the default run (issue 40)
def test_the_report_groups_the_reds_of_one_cause_and_keeps_every_verdict():
    report = check_implementation(SlowUpcast(), ops=["relu"])  # with the oracle: f32 reds too
    groups = report.groups()
    assert groups and groups[0]["cause"] == PROMOTION
    group = groups[0]
    failed = [r.id for r in report.failures() if r.cause == PROMOTION]
    assert group["count"] == len(failed) >= 2 and group["checks"] == failed
    assert report.verdicts()["relu"] == "FAIL"
    assert report.to_json()["groups"] == groups


@pytest.mark.parametrize("message, cause", [
    ("linear forward: dtype float64, expected float32", PROMOTION),
    ("linear: float32 in -> float32 out (got float64)", PROMOTION),
    ("x: float32 inputs gave float64 (a silent cast)", PROMOTION),
    ("layernorm dx (float32) differs from torch: worst at index (0, 1)", ""),
])
def test_a_promotion_is_one_cause_whatever_the_check_says(message, cause):
    assert cause_of(AssertionError(message)) == cause


def test_an_exception_of_the_implementation_is_its_type_and_line():
    def implementation_code():
        return {}["missing"]

    try:
        implementation_code()
    except KeyError as e:
        cause = cause_of(e)
    assert cause.startswith("KeyError raised at test_shrink_budget.py:")
    assert "implementation_code" in cause


def test_the_budget_is_cpu_seconds_so_a_busy_machine_shows_the_same_example(monkeypatch):
    """Shrinking is bounded by the CPU seconds it uses, not the wall clock's: on a busy machine
    the wall clock runs several times faster than this process's CPU, and a wall-clock budget
    ran out before the same shrink had finished (a red that showed another example than the
    same run on an idle machine).  The wall clock bounds one check's shrinking only far above
    (SHRINK_WALL_SECONDS: code that sleeps uses no CPU)."""
    from minibert_spec.suite import shrink

    clock = {"cpu": 0.0, "wall": 0.0}
    monkeypatch.setattr(shrink.time, "process_time", lambda: clock["cpu"])
    monkeypatch.setattr(shrink.time, "perf_counter", lambda: clock["wall"])
    tracker = shrink._Tracker(ShrinkBudget(5.0))
    tracker.saw(AssertionError("a value"))
    clock["wall"] = 15.0  # a machine at load 6 on 2 cores: 3 wall seconds per CPU second
    clock["cpu"] = 4.0
    assert not tracker.stop_now()
    clock["cpu"] = 5.5
    assert tracker.stop_now() and tracker.spent() == 5.5
    sleeper = shrink._Tracker(ShrinkBudget(5.0))
    clock["cpu"], clock["wall"] = 0.0, 0.0
    sleeper.saw(AssertionError("a value"))
    clock["wall"] = shrink.SHRINK_WALL_SECONDS + 1  # no CPU used: the wall bound ends it
    assert sleeper.stop_now()
