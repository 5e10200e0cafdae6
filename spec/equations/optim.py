"""Adam (and AdamW, decoupled weight decay) and the slides' plain gradient step.

The implementations live in ``reference/optim.py`` (``adam_init``, ``adam_step``); the SymPy <->
code adapters below assume the call signatures written next to them.
"""

from __future__ import annotations

import functools

import numpy as np
import sympy as sp

from minibert_spec.equations import Equation, Numeric, Proof, register
from minibert_spec.equations._cache import maps_cache
from minibert_spec.equations._sym import fmt_values, lambdify_map
from minibert_spec.sources import MINIBERT, SEED001, SLIDES

PROJECT = "project convention (BERT's optimizer; not in the five documents)"

b1, b2, lr, eps, g, t = sp.symbols("beta1 beta2 alpha epsilon g t", positive=True)


def adam_moments(grads, beta1=b1, beta2=b2):
    """m_t, v_t after the gradients g_1..g_n from m_0 = v_0 = 0."""
    m = v = sp.Integer(0)
    for gi in grads:
        m = beta1 * m + (1 - beta1) * gi
        v = beta2 * v + (1 - beta2) * gi ** 2
    return m, v


def adam_update(theta, m, v, step, alpha=lr, beta1=b1, beta2=b2, epsilon=eps, wd=0):
    m_hat, v_hat = m / (1 - beta1 ** step), v / (1 - beta2 ** step)
    return theta - alpha * (m_hat / (sp.sqrt(v_hat) + epsilon) + wd * theta)


def _prove_adam() -> Proof:
    """Bias correction makes the moments exact for a constant gradient: after n steps of g,
    m_n / (1 - beta1^n) = g and v_n / (1 - beta2^n) = g^2 (n = 1..6 expanded; the general n by
    the geometric sum (1 - beta) sum_k beta^(n-k) = 1 - beta^n)."""
    for n in range(1, 7):
        m, v = adam_moments([g] * n)
        if sp.cancel(m / (1 - b1 ** n) - g) != 0 or sp.cancel(v / (1 - b2 ** n) - g ** 2) != 0:
            return Proof("refuted", (n,), f"n={n}: bias-corrected moment != constant gradient")
    k, n = sp.symbols("k n", integer=True, positive=True)
    geo = sp.simplify(sp.summation((1 - b1) * b1 ** (n - k), (k, 1, n)) - (1 - b1 ** n))
    if geo != 0:
        return Proof("refuted", ("symbolic",), "geometric sum")
    theta = sp.Symbol("theta", real=True)
    first = adam_update(theta, *adam_moments([g]), 1)
    if sp.simplify(first - (theta - lr * g / (g + eps))) != 0:
        return Proof("refuted", (1,), "first step != theta - alpha g / (|g| + eps)")
    return Proof("proven", tuple(range(1, 7)),
                 "m_hat = g, v_hat = g^2 for constant g; first step = alpha g / (|g| + eps)")


def _prove_adamw() -> Proof:
    """Decoupled weight decay: theta <- theta - alpha (m_hat / (sqrt(v_hat) + eps) + lambda
    theta).  With lambda = 0 it is Adam (proven); it is not Adam on the L2-regularised gradient
    g + lambda theta (counterexample)."""
    lam, theta = sp.Symbol("lambda", positive=True), sp.Symbol("theta", real=True)
    m, v = adam_moments([g])
    if sp.simplify(adam_update(theta, m, v, 1, wd=0) - adam_update(theta, m, v, 1)) != 0:
        return Proof("refuted", (1,), "lambda = 0 is not Adam")
    decoupled = adam_update(theta, m, v, 1, wd=lam)
    l2 = adam_update(theta, *adam_moments([g + lam * theta]), 1)
    vals = {g: sp.Rational(1, 2), theta: 2, lam: sp.Rational(1, 10), lr: sp.Rational(1, 1000),
            eps: sp.Rational(1, 10 ** 8), b1: sp.Rational(9, 10), b2: sp.Rational(999, 1000)}
    a, b = float(decoupled.subs(vals)), float(l2.subs(vals))
    return Proof("proven", (1,), f"lambda = 0 gives Adam; decoupled != L2 through the moments: at "
                                 f"{fmt_values(vals)}: {a:.9f} vs {b:.9f}")


def _prove_sgd() -> Proof:
    """The slides' update E <- E - eta grad decreases a smooth loss to first order:
    L(E - eta g) = L(E) - eta ||g||^2 + O(eta^2) (series in eta of an arbitrary L)."""
    eta = sp.Symbol("eta", positive=True)
    x, y = sp.symbols("x y", real=True)
    L = sp.Function("L")
    gx, gy = sp.diff(L(x, y), x), sp.diff(L(x, y), y)
    series = sp.series(L(x - eta * gx, y - eta * gy), eta, 0, 2).removeO()
    if sp.simplify(series - (L(x, y) - eta * (gx ** 2 + gy ** 2))) != 0:
        return Proof("refuted", (2,), "first-order decrease")
    return Proof("convention", (2,), "first-order descent proven; the project trains with Adam "
                                     "(Mini-BERT derivation §5), the slides' rule is plain SGD")


# --------------------------------------------------------------------------- SymPy <-> code
@maps_cache
def _adam_sympy(size, wd=0):
    """Three Adam steps on a vector, lambdified: (params, g1, g2, g3) -> params after step 3
    (AdamW with decoupled decay ``wd`` when it is not 0)."""
    n = size[0]
    th = [sp.Symbol(f"th{i}", real=True) for i in range(n)]
    gs = [[sp.Symbol(f"g{k}_{i}", real=True) for i in range(n)] for k in range(3)]
    hyper = dict(alpha=sp.Rational(1, 1000), beta1=sp.Rational(9, 10),
                 beta2=sp.Rational(999, 1000), epsilon=sp.Rational(1, 10 ** 8))
    out = []
    for i in range(n):
        theta = th[i]
        for step in range(1, 4):
            m, v = adam_moments([gs[k][i] for k in range(step)], hyper["beta1"], hyper["beta2"])
            theta = adam_update(theta, m, v, step, wd=wd, **hyper)
        out.append(theta)
    vec = functools.partial(np.array, dtype=object)
    return lambdify_map(dict(theta=vec(th), g1=vec(gs[0]), g2=vec(gs[1]), g3=vec(gs[2])),
                        [vec(out)])


def _adam_code(impl, size, theta, g1, g2, g3, **decay):
    # protocol (spec/protocol.py): adam_init(params) -> state; adam_step(params, grads,
    # state, *, lr, beta1, beta2, eps, weight_decay, no_decay) -> (params, state)
    params, state = {"w": theta.copy()}, impl.adam_init({"w": theta})
    for grad in (g1, g2, g3):
        params, state = impl.adam_step(params, {"w": grad}, state, lr=1e-3, beta1=0.9,
                                       beta2=0.999, eps=1e-8, **decay)
    return (params["w"],)


# a large decay (0.1 x lr 1e-3 per step) so that coupling it through the moments (Adam + L2)
# or dropping it moves the result far beyond SYMPY_CODE_RTOL
ADAMW_DECAY = sp.Rational(1, 10)


ADAM_NUMERIC = Numeric(((3,), (5,)), lambda s: dict(theta=("float", s, 2.0),
                                                   g1=("float", s, 1.0), g2=("float", s, 1.0),
                                                   g3=("float", s, 1.0)),
                       _adam_sympy, _adam_code, needs=("adam_init", "adam_step"))


ADAMW_NUMERIC = Numeric(
    ((3,), (5,)), ADAM_NUMERIC.inputs, lambda size: _adam_sympy(size, wd=ADAMW_DECAY),
    lambda impl, size, **a: _adam_code(impl, size, **a, weight_decay=float(ADAMW_DECAY),
                                       no_decay=()),
    needs=("adam_init", "adam_step"))


register(Equation(
    "optim.adam", "Adam with bias correction", (f"{MINIBERT} §5.1", f"{SEED001} §4"),
    r"m_t = \beta_1 m_{t-1} + (1-\beta_1) g_t,\ v_t = \beta_2 v_{t-1} + (1-\beta_2) g_t^2,\ "
    r"\theta_t = \theta_{t-1} - \alpha \frac{m_t/(1-\beta_1^t)}"
    r"{\sqrt{v_t/(1-\beta_2^t)} + \epsilon}",
    _prove_adam, torch_op="torch.optim.Adam", numeric=ADAM_NUMERIC,
    note="eps outside the square root in both documents, as torch"))
register(Equation(
    "optim.adamw", "AdamW (decoupled weight decay)", (PROJECT,),
    r"\theta_t = \theta_{t-1} - \alpha \Bigl(\frac{\hat m_t}{\sqrt{\hat v_t} + \epsilon} + "
    r"\lambda \theta_{t-1}\Bigr)",
    _prove_adamw, torch_op="torch.optim.AdamW", numeric=ADAMW_NUMERIC,
    uses=("optim.adam",)))
register(Equation(
    "optim.sgd", "Plain gradient step on the embeddings", (f"{SLIDES} (embedding space)",),
    r"E_k \leftarrow E_k - \eta \nabla_{E_k} \mathcal{L}", _prove_sgd, kind="document",
    expected="convention", target="optim.adam"))
