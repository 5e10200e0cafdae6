"""Equation IDs are the glue between spec/, reference/ and tests/.

A reference function declares the equations it implements with ``@implements("id", ...)``;
``spec/`` defines the IDs and the audit joins both with the tests' ``@pytest.mark.equation``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)

# equation id -> qualified names of the functions implementing it
IMPLEMENTATIONS: dict[str, list[Callable]] = defaultdict(list)


def implements(*equation_ids: str) -> Callable[[F], F]:
    """Tag a function with the spec equation IDs it implements (no behaviour change)."""

    def tag(fn: F) -> F:
        fn.__equations__ = tuple(equation_ids)  # type: ignore[attr-defined]
        for eq in equation_ids:
            IMPLEMENTATIONS[eq].append(fn)
        return fn

    return tag
