"""Numerical guards an implementation may declare, and how the suite judges a guarded result.

A guard is a deliberate, tiny change of a formula that keeps it finite: torch's clipping divides
by ``norm + 1e-6``; many hand-written losses take ``log(p + 1e-12)`` or clip ``p`` at 1e-15.  A
correct implementation with a guard differs from the unguarded formula by an amount the guard
fixes, so it is judged against the *same* formula with the same guard -- never by widening a
tolerance for everyone.  Declared in ``CAPABILITIES["guards"]``::

    CAPABILITIES = {"guards": {"log_eps": 1e-12}}   # cross_entropy computes -log(p + 1e-12)

An undeclared guard stays a red, and the red names the guard it looks like (clipping: the eps
the measured factor implies).  NumPy only; the declaration is validated by
:func:`spec.protocol.capabilities.capabilities`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

# name -> what it declares (``minibert adapter new`` prints these)
GUARDS = {
    "clip_eps": "clip_by_global_norm without an eps keyword divides by norm + clip_eps (torch: "
                "1e-6); undeclared, the protocol's eps = 0 is expected",
    "log_eps": "cross_entropy computes -log(p + log_eps), p the softmax probability of the "
               "label (the loss is then >= -log(1 + log_eps), and capped at -log(log_eps))",
    "prob_clip": "cross_entropy computes -log(max(p, prob_clip)) (probabilities clipped below)",
}
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
# (spec.protocol.capabilities refuses a declaration outside it, naming the range)
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
    # max_norm / (norm + eps) leaves the clipped norm max_norm * norm / (norm + eps): short of
    # max_norm by eps / (norm + eps) < eps / max_norm, relative (clipping acts only when
    # norm > max_norm).  At max_norm = 1 (BERT's) eps <= 1e-4 keeps that within 1e-4, the
    # resolution the suite grants any float32 result (spec.tolerances.ORACLE_RTOL_F32): a larger
    # eps visibly changes every clipped step -- another clipping rule, not a guard against a zero
    # norm.  torch's own is 1e-6, 100x inside; 1e-3 is not a guard.
    "clip_eps": (MIN_GUARD, 1e-4),
}
# guards that change the same formula: an implementation computes one of them
CROSS_ENTROPY_GUARDS = ("log_eps", "prob_clip")
EXCLUSIVE_GUARDS = (CROSS_ENTROPY_GUARDS,)


def guard_range(name: str) -> tuple[float, float]:
    """(least, largest) value of the guard ``name`` that is still a guard."""
    return GUARD_RANGES.get(name, (MIN_GUARD, MAX_GUARD))


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
    """The one loss guard declared (log_eps or prob_clip), or None."""
    found = [k for k in CROSS_ENTROPY_GUARDS if k in guards]
    if len(found) > 1:
        raise ValueError("CAPABILITIES['guards']: declare log_eps or prob_clip, not both")
    return found[0] if found else None


def guarded_nll(logp: np.ndarray, guards: Mapping) -> np.ndarray:
    """-log p of the label under the declared guard, from float64 log-probabilities."""
    kind = ce_guard(guards)
    if kind == "log_eps":
        return -np.log(np.exp(logp) + guards["log_eps"])
    if kind == "prob_clip":
        return -np.maximum(logp, np.log(guards["prob_clip"]))
    return -logp


def guarded_grad_factor(p_label: np.ndarray, guards: Mapping) -> np.ndarray:
    """d(-guarded log p_y)/dz = factor * (p - onehot): the factor per position (1 unguarded)."""
    kind = ce_guard(guards)
    if kind == "log_eps":
        return p_label / (p_label + guards["log_eps"])
    if kind == "prob_clip":
        return (p_label >= guards["prob_clip"]).astype(np.float64)
    return np.ones_like(p_label)


def loss_floor(guards: Mapping) -> float:
    """The least value a guarded per-position loss can take: 0 unguarded; with log(p + eps) at
    p = 1, -log(fl(1 + eps)), where 1 + eps rounds to a float64 up to half a spacing at 1
    (2^-53) above: -(eps + 2^-52) covers it (measured: -log(1 + 1e-12) = -1.0000889e-12)."""
    if ce_guard(guards) != "log_eps":
        return 0.0
    return -(float(guards["log_eps"]) + float(np.finfo(np.float64).eps))


def cross_entropy_adjustment(guards: Mapping, logits, labels, ignore_index: int,
                             reduction: str, dloss: float = 1.0):
    """For a declared loss guard: (loss shift, dlogits allowance, reason).

    ``loss shift``: guarded loss - unguarded loss, in float64, independent of ``dloss`` (add it
    to an unguarded oracle: the oracle then computes the same guarded formula).  ``dlogits
    allowance``: per entry, |guarded gradient - unguarded gradient| (an implementation may
    differentiate either form; the guard fixes how far apart they are).
    (0, 0, "") without a guard."""
    if ce_guard(guards) is None:
        return 0.0, 0.0, ""
    z = np.asarray(logits, dtype=np.float64)
    logp = z - np.logaddexp.reduce(z, axis=-1, keepdims=True)
    keep = labels != ignore_index
    safe = np.where(keep, labels, 0)
    lp = np.take_along_axis(logp, safe[..., None], -1)[..., 0]
    n = max(int(keep.sum()), 1) if reduction == "mean" else 1
    shift = float(np.sum((guarded_nll(lp, guards) + lp) * keep) / n)
    g = np.exp(logp)
    np.put_along_axis(g, safe[..., None], np.take_along_axis(g, safe[..., None], -1) - 1, -1)
    factor = guarded_grad_factor(np.exp(lp), guards)
    allow = np.abs(g * ((1 - factor) * keep)[..., None]) * abs(float(dloss)) / n
    kind = ce_guard(guards)
    reason = (f"declared guard {kind}={guards[kind]:g}: the loss is compared with the same "
              f"guarded formula (shift {shift:+.1e}), dlogits within |guarded - unguarded| "
              f"gradient (<= {float(np.max(allow, initial=0)):.1e})")
    return shift, allow, reason
