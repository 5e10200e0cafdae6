"""The first red, fast (issue 29): the checks run cheapest and most decisive first, and
``--first-red`` / ``first_red=True`` stops at the first failure; every check the run did not
reach is ``not run`` -- its own outcome and cell status, never counted as passed, never n/a."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from minibert_spec.suite import selected_checks
from minibert_spec.suite.report import EXIT_FAIL, EXIT_NOT_RUN, CheckReport
from minibert_spec.suite.run import COMPOSITE_OPS, NOT_RUN, STOPPED, Result, first_red_order
from tests import ROOT
from tests.examples import broken_impl
from tests.unshrunk import check_implementation


def test_fixed_seed_checks_first_the_oracle_after_and_the_composite_ops_last():
    order = first_red_order(selected_checks())

    def where(pred):
        return [i for i, c in enumerate(order) if pred(c)]

    own = [c for c in order if not c.oracle and not COMPOSITE_OPS & set(c.ops)]
    fixed = where(lambda c: c in own and c.given is None)
    drawn = where(lambda c: c in own and c.given is not None)
    oracle = where(lambda c: c.oracle and not COMPOSITE_OPS & set(c.ops))
    composite = where(lambda c: COMPOSITE_OPS & set(c.ops))
    assert fixed and drawn and oracle and composite
    assert max(fixed) < min(drawn) and max(drawn) < min(oracle) and max(oracle) < min(composite)
    assert sorted(c.id for c in order) == sorted(c.id for c in selected_checks())


def test_in_process_the_run_stops_at_the_first_red():
    report = check_implementation(broken_impl, oracle="off", first_red=True)
    outcomes = [r.outcome for r in report.results]
    assert outcomes.count("failed") == 1
    first = report.failures()[0]
    # the cheapest decisive check, on its fixed-seed case (an explicit example, not a draw)
    assert first.id == "fd[layernorm]" and "explicit example" in first.message
    stopped = report.not_run()
    assert len(stopped) > 100 and {r.message for r in stopped} == {STOPPED}
    assert "passed" not in {r.outcome for r in stopped}
    assert report.exit_code() == EXIT_FAIL
    # every op whose checks were all stopped says so, not ok and not n/a
    verdicts = report.verdicts()
    assert verdicts["layernorm"] == "FAIL"
    assert "not run" in set(verdicts.values())
    assert [r.id for r in report.results] == [c.id for c in
                                              selected_checks()]  # the report's own order


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_minibert_check_first_red_lists_what_it_did_not_run(tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "minibert_spec.cli", "check",
                           "tests.examples.broken_impl",
                           "--first-red", "--oracle", "off", "--format", "json", "-o", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == EXIT_FAIL, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    failed = [r for r in data["results"] if r["outcome"] == "failed"]
    stopped = [r for r in data["results"] if r["outcome"] == NOT_RUN]
    assert failed and all("layernorm" in r["ops"] for r in failed)
    assert stopped and all(r["message"] == STOPPED for r in stopped)
    assert data["counts"][NOT_RUN] == len(stopped)
    statuses = {c["status"] for op in data["ops"] for c in op["cells"].values()}
    assert NOT_RUN in statuses
    table = subprocess.run([sys.executable, "-m", "minibert_spec.cli", "check",
                            "tests.examples.broken_impl", "-x", "--oracle", "off"],
                           capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert table.returncode == EXIT_FAIL
    text = " ".join(table.stdout.split())
    assert "not run: stopped at the first red" in text


def test_a_report_with_checks_not_run_and_no_red_is_not_a_pass():
    results = [Result("fd[relu]", "fd", ("relu",), "passed"),
               Result("fd[linear]", "fd", ("linear",), NOT_RUN, STOPPED)]
    report = CheckReport("x", results)
    assert report.verdicts() == {"linear": NOT_RUN, "relu": "ok"}
    assert report.exit_code() == EXIT_NOT_RUN
