"""Every equation of the five source documents as a checkable entry.

An :class:`Equation` has a stable ID (the one the reference's ``@implements`` tags and the
tests' ``@pytest.mark.equation`` use), the document(s) and section(s) it comes from, its LaTeX,
and a ``proof``: a function that builds the forward map in SymPy, derives the backward with
``sympy.diff`` on small symbolic sizes and compares it with the closed form -- proven (the
difference is identically 0 at every size tried), refuted (a concrete numeric counterexample,
printed) or a convention (two readings of an ambiguous statement, one proven, one refuted).

Two kinds of entries:

* ``derivation``: the formula the reference implements.  Needs an implementing function, a
  finite-difference test (if it states a gradient), an oracle test (if torch has the op) and a
  SymPy <-> code check (``numeric``).
* ``document``: a document's own variant that differs from the derivation (a wrong closed form,
  a mislabel, another orientation).  Its evidence is the proof/refutation; ``target`` names the
  derivation the reference implements instead, whose evidence it inherits.

One module per ID prefix: the entries whose IDs start with ``softmax.`` are registered by
``spec/equations/softmax.py`` (checked by tests/equations/test_spec_equations.py), so an ID
leads to its file in one hop; private modules (``_sym``, ``_nn``) hold the shared SymPy
helpers.  Modules register their entries on import, and :func:`register` records the call
site (file:line) for the audit; :func:`load` discovers and imports every public module of the
package.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

SYMPY_STATUSES = ("proven", "refuted", "convention")
KINDS = ("derivation", "document")



def modules() -> list[str]:
    """The equation modules: every module of this package whose name does not start with _."""
    return sorted(info.name for info in pkgutil.iter_modules(__path__)
                  if not info.name.startswith("_"))


@dataclass
class Proof:
    """Outcome of an equation's SymPy check."""

    status: str  # proven | refuted | convention
    sizes: tuple = ()  # symbolic sizes tried
    detail: str = ""  # the counterexample (refuted), the two readings (convention), notes
    seconds: float = 0.0

    def __post_init__(self):
        if self.status not in SYMPY_STATUSES:
            raise ValueError(f"status: expected one of {SYMPY_STATUSES}, got {self.status!r}")


@dataclass
class Numeric:
    """SymPy <-> code correspondence: the lambdified SymPy map and the implementation's function
    on the same float64 inputs.

    inputs(size) -> {name: ("float", shape, bound) | ("int", shape, high) | ("bool", shape)}
    sympy(size)  -> callable(**arrays) -> tuple of arrays (lambdified, cached by the module)
    code(impl, size, **arrays) -> tuple of arrays (reaches the implementation)
    accept(size, **arrays) -> bool: the sample is away from kinks / singular points
    """

    sizes: tuple
    inputs: Callable
    sympy: Callable
    code: Callable
    accept: Callable | None = None
    needs: tuple[str, ...] = ()  # impl attributes the code side calls (absent -> pending)
    # a documented convention that moves the code's result by at most ``rtol`` relative:
    # (rtol, what it is); within it the check reports the convention instead of failing
    convention: tuple[float, str] | None = None
    # a convention an implementation may declare (CAPABILITIES["conventions"]) under which this
    # derivation is not the one it implements: the check is then not applicable, saying so
    other_convention: str | None = None
    # how the code side calls its op, for a declared guard of the op's row
    # (spec/protocol/guards.adjustment): arrays -> (differentiable inputs, other arguments,
    # upstream gradient) as the forward and backward take them; None: no guard applies
    guard_call: Callable | None = None
    # the protocol variant this derivation is (minibert_spec.protocol.variants: {"layernorm.affine":
    # False}): the check needs the implementation to declare it, decided before any draw
    variant: dict = field(default_factory=dict)
    # adapt(caps, arrays) -> arrays: the drawn inputs for an implementation's declared forms
    # (eps = 0 without eps, zero biases it has none of): both sides get the result, so SymPy
    # evaluates the same form the code is called in
    adapt: Callable | None = None


@dataclass
class Equation:
    id: str
    title: str
    sources: tuple[str, ...]  # "Mini-BERT derivation §3.3", ...
    latex: str
    proof: Callable[[], Proof] | None
    kind: str = "derivation"
    expected: str = "proven"  # the recorded SymPy verdict; a different outcome is a regression
    target: str | None = None  # document entries: the derivation the reference implements
    gradient: bool = False  # states a gradient -> needs a finite-difference test
    torch_op: str | None = None  # the torch op (-> needs an oracle test); None: torch has none
    numeric: Numeric | None = None
    numeric_na: str = ""  # why no SymPy <-> code check applies (derivations only)
    impl_hint: str = ""  # where the implementation lives when it is not a tagged reference fn
    note: str = ""  # conventions, readings, what the verdict means
    # the equations this derivation is built from (a blueprint's \uses): the report's
    # dependency graph draws an edge from each to this one
    uses: tuple[str, ...] = ()
    # set by register(): the module and the file:line of the register(...) call
    module: str = field(default="", compare=False)
    file: str = field(default="", compare=False)
    line: int = field(default=0, compare=False)
    _proof_cache: Proof | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind: expected one of {KINDS}, got {self.kind!r}")
        if self.expected not in SYMPY_STATUSES:
            raise ValueError(f"expected: expected one of {SYMPY_STATUSES}, got {self.expected!r}")
        if isinstance(self.uses, str):
            raise ValueError(f"{self.id}: uses: expected a tuple of equation IDs, got the "
                             f"string {self.uses!r}")
        if self.id in self.uses:
            raise ValueError(f"{self.id}: uses: an equation cannot use itself")
        if self.kind == "document" and not self.target:
            raise ValueError(f"{self.id}: a document entry needs target= (the derivation the "
                             "reference implements)")

    @property
    def where(self) -> str:
        """file:line of the definition (the register call), or "" for an unregistered entry."""
        return f"{self.file}:{self.line}" if self.file else ""

    def run_proof(self) -> Proof:
        """Run (once per machine and source: spec/equations/_cache.py keeps the outcome, keyed
        by the source of the equation's module and what it imports) and time the SymPy check;
        ``seconds`` is the time the proof took when it ran."""
        if self._proof_cache is None:
            if self.proof is None:
                raise ValueError(f"{self.id}: no SymPy proof or refutation")
            from minibert_spec.equations import _cache

            # a process proving it now: wait and read its outcome
            self._proof_cache = _cache.once(_cache.proof_path(self), self._stored, self._prove)
        return self._proof_cache

    def _stored(self) -> Proof | None:
        """The proof's outcome as spec/equations/_cache.py keeps it, or None."""
        from minibert_spec.equations import _cache

        stored = _cache.read_proof(self)
        return None if stored is None else Proof(stored["status"], _tuples(stored["sizes"]),
                                                 stored["detail"], stored["seconds"])

    def _prove(self) -> Proof:
        """Run and time the proof, and store its outcome (spec/equations/_cache.py)."""
        from minibert_spec.equations import _cache

        start = time.perf_counter()
        result = self.proof()
        result.seconds = time.perf_counter() - start
        _cache.write_proof(self, {"status": result.status, "sizes": result.sizes,
                                  "detail": result.detail, "seconds": result.seconds})
        return result


def _tuples(v):
    """JSON lists back to the tuples a Proof's sizes were."""
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


EQUATIONS: dict[str, Equation] = {}


def register(eq: Equation) -> Equation:
    """Add ``eq`` to the registry, recording where: the caller's module and file:line."""
    if eq.id in EQUATIONS:
        raise ValueError(f"id: equation {eq.id!r} registered twice")
    caller = sys._getframe(1)
    eq.module = caller.f_globals.get("__name__", "")
    eq.file, eq.line = caller.f_code.co_filename, caller.f_lineno
    EQUATIONS[eq.id] = eq
    return eq


def load() -> dict[str, Equation]:
    """Import every equation module; return the registry (ID -> Equation)."""
    for name in modules():
        importlib.import_module(f"{__name__}.{name}")
    return EQUATIONS
