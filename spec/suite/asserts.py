"""Assertions of the checks, without pytest (the suite runs under ``minibert check`` too):
each failure message names what was compared and both values."""

from __future__ import annotations

import re
from contextlib import contextmanager


@contextmanager
def raises(exc_type: type[BaseException], *, match: str | None = None):
    """The block must raise ``exc_type`` whose message matches ``match`` (``re.search``);
    anything else -- no exception, another type, another message -- is an AssertionError
    that says what happened instead."""
    try:
        yield
    except exc_type as e:
        if match is not None and not re.search(match, str(e)):
            raise AssertionError(f"raised {type(e).__name__}({str(e)[:200]!r}), whose message "
                                 f"does not match {match!r}") from e
        return
    except AssertionError:
        raise
    except Exception as e:
        raise AssertionError(f"expected {exc_type.__name__}"
                             + (f" matching {match!r}" if match else "")
                             + f", got {type(e).__name__}: {str(e)[:200]}") from e
    raise AssertionError(f"expected {exc_type.__name__}"
                         + (f" matching {match!r}" if match else "") + ", nothing was raised")


def assert_rel(got, want, rel: float, what: str) -> None:
    """|got - want| <= rel * |want| for scalars, with both values in the message."""
    got, want = float(got), float(want)
    if not abs(got - want) <= rel * abs(want):
        raise AssertionError(f"{what}: got {got!r}, expected {want!r} (relative difference "
                             f"{abs(got - want) / abs(want) if want else float('inf'):.2e} > "
                             f"{rel:g})")
