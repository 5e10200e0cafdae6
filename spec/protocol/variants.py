"""The variants an implementation may declare, each declared once: what it means, how a call
reaches an implementation declaring it, and how a check asks for it.

An implementation declares the forms it supports in ``CAPABILITIES``: a *claim* (``"key_mask":
False``: no key mask anywhere) or an op's *option* (``CAPABILITIES["layernorm"] = {"affine":
False}``).  Each entry of :data:`CLAIMS` and :data:`VARIANTS` says

* what each value means (a verdict prints it);
* how the proxy reaches it: ``pieces`` -- forward arguments the call leaves out (None) in the
  non-standard form (a call passing them to an implementation without them, or leaving them
  out of one that needs them, is *not applicable*, never a false red); ``argument`` -- the
  keyword that selects the form (passed to an implementation declaring several forms, left
  out for one declaring a single form); ``convert`` -- the conversion to and from the standard
  form the proxy applies (per-head weights, a loss on probabilities; it handles the option's
  keyword itself);
* the keyword a case family's strategy takes for it (``strategy``: ``bias``, ``masked``, or the
  option's name), so a family asks for a form with ``needs={"op.option": value}`` and draws it.

Every layer the proxy runs is ``(args, kwargs) -> (args, kwargs, post)``: run in order before
the call, their ``post`` in reverse order after it.  Positional arguments are named by the op
table (:attr:`minibert_spec.protocol.table.Op.args`, the reference's own signatures).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from minibert_reference.ops import (
    BLOCK_PARTS,
    IGNORE_INDEX,
    SoftmaxCache,
    _softmax_backward,
    _softmax_forward,
)
from minibert_spec.builtin import declarations
from minibert_spec.protocol.norm_eps import (  # noqa: F401 (re-exported: their old home)
    LN_EPS_OPS,
    _call_eps_value,
    eps_of,
    fixed_eps_hint,
    is_number,
    pinned_eps,
    with_pinned_config,
    with_pinned_eps,
)
from minibert_spec.protocol.table import OPS

Layer = Callable[[tuple, dict], tuple]
ATTN_W = ("W_q", "W_k", "W_v", "W_o")
ATTN_B = ("b_q", "b_k", "b_v", "b_o")


@dataclass(frozen=True)
class Option:
    """One option of an op: its values (the first is the protocol's standard form), what each
    value means, and how the suite reaches it (see the module's docstring).  ``absent``: the
    values of a piece that mean "left out" (eps = 0 as well as None); ``absent_ok``: a call
    leaving the piece out is taken by every implementation (an eps of 0 is one value of eps);
    ``also``: further ops the option reaches (a block's attention); ``number``: what a declared
    number means (formatted with ``value``), where a positive finite float is a form too: code
    that fixes the piece at that value whatever the call passes (a LayerNorm's eps);
    ``standard``: the values an implementation declaring nothing is taken to have, where that
    is more than the first (the decoder's positions: the GPT-2 and LLaMA forms, each checked
    before the option could be declared)."""

    values: tuple
    meaning: Mapping
    argument: str | None = None
    pieces: tuple[str, ...] = ()
    absent: tuple = (None,)
    absent_ok: bool = False
    convert: Callable | None = None
    also: tuple[str, ...] = ()
    strategy: str | None = None
    number: str | None = None
    standard: tuple = ()

    @property
    def default(self):
        return self.values[0]

    def means(self, value) -> str:
        """What ``value`` means: its entry in ``meaning``, or a declared number's."""
        if self.number is not None and is_number(value):
            return self.number.format(value=value)
        return self.meaning[value]


@dataclass(frozen=True)
class Claim:
    """A capability that is a claim, not an op's option: True unless declared False, reached
    through ``pieces`` (op -> forward arguments that must be absent without it) and
    ``keywords`` (op -> a keyword that must be None without it)."""

    what: str
    pieces: Mapping = field(default_factory=dict)
    keywords: Mapping = field(default_factory=dict)
    strategy: str | None = None


CLAIMS: dict[str, Claim] = {
    "attention_bias": Claim("attention_bias (an attention with biases)",
                            pieces={"attention": ATTN_B,
                                    "block": tuple(f"attn.{n}" for n in ATTN_B)},
                            strategy="bias"),
    "key_mask": Claim("key_mask (a masked attention)",
                      keywords={"attention": "mask", "block": "mask", "softmax": "mask"},
                      strategy="masked"),
    "weight_decay": Claim("weight_decay (AdamW)"),  # adam_step: spec/protocol/proxy.py
}


# --------------------------------------------------------------------------- conversions
class _Wrapped:
    """A cache the proxy wrapped (per-head layout, composed softmax): the implementation's own
    cache and what the backward needs to undo the adaptation."""

    def __init__(self, kind: str, inner, **info):
        self.kind, self.inner, self.info = kind, inner, info


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


def _per_head(op: str, forward: bool, declared: tuple, not_claimed) -> Layer | None:
    """``attention.heads = "per_head"``: the forward's weights to the per-head layout (its
    cache wrapped with H), the backward's gradients back to the protocol's.  ``"single"``: one
    head, no ``n_heads`` keyword (a call with n_heads > 1 is not applicable)."""
    if declared == ("single",):
        return _single_head(not_claimed) if forward else None
    if declared != ("per_head",):
        return None
    if forward:
        def layer(args, kwargs):
            A = kwargs["n_heads"]
            H = np.shape(get(op, args, kwargs, "x"))[-1]
            if op == "attention":
                for n in ATTN_W + ATTN_B:
                    args, kwargs = put(op, args, kwargs, n,
                                       to_per_head(n, get(op, args, kwargs, n), A))
            else:  # the block's p: its attn.* entries
                p = {k: to_per_head(k[5:], a, A) if k.startswith("attn.") else a
                     for k, a in get(op, args, kwargs, "p").items()}
                args, kwargs = put(op, args, kwargs, "p", p)

            def post(result):
                out, cache = result
                return out, _Wrapped("per_head", cache, H=H)

            return args, kwargs, post

        return layer

    names = ("x",) + ATTN_W + ATTN_B

    def back(args, kwargs):
        if not (len(args) >= 2 and isinstance(args[1], _Wrapped)):
            return args, kwargs, None
        H = args[1].info["H"]

        def post(result):
            if op == "attention":
                return tuple(g if i == 0 or i >= len(names) else from_per_head(names[i], g, H)
                             for i, g in enumerate(result))
            dx, grads = result
            if not isinstance(grads, dict):
                return result
            return dx, {k: from_per_head(k[5:], g, H) if k.startswith("attn.") else g
                        for k, g in grads.items()}

        return (args[0], args[1].inner, *args[2:]), kwargs, post

    return back


def _single_head(not_claimed) -> Layer:
    """A single-head attention (or a block of one) takes no ``n_heads``: the keyword is dropped,
    and a call asking for more heads is not applicable."""
    def layer(args, kwargs):
        kwargs = dict(kwargs)
        A = kwargs.pop("n_heads", 1)
        if A != 1:
            not_claimed(f"{variant_text('attention', 'heads', 'fused')} (the call asks for "
                        f"n_heads={A}; it declares attention.heads=single)")
        return args, kwargs, None

    return layer


def _probabilities(op: str, forward: bool, forms: tuple, not_claimed) -> Layer | None:
    """``cross_entropy.input = "probabilities"`` (or ``"probabilities_dlogits"``): a call with
    logits (every standard check) is composed with the protocol's softmax (minibert_reference.ops,
    the one definition): the implementation gets p = softmax(logits), and its dL/dp goes back
    through softmax's backward (the composed form's logit gradient is already dL/dlogits).  A
    call with ``input=`` probabilities reaches it as it is ("alone")."""
    if not forward:
        return _composed_backward

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
            not_claimed(variant_text(op, "input", asked))
        # logits asked, probabilities taken: compose with the protocol's softmax
        form = forms[0]
        if len(forms) > 1:
            kwargs["input"] = form
        p, sm_cache = _softmax_forward(np.asarray(get(op, args, kwargs, "logits")))
        args, kwargs = put(op, args, kwargs, "logits", p)

        def post(result):
            loss, cache = result
            return loss, _Wrapped("softmax", cache, form=form, softmax=sm_cache)

        return args, kwargs, post

    return layer


def _composed_backward(args, kwargs):
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


def _ignored_positions(op: str, forward: bool, declared: tuple, not_claimed) -> Layer | None:
    """``<loss>.ignore_index = False`` (cross_entropy, linear_cross_entropy): the keyword is
    dropped; a call whose labels hold ignored positions is not applicable (the loss takes
    predicted rows only)."""
    if not forward or True in declared:
        return None

    def layer(args, kwargs):
        kwargs = dict(kwargs)
        ignore = kwargs.pop("ignore_index", IGNORE_INDEX)
        if np.any(np.asarray(get(op, args, kwargs, "labels")) == ignore):
            not_claimed(variant_text(op, "ignore_index", True)
                        + " (the call has ignored positions)")
        return args, kwargs, None

    return layer


def _losses_of(op: str, args, kwargs):
    """(per-position weights of the kept positions, their count): for cross_entropy (and
    linear_cross_entropy) the positions whose label is not ignore_index, for mse every
    element."""
    if op == "mse":
        n = int(np.size(get(op, args, kwargs, "y")))
        return None, n
    labels = np.asarray(get(op, args, kwargs, "labels"))
    keep = labels != kwargs.get("ignore_index", IGNORE_INDEX)
    return keep, int(keep.sum())


def _reduction(op: str, forward: bool, declared: tuple, not_claimed) -> Layer | None:
    """``<loss>.reduction``: a loss that only averages ("mean"), only sums ("sum") or returns
    the per-position losses ("none", [labels' shape], an mse's elementwise squares).  The
    suite does the reduction maths here, once: the protocol's mean (over the kept positions,
    at least 1) or sum from what the implementation returns, and the upstream gradient the
    implementation's backward expects (dloss scaled by n or 1/n; per position for "none")."""
    if "keyword" in declared:
        return None
    form = declared[0]
    if not forward:
        def back(args, kwargs):
            if not (len(args) >= 2 and isinstance(args[1], _Wrapped) and
                    args[1].kind == "reduction"):
                return args, kwargs, None
            w = args[1]
            dloss, asked, keep, n = args[0], w.info["asked"], w.info["keep"], w.info["n"]
            if form == "none":
                scale = dloss / (max(n, 1) if asked == "mean" else 1)
                d = np.full(w.info["shape"], scale) if keep is None else \
                    np.where(keep, scale, 0.0)
                d = d.astype(w.info["dtype"])
            else:
                d = _rescaled(dloss, form, asked, max(n, 1))
            return (d, w.inner, *args[2:]), kwargs, None

        return back

    def layer(args, kwargs):
        kwargs = dict(kwargs)
        asked = kwargs.pop("reduction", "mean")
        keep, n = _losses_of(op, args, kwargs)

        def post(result):
            loss, cache = result
            loss = np.asarray(loss)
            if form == "none":
                per = loss if keep is None else np.where(keep, loss, 0)
                total = per.sum(dtype=loss.dtype)
                value = total / loss.dtype.type(max(n, 1)) if asked == "mean" else total
                info = dict(shape=loss.shape, dtype=loss.dtype)
            else:
                value, info = _rescaled(loss, form, asked, loss.dtype.type(max(n, 1))), {}
            return value[()] if np.ndim(value) == 0 else value, _Wrapped(
                "reduction", cache, asked=asked, keep=keep, n=n, **info)

        return args, kwargs, post

    return layer


def _rescaled(x, form: str, asked: str, n):
    """``x`` of the reduction taken (``form``) as the reduction ``asked``, forward (the loss)
    and backward (the upstream gradient) alike: the sum is the mean times the n kept
    positions."""
    if form == asked:
        return x
    return x * n if form == "mean" else x / n


def _ln_affine(op: str, forward: bool, declared: tuple, not_claimed) -> Layer | None:
    """``layernorm.affine``: gamma and beta as pieces of the LayerNorm's call (the piece layer);
    inside a block of LayerNorms (``also``), the block's ``p`` with or without ``ln1.gamma``,
    ``ln1.beta`` ... (a call whose form the implementation does not declare is not
    applicable).  A block of RMSNorms has its gamma whatever the LayerNorm's form."""
    if not forward:
        return None
    option = VARIANTS["layernorm"]["affine"]
    if op == "layernorm":
        return _piece_layer(op, "layernorm", "affine", option, declared, not_claimed)

    def layer(args, kwargs):
        if get(op, args, kwargs, "normalization", "layernorm") != "layernorm":
            return args, kwargs, None
        given = get(op, args, kwargs, "ln1.gamma") is not None
        if given not in declared:
            not_claimed(variant_text("layernorm", "affine", given) + " (the block's p "
                        + ("has" if given else "has no") + " ln1.gamma, ln1.beta ...)")
        return args, kwargs, None

    return layer


# ------------------------------------------------------------- a norm's eps (LayerNorm, RMSNorm)
def call_eps(caps: dict, eps: float) -> float:
    """The eps a check that would pass ``eps`` to the implementation's LayerNorm passes (and
    computes its expectation with): :func:`eps_of` at the implementation's declared form."""
    return eps_of(resolve_variant(caps, "layernorm")["eps"], eps)


def _fixed_eps(norm: str) -> Callable:
    """The ``convert`` of ``<norm>.eps`` (layernorm, rmsnorm): False -- a call passing an eps
    to the norm is not applicable (the piece layer); a number c -- the code computes at c
    whatever the call passes, so a call of the norm (or, for LayerNorm, a composite of
    LayerNorms) passing another eps, or leaving it out (the protocol's default), is not
    applicable: the checks pass c (:func:`with_pinned_eps`, the cases' ``eps_of``), and those
    whose point is another eps (eps inside the root) say why they do not apply."""
    def convert(op: str, forward: bool, declared: tuple, not_claimed) -> Layer | None:
        if not forward:
            return None
        option = VARIANTS[norm]["eps"]
        if not is_number(declared[0]):
            return (_piece_layer(op, norm, "eps", option, declared, not_claimed)
                    if op == norm else None)
        c = float(declared[0])

        def layer(args, kwargs):
            # a composite of RMSNorms carries RMSNorm's eps, not the LayerNorm's
            if get(op, args, kwargs, "normalization", "layernorm") != "layernorm" \
                    and op != norm:
                return args, kwargs, None
            eps = _call_eps_value(op, args, kwargs)
            # the declared value as the call carries it (a float32 scalar: rounded)
            if not (is_number(eps) and abs(float(eps) - c) <= 1e-6 * c):
                said = "leaves eps out" if eps is None else f"passes eps={eps}"
                not_claimed(f"{op} at another eps than its own ({option.means(c)}; the call "
                            f"{said})")
            return args, kwargs, None

        return layer

    return convert


# --------------------------------------------------------------------------- the options
_REDUCTION_MEANING = {
    "keyword": "reduction= 'mean' | 'sum' as the protocol's keyword",
    "mean": "the mean only, no reduction keyword: the suite derives the sum (x the kept "
            "positions) and its gradient",
    "sum": "the sum only, no reduction keyword: the suite derives the mean",
    "none": "per-position losses (labels' shape, no reduction): the suite takes the mean or "
            "sum over the kept positions and hands the backward per-position dloss"}
# a cross-entropy's options, shared by cross_entropy and linear_cross_entropy (one definition:
# the same meaning, the same adapters)
_IGNORE_INDEX = Option((True, False), {
    True: "labels may hold ignore_index",
    False: "without ignore_index: it takes the predicted rows only; checked on "
           "gathered rows in both layouts [N, V] and [1, N, V]"},
    convert=_ignored_positions)
_CE_REDUCTION = Option(("keyword", "mean", "sum", "none"), _REDUCTION_MEANING,
                       convert=_reduction)
# op -> option -> Option.  An implementation declares the values it supports under its op's
# name in CAPABILITIES (one value or a tuple); an undeclared option supports its default only.
VARIANTS: dict[str, dict[str, Option]] = {
    "layernorm": {
        "affine": Option((True, False), {True: "with gamma and beta",
                                         False: "without gamma/beta: the suite passes None "
                                                "for both and expects None gradients (in a "
                                                "block: no ln*.gamma, ln*.beta)"},
                         pieces=("gamma", "beta"), convert=_ln_affine, also=("block",)),
        "eps": Option((True, False), {True: "with eps inside the square root",
                                      False: "without eps: the suite passes eps=0 (rows are "
                                             "kept away from constant)"},
                      pieces=("eps",), absent=(None, 0), absent_ok=True,
                      convert=_fixed_eps("layernorm"), also=LN_EPS_OPS[1:],
                      # the code's own constant: every LayerNorm is checked at it
                      number="eps fixed at {value:g} by the declaration"),
    },
    "ffn": {
        "b_1": Option((True, False), {True: "with b_1",
                                      False: "without b_1: the suite passes b_1=None and "
                                             "expects db_1 None"}, pieces=("b_1",),
                      also=("block",)),
        "b_2": Option((True, False), {True: "with b_2",
                                      False: "without b_2: the suite passes b_2=None and "
                                             "expects db_2 None"}, pieces=("b_2",),
                      also=("block",)),
        "activation": Option(("relu", "gelu", "gelu_tanh", "relu2"),
                             {"relu": "ReLU", "gelu": "exact GELU (erf)",
                              "gelu_tanh": "GELU's tanh approximation (GPT-2's gelu_new)",
                              "relu2": "squared ReLU max(x, 0)^2 (Primer, the nanoGPT "
                                       "speedrun)"},
                             argument="activation", also=("block",)),
    },
    "attention": {
        "W_o": Option((True, False), {True: "with the output projection W_o",
                                      False: "without W_o: y = merge(C); the suite passes "
                                             "W_o=None, b_o=None and expects None gradients"},
                      pieces=("W_o",), also=("block",)),
        "causal": Option((False, True), {False: "bidirectional", True: "causal: position i "
                                         "attends keys j <= i"}, argument="causal"),
        "rope": Option((None, "interleaved", "half"), {
            None: "without rotary embeddings",
            "interleaved": "RoPE on queries and keys, interleaved pairs (2i, 2i+1) (Meta's "
                           "LLaMA): the suite passes rope=\"interleaved\"",
            "half": "RoPE on queries and keys, half-split pairs (i, i + d_k/2) (Hugging Face's "
                    "LLaMA): the suite passes rope=\"half\""}, argument="rope",
            also=("block",)),
        "heads": Option(("fused", "per_head", "single"),
                        {"fused": "W_q, W_k, W_v, W_o [H, H] (head a owns columns a*d_k..)",
                         "per_head": "per-head projections: W_q, W_k, W_v [A, H, d_k], b_q.. "
                                     "[A, d_k], W_o [A, d_k, H] (the suite converts the "
                                     "protocol's [H, H] and back; FD indices stay [H, H])",
                         "single": "single-head attention: no n_heads keyword, d_k = H (the "
                                   "suite draws one head)"},
                        convert=_per_head, also=("block",)),
    },
    "block": {
        "norm": Option(("post", "pre", "pre_final", "inner"),
                       {"post": "post-LN (BERT): LN2(h + FFN(h)), h = LN1(x + MHA(x))",
                        "pre": "pre-LN (GPT-2): h + FFN(LN2(h)), h = x + MHA(LN1(x))",
                        "pre_final": "pre-LN followed by its final LayerNorm LN_f (p has "
                                     "ln_f.gamma, ln_f.beta)",
                        "inner": "each sublayer's output normalised inside the residual "
                                 "branch: h + LN2(FFN(h)), h = x + LN1(MHA(x))"},
                       argument="norm"),
        "causal": Option((False, True), {False: "bidirectional attention",
                                         True: "causal attention"}, argument="causal"),
        "normalization": Option(("layernorm", "rmsnorm"),
                                {"layernorm": "LayerNorms (gamma, beta)",
                                 "rmsnorm": "RMSNorms (LLaMA: ln1.gamma, ln2.gamma, no beta)"},
                                argument="normalization"),
        "ffn": Option(("mlp", "swiglu"), {
            "mlp": "the FFN act(x W_1 + b_1) W_2 + b_2 (keys ffn.*)",
            "swiglu": "SwiGLU (LLaMA: keys swiglu.W_1 (gate), swiglu.W_3 (up), swiglu.W_2 "
                      "(down))"}, argument="ffn"),
    },
    "decoder": {
        "tied": Option((True, False), {
            True: "the LM head tied to the token embedding (logits = h W_E^T; W_E's gradient "
                  "sums both uses)",
            False: "an LM head of its own (lm_head.W [V, H])"}),
        "position": Option(("learned", "rope", "learned_rope", "sinusoidal", "none"), {
            "learned": "learned positions (embeddings.position.W [T_max, H], GPT-2's wpe)",
            "rope": "RoPE on every block's queries and keys, no position table (LLaMA)",
            "learned_rope": "learned positions (embeddings.position.W) and RoPE on every "
                            "block's queries and keys",
            "sinusoidal": "the fixed sinusoidal table added to the token embedding (no "
                          "parameters)",
            "none": "no positions: the causal mask alone orders the tokens"},
            standard=("learned", "rope")),
        "final_norm": Option((True, False), {
            True: "the final norm final_ln before the LM head",
            False: "no final norm: the last block's output goes to the LM head as it is"}),
        "head_bias": Option((False, True), {
            False: "an LM head without bias",
            True: "an LM head with a bias lm_head.b [V] (logits = h W^T + b)"}),
    },
    "cross_entropy": {
        "ignore_index": _IGNORE_INDEX,
        "input": Option(("logits", "probabilities", "probabilities_dlogits"), {
            "logits": "logits in",
            "probabilities": "softmax output in, dL/dp out: checked alone and composed with "
                             "the protocol's softmax",
            "probabilities_dlogits": "softmax output in, the logit gradient of softmax + CE "
                                     "out: checked alone and as the composed loss of logits"},
            argument="input", convert=_probabilities),
        "reduction": _CE_REDUCTION,
    },
    # the fused head + loss: cross-entropy's own options, the same adapters
    "linear_cross_entropy": {"ignore_index": _IGNORE_INDEX, "reduction": _CE_REDUCTION},
    "mse": {
        "reduction": Option(("keyword", "none"), {
            "keyword": "the protocol's mean of the squared errors",
            "none": "elementwise squared errors (no reduction): the suite takes their mean and "
                    "hands the backward dloss / n per element"}, convert=_reduction),
    },
}
# the converters a built-in op's declared option names (spec/builtin/: ``convert="fixed_eps"``),
# each made for its op
_CONVERTERS = {"fixed_eps": _fixed_eps}


def _declared_options(name: str, options: Mapping) -> dict[str, Option]:
    """A declaration's options (Option's keywords, ``convert`` a name of :data:`_CONVERTERS`)."""
    return {key: Option(**{**kw, **({"convert": _CONVERTERS[kw["convert"]](name)}
                                    if "convert" in kw else {})})
            for key, kw in options.items()}


def _with_declared(variants: dict, decls) -> dict:
    """``variants`` with the options of each built-in op's declaration (spec/builtin/) placed
    after those of the op it names (``options_after``, else the row it follows, ``after``) --
    a hand entry or a declared one -- or last."""
    declared = {d.name: _declared_options(d.name, d.options) for d in decls if d.options}
    out = {}

    def place(op: str, options) -> None:
        out[op] = options
        for d in decls:
            if (d.options_after or d.after) == op and d.name in declared:
                place(d.name, declared.pop(d.name))

    for op, options in variants.items():
        place(op, options)
    return {**out, **declared}


VARIANTS = _with_declared(VARIANTS, declarations())


# --------------------------------------------------------------------------- the proxy's layers
def get(op: str, args: tuple, kwargs: dict, name: str, default=None):
    """The forward argument ``name`` of a call (positional by the op table's order, else a
    keyword; a name of no argument is looked up in the dict argument: a block's ``p``)."""
    names = OPS[op].args
    if name in names:
        i = names.index(name)
        return args[i] if i < len(args) else kwargs.get(name, default)
    if name in kwargs:
        return kwargs[name]
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, Mapping) and name in value:
            return value[name]
    return default


def put(op: str, args: tuple, kwargs: dict, name: str, value) -> tuple[tuple, dict]:
    """The call with the forward argument ``name`` replaced."""
    i = OPS[op].args.index(name)
    if i < len(args):
        return args[:i] + (value,) + args[i + 1:], kwargs
    return args, {**kwargs, name: value}


def reaches(key: str, op: str) -> bool:
    """The option ``key`` ("ffn.b_2") is ``op``'s own or reaches it as a part's (``also``)."""
    owner, option = key.split(".")
    return owner == op or op in VARIANTS[owner][option].also


def variant_text(op: str, option: str, value) -> str:
    """What one option's value means, for a verdict: "layernorm without gamma/beta..."."""
    return f"{op} {VARIANTS[op][option].means(value)}"


def options_of(op: str) -> dict[tuple[str, str], Option]:
    """(declaring op, option) -> Option for every option that reaches ``op``."""
    return {(owner, name): option for owner, options in VARIANTS.items()
            for name, option in options.items() if owner == op or op in option.also}


def layers(op: str, name: str, caps: dict, not_claimed: Callable[[str], None]) -> list[Layer]:
    """The adaptation layers of one protocol function under the implementation's claims and
    options, in the order of the tables above.  An option of a part (``also``: the FFN's b_2,
    the attention's W_o) reaches a composite op the same way: its piece is the part's key in
    the composite's parameter dict (``ffn.b_2``, minibert_reference.ops.BLOCK_PARTS), its keyword
    the
    composite's keyword of the same name."""
    forward = name.endswith("_forward")
    out: list[Layer] = []
    for claim, c in CLAIMS.items():
        if forward and not caps[claim] and (op in c.pieces or op in c.keywords):
            out.append(_claim_layer(op, c, not_claimed))
    for (owner, option_name), option in options_of(op).items():
        declared = caps[owner][option_name]
        if forward and option.pieces and option.convert is None:
            out.append(_piece_layer(op, owner, option_name, option, declared, not_claimed))
        if forward and option.argument and option.convert is None:
            out.append(_keyword_layer(op, owner, option_name, option, declared, not_claimed))
        if option.convert is not None:
            layer = option.convert(op, forward, declared, not_claimed)
            if layer is not None:
                out.append(layer)
    return out


def _claim_layer(op: str, claim: Claim, not_claimed) -> Layer:
    def layer(args, kwargs):
        given = [n for n in claim.pieces.get(op, ()) if get(op, args, kwargs, n) is not None]
        keyword = claim.keywords.get(op)
        if given or (keyword and get(op, args, kwargs, keyword) is not None):
            not_claimed(claim.what)
        return args, kwargs, None

    return layer


def part_key(op: str, owner: str, piece: str) -> str:
    """The name of an option's piece in ``op``'s arguments: the piece itself for the option's
    own op, the part's key in a composite's parameter dict otherwise (``ffn.b_2``)."""
    return piece if owner == op else BLOCK_PARTS[owner] + piece


def _has_part(op: str, owner: str, args: tuple, kwargs: dict) -> bool:
    """The call has the part ``owner`` (a composite's parameter dict holds a key of its: a
    block with SwiGLU has no FFN, whose options then do not reach it)."""
    if owner == op:
        return True
    prefix = BLOCK_PARTS[owner]
    return any(isinstance(v, Mapping) and any(str(k).startswith(prefix) for k in v)
               for v in list(args) + list(kwargs.values()))


def _piece_layer(op: str, owner: str, name: str, option: Option, declared: tuple,
                 not_claimed) -> Layer:
    """A piece the checks pass as None (or 0) when absent: gamma, eps, b_2, W_o; in a
    composite's parameter dict, a key left out (``ffn.b_2``) of a part it has."""
    first = part_key(op, owner, option.pieces[0])

    def layer(args, kwargs):
        if not _has_part(op, owner, args, kwargs):
            return args, kwargs, None
        value = get(op, args, kwargs, first)
        given = not any(value is a or (a is not None and value is not None and
                                       np.ndim(value) == 0 and value == a)
                        for a in option.absent)
        if given not in declared and not (option.absent_ok and not given):
            not_claimed(variant_text(owner, name, given) + " (the call "
                        + (f"passes {first}" + (f"={value}" if np.ndim(value) == 0 else "")
                           if given else f"leaves out {first}") + ")")
        return args, kwargs, None

    return layer


def _keyword_layer(op: str, owner: str, name: str, option: Option, declared: tuple,
                   not_claimed) -> Layer:
    """An option selected by a keyword (causal, norm, input; a part's activation reaching a
    composite)."""
    def layer(args, kwargs):
        value = kwargs.get(option.argument, option.default)
        if value not in declared:
            not_claimed(variant_text(owner, name, value))
        if len(declared) == 1:  # a single form: the keyword carries nothing
            kwargs = {k: x for k, x in kwargs.items() if k != option.argument}
        return args, kwargs, None

    return layer


# --------------------------------------------------------------------------- declarations
def resolve_variant(caps: dict, op: str, fixed: Mapping | None = None) -> dict:
    """Every option of ``op`` for one check: the ``fixed`` values it is about, the others at
    the implementation's standard form where it supports it, else its first declared value.
    Raises LookupError naming what the implementation does not declare."""
    fixed = dict(fixed or {})
    out = {}
    for name, option in VARIANTS[op].items():
        values = caps[op][name]
        if name in fixed:
            if fixed[name] not in values:
                raise LookupError(variant_text(op, name, fixed[name]))
            out[name] = fixed[name]
        else:
            out[name] = option.default if option.default in values else values[0]
    return out


def strategy_keyword(key: str) -> str:
    """The keyword a case family's strategy takes for a claim or an "op.option"."""
    if key in CLAIMS:
        return CLAIMS[key].strategy or key
    op, option = key.split(".")
    return VARIANTS[op][option].strategy or option


def unmet(caps: dict, needs: Mapping) -> str | None:
    """The first of a check's ``needs`` the implementation does not declare, in words (None:
    all met).  ``needs`` maps a claim ("key_mask") to True, or "op.option" to a value."""
    for key, value in needs.items():
        if key in CLAIMS:
            if value and not caps[key]:
                return CLAIMS[key].what
            continue
        op, option = key.split(".")
        if value not in caps[op][option]:
            declared = caps[op][option]
            said = (VARIANTS[op][option].means(declared[0]) if is_number(declared[0])
                    else f"it declares {op}.{option}={'|'.join(map(str, declared))}")
            return f"{variant_text(op, option, value)} ({said})"
    return None


def declared_variants(caps: dict) -> dict[str, list[str]]:
    """op -> what each option declared without its standard form changes (the verdict's
    convention lines; an implementation that also has the standard form is checked in both)."""
    out: dict[str, list[str]] = {}
    for op, options in VARIANTS.items():
        for name, option in options.items():
            values = caps[op][name]
            if option.default not in values:  # it lacks the standard form: say what it has
                out.setdefault(op, []).append(
                    f"variant {op}.{name}={'|'.join(map(str, values))}: "
                    + "; ".join(option.means(v) for v in values if v != option.default))
    return out
