"""Case families of the losses: cross-entropy (on logits with ignored positions, on
gathered rows, on probabilities), the fused linear cross-entropy, the next-token
cross-entropy and MSE."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from minibert_spec.protocol import IGNORE_INDEX
from minibert_spec.suite.strategies.kit import (
    OpCase,
    _lead_shapes,
    _seed,
    _softmax_rows,
    arrays,
    cases,
    ce_labels,
    fixed_examples,
    np_arrays,
    scalar_upstream,
    sizes,
    upstream_like,
)

# --------------------------------------------------------------------------- losses
_PROBS = ("probs", "probs_dp", "probs_dlogits")  # the probability forms' equations
_IGNORING = {"cross_entropy.ignore_index": True}
# the example's labels: ignored positions within and across rows
_CE_LABELS = np.array([[1, IGNORE_INDEX, 4, 4], [IGNORE_INDEX, IGNORE_INDEX, 0, 2]])


def _gathered(logits: np.ndarray, labels: np.ndarray, layout: str | None):
    """The predicted rows of an example, [N, V] ("rows") or [1, N, V] ("batch")."""
    if layout is None:
        return logits, labels
    keep = labels != IGNORE_INDEX
    logits, labels = logits[keep], labels[keep]
    return (logits, labels) if layout == "rows" else (logits[None], labels[None])


def _cross_entropy_example(rng, reduction: str, layout: str | None = None):
    logits, labels = _gathered(rng.standard_normal((2, 4, 5)) * 2, _CE_LABELS, layout)
    fixed = {"labels": labels, "reduction": reduction,
             **({"ignore_index": IGNORE_INDEX} if layout is None else {})}
    return OpCase({"logits": logits}, fixed, upstream_like(rng, ()))


_CE = dict(torch="cross_entropy")


@cases("cross_entropy", "mean", reduction="mean", omit=("sum",) + _PROBS, needs=_IGNORING,
       **_CE)
@cases("cross_entropy", "sum", reduction="sum", omit=("mean",) + _PROBS, needs=_IGNORING, **_CE)
# the predicted rows gathered, in both layouts a loss without ignore_index is handed: [N, V]
# and [1, N, V] (a loss dividing by shape[0] is right in one and wrong in the other)
@cases("cross_entropy", "rows_mean", reduction="mean", layout="rows", omit=("sum",) + _PROBS,
       **_CE)
@cases("cross_entropy", "rows_sum", reduction="sum", layout="rows", omit=("mean",) + _PROBS,
       **_CE)
@cases("cross_entropy", "batch_mean", reduction="mean", layout="batch", omit=("sum",) + _PROBS,
       **_CE)
@cases("cross_entropy", "batch_sum", reduction="sum", layout="batch", omit=("mean",) + _PROBS,
       **_CE)
@fixed_examples(_cross_entropy_example)
@st.composite
def cross_entropy_cases(draw, reduction: str, layout: str | None = None) -> OpCase:
    """``layout`` None: any leading shape, ignored positions marked with ``ignore_index``
    (passed: -100, the default, or -1, which a loss masking with the default would score);
    "rows" [N, V] / "batch" [1, N, V]: every position predicted (no ignore_index passed)."""
    if layout is None:
        lead = draw(_lead_shapes(3).filter(len))  # labels need at least one axis
    else:
        N = draw(sizes(1, 5))
        lead = (N,) if layout == "rows" else (1, N)
    V = draw(sizes(1, 6))
    inputs = {"logits": draw(arrays(lead + (V,), -4.0, 4.0))}
    fixed = {"reduction": reduction}
    if layout is None:
        fixed["ignore_index"] = draw(st.sampled_from([IGNORE_INDEX, -1]))
        fixed["labels"] = draw(ce_labels(lead, V, fixed["ignore_index"]))
    else:
        fixed["labels"] = draw(hnp.arrays(np.int64, lead, elements=st.integers(0, V - 1),
                                          fill=st.nothing()))
    return OpCase(inputs, fixed, draw(scalar_upstream()), draw(_seed()))


def _probs_omit(form: str, reduction: str) -> tuple:
    other = "probs_dlogits" if form == "probabilities" else "probs_dp"
    return ("mean", "sum", other)


def _probs(form: str, reduction: str) -> dict:
    return dict(reduction=reduction, omit=_probs_omit(form, reduction),
                needs={"cross_entropy.input": form}, resolve=("cross_entropy.ignore_index",),
                fd=form == "probabilities", torch=f"cross_entropy_{form}")


def _cross_entropy_probs_example(rng, reduction: str, input: str,  # noqa: A002 (the keyword)
                                 ignore_index: bool = True):
    logits, labels = _gathered(rng.standard_normal((2, 4, 5)), _CE_LABELS,
                               None if ignore_index else "rows")
    fixed = {"labels": labels, "reduction": reduction, "input": input}
    return OpCase({"logits": _softmax_rows(logits)}, fixed, upstream_like(rng, ()))


# the loss on probabilities alone (its composition with softmax is every family above, through
# the proxy); the composed form's backward is a logit gradient, not d/dp: no FD of its own
@cases("cross_entropy", "probs_mean", **_probs("probabilities", "mean"))
@cases("cross_entropy", "probs_sum", **_probs("probabilities", "sum"))
@cases("cross_entropy", "probs_dlogits_mean", **_probs("probabilities_dlogits", "mean"))
@cases("cross_entropy", "probs_dlogits_sum", **_probs("probabilities_dlogits", "sum"))
@fixed_examples(_cross_entropy_probs_example)
@st.composite
def cross_entropy_probs_cases(draw, reduction: str, input: str,  # noqa: A002 (the keyword)
                              ignore_index: bool = True) -> OpCase:
    """Probabilities p = softmax(z), z in [-2, 2] (every p >= e^-4 / V: -log p stays smooth
    at the FD step), passed as the first argument with ``input=form``; ignored positions only
    for an implementation that takes ignore_index."""
    lead = draw(_lead_shapes(3).filter(len))
    V = draw(sizes(1, 6))
    p = _softmax_rows(draw(arrays(lead + (V,), -2.0, 2.0)))
    labels = (draw(ce_labels(lead, V)) if ignore_index else
              draw(np_arrays(np.int64, tuple(lead), st.integers(0, V - 1), st.nothing())))
    fixed = {"labels": labels, "reduction": reduction, "input": input}
    return OpCase({"logits": p}, fixed, draw(scalar_upstream()), draw(_seed()))


def _linear_cross_entropy_example(rng, reduction: str, layout: str | None = None):
    x = rng.standard_normal((2, 3, 4))
    labels = np.array([[1, IGNORE_INDEX, 4], [0, 4, IGNORE_INDEX]])
    if layout is not None:  # the predicted rows, [N, n_in] or [1, N, n_in]
        keep = labels != IGNORE_INDEX
        x, labels = (x[keep], labels[keep]) if layout == "rows" else (x[keep][None],
                                                                      labels[keep][None])
    inputs = {"x": x, "W": rng.standard_normal((4, 5)), "b": rng.standard_normal(5)}
    fixed = {"labels": labels, "reduction": reduction,
             **({"ignore_index": IGNORE_INDEX} if layout is None else {})}
    return OpCase(inputs, fixed, upstream_like(rng, ()))


_LINEAR_IGNORING = {"linear_cross_entropy.ignore_index": True}


@cases("linear_cross_entropy", "mean", reduction="mean", torch="linear_cross_entropy",
       needs=_LINEAR_IGNORING)
@cases("linear_cross_entropy", "sum", reduction="sum", torch="linear_cross_entropy",
       needs=_LINEAR_IGNORING)
# the predicted rows in both layouts a loss without ignore_index is handed (cross_entropy's)
@cases("linear_cross_entropy", "rows_mean", reduction="mean", layout="rows",
       torch="linear_cross_entropy")
@cases("linear_cross_entropy", "rows_sum", reduction="sum", layout="rows",
       torch="linear_cross_entropy")
@cases("linear_cross_entropy", "batch_mean", reduction="mean", layout="batch",
       torch="linear_cross_entropy")
@cases("linear_cross_entropy", "batch_sum", reduction="sum", layout="batch",
       torch="linear_cross_entropy")
@fixed_examples(_linear_cross_entropy_example)
@st.composite
def linear_cross_entropy_cases(draw, reduction: str, layout: str | None = None) -> OpCase:
    """The fused head + loss: x [..., n_in] (one to three leading axes), W, b (or None), labels
    with one to all positions predicted, ignored ones marked -100 or -1 (passed); the
    defaults' one block of rows (the block boundaries are the reference's own tests,
    tests/reference/test_linear_cross_entropy.py).  ``layout`` "rows" [N, n_in] / "batch"
    [1, N, n_in]: every position predicted, no ignore_index passed (cross_entropy_cases')."""
    if layout is None:
        lead = draw(_lead_shapes(3).filter(len))
    else:
        N = draw(sizes(1, 5))
        lead = (N,) if layout == "rows" else (1, N)
    n_in, V = draw(sizes(1, 4)), draw(sizes(1, 6))
    inputs = {"x": draw(arrays(lead + (n_in,))), "W": draw(arrays((n_in, V), -1.0, 1.0)),
              "b": draw(arrays((V,), -1.0, 1.0)) if draw(st.booleans()) else None}
    if layout is not None:
        labels = draw(hnp.arrays(np.int64, lead, elements=st.integers(0, V - 1),
                                 fill=st.nothing()))
        return OpCase(inputs, {"labels": labels, "reduction": reduction},
                      draw(scalar_upstream()), draw(_seed()))
    ignore_index = draw(st.sampled_from([IGNORE_INDEX, -1]))
    fixed = {"labels": draw(ce_labels(lead, V, ignore_index)), "ignore_index": ignore_index,
             "reduction": reduction}
    return OpCase(inputs, fixed, draw(scalar_upstream()), draw(_seed()))


@cases("mse", torch="mse")
@fixed_examples(lambda rng: OpCase({"y_hat": rng.standard_normal((2, 3, 4)),
                                    "y": rng.standard_normal((2, 3, 4))}, {},
                                   upstream_like(rng, ())))
@st.composite
def mse_cases(draw) -> OpCase:
    shape = draw(_lead_shapes()) + (draw(sizes(1, 4)),)
    inputs = {"y_hat": draw(arrays(shape)), "y": draw(arrays(shape))}
    return OpCase(inputs, {}, draw(scalar_upstream()), draw(_seed()))
