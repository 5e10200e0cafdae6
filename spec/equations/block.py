"""The post-LN encoder block, and the NumPy-Transformer document's "Pre-LN" label on it.

The block's SymPy <-> code check (``block_forward``) also checks ``residual.forward``."""

from __future__ import annotations

import numpy as np
import sympy as sp

from minibert_spec.equations import Equation, Numeric, Proof, register
from minibert_spec.equations._cache import maps_cache
from minibert_spec.equations._nn import KINK, ln_row, relu_expr
from minibert_spec.equations._sym import (
    Stage,
    arr,
    chain_equal,
    floats,
    fmt_array,
    is_zero,
    lambdify_map,
)
from minibert_spec.sources import GUIDE, MINIBERT, PROTOCOL_VARIANTS, SEED001, SLIDES


def _prove_postln() -> Proof:
    """Post-LN: the block's output is a LayerNorm output, so with gamma = 1, beta = 0 every row
    has mean 0 whatever the sublayer (checked with an arbitrary sublayer output f)."""
    for n in (2, 3):
        x = arr("x", n)
        f = [sp.Function(f"f{i}")(*x) for i in range(n)]
        out = ln_row(np.array([x[i] + f[i] for i in range(n)], dtype=object))
        if not is_zero(sp.Add(*out)):
            return Proof("refuted", (n,), "output row mean != 0")
    return Proof("proven", (2, 3), "x' = LN(x + MHA(x)), out = LN(x' + FFN(x')): rows of "
                                   "LN(.) have mean 0 (gamma = 1, beta = 0)")


def postln_stream(x, stages):
    """The post-LN block's forward up to LN2, as its backward reads it: r1 = x + MHA(x),
    h = LN1(r1), r2 = h + FFN(h) (the block's output is LN2(r2))."""
    mha, ln1, ffn, _ = stages
    r1 = [x[i] + a for i, a in enumerate(mha(x))]
    h = ln1(r1)
    r2 = [h[i] + f for i, f in enumerate(ffn(h))]
    return r1, h, r2


def block_backward_composed(x, dout, stages):
    """The block's backward as the reference composes it (``_block_backward``): LN2's
    backward, the FFN's plus the skip, LN1's, the attention's plus the skip.  ``stages`` =
    (attention, ln1, ffn, ln2), each a :class:`Stage` (or anything with ``vjp``).  Returns
    (dx, [parameter gradients per stage])."""
    mha, ln1, ffn, ln2 = stages
    n = len(x)
    r1, h, r2 = postln_stream(x, stages)
    dr2, dp_ln2 = ln2.vjp(r2, dout)
    dh_ffn, dp_ffn = ffn.vjp(h, dr2)
    dh = [dr2[i] + dh_ffn[i] for i in range(n)]  # skip + FFN branch
    dr1, dp_ln1 = ln1.vjp(r1, dh)
    dx_attn, dp_mha = mha.vjp(x, dr1)
    dx = [dr1[i] + dx_attn[i] for i in range(n)]  # skip + attention branch
    return dx, [dp_mha, dp_ln1, dp_ffn, dp_ln2]


def block_forward_staged(x, stages):
    return stages[3](postln_stream(x, stages)[2])


def _arbitrary_stages(n: int) -> tuple:
    """Attention, LN1, FFN, LN2 as arbitrary stages of ``n`` features, one parameter each."""
    return tuple(Stage(name, n, (sp.Symbol(f"p_{name}", real=True),))
                 for name in ("A", "L", "F", "N"))


def chain_differs(x, dout, out, dx, stages, dparams) -> str:
    """What differs between a composed backward (``dx``, each stage's ``dparams``) and
    sympy.diff of <dout, out> w.r.t. x and each stage's parameter; "" when nothing does."""
    loss = sp.Add(*[d * o for d, o in zip(dout, out)])
    for i in range(len(x)):
        if not chain_equal(sp.diff(loss, x[i]), dx[i]):
            return f"dx_{i} differs from sympy.diff"
    for stage, dp in zip(stages, dparams):
        if not chain_equal(sp.diff(loss, stage.params[0]), dp[0]):
            return f"the gradient of {stage.params[0]} differs"
    return ""


def _prove_chain(forward, composed, detail: str, finals=(None,)) -> Proof:
    """The chain rule through a block in the order the code walks it (``composed``), for
    arbitrary stages (n = 2 features, one parameter each; each of ``finals`` a final
    LayerNorm stage, or None): dx and every stage's parameter gradient equal sympy.diff of
    the composed ``forward``."""
    n = 2
    x, dout = arr("x", n), arr("dout", n)
    for final in finals:
        stages, extra = _arbitrary_stages(n), {} if final is None else {"final": final}
        out = forward(list(x), stages, **extra)
        dx, dparams = composed(list(x), list(dout), stages, **extra)
        wrong = chain_differs(x, dout, out, dx, stages + ((final,) if final else ()), dparams)
        if wrong:
            return Proof("refuted", (n,), wrong + (" (with LN_f)" if final else ""))
    return Proof("proven", (n,), detail)


def prove_block_backward(composed=block_backward_composed) -> Proof:
    """The chain rule through the post-LN block in the order the code walks it, for
    *arbitrary* stages: attention, LN1, FFN, LN2 are undefined SymPy functions of their
    input (n = 2 features) and of one parameter each.  The input gradient and every
    parameter gradient of the composed backward equal sympy.diff of the composed forward.
    What each stage's backward computes is proven by its own equation (the uses)."""
    return _prove_chain(block_forward_staged, composed,
                        "dx and the four stages' parameter gradients equal sympy.diff of "
                        "LN2(h + FFN(h)), h = LN1(x + MHA(x)), for arbitrary stage functions")


def _sublayer(v, W):
    return v @ W


def _prove_preln_label() -> Proof:
    """The NumPy-Transformer document labels LN(X + MultiHead(X)) 'Pre-LN'.  That formula is
    post-LN (LayerNorm after the residual add); pre-LN is X + MultiHead(LN(X)).  The two differ:
    a concrete input with a linear stand-in sublayer (the label is independent of the
    sublayer; gamma = 1, beta = 0)."""
    x = np.array([sp.Integer(1), sp.Integer(2), sp.Integer(4)], dtype=object)
    W = np.array([[2, 0, 1], [0, 1, 0], [1, 0, -1]], dtype=object)
    post = ln_row(x + _sublayer(x, W))
    pre = x + _sublayer(ln_row(x), W)
    a, b = floats(post), floats(pre)
    return Proof("refuted", (3,),
                 f"x={x.tolist()}, sublayer(v) = v W with W={W.tolist()}: the stated formula "
                 f"LN(x + f(x)) = {fmt_array(a)} (row mean {a.mean():.3g}: post-LN), pre-LN "
                 f"x + f(LN(x)) = {fmt_array(b)} (row mean {b.mean():.3g})")


# --------------------------------------------------------------------------- SymPy <-> code
@maps_cache
def _block_stages(size):
    """The post-LN block's stages as lambdified SymPy forward maps (A = 1, no attention biases):
    attention, LayerNorm of one row, FFN.  Lambdifying the composed expression is far too slow
    (nested square roots through two LayerNorms), so the block composes the stages in NumPy."""
    B, T, H, I = size
    x = arr("x", B, T, H)
    W = {n: arr(n, H, H) for n in ("W_q", "W_k", "W_v", "W_o")}
    q, k, v = x @ W["W_q"], x @ W["W_k"], x @ W["W_v"]
    e = np.vectorize(sp.exp, otypes=[object])((q @ k.transpose(0, 2, 1)) / sp.sqrt(H))
    att = ((e / e.sum(axis=-1, keepdims=True)) @ v) @ W["W_o"]
    r, g, b = arr("r", H), arr("g", H), arr("be", H)
    ln = ln_row(r, g, b)
    h, W1, b1, W2, b2 = arr("h", H), arr("W_1", H, I), arr("b_1", I), arr("W_2", I, H), \
        arr("b_2", H)
    f = np.vectorize(relu_expr, otypes=[object])(h @ W1 + b1) @ W2 + b2
    return (lambdify_map(dict(x=x, **W), [att]), lambdify_map(dict(r=r, g=g, be=b), [ln]),
            lambdify_map(dict(h=h, W_1=W1, b_1=b1, W_2=W2, b_2=b2), [f]))


def _staged(size):
    """The block's stages as NumPy functions of [B, T, H] arrays: (mha, ln, ffn), ``ln(a,
    name, p)`` the LayerNorm ``name`` ("ln1", ...) of every row."""
    attention, layernorm, ffn = _block_stages(size)

    def mha(x, p):
        return attention(x=x, **{n: p[n] for n in ("W_q", "W_k", "W_v", "W_o")})[0]

    def ln(a, name, p):
        return np.stack([layernorm(r=row, g=p[f"{name}_gamma"], be=p[f"{name}_beta"])[0]
                         for row in a.reshape(-1, a.shape[-1])]).reshape(a.shape)

    def ff(h, p):
        return np.stack([ffn(h=row, **{n: p[n] for n in ("W_1", "b_1", "W_2", "b_2")})[0]
                         for row in h.reshape(-1, h.shape[-1])]).reshape(h.shape)

    return mha, ln, ff


def _block_fn(size):
    mha, ln, ffn = _staged(size)

    def run(x, **p):
        h1 = ln(x + mha(x, p), "ln1", p)
        return (ln(h1 + ffn(h1, p), "ln2", p),)

    return run


def _block_inputs(size):
    B, T, H, I = size
    spec = {n: ("float", (H, H), 1.5) for n in ("W_q", "W_k", "W_v", "W_o")}
    spec.update(x=("float", (B, T, H), 2.0), W_1=("float", (H, I), 2.0),
                b_1=("float", (I,), 1.0), W_2=("float", (I, H), 2.0), b_2=("float", (H,), 1.0))
    for ln in ("ln1", "ln2"):
        spec[f"{ln}_gamma"], spec[f"{ln}_beta"] = ("float", (H,), 2.0), ("float", (H,), 1.0)
    return spec


def _kink_free(ffn_input):
    """accept(size, x, **p): away from the FFN's ReLU kinks, ``ffn_input(mha, ln, x, p)``
    (what the FFN reads) computed through the stages themselves."""
    def accept(size, x, norm=None, **p):
        mha, ln, _ = _staged(size)
        return bool(np.min(np.abs(ffn_input(mha, ln, x, p) @ p["W_1"] + p["b_1"])) > KINK)
    return accept


def _block_code(*norm):
    """impl.block_forward on the sample's parameters renamed to the protocol's keys
    ("ln1_gamma" -> "ln1.gamma"); ``norm`` given (or drawn by the variant's adapt): passed on."""
    def code(impl, size, x, **p):
        kw = {"norm": p.pop("norm", *norm)} if norm else {}
        params = {("attn." + k if k.startswith("W_") and k[2] in "qkvo" else
                   "ffn." + k if k[0] in "Wb" else k.rsplit("_", 1)[0] + "." +
                   k.rsplit("_", 1)[1]): v for k, v in p.items()}
        out, _ = impl.block_forward(x, params, n_heads=1, eps=1e-5, **kw)
        return (out,)
    return code


BLOCK_SIZES = ((2, 2, 3, 2),)
# the whole block vs the composed SymPy stages; residual.forward reuses it (the reference has
# no standalone residual op)
BLOCK_CHECK = Numeric(BLOCK_SIZES, _block_inputs, _block_fn, _block_code(),
                      _kink_free(lambda mha, ln, x, p: ln(x + mha(x, p), "ln1", p)),
                      needs=("block_forward",))


register(Equation(
    "block.postln", "Post-LN encoder block",
    (f"{MINIBERT} §2.5", f"{SEED001} §1.3", f"{SLIDES} (step 2)", f"{GUIDE} §10"),
    r"x' = \mathrm{LN}(x + \mathrm{MHA}(x)),\ \mathrm{out} = \mathrm{LN}(x' + \mathrm{FFN}(x'))",
    _prove_postln, torch_op="torch.nn.TransformerEncoderLayer(norm_first=False)",
    numeric=BLOCK_CHECK,
    uses=("attention.output", "ffn.forward", "layernorm.forward", "residual.forward")))
register(Equation(
    "block.preln_label", "'Pre-LN style' label on LN(X + MultiHead(X))", (f"{SEED001} §1.3",),
    r"Z = \mathrm{LayerNorm}(X + \mathrm{MultiHead}(X))\ \text{(labelled Pre-LN)}",
    _prove_preln_label, kind="document", expected="refuted", target="block.postln",
    note="the formulas are post-LN (what the reference implements); only the label is wrong"))
register(Equation(
    "block.backward", "Post-LN block backward: the stages' backwards composed",
    (f"{SEED001} §2", f"{SEED001} §2.3"),
    r"\delta r_2 = \mathrm{LN}_2^\top(\delta),\ \delta h = \delta r_2 + "
    r"\mathrm{FFN}^\top(\delta r_2),\ \delta r_1 = \mathrm{LN}_1^\top(\delta h),\ "
    r"\delta x = \delta r_1 + \mathrm{MHA}^\top(\delta r_1)",
    prove_block_backward, gradient=True,
    torch_op="torch.nn.TransformerEncoderLayer(norm_first=False)",
    numeric_na="a composition of the op backwards, each with its own SymPy <-> code check; "
               "the composition is checked by finite differences and the torch oracle on the "
               "block op, and proven for arbitrary stages",
    note="M^T(d) is the stage's transposed Jacobian at its own input times d: the proof "
         "takes every stage as an arbitrary function, so it proves the wiring (which "
         "gradient goes where, both skips), and the uses prove each stage",
    uses=("block.postln", "layernorm.backward.dx", "layernorm.backward.dgamma",
          "layernorm.backward.dbeta", "attention.backward.dx", "ffn.backward",
          "residual.backward")))


# --------------------------------------------------------------------------- pre-LN variant
VARIANT = PROTOCOL_VARIANTS


def preln_stream(x, stages):
    """The pre-LN block's forward before LN_f, as its backward reads it: n1 = LN1(x),
    h = x + MHA(n1), n2 = LN2(h), out = h + FFN(n2)."""
    mha, ln1, ffn, ln2 = stages
    n1 = ln1(x)
    h = [x[i] + a for i, a in enumerate(mha(n1))]
    n2 = ln2(h)
    out = [h[i] + f for i, f in enumerate(ffn(n2))]
    return n1, h, n2, out


def preln_block_forward_staged(x, stages, final=None):
    """h = x + MHA(LN1(x)), out = h + FFN(LN2(h)) (then LN_f): the residual stream is never
    normalised; each sublayer reads a LayerNorm of it."""
    out = preln_stream(x, stages)[3]
    return final(out) if final is not None else out


def preln_block_backward_composed(x, dout, stages, final=None):
    """The pre-LN block's backward as the reference composes it (``_preln_block_backward``):
    LN_f's backward, the FFN's then LN2's plus the skip, the attention's then LN1's plus the
    skip.  Returns (dx, [parameter gradients per stage (, LN_f)])."""
    mha, ln1, ffn, ln2 = stages
    n = len(x)
    n1, h, n2, out = preln_stream(x, stages)
    dp_final = []
    if final is not None:
        dout, dp_final = final.vjp(out, dout)
    dn2, dp_ffn = ffn.vjp(n2, dout)
    dr2, dp_ln2 = ln2.vjp(h, dn2)
    dh = [dout[i] + dr2[i] for i in range(n)]  # skip + FFN branch
    dn1, dp_mha = mha.vjp(n1, dh)
    dr1, dp_ln1 = ln1.vjp(x, dn1)
    dx = [dh[i] + dr1[i] for i in range(n)]  # skip + attention branch
    return dx, [dp_mha, dp_ln1, dp_ffn, dp_ln2] + ([dp_final] if final is not None else [])


def _prove_preln() -> Proof:
    """The pre-LN block leaves the residual stream un-normalised: with both sublayers zero the
    block is the identity (post-LN would return LN(LN(x))), and with its final LayerNorm it is
    LN_f(x) (n = 2, 3 features, arbitrary LayerNorm stages)."""
    for n in (2, 3):
        x = list(arr("x", n))
        zero = type("Zero", (), {"__call__": lambda self, v: [0] * len(v)})()
        lns = [Stage(name, n) for name in ("L", "N", "F")]
        out = preln_block_forward_staged(x, (zero, lns[0], zero, lns[1]))
        if any(not is_zero(o - xi) for o, xi in zip(out, x)):
            return Proof("refuted", (n,), "zero sublayers do not give the identity")
        out = preln_block_forward_staged(x, (zero, lns[0], zero, lns[1]), final=lns[2])
        if any(not chain_equal(o, f) for o, f in zip(out, lns[2](x))):
            return Proof("refuted", (n,), "zero sublayers do not give LN_f(x)")
    return Proof("proven", (2, 3), "zero sublayers: out = x (pre), LN_f(x) (pre_final): the "
                                   "residual stream passes unnormalised")


def _prove_preln_backward() -> Proof:
    """The chain rule through the pre-LN block, with and without its final LayerNorm."""
    return _prove_chain(preln_block_forward_staged, preln_block_backward_composed,
                        "dx and every stage's parameter gradient equal sympy.diff of "
                        "h + FFN(LN2(h)), h = x + MHA(LN1(x)), with and without LN_f, "
                        "for arbitrary stage functions",
                        (None, Stage("G", 2, (sp.Symbol("p_G", real=True),))))


def _preln_fn(size):
    """The pre-LN block (with LN_f for norm "pre_final") from the same staged maps."""
    mha, ln, ffn = _staged(size)

    def run(x, norm="pre", **p):
        h = x + mha(ln(x, "ln1", p), p)
        out = h + ffn(ln(h, "ln2", p), p)
        return (ln(out, "ln_f", p) if norm == "pre_final" else out,)

    return run


def _variant_inputs(size):
    spec = _block_inputs(size)
    H = size[2]
    spec["ln_f_gamma"], spec["ln_f_beta"] = ("float", (H,), 2.0), ("float", (H,), 1.0)
    return spec


def declared_preln(caps, arrays):
    """The pre-LN form the implementation declares: "pre", else "pre_final" (with LN_f)."""
    from minibert_spec.protocol import NotApplicable

    norms = caps["block"]["norm"]
    norm = "pre" if "pre" in norms else "pre_final" if "pre_final" in norms else None
    if norm is None:
        raise NotApplicable("not applicable: the implementation does not claim a pre-LN block "
                            f"(it declares block.norm={'|'.join(norms)})")
    out = {**arrays, "norm": norm}
    if norm == "pre":
        out.pop("ln_f_gamma", None)
        out.pop("ln_f_beta", None)
    return out


register(Equation(
    "block.preln", "Pre-LN block (GPT-2), optionally with its final LayerNorm", (VARIANT,),
    r"h = x + \mathrm{MHA}(\mathrm{LN}_1(x)),\ \mathrm{out} = h + "
    r"\mathrm{FFN}(\mathrm{LN}_2(h))\ [\,\mathrm{out} \leftarrow \mathrm{LN}_f(\mathrm{out})]",
    _prove_preln, torch_op="torch.nn.TransformerEncoderLayer(norm_first=True)",
    numeric=Numeric(BLOCK_SIZES, _variant_inputs, _preln_fn, _block_code(None),
                    _kink_free(lambda mha, ln, x, p: ln(x + mha(ln(x, "ln1", p), p), "ln2", p)),
                    needs=("block_forward",), adapt=declared_preln),
    note="a variant of the protocol (CAPABILITIES block.norm = pre | pre_final): the pre-LN "
         "label the NumPy-Transformer document puts on a post-LN formula (block.preln_label) "
         "names this block",
    uses=("attention.output", "ffn.forward", "layernorm.forward", "residual.forward")))
register(Equation(
    "block.preln_backward", "Pre-LN block backward: the stages' backwards composed",
    (VARIANT,),
    r"\delta h = \delta + \mathrm{LN}_2^\top(\mathrm{FFN}^\top(\delta)),\ "
    r"\delta x = \delta h + \mathrm{LN}_1^\top(\mathrm{MHA}^\top(\delta h))\ "
    r"(\delta \leftarrow \mathrm{LN}_f^\top(\delta)\ \text{first})",
    _prove_preln_backward, gradient=True,
    torch_op="torch.nn.TransformerEncoderLayer(norm_first=True)",
    numeric_na="a composition of the op backwards, each with its own SymPy <-> code check; "
               "checked by finite differences and the torch oracle on the block op, and "
               "proven for arbitrary stages",
    uses=("block.preln", "layernorm.backward.dx", "attention.backward.dx", "ffn.backward",
          "residual.backward")))


# --------------------------------------------------------------------------- x + LN(f(x))
def innerln_stream(x, stages):
    """The block with normalised sublayer outputs, as its backward reads it: a = MHA(x),
    h = x + LN1(a), f = FFN(h), out = h + LN2(f)."""
    mha, ln1, ffn, ln2 = stages
    a = mha(x)
    h = [x[i] + v for i, v in enumerate(ln1(a))]
    f = ffn(h)
    out = [h[i] + v for i, v in enumerate(ln2(f))]
    return a, h, f, out


def innerln_block_backward_composed(x, dout, stages):
    """The backward as the reference composes it (``_innerln_block_backward``): LN2's backward
    then the FFN's plus the skip, LN1's then the attention's plus the skip."""
    mha, ln1, ffn, ln2 = stages
    n = len(x)
    a, h, f, out = innerln_stream(x, stages)
    dn2, dp_ln2 = ln2.vjp(f, dout)
    dh_ffn, dp_ffn = ffn.vjp(h, dn2)
    dh = [dout[i] + dh_ffn[i] for i in range(n)]  # skip + FFN branch
    dn1, dp_ln1 = ln1.vjp(a, dh)
    dx_attn, dp_mha = mha.vjp(x, dn1)
    dx = [dh[i] + dx_attn[i] for i in range(n)]  # skip + attention branch
    return dx, [dp_mha, dp_ln1, dp_ffn, dp_ln2]


def _prove_innerln() -> Proof:
    """x + LN(f(x)) keeps the residual stream un-normalised: with a constant sublayer output
    c the LayerNorm of it is beta (gamma * 0 + beta: a constant row normalises to 0), so the
    block is x + beta1 + beta2 -- post-LN would return LN(.) of mean 0; checked with
    symbolic beta (n = 2, 3), gamma = 1."""
    for n in (2, 3):
        x = arr("x", n)
        c = sp.Symbol("c", real=True)
        b1, b2, ones = arr("b1", n), arr("b2", n), np.ones(n, dtype=object)
        const = np.array([c] * n, dtype=object)
        h = x + ln_row(const, ones, b1)
        out = h + ln_row(const, ones, b2)
        if any(not is_zero(o - (x[i] + b1[i] + b2[i])) for i, o in enumerate(out)):
            return Proof("refuted", (n,), "a constant sublayer does not give x + beta1 + beta2")
    return Proof("proven", (2, 3), "constant sublayers: out = x + beta1 + beta2 (the residual "
                                   "stream passes unnormalised)")


def _prove_innerln_backward() -> Proof:
    """The chain rule through h = x + LN1(MHA(x)), out = h + LN2(FFN(h))."""
    return _prove_chain(lambda x, stages: innerln_stream(x, stages)[3],
                        innerln_block_backward_composed,
                        "dx and the four stages' parameter gradients equal sympy.diff of "
                        "h + LN2(FFN(h)), h = x + LN1(MHA(x)), for arbitrary stage functions")


def _innerln_fn(size):
    mha, ln, ffn = _staged(size)

    def run(x, **p):
        h = x + ln(mha(x, p), "ln1", p)
        return (h + ln(ffn(h, p), "ln2", p),)

    return run


register(Equation(
    "block.innerln", "Block with normalised sublayer outputs, x + LN(f(x))", (VARIANT,),
    r"h = x + \mathrm{LN}_1(\mathrm{MHA}(x)),\ \mathrm{out} = h + "
    r"\mathrm{LN}_2(\mathrm{FFN}(h))",
    _prove_innerln, torch_op="torch: multi_head_attention_forward, F.layer_norm composed",
    numeric=Numeric(BLOCK_SIZES, _block_inputs, _innerln_fn, _block_code("inner"),
                    _kink_free(lambda mha, ln, x, p: x + ln(mha(x, p), "ln1", p)),
                    needs=("block_forward",), variant={"block.norm": "inner"}),
    note="a variant of the protocol (CAPABILITIES block.norm = inner): the form many "
         "from-scratch implementations write, each sublayer's output normalised before the "
         "residual sum",
    uses=("attention.output", "ffn.forward", "layernorm.forward", "residual.forward")))
register(Equation(
    "block.innerln_backward", "x + LN(f(x)) block backward: the stages' backwards composed",
    (VARIANT,),
    r"\delta h = \delta + \mathrm{FFN}^\top(\mathrm{LN}_2^\top(\delta)),\ "
    r"\delta x = \delta h + \mathrm{MHA}^\top(\mathrm{LN}_1^\top(\delta h))",
    _prove_innerln_backward, gradient=True,
    torch_op="torch: multi_head_attention_forward, F.layer_norm composed",
    numeric_na="a composition of the op backwards, each with its own SymPy <-> code check; "
               "checked by finite differences and the torch oracle on the block op, and "
               "proven for arbitrary stages",
    uses=("block.innerln", "layernorm.backward.dx", "attention.backward.dx", "ffn.backward",
          "residual.backward")))
