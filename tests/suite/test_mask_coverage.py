"""Every declarable attention and block variant is drawn with and without a key mask (issue 41).

A family whose mask followed the declaration drew masked cases alone for the default claim: a
single-head class without W_o and without a mask argument (tests/examples/single_head_noproj.py,
adapted as the docs show) had every FD, oracle and invariant check of its declared form n/a, and
its row was ``ok`` on one SymPy check -- a class that promotes float32 to float64 included."""

from __future__ import annotations

import inspect

import pytest

from minibert_spec.suite import check_implementation
from minibert_spec.suite.strategies import FAMILIES
from tests.examples import single_head_noproj


def _mask_families(op: str) -> dict:
    """family name -> (its needs without key_mask, masked), for the families of ``op`` whose
    strategy takes ``masked``."""
    out = {}
    for f in FAMILIES:
        if f.op == op and "masked" in inspect.signature(f.function).parameters:
            assert "key_mask" not in f.resolve, f"{f.name}: its mask follows the declaration"
            needs = tuple(sorted((k, v) for k, v in f.needs if k != "key_mask"))
            out[f.name] = (needs, f.cases.keywords["masked"])
    return out


@pytest.mark.parametrize("op", ["attention", "block"])
def test_every_variant_has_a_family_without_and_one_with_a_mask(op):
    families = _mask_families(op)
    assert len(families) >= 6, families
    by_variant: dict = {}
    for name, (needs, masked) in families.items():
        by_variant.setdefault((needs, name.removesuffix("_mask")), set()).add(masked)
    missing = {k: v for k, v in by_variant.items() if v != {False, True}}
    assert not missing, f"variants of {op} drawn with a mask only or without one only: {missing}"


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("bug, verdict", [("", "ok"), ("upcast", "FAIL"), ("no_v_path", "FAIL")])
def test_a_w_o_free_single_head_class_without_a_mask_is_judged_by_fd_and_the_oracle(
        monkeypatch, bug, verdict):
    monkeypatch.setattr(single_head_noproj, "BUG", bug)
    report = check_implementation(single_head_noproj, ops=["attention"])
    assert report.verdicts()["attention"] == verdict, report.summary()
    ran = {r.id: r.outcome for r in report.results if r.outcome in ("passed", "failed")}
    for judged in ("fd[attention_noproj]", "oracle.forward[attention_noproj-f32]",
                   "oracle.backward[attention_noproj-f64]",
                   "invariant[attention_noproj.float32_vs_float64]"):
        assert judged in ran, sorted(ran)
    if bug == "upcast":  # float32 in -> float64 out: the float32 checks say it
        assert ran["invariant[attention_noproj.float32_vs_float64]"] == "failed"
        assert ran["oracle.forward[attention_noproj-f32]"] == "failed"
    if bug == "no_v_path":
        assert ran["fd[attention_noproj]"] == "failed"
        assert ran["oracle.backward[attention_noproj-f64]"] == "failed"
