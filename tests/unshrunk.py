"""The suite's runner without shrinking, for the project's tests of implementations that fail on
purpose: the verdict (which checks fail, what their messages name) is what they assert, and
shrinking each failure for up to 5 s only made them slow.  Derandomized under every profile:
which example fails first decides the message, so a random profile (``dev``) made them flaky."""

from __future__ import annotations

from minibert_spec.suite import check_implementation as _check_implementation
from minibert_spec.suite.run import check_settings


def check_implementation(*args, **kwargs):
    return _check_implementation(*args, settings=check_settings(shrink=False, derandomize=True),
                                 **kwargs)
