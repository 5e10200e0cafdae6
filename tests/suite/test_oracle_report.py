"""The oracle's deviation report (MINIBERT_ORACLE_REPORT, ``torch_oracle summarize``): what the
oracle tolerance rule is measured with, so it must record every comparison and agree with the
verdicts it sits beside."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")


def test_the_oracle_report_records_each_comparison_and_agrees_with_the_verdict(tmp_path):
    from minibert_spec.suite.torch_oracle import REPORT_ENV, summarize

    report = tmp_path / "oracle.jsonl"
    env = dict(os.environ, **{REPORT_ENV: str(report)})
    out = subprocess.run(
        [sys.executable, "-m", "minibert_spec.cli", "check", "minibert_reference", "--ops",
         "layernorm", "--kinds", "oracle", "--quick", "-j", "1", "--format", "json"],
        env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    passed = [r for r in json.loads(out.stdout)["results"] if r["outcome"] == "passed"]
    rows = [json.loads(line) for line in report.read_text().splitlines()]
    assert passed and rows
    # both dtypes, forward and backward, each within what the rule allowed (the checks passed)
    assert {r["dtype"] for r in rows} >= {"float32", "float64"}
    assert all(0 <= r["of_allowed"] <= 1 for r in rows), max(r["of_allowed"] for r in rows)
    text = summarize(str(report))
    assert "layernorm" in text.lower() and "worst float32 ops" in text
