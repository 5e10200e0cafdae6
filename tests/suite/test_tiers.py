"""The tiers of a verdict (issue 40): the standard tier by default (each check's fixed-seed
examples + 3 drawn, the whole model at tiny configurations), ``--deep`` (+ 10 drawn, and the
whole model at the mini_bert preset's size), ``--quick`` (nothing drawn); ``--max-examples``
still overrides; the report's header and JSON say which tier ran and what each check drew."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys

import pytest
from hypothesis import settings

import minibert_reference
from minibert_spec.suite import check_implementation, selected_checks
from minibert_spec.suite.registry import get
from minibert_spec.suite.run import TIERS, check_settings, depth, tier_of
from tests import ROOT

# a check that draws (a case family's invariant) and never rejects a draw
DRAWING = "invariant[softmax.rows_sum_to_one]"


@contextlib.contextmanager
def no_profile():
    """Hypothesis's own default profile, as a user's script or a worker process has it (the
    project's tests load dev or ci, which govern the examples instead)."""
    before = settings.get_current_profile_name()
    settings.load_profile("default")
    try:
        yield
    finally:
        settings.load_profile(before)


def test_the_standard_tier_leaves_out_exactly_the_mini_bert_size_model_checks():
    standard = {c.id for c in selected_checks()}
    deep = {c.id for c in selected_checks(deep=True)}
    assert standard < deep
    left_out = deep - standard
    # the mini_bert preset at its own size: the id names it, not a tiny_ or -small shrink
    at_size = {i for i in deep if re.search(r"[-\[]mini_bert(-B|-float|\]|$)", i)}
    assert left_out == at_size and len(left_out) >= 30
    assert all(get(i).ops == ("model",) for i in left_out)
    # the standard tier still judges the whole model, at tiny configurations
    assert {"fd[model-tiny_mini_bert-B2-T6-mean]", "fd[model-seed001-B3-T5-mean]",
            "oracle.backward[model.loss-mini_bert-small-B2-T9-s1-mean-f64]"} <= standard


def test_a_deep_check_named_by_id_runs_in_any_tier():
    assert [c.id for c in selected_checks(ids=["fd[model.gradcheck-mini_bert]"])] == [
        "fd[model.gradcheck-mini_bert]"]


def test_quick_and_deep_together_are_refused():
    with pytest.raises(ValueError, match="quick and deep: expected one tier, got both"):
        tier_of(True, True)
    with pytest.raises(ValueError, match="expected one tier"):
        selected_checks(quick=True, deep=True)
    with pytest.raises(ValueError, match=r"tier: expected one of \['quick', 'standard', "
                                         r"'deep'\], got 'shallow'"):
        check_settings(tier="shallow")


def test_without_a_profile_each_tier_draws_its_examples():
    assert TIERS == {"quick": 0, "standard": 3, "deep": 10}
    with no_profile():
        assert check_settings().max_examples == 3
        assert check_settings(tier="deep").max_examples == 10
        assert check_settings(tier="deep", max_examples=7).max_examples == 7
        assert [p.name for p in check_settings(tier="quick").phases] == ["explicit"]
    assert depth("deep", 7) == {"tier": "deep", "drawn_per_check": 7,
                                "mini_bert_size_model_checks": True}


def test_the_depth_said_is_what_the_checks_run_under():
    # one rule (check_settings): a profile the caller loaded is what is drawn, and said
    with no_profile():
        assert depth("standard")["drawn_per_check"] == 3
        assert depth("quick")["drawn_per_check"] == 0
    settings.register_profile("minibert-test-tiers-7", max_examples=7)
    previous = settings.get_current_profile_name()
    settings.load_profile("minibert-test-tiers-7")
    try:
        assert depth("standard")["drawn_per_check"] == 7 == check_settings().max_examples
        assert depth("quick")["drawn_per_check"] == 0
        assert depth("deep", 4)["drawn_per_check"] == 4
    finally:
        settings.load_profile(previous)


def test_a_quick_run_under_the_caller_s_drawing_settings_says_it_draws():
    """check_implementation(quick=True, settings=...) keeps the quick checks but draws what the
    settings draw: the header says so, never "nothing drawn" beside 25 drawn in the JSON."""
    from minibert_spec.suite.run import depth_line

    drawing = check_settings(max_examples=5)
    d = depth("quick", settings=drawing)
    assert d["drawn_per_check"] == 5
    assert "5 drawn per check" in depth_line(d) and "nothing drawn" not in depth_line(d)
    assert depth_line(depth("quick")) == "tier quick: the fixed-seed examples alone, nothing drawn"


@pytest.mark.parametrize("deep", [False, True])
def test_the_report_says_the_tier_and_each_check_counts_its_examples(deep):
    from minibert_spec.protocol import capabilities

    fixed = len(get(DRAWING).examples(capabilities(minibert_reference)))
    with no_profile():
        report = check_implementation(minibert_reference, ids=[DRAWING], oracle="off",
                                      deep=deep)
        # depth() reads the settings the checks run under: the profile loaded, or the tier's
        assert report.depth == depth("deep" if deep else "standard")
    (r,) = report.results
    drawn = TIERS["deep" if deep else "standard"]
    assert r.outcome == "passed" and r.examples == fixed + drawn
    assert report.to_json()["depth"]["drawn_per_check"] == drawn
    assert report.to_json()["results"][0]["examples"] == fixed + drawn


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "minibert_spec.cli", "check", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # the slow tier: >= 4.5 s of the default run (issue 40)
def test_the_command_says_its_tier_in_the_header_the_json_and_help(tmp_path):
    out = tmp_path / "r.json"
    r = _cli("minibert_reference", "-k", re.escape(DRAWING), "--oracle", "off", "--deep",
             "--max-examples", "4", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "tier deep: the fixed-seed examples + 4 drawn per check" in r.stdout
    data = json.loads(out.read_text())
    assert data["depth"] == {"tier": "deep", "drawn_per_check": 4,
                             "mini_bert_size_model_checks": True}
    assert data["settings"]["tier"] == "deep"
    refused = _cli("minibert_reference", "--quick", "--deep")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "minibert check: --quick and --deep: expected one tier, got both"]
    help_text = " ".join(_cli("--help").stdout.split())
    assert "standard (the default: each check's fixed-seed examples + 3 drawn" in help_text
    assert "--deep" in help_text and "mini_bert preset's size" in help_text



def _pytest_plugin(cwd, *args):
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "--minibert-impl=minibert_reference", "--co", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # two pytest sessions collecting the whole suite
def test_the_plugin_says_its_tier_in_pytest_s_header(tmp_path):
    deep = _pytest_plugin(tmp_path, "--minibert-deep", "-k", "gradcheck")
    assert deep.returncode == 0, deep.stdout[-2000:]
    assert "minibert: tier deep: the fixed-seed examples + 10 drawn per check" in deep.stdout
    assert "fd[model.gradcheck-mini_bert]" in deep.stdout  # the deep tier's own check
    standard = _pytest_plugin(tmp_path, "-k", "gradcheck")
    assert "minibert: tier standard: the fixed-seed examples + 3 drawn per check" in \
        standard.stdout
    assert "fd[model.gradcheck-seed001]" in standard.stdout
    assert "fd[model.gradcheck-mini_bert]" not in standard.stdout


_SETTINGS_UNDER_CI = """
import sys
from hypothesis import settings
if sys.argv[1] == "own":  # the user's own ci profile, registered over Hypothesis's
    settings.register_profile("ci", max_examples=7)
    settings.load_profile("ci")
from minibert_spec.suite.run import check_settings, profile_chosen
s = check_settings()
print(settings.get_current_profile_name(), profile_chosen(), s.max_examples, s.derandomize)
"""


@pytest.mark.parametrize("profile, expected", [
    ("hypothesis's", f"ci False {TIERS['standard']} True"),  # loaded by Hypothesis, not chosen
    ("own", "ci True 7 True")])  # derandomize: from the built-in it extends
def test_hypothesis_s_own_ci_profile_is_not_a_user_s_choice(profile, expected):
    """Hypothesis loads a ``ci`` profile by itself where ``CI`` is set (100 examples): every
    check of a user's CI job drew 100 examples instead of the tier's 3, and the plugin's header
    said so.  A ``ci`` profile the user registers is theirs, and is honoured."""
    env = {**os.environ, "CI": "true"}
    env.pop("MINIBERT_PROFILE", None)
    r = subprocess.run([sys.executable, "-c", _SETTINGS_UNDER_CI, profile], env=env,
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == expected.split()
