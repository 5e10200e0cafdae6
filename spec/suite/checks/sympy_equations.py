"""The equations of the SymPy <-> code checks, loaded on import: SymPy and every module of
minibert_spec.equations (~0.9 s).  Imported by the worker that runs such a check -- or by the
fork server before it forks the workers, when one is selected
(minibert_spec.suite.pool.KIND_PRELOAD) -- never by the process that lists the checks, which
reads the generated index (minibert_spec.suite.checks.sympy_code.numeric_equations)."""

from __future__ import annotations

from minibert_spec.equations import load

EQUATIONS = load()
