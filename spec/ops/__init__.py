"""Ops declared by a user: one declaration per op, from which the suite derives its checks.

An op the table lacks (an ALiBi bias, a router, a loss of one's own) is *declared* beside
``CAPABILITIES``, in the spirit of PyTorch's OpInfo (one entry per op -- its sample inputs, its
reference, its error inputs -- from which every test is derived); the declaration is the
:class:`~minibert_spec.builtin.OpDeclaration` each built-in op of spec/builtin/ is too::

    from minibert_spec import ops

    OPS = [ops.declare("reglu", forward=reglu_forward, backward=reglu_backward,
                       args={"x": ops.array("n", "2*d")}, sizes={"n": (1, 3), "d": (1, 4)},
                       torch=lambda torch, F, x: F.relu(x.chunk(2, -1)[0]) * x.chunk(2, -1)[1])]

* ``forward(**arrays, **scalars) -> (out, cache)`` and ``backward(dout, cache) -> (one gradient
  per differentiable array, in the order of args)``: the protocol's pair convention;
* ``args`` in the forward's keyword order, each a kind: :func:`array` (differentiable, float),
  :func:`ints` (an integer array, e.g. ids), :func:`bools` (a mask), :func:`scalar` (a fixed
  keyword value);
* shapes are tuples of sizes: an integer, a symbol of ``sizes`` (``"d"``) or an integer multiple
  of one (``"2*d"``); each symbol is drawn by Hypothesis in its ``(low, high)`` range;
* ``torch`` (optional): the twin, called ``torch(torch, torch.nn.functional, **tensors)``, so
  that declaring imports nothing; the oracle compares the forward and, through
  ``torch.autograd``, the backward with it;
* ``smooth`` (optional): ``smooth(**arrays) -> bool``, False where a central difference would
  cross a kink (the draw is discarded, never judged).

The suite derives FD, oracle (with a twin), invariant and bad-input checks from each
declaration (their ids and rules: spec/suite/declared.py).  A malformed declaration
is a :class:`~minibert_spec.protocol.capabilities.DeclarationError`: one line naming the op, the
field, what was given and what is accepted.  This module validates and describes; it draws
nothing and imports neither Hypothesis nor torch.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from minibert_spec.builtin import KINDS, SIZE, Arg, OpDeclaration, shape_of
from minibert_spec.protocol import OPS as TABLE
from minibert_spec.protocol.capabilities import DeclarationError

__all__ = ["Arg", "OpDeclaration", "KINDS", "array", "ints", "bools", "scalar", "declare",
           "declared_ops", "shape_of", "DeclarationError", "ATTRIBUTE", "MAX_SIZE"]

# the attribute of a user's module or object that lists its declared ops (beside CAPABILITIES)
ATTRIBUTE = "OPS"
# the largest size a symbol may be drawn at: FD costs two forwards per entry it localises, and
# a declared op is checked on small shapes (as torch.autograd.gradcheck's users do)
MAX_SIZE = 64
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def array(*shape, low: float = -2.0, high: float = 2.0) -> Arg:
    """A differentiable float array of ``shape``, entries drawn in [low, high]."""
    return Arg("array", tuple(shape), float(low), float(high))


def ints(*shape, low: int = 0, high: int = 1) -> Arg:
    """An integer array of ``shape`` (ids, positions), entries drawn in [low, high]."""
    return Arg("ints", tuple(shape), int(low), int(high))


def bools(*shape) -> Arg:
    """A boolean array of ``shape`` (a mask)."""
    return Arg("bools", tuple(shape), 0, 1)


def scalar(value) -> Arg:
    """A fixed keyword argument (an int, a float, a string, a bool), passed as it is."""
    return Arg("scalar", (), value=value)


def _refuse(name, what: str, got, expected: str):
    raise DeclarationError(f"{ATTRIBUTE}[{name!r}].{what}: expected {expected}, got {got!r}")


def _symbols(size) -> str | None:
    """The symbol a size names (None for a literal int); a DeclarationError-worthy size: ''."""
    if isinstance(size, bool):
        return ""
    if isinstance(size, int):
        return None if size >= 1 else ""
    m = SIZE.match(size) if isinstance(size, str) else None
    return m["sym"] if m else ""


def declare(name: str, *, forward: Callable, backward: Callable, args: Mapping[str, Arg],
            sizes: Mapping[str, tuple[int, int]] | None = None, torch: Callable | None = None,
            smooth: Callable | None = None) -> OpDeclaration:
    """Declare one op (see the module's docstring); a malformed declaration is a
    DeclarationError naming the field, what was given and what is accepted."""
    if not isinstance(name, str) or not _NAME.match(name):
        _refuse(name, "name", name, "a lower-case identifier such as 'geglu' ([a-z][a-z0-9_]*)")
    if name in TABLE:
        _refuse(name, "name", name, f"a name that is not a built-in op ({', '.join(TABLE)})")
    for what, fn in (("forward", forward), ("backward", backward)):
        if not callable(fn):
            _refuse(name, what, fn, "a function")
    for what, fn in (("torch", torch), ("smooth", smooth)):
        if fn is not None and not callable(fn):
            _refuse(name, what, fn, "a function, or None")
    if not isinstance(args, Mapping) or not args:
        _refuse(name, "args", args, "a non-empty dict {argument name: ops.array(...) | "
                "ops.ints(...) | ops.bools(...) | ops.scalar(...)}")
    sizes = dict(sizes or {})
    for sym, rng in sizes.items():
        ok = (isinstance(rng, tuple) and len(rng) == 2
              and all(isinstance(v, int) and not isinstance(v, bool) for v in rng)
              and 1 <= rng[0] <= rng[1] <= MAX_SIZE)
        if not ok:
            _refuse(name, f"sizes[{sym!r}]", rng, f"a pair (low, high) of ints, 1 <= low <= high"
                    f" <= {MAX_SIZE}")
    used = set()
    for arg, spec in args.items():
        if not isinstance(arg, str) or not arg.isidentifier():
            _refuse(name, "args", arg, "argument names that are Python identifiers")
        if not isinstance(spec, Arg):
            _refuse(name, f"args[{arg!r}]", spec, "ops.array(...), ops.ints(...), "
                    "ops.bools(...) or ops.scalar(value)")
        for s in spec.shape:
            sym = _symbols(s)
            if sym == "":
                _refuse(name, f"args[{arg!r}].shape", spec.shape, "sizes that are positive "
                        "ints, symbols of sizes ('d') or multiples of one ('2*d')")
            if sym is not None and sym not in sizes:
                _refuse(name, f"args[{arg!r}].shape", s, f"a symbol of sizes {sorted(sizes)}")
            used.add(sym)
        if spec.kind != "scalar" and not spec.low <= spec.high:
            _refuse(name, f"args[{arg!r}]", (spec.low, spec.high), "low <= high")
    if not any(a.differentiable for a in args.values()):
        _refuse(name, "args", sorted(args), "at least one ops.array(...) (a differentiable "
                "input: the backward's gradients are what is checked)")
    unused = sorted(set(sizes) - used)
    if unused:
        _refuse(name, "sizes", unused, "symbols that some argument's shape uses")
    return OpDeclaration(name, inputs=tuple(args), forward=forward, backward=backward,
                         args=dict(args), sizes=sizes, torch=torch, smooth=smooth)


def declared_ops(impl) -> tuple[OpDeclaration, ...]:
    """The ops ``impl`` (a module, an object, a proxy of either) declares in its ``OPS``
    attribute, validated: () when it has none; a DeclarationError when ``OPS`` is not a list
    of :func:`declare` results with distinct names."""
    try:
        obj = object.__getattribute__(impl, "_impl_obj")  # past a proxy (it raises on misses)
    except AttributeError:
        obj = impl
    try:
        declared = getattr(obj, ATTRIBUTE, None)
    except Exception as e:  # noqa: BLE001 -- a module __getattr__ failing: refused, named
        raise DeclarationError(f"{ATTRIBUTE}: reading it raised {type(e).__name__}: {e}"
                               ) from None
    if declared is None:
        return ()
    if not isinstance(declared, (list, tuple)):
        raise DeclarationError(f"{ATTRIBUTE}: expected a list of minibert_spec.ops.declare(...)"
                               f", got {type(declared).__name__}")
    seen = set()
    for i, d in enumerate(declared):
        if not isinstance(d, OpDeclaration) or d.forward is None:  # a built-in op's OP is no user's
            raise DeclarationError(f"{ATTRIBUTE}[{i}]: expected minibert_spec.ops.declare(...),"
                                   f" got {type(d).__name__}")
        if d.name in seen:
            raise DeclarationError(f"{ATTRIBUTE}[{i}]: the name {d.name!r} is declared twice")
        seen.add(d.name)
    return tuple(declared)
