"""Declarative adapters for class-style implementations: a layer class, or an optimizer class that
updates its parameters in place, described by a mapping instead of adapter code.

A class-style layer keeps its activations on ``self`` and its gradients in attributes (``dW``,
or ``W.grad`` on a parameter object, often accumulated with ``+=``).  :func:`layer` turns such a
class into the protocol's op pair, with the protocol's own signature (taken from the reference
function of the op-table row)::

    linear_forward, linear_backward = layer(
        "linear", lambda W, b: Linear(*W.shape, bias=b is not None),
        params={"W": "W", "b": "b"}, grads={"W": "dW", "b": "db"})

* a **fresh layer per forward call** (the layer is the cache: a second forward can never
  overwrite the activations a pending backward needs);
* ``new`` builds it: a callable whose parameter names are protocol arguments of the forward
  (``lambda W, b: ...``, or the class itself when its ``__init__`` already uses them);
* ``params`` then sets protocol arguments as attributes (a dotted path: ``"W.value"``; a path
  through a dict uses its keys);
* ``inputs`` are the protocol arguments passed to the forward method (default: the first);
* ``grads`` maps each differentiable input to the attribute holding its gradient after the
  backward method (``"dW"``, ``"W.grad"``); the remaining differentiable input gets the
  backward method's return value (``None`` for an absent bias);
* ``accumulate=True``: the layer *adds* into its gradient attributes (``+=``): they are set to
  zeros of the parameter's shape and dtype before each backward, and the suite checks the
  declaration (``invariant[<op>.grad_accumulates]``: two backward calls sum);
* ``upstream=False``: the backward method takes no upstream gradient (a loss layer returning
  the gradient of a loss of 1): every gradient is scaled by ``dloss``.

A protocol keyword the mapping does not pass on (a mask, ``reduction="sum"``, a bias the class
has no place for) is accepted at its protocol default only; any other value makes the check
*not applicable*, naming the argument -- never silently dropped.

:func:`optimizer` does the same for an optimizer class whose ``step(params, grads)`` updates in
place: the protocol's ``adam_step`` is pure (a deep copy of the optimizer per step).
"""

from __future__ import annotations

import copy
import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from spec.protocol import OPS, NotApplicable

__all__ = ["layer", "optimizer", "LayerSpec", "get_path", "set_path"]


# --------------------------------------------------------------------------- attribute paths
def get_path(obj, path: str):
    """``obj.a.b`` for the path ``"a.b"`` (a dict on the way is indexed by the component)."""
    for part in path.split("."):
        obj = obj[part] if isinstance(obj, Mapping) else getattr(obj, part)
    return obj


def set_path(obj, path: str, value) -> None:
    *head, last = path.split(".")
    for part in head:
        obj = obj[part] if isinstance(obj, Mapping) else getattr(obj, part)
    if isinstance(obj, dict):
        obj[last] = value
    else:
        setattr(obj, last, value)


def protocol_signature(op: str, which: str) -> inspect.Signature:
    """The signature of the protocol function ``which`` ("forward"/"backward") of ``op``: the
    reference's own (the table's ``module``)."""
    row = OPS[op]
    if row.pair is None:
        raise ValueError(f"layer: {op!r} is not an op pair of the table")
    name = row.pair[0] if which == "forward" else row.pair[1]
    return inspect.signature(getattr(importlib.import_module(f"reference.{row.module}"), name))


def _is_default(value, default) -> bool:
    if default is inspect.Parameter.empty:
        return False
    if value is None or default is None:
        return value is default
    try:
        return bool(np.all(value == default)) and np.shape(value) == np.shape(default)
    except Exception:  # noqa: BLE001 -- incomparable: not the default
        return False


# --------------------------------------------------------------------------- layers
@dataclass
class LayerSpec:
    """What :func:`layer` was told (kept on the generated functions as ``__minibert_layer__``:
    the accumulation check reads it)."""

    op: str
    new: Callable
    params: Mapping[str, str] = field(default_factory=dict)
    grads: Mapping[str, str] = field(default_factory=dict)
    inputs: tuple[str, ...] = ()
    forward: str = "forward"
    backward: str = "backward"
    accumulate: bool = False
    upstream: bool = True

    def zero_grads(self, cache) -> None:
        for name, path in self.grads.items():
            if cache.args.get(name) is not None:
                set_path(cache.layer, path, np.zeros_like(cache.args[name]))

    def run_backward(self, cache, dout):
        """The layer's own backward method (no zeroing): its return value."""
        method = getattr(cache.layer, self.backward)
        return method(dout) if self.upstream else method()

    def read_grads(self, cache) -> dict:
        return {n: get_path(cache.layer, p) for n, p in self.grads.items()
                if cache.args.get(n) is not None}


class LayerCache:
    """The cache of a layer's forward: the fresh layer and the protocol arguments it got."""

    def __init__(self, layer, args):
        self.layer, self.args = layer, args

    def __repr__(self) -> str:
        return f"<cache: {type(self.layer).__name__}>"


def layer(op: str, new: Callable, *, params: Mapping[str, str] | None = None,
          grads: Mapping[str, str] | None = None, inputs: tuple[str, ...] | None = None,
          forward: str = "forward", backward: str = "backward", accumulate: bool = False,
          upstream: bool = True) -> tuple[Callable, Callable]:
    """``(X_forward, X_backward)`` of op ``op`` backed by a fresh class-style layer per call
    (see the module's docstring for every argument)."""
    fsig = protocol_signature(op, "forward")
    names = list(fsig.parameters)
    params, grads = dict(params or {}), dict(grads or {})
    inputs = tuple(inputs) if inputs is not None else (names[0],)
    wanted = [p.name for p in inspect.signature(new).parameters.values()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    required = [p.name for p in inspect.signature(new).parameters.values()
                if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for what, keys in (("new", required), ("params", params), ("inputs", inputs),
                       ("grads", grads)):
        unknown = [k for k in keys if k not in names]
        if unknown:
            raise ValueError(f"layer({op!r}): {what} names {unknown}, not arguments of the "
                             f"protocol's {OPS[op].pair[0]}{fsig}")
    diff = OPS[op].inputs
    used = set(wanted) | set(params) | set(inputs)
    spec = LayerSpec(op, new, params, grads, inputs, forward, backward, accumulate, upstream)

    def forward_fn(*args, **kwargs):
        bound = fsig.bind(*args, **kwargs)
        bound.apply_defaults()
        a = dict(bound.arguments)
        for n in names:
            if n not in used and not _is_default(a[n], fsig.parameters[n].default):
                raise NotApplicable(
                    f"not applicable: the class layer adapted for {op} ({_label(new)}) takes no "
                    f"{n} (only the protocol default {fsig.parameters[n].default!r})")
        for n in params:
            if a[n] is None and n not in wanted:  # the class has a slot the call leaves out
                raise NotApplicable(f"not applicable: the class layer adapted for {op} "
                                    f"({_label(new)}) always has {n}; called with {n}=None")
        obj = new(**{n: a[n] for n in wanted if n in a})
        for n, path in params.items():
            set_path(obj, path, a[n])
        out = getattr(obj, forward)(*(a[n] for n in inputs))
        return out, LayerCache(obj, a)

    def backward_fn(dout, cache):
        if accumulate:
            spec.zero_grads(cache)
        r = spec.run_backward(cache, dout)
        got = spec.read_grads(cache)
        rs = list(r) if isinstance(r, tuple) else [r]
        out = []
        for n in diff:
            if cache.args.get(n) is None and n in fsig.parameters and \
                    fsig.parameters[n].default is None:
                out.append(None)
            elif n in grads:
                out.append(got[n])
            else:
                out.append(rs.pop(0) if rs else None)
        if not upstream:  # the layer's gradients are those of a loss of 1
            out = [g if g is None else g * np.asarray(g).dtype.type(dout) for g in out]
        return tuple(out)

    fwd_name, bwd_name = OPS[op].pair
    for fn, name in ((forward_fn, fwd_name), (backward_fn, bwd_name)):
        fn.__name__ = fn.__qualname__ = name
        fn.__doc__ = f"{name}: the class layer {_label(new)} through spec.suite.adapters.layer"
        fn.__minibert_layer__ = spec
    forward_fn.__signature__ = fsig
    return forward_fn, backward_fn


def _label(new) -> str:
    return getattr(new, "__qualname__", None) or type(new).__name__


# --------------------------------------------------------------------------- optimizers
def optimizer(new: Callable, *, step: str = "step", hyper: Mapping, m, v, t: str = "t",
              no_decay: str | None = None) -> tuple[Callable, Callable]:
    """``(adam_init, adam_step)`` for an optimizer class updating parameters in place.

    new:      ``new(params) -> optimizer``
    step:     its method ``step(params, grads)`` updating ``params`` (a dict) in place
    hyper:    protocol keyword (``lr``, ``beta1``, ``beta2``, ``eps``, ``weight_decay``) ->
              attribute path set before each step; a tuple of keywords sets a tuple
              (``("beta1", "beta2"): "betas"``).  Keywords not listed are not in the
              signature (no ``weight_decay``: declare CAPABILITIES["weight_decay"] = False)
    m, v:     attribute paths of the moment dicts, or ``optimizer -> dict`` callables
    t:        attribute path of the step counter
    no_decay: the step method's keyword taking a collection of undecayed names, if it has one
              (without it the suite applies the protocol's default rule itself, and says so)

    The state is ``{"step", "m", "v", "opt"}``; each step deep-copies ``opt`` (the protocol's
    ``adam_step`` is pure) and the parameters."""
    flat = {k: path for keys, path in hyper.items()
            for k in (keys if isinstance(keys, tuple) else (keys,))}
    defaults = {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}
    unknown = sorted(set(flat) - {"lr", *defaults})
    if unknown or "lr" not in flat:
        raise ValueError(f"optimizer: hyper keys {sorted(flat)}: expected lr and some of "
                         f"{sorted(defaults)}")

    def _get(opt, what):
        return what(opt) if callable(what) else get_path(opt, what)

    def state_of(opt):
        return {"step": get_path(opt, t), "m": _get(opt, m), "v": _get(opt, v), "opt": opt}

    def adam_init(params):
        return state_of(new(params))

    def adam_step(params, grads, state, **kw):
        opt = copy.deepcopy(state["opt"])
        for keys, path in hyper.items():
            if isinstance(keys, tuple):
                set_path(opt, path, tuple(kw.get(k, defaults.get(k)) for k in keys))
            else:
                set_path(opt, path, kw.get(keys, defaults.get(keys)))
        new_params = {k: np.array(p, copy=True) for k, p in params.items()}
        extra = {}
        if no_decay is not None:
            nd = kw.get("no_decay")
            if nd is None:
                from reference.optim import default_no_decay as nd
            extra[no_decay] = [k for k in params if nd(k)] if callable(nd) else list(nd)
        getattr(opt, step)(new_params, grads, **extra)
        return new_params, state_of(opt)

    P = inspect.Parameter
    adam_step.__signature__ = inspect.Signature(
        [P("params", P.POSITIONAL_OR_KEYWORD), P("grads", P.POSITIONAL_OR_KEYWORD),
         P("state", P.POSITIONAL_OR_KEYWORD), P("lr", P.KEYWORD_ONLY)]
        + [P(k, P.KEYWORD_ONLY, default=d) for k, d in defaults.items() if k in flat]
        + ([P("no_decay", P.KEYWORD_ONLY, default=None)] if no_decay is not None else []))
    return adam_init, adam_step
