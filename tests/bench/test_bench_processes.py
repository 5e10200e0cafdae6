"""Each side of a timing alone in its own process (minibert_spec.benchproc): the order of the
processes, the statistics over rounds, each process's self-check, and the report built from them --
on fake processes with synthetic measurements (no time is asserted anywhere) -- and, with real
child processes, that each side really ran in a process of its own (by pid) and that the
reference's process never loaded torch.

Why: timing NumPy and torch in one process distorted both (torch's 2-thread step 131 ms
in-process, 66 ms alone); the bench and the audit's timing claims alternated call by call in
one process.
"""

from __future__ import annotations

import json
import os
import re
import sys
import types

import numpy as np
import pytest

import minibert_spec.benchproc
from minibert_spec.bench import BENCH_TASK, Stats
from minibert_spec.benchproc import (
    Process,
    check_processes,
    impl_spec,
    run_child,
    run_rounds,
    stats_of,
)

KEYS = ("step_full", "step_masked", "forward", "backward", "optimizer", "optimizer_out")


class FakeProcesses:
    """A runner standing in for ``run_child``: records each job, answers with a new pid and
    the times ``times(side, threads, call_index)`` gives (seconds per call)."""

    def __init__(self, times=None, *, load=0.2, sgemm=None, keys=KEYS, repeats=3):
        self.jobs, self.pid = [], 1000
        # above every row's FLOP floor at the fake sgemm rates (a plausible run)
        self.times = times or (lambda side, n, i: (0.300 if side == "ours" else 0.250) / n)
        self.load, self.keys, self.repeats = load, keys, repeats
        self.sgemm = sgemm or {1: [170.0, 165.0], 2: [320.0, 310.0]}

    def __call__(self, job):
        self.jobs.append(job)
        self.pid += 1
        side, n = job["side"], job["threads"]
        return {"side": side, "threads": n, "pid": self.pid,
                "times": {k: [self.times(side, n, len(self.jobs)) for _ in range(self.repeats)]
                          for k in self.keys},
                "load_before": self.load, "load_after": self.load + n,
                "sgemm": {k: v for k, v in self.sgemm.items() if k in (1, n)},
                "torch_loaded": side == "torch", "info": {}}


def test_the_sides_alternate_process_by_process():
    fake = FakeProcesses()
    procs = run_rounds({"task": BENCH_TASK}, sides=("ours", "torch"), threads=[1, 2], rounds=3,
                       runner=fake)
    order = [(j["side"], j["threads"]) for j in fake.jobs]
    assert order == [("ours", 1), ("torch", 1), ("ours", 2), ("torch", 2)] * 3
    assert [p.round for p in procs] == [r for r in range(3) for _ in range(4)]
    assert len({p.pid for p in procs}) == 12  # one process per side, thread count and round


def test_a_child_answering_for_another_side_is_an_error():
    def wrong(job):
        return {**FakeProcesses()(job), "side": "torch"}

    with pytest.raises(ValueError, match="answered for 'torch'.*asked 'ours'"):
        run_rounds({}, sides=("ours",), threads=[1], rounds=1, runner=wrong)


def test_the_budget_stops_starting_rounds_but_never_the_first(monkeypatch):
    clock = iter(range(0, 1000, 10))
    monkeypatch.setattr(minibert_spec.benchproc.time, "perf_counter", lambda: next(clock))
    fake = FakeProcesses()
    procs = run_rounds({}, sides=("ours", "torch"), threads=[2], rounds=5, runner=fake,
                       budget_s=0.0)
    assert len(procs) == 2 and {p.round for p in procs} == {0}


def test_stats_over_rounds_are_the_median_of_the_process_medians():
    rounds = [[0.001, 0.002, 0.090], [0.010, 0.020, 0.030], [0.004, 0.005, 0.006]]
    s = Stats.of_rounds(rounds)
    # process medians 2, 20 and 5 ms: one process's outlier call (90 ms) does not count
    assert s.median_ms == pytest.approx(5.0)
    assert (s.n, s.rounds) == (9, 3)
    assert s.p10_ms == pytest.approx(np.percentile([2, 20, 5], 10))
    assert s.p10_ms <= s.median_ms <= s.p90_ms


def test_stats_of_keeps_sides_and_thread_counts_apart():
    fake = FakeProcesses(lambda side, n, i: {"ours": 0.030, "torch": 0.020}[side] / n)
    procs = run_rounds({}, sides=("ours", "torch"), threads=[1, 2], rounds=2, runner=fake)
    for side, ms in (("ours", 30.0), ("torch", 20.0)):
        for n in (1, 2):
            st = stats_of(procs, side, n, "forward")
            assert st.median_ms == pytest.approx(ms / n) and st.rounds == 2 and st.n == 6
    assert stats_of(procs, "ours", 4, "forward") is None


def _process(i, **change):
    data = {"side": "ours", "threads": 2, "pid": 100 + i, "times": {"step": [0.080] * 3},
            "load_before": 0.3, "load_after": 2.3, "sgemm": {1: [170.0, 160.0],
                                                            2: [320.0, 300.0]}}
    return Process.from_json({**data, **change}, round=i)


def test_each_process_checks_itself_and_is_named():
    gflop = {"step": 9.1}  # 80 ms against a 28 ms floor at 320 GFLOP/s: plausible
    idle = [_process(0), _process(1, side="torch")]
    assert check_processes(idle, cores=2, gflop=gflop) == []
    busy = [_process(0), _process(1, side="torch", sgemm={1: [170.0, 160.0], 2: [10.0, 9.0]},
                                  times={"step": [0.010] * 3})]
    problems = check_processes(busy, cores=2, gflop=gflop)
    assert len(problems) == 2 and busy[0].problems == []
    assert all(p.startswith("torch process 2 at 2 thread(s) (pid 101): ") for p in problems)
    assert "sgemm at 2 BLAS threads 10 GFLOP/s" in problems[0]
    assert "step took 0.01x its FLOP floor" in problems[1]


def test_the_load_before_a_later_process_counts_the_runs_own_threads_out():
    """The 1-minute load average still holds the run's previous process: 3.5 before a later
    2-thread process is 1.5 of load from elsewhere (plausible), before the first it is not."""
    assert check_processes([_process(0, load_before=1.0), _process(1, load_before=3.5)],
                           cores=2, gflop={}) == []
    first = check_processes([_process(0, load_before=3.5)], cores=2, gflop={})
    assert len(first) == 1 and "load average 3.50 above the 2 core(s) before" in first[0]
    later = check_processes([_process(0), _process(1, load_before=4.5)], cores=2, gflop={})
    assert len(later) == 1 and "4.50 before the run (2.50 without the 2 thread(s)" in later[0]


# --------------------------------------------------------------------------- the bench CLI
def _bench(monkeypatch, tmp_path, fake, *extra):
    from minibert_spec.cli import main

    monkeypatch.setattr(minibert_spec.benchproc, "run_child", fake)
    monkeypatch.setattr("minibert_spec.bench.load_torch_side", lambda: (object(), ""))
    # the parent's: an idle run
    monkeypatch.setattr("minibert_spec.bench.load_average", lambda: 0.5)
    out = tmp_path / "bench.json"
    rc = main(["bench", "--rounds", "2", "--threads", "1", "2", "--no-train-rate", "--no-rss",
               "--format", "json", "-o", str(out), *extra])
    return rc, json.loads(out.read_text())


def test_the_bench_report_comes_from_the_processes(monkeypatch, tmp_path):
    fake = FakeProcesses(lambda side, n, i: {"ours": 0.120, "torch": 0.100}[side] / n)
    rc, report = _bench(monkeypatch, tmp_path, fake)
    assert rc == 0 and report["problems"] == []
    rows = {(r["key"], r["threads"]): r for r in report["rows"]}
    assert set(rows) == {(k, n) for k in KEYS for n in (1, 2)}
    for (_, n), r in rows.items():
        assert r["ours"]["median_ms"] == pytest.approx(120.0 / n)
        assert r["torch"]["median_ms"] == pytest.approx(100.0 / n)
        assert r["ratio"] == pytest.approx(1.2)
        assert (r["ours"]["rounds"], r["ours"]["n"]) == (2, 6)
    # every process is in the report, in run order, each side at each count in its own
    procs = report["processes"]
    assert [(p["side"], p["threads"], p["round"]) for p in procs] == [
        (s, n, r) for r in range(2) for n in (1, 2) for s in ("ours", "torch")]
    assert len({p["pid"] for p in procs}) == 8
    assert report["sgemm_gflops"] == {"1": 170.0, "2": 320.0}
    assert all(t["met"] is not None for t in report["targets"] if t["value"] is not None)


@pytest.mark.parametrize("allow", [False, True])
def test_one_busy_process_fails_the_run(monkeypatch, tmp_path, capsys, allow):
    base = FakeProcesses()

    def one_busy(job):
        data = base(job)
        if len(base.jobs) == 8:  # torch's 2-thread process of the second round
            data["sgemm"] = {1: [170.0, 165.0], 2: [320.0, 100.0]}  # a contended probe
        return data

    rc, report = _bench(monkeypatch, tmp_path, one_busy, *(["--allow-noisy"] if allow else []))
    assert rc == (0 if allow else 1)
    assert len(report["problems"]) == 1
    assert report["problems"][0].startswith("torch process 2 at 2 thread(s) (pid 1008): sgemm")
    assert "median 100: the probe was contended" in report["problems"][0]
    assert report["processes"][7]["problems"] and not any(
        p["problems"] for p in report["processes"][:7])
    assert all(t["met"] is None for t in report["targets"])
    err = capsys.readouterr().err
    assert ("failed its self-check (torch process 2" in err) != allow


# --------------------------------------------------------------------------- real processes
@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_each_side_runs_in_a_process_of_its_own(tmp_path):
    """The real harness on a tiny batch: ours and torch alternate in fresh processes (pids
    distinct from each other and from this one); the reference's process never imports
    torch; torch's runs at the thread count asked for."""
    pytest.importorskip("torch")
    job = {"task": BENCH_TASK, "preset": "mini_bert", "batch": 2, "seq": 8, "seed": 0,
           "keys": ["forward", "backward"], "repeats": 1, "warmup": 0, "check": False}
    procs = run_rounds(job, sides=("ours", "torch"), threads=[1], rounds=2)
    assert [p.side for p in procs] == ["ours", "torch", "ours", "torch"]
    pids = [p.pid for p in procs]
    assert len(set(pids)) == 4 and os.getpid() not in pids
    for p in procs:
        assert p.torch_loaded == (p.side == "torch")
        assert set(p.times) == {"forward", "backward"} and all(
            len(t) == 1 and t[0] > 0 for t in p.times.values())
        if p.side == "torch":
            assert p.info["torch_threads"] == 1
        # single-threaded BLAS in both (the reference's workers and torch's idle NumPy)
        assert all(b["num_threads"] == 1 for b in p.info["blas"] if b["user_api"] == "blas")


@pytest.mark.parametrize("task, error", [
    ("nope", "ValueError: task: expected 'package.module:function' building a side's timed "
             "calls, got 'nope'"),
    ("minibert_spec.bench:no_such_function",
     "ValueError: task: 'minibert_spec.bench' has no function 'no_such_function'"),
    ("no_such_module:f", "ModuleNotFoundError: No module named 'no_such_module'")])
def test_a_failing_child_is_an_error_not_a_figure(task, error):
    """The harness times what the job's task names; a task it cannot build is the child's
    failure, reported with its last error line -- never a figure."""
    with pytest.raises(ValueError, match=r"failed \(exit 1\): " + re.escape(error)):
        run_child({"task": task, "side": "ours", "threads": 1, "repeats": 1, "warmup": 0,
                   "check": False})


def test_the_timing_claims_run_in_a_child_process(impl):
    """The audit's timing claims (smoke: the reference only, a tiny model) time in a child
    process importing the implementation by name."""
    from minibert_spec.claims import CLAIMS, Context, evaluate

    ctx = Context(impl, measure=True, repeats=1, smoke=True)
    o = evaluate(CLAIMS["timing.forward"], ctx)
    assert o.obtained.endswith("in its own process) (smoke: tiny model)"), o.obtained
    (p,) = ctx.timing_processes
    assert p.side == "ours" and p.pid != os.getpid() and not p.torch_loaded


# --------------------------------------------------------------------------- the impl's name
adapter = types.SimpleNamespace()  # a module-level object: importable as this module's name


def test_a_child_imports_the_implementation_by_name(impl):
    import minibert_reference

    assert impl_spec(minibert_reference) == "minibert_reference" and \
        impl_spec(impl) == "minibert_reference"
    mod = sys.modules[__name__]
    assert impl_spec(mod.adapter) is None  # SimpleNamespace's module is not this one
    obj = type("Adapter", (), {"__module__": __name__})()
    mod.adapter_obj = obj
    try:
        assert impl_spec(obj) == f"{__name__}:adapter_obj"
    finally:
        del mod.adapter_obj


def test_an_implementation_without_a_name_is_not_measured():
    from minibert_spec.claims import CLAIMS, Context, evaluate

    local = type("Local", (), {})()  # bound to no module-level name
    o = evaluate(CLAIMS["timing.step"], Context(local, measure=True, smoke=True))
    assert (o.obtained, o.verdict) == ("not measured", "not reproducible")
    assert "no importable name" in o.detail
