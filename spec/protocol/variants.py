"""How the proxy reaches an implementation that declares a variant of an op (CAPABILITIES, see
:data:`spec.protocol.capabilities.VARIANTS`): a call in a form the implementation does not
declare is *not applicable* (never a false red), a keyword that selects the form is passed to
an implementation declaring several forms and left out for one declaring a single form, and
two variants are adapted:

* ``attention.heads = "per_head"``: the protocol's W_q, W_k, W_v [H, H] become [A, H, d_k]
  (head a's columns), b_q.. [A, d_k], W_o [A, d_k, H] (head a's rows), for attention and
  the block's ``attn.*``; the gradients come back in the protocol's layout.
* ``cross_entropy.input = "probabilities"`` (or ``"probabilities_dlogits"``): a call with
  logits (every standard cross-entropy check) is composed with the protocol's softmax
  (reference.ops, the one definition): the implementation gets p = softmax(logits), and its
  dL/dp goes back through softmax's backward (the composed form's logit gradient is already
  dL/dlogits).  A call with ``input=`` probabilities reaches it as it is ("alone").

Each adaptation is a *layer* ``(args, kwargs) -> (args, kwargs, post)``; the proxy runs the
layers in order before the call and their ``post`` in reverse order after it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from reference.ops import IGNORE_INDEX, SoftmaxCache, _softmax_backward, _softmax_forward
from spec.protocol.capabilities import VARIANTS, variant_text

Layer = Callable[[tuple, dict], tuple]
ATTN_W = ("W_q", "W_k", "W_v", "W_o")
ATTN_B = ("b_q", "b_k", "b_v", "b_o")
ATTENTION_ARGS = ("x",) + ATTN_W + ATTN_B
# positional names of the forwards the layers read
ARGS = {"layernorm": ("x", "gamma", "beta", "eps"), "ffn": ("x", "W_1", "b_1", "W_2", "b_2"),
        "attention": ATTENTION_ARGS, "block": ("x", "p"),
        "cross_entropy": ("logits", "labels")}


def _get(op: str, args: tuple, kwargs: dict, name: str, default=None):
    names = ARGS[op]
    i = names.index(name)
    return args[i] if i < len(args) else kwargs.get(name, default)


def _set(op: str, args: tuple, kwargs: dict, name: str, value) -> tuple[tuple, dict]:
    i = ARGS[op].index(name)
    if i < len(args):
        args = args[:i] + (value,) + args[i + 1:]
    else:
        kwargs = {**kwargs, name: value}
    return args, kwargs


class _Wrapped:
    """A cache the proxy wrapped (per-head layout, composed softmax): the implementation's own
    cache and what the backward needs to undo the adaptation."""

    def __init__(self, kind: str, inner, **info):
        self.kind, self.inner, self.info = kind, inner, info


def layers(op: str, name: str, caps: dict, not_claimed: Callable[[str], None]) -> list[Layer]:
    """The adaptation layers of one protocol function under the implementation's variants."""
    if op not in VARIANTS:
        return []
    v = caps[op]
    forward = name.endswith("_forward")
    out: list[Layer] = []

    def piece(arg: str, option: str, also: tuple = ()):
        """A piece the checks pass as None when absent (gamma, b_2, W_o)."""
        def layer(args, kwargs):
            given = _get(op, args, kwargs, arg) is not None
            if given not in v[option]:
                not_claimed(variant_text(op, option, given) + " (the call "
                            + ("passes " if given else "leaves out ") + arg + ")")
            return args, kwargs, None
        return layer

    def keyword(option: str):
        """An option selected by a keyword (causal, norm, input)."""
        opt = VARIANTS[op][option]

        def layer(args, kwargs):
            value = kwargs.get(opt.argument, opt.default)
            if value not in v[option]:
                not_claimed(variant_text(op, option, value))
            if len(v[option]) == 1:  # a single form: the keyword carries nothing
                kwargs = {k: x for k, x in kwargs.items() if k != opt.argument}
            return args, kwargs, None
        return layer

    if forward and op == "layernorm":
        out.append(piece("gamma", "affine"))

        def eps(args, kwargs):
            value = _get(op, args, kwargs, "eps")
            if value is not None and value != 0 and True not in v["eps"]:
                not_claimed(variant_text(op, "eps", True) + f" (the call passes eps={value})")
            return args, kwargs, None
        out.append(eps)
    elif forward and op == "ffn":
        out.append(piece("b_2", "b_2"))
    elif op == "attention":
        if forward:
            out += [piece("W_o", "W_o"), keyword("causal")]
        if v["heads"] == ("per_head",):
            out.append(_per_head_forward(op) if forward else _per_head_backward(op))
    elif op == "block":
        if forward:
            out += [keyword("norm"), keyword("causal")]
        if caps["attention"]["heads"] == ("per_head",):
            out.append(_per_head_forward(op) if forward else _per_head_backward(op))
    elif op == "cross_entropy":
        if forward:
            out.append(_ce_input(v, not_claimed))
            if True not in v["ignore_index"]:
                out.append(_ce_without_ignore_index(not_claimed))
        else:
            out.append(_ce_composed_backward)
    return out


# --------------------------------------------------------------------------- per-head
def to_per_head(name: str, a: np.ndarray, n_heads: int) -> np.ndarray:
    """One attention parameter from the protocol's layout to the per-head one."""
    if a is None:
        return None
    H = a.shape[0]
    d_k = H // n_heads
    if name == "W_o":  # head a's rows: [A, d_k, H]
        return np.ascontiguousarray(a.reshape(n_heads, d_k, H))
    if name.startswith("W_"):  # head a's columns: [H, H] -> [A, H, d_k]
        return np.ascontiguousarray(a.reshape(H, n_heads, d_k).transpose(1, 0, 2))
    if name == "b_o":
        return a
    return np.ascontiguousarray(a.reshape(n_heads, d_k))  # b_q, b_k, b_v


def from_per_head(name: str, g, H: int):
    """A gradient in the per-head layout back to the protocol's (the inverse of to_per_head)."""
    if g is None or name == "b_o":
        return g
    g = np.asarray(g)
    if name == "W_o":
        return g.reshape(H, H)
    if name.startswith("W_"):
        return np.ascontiguousarray(g.transpose(1, 0, 2).reshape(H, H))
    return g.reshape(H)


def _per_head_forward(op: str):
    """The forward's weights to the per-head layout; its cache wrapped with H (to undo)."""
    def layer(args, kwargs):
        A = kwargs["n_heads"]
        H = np.shape(_get(op, args, kwargs, "x"))[-1]
        if op == "attention":
            for n in ATTN_W + ATTN_B:
                args, kwargs = _set(op, args, kwargs, n, to_per_head(n, _get(op, args, kwargs,
                                                                             n), A))
        else:  # the block's p: its attn.* entries
            p = {k: to_per_head(k[5:], a, A) if k.startswith("attn.") else a
                 for k, a in _get(op, args, kwargs, "p").items()}
            args, kwargs = _set(op, args, kwargs, "p", p)

        def post(result):
            out, cache = result
            return out, _Wrapped("per_head", cache, H=H)

        return args, kwargs, post

    return layer


def _per_head_backward(op: str):
    """The backward's gradients from the per-head layout back to the protocol's."""
    def layer(args, kwargs):
        if not (len(args) >= 2 and isinstance(args[1], _Wrapped)):
            return args, kwargs, None
        H = args[1].info["H"]

        def post(result):
            if op == "attention":
                return tuple(g if i == 0 or i >= len(ATTENTION_ARGS)
                             else from_per_head(ATTENTION_ARGS[i], g, H)
                             for i, g in enumerate(result))
            dx, grads = result
            if not isinstance(grads, dict):
                return result
            return dx, {k: from_per_head(k[5:], g, H) if k.startswith("attn.") else g
                        for k, g in grads.items()}

        return (args[0], args[1].inner, *args[2:]), kwargs, post

    return layer


# --------------------------------------------------------------------------- cross-entropy
def _ce_input(v: dict, not_claimed):
    forms = v["input"]

    def layer(args, kwargs):
        kwargs = dict(kwargs)
        asked = kwargs.pop("input", "logits")
        if not args and "logits" in kwargs:  # positional: the loss may name it p, probs, ...
            args = (kwargs.pop("logits"),)
        if asked in forms:  # as it is: the implementation's own form ("alone")
            if len(forms) > 1 and asked != "logits":
                kwargs["input"] = asked
            return args, kwargs, None
        if asked != "logits":
            not_claimed(variant_text("cross_entropy", "input", asked))
        # logits asked, probabilities taken: compose with the protocol's softmax
        form = forms[0]
        if len(forms) > 1:
            kwargs["input"] = form
        logits = _get("cross_entropy", args, kwargs, "logits")
        p, sm_cache = _softmax_forward(np.asarray(logits))
        args, kwargs = _set("cross_entropy", args, kwargs, "logits", p)

        def post(result):
            loss, cache = result
            return loss, _Wrapped("softmax", cache, form=form, softmax=sm_cache)

        return args, kwargs, post

    return layer


def _ce_without_ignore_index(not_claimed):
    def layer(args, kwargs):
        kwargs = dict(kwargs)
        ignore = kwargs.pop("ignore_index", IGNORE_INDEX)
        labels = _get("cross_entropy", args, kwargs, "labels")
        if np.any(np.asarray(labels) == ignore):
            not_claimed(variant_text("cross_entropy", "ignore_index", True)
                        + " (the call has ignored positions)")
        return args, kwargs, None

    return layer


def _ce_composed_backward(args, kwargs):
    if not (len(args) >= 2 and isinstance(args[1], _Wrapped) and args[1].kind == "softmax"):
        return args, kwargs, None
    w = args[1]

    def post(grads):
        if w.info["form"] != "probabilities" or not isinstance(grads, tuple) or not grads:
            return grads  # the composed form: already the logit gradient
        dp = np.asarray(grads[0])
        (dlogits,) = _softmax_backward(dp, SoftmaxCache(w.info["softmax"].p))
        return (dlogits, *grads[1:])

    return (args[0], w.inner, *args[2:]), kwargs, post
