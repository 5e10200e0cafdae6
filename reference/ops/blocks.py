"""Transformer blocks: post-LN, pre-LN (with or without a final LN) and inner-LN, their parameter
names and the norm / attention / FFN parts they compose."""

from __future__ import annotations

from typing import NamedTuple

from minibert_reference.ops.activations import _check_activation
from minibert_reference.ops.attention import (
    ATTENTION_PARAMS,
    AttentionCache,
    _attention_backward,
    _attention_forward,
    _check_attention,
)
from minibert_reference.ops.ffn import (
    FFN_PARAMS,
    SWIGLU_PARAMS,
    FFNCache,
    SwiGLUCache,
    _check_ffn_params,
    _ffn_backward,
    _ffn_forward,
    _swiglu_backward,
    _swiglu_forward,
)
from minibert_reference.ops.norms import (
    LayerNormCache,
    RMSNormCache,
    _check_eps,
    _check_layernorm_params,
    _layernorm_backward,
    _layernorm_forward,
    _rmsnorm_backward,
    _rmsnorm_forward,
)
from minibert_reference.registry import implements
from minibert_reference.validate import as_float_array

# the public ops of this section: the package gathers them into minibert_reference.ops.__all__
__all__ = ["block_param_names", "block_param_shapes", "block_forward", "block_backward"]

# --------------------------------------------------------------------------- blocks
# where a block's LayerNorms sit: "post" (BERT, the documents), "pre" (GPT-2: x + MHA(LN1(x)),
# the residual stream never normalised), "pre_final" (pre-LN followed by the final
# LayerNorm ln_f that a pre-LN stack needs before its head: a one-block GPT) and "inner"
# (x + LN(f(x)): each sublayer's output normalised before the residual sum)
BLOCK_NORMS = ("post", "pre", "pre_final", "inner")
# which normalisation a block's ln1 / ln2 / ln_f are: LayerNorm (gamma, beta) or RMSNorm
# (gamma only: LLaMA)
BLOCK_NORMALIZATIONS = ("layernorm", "rmsnorm")
# the block's feed-forward part: the FFN (act(x W_1 + b_1) W_2 + b_2) or LLaMA's SwiGLU
BLOCK_FFNS = ("mlp", "swiglu")
# a block's parts and the prefix of their parameters in its dict ``p`` (the op table's rows)
BLOCK_PARTS = {"attention": "attn.", "ffn": "ffn.", "swiglu": "swiglu."}


def block_param_names(attn_bias: bool = True, norm: str = "post", *, W_o: bool = True,
                      b_1: bool = True, b_2: bool = True, normalization: str = "layernorm",
                      ffn: str = "mlp", swiglu_bias: bool = False,
                      ln_affine: bool = True) -> tuple[str, ...]:
    """Local parameter names of one block, in a fixed order: what its parts declare -- the
    attention's biases (``attn_bias``) and output projection (``W_o``), the feed-forward part
    (``ffn``: the FFN's ``ffn.*`` with its biases ``b_1``, ``b_2``, or SwiGLU's ``swiglu.*``,
    with biases when ``swiglu_bias``), LayerNorm's beta (absent for RMSNorm), LayerNorms without
    gamma and beta (``ln_affine`` False) -- and ``ln_f.*`` for "pre_final".  The one
    definition: the block's check, the models' parameters and the suite's strategies read it."""
    attn = ("W_q", "W_k", "W_v") + (("W_o",) if W_o else ())
    if attn_bias:
        attn += ("b_q", "b_k", "b_v") + (("b_o",) if W_o else ())
    if ffn == "swiglu":
        mlp = tuple(f"swiglu.{n}" for n in ("W_1", "W_2", "W_3") + (
            ("b_1", "b_2", "b_3") if swiglu_bias else ()))
    else:
        mlp = tuple(f"ffn.{n}" for n in ("W_1",) + (("b_1",) if b_1 else ()) + ("W_2",)
                    + (("b_2",) if b_2 else ()))
    affine = ("gamma",) if normalization == "rmsnorm" else ("gamma", "beta") if ln_affine \
        else ()
    lns = ("ln1", "ln2") + (("ln_f",) if norm == "pre_final" else ())
    ln = {name: tuple(f"{name}.{a}" for a in affine) for name in lns}
    return tuple(f"attn.{n}" for n in attn) + ln["ln1"] + mlp + ln["ln2"] + ln.get("ln_f", ())


def block_param_shapes(names: tuple, H: int, I: int) -> dict[str, tuple[int, ...]]:
    """Name -> shape of a block's parameters ``names`` (block_param_names): the attention's
    weights [H, H], the FFN's W_1 [H, I], b_1 [I], W_2 [I, H] (SwiGLU's W_1, W_3 [H, I], b_1,
    b_3 [I], W_2 [I, H]); every other one [H]."""
    shapes = {"ffn.W_1": (H, I), "ffn.b_1": (I,), "ffn.W_2": (I, H), "swiglu.W_1": (H, I),
              "swiglu.W_3": (H, I), "swiglu.W_2": (I, H), "swiglu.b_1": (I,),
              "swiglu.b_3": (I,)}
    return {n: shapes.get(n, (H, H) if n.startswith("attn.W") else (H,)) for n in names}


def _block_variant(p: dict) -> dict:
    """The pieces a block's ``p`` carries, as ``block_param_names``' keywords (RMSNorm has no
    beta: with ``normalization`` "rmsnorm" there is none to look for)."""
    return {"attn_bias": "attn.b_q" in p, "W_o": "attn.W_o" in p, "b_1": "ffn.b_1" in p,
            "b_2": "ffn.b_2" in p, "swiglu_bias": "swiglu.b_1" in p,
            "ln_affine": "ln1.gamma" in p}


def _norm_forward(x, p: dict, name: str, eps: float, normalization: str):
    """The block's normalisation ``name`` (ln1, ln2, ln_f): LayerNorm or RMSNorm."""
    if normalization == "rmsnorm":
        return _rmsnorm_forward(x, p[f"{name}.gamma"], eps)
    # a LayerNorm without affine (no gamma, beta in p): layernorm.affine False
    return _layernorm_forward(x, p.get(f"{name}.gamma"), p.get(f"{name}.beta"), eps)


def _norm_backward(dy, cache, name: str):
    """(dx, {name.gamma: .., name.beta: ..}) of one of the block's normalisations."""
    if isinstance(cache, RMSNormCache):
        dx, dgamma = _rmsnorm_backward(dy, cache)
        return dx, {f"{name}.gamma": dgamma}
    dx, dgamma, dbeta = _layernorm_backward(dy, cache)
    if dgamma is None:  # without affine: nothing to return
        return dx, {}
    return dx, {f"{name}.gamma": dgamma, f"{name}.beta": dbeta}


def _attention_of(p: dict) -> list:
    """The attention's arguments from ``p``, in the op's order (None for absent pieces)."""
    return [p.get(f"attn.{n}") for n in ATTENTION_PARAMS]


def _ffn_of(p: dict) -> list:
    """The FFN's parameters from ``p``, in the op's order (None for an absent bias)."""
    return [p.get(f"ffn.{n}") for n in FFN_PARAMS]


def _mlp_forward(x, p: dict, activation: str, ffn: str):
    """The block's feed-forward part: the FFN, or SwiGLU (``ffn`` "swiglu")."""
    if ffn == "swiglu":
        return _swiglu_forward(x, *(p.get(f"swiglu.{n}") for n in SWIGLU_PARAMS))
    return _ffn_forward(x, *_ffn_of(p), activation)


def _mlp_backward(dy, cache):
    """(dx, its gradients keyed like the block's p) of the feed-forward part."""
    if isinstance(cache, SwiGLUCache):
        dx, *grads = _swiglu_backward(dy, cache)
        return dx, _part_grads("swiglu.", SWIGLU_PARAMS, grads)
    dx, *grads = _ffn_backward(dy, cache)
    return dx, _part_grads("ffn.", FFN_PARAMS, grads)


def _part_grads(prefix: str, names: tuple, grads) -> dict:
    return {f"{prefix}{n}": g for n, g in zip(names, grads)}


class BlockCache(NamedTuple):
    attn: AttentionCache
    ln1: LayerNormCache | RMSNormCache
    ffn: FFNCache | SwiGLUCache
    ln2: LayerNormCache | RMSNormCache
    names: tuple  # the keys of p, sorted


@implements("block.postln", "residual.forward")
def _block_forward(x, p: dict, *, n_heads: int, mask=None, eps: float = 1e-12,
                   activation: str = "relu", norm: str = "post", causal: bool = False,
                   normalization: str = "layernorm", ffn: str = "mlp", rope: str | None = None,
                   rope_base: float = 10000.0):
    """Post-LN encoder block (Mini-BERT derivation §2.5, BERT):

    h = LN1(x + MHA(x));  out = LN2(h + FFN(h)).
    ``p`` maps local names (``attn.W_q``, ``ln1.gamma``, ...) to arrays; a piece its parts
    leave out (``attn.W_o``, a bias) is absent.  ``norm`` "pre" or "pre_final": the pre-LN
    block (``_preln_block_forward``); ``causal``: causal attention; ``normalization``
    "rmsnorm": every LN is an RMSNorm; ``ffn`` "swiglu": the feed-forward part is SwiGLU
    (``swiglu.*``); ``rope``: the attention's queries and keys turned by RoPE.
    """
    attend = dict(n_heads=n_heads, mask=mask, causal=causal, rope=rope, rope_base=rope_base)
    if norm == "inner":
        return _innerln_block_forward(x, p, eps=eps, activation=activation,
                                      normalization=normalization, ffn=ffn, **attend)
    if norm != "post":
        return _preln_block_forward(x, p, eps=eps, activation=activation,
                                    normalization=normalization, ffn=ffn, **attend)
    a, c_attn = _attention_forward(x, *_attention_of(p), **attend)  # [B, T, H]
    h, c_ln1 = _norm_forward(x + a, p, "ln1", eps, normalization)
    f, c_ffn = _mlp_forward(h, p, activation, ffn)
    out, c_ln2 = _norm_forward(h + f, p, "ln2", eps, normalization)
    return out, BlockCache(attn=c_attn, ln1=c_ln1, ffn=c_ffn, ln2=c_ln2, names=tuple(sorted(p)))


@implements("residual.backward", "block.backward")
def _block_backward(dout, cache):
    """Returns (dx, grads) with grads keyed like the forward's ``p``.

    A residual sum passes its gradient unchanged to both branches: dx gets dr from the skip
    connection plus the attention branch's input gradient.
    """
    if isinstance(cache, PreLNBlockCache):
        return _preln_block_backward(dout, cache)
    if isinstance(cache, InnerLNBlockCache):
        return _innerln_block_backward(dout, cache)
    dr2, g2 = _norm_backward(dout, cache.ln2, "ln2")  # d(h + FFN(h))
    dh_ffn, dffn = _mlp_backward(dr2, cache.ffn)
    dh = dr2 + dh_ffn  # skip + FFN branch
    dr1, g1 = _norm_backward(dh, cache.ln1, "ln1")  # d(x + MHA(x))
    dx_attn, *dattn = _attention_backward(dr1, cache.attn)
    dx = dr1 + dx_attn  # skip + attention branch
    grads = {**_part_grads("attn.", ATTENTION_PARAMS, dattn), **dffn, **g1, **g2}
    return dx, {n: grads[n] for n in cache.names}


class PreLNBlockCache(NamedTuple):
    ln1: LayerNormCache | RMSNormCache
    attn: AttentionCache
    ln2: LayerNormCache | RMSNormCache
    ffn: FFNCache | SwiGLUCache
    ln_f: LayerNormCache | RMSNormCache | None  # the final LayerNorm ("pre_final"), else None
    names: tuple  # the keys of p, sorted


@implements("block.preln")
def _preln_block_forward(x, p: dict, *, n_heads: int, mask=None, eps: float = 1e-12,
                         activation: str = "relu", causal: bool = False,
                         normalization: str = "layernorm", ffn: str = "mlp",
                         rope: str | None = None, rope_base: float = 10000.0):
    """Pre-LN block (GPT-2; torch's ``norm_first=True``): each sublayer reads a LayerNorm of the
    residual stream and adds to it, the stream itself is never normalised:

    h = x + MHA(LN1(x));  out = h + FFN(LN2(h));  with ``ln_f.*`` in ``p``: out = LN_f(out).
    LLaMA's block: ``normalization`` "rmsnorm", ``ffn`` "swiglu", ``rope``.
    """
    n1, c_ln1 = _norm_forward(x, p, "ln1", eps, normalization)
    a, c_attn = _attention_forward(n1, *_attention_of(p), n_heads=n_heads, mask=mask,
                                   causal=causal, rope=rope, rope_base=rope_base)
    h = x + a  # [B, T, H]
    n2, c_ln2 = _norm_forward(h, p, "ln2", eps, normalization)
    f, c_ffn = _mlp_forward(n2, p, activation, ffn)
    out = h + f
    c_lnf = None
    if "ln_f.gamma" in p:
        out, c_lnf = _norm_forward(out, p, "ln_f", eps, normalization)
    return out, PreLNBlockCache(ln1=c_ln1, attn=c_attn, ln2=c_ln2, ffn=c_ffn, ln_f=c_lnf,
                                names=tuple(sorted(p)))


@implements("block.preln_backward")
def _preln_block_backward(dout, cache):
    """Returns (dx, grads).  The residual stream carries its gradient past both sublayers:
    dh = dout + LN2^T(FFN^T(dout)), dx = dh + LN1^T(MHA^T(dh)) (after LN_f^T with ``ln_f``)."""
    grads = {}
    if cache.ln_f is not None:
        dout, g_f = _norm_backward(dout, cache.ln_f, "ln_f")
        grads.update(g_f)
    dn2, dffn = _mlp_backward(dout, cache.ffn)
    dr2, g2 = _norm_backward(dn2, cache.ln2, "ln2")
    dh = dout + dr2  # skip + FFN branch
    dn1, *dattn = _attention_backward(dh, cache.attn)
    dr1, g1 = _norm_backward(dn1, cache.ln1, "ln1")
    dx = dh + dr1  # skip + attention branch
    grads.update({**_part_grads("attn.", ATTENTION_PARAMS, dattn), **dffn, **g1, **g2})
    return dx, {n: grads[n] for n in cache.names}


class InnerLNBlockCache(NamedTuple):
    attn: AttentionCache
    ln1: LayerNormCache | RMSNormCache
    ffn: FFNCache | SwiGLUCache
    ln2: LayerNormCache | RMSNormCache
    names: tuple  # the keys of p, sorted


@implements("block.innerln")
def _innerln_block_forward(x, p: dict, *, n_heads: int, mask=None, eps: float = 1e-12,
                           activation: str = "relu", causal: bool = False,
                           normalization: str = "layernorm", ffn: str = "mlp",
                           rope: str | None = None, rope_base: float = 10000.0):
    """The block with each sublayer's output normalised inside the residual branch (the form
    many from-scratch implementations write, ``x + norm(sublayer(x))``):

    h = x + LN1(MHA(x));  out = h + LN2(FFN(h))."""
    a, c_attn = _attention_forward(x, *_attention_of(p), n_heads=n_heads, mask=mask,
                                   causal=causal, rope=rope, rope_base=rope_base)
    n1, c_ln1 = _norm_forward(a, p, "ln1", eps, normalization)
    h = x + n1  # [B, T, H]
    f, c_ffn = _mlp_forward(h, p, activation, ffn)
    n2, c_ln2 = _norm_forward(f, p, "ln2", eps, normalization)
    return h + n2, InnerLNBlockCache(attn=c_attn, ln1=c_ln1, ffn=c_ffn, ln2=c_ln2,
                                     names=tuple(sorted(p)))


@implements("block.innerln_backward")
def _innerln_block_backward(dout, cache):
    """Returns (dx, grads): each residual sum hands its gradient to the skip unchanged and to
    the branch through LN^T then the sublayer^T: dh = dout + FFN^T(LN2^T(dout)), dx = dh +
    MHA^T(LN1^T(dh))."""
    dn2, g2 = _norm_backward(dout, cache.ln2, "ln2")
    dh_ffn, dffn = _mlp_backward(dn2, cache.ffn)
    dh = dout + dh_ffn  # skip + FFN branch
    dn1, g1 = _norm_backward(dh, cache.ln1, "ln1")
    dx_attn, *dattn = _attention_backward(dn1, cache.attn)
    dx = dh + dx_attn  # skip + attention branch
    grads = {**_part_grads("attn.", ATTENTION_PARAMS, dattn), **dffn, **g1, **g2}
    return dx, {n: grads[n] for n in cache.names}


def _check_block(x, p, n_heads, mask, eps, norm="post", causal=False,
                 normalization="layernorm", ffn="mlp", rope=None, rope_base=10000.0):
    """Checks block_forward's arguments; returns the mask as bool [B, T] (or None)."""
    if not isinstance(p, dict):
        raise ValueError(f"p: expected a dict of block parameters, got {type(p).__name__}")
    for name, value, allowed in (("norm", norm, BLOCK_NORMS),
                                 ("normalization", normalization, BLOCK_NORMALIZATIONS),
                                 ("ffn", ffn, BLOCK_FFNS)):
        if value not in allowed:
            raise ValueError(f"{name}: expected one of {allowed}, got {value!r}")
    variant = _block_variant(p)
    expected = set(block_param_names(norm=norm, normalization=normalization, ffn=ffn,
                                     **variant))
    if set(p) != expected:
        keywords = ", ".join(f"{k}={v}" for k, v in variant.items())
        raise ValueError(f"p: expected the keys of block_param_names({keywords}, norm={norm!r}, "
                         f"normalization={normalization!r}, ffn={ffn!r}); missing "
                         f"{sorted(expected - set(p))}, unexpected {sorted(set(p) - expected)}")
    mask = _check_attention(x, *_attention_of(p), n_heads, mask, causal, rope, rope_base)
    H = x.shape[-1]
    for ln in ("ln1", "ln2") + (("ln_f",) if norm == "pre_final" else ()):
        if normalization == "rmsnorm":
            as_float_array(f"{ln}.gamma", p[f"{ln}.gamma"], shape=(H,), dtype=x.dtype)
            _check_eps(eps)
        else:
            _check_layernorm_params(H, x.dtype, p.get(f"{ln}.gamma"), p.get(f"{ln}.beta"), eps,
                                    affine_optional=True)
    if ffn == "swiglu":
        for name, shape in block_param_shapes(tuple(n for n in p if n.startswith("swiglu.")),
                                              H, p["swiglu.W_1"].shape[-1]).items():
            as_float_array(name, p[name], shape=shape, dtype=x.dtype)
    else:
        _check_ffn_params(H, x.dtype, *_ffn_of(p), b_1_optional=True, b_2_optional=True)
    return mask


def block_forward(x, p: dict, *, n_heads: int, mask=None, eps: float = 1e-12,
                  activation: str = "relu", norm: str = "post", causal: bool = False,
                  normalization: str = "layernorm", ffn: str = "mlp", rope: str | None = None,
                  rope_base: float = 10000.0):
    """x [B, T, H], ``p`` a dict with the keys of ``block_param_names(...)`` (the pieces its
    parts have: without ``attn.W_o``/``attn.b_o``, attention biases, ``ffn.b_1``/``ffn.b_2``
    where they are absent) -> [B, T, H]; the FFN's ``activation`` relu (default), gelu,
    gelu_tanh or relu2 (squared ReLU); ``norm`` "post" (BERT), "pre" or "pre_final" (GPT-2,
    the latter with its final LayerNorm ``ln_f``), "inner" (x + LN(f(x))); ``causal``
    attention; ``normalization`` "layernorm" or "rmsnorm" (LLaMA: gamma only); ``ffn``
    "swiglu" (LLaMA: ``swiglu.W_1``, ``W_2``, ``W_3``, biases optional); ``rope`` "half" or
    "interleaved" (RoPE on queries and keys, ``rope_base``)."""
    mask = _check_block(x, p, n_heads, mask, eps, norm, causal, normalization, ffn, rope,
                        rope_base)
    _check_activation(activation)
    return _block_forward(x, p, n_heads=n_heads, mask=mask, eps=eps, activation=activation,
                          norm=norm, causal=bool(causal), normalization=normalization, ffn=ffn,
                          rope=rope, rope_base=rope_base)


def block_backward(dout, cache):
    x = cache.attn.qkv.x if isinstance(cache, (BlockCache, InnerLNBlockCache)) else \
        cache.ln1.x_hat
    as_float_array("dout", dout, shape=x.shape, dtype=x.dtype)
    return _block_backward(dout, cache)
