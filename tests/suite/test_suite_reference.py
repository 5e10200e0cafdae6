"""The shipped judging suite on the reference, exactly as a user runs it on their own
implementation (spec.suite.parametrize_with_checks): every check, bad input included."""

import reference
from spec.suite import parametrize_with_checks


@parametrize_with_checks(reference, bad_input=True)
def test_conformance(check):
    check()
