"""Adam (and AdamW), the warmup + linear-decay schedule, global-norm clipping, gradient
accumulation, and the slides' plain gradient step.

The implementations live in ``reference/optim.py`` (``adam_init``, ``adam_step``,
``warmup_linear_lr``, ``global_grad_norm``, ``clip_by_global_norm``, ``accumulate_gradients``);
until it is present these entries show as gaps in the audit.  The SymPy <-> code adapters below
assume the call signatures written next to them -- adjust them in one place if they differ.
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from spec.equations import Equation, Numeric, Proof, register
from spec.equations._sym import fmt_values

MINIBERT = "Mini-BERT derivation"
SEED001 = "NumPy-Transformer document"
SLIDES = "BERT masked-LM slides"
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


STEP, W_, TOTAL, PEAK = sp.symbols("step warmup total peak", positive=True)


def lr_document(step, warmup=W_, total=TOTAL, peak=PEAK):
    """Mini-BERT derivation §8.1, 0-based steps."""
    return sp.Piecewise((peak * step / warmup, step < warmup),
                        (peak * (1 - (step - warmup) / (total - warmup)), True))


def _prove_schedule() -> Proof:
    """The two branches meet at step = warmup (both give peak), the rate reaches 0 at
    step = total, and it rises/decays linearly (constant slopes peak/warmup and
    -peak/(total - warmup))."""
    up = PEAK * STEP / W_
    down = PEAK * (1 - (STEP - W_) / (TOTAL - W_))
    checks = (sp.simplify(up.subs(STEP, W_) - PEAK), sp.simplify(down.subs(STEP, W_) - PEAK),
              sp.simplify(down.subs(STEP, TOTAL)), sp.simplify(sp.diff(up, STEP) - PEAK / W_),
              sp.simplify(sp.diff(down, STEP) + PEAK / (TOTAL - W_)))
    if any(c != 0 for c in checks):
        return Proof("refuted", ("symbolic",), f"continuity / endpoint checks: {checks}")
    return Proof("proven", ("symbolic",),
                 "continuous at warmup (= peak), 0 at total, linear on both sides")


def _prove_step0() -> Proof:
    """With steps counted from 0, lr(0) = peak * 0 / warmup = 0: the first update does nothing.
    Counting from 1 (step + 1 in the formula) gives peak / warmup > 0 on the first update and
    peak at update number warmup."""
    first = lr_document(sp.Integer(0))  # 0 < warmup: the warmup branch
    shifted = (PEAK * (STEP + 1) / W_).subs(STEP, 0)  # the warmup branch, 1-based
    if first != 0 or sp.simplify(shifted - PEAK / W_) != 0:
        return Proof("refuted", (0,), f"lr(0) = {first}")
    return Proof("convention", (0,), "0-based as written: lr(0) = 0 (first step wasted); "
                                     "(step + 1)/warmup: lr = peak/warmup > 0 on the first step")


def _prove_clip() -> Proof:
    """scale = max_norm / ||g|| when ||g|| > max_norm: the clipped gradients have global norm
    exactly max_norm and the same direction; otherwise unchanged (min(1, c/||g||))."""
    for n in (2, 3):
        gs = sp.symbols(f"g0:{n}", real=True)
        c = sp.Symbol("c", positive=True)
        norm = sp.sqrt(sp.Add(*[x ** 2 for x in gs]))
        clipped = [x * c / norm for x in gs]
        if sp.simplify(sp.sqrt(sp.Add(*[x ** 2 for x in clipped])) - c) != 0:
            return Proof("refuted", (n,), "clipped norm != max_norm")
    return Proof("proven", (2, 3), "||scale * g|| = max_norm, direction kept")


def _accumulation_case():
    """Two micro-batches with 1 and 3 masked tokens; per-token gradients a; b, c, d."""
    a, b, c, d = sp.symbols("a b c d", real=True)
    micro = [[a], [b, c, d]]
    full = sp.Add(a, b, c, d) / 4  # the mean over the 4 masked tokens of the whole batch
    return micro, full, (a, b, c, d)


def _prove_accum() -> Proof:
    """For a loss that is a mean over masked tokens, the full-batch gradient is
    sum_k n_k g_k / sum_k n_k (g_k each micro-batch's mean gradient, n_k its masked count) --
    equivalently, accumulate the micro-batch *sums* and divide once by the total count."""
    micro, full, _ = _accumulation_case()
    means = [sp.Add(*m) / len(m) for m in micro]
    weighted = sp.Add(*[len(m) * gk for m, gk in zip(micro, means)]) / sum(len(m) for m in micro)
    if sp.simplify(weighted - full) != 0:
        return Proof("refuted", ("symbolic",), "weighted mean != full-batch gradient")
    return Proof("proven", (1, 3), "masked counts 1 and 3: weighted by n_k it equals the "
                                   "full-batch gradient identically")


def _prove_divide_by_steps() -> Proof:
    """Mini-BERT derivation §8.2: sum the micro-batch gradients, divide by accumulation_steps."""
    micro, full, (a, b, c, d) = _accumulation_case()
    means = [sp.Add(*m) / len(m) for m in micro]
    stated = sp.Add(*means) / len(micro)
    vals = {a: 1, b: 0, c: 0, d: 0}
    if sp.simplify(stated - full) == 0:
        return Proof("proven", ())
    return Proof("refuted", (1, 3),
                 f"micro-batches with 1 and 3 masked tokens, per-token gradients (a | b, c, d) = "
                 f"(1 | 0, 0, 0): divided by the 2 steps gives {stated.subs(vals)}, the full batch "
                 f"{full.subs(vals)}; equal only when every micro-batch holds the same number of "
                 f"masked tokens (or the loss is a sum)")


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
    f = sp.lambdify([th, *gs], out, "numpy")
    return lambda theta, g1, g2, g3: (np.asarray(f(theta, g1, g2, g3), dtype=float),)


def _adam_code(impl, size, theta, g1, g2, g3, **decay):
    # protocol (spec/conformance.py): adam_init(params) -> state; adam_step(params, grads,
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


def lr_project(step, warmup=W_, total=TOTAL, peak=PEAK):
    """The reference's convention (schedule.warmup_linear.step0): the warmup branch counts
    updates from 1, peak (step + 1) / warmup, so the first update is not wasted; the decay
    branch is the document's, peak (total - step) / (total - warmup), floored at 0."""
    return sp.Piecewise((peak * (step + 1) / warmup, step < warmup),
                        (sp.Max(0, peak * (1 - (step - warmup) / (total - warmup))), True))


def _schedule_sympy(size):
    warmup, total = size
    f = sp.lambdify([STEP, PEAK], lr_project(STEP, sp.Integer(warmup), sp.Integer(total)),
                    "numpy")
    return lambda peak: (np.array([f(k, float(peak[0])) for k in range(total + 3)]),)


def _schedule_code(impl, size, peak):
    warmup, total = size
    return (np.array([impl.warmup_linear_lr(k, peak_lr=float(peak[0]), warmup_steps=warmup,
                                            total_steps=total) for k in range(total + 3)]),)


def _clip_code(impl, size, g, max_norm):
    clipped = impl.clip_by_global_norm({"a": g[:2], "b": g[2:]}, float(max_norm[0]))
    clipped = clipped[0] if isinstance(clipped, tuple) else clipped
    return (np.concatenate([clipped["a"], clipped["b"]]),)


def _clip_sympy(size):
    n = size[0]
    gs = [sp.Symbol(f"g{i}", real=True) for i in range(n)]
    c = sp.Symbol("c", positive=True)
    norm = sp.sqrt(sp.Add(*[x ** 2 for x in gs]))
    out = [sp.Piecewise((x * c / norm, norm > c), (x, True)) for x in gs]
    f = sp.lambdify([gs, c], out, "numpy")

    def clip(g, max_norm):
        # NumPy's Piecewise evaluates both branches: c / norm of an all-zero g is 0/0 in the
        # branch that is not taken
        with np.errstate(invalid="ignore", divide="ignore"):
            return (np.asarray(f(g, float(max_norm[0])), dtype=float),)
    return clip


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
    _prove_adamw, torch_op="torch.optim.AdamW", numeric=ADAMW_NUMERIC))
register(Equation(
    "schedule.warmup_linear", "Linear warmup then linear decay", (f"{MINIBERT} §8.1",),
    r"\mathrm{lr} = \mathrm{peak} \frac{step}{warmup}\ (step < warmup),\ \mathrm{peak}\Bigl(1 - "
    r"\frac{step - warmup}{total - warmup}\Bigr)",
    _prove_schedule,
    numeric=Numeric(((4, 10), (1, 3), (5, 6)), lambda s: dict(peak=("float", (1,), 1.0)),
                    _schedule_sympy, _schedule_code, accept=lambda s, peak: bool(peak[0] > 0),
                    needs=("warmup_linear_lr",)),
    note="the reference counts warmup updates from 1 (schedule.warmup_linear.step0); the "
         "SymPy <-> code check uses that convention, lr_project"))
register(Equation(
    "schedule.warmup_linear.step0", "Learning rate at the first step", (f"{MINIBERT} §8.1",),
    r"\mathrm{lr}(0) = \mathrm{peak} \cdot 0 / warmup = 0", _prove_step0, kind="document",
    expected="convention", target="schedule.warmup_linear"))
register(Equation(
    "clip.global_norm", "Global-norm gradient clipping", (f"{MINIBERT} §7.3",),
    r"n = \sqrt{\sum_p \lVert g_p \rVert^2},\ g_p \leftarrow g_p \cdot \frac{c}{n}\ (n > c)",
    _prove_clip, torch_op="torch.nn.utils.clip_grad_norm_",
    numeric=Numeric(((4,), (5,)), lambda s: dict(g=("float", s, 2.0),
                                                 max_norm=("float", (1,), 3.0)),
                    _clip_sympy, _clip_code,
                    accept=lambda s, g, max_norm: bool(max_norm[0] > 0.1),
                    needs=("clip_by_global_norm",))))
register(Equation(
    "accum.grad_mean", "Gradient accumulation equals the full-batch gradient",
    (f"{MINIBERT} §8.2",),
    r"g = \frac{\sum_k n_k \bar g_k}{\sum_k n_k}\ (n_k \text{ masked tokens in micro-batch } k)",
    _prove_accum,
    numeric_na="a loop over micro-batches, not a map on arrays: tests/test_optim_accum.py checks "
               "it end to end (accumulated vs full-batch model gradient, uneven micro-batches)"))
register(Equation(
    "accum.divide_by_steps", "Accumulated gradients divided by accumulation_steps",
    (f"{MINIBERT} §8.2",), r"g = \frac{1}{K} \sum_{k=1}^{K} \bar g_k", _prove_divide_by_steps,
    kind="document", expected="refuted", target="accum.grad_mean"))
register(Equation(
    "optim.sgd", "Plain gradient step on the embeddings", (f"{SLIDES} (embedding space)",),
    r"E_k \leftarrow E_k - \eta \nabla_{E_k} \mathcal{L}", _prove_sgd, kind="document",
    expected="convention", target="optim.adam"))
