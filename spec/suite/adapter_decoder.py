"""The declarative adapter of a causal decoder written with its own parameter names
(:func:`decoder`, re-exported by :mod:`minibert_spec.suite.adapters`): the protocol's
``decoder_forward`` / ``decoder_backward`` / ``decoder_loss_and_grads`` made from the model's
own forward, backward and loss and a name map, applied exactly in both directions (see
``decoder``'s docstring for every argument)."""

from __future__ import annotations

import functools
import inspect
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from minibert_reference.config import DecoderConfig
from minibert_reference.decoder import param_shapes
from minibert_reference.ops import IGNORE_INDEX
from minibert_spec.protocol import NotApplicable
from minibert_spec.suite.adapter_masks import callable_name

__all__ = ["decoder", "DecoderRow"]

INDEX = "{i}"  # the layer index in a model's per-layer name ("h.{i}.ln_1.g")
LAYERS = "layers.{i}."  # the protocol's prefix of layer i's parameters
LOSS_ARGUMENTS = ("logits", "labels", "input_ids", "ignore_index", "cache")


@functools.cache
def protocol_names() -> tuple[frozenset, frozenset]:
    """The decoder row's whole names (embeddings, final norm, head) and a block's local names
    (``attn.W_q``, ``ln1.gamma``, ``swiglu.W_3``), in every form the row has: the reference's
    ``param_shapes`` of the two configs that hold every name (biased, LayerNorm, an untied
    biased head, the MLP or SwiGLU)."""
    whole, local = set(), set()
    first = LAYERS.replace(INDEX, "0")
    for ffn in ("mlp", "swiglu"):
        config = DecoderConfig(n_layers=1, ffn=ffn, attn_bias=True, mlp_bias=True,
                               tie_embeddings=False, final_norm=True, head_bias=True)
        for name in param_shapes(config):
            if name.startswith(first):
                local.add(name[len(first):])
            else:
                whole.add(name)
    return frozenset(whole), frozenset(local)


def _protocol_pattern(name, where: str) -> str:
    """A declared protocol name as a pattern: a whole name as it is, a block's local name as
    ``layers.{i}.<name>`` (the same tensor in every layer)."""
    whole, local = protocol_names()
    if isinstance(name, str) and name in whole:
        return name
    if isinstance(name, str) and name in local:
        return LAYERS + name
    raise ValueError(f"decoder: {where} names {name!r}: expected a parameter name of the "
                     f"decoder row (minibert_reference.decoder.param_shapes): one of "
                     f"{', '.join(sorted(whole))}, or a block's local name, the same in every "
                     f"layer: one of {', '.join(sorted(local))}")


def _own_pattern(own, protocol: str, where: str) -> str:
    """A model's name, checked against its protocol pattern: a per-layer tensor's name holds
    ``{i}`` (where the layer index goes), a whole one does not."""
    if not isinstance(own, str) or not own:
        raise ValueError(f"decoder: {where}: expected the model's name (a string), got {own!r}")
    per_layer = protocol.startswith(LAYERS)
    if per_layer != (INDEX in own):
        expected = "a name holding {i}, the layer index" if per_layer else "a name without {i}"
        raise ValueError(f"decoder: {where}: {protocol!r} is "
                         f"{'in every layer' if per_layer else 'one tensor'}: expected "
                         f"{expected}, got {own!r}")
    return own


@dataclass(frozen=True)
class Plan:
    """The name map for one number of layers: protocol name -> the model's (``simple``), the
    model's fused tensor -> the protocol names it joins along its last axis (``fused``)."""

    simple: dict
    fused: dict

    def target(self) -> dict:
        """Protocol name -> the model's tensor holding it."""
        return {**self.simple, **{p: own for own, parts in self.fused.items() for p in parts}}


def _plan(simple: Mapping, fused: Mapping, n_layers: int) -> Plan:
    """The patterns for layers 0..n_layers-1, each protocol name mapped once and each of the
    model's names produced once (two patterns meeting on one name is refused, naming it)."""

    def at(pattern, i):
        return pattern.replace(INDEX, str(i))

    def layers(pattern):
        return range(n_layers) if INDEX in pattern else (0,)

    s = {at(p, i): at(o, i) for p, o in simple.items() for i in layers(p)}
    f = {at(o, i): tuple(at(p, i) for p in parts) for o, parts in fused.items()
         for i in layers(o)}
    protocol = list(s) + [p for parts in f.values() for p in parts]
    own = list(s.values()) + list(f)
    for what, names in (("protocol name", protocol), ("model's name", own)):
        twice = sorted(n for n, count in Counter(names).items() if count > 1)
        if twice:
            raise ValueError(f"decoder: the {what} {twice[0]!r} is mapped twice (names= and "
                             f"fused= map each protocol name once, to a name of its own)")
    return Plan(s, f)


def _layered(patterns, n_layers: int) -> frozenset:
    """The model's names of ``patterns`` for layers 0..n_layers-1: a per-layer pattern
    (``h.{i}.attn.c_proj.w``) in every layer, a whole name as it is."""
    return frozenset(p.replace(INDEX, str(i)) for p in patterns
                     for i in (range(n_layers) if INDEX in p else (0,)))


def _swap(a, own: str):
    """A tensor in the other layout (``transposed``): its last two axes swapped (a view, so a
    model writing into it is still seen writing into the caller's array)."""
    a = np.asarray(a)
    if a.ndim < 2:
        raise ValueError(f"decoder: transposed names {own!r}, of shape {a.shape}: expected a "
                         "matrix")
    return np.swapaxes(a, -1, -2)


@dataclass
class Record:
    """What the forward gave the model: the protocol's keys in order, the model's keys, and
    each fused tensor's parts' sizes along the last axis (where the backward splits it)."""

    params: list
    own: dict  # the model's name -> the protocol names it holds
    sizes: dict
    transposed: frozenset = frozenset()  # the model's names stored transposed, every layer's


class DecoderCache:
    """The cache of a mapped forward: the name record and the model's own cache."""

    def __init__(self, record: Record, cache):
        self.record, self.cache = record, cache

    def __repr__(self) -> str:
        return f"<decoder cache: {type(self.cache).__name__}>"


def to_model(params: Mapping, plan: Plan, transposed) -> tuple[dict, Record]:
    """The protocol's parameters under the model's names, in the order of ``params``: a
    protocol name no rule maps, or a fused tensor with some of its parts missing, is a
    ValueError naming it (never a tensor the model silently does without)."""
    target = plan.target()
    left = [k for k in params if k not in target]
    if left:
        raise ValueError(f"decoder_forward: params {left}: no name of the model for them "
                         "(names= and fused= map none of them)")
    own, record = {}, Record(list(params), {}, {})
    for k in params:
        name = target[k]
        if name in own:
            continue
        parts = plan.fused.get(name, (k,))
        missing = [p for p in parts if p not in params]
        if missing:
            raise ValueError(f"decoder_forward: params has {k!r} but not {missing}: the "
                             f"model's {name!r} joins {list(parts)}")
        value = params[k] if len(parts) == 1 else np.concatenate([params[p] for p in parts], -1)
        own[name] = _swap(value, name) if name in transposed else value
        record.own[name] = parts
        if len(parts) > 1:
            record.sizes[name] = [np.shape(params[p])[-1] for p in parts]
    return own, record


def to_protocol(grads, record: Record, transposed) -> dict:
    """The model's gradients under the protocol's names, keyed exactly like the forward's
    params: a gradient missing (or None) or one of no parameter is a ValueError naming it --
    a dropped gradient is never taken as zero."""
    if not isinstance(grads, Mapping):
        raise ValueError(f"decoder_backward: the model's backward returned "
                         f"{type(grads).__name__}: expected a dict of gradients by its names")
    missing = [k for k in record.own if grads.get(k) is None]
    if missing:
        raise ValueError(f"decoder_backward: the model's gradients lack {missing} (of "
                         f"{[p for k in missing for p in record.own[k]]}): a gradient left out "
                         "is not taken as zero")
    extra = [k for k in grads if k not in record.own]
    if extra:
        raise ValueError(f"decoder_backward: the model's gradients {extra} are of no parameter "
                         f"it was given (expected exactly {list(record.own)})")
    out = {}
    for name, parts in record.own.items():
        g = _swap(grads[name], name) if name in transposed else grads[name]
        if len(parts) == 1:
            out[parts[0]] = g
            continue
        sizes = record.sizes[name]
        if np.shape(g)[-1] != sum(sizes):
            raise ValueError(f"decoder_backward: the gradient of {name!r} has shape "
                             f"{np.shape(g)}: expected a last axis of {sum(sizes)} "
                             f"({' + '.join(map(str, sizes))}, {', '.join(parts)})")
        out.update(zip(parts, np.split(g, np.cumsum(sizes)[:-1], -1)))
    return {k: out[k] for k in record.params}


def _loss_arguments(loss: Callable) -> tuple[str, ...]:
    """The arguments ``loss`` names among :data:`LOSS_ARGUMENTS` (passed by keyword); a
    required one outside them is refused, naming it."""
    if not callable(loss):
        raise ValueError(f"decoder: loss: expected a function of (some of) "
                         f"{', '.join(LOSS_ARGUMENTS)}, got {loss!r}")
    names, unknown = [], []
    for p in inspect.signature(loss).parameters.values():
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            continue
        if p.name in LOSS_ARGUMENTS:
            names.append(p.name)
        elif p.default is p.empty:
            unknown.append(p.name)
    if unknown or not {"logits", "cache"} & set(names):
        raise ValueError(f"decoder: loss takes {[*names, *unknown]}: expected names among "
                         f"{', '.join(LOSS_ARGUMENTS)}, logits or cache among them (the "
                         "model's output)")
    return tuple(names)


def decoder(forward: Callable, backward: Callable, *, names: Mapping[str, str],
            fused: Mapping[str, tuple[str, ...]] | None = None, transposed=(),
            loss: Callable, capabilities: Mapping | None = None) -> DecoderRow:
    """The protocol's decoder row for a decoder written with its own parameter names.

    forward:      ``forward(params, config, input_ids) -> (logits, cache)``, ``params`` keyed
                  by the model's names (a fresh dict per call)
    backward:     ``backward(dlogits, cache) -> grads``, keyed by the model's names: exactly
                  the names the forward was given, none missing (or None), none extra
    names:        protocol name -> the model's: a whole name (``"embeddings.token.W": "wte"``)
                  or a block's local name, the same tensor in every layer, with ``{i}`` where
                  the model puts the layer index (``"ln1.gamma": "h.{i}.ln_1.g"``).  Rules for
                  tensors a form lacks (a bias, ``final_ln.beta``) apply where they are given
    fused:        the model's tensor -> the protocol names it joins side by side along the
                  last axis (``{"h.{i}.attn.c_attn.w": ("attn.W_q", "attn.W_k",
                  "attn.W_v")}``: [H, 3H]); its gradient is split back at the parts' sizes
    transposed:   the model's names of tensors it stores transposed (``("lm_head.w",)``:
                  [H, V] where the protocol has [V, H]); a fused tensor is joined first
    loss:         the model's loss, called with the arguments it names among ``logits,
                  labels, input_ids, ignore_index, cache`` (``cache``: the model's own),
                  returning ``(loss, dlogits)``: dlogits the gradient of the loss, or a
                  function ``dloss -> dlogits``.  Labels default to the ids; a loss naming no
                  ``ignore_index`` (``labels``) is not applicable to another ignore index
                  (labels other than the ids)
    capabilities: the row's declaration, the namespace's ``CAPABILITIES``

    Returns a namespace of ``decoder_forward``, ``decoder_backward`` and
    ``decoder_loss_and_grads`` (and ``CAPABILITIES``), which also unpacks as those three.
    Every declaration error is a ValueError here; a protocol key no rule maps, a model's
    gradient missing or left over is one at the call, naming it."""
    for what, fn in (("forward", forward), ("backward", backward)):
        if not callable(fn):
            raise ValueError(f"decoder: {what}: expected a function, got {fn!r}")
    if not isinstance(names, Mapping) or not isinstance(fused or {}, Mapping):
        raise ValueError(f"decoder: names and fused: expected dicts, got {names!r}, {fused!r}")
    simple = {_protocol_pattern(k, "names"): v for k, v in names.items()}
    simple = {k: _own_pattern(v, k, f"names[{k.removeprefix(LAYERS)!r}]")
              for k, v in simple.items()}
    joined = {}
    for own, parts in (fused or {}).items():
        if not isinstance(parts, (tuple, list)) or len(parts) < 2:
            raise ValueError(f"decoder: fused[{own!r}]: expected a tuple of two or more "
                             f"protocol names, got {parts!r}")
        pats = tuple(_protocol_pattern(p, f"fused[{own!r}]") for p in parts)
        if len({p.startswith(LAYERS) for p in pats}) > 1:
            raise ValueError(f"decoder: fused[{own!r}] joins {list(parts)}: expected names of "
                             "one layer's block, or whole names, not both")
        joined[_own_pattern(own, pats[0], f"fused[{own!r}]")] = pats
    transposed = (transposed,) if isinstance(transposed, str) else tuple(transposed)
    unknown = [t for t in transposed if t not in set(simple.values()) | set(joined)]
    if unknown:
        raise ValueError(f"decoder: transposed names {unknown}: expected the model's names "
                         f"(the values of names=, the keys of fused=: "
                         f"{', '.join([*simple.values(), *joined])})")
    _plan(simple, joined, 2)  # two patterns meeting on one name: refused now, not at a check
    wants = _loss_arguments(loss)
    if capabilities is not None and not isinstance(capabilities, Mapping):
        raise ValueError(f"decoder: capabilities: expected a dict, got {capabilities!r}")

    def decoder_forward(params, config, input_ids):
        # a per-layer pattern of transposed= in every layer (never silently in none)
        layered = _layered(transposed, config.n_layers)
        own, record = to_model(params, _plan(simple, joined, config.n_layers), layered)
        record.transposed = layered
        logits, cache = forward(own, config, input_ids)
        return logits, DecoderCache(record, cache)

    def decoder_backward(dlogits, cache):
        return to_protocol(backward(dlogits, cache.cache), cache.record,
                           cache.record.transposed)

    def decoder_loss_and_grads(params, config, input_ids, labels=None, *,
                               ignore_index=IGNORE_INDEX):
        _loss_applies(loss, wants, input_ids, labels, ignore_index)
        logits, cache = decoder_forward(params, config, input_ids)
        given = {"logits": logits, "labels": input_ids if labels is None else labels,
                 "input_ids": input_ids, "ignore_index": ignore_index, "cache": cache.cache}
        value, dlogits = _pair(loss(**{n: given[n] for n in wants}))
        if callable(dlogits):  # a closure-style loss: the gradient of a loss of 1
            dlogits = dlogits(np.asarray(logits).dtype.type(1.0))
        return value, decoder_backward(dlogits, cache)

    fns = (decoder_forward, decoder_backward, decoder_loss_and_grads)
    for fn in fns:
        fn.__qualname__ = fn.__name__
        fn.__doc__ = (f"{fn.__name__}: {callable_name(forward)} through "
                      "minibert_spec.suite.adapters.decoder")
    extra = {} if capabilities is None else {"CAPABILITIES": dict(capabilities)}
    return DecoderRow(**{fn.__name__: fn for fn in fns}, **extra)


class DecoderRow(SimpleNamespace):
    """The three protocol functions (attributes, and unpacked in the protocol's order) and,
    where declared, ``CAPABILITIES``."""

    def __iter__(self):
        return iter((self.decoder_forward, self.decoder_backward, self.decoder_loss_and_grads))


def _loss_applies(loss, wants, input_ids, labels, ignore_index) -> None:
    """A loss naming no ``ignore_index`` computes the protocol default's loss only, one naming
    no ``labels`` the ids' own: any other call is not applicable, naming the argument."""
    if "ignore_index" not in wants and ignore_index != IGNORE_INDEX:
        raise NotApplicable(f"not applicable: the loss adapted for decoder ({callable_name(loss)}) "
                            f"takes no ignore_index (only the protocol default {IGNORE_INDEX})")
    if "labels" not in wants and labels is not None and not np.array_equal(labels, input_ids):
        raise NotApplicable(f"not applicable: the loss adapted for decoder ({callable_name(loss)}) "
                            "takes no labels (only the ids' own next tokens)")


def _pair(returned) -> tuple:
    if not isinstance(returned, tuple) or len(returned) != 2:
        raise ValueError(f"decoder_loss_and_grads: the model's loss returned "
                         f"{type(returned).__name__}: expected (loss, dlogits)")
    return returned
