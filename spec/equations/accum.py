"""Gradient accumulation over micro-batches (Mini-BERT derivation §8.2): the weighted mean that
equals the full-batch gradient, and the document's division by accumulation_steps."""

from __future__ import annotations

import sympy as sp

from minibert_spec.equations import Equation, Proof, register
from minibert_spec.sources import MINIBERT


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


register(Equation(
    "accum.grad_mean", "Gradient accumulation equals the full-batch gradient",
    (f"{MINIBERT} §8.2",),
    r"g = \frac{\sum_k n_k \bar g_k}{\sum_k n_k}\ (n_k \text{ masked tokens in micro-batch } k)",
    _prove_accum,
    numeric_na="a loop over micro-batches, not a map on arrays: the suite's "
               "accumulation checks take it end to end (accumulated vs full-batch model "
               "gradient, uneven micro-batches)",
    uses=("loss.ce.backward.mean",)))
register(Equation(
    "accum.divide_by_steps", "Accumulated gradients divided by accumulation_steps",
    (f"{MINIBERT} §8.2",), r"g = \frac{1}{K} \sum_{k=1}^{K} \bar g_k", _prove_divide_by_steps,
    kind="document", expected="refuted", target="accum.grad_mean"))
