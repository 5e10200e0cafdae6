"""What an implementation declares it does not support (``CAPABILITIES``), and the conventions it
may follow: the defaults, the validation of a declaration, and the rank adaptation of the ops
that act on the last axis alone.  The claims and variants themselves are declared in
:mod:`spec.protocol.variants`."""

from __future__ import annotations

import inspect
from collections.abc import Mapping

import numpy as np

from spec.protocol import arrays

# the conventions an implementation may declare, and the warning that reports one
from spec.protocol.conventions import CONVENTIONS, ConventionWarning  # noqa: F401 (re-exported)
from spec.protocol.guards import GUARDS, MAX_GUARD
from spec.protocol.variants import (  # noqa: F401 (the declarations' vocabulary, re-exported)
    CLAIMS,
    VARIANTS,
    declared_variants,
    resolve_variant,
    unmet,
    variant_text,
)

DEFAULT_CAPABILITIES = {"attention_bias": True, "key_mask": True, "weight_decay": True,
                        "ranks": {}, "conventions": (), "guards": {},
                        # the array library it computes on: its calls are converted from and to
                        # NumPy (spec/protocol/arrays.py)
                        "arrays": "numpy"}
# ops that act on the last axis alone: any rank can be reshaped to one the implementation
# accepts; the names of their forward arguments (in protocol order) that carry the leading axes
RANK_ADAPTABLE = {"linear": ("x",), "layernorm": ("x",), "softmax": ("x", "mask"),
                  "relu": ("x",), "tanh": ("x",), "ffn": ("x",),
                  "cross_entropy": ("logits", "labels"), "mse": ("y_hat", "y"),
                  "linear_cross_entropy": ("x", "labels")}



def capabilities(impl) -> dict:
    """The implementation's CAPABILITIES (object, else its module) over the defaults."""
    obj = _declaring_object(impl)
    declared = getattr(obj, "CAPABILITIES", None)
    if declared is None and not inspect.ismodule(obj):
        declared = getattr(inspect.getmodule(type(obj)), "CAPABILITIES", None)
    caps = {**DEFAULT_CAPABILITIES, **(declared or {})}
    reject_unknown("CAPABILITIES", "keys", caps,
                   sorted(DEFAULT_CAPABILITIES) + sorted(VARIANTS))
    reject_unknown("CAPABILITIES", "conventions", caps["conventions"], sorted(CONVENTIONS))
    _validate_guards(caps["guards"])
    arrays.validate(caps["arrays"])
    for op, options in VARIANTS.items():
        caps[op] = _variant_values(op, caps.get(op, {}), options)
    return caps


def _validate_guards(guards) -> None:
    """CAPABILITIES["guards"]: a dict of known guard names (spec/protocol/guards.py) to numbers
    in [0, MAX_GUARD]."""
    if not isinstance(guards, Mapping):
        raise ValueError(f"CAPABILITIES['guards']: expected a dict like {{'log_eps': 1e-12}}, "
                         f"got {guards!r}")
    reject_unknown("CAPABILITIES['guards']", "guards", guards, sorted(GUARDS))
    for k, v in guards.items():
        if not isinstance(v, (int, float)) or not 0 <= float(v) <= MAX_GUARD:
            raise ValueError(f"CAPABILITIES['guards'][{k!r}]: expected a number in "
                             f"[0, {MAX_GUARD:g}], got {v!r}")


def declared_guards(impl) -> dict:
    """The numerical guards the implementation declares (CAPABILITIES["guards"])."""
    return dict(capabilities(impl)["guards"])


def reject_unknown(where: str, what: str, given, known: list) -> None:
    """A ValueError naming ``where`` and the unknown ``what`` when ``given`` holds names outside
    ``known`` (listed in the message in its order)."""
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown {what} {unknown}; expected some of {known}")


def _variant_values(op: str, declared, options: dict) -> dict:
    """{option: tuple of supported values} from an op's declaration (a value or a tuple)."""
    if not isinstance(declared, Mapping):
        raise ValueError(f"CAPABILITIES[{op!r}]: expected a dict of options "
                         f"{sorted(options)}, got {declared!r}")
    reject_unknown(f"CAPABILITIES[{op!r}]", "options", declared, sorted(options))
    out = {}
    for name, option in options.items():
        v = declared.get(name, option.default)
        values = tuple(v) if isinstance(v, (tuple, list, set, frozenset)) else (v,)
        bad = [x for x in values if x not in option.values]
        if bad or not values:
            raise ValueError(f"CAPABILITIES[{op!r}][{name!r}]: expected values among "
                             f"{list(option.values)}, got {v!r}")
        out[name] = tuple(x for x in option.values if x in values)  # in the table's order
    return out


def not_claimed_message(label: str, what: str) -> str:
    return f"not applicable: {label} does not claim {what} (CAPABILITIES)"


def _declaring_object(impl):
    """The object whose CAPABILITIES count: the implementation a proxy wraps (ImplProxy keeps
    it in ``_impl_obj``, read past the proxy's own ``__getattribute__``), else ``impl``.  Read
    by name, so that this module needs nothing of the proxy's (which imports it)."""
    try:
        return object.__getattribute__(impl, "_impl_obj")
    except AttributeError:
        return impl


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

