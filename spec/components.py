"""Components: behaviour of the reference's tooling that no source document states as an
equation, but that tests check and catalog mutants break exactly as they do an equation.

A component has an ID (used by ``@pytest.mark.equation(...)`` tags and by a mutant's
``equation`` field, like an equation ID), the statement the tests hold the code to, and where
the code lives (``module:function``).  The audit shows one row per component -- its tests, its
mutants and which tagged tests kill them -- without SymPy, finite-difference or oracle columns:
a component needs a tagged test, and with the mutation matrix, tagged tests that kill each of
its mutants.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Component:
    id: str
    statement: str
    implementation: str  # "module:function"
    file: str = field(default="", compare=False)
    line: int = field(default=0, compare=False)


COMPONENTS: dict[str, Component] = {}


def component(id: str, statement: str, implementation: str) -> Component:
    """Register a component, recording where (file:line) for the audit."""
    if id in COMPONENTS:
        raise ValueError(f"id: component {id!r} registered twice")
    caller = sys._getframe(1)
    COMPONENTS[id] = c = Component(id, statement, implementation, caller.f_code.co_filename,
                                   caller.f_lineno)
    return c


component("checkpoint.integrity",
          "Every tensor (parameters, both Adam moments) and every metadata field (the RNG "
          "state, step, configs, history, thread counts, tokenizer) of a training checkpoint "
          "is covered by its SHA-256 record: one changed byte is refused on load",
          "minibert_reference.train.checkpoint:load_checkpoint")
