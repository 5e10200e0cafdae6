"""Assertions of the checks, without pytest (the suite runs under ``minibert check`` too):
each failure message names what was compared and both values."""

from __future__ import annotations

import re
import unittest
from contextlib import contextmanager


@contextmanager
def raises(exc_type: type[BaseException], *, match: str | None = None):
    """The block must raise ``exc_type`` whose message matches ``match`` (``re.search``);
    anything else -- no exception, another type, another message -- is an AssertionError
    that says what happened instead.  A skip (the protocol's NotApplicable: a form the
    implementation does not declare) is no outcome of the block: it passes through, so a
    bad-input case of an undeclared form is n/a, never a red."""
    try:
        yield
    except exc_type as e:
        if match is not None and not re.search(match, str(e)):
            raise AssertionError(f"raised {type(e).__name__}({str(e)[:200]!r}), whose message "
                                 f"does not match {match!r}") from e
        return
    except (AssertionError, unittest.SkipTest):
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


def assert_finite(got, want, what: str, *, got_name: str = "", want_name: str = "expected"
                  ) -> None:
    """Every entry of ``got`` finite; else the first non-finite entry is named with its index
    and the expected value there ("loss inf, expected 8572.99"; "dlogits at index (0, 1): nan,
    expected 0.25"), and how many entries are not finite."""
    import numpy as np

    a, b = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    bad = ~np.isfinite(a)
    if not bad.any():
        return
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    expected = float(b[idx]) if b.shape == a.shape else float(np.ravel(b)[0]) if b.size == 1 \
        else None
    head = f"{what}{f' at index {idx}' if a.ndim else ''}: {got_name + ' ' if got_name else ''}" \
        f"{float(a[idx])!r}"
    raise AssertionError(head + (f", {want_name} {expected!r}" if expected is not None else "")
                         + (f" ({int(bad.sum())} of {a.size} entries not finite)" if a.ndim
                            else ""))


def worst(got, want, allowed, *, got_name: str = "got", want_name: str = "expected") -> str:
    """What differs, in one line: the index of the worst entry (largest excess over
    ``allowed``, a scalar or an array like ``want``), both values there, the absolute and
    relative error against the allowance, and how many entries are outside."""
    import numpy as np

    a = np.asarray(got, dtype=np.float64)
    b = np.asarray(want, dtype=np.float64)
    allowed = np.broadcast_to(np.asarray(allowed, dtype=np.float64), b.shape)
    if a.shape != b.shape:
        return f"shape {a.shape}, {want_name} {b.shape}"
    if a.size == 0:
        return "empty arrays"
    diff = np.abs(a - b)
    bad = ~(diff <= allowed)  # NaN counts as outside
    excess = np.where(np.isnan(diff), np.inf, diff - allowed)
    idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(excess)), a.shape))
    rel = diff[idx] / abs(b[idx]) if b[idx] != 0 else float("inf")
    where = f"at index {idx}" if a.ndim else "(scalar)"
    return (f"worst {where}: {got_name} {float(a[idx])!r}, {want_name} {float(b[idx])!r}; "
            f"|difference| "
            f"{diff[idx]:.3e} > allowed {allowed[idx]:.1e} (relative {rel:.2e}); "
            f"{int(bad.sum())} of {a.size} entries outside")


def assert_close(got, want, *, rtol: float, atol=0.0, what: str, got_name: str = "got",
                 want_name: str = "expected", rule: str | None = None) -> None:
    """|got - want| <= atol + rtol |want| entry by entry (numpy.testing.assert_allclose's rule;
    ``atol`` a scalar or one per entry), same shape: the suite's one closeness assertion, got
    first.  The message names ``what``, the worst index and both values (as ``got_name`` and
    ``want_name``), then the tolerance (``rule``: in words, else rtol and atol)."""
    import numpy as np

    a, b = np.asarray(got), np.asarray(want)
    if a.shape != b.shape:
        raise AssertionError(f"{what}: shape {a.shape}, {want_name} {b.shape}")
    allowed = atol + rtol * np.abs(b.astype(np.float64))
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    if not np.all(diff <= allowed):
        tol = rule or (f"rtol {rtol:g}, atol " + (f"{atol:g}" if np.ndim(atol) == 0 else
                                                  f"up to {float(np.max(atol)):.1e} per entry"))
        where = worst(a, b, allowed, got_name=got_name, want_name=want_name)
        raise AssertionError(f"{what}: {where} ({tol})")
