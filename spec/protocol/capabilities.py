"""What an implementation declares it does not support (``CAPABILITIES``), and the conventions it
may follow: the defaults, the validation of a declaration, and the rank adaptation of the ops
that act on the last axis alone."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from spec.protocol.guards import GUARDS, MAX_GUARD

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


# --------------------------------------------------------------------------- variants
@dataclass(frozen=True)
class Option:
    """One variant option of an op: its values (the first is the protocol's standard form),
    what each value means (the verdict prints it), and how the suite reaches it: ``argument``
    names the forward's keyword that selects it (passed to an implementation that declares
    several values, left out for one that declares a single one), None where the checks pass
    None for an absent input (a piece the implementation lacks) or the proxy adapts the call."""

    values: tuple
    meaning: Mapping
    argument: str | None = None

    @property
    def default(self):
        return self.values[0]


# op -> option -> Option.  An implementation declares the values it supports under its op's
# name in CAPABILITIES (one value or a tuple); an undeclared option supports its default only.
VARIANTS: dict[str, dict[str, Option]] = {
    "layernorm": {
        "affine": Option((True, False), {True: "with gamma and beta",
                                         False: "without gamma/beta: the suite passes None "
                                                "for both and expects None gradients"}),
        "eps": Option((True, False), {True: "with eps inside the square root",
                                      False: "without eps: the suite passes eps=0 (rows are "
                                             "kept away from constant)"}),
    },
    "ffn": {
        "b_2": Option((True, False), {True: "with b_2",
                                      False: "without b_2: the suite passes b_2=None and "
                                             "expects db_2 None"}),
    },
    "attention": {
        "W_o": Option((True, False), {True: "with the output projection W_o",
                                      False: "without W_o: y = merge(C); the suite passes "
                                             "W_o=None, b_o=None and expects None gradients"}),
        "causal": Option((False, True), {False: "bidirectional", True: "causal: position i "
                                         "attends keys j <= i"}, argument="causal"),
        "heads": Option(("fused", "per_head"),
                        {"fused": "W_q, W_k, W_v, W_o [H, H] (head a owns columns a*d_k..)",
                         "per_head": "per-head projections: W_q, W_k, W_v [A, H, d_k], b_q.. "
                                     "[A, d_k], W_o [A, d_k, H] (the suite converts the "
                                     "protocol's [H, H] and back; FD indices stay [H, H])"}),
    },
    "block": {
        "norm": Option(("post", "pre", "pre_final"),
                       {"post": "post-LN (BERT): LN2(h + FFN(h)), h = LN1(x + MHA(x))",
                        "pre": "pre-LN (GPT-2): h + FFN(LN2(h)), h = x + MHA(LN1(x))",
                        "pre_final": "pre-LN followed by its final LayerNorm LN_f (p has "
                                     "ln_f.gamma, ln_f.beta)"}, argument="norm"),
        "causal": Option((False, True), {False: "bidirectional attention",
                                         True: "causal attention"}, argument="causal"),
    },
    "cross_entropy": {
        "ignore_index": Option((True, False), {
            True: "labels may hold ignore_index",
            False: "without ignore_index: it takes the predicted rows only; checked on "
                   "gathered rows in both layouts [N, V] and [1, N, V]"}),
        "input": Option(("logits", "probabilities", "probabilities_dlogits"), {
            "logits": "logits in",
            "probabilities": "softmax output in, dL/dp out: checked alone and composed with "
                             "the protocol's softmax",
            "probabilities_dlogits": "softmax output in, the logit gradient of softmax + CE "
                                     "out: checked alone and as the composed loss of logits"},
            argument="input"),
    },
}


def capabilities(impl) -> dict:
    """The implementation's CAPABILITIES (object, else its module) over the defaults."""
    obj = object.__getattribute__(impl, "_impl_obj") if _is_proxy(impl) else impl
    declared = getattr(obj, "CAPABILITIES", None)
    if declared is None and not inspect.ismodule(obj):
        declared = getattr(inspect.getmodule(type(obj)), "CAPABILITIES", None)
    caps = {**DEFAULT_CAPABILITIES, **(declared or {})}
    reject_unknown("CAPABILITIES", "keys", caps,
                   sorted(DEFAULT_CAPABILITIES) + sorted(VARIANTS))
    reject_unknown("CAPABILITIES", "conventions", caps["conventions"], sorted(CONVENTIONS))
    _validate_guards(caps["guards"])
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


class ConventionWarning(UserWarning):
    """A documented convention the implementation follows (lr(0) = 0, a float64 loss, a
    divisor guard): not a failure; the report lists it with the number it changes."""


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


def supports(caps: dict, op: str, option: str, value) -> bool:
    return value in caps[op][option]


def resolve_variant(caps: dict, op: str, fixed: Mapping | None = None) -> dict:
    """Every option of ``op`` for one check: the ``fixed`` values it is about, the others at
    the implementation's standard form where it supports it, else its first declared value.
    Raises LookupError naming what the implementation does not declare."""
    fixed = dict(fixed or {})
    out = {}
    for name, option in VARIANTS[op].items():
        values = caps[op][name]
        if name in fixed:
            if fixed[name] not in values:
                raise LookupError(variant_text(op, name, fixed[name]))
            out[name] = fixed[name]
        else:
            out[name] = option.default if option.default in values else values[0]
    return out


def variant_text(op: str, option: str, value) -> str:
    """What one option's value means, for a verdict: "layernorm without gamma/beta..."."""
    return f"{op} {VARIANTS[op][option].meaning[value]}"


# capabilities that are claims, not variants: what a check needing them says when unmet
_CLAIMS = {"attention_bias": "attention_bias (an attention with biases)",
           "key_mask": "key_mask (a masked attention)",
           "weight_decay": "weight_decay (AdamW)"}


def unmet(caps: dict, needs: Mapping) -> str | None:
    """The first of a check's ``needs`` the implementation does not declare, in words (None:
    all met).  ``needs`` maps a claim ("key_mask") to True, or "op.option" to a value."""
    for key, value in needs.items():
        if key in _CLAIMS:
            if value and not caps[key]:
                return _CLAIMS[key]
            continue
        op, option = key.split(".")
        if value not in caps[op][option]:
            declared = "|".join(map(str, caps[op][option]))
            return f"{variant_text(op, option, value)} (it declares {op}.{option}={declared})"
    return None


def declared_variants(caps: dict) -> dict[str, list[str]]:
    """op -> what each option declared without its standard form changes (the verdict's
    convention lines; an implementation that also has the standard form is checked in both)."""
    out: dict[str, list[str]] = {}
    for op, options in VARIANTS.items():
        for name, option in options.items():
            values = caps[op][name]
            if option.default not in values:  # it lacks the standard form: say what it has
                out.setdefault(op, []).append(
                    f"variant {op}.{name}={'|'.join(map(str, values))}: "
                    + "; ".join(option.meaning[v] for v in values if v != option.default))
    return out


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

