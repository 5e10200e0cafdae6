"""``minibert bench`` runs end to end on a tiny batch (every row at both thread counts, the
targets section, JSON and table output) and refuses bad flags with one line and exit 2.  No time
is asserted anywhere: only that the measurements exist and are consistent with each other."""

from __future__ import annotations

import json

import pytest

from minibert_spec.cli import main

KEYS = ("step_full", "step_masked", "forward", "backward", "optimizer", "optimizer_out")


@pytest.mark.slow  # the slow tier (conftest.py): every benchmark row, measured
def test_bench_measures_every_row_and_target(tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "reports" / "bench.json"
    # one round of real processes (a process per side and thread count: ~20 s on this 2-core
    # machine); tests/bench/test_bench_processes.py covers rounds on fake processes
    rc = main(["bench", "-B", "2", "-T", "8", "--rounds", "1", "--repeats", "2", "--warmup",
               "0", "--threads", "1", "2", "--no-train-rate", "--no-rss", "--format", "json",
               "-o", str(out), "--allow-noisy"])  # this shared machine may be busy
    assert rc == 0
    report = json.loads(out.read_text())
    rows = {(r["key"], r["threads"]): r for r in report["rows"]}
    assert set(rows) == {(k, n) for k in KEYS for n in (1, 2)}
    for r in rows.values():
        assert r["ours"]["n"] == 2 and r["torch"]["n"] == 2
        assert r["ours"]["rounds"] == 1 and r["torch"]["rounds"] == 1
        assert r["ratio"] == pytest.approx(r["ours"]["median_ms"] / r["torch"]["median_ms"])
        assert r["ours"]["p10_ms"] <= r["ours"]["median_ms"] <= r["ours"]["p90_ms"]
    assert rows[("step_full", 2)]["gflop"] > rows[("step_masked", 2)]["gflop"] > 0
    assert set(report["sgemm_gflops"]) == {"1", "2"}
    targets = {t["name"]: t for t in report["targets"]}
    assert len(targets) == 8
    full2 = rows[("step_full", 2)]
    masked = next(t for n, t in targets.items() if n.startswith("train step, masked head"))
    assert masked["value"] == pytest.approx(rows[("step_masked", 2)]["ours"]["median_ms"]
                                            / full2["torch"]["median_ms"])
    floor = next(t for n, t in targets.items() if n.endswith("/ FLOP floor"))
    assert floor["value"] == pytest.approx(full2["vs_floor"])
    for t in targets.values():  # skipped measurements are "not measured", never "met"
        if "RSS" in t["name"] or "steps/s" in t["name"]:
            assert t["value"] is None and t["met"] is None
        else:  # judged, unless the run failed its self-check
            assert t["met"] in ((None,) if report["problems"] else (True, False))
            assert t["implausible"] == bool(report["problems"])
    assert report["blas"] and all(b["num_threads"] >= 1 for b in report["blas"])


def test_bench_table_lists_the_targets():
    from minibert_spec.bench import BenchReport, Row, Stats, Target
    from minibert_spec.cli.bench import render_table

    stats = Stats(10.0, 9.0, 11.0, 3)
    report = BenchReport("mini_bert", 8, 64, "float32", [], {1: 100.0}, policy="p",
                    rows=[Row("step_full", "train step, full head", 1, 9.1, stats, stats, 91.0)],
                    targets=[Target("a target", 0.5, 0.9, "<="), Target("b", None, 1, ">=")])
    text = render_table(report)
    assert "a target: 0.50 (target <= 0.9) met" in text
    assert "b: - (target >= 1) not measured" in text
    assert "train step, full head" in text and "1.00" in text


@pytest.mark.parametrize("flags, what", [
    (["--threads", "0"], "--threads"), (["--preset", "bert_tiny"], "--preset"),
    (["--seq", "100"], "--seq"), (["--repeats", "0"], "--repeats"),
    (["--warmup", "-1"], "--warmup"), (["--rounds", "0"], "--rounds")])
def test_bench_bad_flags_are_one_line_errors(capsys, flags, what):
    assert main(["bench", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and what in err[0]


def test_a_failing_rss_child_is_an_error_not_a_figure():
    from minibert_spec.bench import _run_script

    with pytest.raises(ValueError, match=r"exit 1\): RuntimeError: broken"):
        _run_script("raise RuntimeError('broken')", "x")


@pytest.mark.slow  # a mini_bert training step in a fresh process: seconds
def test_the_train_rate_child_runs():
    """``minibert bench``'s default report includes the training rate: its child script must
    run (it once named a module the script no longer imported, so every default bench ended
    in a NameError)."""
    import json

    from minibert_spec.bench import TRAIN_RATE_SCRIPT, _run_script

    res = json.loads(_run_script(TRAIN_RATE_SCRIPT, "mini_bert", "1", 1))
    assert res["threads"] == 1 and res["steps_per_s"] > 0
