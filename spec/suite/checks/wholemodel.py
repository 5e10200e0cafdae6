"""The ``whole_model`` row: a whole model of any architecture, declared from the function the
user has (minibert_spec.protocol.wholemodel), judged by finite differences of its loss in every
parameter tensor (minibert_spec.numerics.finite_differences.gradcheck_dict: random mixed-sign
directions, then element-wise on the worst tensor), at parameters moved off their values
(random gains and biases) and on batches Hypothesis draws from the shapes the parameters
imply; the gradient's bookkeeping (keys, shapes, dtypes, finite) and the inputs left
untouched.  No torch twin: it judges any architecture, and its red says which op rows to read
next."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from minibert_spec.numerics.finite_differences import (
    gradcheck_dict,
    gradient_bookkeeping,
    moved,
)
from minibert_spec.protocol import unwrap
from minibert_spec.protocol.composed import ModelOfRows
from minibert_spec.protocol.conventions import ConventionWarning
from minibert_spec.protocol.wholemodel import declaration, look_next
from minibert_spec.suite.registry import check

# batch shapes and the seed of the parameters' move and the batch's values, drawn by Hypothesis
# (a red shrinks to the smallest batch that shows it); T is capped by the params' position table
GIVEN = {"B": st.integers(1, 3), "T": st.integers(2, 8), "seed": st.integers(0, 2**16 - 1)}
FIXED = {"B": 2, "T": 5, "seed": 0}


@dataclass
class Case:
    params: dict  # moved off the declared values, in the dtype the code computes in
    batch: dict
    loss: float
    grads: dict
    dtype: str  # "float64", or "float32" for float32-only code run as it is


def _snapshot(tree):
    if isinstance(tree, np.ndarray):
        return tree.copy()
    if isinstance(tree, dict):
        return {k: _snapshot(v) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_snapshot(v) for v in tree)
    return tree


def _changed(before, after, where: str) -> str | None:
    """Where ``after`` differs from the snapshot ``before`` (the first entry, both values)."""
    if isinstance(before, np.ndarray):
        if not isinstance(after, np.ndarray) or after.shape != before.shape \
                or after.dtype != before.dtype:
            return f"{where} was replaced ({type(after).__name__})"
        diff = np.argwhere(~((after == before) | (np.isnan(after) & np.isnan(before)))
                           if np.issubdtype(before.dtype, np.floating) else after != before)
        if len(diff):
            i = tuple(int(j) for j in diff[0])
            return f"{where} changed at index {i}: {before[i]!r} -> {after[i]!r}"
        return None
    if isinstance(before, dict):
        if not isinstance(after, dict) or list(after) != list(before):
            return f"{where}'s keys changed"
        return next((c for k in before
                     if (c := _changed(before[k], after[k], f"{where}[{k!r}]"))), None)
    if isinstance(before, tuple):
        return next((c for i, (b, a) in enumerate(zip(before, after))
                     if (c := _changed(b, a, f"{where}[{i}]"))), None)
    return None


def _scalar(loss, what: str) -> float:
    value = np.asarray(loss)
    assert value.ndim == 0 and np.issubdtype(value.dtype, np.floating), (
        f"{what}: the loss is {type(loss).__name__} {value.dtype} of shape {value.shape}, "
        "expected a float scalar")
    assert np.isfinite(value), f"{what}: the loss is not finite: {float(value)}"
    return float(value)


def _call(impl, params, batch, dloss):
    out = impl.whole_model_loss_and_grads(params, batch, dloss)
    assert isinstance(out, tuple) and len(out) == 2, (
        f"whole model: loss_and_grads returned {type(out).__name__}"
        + (f" of {len(out)}" if isinstance(out, tuple) else "") + ", expected (loss, grads)")
    return out


def _is_f32(grads) -> bool:
    """The code computed in float32 though given float64 -- every gradient came back float32:
    float32-only code, judged as it is.  Some float32 among float64 is no float32 code: the
    bookkeeping names those gradients."""
    values = list(grads.values()) if isinstance(grads, dict) else []
    return bool(values) and all(np.asarray(v).dtype == np.float32 for v in values)


def draw(impl, B: int, T: int, seed: int):
    """The inputs of one example: the declared params moved off their values (their own
    dtype), a batch of B x T, and the upstream gradient of a forward / backward pair."""
    model = declaration(unwrap(impl))
    rng = np.random.default_rng(seed)
    base = moved(model.params, rng)
    batch = model.draw_batch(B, T, rng)
    return base, batch, float(rng.uniform(0.5, 2.0) * rng.choice([-1.0, 1.0]))


def model_case(impl, B: int, T: int, seed: int, inputs=None) -> Case:
    """The case of one example: the declared params moved off their values (float64), a batch
    of B x T, the code's (loss, grads) there -- float64 unless the code computes in float32
    whatever it is given (or raises on float64 while its own params are float32): then float32
    params, as it runs.  The gradient's bookkeeping is asserted (each problem named).
    ``inputs``: :func:`draw`'s, drawn here when None."""
    base, batch, dloss = inputs if inputs is not None else draw(impl, B, T, seed)
    f32_declared = all(v.dtype == np.float32 for v in base.values())
    params = {k: v.astype(np.float64) for k, v in base.items()}
    try:
        loss, grads = _call(impl, params, batch, dloss)
        f32 = _is_f32(grads)
    except Exception:  # noqa: BLE001 -- float32-only code may refuse float64: tried below
        if not f32_declared:
            raise
        f32 = True
    if f32:
        params = {k: v.astype(np.float32) for k, v in base.items()}
        loss, grads = _call(impl, params, batch, dloss)
    problems = gradient_bookkeeping(params, grads)
    assert not problems, "whole model: " + "; ".join(problems)
    value = _scalar(loss, "whole model")
    return Case(params, batch, value, grads, "float32" if f32 else "float64")


def _look_next(names: list[str], failed: set[str]) -> str:
    """The rows to read next.  A wrong *input* gradient reaches every tensor before the op
    (params in forward order): most tensors up to the last that disagrees are wrong, and the
    bug sits between it and the first after it that agrees -- in that agreeing tensor's op
    (its parameter gradients right, its input gradient wrong: a norm's dx) or in the
    disagreeing one's.  A wrong *parameter* gradient stays in its tensor: a few tensors
    disagree, the ones around them agree, and their own ops are the rows to read."""
    last = max((i for i, n in enumerate(names) if n in failed), default=None)
    if last is None:
        return ""
    upto = names[:last + 1]
    if 2 * sum(n in failed for n in upto) <= len(upto):  # isolated: parameter gradients
        ops = tuple(dict.fromkeys(op for n in upto if n in failed for op in look_next(n)))
        where = "only the tensors named disagree (their neighbours agree)"
    else:
        nxt = names[last + 1] if last + 1 < len(names) else None
        ops = tuple(dict.fromkeys((look_next(nxt) if nxt else ()) + look_next(names[last])))
        where = (f"wrong up to {names[last]!r}, right from {nxt!r} on" if nxt else
                 f"every tensor up to the last, {names[last]!r}, disagrees")
    return where + (f": look next at the op rows {', '.join(ops)} (minibert check <your ops> "
                    f"--ops {' '.join(ops)})" if ops else ": their names point at no op row")


@check("fd", "whole_model", ops=("whole_model",), given=GIVEN,
       examples=lambda _: lambda caps: [FIXED])
def whole_model_gradients_match_finite_differences(impl, B, T, seed):
    """Every parameter tensor of the whole model along a random mixed-sign direction (two
    evaluations each), the worst disagreeing one element by element: float64 central
    differences of the loss, at random parameters on a drawn batch."""
    case = model_case(impl, B, T, seed)
    names = list(case.params)

    def loss(p):
        return _scalar(impl.whole_model_loss(p, case.batch), "whole model (the loss alone)")

    res = gradcheck_dict(loss, case.params, case.grads,
                         rng=np.random.default_rng(seed + 1), op="whole model")
    # a model composed of the implementation's op rows (minibert_spec.protocol.composed): the
    # verdict says which rows it used, and a red points at those rows, not at tensor names
    model = declaration(unwrap(impl))
    composed = model.describe() if isinstance(model, ModelOfRows) else ""
    if composed:
        warnings.warn(ConventionWarning(composed), stacklevel=2)
    if case.dtype == "float32":
        warnings.warn(ConventionWarning(res.floor_note()), stacklevel=2)
    failed = res.failed
    if failed:
        worst = res.worst
        where = (f" at index {worst.index}" if worst.mode == "elementwise" else
                 " along a random direction")
        raise AssertionError(
            f"whole model: d/d{worst.tensor}{where}: analytic {worst.analytic:.6e}, finite "
            f"difference {worst.numeric:.6e} ({len(failed)} of {len(names)} parameter tensors "
            f"disagree); "
            f"{model.look_next() if composed else _look_next(names, {r.tensor for r in failed})}\n"
            f"disagree: {', '.join(r.tensor for r in failed)} ({res.floor_note()})\n"
            f"worst: {worst}" + (f"\n{composed}" if composed else ""))


@check("invariant", "whole_model.grads_match_params", ops=("whole_model",), quick=True)
def whole_model_grads_match_params(impl):
    """grads keys == params keys (a missing or extra key named), each gradient of its
    parameter's shape and dtype, every entry and the loss finite."""
    model_case(impl, **FIXED)


@check("invariant", "whole_model.inputs_untouched", ops=("whole_model",), quick=True)
def whole_model_leaves_its_inputs_untouched(impl):
    """loss_and_grads changes neither the params nor the batch it is given (in place, or their
    keys)."""
    base, batch, dloss = draw(impl, **FIXED)
    before, kept = _snapshot(batch), _snapshot(base)
    case = model_case(impl, **FIXED, inputs=(base, batch, dloss))
    # the params it was given: the drawn ones in the dtype it runs in (astype: exact copies)
    given = {k: v.astype(case.params[k].dtype) for k, v in kept.items()}
    changed = (_changed(before, case.batch, "the batch")
               or _changed(given, case.params, "params"))
    assert changed is None, f"whole model: loss_and_grads changed its input: {changed}"
