"""LayerNorm: forward, and the gradients w.r.t. x, gamma, beta.

Derivations are on one row of N features (the statistics are per row, rows are independent);
the SymPy <-> code check uses two rows so the sums over rows in dgamma / dbeta are exercised.
sigma = sqrt(var + eps) is replaced by a positive symbol s after differentiating (the base
``var + eps`` is a single expression object, so the replacement is exact) -- the identities
then are polynomial in x, gamma, dy and 1/s.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import sympy as sp

from minibert_spec.equations import Equation, Numeric, Proof, register
from minibert_spec.equations._cache import maps_cache
from minibert_spec.equations._code import by_rows, op_code
from minibert_spec.equations._sym import arr, compare, is_zero, lambdify_map, vjp
from minibert_spec.protocol.variants import call_eps
from minibert_spec.sources import MINIBERT, PROTOCOL_VARIANTS, SEED001

FEATURES = (2, 3, 4, 5)  # N tried by every proof
NUMERIC_FEATURES = (2, 3, 4)
ROWS = 2
LN_EPS = 1e-5  # eps of the SymPy <-> code check (any positive value; the proofs keep eps symbolic)

EPS = sp.Symbol("eps", positive=True)
S = sp.Symbol("s", positive=True)  # sqrt(var + eps)


@cache
def row(N: int):
    """One row: symbols, forward y, sympy.diff-derived (dx, dgamma, dbeta) with s for sigma."""
    x, g, b, dy = arr("x", N), arr("gamma", N), arr("beta", N), arr("dy", N)
    mu = sp.Add(*x) / N
    var = sp.Add(*[(xi - mu) ** 2 for xi in x]) / N
    base = var + EPS
    y = np.array([g[i] * (x[i] - mu) * base ** sp.Rational(-1, 2) + b[i] for i in range(N)],
                 dtype=object)
    to_s = {base: S ** 2}
    dx, dg, db = (np.array([sp.sympify(e).xreplace(to_s) for e in vjp(y, dy, w)], dtype=object)
                  for w in (x, g, b))
    return dict(x=x, gamma=g, beta=b, dy=dy, mu=mu, var=var, y=y, dx=dx, dgamma=dg, dbeta=db,
                aux={S: sp.sqrt(base)})


def x_hat(r) -> np.ndarray:
    return np.array([(xi - r["mu"]) / S for xi in r["x"]], dtype=object)


def closed_dx(r) -> np.ndarray:
    """dx = (1/s) (g - mean(g) - x_hat mean(g x_hat)),  g = dy * gamma (gamma inside)."""
    N = len(r["x"])
    g = r["dy"] * r["gamma"]
    xh = x_hat(r)
    mg, mgx = sp.Add(*g) / N, sp.Add(*(g * xh)) / N
    return np.array([(g[i] - mg - xh[i] * mgx) / S for i in range(N)], dtype=object)


def gamma_outside_dx(r) -> np.ndarray:
    """The Mini-BERT derivation §3.3 form: (gamma/s) [dy - mean(dy) - x_hat mean(dy x_hat)]."""
    N = len(r["x"])
    dy, xh = r["dy"], x_hat(r)
    m, mx = sp.Add(*dy) / N, sp.Add(*(dy * xh)) / N
    return np.array([r["gamma"][i] / S * (dy[i] - m - xh[i] * mx) for i in range(N)],
                    dtype=object)


def stepwise_dx(r) -> np.ndarray:
    """The NumPy-Transformer document's step-by-step backward, term by term."""
    N = len(r["x"])
    x, mu = r["x"], r["mu"]
    g = r["dy"] * r["gamma"]  # g_xhat
    g_var = sp.Add(*[g[j] * (x[j] - mu) for j in range(N)]) * (-sp.Rational(1, 2)) * S ** -3
    g_mu = (-sp.Add(*[g[j] / S for j in range(N)])
            + g_var * sp.Add(*[-2 * (x[j] - mu) for j in range(N)]) / N)
    return np.array([g[i] / S + g_var * 2 * (x[i] - mu) / N + g_mu / N for i in range(N)],
                    dtype=object)


def _prove(derived_key: str, closed_fn, sizes=FEATURES) -> Proof:
    for N in sizes:
        r = row(N)
        ok, detail = compare(r[derived_key], closed_fn(r), r["aux"])
        if not ok:
            return Proof("refuted", (N,), f"N={N}: {detail}")
    return Proof("proven", tuple(sizes))


def _prove_forward() -> Proof:
    """The normalisation the documents state does normalise: with s = sqrt(var + eps),
    mean(x_hat) = 0 and mean(x_hat^2) = var / s^2 (-> 1 as eps -> 0), identically in x."""
    for N in FEATURES:
        r = row(N)
        xh = x_hat(r)
        if not is_zero(sp.Add(*xh)):
            return Proof("refuted", (N,), f"N={N}: mean(x_hat) != 0")
        if not is_zero(sp.Add(*(xh * xh)) / N - r["var"] / S ** 2):
            return Proof("refuted", (N,), f"N={N}: mean(x_hat^2) != var/(var+eps)")
    return Proof("proven", FEATURES, "mean(x_hat) = 0 and mean(x_hat^2) = var/(var+eps)")


def _prove_gamma_outside() -> Proof:
    refuted = _prove("dx", gamma_outside_dx, sizes=(2, 3))
    # ... and the reading under which it is right: gamma constant across features
    c = sp.Symbol("c", real=True)
    for N in (2, 3):
        r = row(N)
        const = {gi: c for gi in r["gamma"]}
        lhs = np.array([e.xreplace(const) for e in r["dx"]], dtype=object)
        rhs = np.array([e.xreplace(const) for e in gamma_outside_dx(r)], dtype=object)
        ok, _ = compare(lhs, rhs, r["aux"])
        if not ok:
            return Proof("proven", refuted.sizes, "unexpected: wrong even for constant gamma")
    return Proof("refuted", refuted.sizes,
                 refuted.detail + "; it is exact only when gamma is constant across features "
                                  "(proven for gamma_i = c, N = 2, 3)")


def _prove_dsigma() -> Proof:
    """d mu / dx_i = 1/N and d sigma / dx_i = (x_i - mu) / (N sigma) (Mini-BERT derivation §3.3,
    sigma = sqrt(var + eps))."""
    for N in FEATURES:
        r = row(N)
        base = r["var"] + EPS
        sigma = sp.sqrt(base)
        for i, xi in enumerate(r["x"]):
            if not is_zero(sp.diff(r["mu"], xi) - sp.Rational(1, N)):
                return Proof("refuted", (N,), f"N={N}: d mu/dx_{i} != 1/N")
            d = sp.diff(sigma, xi).xreplace({base: S ** 2}) - (xi - r["mu"]) / (N * S)
            if not is_zero(d):
                return Proof("refuted", (N,), f"N={N}: d sigma/dx_{i} != (x_i - mu)/(N sigma)")
    return Proof("proven", FEATURES)


# --------------------------------------------------------------------------- SymPy <-> code
@maps_cache
def _row_fn(N: int):
    """The proofs' per-row derivation (s = sqrt(var + eps) put back), lambdified with eps as an
    input: (x, gamma, beta, dy, eps) -> (y, dx, dgamma_row, dbeta_row)."""
    r = row(N)
    aux = {S: sp.sqrt(r["var"] + EPS)}
    inputs = dict(x=r["x"], gamma=r["gamma"], beta=r["beta"], dy=r["dy"],
                  eps=np.array([EPS], dtype=object))
    return lambdify_map(inputs, [r["y"], r["dx"], r["dgamma"], r["dbeta"]], aux)


def _numeric_fns(N: int):
    """Rows are independent: the row map applied to each row; dgamma and dbeta add up over
    rows (the sum over rows is what the code's [..., N] -> [N] reduction must equal)."""
    f = _row_fn(N)

    def run(x, gamma, beta, dy, eps=LN_EPS):
        return by_rows(f, dict(x=x, dy=dy), 2, gamma=gamma, beta=beta, eps=np.array([eps]))

    return {"y": lambda **a: (run(**a)[0],),
            "grads": lambda **a: run(**a)[1:]}


def _inputs(N):
    return dict(x=("float", (ROWS, N), 2.0), gamma=("float", (N,), 2.0),
                beta=("float", (N,), 2.0), dy=("float", (ROWS, N), 1.0))


def _accept(N, x, **_):
    # rows away from constant: var >= 1e-2 keeps 1/sigma moderate (LayerNorm's singular point)
    return bool(np.min(np.var(x, axis=-1)) >= 1e-2)


def _sympy_grad(which):
    return lambda N: (lambda **a: (_numeric_fns(N)["grads"](**a)[which],))


def declared_eps(caps, arrays):
    """The eps of both sides, the lambdified derivation's symbol and the code's argument, as
    the implementation declares it (minibert_spec.protocol.variants.call_eps): LN_EPS, 0 without eps
    (layernorm eps=False), the number where its code fixes eps (layernorm eps=1e-6)."""
    return {**arrays, "eps": call_eps(caps, LN_EPS)}


def _numeric(sympy_fn, which=None):
    """``which``: the entry of layernorm_backward's (dx, dgamma, dbeta); None: the forward."""
    code = op_code(which is not None, "layernorm_forward", "layernorm_backward",
                   lambda x, gamma, beta, dy, eps=LN_EPS: ((x, gamma, beta, eps), {}), "dy",
                   pick=which)
    return Numeric(NUMERIC_FEATURES, _inputs, sympy_fn, code, _accept,
                   needs=("layernorm_forward", "layernorm_backward"), adapt=declared_eps)


# --------------------------------------------------------------------------- entries
register(Equation(
    "layernorm.forward", "LayerNorm forward",
    (f"{MINIBERT} §2.3", f"{MINIBERT} §7.2", f"{SEED001} §2.2", "visual guide §7"),
    r"y = \gamma \odot \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}} + \beta,\ "
    r"\mu = \tfrac1N \sum_j x_j,\ \sigma^2 = \tfrac1N \sum_j (x_j - \mu)^2",
    _prove_forward, torch_op="torch.nn.functional.layer_norm",
    numeric=_numeric(lambda N: _numeric_fns(N)["y"]),
    note="biased (1/N) variance in every document and in torch"))

register(Equation(
    "layernorm.backward.dx", "LayerNorm input gradient (gamma inside the means)",
    (f"{MINIBERT} §3.3", f"{SEED001} §2.2"),
    r"\frac{\partial L}{\partial x} = \frac{1}{\sigma}\Bigl(g - \overline{g} - \hat x\,"
    r"\overline{g \odot \hat x}\Bigr),\ g = \frac{\partial L}{\partial y} \odot \gamma",
    lambda: _prove("dx", closed_dx), gradient=True, torch_op="torch.nn.functional.layer_norm",
    numeric=_numeric(_sympy_grad(0), 0),
    uses=("layernorm.forward",)))

register(Equation(
    "layernorm.backward.dgamma", "LayerNorm gamma gradient", (f"{MINIBERT} §3.3",),
    r"\frac{\partial L}{\partial \gamma} = \sum_{rows} \frac{\partial L}{\partial y} \odot \hat x",
    lambda: _prove("dgamma", lambda r: r["dy"] * x_hat(r)), gradient=True,
    torch_op="torch.nn.functional.layer_norm",
    numeric=_numeric(_sympy_grad(1), 1),
    uses=("layernorm.forward",)))

register(Equation(
    "layernorm.backward.dbeta", "LayerNorm beta gradient", (f"{MINIBERT} §3.3",),
    r"\frac{\partial L}{\partial \beta} = \sum_{rows} \frac{\partial L}{\partial y}",
    lambda: _prove("dbeta", lambda r: r["dy"]), gradient=True,
    torch_op="torch.nn.functional.layer_norm",
    numeric=_numeric(_sympy_grad(2), 2),
    uses=("layernorm.forward",)))

register(Equation(
    "layernorm.backward.dx.gamma_outside", "LayerNorm dx with gamma pulled out of the means",
    (f"{MINIBERT} §3.3",),
    r"\frac{\partial L}{\partial x} = \frac{\gamma}{\sigma}\Bigl[\frac{\partial L}{\partial y}"
    r" - \tfrac1N \sum \frac{\partial L}{\partial y} - \tfrac{\hat x}{N} \sum "
    r"\frac{\partial L}{\partial y} \odot \hat x\Bigr]",
    _prove_gamma_outside, kind="document", expected="refuted", target="layernorm.backward.dx",
    note="correct only for a gamma that is constant across features (e.g. at initialisation, "
         "which is why a gradient check at init does not catch it)"))

register(Equation(
    "layernorm.backward.dx.stepwise", "LayerNorm dx, step-by-step form (g_var, g_mu)",
    (f"{SEED001} §2.2",),
    r"g_{\sigma^2} = \sum_j g_j (x_j - \mu) \cdot (-\tfrac12)(\sigma^2+\epsilon)^{-3/2},\ "
    r"g_\mu = -\sum_j \frac{g_j}{\sqrt{\sigma^2+\epsilon}} + g_{\sigma^2} \frac{\sum_j -2(x_j-\mu)}"
    r"{N},\ \frac{\partial L}{\partial x_i} = \frac{g_i}{\sqrt{\sigma^2+\epsilon}} + g_{\sigma^2}"
    r"\frac{2(x_i-\mu)}{N} + \frac{g_\mu}{N}",
    lambda: _prove("dx", stepwise_dx), kind="document", target="layernorm.backward.dx",
    note="the second term of g_mu is identically 0 (sum of x - mu), so the form reduces to the "
         "closed form; gamma multiplies dy before the sums, as it must"))

register(Equation(
    "layernorm.backward.dsigma", "Derivatives of the LayerNorm statistics",
    (f"{MINIBERT} §3.3",),
    r"\frac{\partial \mu}{\partial x_i} = \frac1N,\ \frac{\partial \sigma}{\partial x_i} = "
    r"\frac{x_i - \mu}{N \sigma}",
    _prove_dsigma, kind="document", target="layernorm.backward.dx"))


# --------------------------------------------------------------------------- no affine map
@cache
def plain_row(N: int):
    """One row without the affine map: y = x_hat, and dx by sympy.diff (s for sigma)."""
    x, dy = arr("x", N), arr("dy", N)
    mu = sp.Add(*x) / N
    base = sp.Add(*[(xi - mu) ** 2 for xi in x]) / N + EPS
    y = np.array([(x[i] - mu) * base ** sp.Rational(-1, 2) for i in range(N)], dtype=object)
    dx = np.array([sp.sympify(e).xreplace({base: S ** 2}) for e in vjp(y, dy, x)], dtype=object)
    return dict(x=x, dy=dy, mu=mu, y=y, dx=dx, aux={S: sp.sqrt(base)})


def closed_plain_dx(r) -> np.ndarray:
    """dx = (1/s) (dy - mean(dy) - x_hat mean(dy x_hat)): the affine form's at gamma = 1."""
    N = len(r["x"])
    dy = r["dy"]
    xh = np.array([(xi - r["mu"]) / S for xi in r["x"]], dtype=object)
    m, mx = sp.Add(*dy) / N, sp.Add(*(dy * xh)) / N
    return np.array([(dy[i] - m - xh[i] * mx) / S for i in range(N)], dtype=object)


def _prove_plain() -> Proof:
    """Without gamma and beta the output is x_hat itself (mean 0 per row), and sympy.diff of
    it equals the closed form the reference computes with g = dy (N = 2..5)."""
    for N in FEATURES:
        r = plain_row(N)
        if not is_zero(sp.Add(*r["y"])):
            return Proof("refuted", (N,), f"N={N}: mean(x_hat) != 0")
        ok, detail = compare(r["dx"], closed_plain_dx(r), r["aux"])
        if not ok:
            return Proof("refuted", (N,), f"N={N}: {detail}")
    return Proof("proven", FEATURES, "y = x_hat; dx = (dy - mean(dy) - x_hat mean(dy x_hat)) / s")


@maps_cache
def _plain_row_fn(N: int):
    r = plain_row(N)
    aux = {S: sp.sqrt(sp.Add(*[(xi - r["mu"]) ** 2 for xi in r["x"]]) / N + EPS)}
    return lambdify_map(dict(x=r["x"], dy=r["dy"], eps=np.array([EPS], dtype=object)),
                        [r["y"], r["dx"]], aux)


def _plain_sympy(N: int):
    f = _plain_row_fn(N)

    def run(x, dy, eps=LN_EPS, **_):
        return by_rows(f, dict(x=x, dy=dy), 2, eps=np.array([eps]))

    return run


def _plain_code(impl, N, x, dy, eps=LN_EPS, **_):
    y, cache = impl.layernorm_forward(x, None, None, eps)
    dx, dgamma, dbeta = impl.layernorm_backward(dy, cache)
    if dgamma is not None or dbeta is not None:
        raise AssertionError("layernorm without the affine map: dgamma and dbeta must come back "
                             f"None, got {type(dgamma).__name__} and {type(dbeta).__name__}")
    return y, dx


register(Equation(
    "layernorm.plain", "LayerNorm without the affine map (forward and dx)", (PROTOCOL_VARIANTS,),
    r"y = \hat x = \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}},\ \frac{\partial L}{\partial x}"
    r" = \frac{1}{\sigma}\Bigl(\delta - \overline{\delta} - \hat x\,\overline{\delta \odot "
    r"\hat x}\Bigr)",
    _prove_plain, gradient=True, torch_op="torch.nn.functional.layer_norm(weight=None)",
    numeric=Numeric(NUMERIC_FEATURES, lambda N: dict(x=("float", (ROWS, N), 2.0),
                                                      dy=("float", (ROWS, N), 1.0)),
                    _plain_sympy, _plain_code, _accept,
                    needs=("layernorm_forward", "layernorm_backward"),
                    variant={"layernorm.affine": False}, adapt=declared_eps),
    note="a variant of the protocol (CAPABILITIES layernorm affine=False; torch's "
         "elementwise_affine=False): gamma = beta = None, their gradients None",
    uses=("layernorm.forward", "layernorm.backward.dx")))
