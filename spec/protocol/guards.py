"""Numerical guards an implementation may declare, and how the suite judges a guarded result.

A guard is a deliberate, tiny change of a formula that keeps it finite: torch's clipping divides
by ``norm + 1e-6``; many hand-written losses take ``log(p + 1e-12)``, clip ``p`` at 1e-15 or
divide a masked sum by ``mask.sum() + 1e-8``; a softmax may divide by ``sum + 1e-9``.  A correct
implementation with a guard differs from the unguarded formula by an amount the guard fixes, so
it is judged against the *same* formula with the same guard -- never by widening a tolerance
for everyone.  Declared in ``CAPABILITIES["guards"]``::

    CAPABILITIES = {"guards": {"log_eps": 1e-12}}   # cross_entropy computes -log(p + 1e-12)

The table :data:`GUARDS` says, per guard, the rows of the op table whose formula it changes
(a log, a division or a square root) and the guarded formula; every row of the table with a
log, a division or a square root has a guard here or its reason for none in :data:`UNGUARDED`.
A guard declared once applies on every row it names.  How a check uses it: the case families'
oracle and the SymPy <-> code checks shift the expected output by the guarded formula's exact
effect and allow each gradient the distance between the guarded and the unguarded gradient
(an implementation may differentiate either form): :func:`adjustment`, one judge per row; the
loss invariants, the clipping and Adam checks evaluate the guarded formula itself
(:func:`mean_divisor`, :func:`guarded_nll`, :func:`clipped_norm`, :func:`adam_denominator`).

An undeclared guard stays a red, and the red names the guard it looks like (clipping: the eps
the measured factor implies).  NumPy only; the declaration is validated by
:func:`minibert_spec.protocol.capabilities.capabilities`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from minibert_spec.protocol.table import NOTHING_TO_GUARD, OPS

# the loss rows: each takes -log of a softmax probability and may take the mean
LOSS_ROWS = ("cross_entropy", "next_token_cross_entropy", "linear_cross_entropy")


@dataclass(frozen=True)
class Guard:
    """One guard: the rows whose formula it changes, what it keeps finite (a log, a division,
    a square root), the guarded formula in words (its range: GUARD_RANGES; the guards it cannot
    be declared with: EXCLUSIVE_GUARDS)."""

    rows: tuple[str, ...]
    at: str
    what: str

    def __str__(self) -> str:
        """One line: ``minibert adapter new`` and a refused declaration print it."""
        return f"{', '.join(self.rows)} ({self.at}): {self.what}"


GUARDS: dict[str, Guard] = {
    "clip_eps": Guard(("clip",), "division",
                      "clip_by_global_norm without an eps keyword divides by norm + clip_eps "
                      "(torch: 1e-6); undeclared, the protocol's eps = 0 is expected"),
    "log_eps": Guard(LOSS_ROWS, "log",
                     "-log(p + log_eps), p the softmax probability of the label (the loss is "
                     "then >= -log(1 + log_eps), and capped at -log(log_eps))"),
    "prob_clip": Guard(LOSS_ROWS, "log", "-log(max(p, prob_clip)) (probabilities clipped below)"),
    "prob_clip_both": Guard(LOSS_ROWS, "log",
                            "-log(clip(p, prob_clip_both, 1 - prob_clip_both)) (probabilities "
                            "clipped on both sides, np.clip(p, eps, 1 - eps))"),
    "mean_eps": Guard(LOSS_ROWS, "division",
                      "the mean divides the summed loss by N + mean_eps (N the predicted "
                      "positions: a masked sum / (mask.sum() + eps))"),
    "softmax_eps": Guard(("softmax",), "division",
                         "p = e / (sum(e) + softmax_eps), e = exp(x - max) over the kept "
                         "entries"),
    "adam_sqrt_eps": Guard(("adam",), "square root",
                           "the update divides by sqrt(v_hat + adam_sqrt_eps) + eps: a guard "
                           "under the root, the eps keyword still outside it"),
}

# The rows of the op table with a log, a division or a square root and no guard of their own,
# and why: each row's own ``unguarded`` (tests/suite/test_guards.py: every row is in GUARDS, or
# says why it needs none)
UNGUARDED = {op.name: op.unguarded for op in OPS.values()
             if op.unguarded and op.unguarded != NOTHING_TO_GUARD}
# A guard is a tiny number: anything larger changes ordinary results, not only the edge cases
# the guard exists for, and is a different formula rather than a guard.  The upper bound of a
# guard added without its own range (GUARD_RANGES).
MAX_GUARD = 1e-3
# The least of every guard: the smallest normal float32 (2^-126 ~ 1.18e-38).  A guard exists to
# keep log(p + eps), max(p, eps) or max_norm / (norm + eps) finite where p or the norm is 0; a
# smaller eps is subnormal in float32 arithmetic (the suite checks float32 too), or 0 where
# subnormals are flushed (code built with -ffast-math): log(0) or a division by 0 again, so it
# guards nothing.  0 itself is no guard at all (leave the key out).
MIN_GUARD = float(np.finfo(np.float32).tiny)
# name -> (least, largest) value that is still a guard, from the maths of the formula it changes
# (minibert_spec.protocol.capabilities refuses a declaration outside it, naming the range)
GUARD_RANGES = {
    # -log(p + eps) differs from -log p by log(1 + eps / p), and its logit gradient by the factor
    # p / (p + eps) (guarded_grad_factor): at eps = 1e-3 a label predicted with p >= 0.1 moves by
    # < 0.01 nats and < 1% of its gradient, so only labels predicted near p ~ eps -- confident
    # mistakes, where the log would blow up -- change materially.  A larger eps changes the loss
    # of ordinary predictions: a different loss (a smoothing), not a guard.
    "log_eps": (MIN_GUARD, 1e-3),
    # -log(max(p, c)) equals -log p wherever p >= c: the same bound as log_eps, for which the
    # change is never larger
    "prob_clip": (MIN_GUARD, 1e-3),
    # -log(clip(p, c, 1 - c)) adds the upper clip: a label predicted with p > 1 - c gets
    # -log(1 - c) ~ c instead of -log p < c, a change below c nats; the same bound
    "prob_clip_both": (MIN_GUARD, 1e-3),
    # max_norm / (norm + eps) leaves the clipped norm max_norm * norm / (norm + eps): short of
    # max_norm by eps / (norm + eps) < eps / max_norm, relative (clipping acts only when
    # norm > max_norm).  At max_norm = 1 (BERT's) eps <= 1e-4 keeps that within 1e-4, the
    # resolution the suite grants any float32 result (minibert_spec.tolerances.ORACLE_RTOL_F32): a
    # larger eps visibly changes every clipped step -- another clipping rule, not a guard against a
    # zero norm.  torch's own is 1e-6, 100x inside; 1e-3 is not a guard.
    "clip_eps": (MIN_GUARD, 1e-4),
    # sum / (N + eps) is short of the mean by eps / (N + eps) < eps, relative (N >= 1 predicted
    # positions: the mean needs one), on every loss: clip_eps's bound, for the same reason
    "mean_eps": (MIN_GUARD, 1e-4),
    # e / (s + eps), s >= 1 after the max shift (the maximum's e is 1): every probability short
    # by eps / (s + eps) < eps, relative, every row summing to s / (s + eps) -- the same bound
    "softmax_eps": (MIN_GUARD, 1e-4),
    # under the root the guard adds to v_hat ~ g^2: sqrt(g^2 + c) floors the divisor at sqrt(c),
    # on the scale of |g|, as Adam's eps does outside the root.  c <= 1e-8 keeps that floor at
    # 1e-4, and an entry with |g| >= 1e-2 moves its step by < c / (2 g^2) = 5e-5, relative; a
    # larger c damps ordinary small gradients (another eps, not a guard against v_hat = 0)
    "adam_sqrt_eps": (MIN_GUARD, 1e-8),
}
# guards that change the same formula: an implementation computes one of them
CROSS_ENTROPY_GUARDS = ("log_eps", "prob_clip", "prob_clip_both")
EXCLUSIVE_GUARDS = (CROSS_ENTROPY_GUARDS,)


def guard_range(name: str) -> tuple[float, float]:
    """(least, largest) value of the guard ``name`` that is still a guard."""
    return GUARD_RANGES.get(name, (MIN_GUARD, MAX_GUARD))


def declared_on(row: str, guards: Mapping) -> dict:
    """The declared guards (``guards``: CAPABILITIES["guards"]) that change ``row``."""
    return {k: v for k, v in guards.items() if k in GUARDS and row in GUARDS[k].rows}


def declare_hint(name: str, implied: float) -> str:
    """The end of an undeclared guard's red: the guard the measured result implies, and how to
    declare it (only a value within its range reads as a guard)."""
    low, high = guard_range(name)
    if not (np.isfinite(implied) and low <= implied <= high):
        return ""
    return (f"; {GUARDS[name].what}, with {name} = {implied:.2g}? if that guard is intended, "
            f"declare it: CAPABILITIES['guards'] = {{{name!r}: {implied:.2g}}}")


# --------------------------------------------------------------------------- clipping
def clip_guard(guards: Mapping) -> float:
    """The divisor guard of ``clip_by_global_norm`` called without ``eps``: the declared
    ``clip_eps`` (``guards``: CAPABILITIES["guards"]), else the protocol's default 0."""
    return float(guards.get("clip_eps", 0.0))


def clipped_norm(norm: float, max_norm: float, eps: float) -> float:
    """The global norm after clipping with the divisor guard eps (torch's clip_grad_norm_ rule:
    scale by min(1, max_norm / (norm + eps)))."""
    return norm * min(1.0, max_norm / (norm + eps))


def implied_clip_eps(norm: float, max_norm: float, got_clipped_norm: float) -> float:
    """The divisor guard eps that explains a clipped norm: got = norm max_norm / (norm + eps)."""
    return norm * max_norm / got_clipped_norm - norm if got_clipped_norm > 0 else float("inf")


def undeclared_clip_message(norm: float, max_norm: float, got: float, eps: float) -> str:
    implied = implied_clip_eps(norm, max_norm, got)
    return (f"the clipped norm {got!r} is max_norm {max_norm!r} scaled by "
            f"{got / max_norm - 1:+.2e} relative: a divisor guard norm + eps with eps = "
            f"{implied:.2g}, where {eps:g} is declared; if that guard is intended, declare it: "
            f"CAPABILITIES['guards'] = {{'clip_eps': {implied:.2g}}} (torch's is 1e-6)")


# --------------------------------------------------------------------------- cross-entropy
def ce_guard(guards: Mapping) -> str | None:
    """The one loss guard declared (one of CROSS_ENTROPY_GUARDS), or None."""
    found = [k for k in CROSS_ENTROPY_GUARDS if k in guards]
    if len(found) > 1:
        raise ValueError(f"CAPABILITIES['guards']: declare one loss guard of "
                         f"{list(CROSS_ENTROPY_GUARDS)}, not {found}")
    return found[0] if found else None


def guarded_nll(logp: np.ndarray, guards: Mapping) -> np.ndarray:
    """-log p of the label under the declared guard, from float64 log-probabilities."""
    kind = ce_guard(guards)
    if kind == "log_eps":
        return -np.log(np.exp(logp) + guards["log_eps"])
    if kind == "prob_clip":
        return -np.maximum(logp, np.log(guards["prob_clip"]))
    if kind == "prob_clip_both":
        c = float(guards["prob_clip_both"])
        return -np.clip(logp, np.log(c), np.log1p(-c))
    return -logp


def guarded_grad_factor(p_label: np.ndarray, guards: Mapping) -> np.ndarray:
    """d(-guarded log p_y)/dz = factor * (p - onehot): the factor per position (1 unguarded)."""
    kind = ce_guard(guards)
    if kind == "log_eps":
        return p_label / (p_label + guards["log_eps"])
    if kind == "prob_clip":
        return (p_label >= guards["prob_clip"]).astype(np.float64)
    if kind == "prob_clip_both":  # constant (gradient 0) where clipped, on either side
        c = float(guards["prob_clip_both"])
        return ((p_label >= c) & (p_label <= 1 - c)).astype(np.float64)
    return np.ones_like(p_label)


def loss_floor(guards: Mapping) -> float:
    """The least value a guarded per-position loss can take: 0 unguarded; with log(p + eps) at
    p = 1, -log(fl(1 + eps)), where 1 + eps rounds to a float64 up to half a spacing at 1
    (2^-53) above: -(eps + 2^-52) covers it (measured: -log(1 + 1e-12) = -1.0000889e-12)."""
    if ce_guard(guards) != "log_eps":
        return 0.0
    return -(float(guards["log_eps"]) + float(np.finfo(np.float64).eps))


def mean_divisor(n: int, reduction: str, guards: Mapping) -> float:
    """What a loss divides its summed terms by: N + mean_eps for "mean" (N the predicted
    positions; mean_eps 0 unless declared), 1 for "sum"."""
    return n + float(guards.get("mean_eps", 0.0)) if reduction == "mean" else 1.0


def _ce_terms(guards: Mapping, logits, labels, ignore_index: int, reduction: str,
              probabilities: bool = False):
    """The pieces both guarded forms share, in float64: log p of each label ``lp``, the
    unguarded per-position gradient ``g`` = p - onehot (over z), the kept positions, the
    unguarded divisor ``n``, the guarded one ``d`` and the log guard's factor per position
    (d(-guarded log p_y)/dz = factor * g).  ``probabilities``: ``logits`` holds p itself."""
    z = np.asarray(logits, dtype=np.float64)
    if probabilities:
        with np.errstate(divide="ignore"):
            logp = np.log(z)
    else:
        logp = z - np.logaddexp.reduce(z, axis=-1, keepdims=True)
    keep = labels != ignore_index
    safe = np.where(keep, labels, 0)
    lp = np.take_along_axis(logp, safe[..., None], -1)[..., 0]
    n = max(int(keep.sum()), 1) if reduction == "mean" else 1
    d = mean_divisor(n, reduction, guards)
    g = np.exp(logp)
    np.put_along_axis(g, safe[..., None], np.take_along_axis(g, safe[..., None], -1) - 1, -1)
    return lp, g, keep, n, d, guarded_grad_factor(np.exp(lp), guards)


def cross_entropy_adjustment(guards: Mapping, logits, labels, ignore_index: int,
                             reduction: str, dloss: float = 1.0, probabilities: bool = False):
    """For the declared loss guards (log_eps or prob_clip, mean_eps): (loss shift, dlogits
    allowance, reason).

    ``loss shift``: guarded loss - unguarded loss, in float64, independent of ``dloss`` (add it
    to an unguarded oracle: the oracle then computes the same guarded formula).  ``dlogits
    allowance``: per entry, |guarded gradient - unguarded gradient| for either form an
    implementation may differentiate (the guarded log's or the plain log's, over the guarded
    divisor; the guard fixes how far apart they are).  (0, 0, "") without a guard.
    ``probabilities``: ``logits`` holds the probabilities a loss of probabilities takes (its
    guard applies to p as given)."""
    kind = ce_guard(guards)
    divided = reduction == "mean" and "mean_eps" in guards
    if kind is None and not divided:
        return 0.0, 0.0, ""
    lp, g, keep, n, d, factor = _ce_terms(guards, logits, labels, ignore_index, reduction,
                                          probabilities)
    shift = float(np.sum(guarded_nll(lp, guards) * keep) / d + np.sum(lp * keep) / n)
    dev = np.maximum(np.abs(factor / d - 1 / n), abs(1 / d - 1 / n))
    allow = np.abs(g * (dev * keep)[..., None]) * abs(float(dloss))
    names = ", ".join(f"{k}={guards[k]:g}" for k in (kind, "mean_eps" if divided else None) if k)
    reason = (f"declared guard {names}: the loss is compared with the same guarded formula "
              f"(shift {shift:+.1e}), dlogits within |guarded - unguarded| gradient "
              f"(<= {float(np.max(allow, initial=0)):.1e})")
    return shift, allow, reason


def cross_entropy_plain_log_delta(guards: Mapping, logits, labels, ignore_index: int,
                                  reduction: str, dloss: float = 1.0):
    """The other gradient a guarded loss may return, signed: dlogits of the plain log over the
    guarded divisor minus dlogits of the guarded log -- the exact derivative of the guarded
    forward, which finite differences measure.  0 without a log guard."""
    if ce_guard(guards) is None:
        return 0.0
    _, g, keep, _, d, factor = _ce_terms(guards, logits, labels, ignore_index, reduction)
    return g * ((1 - factor) / d * keep)[..., None] * float(dloss)


# --------------------------------------------------------------------------- softmax
def softmax_terms(x, mask=None):
    """(z, keep, e, s) in float64: x, the kept entries, e = exp(x - max) on them (0 elsewhere)
    and its row sums s [..., 1] (>= 1: the maximum's e is 1), the unguarded p being e / s."""
    z = np.asarray(x, dtype=np.float64)
    keep = np.ones(z.shape, bool) if mask is None else np.asarray(mask, bool)
    top = np.where(keep, z, -np.inf).max(axis=-1, keepdims=True)
    e = np.where(keep, np.exp(np.where(keep, z, top) - top), 0.0)
    return z, keep, e, e.sum(axis=-1, keepdims=True)


def softmax_adjustment(guards: Mapping, x, mask=None, dout=None):
    """For a declared softmax_eps: (output shift, dx allowance, reason).  The guarded formula
    p_g = e / (s + eps), e = exp(x - max) on the kept entries, s their sum, against the
    unguarded p = e / s; dx within the larger distance from the unguarded p (dout - <dout, p>)
    of the two forms an implementation may differentiate: p_g (dout - <dout, p_g>) (the row
    maximum held constant, as code writes it) and the exact derivative, which also moves the
    maximum's entry by -eps / (s + eps) <dout, p_g> (finite differences see that one)."""
    eps = float(guards["softmax_eps"])
    z, keep, e, s = softmax_terms(x, mask)
    p, p_g = e / s, e / (s + eps)
    shift = p_g - p
    if dout is None:
        return shift, 0.0, ""
    dy = np.asarray(dout, dtype=np.float64)
    plain = p * (dy - (dy * p).sum(-1, keepdims=True))
    held = p_g * (dy - (dy * p_g).sum(-1, keepdims=True))
    exact = held.copy()
    at = np.argmax(np.where(keep, z, -np.inf), axis=-1)[..., None]
    moved = np.take_along_axis(exact, at, -1) - eps / (s + eps) * (dy * p_g).sum(-1, keepdims=True)
    np.put_along_axis(exact, at, moved, -1)
    allow = np.maximum(np.abs(held - plain), np.abs(exact - plain))
    reason = (f"declared guard softmax_eps={eps:g}: compared with the same guarded formula "
              f"(shift <= {float(np.max(np.abs(shift), initial=0)):.1e}), dx within |guarded - "
              f"unguarded| gradient (<= {float(np.max(allow, initial=0)):.1e})")
    return shift, allow, reason


# --------------------------------------------------------------------------- Adam
def adam_denominator(v_hat, eps: float, guards: Mapping):
    """Adam's divisor: sqrt(v_hat) + eps, or sqrt(v_hat + adam_sqrt_eps) + eps under the
    declared guard."""
    return np.sqrt(np.asarray(v_hat, dtype=np.float64) + float(guards.get("adam_sqrt_eps", 0.0))) \
        + eps


def adam_update_shift(m, v, step: int, *, beta1: float, beta2: float, eps: float,
                      guards: Mapping) -> np.ndarray:
    """The declared guard's change of one Adam update m_hat / (sqrt(v_hat) + eps) after step t
    (1-based), from that step's moments: guarded - unguarded, in float64 (the moments
    themselves do not depend on the guard)."""
    m_hat = np.asarray(m, dtype=np.float64) / (1 - beta1 ** step)
    v_hat = np.asarray(v, dtype=np.float64) / (1 - beta2 ** step)
    return m_hat / adam_denominator(v_hat, eps, guards) - m_hat / adam_denominator(v_hat, eps, {})


# --------------------------------------------------------------------------- per row
@dataclass(frozen=True)
class Adjustment:
    """A row's declared guards on one call: ``shift`` (guarded - unguarded output, to add to
    an unguarded oracle), ``allowance`` (per differentiable input: |guarded - unguarded
    gradient|), ``reason`` (for the report)."""

    shift: object
    allowance: Mapping
    reason: str


def _loss_rows(logits, labels, fixed) -> tuple:
    from minibert_reference.ops import IGNORE_INDEX  # the protocol's default

    return (logits, labels, fixed.get("ignore_index", IGNORE_INDEX),
            fixed.get("reduction", "mean"))


# A loss row's call as cross-entropy rows: (logits, labels, ignore_index, reduction) and how a
# per-logit array reaches the row's differentiable inputs -- signed, or ``absolute`` (a bound
# on how far an allowance reaches, by the triangle inequality).
def _ce_call(inputs, fixed) -> tuple:
    return _loss_rows(inputs["logits"], fixed["labels"], fixed), \
        lambda per_logit, absolute=False: {"logits": per_logit}


def _next_token_call(inputs, fixed) -> tuple:
    """Positions 0..T-2 against ids[1:]; the last position predicts nothing (no guard there:
    zero in the per-logit array)."""
    z = np.asarray(inputs["logits"])

    def to_inputs(per_row, absolute=False):
        full = np.zeros(z.shape)
        full[..., :-1, :] = per_row
        return {"logits": full}

    return _loss_rows(z[..., :-1, :], np.asarray(fixed["ids"])[..., 1:], fixed), to_inputs


def _linear_cross_entropy_call(inputs, fixed) -> tuple:
    """The logits x W + b in float64; a per-logit array carried through the linear map's
    backward to x, W and b (signed: exact, the map is linear)."""
    x, W, b = (None if v is None else np.asarray(v, dtype=np.float64)
               for v in (inputs["x"], inputs["W"], inputs.get("b")))

    def to_inputs(per_logit, absolute=False):
        xs, Ws = (np.abs(x), np.abs(W)) if absolute else (x, W)
        rows = np.broadcast_to(per_logit, xs.shape[:-1] + Ws.shape[1:]).reshape(-1, Ws.shape[1])
        return {"x": (rows @ Ws.T).reshape(xs.shape), "W": xs.reshape(-1, Ws.shape[0]).T @ rows,
                "b": None if b is None else rows.sum(axis=0)}

    logits = x @ W + (0.0 if b is None else b)
    return _loss_rows(logits, fixed["labels"], fixed), to_inputs


LOSS_CALLS: dict[str, Callable] = {"cross_entropy": _ce_call,
                                   "next_token_cross_entropy": _next_token_call,
                                   "linear_cross_entropy": _linear_cross_entropy_call}


def _label_terms(guards, inputs, fixed) -> tuple:
    """A loss of probabilities returning dL/dp (``input="probabilities"``): its dp lives at
    each kept position's label entry alone, -1/(d p_y) for the plain log, -factor/(d p_y) for
    the guarded one.  (p, labels, keep, 1/p_y, n, d, factor)."""
    p, labels, ignore_index, reduction = _loss_rows(inputs["logits"], fixed["labels"], fixed)
    lp, _, keep, n, d, factor = _ce_terms(guards, p, labels, ignore_index, reduction, True)
    return p, labels, keep, np.exp(-lp), n, d, factor


def _at_labels(shape, labels, keep, per_position) -> np.ndarray:
    """Zeros of ``shape`` but at each kept position's label entry, which holds that position's
    value of ``per_position``."""
    out = np.zeros(shape)
    np.put_along_axis(out, np.where(keep, labels, 0)[..., None], (per_position * keep)[..., None],
                      -1)
    return out


def _loss(row: str, guards, inputs, fixed, dout):
    """The loss guards of ``row``: the loss shift and, per differentiable input, the logits'
    allowance carried to it (in absolute values through a linear head).  A loss of
    probabilities returning dL/dp: dp within |guarded - unguarded| at each label entry, the
    unguarded dp_y = -1/(n p_y) scaled by the same deviation of the two forms as dlogits."""
    form = fixed.get("input", "logits")
    if form == "probabilities":
        p, labels, keep, inv_p, n, d, factor = _label_terms(guards, inputs, fixed)
        shift, _, why = cross_entropy_adjustment(guards, *_loss_rows(p, labels, fixed), dout,
                                                 probabilities=True)
        dev = np.maximum(np.abs(factor / d - 1 / n), abs(1 / d - 1 / n))
        return Adjustment(shift, {"logits": _at_labels(np.shape(p), labels, keep,
                                                       inv_p * dev * abs(float(dout)))}, why)
    # logits, or p with dL/dlogits returned (probabilities_dlogits): the same gradient, over z
    rows, to_inputs = LOSS_CALLS[row](inputs, fixed)
    shift, allow, why = cross_entropy_adjustment(guards, *rows, dout,
                                                 probabilities=form != "logits")
    return Adjustment(shift, to_inputs(allow, absolute=True), why)


def alternative_gradient(row: str, guards: Mapping, inputs: Mapping, fixed: Mapping,
                         dout=1.0) -> dict | None:
    """The other gradient ``row``'s declared loss guard allows (the plain log's), minus the
    guarded forward's exact derivative, per differentiable input; None when no log guard is
    declared on the row (minibert_spec.numerics.fdcheck tries the backward against finite
    differences with it taken away when the backward alone is red)."""
    declared = declared_on(row, guards)
    if row not in LOSS_CALLS or ce_guard(declared) is None:
        return None
    form = fixed.get("input", "logits")
    if form == "probabilities":  # dL/dp: -1/(d p_y) against -factor/(d p_y), at each label
        p, labels, keep, inv_p, _, d, factor = _label_terms(declared, inputs, fixed)
        return {"logits": _at_labels(np.shape(p), labels, keep,
                                     -(1 - factor) / d * inv_p * float(dout))}
    if form != "logits":  # p with dL/dlogits: the composed check passes z = log p as logits
        return None
    rows, to_inputs = LOSS_CALLS[row](inputs, fixed)
    return to_inputs(cross_entropy_plain_log_delta(declared, *rows, dout))


def _softmax(guards, inputs, fixed, dout):
    shift, allow, why = softmax_adjustment(guards, inputs["x"], fixed.get("mask"), dout)
    return Adjustment(shift, {"x": allow}, why)


# row -> its judge: (declared guards of the row, the forward's differentiable inputs, its other
# arguments, the upstream gradient) -> Adjustment or None.  The clip and adam rows are judged
# by their own checks (clipped_norm, adam_update_shift).
JUDGES: dict[str, Callable] = {**{row: functools.partial(_loss, row) for row in LOSS_CALLS},
                               "softmax": _softmax}


def adjustment(row: str, guards: Mapping, inputs: Mapping, fixed: Mapping,
               dout=1.0) -> Adjustment | None:
    """The declared guards of ``row`` (``guards``: CAPABILITIES["guards"]) on one call, by the
    row's judge; None when none applies."""
    declared = declared_on(row, guards)
    judge = JUDGES.get(row)
    if not declared or judge is None:
        return None
    adj = judge(declared, inputs, fixed, dout)
    return adj if adj is not None and adj.reason else None
