"""What an implementation declares it does not support (``CAPABILITIES``), and the conventions it
may follow: the defaults, the validation of a declaration, and the rank adaptation of the ops
that act on the last axis alone."""

from __future__ import annotations

import inspect

import numpy as np

DEFAULT_CAPABILITIES = {"attention_bias": True, "key_mask": True, "weight_decay": True,
                        "ranks": {}, "conventions": (), "guards": {}}
# conventions an implementation may declare (CAPABILITIES["conventions"])
CONVENTIONS = frozenset({"lr(0)=0"})
# ops that act on the last axis alone: any rank can be reshaped to one the implementation
# accepts; the names of their forward arguments (in protocol order) that carry the leading axes
RANK_ADAPTABLE = {"linear": ("x",), "layernorm": ("x",), "softmax": ("x", "mask"),
                  "relu": ("x",), "tanh": ("x",), "ffn": ("x",),
                  "cross_entropy": ("logits", "labels"), "mse": ("y_hat", "y"),
                  "linear_cross_entropy": ("x", "labels")}
FORWARD_ARGS = {"linear": ("x", "W", "b"), "layernorm": ("x", "gamma", "beta", "eps"),
                 "softmax": ("x", "mask"), "relu": ("x",), "tanh": ("x",),
                 "ffn": ("x", "W_1", "b_1", "W_2", "b_2"), "cross_entropy": ("logits", "labels"),
                 "mse": ("y_hat", "y"), "linear_cross_entropy": ("x", "W", "b", "labels")}


def capabilities(impl) -> dict:
    """The implementation's CAPABILITIES (object, else its module) over the defaults."""
    obj = object.__getattribute__(impl, "_impl_obj") if _is_proxy(impl) else impl
    declared = getattr(obj, "CAPABILITIES", None)
    if declared is None and not inspect.ismodule(obj):
        declared = getattr(inspect.getmodule(type(obj)), "CAPABILITIES", None)
    caps = {**DEFAULT_CAPABILITIES, **(declared or {})}
    unknown = sorted(set(caps) - set(DEFAULT_CAPABILITIES))
    if unknown:
        raise ValueError(f"CAPABILITIES: unknown keys {unknown}; expected some of "
                         f"{sorted(DEFAULT_CAPABILITIES)}")
    unknown = sorted(set(caps["conventions"]) - CONVENTIONS)
    if unknown:
        raise ValueError(f"CAPABILITIES: unknown conventions {unknown}; expected some of "
                         f"{sorted(CONVENTIONS)}")
    from spec.guards import validate_guards  # numerical guards: spec/guards.py (issue 23)

    validate_guards(caps["guards"])
    return caps


def not_claimed_message(label: str, what: str) -> str:
    return f"not applicable: {label} does not claim {what} (CAPABILITIES)"



def _is_proxy(impl) -> bool:
    from spec.protocol.proxy import ImplProxy

    return isinstance(impl, ImplProxy)


def target_lead(lead: tuple, ranks) -> tuple | None:
    """Leading shape of rank r-1 for an accepted rank r: pad with 1s or merge leading axes."""
    ranks = sorted(int(r) for r in ranks)
    if len(lead) + 1 in ranks:
        return None
    bigger = [r for r in ranks if r > len(lead) + 1]
    if bigger:
        return (1,) * (bigger[0] - 1 - len(lead)) + lead
    r = ranks[-1]
    if r < 1:
        raise ValueError(f"CAPABILITIES ranks: expected ranks >= 1, got {ranks}")
    keep = lead[len(lead) - (r - 2):] if r >= 2 else ()
    merged = int(np.prod(lead[:len(lead) - len(keep)], dtype=np.int64))
    return ((merged,) + tuple(keep)) if r >= 2 else ()

