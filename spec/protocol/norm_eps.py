"""A norm's eps as code fixes it: what a declared number is (``CAPABILITIES["layernorm"] =
{"eps": 1e-6}``), the eps each call passes for the declared form, the composites whose calls
carry a LayerNorm's eps, and the hint a LayerNorm red gives where the rows show a fixed eps.

The options themselves (``layernorm.eps``, ``rmsnorm.eps``) and the proxy layer that checks a
call against a fixed eps are in :mod:`minibert_spec.protocol.variants`, which imports this
module (never the other way round).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping

import numpy as np

from minibert_reference import ops
from minibert_spec.protocol.table import OPS


def is_number(value) -> bool:
    """A declared number: a float (True, False and integers are no numbers here: True and
    False are the options' own values, and 1 is not True)."""
    return isinstance(value, (float, np.floating))


# the ops whose calls carry a LayerNorm eps (keyword or positional ``eps``): LayerNorm itself and
# the composites built on it (a block with RMSNorm carries RMSNorm's: not reached)
LN_EPS_OPS = ("layernorm", "block", "embedding_ln", "mlm_head")


def eps_of(declared, eps: float | None) -> float | None:
    """The eps a LayerNorm call passes for the value of ``layernorm.eps`` it is checked in
    (resolve_variant's): ``eps`` (the check's own; None: drawn) with eps inside the root
    (True), 0 without eps (False), the number where the code fixes it -- both sides of every
    comparison then compute at the eps the code does."""
    if declared is True:
        return eps
    return 0.0 if declared is False else float(declared)


def pinned_eps(caps: dict, norm: str = "layernorm") -> float | None:
    """The eps of ``norm`` (layernorm, rmsnorm) the implementation declares fixed in its code
    (``CAPABILITIES = {"layernorm": {"eps": 1e-6}}``), else None."""
    declared = caps[norm]["eps"]
    return float(declared[0]) if is_number(declared[0]) else None


def with_pinned_eps(op: str, caps: dict, fixed: Mapping) -> Mapping:
    """A case's fixed arguments for ``op`` with the declared eps where the implementation
    fixes it and ``op``'s call carries a LayerNorm eps (a block of RMSNorms carries RMSNorm's);
    ``fixed`` itself otherwise.  A composite's case left at the protocol's default eps (an
    embedding LayerNorm called without eps) gets it passed."""
    c = pinned_eps(caps)
    if c is None or op not in LN_EPS_OPS or fixed.get("normalization",
                                                      "layernorm") != "layernorm":
        return fixed
    return {**fixed, "eps": c}


def with_pinned_config(caps: dict, config):
    """A model config (minibert_reference.config's dataclasses, ``ln_eps``) as code that fixes its
    LayerNorm eps runs it: ``ln_eps`` at the declared value (a config of RMSNorms keeps its
    own); ``config`` itself otherwise.  The model oracles build both sides from it."""
    c = pinned_eps(caps)
    if c is None or getattr(config, "normalization", "layernorm") != "layernorm":
        return config
    return dataclasses.replace(config, ln_eps=c)


def fixed_eps_hint(var, normalised_var) -> str:
    """The end of the red of a LayerNorm called with eps = 0 whose rows did not come back with
    variance 1: where every row came back with var / (var + c) for one c > 0 -- rows of
    different variances agreeing on c to 1% -- the code ignores eps and fixes it at c; how to
    declare that.  "" where the rows do not tell (one row, rows of one variance, no common
    c): another bug, not guessed at."""
    var = np.ravel(np.asarray(var, dtype=np.float64))
    got = np.ravel(np.asarray(normalised_var, dtype=np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        c = var * (1.0 / got - 1.0)  # got = var / (var + c)
    if var.size < 2 or not (np.all(np.isfinite(c)) and np.all(c > 0)) \
            or var.max() < 1.5 * var.min() or c.max() > 1.01 * c.min():
        return ""
    c0 = float(f"{float(np.median(c)):.2g}")
    return (f"; every row came back with variance var / (var + c), c = {c0:g}, from a call "
            f"with eps = 0: the code ignores eps and fixes it at {c0:g}? if so, declare it: "
            f"CAPABILITIES['layernorm'] = {{'eps': {c0!r}}}")


def _call_eps_value(op: str, args: tuple, kwargs: dict):
    """The eps a call of ``op``'s forward passes (keyword, or positional as the reference's
    signature has it; None where it leaves eps out: the code's own default)."""
    if "eps" in kwargs:
        return kwargs["eps"]
    try:
        bound = inspect.signature(getattr(ops, OPS[op].pair[0])).bind_partial(*args, **kwargs)
    except TypeError:
        return None
    return bound.arguments.get("eps")
