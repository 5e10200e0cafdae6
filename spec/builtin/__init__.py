"""The built-in ops, one declaration each: ``spec/builtin/<op>.py`` holds an op's table row, its
case families, its identities, its mutants and its infer probe, and every registry of the suite
reads them from here instead of holding a hand entry (issue 38; PyTorch's OpInfo is the
model: one entry per op, every test derived from the list).

A declaration imports nothing of the project: what it draws with, checks with and is compared
against is *handed* to it, as a torch twin is handed ``torch.nn.functional`` --

* ``Family.draw(draw, k, **variant)``: a Hypothesis composite body, ``k`` the drawing kit
  (minibert_spec.suite.strategies.builtin.HANDED: kit's ``k.arrays``, ``k.upstream``,
  ``k.OpCase``..., the norms' ``k.layernorm_eps``, a variant's ``k.eps_of``);
* ``Family.examples(rng, k, **variant)``: its fixed-seed cases, NumPy alone;
* ``Family.torch(to)``: the twin, ``to`` minibert_spec.suite.torch_oracle (``to.F``);
* ``Identity.check(impl, case, h, **given)``: ``h`` the findings of
  minibert_spec.numerics.identities (``h.close``, ``h.holds``, ``h.exact``, ``h.require``) and
  ``h.pinned_eps(impl, norm)`` (minibert_spec.suite.checks.invariants.HANDED); a ``given``
  option may be ``k -> {name: strategy}``, handed the kit.

So this package sits low in the layers (below the protocol), and each registry -- the op table
(spec/protocol/table.py), the case families (spec/suite/strategies/kit.py), the invariant
checks (spec/suite/checks/invariants.py), the mutation catalog (spec/mutants.py), the infer
probes (spec/suite/infer/probes.py) -- includes the declarations' parts without an upward
import.  Modules are discovered as spec/equations/ discovers its own: every public module of
this package, each defining ``OP``.  A user's op is the same :class:`OpDeclaration`, made by
minibert_spec.ops.declare (which validates it) and listed in the implementation's ``OPS``.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

__all__ = ["NOTHING_TO_GUARD", "KINDS", "SIZE", "Arg", "OpDeclaration", "Family", "Identity",
           "Mutant", "declarations", "modules", "shape_of"]

# a row's ``unguarded`` when its formula has nothing a guard could change (the guard table,
# minibert_spec.protocol.guards, reads it)
NOTHING_TO_GUARD = "nothing to keep finite: no log, no division by a computed value, no root"


@dataclass(frozen=True)
class Family:
    """One case family of the op (minibert_spec.suite.strategies.kit.CaseFamily): its drawing,
    its fixed-seed examples, its torch twin; ``options`` the rest of ``kit.cases``' keywords
    (omit, also, smooth, needs, resolve, torch_float64, strategy keywords...)."""

    draw: Callable = field(repr=False)
    examples: Callable | None = field(default=None, repr=False)
    variant: str | None = None
    torch: str | Callable | None = field(default=None, repr=False)
    options: Mapping = field(default_factory=dict)


@dataclass(frozen=True)
class Identity:
    """An op-specific invariant check, ``invariant[<op>.<name>]``, on one family's cases
    (``family``: its name, default the op's); ``options`` are ``on_family``'s keywords
    (equations=, given=, example=...)."""

    name: str
    check: Callable = field(repr=False)
    family: str | None = None
    options: Mapping = field(default_factory=dict)


@dataclass(frozen=True)
class Mutant:
    """A bug of the reference (minibert_spec.mutants.Mutant): the equation it breaks, the bug
    in one line, the function it edits (``"ops._silu_backward"``) and its exact ``(old, new)``
    edits; ``caught_by``: the op whose conformance checks must kill it (default: this op)."""

    name: str
    equation: str
    description: str
    target: str
    edits: tuple[tuple[str, ...], ...]
    fast: bool = False
    caught_by: str | None = None


@dataclass(frozen=True)
class Arg:
    """One argument of a user's forward (minibert_spec.ops.declare): its kind (:data:`KINDS`),
    its shape (sizes: ints, symbols, ``"k*symbol"``), the range its entries are drawn from, or
    its fixed value."""

    kind: str
    shape: tuple = ()
    low: float = -2.0
    high: float = 2.0
    value: object = None

    @property
    def differentiable(self) -> bool:
        return self.kind == "array"


KINDS = ("array", "ints", "bools", "scalar")
# a size of an argument's shape: a symbol of ``sizes``, or an integer multiple of one ("2*d")
SIZE = re.compile(r"^(?:(?P<k>[1-9][0-9]*)\*)?(?P<sym>[A-Za-z_][A-Za-z0-9_]*)$")


def shape_of(arg: Arg, sizes: Mapping[str, int]) -> tuple[int, ...]:
    """The concrete shape of ``arg`` for the drawn ``sizes`` (symbol -> int)."""
    out = []
    for s in arg.shape:
        m = None if isinstance(s, int) else SIZE.match(s)
        out.append(s if m is None else int(m["k"] or 1) * sizes[m["sym"]])
    return tuple(out)


@dataclass(frozen=True)
class OpDeclaration:
    """One op, ours or a user's: the one declaration every registry reads (issue 38).

    A built-in op (a module of this package) is a row of the op table: its fields are those of
    minibert_spec.protocol.table.Op (``names`` defaults to the pair ``<name>_forward``,
    ``<name>_backward``), ``after`` the row it follows in the table (the table's order is the
    protocol document's and the check list's).  ``probe``: minibert_spec.suite.infer.probes.Probe's
    keywords beside ``op`` (None: infer does not look for it), ``variant_probe`` those of the
    declared form tried where a class matches no standard probe (VARIANT_PROBES); ``aliases``:
    the names a forward of it goes by.

    A user's op (minibert_spec.ops.declare, listed in the implementation's ``OPS``) is no row
    (``after`` None): it brings its own ``forward``/``backward`` pair, its ``args`` (name ->
    :class:`Arg`; ``inputs`` their names), the ``sizes`` its shapes' symbols are drawn in, its
    ``torch`` twin (``torch(torch, torch.nn.functional, **tensors)``) and ``smooth`` domain;
    minibert_spec.suite.declared derives its checks."""

    name: str
    after: str | None = None
    inputs: tuple[str, ...] = ()
    equations: tuple[str, ...] = ()
    doc: str = ""
    unguarded: str = ""
    names: tuple[str, ...] = ()
    params: tuple[str, ...] = ()
    module: str = "ops"
    ranks: tuple[str, ...] = ()
    backward_doc: str = ""
    families: tuple[Family, ...] = ()
    identities: tuple[Identity, ...] = ()
    mutants: tuple[Mutant, ...] = ()
    probe: Mapping | None = None
    variant_probe: Mapping | None = None
    # the variant options an implementation may declare (CAPABILITIES[<op>]): name ->
    # minibert_spec.protocol.variants.Option's keywords, ``convert`` a converter's name there
    options: Mapping[str, Mapping] = field(default_factory=dict)
    # the op whose VARIANTS entry its options follow (VARIANTS keeps its own order): default
    # ``after``
    options_after: str | None = None
    aliases: tuple[str, ...] = ()
    # its bad-input cases: (label "<word> <what>", the argument the ValueError must name,
    # call(impl, b)), ``b`` the bad-input module's arrays (minibert_spec.suite.checks.bad_input:
    # B, T, H, X, VEC, IDS, rng, f32...); the id is ``<op>.<what>``, the label its former id
    bad_inputs: tuple[tuple[str, str, Callable], ...] = ()
    # a user's op: its own pair, arguments, sizes, twin and smooth domain (see above)
    forward: Callable | None = field(default=None, repr=False)
    backward: Callable | None = field(default=None, repr=False)
    args: Mapping[str, Arg] = field(default_factory=dict)
    sizes: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    torch: Callable | None = field(default=None, repr=False)
    smooth: Callable | None = field(default=None, repr=False)

    @property
    def row(self) -> dict:
        """The keywords of the op table's row (minibert_spec.protocol.table.Op)."""
        return dict(name=self.name, names=self.names or (f"{self.name}_forward",
                                                         f"{self.name}_backward"),
                    inputs=self.inputs, equations=self.equations, params=self.params,
                    module=self.module, unguarded=self.unguarded, ranks=self.ranks,
                    doc=self.doc, backward_doc=self.backward_doc)

    def caught_by(self) -> dict[str, str]:
        """Mutant name -> the op whose checks must kill it."""
        return {m.name: m.caught_by or self.name for m in self.mutants}

    @property
    def differentiable(self) -> tuple[str, ...]:
        """A user's op: the arrays its backward returns a gradient for, in the forward's order."""
        return tuple(n for n, a in self.args.items() if a.differentiable)

    @property
    def fixed(self) -> dict:
        """A user's op: its fixed keyword arguments (scalars)."""
        return {n: a.value for n, a in self.args.items() if a.kind == "scalar"}


def modules() -> list[str]:
    """The declaration modules: every module of this package whose name does not start with _."""
    return sorted(info.name for info in pkgutil.iter_modules(__path__)
                  if not info.name.startswith("_"))


@functools.cache
def declarations() -> tuple[OpDeclaration, ...]:
    """Every built-in op's declaration (each module's ``OP``), in module order."""
    out = []
    for name in modules():
        op = importlib.import_module(f"{__name__}.{name}").OP
        if not isinstance(op, OpDeclaration) or op.name != name or op.after is None:
            raise ValueError(f"spec/builtin/{name}.py: OP must be an OpDeclaration named "
                             f"{name!r} with the row it follows (after=)")
        out.append(op)
    return tuple(out)
