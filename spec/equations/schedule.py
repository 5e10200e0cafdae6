"""The learning-rate schedule: linear warmup then linear decay (Mini-BERT derivation §8.1), and
the document's lr(0) = 0 at the first step.  The implementation: ``warmup_linear_lr``."""

from __future__ import annotations

import numpy as np
import sympy as sp

from minibert_spec.equations import Equation, Numeric, Proof, register
from minibert_spec.equations._cache import maps_cache
from minibert_spec.equations._sym import lambdify_map
from minibert_spec.sources import MINIBERT

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


# --------------------------------------------------------------------------- SymPy <-> code
def lr_project(step, warmup=W_, total=TOTAL, peak=PEAK):
    """The reference's convention (schedule.warmup_linear.step0): the warmup branch counts
    updates from 1, peak (step + 1) / warmup, so the first update is not wasted; the decay
    branch is the document's, peak (total - step) / (total - warmup), floored at 0."""
    return sp.Piecewise((peak * (step + 1) / warmup, step < warmup),
                        (sp.Max(0, peak * (1 - (step - warmup) / (total - warmup))), True))


@maps_cache
def _schedule_map(size):
    """lr at steps 0 .. total + 2 as a map of peak (each step's branch decided by SymPy; peak
    of either sign, as the check draws it: a symbol without assumptions keeps the floor)."""
    warmup, total = size
    peak = sp.Symbol("peak")
    lrs = np.array([lr_project(sp.Integer(k), sp.Integer(warmup), sp.Integer(total), peak)
                    for k in range(total + 3)], dtype=object)
    return lambdify_map(dict(peak=np.array([peak], dtype=object)), [lrs])


def _schedule_sympy(size):
    return _schedule_map(size)


def _schedule_code(impl, size, peak):
    warmup, total = size
    return (np.array([impl.warmup_linear_lr(k, peak_lr=float(peak[0]), warmup_steps=warmup,
                                            total_steps=total) for k in range(total + 3)]),)


register(Equation(
    "schedule.warmup_linear", "Linear warmup then linear decay", (f"{MINIBERT} §8.1",),
    r"\mathrm{lr} = \mathrm{peak} \frac{step}{warmup}\ (step < warmup),\ \mathrm{peak}\Bigl(1 - "
    r"\frac{step - warmup}{total - warmup}\Bigr)",
    _prove_schedule,
    numeric=Numeric(((4, 10), (1, 3), (5, 6)), lambda s: dict(peak=("float", (1,), 1.0)),
                    _schedule_sympy, _schedule_code, accept=lambda s, peak: bool(peak[0] > 0),
                    needs=("warmup_linear_lr",), other_convention="lr(0)=0"),
    note="the reference counts warmup updates from 1 (schedule.warmup_linear.step0); the "
         "SymPy <-> code check uses that convention, lr_project"))
register(Equation(
    "schedule.warmup_linear.step0", "Learning rate at the first step", (f"{MINIBERT} §8.1",),
    r"\mathrm{lr}(0) = \mathrm{peak} \cdot 0 / warmup = 0", _prove_step0, kind="document",
    expected="convention", target="schedule.warmup_linear"))
