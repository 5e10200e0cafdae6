"""ReLU, tanh, the FFN, residual connections, the post-LN block, the pooler -- and the documents'
variants of them (a mislabelled "Pre-LN", residuals from the embeddings, pooler orientation)."""

from __future__ import annotations

from functools import cache

import numpy as np
import sympy as sp

from spec.equations import Equation, Numeric, Proof, register
from spec.equations._sym import arr, compare, fmt_array, is_zero, lambdify_map, vjp

MINIBERT = "Mini-BERT derivation"
SEED001 = "NumPy-Transformer document"
SLIDES = "BERT masked-LM slides"
BLOG = "BERT-base blog"
GUIDE = "visual guide"

KINK = 1e-3  # SymPy <-> code samples keep ReLU inputs this far from 0 (spec.tolerances.KINK_MARGIN)


def _relu(e):
    return sp.Max(0, e)


def _prove_relu() -> Proof:
    """d max(0, x)/dx = 1 for x > 0 and 0 for x < 0 (sympy.diff of Max on signed symbols); at
    x = 0 the derivative does not exist and the code takes 0 (as torch does)."""
    xp, xn = sp.Symbol("xp", positive=True), sp.Symbol("xn", negative=True)
    if sp.diff(_relu(xp), xp) != 1 or sp.diff(_relu(xn), xn) != 0:
        return Proof("refuted", ("symbolic",), "derivative of max(0, x) is not the step function")
    if _relu(xp) != xp or _relu(xn) != 0:
        return Proof("refuted", ("symbolic",), "max(0, x) is not x on x > 0, 0 on x < 0")
    return Proof("proven", (1,), "x != 0; the subgradient at 0 is taken as 0 (convention)")


def _prove_tanh() -> Proof:
    x = sp.Symbol("x", real=True)
    if sp.simplify(sp.diff(sp.tanh(x), x) - (1 - sp.tanh(x) ** 2)) != 0:
        return Proof("refuted", ("symbolic",), "d tanh != 1 - tanh^2")
    return Proof("proven", (1,))


FFN_SIZES = ((1, 2, 2, 3), (2, 1, 3, 2))  # (B, T, H, I)


def _prove_ffn() -> Proof:
    """On every activation region (a fixed on/off pattern m of the hidden units, pre-activations
    of sign m) FFN(x) = ((x W1 + b1) ⊙ m) W2 + b2, and sympy.diff gives
    dx = ((dy W2^T) ⊙ m) W1^T, dW1 = x^T ((dy W2^T) ⊙ m), db1 = sum((dy W2^T) ⊙ m),
    dW2 = relu(h)^T dy, db2 = sum(dy)."""
    rng = np.random.default_rng(0)
    for B, T, H, I in FFN_SIZES:
        x, W1, b1, W2, b2 = arr("x", B, T, H), arr("W1", H, I), arr("b1", I), arr("W2", I, H), \
            arr("b2", H)
        dy = arr("dy", B, T, H)
        m = rng.integers(0, 2, (B, T, I))  # the region: which hidden units are on
        h = x @ W1 + b1
        a = h * m
        y = a @ W2 + b2
        da = (dy @ W2.T) * m
        pairs = ((x, da @ W1.T), (W1, x.reshape(-1, H).T @ da.reshape(-1, I)),
                 (b1, da.sum(axis=(0, 1))), (W2, a.reshape(-1, I).T @ dy.reshape(-1, H)),
                 (b2, dy.sum(axis=(0, 1))))
        for w, closed in pairs:
            ok, detail = compare(vjp(y, dy, w), closed)
            if not ok:
                return Proof("refuted", (B, T, H, I), detail)
    return Proof("proven", FFN_SIZES, "on each activation region (ReLU pattern fixed)")


def _prove_residual() -> Proof:
    """out = x + f(x) for an arbitrary differentiable f: dx = dout + J_f^T dout -- the gradient
    reaches x unchanged through the skip connection and through f's backward."""
    for n in (2, 3):
        x, dout = arr("x", n), arr("dout", n)
        f = [sp.Function(f"f{i}")(*x) for i in range(n)]
        out = np.array([x[i] + f[i] for i in range(n)], dtype=object)
        closed = np.array([dout[i] + sp.Add(*[dout[j] * sp.diff(f[j], x[i]) for j in range(n)])
                           for i in range(n)], dtype=object)
        if not all(sp.expand(a - b) == 0 for a, b in zip(vjp(out, dout, x), closed)):
            return Proof("refuted", (n,), "dx != dout + J^T dout")
    return Proof("proven", (2, 3), "f an arbitrary (undefined) SymPy function of all of x")


LN_EPS = sp.Rational(1, 10 ** 5)  # the block check's LayerNorm eps (passed to the code too)


def _ln(v, gamma=None, beta=None, eps=LN_EPS):
    N = len(v)
    mu = sp.Add(*v) / N
    var = sp.Add(*[(e - mu) ** 2 for e in v]) / N
    out = np.array([(e - mu) / sp.sqrt(var + eps) for e in v], dtype=object)
    if gamma is not None:
        out = out * gamma + beta
    return out


def _prove_postln() -> Proof:
    """Post-LN: the block's output is a LayerNorm output, so with gamma = 1, beta = 0 every row
    has mean 0 whatever the sublayer (checked with an arbitrary sublayer output f)."""
    for n in (2, 3):
        x = arr("x", n)
        f = [sp.Function(f"f{i}")(*x) for i in range(n)]
        out = _ln(np.array([x[i] + f[i] for i in range(n)], dtype=object))
        if not is_zero(sp.Add(*out)):
            return Proof("refuted", (n,), "output row mean != 0")
    return Proof("proven", (2, 3), "x' = LN(x + MHA(x)), out = LN(x' + FFN(x')): rows of "
                                   "LN(.) have mean 0 (gamma = 1, beta = 0)")


def _sublayer(v, W):
    return v @ W


def _prove_preln_label() -> Proof:
    """The NumPy-Transformer document labels LN(X + MultiHead(X)) 'Pre-LN'.  That formula is
    post-LN (LayerNorm after the residual add); pre-LN is X + MultiHead(LN(X)).  The two differ:
    a concrete input with a linear stand-in sublayer (the label is independent of the
    sublayer; gamma = 1, beta = 0)."""
    x = np.array([sp.Integer(1), sp.Integer(2), sp.Integer(4)], dtype=object)
    W = np.array([[2, 0, 1], [0, 1, 0], [1, 0, -1]], dtype=object)
    post = _ln(x + _sublayer(x, W))
    pre = x + _sublayer(_ln(x), W)
    a = np.array([float(e) for e in post])
    b = np.array([float(e) for e in pre])
    return Proof("refuted", (3,),
                 f"x={x.tolist()}, sublayer(v) = v W with W={W.tolist()}: the stated formula "
                 f"LN(x + f(x)) = {fmt_array(a)} (row mean {a.mean():.3g}: post-LN), pre-LN "
                 f"x + f(LN(x)) = {fmt_array(b)} (row mean {b.mean():.3g})")


def _prove_blog_residual() -> Proof:
    """The BERT-base blog adds X (the embeddings) in both residuals of every layer: Z̄_l =
    LN(X + Z̃_l), Z_l = LN(X + Z_l^out).  A residual adds the sublayer's own input: Z_{l-1}
    for the attention, Z̄_l for the FFN (BERT, every other document, the reference).  With the
    FFN sublayer's output held fixed, the second residual already differs in layer 1, since
    Z̄_1 = LN(X + Z̃_1) != X."""
    X = np.array([sp.Integer(1), sp.Integer(2), sp.Integer(4)], dtype=object)
    Zt = np.array([sp.Integer(0), sp.Integer(3), sp.Integer(-1)], dtype=object)  # attention out
    Zout = np.array([sp.Integer(2), sp.Integer(-1), sp.Integer(1)], dtype=object)  # FFN out
    Zbar = _ln(X + Zt)
    blog = _ln(X + Zout)
    bert = _ln(Zbar + Zout)
    a = np.array([float(e) for e in blog])
    b = np.array([float(e) for e in bert])
    return Proof("refuted", (3,),
                 f"layer 1, X={X.tolist()}, attention output {Zt.tolist()}, FFN output "
                 f"{Zout.tolist()}: LN(X + Z_out) = {fmt_array(a)} vs LN(Z̄ + Z_out) = "
                 f"{fmt_array(b)}; from layer 2 on the first residual differs too (X != Z_(l-1))")


def _prove_pooler() -> Proof:
    """pooled = tanh(h[:, 0] W + b): sympy.diff gives dh[:, 0] = (dy ⊙ (1 - pooled^2)) W^T and
    dh[:, t] = 0 for t > 0 (only the first token feeds the pooler)."""
    B, T, H = 2, 3, 2
    h, W, b, dy = arr("h", B, T, H), arr("W", H, H), arr("b", H), arr("dy", B, H)
    pooled = np.vectorize(sp.tanh, otypes=[object])(h[:, 0] @ W + b)
    closed = np.zeros((B, T, H), dtype=object)
    closed[:, 0] = (dy * (1 - pooled ** 2)) @ W.T
    ok, detail = compare(vjp(pooled, dy, h), closed)
    return Proof("proven" if ok else "refuted", (B, T, H), detail)


def _prove_pooler_orientation() -> Proof:
    """The blog writes tanh(W^final Z[0, :]) with the row Z[0, :]; read as a column it is
    tanh(Z[0, :] W^T) -- the reference's tanh(h[:, 0] W + b) with W = (W^final)^T (proven) and
    a bias the blog leaves out."""
    H = 3
    W, z = arr("W", H, H), arr("z", H)
    ok, detail = compare(W @ z, z @ W.T)
    if not ok:
        return Proof("refuted", (H,), detail)
    return Proof("convention", (H,), "W z (column) = z W^T (row), proven; bias: blog none, "
                                     "BERT and the reference b")


# --------------------------------------------------------------------------- SymPy <-> code
def _elementwise_numeric(fn, dfn, attr_f, attr_b, accept=None):
    shapes = ((2, 3), (1, 4))

    @cache
    def fns(shape):
        x, dy = arr("x", *shape), arr("dy", *shape)
        y = np.vectorize(fn, otypes=[object])(x)
        return (lambdify_map(dict(x=x, dy=dy), [y]),
                lambdify_map(dict(x=x, dy=dy), [vjp(y, dy, x)]))

    def code(which):
        def run(impl, shape, x, dy):
            y, c = getattr(impl, attr_f)(x)
            return (y,) if which == 0 else getattr(impl, attr_b)(dy, c)
        return run

    def inputs(shape):
        # "float_away": |x| in [KINK, 2] with either sign -- the kink stays out by construction
        return dict(x=("float_away", shape, 2.0, KINK), dy=("float", shape, 1.0))

    return [Numeric(shapes, inputs, lambda s, w=w: fns(s)[w], code(w), accept,
                    needs=(attr_f, attr_b)) for w in (0, 1)]


def _away_from_kink(size, x, **_):
    return bool(np.min(np.abs(x)) > KINK)


RELU_FWD, RELU_BWD = _elementwise_numeric(_relu, None, "relu_forward", "relu_backward",
                                          _away_from_kink)
TANH_FWD, TANH_BWD = _elementwise_numeric(sp.tanh, None, "tanh_forward", "tanh_backward")


@cache
def _token_ffn(H: int, I: int):
    """One token's FFN and its sympy.diff gradients, lambdified."""
    x, W1, b1, W2, b2, dy = arr("x", H), arr("W_1", H, I), arr("b_1", I), arr("W_2", I, H), \
        arr("b_2", H), arr("dy", H)
    y = np.vectorize(_relu, otypes=[object])(x @ W1 + b1) @ W2 + b2
    inputs = dict(x=x, W_1=W1, b_1=b1, W_2=W2, b_2=b2, dy=dy)
    return lambdify_map(inputs, [y] + [vjp(y, dy, w) for w in (x, W1, b1, W2, b2)])


def _ffn_fns(size):
    """The FFN acts on each token alone: the token map per position; parameter gradients add
    up over positions."""
    B, T, H, I = size
    f = _token_ffn(H, I)

    def run(x, dy, **p):
        outs = [f(x=x[b, t], dy=dy[b, t], **p) for b in range(B) for t in range(T)]
        y = np.stack([o[0] for o in outs]).reshape(B, T, H)
        dx = np.stack([o[1] for o in outs]).reshape(B, T, H)
        return y, (dx, *(sum(o[k] for o in outs) for k in range(2, 6)))

    return (lambda **a: (run(**a)[0],), lambda **a: run(**a)[1])


def _ffn_inputs(size):
    B, T, H, I = size
    return dict(x=("float", (B, T, H), 2.0), W_1=("float", (H, I), 2.0), b_1=("float", (I,), 1.0),
                W_2=("float", (I, H), 2.0), b_2=("float", (H,), 1.0),
                dy=("float", (B, T, H), 1.0))


def _ffn_accept(size, x, W_1, b_1, **_):
    return bool(np.min(np.abs(x @ W_1 + b_1)) > KINK)


def _ffn_code(which):
    def code(impl, size, x, W_1, b_1, W_2, b_2, dy):
        y, c = impl.ffn_forward(x, W_1, b_1, W_2, b_2)
        return (y,) if which == 0 else tuple(impl.ffn_backward(dy, c))
    return code


@cache
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
    ln = _ln(r, g, b)
    h, W1, b1, W2, b2 = arr("h", H), arr("W_1", H, I), arr("b_1", I), arr("W_2", I, H), \
        arr("b_2", H)
    f = np.vectorize(_relu, otypes=[object])(h @ W1 + b1) @ W2 + b2
    return (lambdify_map(dict(x=x, **W), [att]), lambdify_map(dict(r=r, g=g, be=b), [ln]),
            lambdify_map(dict(h=h, W_1=W1, b_1=b1, W_2=W2, b_2=b2), [f]))


def _block_fn(size):
    attention, layernorm, ffn = _block_stages(size)

    def rows(fn, a, **kw):
        return np.stack([fn(r=row, **kw)[0] for row in a.reshape(-1, a.shape[-1])]).reshape(
            a.shape)

    def run(x, **p):
        (att,) = attention(x=x, **{n: p[n] for n in ("W_q", "W_k", "W_v", "W_o")})
        h1 = rows(layernorm, x + att, g=p["ln1_gamma"], be=p["ln1_beta"])
        f = np.stack([ffn(h=row, **{n: p[n] for n in ("W_1", "b_1", "W_2", "b_2")})[0]
                      for row in h1.reshape(-1, h1.shape[-1])]).reshape(h1.shape)
        return (rows(layernorm, h1 + f, g=p["ln2_gamma"], be=p["ln2_beta"]),)

    return run


def _block_inputs(size):
    B, T, H, I = size
    spec = {n: ("float", (H, H), 1.5) for n in ("W_q", "W_k", "W_v", "W_o")}
    spec.update(x=("float", (B, T, H), 2.0), W_1=("float", (H, I), 2.0),
                b_1=("float", (I,), 1.0), W_2=("float", (I, H), 2.0), b_2=("float", (H,), 1.0))
    for ln in ("ln1", "ln2"):
        spec[f"{ln}_gamma"], spec[f"{ln}_beta"] = ("float", (H,), 2.0), ("float", (H,), 1.0)
    return spec


def _block_accept(size, x, **p):
    """Away from the FFN's ReLU kinks (computed through the stages themselves)."""
    attention, layernorm, _ = _block_stages(size)
    (att,) = attention(x=x, **{n: p[n] for n in ("W_q", "W_k", "W_v", "W_o")})
    h1 = np.stack([layernorm(r=row, g=p["ln1_gamma"], be=p["ln1_beta"])[0]
                   for row in (x + att).reshape(-1, x.shape[-1])])
    return bool(np.min(np.abs(h1 @ p["W_1"] + p["b_1"])) > KINK)


def _block_code(impl, size, x, **p):
    params = {("attn." + k if k.startswith("W_") and k[2] in "qkvo" else
               "ffn." + k if k[0] in "Wb" else k.replace("_", ".", 1)): v for k, v in p.items()}
    out, _ = impl.block_forward(x, params, n_heads=1, eps=1e-5)
    return (out,)


BLOCK_SIZES = ((2, 2, 3, 2),)

register(Equation(
    "relu.forward", "ReLU", (f"{MINIBERT} §2.4", f"{MINIBERT} §3.5", f"{SEED001} §1.4",
                             f"{SLIDES} (FFN)", f"{BLOG} (forward)", f"{GUIDE} §5"),
    r"\mathrm{ReLU}(x) = \max(0, x)", _prove_relu, torch_op="torch.relu", numeric=RELU_FWD))
register(Equation(
    "relu.backward", "ReLU gradient", (f"{MINIBERT} §3.5",),
    r"\frac{\partial L}{\partial x} = \frac{\partial L}{\partial y} \odot [x > 0]", _prove_relu,
    gradient=True, torch_op="torch.relu", numeric=RELU_BWD,
    note="subgradient 0 at x = 0, as torch"))
register(Equation(
    "tanh.forward", "tanh (pooler activation)", (f"{BLOG} (final)",), r"y = \tanh(x)",
    _prove_tanh, torch_op="torch.tanh", numeric=TANH_FWD))
register(Equation(
    "tanh.backward", "tanh gradient", (f"{BLOG} (final)",),
    r"\frac{\partial L}{\partial x} = \frac{\partial L}{\partial y} (1 - \tanh^2 x)", _prove_tanh,
    gradient=True, torch_op="torch.tanh", numeric=TANH_BWD))
register(Equation(
    "ffn.forward", "Position-wise feed-forward network",
    (f"{MINIBERT} §2.4", f"{SEED001} §1.4", f"{SLIDES} (FFN)", f"{BLOG} (forward)",
     f"{GUIDE} §5"),
    r"\mathrm{FFN}(x) = \max(0, x W_1 + b_1) W_2 + b_2", _prove_ffn,
    numeric=Numeric(FFN_SIZES, _ffn_inputs, lambda s: _ffn_fns(s)[0], _ffn_code(0), _ffn_accept,
                    needs=("ffn_forward",))))
register(Equation(
    "ffn.backward", "FFN gradients", (f"{MINIBERT} §3.1", f"{MINIBERT} §3.5"),
    r"\delta h = (\delta y W_2^\top) \odot [h > 0],\ \delta x = \delta h W_1^\top,\ "
    r"\delta W_1 = x^\top \delta h,\ \delta W_2 = \mathrm{ReLU}(h)^\top \delta y",
    _prove_ffn, gradient=True,
    numeric=Numeric(FFN_SIZES, _ffn_inputs, lambda s: _ffn_fns(s)[1], _ffn_code(1), _ffn_accept,
                    needs=("ffn_forward", "ffn_backward"))))
register(Equation(
    "residual.forward", "Residual connection", (f"{MINIBERT} §2.5", f"{SEED001} §1.3",
                                                f"{SLIDES} (step 2)", f"{GUIDE} §10"),
    r"\mathrm{out} = x + \mathrm{sublayer}(x)", _prove_residual,
    numeric=Numeric(BLOCK_SIZES, _block_inputs, _block_fn, _block_code, _block_accept,
                    needs=("block_forward",)),
    note="checked inside the block's forward (the reference has no standalone residual op)"))
register(Equation(
    "residual.backward", "Gradient through a residual connection", (f"{SEED001} §2.3",),
    r"\frac{\partial L}{\partial x} = \delta + J_{\mathrm{sublayer}}^\top \delta",
    _prove_residual, gradient=True,
    numeric_na="the block's dx is the only place the code adds the two branches; it is checked "
               "by finite differences (block op) and the identity itself is proven for an "
               "arbitrary sublayer"))
register(Equation(
    "block.postln", "Post-LN encoder block",
    (f"{MINIBERT} §2.5", f"{SEED001} §1.3", f"{SLIDES} (step 2)", f"{GUIDE} §10"),
    r"x' = \mathrm{LN}(x + \mathrm{MHA}(x)),\ \mathrm{out} = \mathrm{LN}(x' + \mathrm{FFN}(x'))",
    _prove_postln, torch_op="torch.nn.TransformerEncoderLayer(norm_first=False)",
    numeric=Numeric(BLOCK_SIZES, _block_inputs, _block_fn, _block_code, _block_accept,
                    needs=("block_forward",))))
register(Equation(
    "block.preln_label", "'Pre-LN style' label on LN(X + MultiHead(X))", (f"{SEED001} §1.3",),
    r"Z = \mathrm{LayerNorm}(X + \mathrm{MultiHead}(X))\ \text{(labelled Pre-LN)}",
    _prove_preln_label, kind="document", expected="refuted", target="block.postln",
    note="the formulas are post-LN (what the reference implements); only the label is wrong"))
register(Equation(
    "residual.from_embeddings", "Residuals that add the embeddings X in every layer",
    (f"{BLOG} (forward)",),
    r"\bar Z_l = \mathrm{LN}(X + \tilde Z_l),\ Z_l = \mathrm{LN}(X + Z_l^{out})",
    _prove_blog_residual, kind="document", expected="refuted", target="residual.forward"))
register(Equation(
    "pooler.forward", "Pooler: tanh of the first token's projection", (f"{BLOG} (final)",),
    r"\mathrm{pooled} = \tanh(h_{[:, 0]} W + b)", _prove_pooler, gradient=True,
    numeric=Numeric(((2, 3, 2),), lambda s: dict(h=("float", s, 2.0), W=("float", (2, 2), 2.0),
                                                 b=("float", (2,), 1.0)),
                    lambda s: _pooler_fn(s),
                    lambda impl, s, h, W, b: (impl.pooler_forward(h, W, b)[0],),
                    needs=("pooler_forward",))))
register(Equation(
    "pooler.orientation", "tanh(W^final Z[0,:])", (f"{BLOG} (final)",),
    r"\tanh(W^{final} Z_{n_{layers}}[0, :])", _prove_pooler_orientation, kind="document",
    expected="convention", target="pooler.forward"))


@cache
def _pooler_fn(size):
    B, T, H = size
    h, W, b = arr("h", B, T, H), arr("W", H, H), arr("b", H)
    pooled = np.vectorize(sp.tanh, otypes=[object])(h[:, 0] @ W + b)
    return lambdify_map(dict(h=h, W=W, b=b), [pooled])
