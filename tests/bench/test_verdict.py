"""``minibert bench --verdict`` (minibert_spec.benchverdict): each case a fresh process per round,
the verdicts of a case compared across its rounds (runs that disagree are no timing), a busy
machine or a round without a result named instead of a judged target; bad input refused in
one line.  No time is asserted: only that the measurements exist and agree with each other."""

from __future__ import annotations

import json
import os

import pytest

from minibert_spec.benchverdict import (
    Case,
    exit_status,
    render,
    run_case,
    summarize,
    user_cases,
)
from minibert_spec.cli import main
from tests import ROOT
from tests.suite.many_submissions import TEMPLATES


def _report(outcome: str, message: str = "") -> dict:
    return {"results": [{"id": "fd[layernorm]", "kind": "fd", "outcome": outcome,
                         "message": message, "seconds": 0.5}],
            "ops": [{"op": "layernorm", "verdict": "ok" if outcome == "passed" else "FAIL"}],
            "exit_code": 0 if outcome == "passed" else 1, "counts": {outcome: 1}}


def _run(wall: float, report: dict) -> dict:
    return {"wall_s": wall, "exit": report["exit_code"], "run_s": 0.5,
            "kinds": {"fd": 0.5}, "counts": report["counts"], "report": report}


CASE = Case(("minibert", "check", "m"), "minibert check m", target_s=2.0)


def test_rounds_that_agree_give_a_median_and_the_start_up():
    runs = [_run(w, _report("failed", "dx: worst at [0, 1]")) for w in (1.0, 3.0, 2.0)]
    entry, problems = summarize(CASE, runs)
    assert problems == []
    assert entry["wall_s"]["median"] == 2.0 and entry["wall_s"]["n"] == 3
    assert entry["startup_s"] == pytest.approx(1.5)  # wall less the pool's own seconds
    assert entry["kind_s"] == {"fd": 0.5} and entry["exit"] == ["1"]


def test_rounds_whose_verdicts_differ_are_no_timing():
    runs = [_run(1.0, _report("failed", "dx: worst")), _run(1.0, _report("passed"))]
    entry, problems = summarize(CASE, runs)
    assert len(problems) == 1 and "the verdicts differ between rounds" in problems[0]
    assert "fd[layernorm]: failed -> passed" in problems[0]
    result = {"rounds": 2, "cores": 2, "load": {"before": 0.1, "after": 0.2},
              "cases": {"m": entry}, "problems": problems}
    text = render(result)
    assert "SELF-CHECK FAILED" in text and "target <= 2 s: not judged" in text


def test_a_first_red_target_is_not_judged_on_a_run_without_a_red():
    case = Case(("minibert", "check", "m", "--first-red"), "first red", target_s=5.0)
    entry, problems = summarize(case, [_run(9.0, _report("passed"))])
    assert problems == [] and entry["target_s"] is None
    assert "no red" in entry["summary"]
    entry, _ = summarize(case, [_run(9.0, _report("failed", "dx: worst"))])
    assert entry["target_s"] == 5.0


def test_a_round_without_a_result_is_named():
    runs = [_run(1.0, _report("passed")),
            {"wall_s": 900.0, "exit": "timeout", "summary": "no result after 900 s"}]
    entry, problems = summarize(CASE, runs)
    assert any("a round gave no result (no result after 900 s)" in p for p in problems)


def test_a_round_that_reaches_no_verdict_is_no_timing():
    """minibert check exit 2 (the implementation does not load) or pytest exit 4/5: nothing
    was checked, so no figure and no judged target."""
    runs = [{"wall_s": 1.0, "exit": 2, "summary": "minibert check: could not run: impl: ..."}]
    entry, problems = summarize(CASE, runs)
    assert problems == [f"minibert check m: a round ran to no verdict (exit 2: "
                        f"{runs[0]['summary']})"]
    result = {"rounds": 1, "cores": 2, "load": {"before": 0.1, "after": 0.2},
              "cases": {"m": entry}, "problems": problems}
    assert "not judged" in render(result)
    # a run with no verdict is no timing even where a busy machine is allowed
    assert exit_status({**result, "busy": []}, allow_noisy=True)[0] == 1
    busy = {**result, "problems": ["load average 3.1 above the 2 core(s)"],
            "busy": ["load average 3.1 above the 2 core(s)"]}
    assert exit_status(busy, allow_noisy=True) == (0, "")
    assert exit_status(busy)[0] == 1 and "--allow-noisy" in exit_status(busy)[1]


@pytest.mark.parametrize("wall, word", [(1.5, "met"), (2.5, "NOT met")])
def test_a_target_is_judged_on_a_quiet_machine(wall, word):
    entry, problems = summarize(CASE, [_run(wall, _report("passed"))])
    result = {"rounds": 1, "cores": 2, "load": {"before": 0.1, "after": 0.2},
              "cases": {"m": entry}, "problems": problems}
    assert f"(target <= 2 s: {word})" in render(result)


def test_the_cases_of_each_implementation_and_the_pytest_file(tmp_path):
    test_file = tmp_path / "test_mine.py"
    test_file.write_text("def test_x():\n    pass\n")
    cases = user_cases(["minibert_reference", "mine"], test_file)
    assert list(cases) == ["minibert_reference (warm)", "minibert_reference (cold)",
                           "minibert_reference --first-red", "mine (warm)", "mine (cold)",
                           "mine --first-red", "pytest test_mine.py"]
    assert cases["minibert_reference (warm)"].target_s == 10.0
    assert cases["minibert_reference (cold)"].target_s == 12.0
    assert cases["mine (warm)"].target_s is None and cases["mine (cold)"].target_s is None
    assert [cases[f"mine ({c})"].cache for c in ("warm", "cold")] == ["warm", "cold"]
    assert cases["mine --first-red"].argv[-3:] == ("--first-red", "--format", "json")
    assert cases["pytest test_mine.py"].cwd == str(tmp_path) and not cases[
        "pytest test_mine.py"].report


def test_a_cold_run_gets_an_empty_cache_of_its_own_and_a_warm_case_keeps_one(tmp_path):
    """Cold: the cache directory removed first (XDG_CACHE_HOME, as minibert check reads it, an
    empty directory no other run used); warm: one directory across the case's rounds."""
    import sys

    script = ("import os, pathlib; home = pathlib.Path(os.environ['XDG_CACHE_HOME']); "
              "print(home, len(list(home.iterdir()))); (home / 'entry').write_text('x')")
    for cache in ("cold", "warm"):
        case = Case((sys.executable, "-c", script), cache, report=False, cache=cache)
        seen = [run_case(case, tmp_path)["summary"].split() for _ in range(3)]
        homes, entries = {h for h, _ in seen}, [int(n) for _, n in seen]
        if cache == "cold":
            assert len(homes) == 3 and entries == [0, 0, 0]
        else:
            assert len(homes) == 1 and entries == [0, 1, 1]
    with pytest.raises(ValueError, match="cache: expected one of"):
        Case(("x",), "x", cache="lukewarm")


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("argv, message", [
    (["--verdict", "minibert_reference", "--pytest-file", "nowhere/test_x.py"],
     "--pytest-file: expected a test file, got 'nowhere/test_x.py'"),
    (["--pytest-file", "x.py"], "--pytest-file: applies to --verdict only"),
    (["--verdict", "minibert_reference", "--rounds", "0"],
     "--rounds: expected an integer >= 1, got 0"),
])
def test_bad_input_is_refused_in_one_line(argv, message, capsys):
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow  # the slow tier (conftest.py): six minibert check processes
def test_bench_verdict_times_a_buggy_implementation_end_to_end(tmp_path, monkeypatch):
    # a student's two ops, LayerNorm's backward wrong: six whole runs of a full implementation
    # cost two minutes of the slow tier and timed nothing more
    (tmp_path / "bench_buggy.py").write_text(TEMPLATES["buggy"])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(ROOT)]))
    out = tmp_path / "verdict.json"
    rc = main(["bench", "--verdict", "bench_buggy", "--rounds", "2",
               "--format", "json", "-o", str(out), "--allow-noisy"])  # this machine may be busy
    assert rc == 0
    result = json.loads(out.read_text())
    whole = result["cases"]["bench_buggy (warm)"]
    cold = result["cases"]["bench_buggy (cold)"]
    assert cold["exit"] == ["1"] and cold["wall_s"]["n"] == 2
    first = result["cases"]["bench_buggy --first-red"]
    assert whole["exit"] == first["exit"] == ["1"]  # red both ways, in both rounds
    assert whole["wall_s"]["n"] == first["wall_s"]["n"] == 2
    assert not any("verdicts differ" in p for p in result["problems"]), result["problems"]
    assert whole["counts"]["failed"] >= 1 and "not run" not in whole["counts"]
    assert first["counts"]["failed"] == 1 and first["counts"]["not run"] > 0
    assert 0 < whole["startup_s"] < whole["wall_s"]["median"]
    assert first["target_s"] == 5.0 and whole["target_s"] is None
