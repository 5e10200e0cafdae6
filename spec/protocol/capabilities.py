"""What an implementation declares it does not support (``CAPABILITIES``), and the conventions it
may follow: the defaults, the one reader and validation of a declaration, and the rank adaptation
of the ops that act on the last axis alone.  The claims and variants themselves are declared in
:mod:`minibert_spec.protocol.variants`, the guards in :mod:`minibert_spec.protocol.guards`.

:func:`capabilities` is the only place a declaration is read.  It validates all of it -- its
type, every key and value against the tables (CLAIMS, VARIANTS, RANK_ADAPTABLE, GUARDS,
CONVENTIONS), and what the declared keyword options say against the code's own signatures --
before any check runs (the proxy reads it on construction, and so does each worker on loading):
a declaration the protocol cannot take is a :class:`DeclarationError`, never an op red.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import reprlib
from collections.abc import Mapping

import numpy as np

# the conventions an implementation may declare, and the warning that reports one
from minibert_spec.protocol.conventions import CONVENTIONS, ConventionWarning  # noqa: F401 (re-exported)
from minibert_spec.protocol.guards import EXCLUSIVE_GUARDS, GUARDS, guard_range
from minibert_spec.protocol.table import OPS, RANK_ADAPTABLE  # noqa: F401 (re-exported)
from minibert_spec.protocol.variants import (  # noqa: F401 (the declarations' vocabulary, re-exported)
    CLAIMS,
    VARIANTS,
    declared_variants,
    resolve_variant,
    unmet,
    variant_text,
)

# every claim is True unless declared False (the claims come from their table); "arrays": the
# array library it computes on, whose calls are converted from and to NumPy
# (spec/protocol/arrays.py)
DEFAULT_CAPABILITIES = {**dict.fromkeys(CLAIMS, True),
                        "ranks": {}, "conventions": (), "guards": {}, "arrays": "numpy"}
# The largest rank a declaration may give.  The protocol's tensors have rank <= 4 (attention
# scores [B, A, T, T]), and the suite reaches a declared rank r by padding an input with up to
# r - 1 leading axes of 1: 8 leaves room for layouts with extra leading axes (a batch of
# batches, beams), while (10**6,) -- a typo -- would ask NumPy for a million axes (its limit is
# 64) and end as an op red on correct code.
MAX_RANK = 8
_SEQUENCES = (tuple, list, set, frozenset)
# the combinations a decoder row was confirmed in (a recorded decoder: minibert adapter infer):
# where declared, the decoder's checks run each form in the first that has what it needs, never
# in a cross of them (minibert_spec.suite.checks.decoder.form_capabilities)
DECODER_FORMS = "decoder_forms"


class DeclarationError(ValueError):
    """A ``CAPABILITIES`` the protocol cannot take: one line naming the key, the value and what
    is accepted.  Raised before any check runs; every entry point stops on it (exit 2, a usage
    error), never judging the implementation with the defaults."""


def capabilities(impl) -> dict:
    """The implementation's CAPABILITIES (object, else its module) over the defaults, validated
    in full (a :class:`DeclarationError` otherwise).  Of a proxy (ImplProxy): those it read and
    validated when it wrapped the implementation (its ``_impl_caps``, which its adapters and
    the checks' n/a decisions already follow), not read again: ~3,000 reads per judging run at
    ~0.13 ms each.  The one dict: callers read it, never write it."""
    try:
        return object.__getattribute__(impl, "_impl_caps")
    except AttributeError:
        pass
    obj = _declaring_object(impl)
    declared = read_declaration(obj)
    caps = _validate(declared)
    _against_the_code(obj, declared, caps)
    return caps


def accepted(*key: str) -> str:
    """What ``CAPABILITIES[key[0]][key[1]]`` accepts, in words: the one text of a refusal and of
    ``minibert adapter new`` (generated from the tables, so a new claim, option, guard or
    rank-adaptable op is described without an edit here)."""
    if not key:
        return "a dict like {'key_mask': False} (or no CAPABILITIES at all: every default)"
    head, rest = key[0], key[1:]
    if head in CLAIMS:
        claim = CLAIMS[head]
        reached = [f"{op} {', '.join(names)}" for op, names in claim.pieces.items()]
        reached += [f"{op} {kw}=" for op, kw in claim.keywords.items()]
        return (f"True or False (False: no {claim.what}"
                + (f"; calls passing {'; '.join(reached)} are n/a" if reached else "") + ")")
    if head == DECODER_FORMS:
        return ("a tuple of dicts of claims and op options, each a combination of the declared "
                "values (the decoder is checked in these only), e.g. ({'decoder': {'position': "
                "'learned'}, 'attention_bias': True}, {'decoder': {'position': 'rope'}, "
                "'attention_bias': False})")
    if head == "ranks":
        if rest:
            lead = RANK_ADAPTABLE.get(rest[0], ("x",))[0]
            return (f"a tuple of integers in [1, {MAX_RANK}] (the ranks of {lead} that "
                    f"{rest[0]} accepts), e.g. (3,)")
        return (f"a dict {{op: tuple of ranks}} over ops among {list(RANK_ADAPTABLE)} (those "
                f"acting on the last axis alone: other ranks are reshaped to one declared), "
                f"ranks integers in [1, {MAX_RANK}], e.g. {{'linear': (3,)}}")
    if head == "conventions":
        return f"a tuple of names among {sorted(CONVENTIONS)}"
    if head == "arrays":
        return ("the import name of the array library it computes on ('numpy', 'torch', "
                "'array_api_strict', 'cupy', ...): its calls are converted from and to NumPy")
    if head == "guards":
        if rest:
            low, high = guard_range(rest[0])
            return f"a number in [{low:.3g}, {high:g}]"
        alone = "; ".join(f"at most one of {list(g)}" for g in EXCLUSIVE_GUARDS)
        return (f"a dict {{name: number}} of guards among {sorted(GUARDS)} ({alone}), e.g. "
                "{'log_eps': 1e-12}")
    options = VARIANTS[head]
    if rest:
        option = options[rest[0]]
        return (f"one value or a tuple of values among {list(option.values)}"
                + (", or one positive finite float alone: the value the code fixes it at, "
                   "e.g. 1e-06" if option.number is not None else ""))
    return f"a dict {{option: value or tuple of values}} of options among {sorted(options)}"


def _refuse(key: tuple, value, accepted_text: str | None = None) -> DeclarationError:
    where = "CAPABILITIES" + "".join(f"[{k!r}]" for k in key)
    return DeclarationError(f"{where}: expected {accepted_text or accepted(*key)}, got "
                            f"{_show(value)}")


def _show(value) -> str:
    """A value in a refusal: its repr, abbreviated, one line."""
    return " ".join(reprlib.repr(value).split())


# --------------------------------------------------------------------------- reading it
_ABSENT = object()


def read_declaration(obj):
    """``obj``'s CAPABILITIES, else its class's module's (an object of a class declared in an
    adapter module), else {}.  Reading it must not raise: a declaration found on the object or
    its class (a property) that raises -- AttributeError included, which getattr(obj, name,
    None) used to take for "absent" -- is a :class:`DeclarationError`; a module ``__getattr__``
    (or a class's) raising AttributeError says "no such attribute", as PEP 562 has it."""
    declared = _read(obj)
    if declared is _ABSENT and not inspect.ismodule(obj):
        module = inspect.getmodule(type(obj))
        if module is not None:
            declared = _read(module)
    return {} if declared is _ABSENT else declared


def _read(holder):
    static = inspect.getattr_static(holder, "CAPABILITIES", _ABSENT)
    hook = (vars(holder).get("__getattr__") if inspect.ismodule(holder)
            else inspect.getattr_static(type(holder), "__getattr__", None))
    if static is _ABSENT and hook is None:
        return _ABSENT
    try:
        return holder.CAPABILITIES
    except AttributeError as e:
        if static is _ABSENT:  # the __getattr__ hook: not there
            return _ABSENT
        error = e
    except Exception as e:  # noqa: BLE001 -- whatever the user's code raises, one line
        error = e
    text = " ".join(str(error).split())
    raise DeclarationError(f"CAPABILITIES: reading it raised {type(error).__name__}"
                           + (f": {text}" if text else "") + f"; expected {accepted()}")


# --------------------------------------------------------------------------- validating it
def _validate(declared) -> dict:
    if not isinstance(declared, Mapping):
        raise _refuse((), declared)
    reject_unknown("CAPABILITIES", "keys", declared,
                   [*DEFAULT_CAPABILITIES, DECODER_FORMS, *sorted(VARIANTS)])
    caps = {**DEFAULT_CAPABILITIES, **{k: v for k, v in declared.items() if k != DECODER_FORMS}}
    for claim in CLAIMS:
        if not isinstance(caps[claim], (bool, np.bool_)):
            raise _refuse((claim,), caps[claim])
        caps[claim] = bool(caps[claim])
    caps["ranks"] = _ranks(caps["ranks"])
    caps["conventions"] = _conventions(caps["conventions"])
    caps["guards"] = _guards(caps["guards"])
    if not (isinstance(caps["arrays"], str) and caps["arrays"]
            and all(part.isidentifier() for part in caps["arrays"].split("."))):
        raise _refuse(("arrays",), caps["arrays"])
    for op, options in VARIANTS.items():
        caps[op] = _variant_values(op, caps.get(op, {}), options)
    caps[DECODER_FORMS] = _decoder_forms(declared.get(DECODER_FORMS, ()), declared, caps)
    return caps


def _decoder_forms(forms, declared: Mapping, caps: dict) -> tuple:
    """CAPABILITIES["decoder_forms"]: each a narrowing of the declaration (claims and options
    only, each value among the declared ones), read as the declaration with those replaced --
    validated in full like it."""
    if not (isinstance(forms, (tuple, list)) and all(isinstance(f, Mapping) for f in forms)):
        raise _refuse((DECODER_FORMS,), forms)
    out = []
    for i, form in enumerate(forms):
        reject_unknown(f"CAPABILITIES[{DECODER_FORMS!r}][{i}]", "keys", form,
                       [*CLAIMS, *sorted(VARIANTS)])
        narrowed = _validate({**{k: v for k, v in declared.items() if k != DECODER_FORMS},
                              **{k: {**declared.get(k, {}), **v} if k in VARIANTS
                                 and isinstance(v, Mapping) else v for k, v in form.items()}})
        wider = [f"{k}={narrowed[k]}" for k in CLAIMS if narrowed[k] and not caps[k]] + [
            f"{op}.{name}={'|'.join(map(str, values))}" for op in VARIANTS
            for name, values in narrowed[op].items() if not set(values) <= set(caps[op][name])]
        if wider:  # a form the declaration does not have would be run (a false red, or green)
            raise DeclarationError(f"CAPABILITIES[{DECODER_FORMS!r}][{i}]: {wider[0]} is not "
                                   "declared: expected values among the declaration's own")
        out.append(narrowed)
    return tuple(out)


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _ranks(ranks) -> dict:
    """CAPABILITIES["ranks"]: {rank-adaptable op: tuple of ranks in [1, MAX_RANK]}, sorted."""
    if not isinstance(ranks, Mapping):
        raise _refuse(("ranks",), ranks)
    reject_unknown("CAPABILITIES['ranks']", "ops", ranks, list(RANK_ADAPTABLE))
    out = {}
    for op, rs in ranks.items():
        if not (isinstance(rs, _SEQUENCES) and rs
                and all(_is_int(r) and 1 <= r <= MAX_RANK for r in rs)):
            raise _refuse(("ranks", op), rs)
        out[op] = tuple(sorted({int(r) for r in rs}))
    return out


def _conventions(conventions) -> tuple:
    if not (isinstance(conventions, _SEQUENCES)
            and all(isinstance(c, str) for c in conventions)):
        raise _refuse(("conventions",), conventions)
    reject_unknown("CAPABILITIES['conventions']", "conventions", conventions, sorted(CONVENTIONS))
    return tuple(dict.fromkeys(conventions))


def _guards(guards) -> dict:
    """CAPABILITIES["guards"]: known guard names (spec/protocol/guards.py) to numbers within the
    range that is still a guard (guards.GUARD_RANGES), one of each group of exclusive guards."""
    if not isinstance(guards, Mapping):
        raise _refuse(("guards",), guards)
    reject_unknown("CAPABILITIES['guards']", "guards", guards, sorted(GUARDS))
    for group in EXCLUSIVE_GUARDS:
        both = [g for g in group if g in guards]
        if len(both) > 1:
            raise DeclarationError(
                f"CAPABILITIES['guards']: expected one of {list(group)} (each guards the same "
                f"formula, and code computes it one way), got {both} together")
    out = {}
    for name, v in guards.items():
        low, high = guard_range(name)
        if not (_numeric(v) and math.isfinite(v) and low <= v <= high):
            raise _refuse(("guards", name), v, f"{accepted('guards', name)} ({GUARDS[name]})")
        out[name] = float(v)
    return out


def declared_guards(impl) -> dict:
    """The numerical guards the implementation declares (CAPABILITIES["guards"])."""
    return dict(capabilities(impl)["guards"])


def reject_unknown(where: str, what: str, given, known: list) -> None:
    """A DeclarationError naming ``where`` and the unknown ``what`` when ``given`` holds names
    outside ``known`` (listed in the message in its order)."""
    unknown = sorted((k for k in given if k not in known), key=repr)
    if unknown:
        raise DeclarationError(f"{where}: unknown {what} {unknown}; expected some of {known}")


def _variant_values(op: str, declared, options: dict) -> dict:
    """{option: tuple of supported values} from an op's declaration (a value or a tuple)."""
    if not isinstance(declared, Mapping):
        raise _refuse((op,), declared)
    reject_unknown(f"CAPABILITIES[{op!r}]", "options", declared, sorted(options))
    out = {}
    for name, option in options.items():
        if name not in declared:  # the standard form alone (or the option's standard forms)
            out[name] = option.standard or (option.default,)
            continue
        v = declared[name]
        if option.number is not None and _numeric(v):
            out[name] = (_declared_number((op, name), v),)
            continue
        values = {_key(x) for x in (v if isinstance(v, _SEQUENCES) else (v,))}
        kept = tuple(a for a in option.values if _key(a) in values)  # in the table's order
        if len(kept) != len(values) or not values:
            raise _refuse((op, name), v)
        out[name] = kept
    return out


def _numeric(v) -> bool:
    """A declared value that means a number (a real that is no bool; a string or a tuple
    holding one is refused as no option's value)."""
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def _declared_number(key: tuple, v) -> float:
    """An option's declared number: a positive finite float (an integer is refused: 1 reads as
    True, 0 as False -- and eps = 0 is the option's False)."""
    if not (isinstance(v, (float, np.floating)) and math.isfinite(v) and v > 0):
        raise _refuse(key, v)
    return float(v)


def _key(x):
    """A declared value as the option's value it is: (type, value), so that 1 is not True nor
    0.0 False (a declaration says what it means); a NumPy bool is a bool; an unhashable value is
    no option's value."""
    if isinstance(x, np.bool_):
        x = bool(x)
    try:
        hash(x)
    except TypeError:
        return (type(x), id(x))
    return (type(x), x)


def _same(x, value) -> bool:
    return _key(x) == _key(value)


# --------------------------------------------------------------------------- against the code
def _against_the_code(obj, declared: Mapping, caps: dict) -> None:
    """A declared option selected by a keyword (causal=, norm=, input=) against the forward's
    own signature.  The suite leaves the keyword out of a call for an implementation declaring
    one form, and out of the calls for the standard form: code taking it with another default
    runs another form; the suite passes it to select among several forms: code without it
    fails every such call.  Either used to end as an op red on correct code (``causal: True``
    on an attention that takes ``causal=False``).  Code whose signature says nothing
    (``**kwargs``, unreadable) is taken as declared."""
    for op, options in VARIANTS.items():
        given = declared.get(op, {})
        for name, option in options.items():
            _against_the_pin(obj, op, name, option.argument, caps[op][name], name in given)
            pair = OPS[op].pair if option.argument and name in given else None
            if pair is None:
                continue
            forward, arg = pair[0], option.argument
            param = _keyword_of(obj, forward, arg)
            values = caps[op][name]
            if param is None or (param is False and len(values) == 1):
                continue  # nothing to tell, or one form without the keyword: always that form
            if param is False:
                raise DeclarationError(
                    f"CAPABILITIES[{op!r}][{name!r}]: got {_show(given[name])}, several forms, "
                    f"so the suite passes {arg}= to select one; but "
                    f"{forward} takes no {arg}= keyword: expected the one form the code has")
            # the form a call without the keyword asks for: the one declared, else the standard
            runs = values[0] if len(values) == 1 else option.default
            default = param.default
            if runs not in values:  # several forms, none standard: every call passes it
                continue
            if default is not param.empty and _same(default, runs):
                continue
            where = f"CAPABILITIES[{op!r}][{name!r}]: got {_show(given[name])}"
            has = "no default" if default is param.empty else f"{arg}={default!r} by default"
            if len(values) > 1:
                raise DeclarationError(
                    f"{where}; the suite leaves {arg}= out of the calls for the standard form "
                    f"{runs!r}, but {forward} takes {has}: expected code whose {arg}= defaults "
                    f"to {runs!r}")
            forms = tuple(x for x in option.values if x in values or _same(x, default))
            raise DeclarationError(
                f"{where}; the suite leaves {arg}= out of its calls for a single form, but "
                f"{forward} takes {has}: expected {forms!r} (code that takes {arg}=), or code "
                f"that is always {runs!r} without the keyword")


def _against_the_pin(obj, op: str, name: str, arg: str | None, values: tuple,
                     given: bool) -> None:
    """A class layer adapted with ``layer(..., fixed={arg: value})`` computes that one value:
    its forward's keyword defaults to it (a call leaving the keyword out is that form), so the
    declaration must be that one form -- another, or several, is refused naming both."""
    if not arg or OPS[op].pair is None:
        return
    try:
        spec = getattr(getattr(obj, OPS[op].pair[0]), "__minibert_layer__", None)
    except Exception:  # noqa: BLE001 -- absent: the checks say what they find
        return
    pinned = getattr(spec, "fixed", None) or {}
    if arg in pinned and not (len(values) == 1 and _same(values[0], pinned[arg])):
        raise DeclarationError(
            f"CAPABILITIES[{op!r}][{name!r}]: got {_show(values if len(values) > 1 else values[0])}"
            f"{'' if given else ' (the default: not declared)'}; "
            f"but {OPS[op].pair[0]} is a layer() with fixed={{{arg!r}: {pinned[arg]!r}}}: "
            f"expected CAPABILITIES[{op!r}][{name!r}] = {pinned[arg]!r}")


def _keyword_of(obj, function: str, keyword: str):
    """The parameter ``keyword`` of ``obj.<function>``: the inspect.Parameter, False when the
    function has no such keyword, None when that cannot be told (absent, unreadable signature,
    ``**kwargs``)."""
    try:
        fn = getattr(obj, function)
    except Exception:  # noqa: BLE001 -- absent: the checks say what they find
        return None
    try:  # capabilities() is read several times per check: a signature once per function
        return _keyword_param(fn, keyword)
    except TypeError:  # an unhashable callable
        return _keyword_param.__wrapped__(fn, keyword)


@functools.lru_cache(maxsize=256)
def _keyword_param(fn, keyword: str):
    try:
        params = inspect.signature(fn).parameters
    except Exception:  # noqa: BLE001 -- unreadable: taken as declared
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    p = params.get(keyword)
    if p is None or p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL):
        return False
    return p


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
    """Leading shape of rank r-1 for an accepted rank r: pad with 1s or merge leading axes
    (``ranks``: a validated declaration's, sorted integers in [1, MAX_RANK])."""
    if len(lead) + 1 in ranks:
        return None
    bigger = [r for r in ranks if r > len(lead) + 1]
    if bigger:
        return (1,) * (bigger[0] - 1 - len(lead)) + lead
    r = ranks[-1]
    keep = lead[len(lead) - (r - 2):] if r >= 2 else ()
    merged = int(np.prod(lead[:len(lead) - len(keep)], dtype=np.int64))
    return ((merged,) + tuple(keep)) if r >= 2 else ()

