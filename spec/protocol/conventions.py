"""Conventions: what an implementation may declare it follows (``CAPABILITIES["conventions"]``),
and the warning by which a check says it judged one (the report lists it with the number it
changes).  A leaf of the protocol package: the capabilities reader and the optimizer contract
both use it."""

from __future__ import annotations

# conventions an implementation may declare (CAPABILITIES["conventions"])
CONVENTIONS = frozenset({"lr(0)=0"})


class ConventionWarning(UserWarning):
    """A documented convention the implementation follows (lr(0) = 0, a float64 loss, a
    divisor guard): not a failure; the report lists it with the number it changes."""
