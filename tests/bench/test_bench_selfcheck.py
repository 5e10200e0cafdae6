"""A measurement checks itself (issue 24, item 6): the self-check of ``minibert bench`` and of
the audit's timing claims, on synthetic measurements (no time is measured or asserted here).

The busy run of the issue -- an sgemm of 10 GFLOP/s at 2 threads, a step at 0.30x its FLOP
floor, load 5 on 2 cores -- was reported with every target "met" and exit 0, and the audit's
timing claims flipped between "confirmed" and "refuted" with the load.
"""

from __future__ import annotations

import pytest

from minibert_spec.bench import (
    SGEMM_MAX_SPREAD,
    SGEMM_MIN_FRACTION,
    BenchReport,
    Row,
    Stats,
    Target,
    plausibility,
)
from minibert_spec.claims.timing import TORCH_REFERENCE_MS, timing_verdict

IDLE = dict(cores=2, load_before=0.3, load_after=2.1, own_threads=2,
            sgemm={1: 176.0, 2: 327.0}, sgemm_median={1: 170.0, 2: 310.0},
            floors={"train step, full head (2 thread(s))": 2.38, "backward (1 thread(s))": 1.6})


def _with(**change):
    return plausibility(**{**IDLE, **change})


def test_an_idle_run_is_plausible():
    assert _with() == []


def test_the_busy_run_of_the_issue_is_implausible_three_times():
    problems = _with(load_before=5.0, sgemm={1: 170.0, 2: 10.0},
                     floors={"train step, full head (2 thread(s))": 0.30})
    assert len(problems) == 3, problems
    assert "load average 5.00 above the 2 core(s)" in problems[0]
    assert "sgemm at 2 BLAS threads 10 GFLOP/s, far below 2 x the 1-thread probe's 170" \
        in problems[1]
    assert "train step, full head (2 thread(s)) took 0.30x its FLOP floor" in problems[2]


@pytest.mark.parametrize("change,needle", [
    (dict(load_before=2.01), "load average 2.01 above the 2 core(s) before the run"),
    (dict(load_after=4.5), "load average 4.50 after the run (2.50 without its own 2"),
    (dict(sgemm={1: 176.0, 2: 175.0}), "sgemm at 2 BLAS threads 175 GFLOP/s"),
    (dict(sgemm_median={1: 170.0, 2: 150.0}), "best round 327 GFLOP/s, median 150"),
    (dict(floors={"forward (1 thread(s))": 0.99}), "forward (1 thread(s)) took 0.99x"),
])
def test_each_condition_alone_is_named(change, needle):
    problems = _with(**change)
    assert len(problems) == 1 and needle in problems[0], problems


def test_thresholds_at_their_boundaries():
    """Exactly the core count, exactly the fraction, exactly the spread, exactly the floor:
    still plausible (each rule is a strict inequality)."""
    assert _with(load_before=2.0, load_after=4.0) == []
    assert _with(sgemm={1: 100.0, 2: SGEMM_MIN_FRACTION * 2 * 100.0},
                 sgemm_median={1: 100.0, 2: 100.0}) == []
    assert _with(sgemm_median={1: 176.0 / SGEMM_MAX_SPREAD, 2: 327.0}) == []
    assert _with(floors={"x": 1.0}) == []


def test_threads_beyond_the_cores_are_expected_to_reach_the_cores_only():
    """4 BLAS threads on 2 cores should reach 2x the 1-thread rate, not 4x."""
    assert _with(sgemm={1: 100.0, 4: 120.0}, sgemm_median={}) == []
    assert len(_with(sgemm={1: 100.0, 4: 90.0}, sgemm_median={})) == 1


def test_unknown_load_is_not_a_problem():
    assert _with(load_before=None, load_after=None) == []


def _report(problems):
    from minibert_spec.cli.bench import targets

    stats, torch = Stats(66.5, 60, 70, 20), Stats(57.3, 55, 60, 20)
    report = BenchReport("mini_bert", 8, 64, "float32", [], {1: 176.0, 2: 327.0}, policy="p",
                    cores=2, load={"before": 5.0, "after": 6.0},
                    sgemm_median={1: 170.0, 2: 310.0}, problems=problems,
                    rows=[Row("step_full", "train step, full head", n, 9.1, stats, torch, 27.8)
                          for n in (1, 2)])
    report.targets = targets(report)
    for t in report.targets:
        t.implausible = bool(problems)
    return report


def test_an_implausible_run_judges_no_target():
    from minibert_spec.cli.bench import render_table

    problems = ["load average 5.00 above the 2 core(s) before the run"]
    report = _report(problems)
    assert all(t.met is None for t in report.targets)
    text = render_table(report)
    assert "SELF-CHECK FAILED" in text and problems[0] in text
    assert " met" not in text.replace("NOT met", "") and "not judged (implausible run)" in text
    data = report.to_json()
    assert data["problems"] == problems and all(t["met"] is None for t in data["targets"])
    judged = _report([])  # the same figures from a plausible run are judged
    assert [t.met for t in judged.targets][:2] == [False, False]
    assert "SELF-CHECK" not in render_table(judged)


def test_target_met_respects_implausible():
    assert Target("t", 0.5, 0.9, "<=").met is True
    assert Target("t", 0.5, 0.9, "<=", implausible=True).met is None


# --------------------------------------------------------------------------- timing claims
def test_a_busy_machine_gives_no_timing_verdict():
    obtained, verdict, detail = timing_verdict("forward", 20, 108.0, 1123.0, threads=2,
                                               problems=["load average 5.00 above"], factor=1.5)
    assert (obtained, verdict) == ("not measured (busy)", "not reproducible")
    assert "load average 5.00" in detail


def test_without_torch_a_raw_time_is_no_verdict():
    obtained, verdict, detail = timing_verdict("step", 60, 53.0, None, threads=2, problems=[],
                                               factor=1.5)
    assert verdict == "not reproducible" and obtained.startswith("53.00 ms here")


@pytest.mark.parametrize("key,stated", [("forward", 20), ("backward", 40), ("step", 60)])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_verdict_is_the_ratio_to_torch_whatever_the_load(key, stated, threads):
    """The same implementation on a machine k times slower (both sides slowed alike) gets the
    same verdict; the verdict flips exactly where the measured ratio leaves [1/1.5, 1.5] x
    the stated ratio (the stated time over the reference machine's torch time)."""
    ref = TORCH_REFERENCE_MS[threads][key]
    for ratio, expected in ((stated / ref, "confirmed"), (1.49 * stated / ref, "confirmed"),
                            (1.51 * stated / ref, "refuted"), (stated / ref / 1.51, "refuted")):
        verdicts = set()
        for k in (1.0, 2.5, 10.0):
            torch_ms = k * ref * 0.9  # this machine: not the reference machine
            out = timing_verdict(key, stated, ratio * torch_ms, torch_ms, threads=threads,
                                 problems=[], factor=1.5)
            verdicts.add(out[1])
            assert f"{ratio:.2f}x torch eager" in out[0]
        assert verdicts == {expected}, (ratio, verdicts)


def test_a_ratio_at_a_thread_count_without_a_yardstick_is_no_verdict():
    """A ratio measured at 4 threads says nothing about the yardstick's 2-thread torch time."""
    obtained, verdict, detail = timing_verdict("step", 60, 50.0, 40.0, threads=4, problems=[],
                                               factor=1.5)
    assert verdict == "not reproducible" and obtained.startswith("1.25x torch eager")
    assert "no torch eager yardstick at 4 thread(s)" in detail


def test_the_claims_time_at_the_yardsticks_thread_count(monkeypatch):
    """claim_timings asks for min(cores, YARDSTICK_THREADS) threads, whatever the cores."""
    import minibert_spec.benchproc
    import minibert_spec.claims.timing
    from minibert_reference.train import threads as threads_mod
    from minibert_spec.claims import Context

    asked = []

    def fake(job):
        asked.append(job["threads"])
        return {"side": job["side"], "threads": job["threads"], "pid": 7,
                "times": {k: [0.01] for k in job["keys"]}}

    monkeypatch.setattr(minibert_spec.benchproc, "run_child", fake)
    for cores, expected in ((1, 1), (2, 2), (16, minibert_spec.claims.timing.YARDSTICK_THREADS)):
        monkeypatch.setattr(threads_mod, "available_cores", lambda c=cores: c)
        import minibert_reference

        timings = Context(minibert_reference, smoke=True, repeats=1).timings
        assert timings["threads"] == expected and asked[-1] == expected
