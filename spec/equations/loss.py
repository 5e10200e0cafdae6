"""Masked cross-entropy (mean over masked tokens or sum) with its logit gradient, and MSE.

The masked CE as a SymPy map takes the one-hot labels O [n, V] and the mask m [n] (1 =
predicted) as inputs, so the SymPy <-> code check feeds O = onehot(label),
m = (label != IGNORE_INDEX).
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from minibert_spec.equations import Equation, Proof, register
from minibert_spec.equations._cache import maps_cache
from minibert_spec.equations._code import op_check
from minibert_spec.equations._sym import (
    arr,
    compare,
    exp_to_symbols,
    forward_backward_maps,
    is_zero,
    softmax_rows,
    vjp,
)
from minibert_spec.protocol import IGNORE_INDEX
from minibert_spec.sources import GUIDE, MINIBERT, PROTOCOL_VARIANTS, SEED001, SLIDES

CE_CASES = ((3, 3, (1, 0, 1)), (2, 4, (1, 1)), (4, 2, (0, 1, 1, 0)))  # (n, V, mask)


def ce(z: np.ndarray, O: np.ndarray, m, reduction: str):
    """-sum_r m_r log softmax(z_r)[label_r]  (/ sum m for "mean"); O one-hot labels."""
    p = softmax_rows(z)
    total = -sp.Add(*[m[r] * sp.Add(*[O[r, v] * sp.log(p[r, v]) for v in range(z.shape[1])])
                      for r in range(z.shape[0])])
    return total / sp.Add(*m) if reduction == "mean" else total


def _prove_grad(reduction: str) -> Proof:
    """dL/dz = (softmax(z) - onehot) * m / N_masked ("mean", Mini-BERT derivation §4.2) or
    without the division ("sum", the slides' loss), for integer one-hot rows O."""
    for n, V, mask in CE_CASES:
        z = arr("z", n, V)
        labels = [(r * 2 + 1) % V for r in range(n)]
        O = np.eye(V, dtype=int)[labels]
        L = ce(z, O, mask, reduction)
        derived, E, aux = exp_to_symbols(vjp(np.array([L], dtype=object),
                                             np.array([1], dtype=object), z), z)
        P = E / E.sum(axis=-1, keepdims=True)
        closed = (P - O) * np.array(mask, dtype=object)[:, None]
        if reduction == "mean":
            closed = closed / sum(mask)
        ok, detail = compare(derived, closed, aux)
        if not ok:
            return Proof("refuted", (n, V), f"mask={mask}: {detail}")
    return Proof("proven", tuple((n, V) for n, V, _ in CE_CASES))


def _prove_forward(reduction: str) -> Proof:
    """-log softmax(z)[y] = log sum_k exp(z_k) - z_y (the log-sum-exp form the code evaluates),
    and the mean is the sum divided by the number of masked positions."""
    for V in (2, 3, 4):
        z = arr("z", V)
        E = [sp.Symbol(f"E{k}", positive=True) for k in range(V)]  # E_k = exp(z_k)
        lhs = -sp.log(E[0] / sp.Add(*E))
        rhs = sp.log(sp.Add(*E)) - sp.log(E[0])  # log E_0 = z_0
        if sp.simplify(sp.expand_log(lhs - rhs, force=True)) != 0:
            return Proof("refuted", (V,), "-log p_y != logsumexp - z_y")
        del z
    for n, V, mask in CE_CASES:
        z = arr("z", n, V)
        O = np.eye(V, dtype=int)[[0] * n]
        if sp.simplify(ce(z, O, mask, "mean") * sum(mask) - ce(z, O, mask, "sum")) != 0:
            return Proof("refuted", (n, V), "mean * N_masked != sum")
    return Proof("proven", (2, 3, 4), "log-sum-exp form; mean = sum / N_masked")


def _prove_reduction_convention() -> Proof:
    """Mini-BERT divides the masked sum by N_masked, the slides do not: the losses and their
    gradients differ by the factor N_masked (proven above), which an optimizer's learning rate
    absorbs under SGD but not under Adam (scale-invariant up to eps)."""
    n, V, mask = CE_CASES[0]
    z = arr("z", n, V)
    O = np.eye(V, dtype=int)[[1, 2, 0]]
    if sp.simplify(ce(z, O, mask, "sum") - sum(mask) * ce(z, O, mask, "mean")) != 0:
        return Proof("refuted", (n, V), "sum != N_masked * mean")
    return Proof("convention", (n, V), f"sum = N_masked x mean (proven, N_masked={sum(mask)} "
                                       "here); the reference offers both (reduction=)")


def _prove_mse(which: str) -> Proof:
    for shape in ((1, 2, 2), (2, 2, 3)):
        y_hat, x = arr("yh", *shape), arr("x", *shape)
        N = int(np.prod(shape))
        L = sp.Add(*((y_hat - x) ** 2).ravel()) / N
        if which == "forward":
            if sp.expand(L - sp.Add(*[(a - b) ** 2 for a, b in zip(y_hat.ravel(), x.ravel())]) / N):
                return Proof("refuted", shape, "")
            continue
        one = np.array([1], dtype=object)
        ok, detail = compare(vjp(np.array([L], dtype=object), one, y_hat), 2 * (y_hat - x) / N)
        ok2, detail2 = compare(vjp(np.array([L], dtype=object), one, x), -2 * (y_hat - x) / N)
        if not (ok and ok2):
            return Proof("refuted", shape, detail or detail2)
    return Proof("proven", ((1, 2, 2), (2, 2, 3)),
                 "" if which == "forward" else "and dL/dX = -dL/dŶ (X is the embedding, "
                                               "itself trained, in the reconstruction task)")


# --------------------------------------------------------------------------- SymPy <-> code
@maps_cache
def _ce_fns(size, reduction):
    n, V = size
    z, O, m = arr("z", n, V), arr("O", n, V), arr("m", n)
    L = np.array([ce(z, O, m, reduction)], dtype=object)
    inputs = dict(z=z, O=O, m=m)
    return forward_backward_maps(inputs, L, np.array([1], dtype=object), [z])


def _ce_inputs(size):
    n, V = size
    return dict(z=("float", (n, V), 3.0), labels=("int", (n,), V), keep=("bool", (n,)))


def _ce_labels(labels, keep):
    return np.where(keep, labels, IGNORE_INDEX)


def _ce_sympy(reduction, which):
    def build(size):
        fns = _ce_fns(size, reduction)

        def run(z, labels, keep):
            O = np.eye(size[1])[labels]
            out = fns[which](z=z, O=O, m=keep.astype(float))
            return (out[0].reshape(()),) if which == 0 else out
        return run
    return build


def _ce_accept(size, z, labels, keep):
    return bool(keep.any())  # the mean needs one predicted position


def _ce_call(reduction):
    """How the code side calls cross_entropy (its inputs, other arguments, dloss)."""
    return lambda z, labels, keep: ({"logits": z}, {"labels": _ce_labels(labels, keep),
                                                    "reduction": reduction}, 1.0)


def _ce_numeric(reduction, which):
    return op_check(which, ((3, 3), (2, 4)), _ce_inputs, _ce_sympy(reduction, which),
                    "cross_entropy_forward", "cross_entropy_backward",
                    lambda z, labels, keep: ((z, _ce_labels(labels, keep)),
                                             {"reduction": reduction}), 1.0, loss=True,
                    accept=_ce_accept, guard_call=_ce_call(reduction))


@maps_cache
def _mse_fns(shape):
    y_hat, x = arr("yh", *shape), arr("y", *shape)
    L = np.array([sp.Add(*((y_hat - x) ** 2).ravel()) / int(np.prod(shape))], dtype=object)
    one = np.array([1], dtype=object)
    inputs = dict(y_hat=y_hat, y=x)
    return forward_backward_maps(inputs, L, one, (y_hat, x))


def _mse_inputs(shape):
    return dict(y_hat=("float", shape, 2.0), y=("float", shape, 2.0))


def _mse_numeric(which):
    def build(shape):
        f = _mse_fns(shape)[which]
        return (lambda **a: (f(**a)[0].reshape(()),)) if which == 0 else f
    return op_check(which, ((1, 2, 2), (2, 2, 3)), _mse_inputs, build, "mse_forward",
                    "mse_backward", lambda y_hat, y: ((y_hat, y), {}), 1.0, loss=True)


TORCH = "torch.nn.functional.cross_entropy"
register(Equation(
    "loss.ce.mean", "Masked cross-entropy, mean over masked positions", (f"{MINIBERT} §4.1",),
    r"L = -\frac{1}{N_{masked}} \sum_{masked} \log p[b, t, y_{b,t}]",
    lambda: _prove_forward("mean"), torch_op=TORCH, numeric=_ce_numeric("mean", 0),
    uses=("softmax.forward",)))
register(Equation(
    "loss.ce.sum", "Masked cross-entropy, summed", (f"{SLIDES} (steps 4-5)", f"{GUIDE} §6"),
    r"\mathcal{L}_{MLM} = -\sum_{i \in \mathcal{M}} \log \mathrm{softmax}(W H_i + b)[y_i]",
    lambda: _prove_forward("sum"), torch_op=TORCH, numeric=_ce_numeric("sum", 0),
    uses=("softmax.forward",)))
register(Equation(
    "loss.ce.backward.mean", "Cross-entropy logit gradient (mean)", (f"{MINIBERT} §4.2",),
    r"\frac{\partial L}{\partial z[b,t,v]} = (p[b,t,v] - \delta_{v, y_{b,t}}) "
    r"\frac{m[b,t]}{N_{masked}}",
    lambda: _prove_grad("mean"), gradient=True, torch_op=TORCH, numeric=_ce_numeric("mean", 1),
    uses=("loss.ce.mean", "softmax.jacobian")))
register(Equation(
    "loss.ce.backward.sum", "Cross-entropy logit gradient (sum)", (f"{SLIDES} (step 5)",),
    r"\frac{\partial L}{\partial z[i,v]} = (p[i,v] - \delta_{v, y_i})\, [i \in \mathcal M]",
    lambda: _prove_grad("sum"), gradient=True, torch_op=TORCH, numeric=_ce_numeric("sum", 1),
    note="the slides state only the loss; the gradient is derived",
    uses=("loss.ce.sum", "softmax.jacobian")))
register(Equation(
    "loss.ce.reduction", "Mean (Mini-BERT) vs sum (slides) over masked positions",
    (f"{MINIBERT} §4.1", f"{SLIDES} (step 5)"),
    r"\mathcal{L}_{sum} = N_{masked} \cdot \mathcal{L}_{mean}", _prove_reduction_convention,
    kind="document", expected="convention", target="loss.ce.mean"))
register(Equation(
    "loss.mse", "Reconstruction MSE", (f"{SEED001} §3",),
    r"\mathcal{L} = \frac{1}{B T d_{model}} \lVert \hat Y - X \rVert_2^2",
    lambda: _prove_mse("forward"), torch_op="torch.nn.functional.mse_loss",
    numeric=_mse_numeric(0)))
register(Equation(
    "loss.mse.backward", "MSE gradient", (f"{SEED001} §3",),
    r"\frac{\partial \mathcal{L}}{\partial \hat Y} = \frac{2}{B T d_{model}} (\hat Y - X)",
    lambda: _prove_mse("backward"), gradient=True, torch_op="torch.nn.functional.mse_loss",
    numeric=_mse_numeric(1),
    uses=("loss.mse",)))


# --------------------------------------------------------------------------- probability input
VARIANT = PROTOCOL_VARIANTS


def _prove_probs_forward() -> Proof:
    """The loss of probabilities at p = softmax(z) is the logits' cross-entropy:
    -log p_y = logsumexp(z) - z_y (V = 2, 3, 4; E_k = exp(z_k))."""
    for V in (2, 3, 4):
        E = [sp.Symbol(f"E{k}", positive=True) for k in range(V)]
        p = [e / sp.Add(*E) for e in E]
        if not is_zero(sp.expand_log(-sp.log(p[V - 1]) - (sp.log(sp.Add(*E)) - sp.log(E[-1])),
                                     force=True)):
            return Proof("refuted", (V,), "-log softmax(z)_y != logsumexp(z) - z_y")
    return Proof("proven", (2, 3, 4), "-log p_y at p = softmax(z) is the logits' loss")


def _prove_probs_dp() -> Proof:
    """dL/dp of L = -sum_r m_r log p[r, y_r] / N is -m_r / (N p[r, y_r]) at the label and 0
    elsewhere (sympy.diff, two rows, V = 3)."""
    n, V, labels, mask = 2, 3, (2, 0), (1, 1)
    p = arr("p", n, V, positive=True)
    L = -sp.Add(*[mask[r] * sp.log(p[r, labels[r]]) for r in range(n)]) / sum(mask)
    for r in range(n):
        for v in range(V):
            want = -sp.Rational(mask[r], sum(mask)) / p[r, v] if v == labels[r] else 0
            if not is_zero(sp.diff(L, p[r, v]) - want):
                return Proof("refuted", (n, V), f"dL/dp[{r}, {v}] differs")
    return Proof("proven", (n, V), "dL/dp = -onehot / p / N_masked")


def _prove_probs_dlogits() -> Proof:
    """Softmax's backward turns dL/dp = -onehot / p into p - onehot: J^T g with J = diag(p) -
    p p^T at p = softmax(z) is the logit gradient (V = 2, 3, 4, label 0), so a backward that
    returns p - onehot from probabilities returns dL/dlogits of softmax + CE composed."""
    for V in (2, 3, 4):
        E = [sp.Symbol(f"E{k}", positive=True) for k in range(V)]
        p = [e / sp.Add(*E) for e in E]
        g = [-1 / p[0]] + [0] * (V - 1)  # dL/dp for label 0
        dot = sp.Add(*[p[k] * g[k] for k in range(V)])
        for j in range(V):
            jt = p[j] * (g[j] - dot)  # (J^T g)_j = p_j (g_j - sum_k p_k g_k)
            if not is_zero(jt - (p[j] - (1 if j == 0 else 0))):
                return Proof("refuted", (V,), f"(J^T dL/dp)_{j} != p_{j} - onehot_{j}")
    return Proof("proven", (2, 3, 4), "softmax^T(-onehot / p) = p - onehot")


register(Equation(
    "loss.ce.probs", "Cross-entropy of probabilities (softmax output in)", (VARIANT,),
    r"L = -\frac{1}{N_{masked}} \sum_{masked} \log p[y]\ \ (p = \mathrm{softmax}(z))",
    _prove_probs_forward, torch_op="torch.nn.functional.nll_loss(log p)",
    numeric_na="the logits' cross-entropy (loss.ce.*) composed with log; checked by FD, the "
               "torch oracle (nll_loss of log p) and composed with the protocol's softmax",
    note="CAPABILITIES cross_entropy.input = probabilities | probabilities_dlogits",
    uses=("loss.ce.mean", "softmax.forward")))
register(Equation(
    "loss.ce.probs_dp", "Its gradient w.r.t. the probabilities", (VARIANT,),
    r"\frac{\partial L}{\partial p[r, v]} = -\frac{m_r\, \delta_{v y_r}}{N_{masked}\, p[r, y_r]}",
    _prove_probs_dp, gradient=True, torch_op="torch.nn.functional.nll_loss(log p)",
    numeric_na="one division at the label; checked by FD on p, the torch oracle and, composed "
               "with softmax's backward, by every logits check",
    uses=("loss.ce.probs",)))
register(Equation(
    "loss.ce.probs_dlogits", "Probabilities in, the composed logit gradient out", (VARIANT,),
    r"J_{\mathrm{softmax}}^\top \frac{\partial L}{\partial p} = p - \mathrm{onehot}(y)",
    _prove_probs_dlogits, gradient=True, torch_op="torch.nn.functional.cross_entropy(log p)",
    numeric_na="the logit gradient of loss.ce.backward.*; checked by the torch oracle alone "
               "(its backward is not d/dp, so FD runs on the composition with softmax)",
    uses=("loss.ce.probs_dp", "softmax.backward", "loss.ce.backward.mean")))
