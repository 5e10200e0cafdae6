"""A check's fixed examples (its case family's fixed-seed cases) are run by the suite itself,
before anything is drawn (minibert_spec.suite.registry.Check.hypothesis_test): the same examples,
order and reds as Hypothesis's explicit phase, without printing every example's arrays before
running it -- the text of a fixed example is built on its failure alone."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import Phase, assume, settings
from hypothesis import strategies as st

import minibert_reference
from minibert_spec.suite.registry import Check
from minibert_spec.suite.run import check_settings


class Loud:
    """A value that counts how often it is printed."""

    printed = 0

    def __init__(self, v):
        self.v = v

    def __repr__(self):
        Loud.printed += 1
        return f"Loud({self.v})"


def _check(body, fixed):
    return Check(id="fd[fixed_examples_probe]", kind="fd", ops=("linear",), equations=(),
                 func=body, given={"n": st.integers(100, 199)},
                 examples=lambda caps: [{"n": v} for v in fixed])


def test_fixed_examples_run_first_in_order_then_the_drawn_ones():
    seen = []
    test = _check(lambda impl, n: seen.append(n), [Loud(1), Loud(2)]).hypothesis_test(
        minibert_reference, check_settings(max_examples=3))
    Loud.printed = 0
    test()
    assert [getattr(v, "v", None) for v in seen[:2]] == [1, 2]
    drawn = seen[2:]
    assert len(drawn) == 3 and all(100 <= n <= 199 for n in drawn)
    assert len(test.completed) == 5
    assert Loud.printed == 0  # passing: never printed


def test_a_failing_fixed_example_names_its_arguments_and_nothing_is_drawn():
    seen = []

    def body(impl, n):
        seen.append(n)
        assert getattr(n, "v", 0) != 2, "wrong at index (0,): analytic 1, FD 2"

    test = _check(body, [Loud(1), Loud(2), Loud(3)]).hypothesis_test(
        minibert_reference, check_settings(max_examples=3))
    with pytest.raises(AssertionError) as e:
        test()
    assert [v.v for v in seen] == [1, 2]  # stopped at the red, before any draw
    notes = " ".join(e.value.__notes__)
    assert "Failing explicit example: fd_fixed_examples_probe(" in notes and "Loud(2)" in notes


def test_the_quick_run_runs_the_fixed_examples_alone():
    seen = []
    test = _check(lambda impl, n: seen.append(n), [7, 8]).hypothesis_test(
        minibert_reference, check_settings(max_examples=0))
    test()
    assert seen == [7, 8] and len(test.completed) == 2


@pytest.mark.filterwarnings("error")  # assume() inside a test case, as Hypothesis runs it
def test_a_fixed_example_that_assume_rejects_is_not_counted():
    def body(impl, n):
        assume(n != 7)

    test = _check(body, [7, 8]).hypothesis_test(minibert_reference,
                                                check_settings(max_examples=0))
    test()
    assert len(test.completed) == 1


def test_a_profile_without_the_explicit_phase_runs_no_fixed_example():
    seen = []
    no_explicit = settings(check_settings(max_examples=2), phases=[Phase.generate])
    test = _check(lambda impl, n: seen.append(n), [7]).hypothesis_test(
        minibert_reference, no_explicit)
    test()
    assert 7 not in seen and len(seen) == 2


def test_a_fixed_example_sees_the_seeded_global_random_state():
    # as under Hypothesis's explicit phase: two runs of one fixed example agree even when the
    # code under test uses NumPy's global generator
    got = []
    test = _check(lambda impl, n: got.append(np.random.random()), [0]).hypothesis_test(
        minibert_reference, check_settings(max_examples=0))
    test()
    test()
    assert got[0] == got[1]
