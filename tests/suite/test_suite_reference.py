"""The shipped judging suite on the reference, exactly as a user runs it on their own
implementation (minibert_spec.suite.parametrize_with_checks): every check, bad input and the deep
tier's mini_bert-size model checks included."""

import pytest

import minibert_reference
from minibert_spec.suite import parametrize_with_checks


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@parametrize_with_checks(minibert_reference, bad_input=True, deep=True)
def test_conformance(check):
    check()
