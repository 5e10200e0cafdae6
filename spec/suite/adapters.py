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
* ``params`` then sets protocol arguments as attributes, by *path*: ``"W"``, ``"W.value"``, a
  dict's key ``"p.W_q"``, a list's item ``"heads[0].W"`` or ``"layers[2].b"`` (a Sequential);
  a tuple of paths sets one value at each (``"eps": ("norm1.eps", "norm2.eps")``: a block
  whose two LayerNorms share the call's eps); a ``None`` (an absent bias) whose path leads
  through a missing or ``None`` sub-object is skipped -- the layer simply has no bias;
* a **block** (``block_forward(x, p, ...)``, ``p`` a dict of parameters): ``params`` and
  ``grads`` name the entries of ``p`` one by one (``{"attn.W_q": "attention.W_q", ...}``);
  the backward's ``grads`` dict is made of the declared ones, and an entry of ``p`` the mapping
  has no place for makes the call *not applicable*, naming it.  ``parts`` derives these
  mappings from the block's sub-layers' own ``layer()`` declarations: ``parts={"attn":
  ("attention", attention_forward), "ln1": ("norm1", layernorm_forward), ...}`` maps
  ``attn.W_q`` to ``"attention." + `` the attention declaration's path of ``W_q``, for
  ``params`` and ``grads`` alike;
* ``inputs`` are the protocol arguments passed to the forward method (default: the first);
  ``output=0``: the forward returns a tuple ``(out, extra)``, ``out`` is its item 0;
* ``grads`` maps each differentiable input to the path of its gradient after the backward:
  an attribute of the layer (``"dW"``, ``"W.grad"``, ``"layers[0].dW"``) or a part of what the
  backward returned, rooted at ``return`` (``"return[1].W"``: the backward returns ``(dx,
  {"W": dW})``); the remaining differentiable inputs get the backward's other return values
  in order (``None`` for an absent bias);
* ``again``: the backward needs the forward's inputs again (``ReLU.backward(x, dy)``:
  ``again=("x",)``; ``CrossEntropyLoss.backward(p, labels)``: ``again=("logits", "labels")``
  with ``upstream=False``).  Each entry is a protocol argument, ``"dout"`` (the upstream
  gradient, appended last when not named), ``"out"`` (the forward's output), ``"forward"``
  (everything the forward returned, ``"forward[1]"`` its item 1), ``"layer"`` (the layer
  object) or a path on the layer (``"layer.cache"``);
* ``backward`` is the layer's method name, or a plain function called with the ``again``
  arguments (``backward=mha_backward, again=("layer", "dout", "layer.cache")``);
* ``forward`` likewise: a plain function (function-style code, no class: ``new=None``) is
  called with the ``inputs`` in order (``layer("softmax", None, forward=softmax,
  backward=softmax_backward, again=("dout", "out"))``; a forward returning ``(out, cache)``
  with ``output=0, again=("dout", "forward[1]")``);
* ``transposed=("W",)``: the layer stores these parameters transposed (an embedding ``[d,
  V]``, a torch-style Linear ``[out, in]``): ``new``, ``params`` and ``inputs`` get ``W.T``,
  and the gradient read back (an attribute, or a value the backward returned) is transposed
  to the protocol's layout;
* ``fixed={"approximate": "tanh"}``: the class computes this one value of a protocol
  argument (a tanh-only GELU): a call with another value is not applicable, naming it, and a
  call leaving the keyword out is that value.  A variant's argument (``fixed={"activation":
  "gelu_tanh"}``, ``{"causal": True}``) goes with the same one form in ``CAPABILITIES``
  (``{"ffn": {"activation": "gelu_tanh"}}``); any other declaration is refused, naming both;
* ``mask=``: an attention or block class takes its own mask format (an additive float mask
  ``[B, 1, T, T]`` of 0 and -1e9, a boolean ``[B, T, T]``, a padding mask beside its own causal
  one): a converter from the suite's ``[B, T]`` key mask (1 = attend, 0 = padded; or None) and
  ``causal``, naming what it needs among ``mask, causal, T, dtype`` (``mask=lambda mask,
  causal, T, dtype: ...``), whose result is passed as the input ``"mask"`` (appended to
  ``inputs`` unless placed there).  The keywords it names are taken (a mask it does not name
  stays *not applicable*); a converter that raises, returns None for a mask, or a shape no
  ``[B, T]`` keys' mask has is a red naming it (``minibert_spec.suite.adapter_masks``);
* ``accumulate=True``: the layer *adds* into its gradient attributes (``+=``): they are set to
  zeros of the parameter's shape and dtype before each backward, and the suite checks the
  declaration (``invariant[<op>.grad_accumulates]``: two backward calls sum);
* ``single_use=True``: the backward frees the forward's activations (``del self.x``): each
  backward runs on a copy of the forward's layer (a check may differentiate one forward
  twice), and the accumulation check, which needs two backward calls on one layer, is not
  applicable, saying so;
* ``upstream=False``: the backward method takes no upstream gradient (a loss layer returning
  the gradient of a loss of 1): every gradient is scaled by ``dloss`` (per position, for a
  loss declared ``CAPABILITIES["cross_entropy"] = {"reduction": "none"}``).

A protocol keyword the mapping does not pass on (a mask, ``reduction="sum"``, a bias the class
has no place for) is accepted at its protocol default only; any other value makes the check
*not applicable*, naming the argument -- never silently dropped.

:func:`optimizer` does the same for an optimizer whose step updates parameters in place, in
each shape real code has: ``step(params, grads)`` on a dict it is given; an optimizer that owns
its parameters (``params="params"``: ``step(grads)``); one over parameter objects whose step()
reads ``p.grad`` (``params="parameters", value="data", grad="grad"``); one bound to a model
(``bound=True``: ``new(model)`` gets a stand-in model holding the parameters and gradients);
and a trainer's per-name update method (``each="_adam_update"``).  Hyperparameters handed to
the step rather than set as attributes are ``hyper`` entries ending in ``=`` (``{"lr": "lr="}``:
``opt.step(params, grads, lr=lr_t)``); a step counter the training loop keeps is ``t="t="``
(passed as that keyword) or ``"t"`` in ``each_args``, with its convention ``first_t=1`` or ``0``
(its value at the first step), the suite counting the steps.  The protocol's ``adam_step`` is
pure: a deep copy of the optimizer per step (``minibert_spec.suite.adapter_optim``).

:func:`decoder` adapts a causal decoder written with its own parameter names (the ``decoder``
row): its forward, backward and loss, and a name map applied exactly both ways -- per-layer names
with ``{i}``, a fused tensor joining W_q | W_k | W_v, tensors stored transposed; a protocol
name no rule maps, or a gradient missing or left over, is a ValueError naming it
(``minibert_spec.suite.adapter_decoder``).
"""

from __future__ import annotations

import copy
import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from minibert_spec.protocol import OPS, NotApplicable
from minibert_spec.suite.adapter_decoder import DecoderRow, decoder
from minibert_spec.suite.adapter_masks import callable_name, mask_converter
from minibert_spec.suite.adapter_optim import StandInModel, optimizer
from minibert_spec.suite.adapter_paths import EACH, _get, _step, get_path, path_parts, set_path

__all__ = ["layer", "optimizer", "decoder", "LayerSpec", "StandInModel", "DecoderRow", "get_path",
           "set_path", "path_parts", "EACH"]


def protocol_signature(op: str, which: str) -> inspect.Signature:
    """The signature of the protocol function ``which`` ("forward"/"backward") of ``op``: the
    reference's own (the table's ``module``)."""
    row = OPS[op]
    if row.pair is None:
        raise ValueError(f"layer: {op!r} is not an op pair of the table")
    name = row.pair[0] if which == "forward" else row.pair[1]
    module = importlib.import_module(f"minibert_reference.{row.module}")
    return inspect.signature(getattr(module, name))


def _is_default(value, default) -> bool:
    if default is inspect.Parameter.empty:
        return False
    if value is None or default is None:
        return value is default
    try:
        return bool(np.all(value == default)) and np.shape(value) == np.shape(default)
    except Exception:  # noqa: BLE001 -- incomparable: not the default
        return False


def _t(a):
    """A parameter in the other layout (``transposed``): its last two axes swapped."""
    return None if a is None else np.ascontiguousarray(np.swapaxes(np.asarray(a), -1, -2))


# --------------------------------------------------------------------------- layers
RETURN = "return"  # the root of a gradient path into what the backward returned


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
    backward: str | Callable = "backward"
    accumulate: bool = False
    upstream: bool = True
    again: tuple[str, ...] = ()
    output: int | None = None
    transposed: tuple[str, ...] = ()
    single_use: bool = False
    fixed: Mapping = field(default_factory=dict)

    @property
    def attribute_grads(self) -> dict[str, str]:
        """The gradients the layer keeps as attributes (not returned by its backward)."""
        return {n: p for n, p in self.grads.items() if path_parts(p)[0] != RETURN}

    def zero_grads(self, cache) -> None:
        for name, path in self.attribute_grads.items():
            if cache.args.get(name) is not None:
                set_path(cache.layer, path, np.zeros_like(self._layout(name, cache.args[name])))

    def _layout(self, name, a):
        return _t(a) if name in self.transposed else a

    def _context(self, cache, dout, name: str):
        parts = path_parts(name)
        root = parts[0]
        if root == "dout":
            value = dout
        elif root == "layer":
            value = cache.layer
        elif root == "out":
            value = cache.out
        elif root == "forward":
            value = cache.returned
        elif root in cache.args:
            value = self._layout(root, cache.args[root])
        else:
            raise ValueError(f"layer({self.op!r}): again names {name!r}: expected a protocol "
                             "argument, dout, out, forward[i], layer or layer.<path>")
        return _get(value, parts[1:])

    def run_backward(self, cache, dout):
        """The layer's own backward (no zeroing): its return value."""
        names = list(self.again)
        if self.upstream and "dout" not in names:
            names.append("dout")
        args = [self._context(cache, dout, n) for n in names]
        if callable(self.backward):
            return self.backward(*args)
        return getattr(cache.layer, self.backward)(*args)

    def read_grads(self, cache, returned=None) -> dict:
        """Each declared gradient (attribute paths; ``return...`` paths from ``returned``), in
        the protocol's layout."""
        out = {}
        for n, path in self.grads.items():
            if cache.args.get(n) is None:
                continue
            parts = path_parts(path)
            if parts[0] == RETURN:
                if returned is None:
                    continue
                value = _get(returned, parts[1:])
            else:
                value = get_path(cache.layer, path)
            out[n] = _t(value) if n in self.transposed else value
        return out


class _Stateless:
    """The layer of function-style code (``new=None``): nothing but the cache's place."""


class LayerCache:
    """The cache of a layer's forward: the fresh layer, the protocol arguments it got, and
    what its forward returned (``returned``; ``out``: the output the protocol sees)."""

    def __init__(self, layer, args, returned=None, out=None):
        self.layer, self.args, self.returned, self.out = layer, args, returned, out

    def __repr__(self) -> str:
        return f"<cache: {type(self.layer).__name__}>"


def layer(op: str, new: Callable | None, *, params: Mapping[str, str] | None = None,
          grads: Mapping[str, str] | None = None, inputs: tuple[str, ...] | None = None,
          forward: str | Callable = "forward", backward: str | Callable = "backward",
          accumulate: bool = False, upstream: bool = True, again: tuple[str, ...] = (),
          output: int | None = None, transposed: tuple[str, ...] = (),
          single_use: bool = False, fixed: Mapping | None = None,
          parts: Mapping[str, tuple[str, Callable]] | None = None,
          mask: Callable | None = None) -> tuple[Callable, Callable]:
    """``(X_forward, X_backward)`` of op ``op`` backed by a fresh class-style layer per call
    (see the module's docstring for every argument)."""
    fsig = protocol_signature(op, "forward")
    names = list(fsig.parameters)
    dict_arg, entries = _dict_argument(op)
    params = {**_from_parts(op, parts, "params", entries), **(params or {})}
    grads = {**_from_parts(op, parts, "grads", entries), **(grads or {})}
    inputs = tuple(inputs) if inputs is not None else (names[0],)
    again = (again,) if isinstance(again, str) else tuple(again)
    transposed = (transposed,) if isinstance(transposed, str) else tuple(transposed)
    if new is None and not callable(forward):
        raise ValueError(f"layer({op!r}): new=None (no class) needs a function as forward, "
                         f"got forward={forward!r}")
    if new is None and params:
        raise ValueError(f"layer({op!r}): params names attributes of a layer; with new=None "
                         f"(a forward function) pass the arguments as inputs, got {params}")
    label = callable_name(new if new is not None else forward)
    new = _Stateless if new is None else new
    wanted = [p.name for p in inspect.signature(new).parameters.values()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    required = [p.name for p in inspect.signature(new).parameters.values()
                if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for what, keys in (("new", required), ("params", params), ("inputs", inputs),
                       ("grads", grads), ("transposed", transposed)):
        unknown = [k for k in keys if k not in names and (what == "new" or k not in entries)]
        if unknown:
            raise ValueError(f"layer({op!r}): {what} names {unknown}, not arguments of the "
                             f"protocol's {OPS[op].pair[0]}{fsig}"
                             + (f" nor keys of its {dict_arg} ({', '.join(sorted(entries))})"
                                if entries else ""))
    bad = {n: g for n, g in grads.items() if not isinstance(g, str)}
    if bad:
        raise ValueError(f"layer({op!r}): grads {bad}: expected one path per gradient")
    for path in [q for v in params.values() for q in _paths(v)] + list(grads.values()):
        path_parts(path)  # a malformed path: refused here, not at the first check
    mapped = [k for k in {**params, **grads} if k in entries]  # entries of the dict argument
    diff = OPS[op].inputs
    fixed = dict(fixed or {})
    unknown = [k for k in fixed if k not in names]
    if unknown:
        raise ValueError(f"layer({op!r}): fixed names {unknown}, not arguments of the "
                         f"protocol's {OPS[op].pair[0]}{fsig}")
    fsig = _pinned(fsig, fixed)
    converter = None
    if mask is not None:  # the class's own mask made from the protocol's mask and causal
        if "mask" not in names or "causal" not in names:
            raise ValueError(f"layer({op!r}): mask= converts the protocol's mask and causal; "
                             f"expected an op whose forward takes both, got {OPS[op].pair[0]}"
                             f"{fsig}")
        converter = mask_converter(op, mask)
    used = set(wanted) | set(params) | set(inputs) | set(fixed) | ({dict_arg} if mapped else set())
    if converter is not None:  # what it reads is taken; a mask it ignores stays n/a
        used |= set(converter.names) & {"mask", "causal"}
        inputs += () if "mask" in inputs else ("mask",)
    spec = LayerSpec(op, new, params, grads, inputs, forward, backward, accumulate, upstream,
                     again, output, transposed, single_use, fixed)
    for name in again:
        root = path_parts(name)[0]
        if root not in ("dout", "layer", "out", "forward") and root not in names:
            raise ValueError(f"layer({op!r}): again names {name!r}: expected a protocol "
                             "argument, dout, out, forward[i], layer or layer.<path>")

    def forward_fn(*args, **kwargs):
        bound = _bind(fsig, used, args, kwargs)
        bound.apply_defaults()
        a = {n: v for n, v in bound.arguments.items() if v is not _OMITTED}
        for n, value in fixed.items():  # the one value of this argument the class computes
            if not _is_default(a[n], value):
                raise NotApplicable(f"not applicable: the class layer adapted for {op} "
                                    f"({label}) computes {n}={value!r} only (called "
                                    f"with {n}={a[n]!r})")
        for n in a:  # an argument the mapping does not pass: its default, or absent
            if n not in used and not _absent(op, n, a[n]) and \
                    not _is_default(a[n], fsig.parameters[n].default):
                raise NotApplicable(
                    f"not applicable: the class layer adapted for {op} ({label}) takes no "
                    f"{n} (only the protocol default {fsig.parameters[n].default!r})")
        if mapped:  # the dict argument's entries, one by one, as the layer's own arguments
            extra = sorted(set(a[dict_arg]) - set(params))
            if extra:
                raise NotApplicable(f"not applicable: the class layer adapted for {op} "
                                    f"({label}) has no place for {dict_arg}[{extra[0]!r}] "
                                    f"(params maps no path to {', '.join(extra)})")
            a = {**a, **{k: a[dict_arg].get(k) for k in mapped}}
        own = {n: spec._layout(n, v) for n, v in a.items()}  # the layer's layout
        if converter is not None:  # inputs' "mask": the class's own format
            own["mask"] = converter(a.get("mask"), a.get("causal", False), a[names[0]])
        obj = new(**{n: own[n] for n in wanted if n in own})
        for n, paths in params.items():
            if a[n] is None and n not in wanted and any(_has_slot(obj, q) for q in _paths(paths)):
                # the class has a slot the call leaves out (new cannot be told to drop it)
                called = f"a {dict_arg} without {n}" if n in entries else f"{n}=None"
                raise NotApplicable(f"not applicable: the class layer adapted for {op} "
                                    f"({label}) always has {n}; called with {called}")
            for path in _paths(paths):
                set_path(obj, path, own[n])
        returned = (forward if callable(forward) else getattr(obj, forward))(
            *(own[n] for n in inputs))
        out = returned[output] if output is not None else returned
        return out, LayerCache(obj, a, returned, out)

    returned = [p for p in map(path_parts, grads.values()) if p[0] == RETURN]
    taken = {p[1] for p in returned if len(p) > 1 and isinstance(p[1], int)}
    whole = any(len(p) == 1 or not isinstance(p[1], int) for p in returned)

    def backward_fn(dout, cache):
        if single_use:  # the backward frees what it reads: run it on a copy, so that a check
            # may call the backward again on the same forward (a gradient read twice)
            cache = LayerCache(copy.deepcopy(cache.layer), cache.args, cache.returned, cache.out)
        if accumulate:
            spec.zero_grads(cache)
        r = spec.run_backward(cache, dout)
        got = spec.read_grads(cache, r)
        rs = [] if whole else [x for i, x in enumerate(r) if i not in taken] \
            if isinstance(r, tuple) else [r]
        out = []
        for n in diff:
            if n == dict_arg and mapped:  # the block's grads dict: its declared entries
                out.append({k: got[k] for k in grads if k in entries and k in got})
            elif cache.args.get(n) is None and n in fsig.parameters and \
                    fsig.parameters[n].default is None:
                out.append(None)
            elif n in grads:
                out.append(got.get(n))
            else:  # returned in the layer's own layout, as an attribute would be
                g = rs.pop(0) if rs else None
                out.append(_t(g) if n in transposed else g)
        if not upstream:  # the layer's gradients are those of a loss of 1 (per position)
            out = [g if g is None else _scaled(g, dout) for g in out]
        return tuple(out)

    fwd_name, bwd_name = OPS[op].pair
    for fn, name in ((forward_fn, fwd_name), (backward_fn, bwd_name)):
        fn.__name__ = fn.__qualname__ = name
        fn.__doc__ = f"{name}: the class layer {label} through minibert_spec.suite.adapters.layer"
        fn.__minibert_layer__ = spec
    # a variant's keyword the class does not take (input=, causal=, norm=) is not in the
    # visible signature: the class computes one form, the one its CAPABILITIES declare
    from minibert_spec.protocol.variants import VARIANTS

    hidden = {o.argument for o in VARIANTS.get(op, {}).values()} - used - {None}
    forward_fn.__signature__ = fsig.replace(
        parameters=[p for p in fsig.parameters.values() if p.name not in hidden])
    return forward_fn, backward_fn


_OMITTED = object()  # a keyword-only argument the call left out (see _bind)


def _pinned(fsig: inspect.Signature, fixed: Mapping) -> inspect.Signature:
    """The protocol signature with each ``fixed`` argument defaulting to its one value: the
    class computes that form, so a call leaving the keyword out (the suite's call for a single
    declared form, ``CAPABILITIES["ffn"] = {"activation": "gelu_tanh"}``) asks for it."""
    return fsig.replace(parameters=[
        p.replace(default=fixed[p.name]) if p.name in fixed and
        (p.kind is p.KEYWORD_ONLY or p.default is not p.empty) else p
        for p in fsig.parameters.values()])


def _paths(value) -> tuple[str, ...]:
    """A ``params`` value: one path, or a tuple of paths given the same value."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _dict_argument(op: str) -> tuple[str | None, frozenset]:
    """The op's argument that is a dict of parameters (the reference's forward annotates it
    ``dict``: the block's ``p``) and the keys it may carry (the row's ``params``), or
    ``(None, frozenset())``."""
    for name, prm in protocol_signature(op, "forward").parameters.items():
        if prm.annotation in (dict, "dict"):
            return name, frozenset(OPS[op].params)
    return None, frozenset()


def _from_parts(op: str, parts, which: str, entries) -> dict:
    """``params`` or ``grads`` (``which``) of a block from its sub-layers' declarations:
    ``parts[prefix] = (path, forward)`` maps the entry ``prefix.name`` to ``path`` joined with
    the path ``forward``'s own ``layer()`` declaration gives ``name``."""
    out = {}
    for prefix, part in (parts or {}).items():
        path, fwd = part
        sub = getattr(fwd, "__minibert_layer__", None)
        if sub is None:
            raise ValueError(f"layer({op!r}): parts[{prefix!r}] = ({path!r}, {fwd!r}): expected "
                             "(a path, a forward made by layer())")
        mine = {n: q for n, q in getattr(sub, which).items() if f"{prefix}.{n}" in entries}
        if not mine:
            raise ValueError(f"layer({op!r}): parts[{prefix!r}]: the {sub.op} declaration "
                             f"gives no {which} path of a {prefix}.* entry (its {which}: "
                             f"{dict(getattr(sub, which))}); map them in {which}=")
        for n, q in mine.items():
            if any(path_parts(x)[0] == RETURN for x in _paths(q)):
                raise ValueError(f"layer({op!r}): parts[{prefix!r}]: {n}'s gradient {q!r} is "
                                 "what the part's backward returns, out of the block's reach")
            joined = tuple(path + ("" if x.startswith("[") else ".") + x for x in _paths(q))
            out[f"{prefix}.{n}"] = joined if isinstance(q, (tuple, list)) else joined[0]
    return out


def _bind(fsig: inspect.Signature, used: set, args, kwargs) -> inspect.BoundArguments:
    """``fsig.bind``, except that a required keyword-only argument the class does not take
    may be left out: a declared variant drops it (attention.heads = "single" calls without
    n_heads), and a class that never sees it cannot miss it."""
    missing = {n: _OMITTED for n, p in fsig.parameters.items()
               if p.kind is p.KEYWORD_ONLY and p.default is p.empty and n not in used
               and n not in kwargs}
    return fsig.bind(*args, **kwargs, **missing)


def _absent(op: str, name: str, value) -> bool:
    """``value`` leaves the protocol argument ``name`` out: None, or a value a declared variant
    of ``op`` means "left out" by (eps = 0: LayerNorm without eps, a class with no eps)."""
    if value is None:
        return True
    from minibert_spec.protocol.variants import VARIANTS

    return any(name in o.pieces and any(_is_default(value, a) for a in o.absent if a is not None)
               for o in VARIANTS.get(op, {}).values())


def _has_slot(obj, path: str) -> bool:
    """The object has a place for the path's value: every sub-object on the way exists and is
    not None (a layer built without a bias has ``self.b = None``, or no ``b`` at all)."""
    *head, _ = path_parts(path)
    for part in head:
        if part == EACH:
            obj = obj[0] if len(obj) else None
        else:
            try:
                obj = _step(obj, part)
            except (AttributeError, KeyError, IndexError):
                return False
        if obj is None:
            return False
    return True


def _scaled(g, dout):
    """``g`` (the gradient of a loss of 1) times the upstream ``dout``: a scalar, or one
    weight per position (an unreduced loss) broadcast over the trailing axes."""
    g = np.asarray(g)
    w = np.asarray(dout)
    if w.ndim:
        w = w.reshape(w.shape + (1,) * (g.ndim - w.ndim))
    return g * w.astype(g.dtype) if np.issubdtype(g.dtype, np.floating) else g * w
