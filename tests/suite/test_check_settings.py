"""The suite's Hypothesis settings (minibert_spec.suite.run.check_settings) never turn generation
trouble into a verdict: a check that rejects many draws is not red for it, and one that can satisfy
none is still an error, never a pass."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from minibert_spec.suite.run import check_settings


def _under_a_random_profile():
    return settings(check_settings(derandomize=False, shrink=False), max_examples=20)


def test_a_check_that_rejects_most_draws_still_runs_to_a_verdict():
    seen = []

    @_under_a_random_profile()
    @given(st.integers(0, 99))
    def check(n):
        assume(n % 10 == 0)  # nine draws in ten rejected: FailedHealthCheck before
        seen.append(n)

    check()
    assert seen and all(n % 10 == 0 for n in seen)


def test_a_check_that_satisfies_nothing_is_not_a_pass():
    @_under_a_random_profile()
    @given(st.integers())
    def check(n):
        assume(False)

    with pytest.raises(Unsatisfiable):
        check()
