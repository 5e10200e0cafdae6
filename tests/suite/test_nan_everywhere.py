"""No gradient check passes code whose gradients are NaN.  NaN compares as "no error" with every
``>`` test (``nan > tol`` is False): the SymPy column was green on an optimizer whose parameters
were NaN after three steps until that comparison was fixed.  This sweep poisons every
derivative of the reference at once -- each op's ``X_backward``, the whole-model and decoder
gradients, softmax's Jacobian -- and requires every finite-difference and oracle-backward check
that passes on the plain reference to be red on the poisoned one (not n/a, not passed), so a
comparison anywhere in those columns that lets NaN through turns this test red by name."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from minibert_spec.protocol import OPS
from tests.examples import reexport
from tests.unshrunk import check_implementation

KINDS = ["fd", "oracle.backward"]
# the derivatives a check may call besides the op pairs' backwards: the model's gradients and
# softmax's Jacobian (its fd row passed on the first run of this sweep, unpoisoned)
DERIVATIVES = ("backward", "loss_and_grads", "masked_lm_loss_and_grads",
               "decoder_loss_and_grads", "accumulate_gradients", "softmax_jacobian")


def _nan_like(value):
    """``value`` with every float entry NaN, its structure kept (tuples, dicts, caches, None)."""
    if isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.floating):
        return np.full_like(value, np.nan)
    if isinstance(value, dict):
        return {k: _nan_like(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_nan_like(v) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_nan_like(v) for v in value)
    if isinstance(value, float):
        return float("nan")
    return value


def _poisoned(fn):
    def wrapper(*args, **kwargs):
        return _nan_like(fn(*args, **kwargs))

    wrapper.__name__ = wrapper.__qualname__ = fn.__name__
    return wrapper


def poisoned_reference():
    names = {n: getattr(reexport, n) for n in dir(reexport) if not n.startswith("_")}
    backwards = {op.pair[1] for op in OPS.values() if op.pair} | set(DERIVATIVES)
    return SimpleNamespace(**{n: _poisoned(f) if n in backwards and callable(f) else f
                              for n, f in names.items()})


@pytest.mark.slow  # the slow tier: two runs of the gradient columns (~1 minute)
def test_every_gradient_check_is_red_on_nan_gradients():
    plain = check_implementation(reexport, kinds=KINDS)
    passed = {r.id for r in plain.results if r.outcome == "passed"}
    assert len(passed) > 150, len(passed)  # the sweep covers the columns, not a corner
    poisoned = {r.id: r for r in check_implementation(poisoned_reference(), kinds=KINDS).results}
    green = sorted(i for i in passed if poisoned[i].outcome != "failed")
    assert not green, [(i, poisoned[i].outcome, poisoned[i].message[:200]) for i in green[:10]]
    silent = sorted(i for i in passed if not poisoned[i].message.strip())
    assert not silent, silent[:10]
