"""The ``block`` row of :mod:`minibert_spec.suite.infer` for a block written as a pair of
functions in the protocol's shape, ``block_forward(x, p, *, n_heads, ...)`` /
``block_backward(dout, cache)``: module-level functions paired by name, or attributes of a
module-level ``types.SimpleNamespace`` (only that plain type is opened: reading its attributes
runs no code of the user's), defined in the module itself.

A forward whose first two arguments are positional and which takes a head count is run once per
key set of ``p`` (:data:`KEY_FORMS`, the protocol's names) and compared with the reference's
``block_forward`` in every form of blocks.FORMS and RoPE convention (float64, blocks.BLOCK_RTOL):
the first equal one is the row.  A key it reads that is no protocol name means the key set
cannot be decided: no row.  Its protocol keywords (n_heads, mask, eps, rope_base) are found by
name; its mask gets the protocol's key mask, else the first converter of blocks.MASKS that
matches.  The backward is run once to see that it returns ``(dx, a dict)``: its gradients are
never compared, so that no bug of a backward is inferred away (minibert check judges them)."""

from __future__ import annotations

import inspect
import itertools
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from minibert_spec.suite.infer.backward import _roles
from minibert_spec.suite.infer.blocks import (
    BLOCK_RTOL,
    FORMS,
    HEAD_NAMES,
    INNER,
    MASK_NAMES,
    B,
    BlockMapping,
    H,
    T,
    _dev,
    _entries,
    _probe_p,
    _reference,
    first_mask,
    form_rows,
    key_mask,
    no_form,
)
from minibert_spec.suite.infer.probes import EPS_NAMES, PROTOCOL_EPS, one_line
from minibert_spec.suite.infer.subjects import pair_names

ROPES = (None, "interleaved", "half")  # the attention's RoPE: none, or a convention
# the probe's heads: two, so that a head has d_k = H / 2 = 4 dimensions -- with 2 (blocks'
# N_HEADS of 4), RoPE's interleaved pairs (0, 1) and its half-split pairs (0, 1) are one
N_HEADS = 2
# the key sets of p tried, in this order (a forward that ignores a key it is given computes
# another output: the next set is tried): block_param_names' keywords, and the CAPABILITIES
# entry a block of those keys needs
KEY_FORMS = (({}, {}),
             ({"ln_affine": False}, {"layernorm": {"affine": False}}),
             ({"W_o": False}, {"attention": {"W_o": False}}),
             ({"b_1": False, "b_2": False}, {"ffn": {"b_1": False, "b_2": False}}),
             ({"swiglu_bias": True}, {"swiglu": {"bias": True}}))
# the protocol keywords of block_forward passed on to the forward, by the names it may give
# them (in the protocol's order); its form keywords (norm, causal, ...) are not: the form found
# is fixed
KEYWORDS = {"n_heads": HEAD_NAMES, "mask": MASK_NAMES, "eps": EPS_NAMES,
            "rope_base": ("rope_base", "rope_theta")}


@dataclass
class FnBlockMapping(BlockMapping):
    """A block row of a function pair: its namespace (``owner``, "" for module-level), its
    names, and ``call``: protocol keyword -> the forward's own argument."""

    owner: str = ""
    fwd_name: str = ""
    bwd_name: str = ""
    call: dict = field(default_factory=dict)


@dataclass(frozen=True)
class _Pair:
    owner: str
    fwd_name: str
    bwd_name: str
    fwd: Callable
    bwd: Callable

    @property
    def label(self) -> str:
        where = f"{self.owner}." if self.owner else ""
        return f"{where}{self.fwd_name}, {where}{self.bwd_name}"


@dataclass
class _FnFound:
    form: dict
    names: tuple  # p's keys
    declares: dict  # what the key set needs declared
    dev: float
    returned: object  # what the forward returned on the probe


def _reads_as_block(fwd) -> dict | None:
    """{protocol keyword: the forward's argument} (``x`` and ``p``: its first two) where the
    forward may be a block's: two leading positional arguments and a head count; else None."""
    try:
        params = list(inspect.signature(fwd).parameters.values())
    except (TypeError, ValueError):
        return None
    positional = [q for q in params if q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2:
        return None
    named = {q.name: q for q in params[2:] if q.kind in (q.POSITIONAL_OR_KEYWORD, q.KEYWORD_ONLY)}
    call = {"x": positional[0].name, "p": positional[1].name}
    for keyword, spellings in KEYWORDS.items():
        own = next((n for n in spellings if n in named), None)
        if own is not None:
            call[keyword] = own
    return call if "n_heads" in call else None


def candidate_pairs(mod, functions) -> list[_Pair]:
    """The function pairs that may be a block's: of ``functions`` (paired by name), then of
    each module-level SimpleNamespace of ``mod``, in the module's order."""
    named = [("", {f.__name__: f for f in functions})]
    for owner, obj in vars(mod).items():
        if not owner.startswith("_") and type(obj) is types.SimpleNamespace:
            named.append((owner, {k: f for k, f in vars(obj).items() if inspect.isfunction(f)
                                  and f.__module__ in (mod.__name__, None)}))
    return [_Pair(owner, f, b, fns[f], fns[b]) for owner, fns in named
            for f, b in pair_names(fns)[0] if _reads_as_block(fns[f]) is not None]


def _rope_base() -> float:
    # the protocol's default, read from the reference's signature (never restated)
    from minibert_reference import block_forward

    return inspect.signature(block_forward).parameters["rope_base"].default


def _run(pair: _Pair, call: dict, p: dict, x, mask=None):
    """What the forward returns on ``x`` and a copy of ``p``, its protocol keywords given the
    probe's values (``mask`` its own mask, or None)."""
    given = {"n_heads": N_HEADS, "eps": PROTOCOL_EPS, "rope_base": _rope_base(), "mask": mask}
    return pair.fwd(x.copy(), {k: v.copy() for k, v in p.items()},
                    **{call[k]: v for k, v in given.items() if k in call})


def _search(pair: _Pair, call: dict) -> tuple[_FnFound | None, str]:
    """The first (key set, form) equal to the reference; else None and why."""
    from minibert_reference.ops import block_param_names
    from minibert_spec.protocol.table import OPS

    x = np.random.default_rng(1).standard_normal((B, T, H))
    outs: dict = {}  # p's keys -> the forward's output (None: it raised)
    closest, raised = (np.inf, None), ""
    for (variant, declares), norm, normalization, ffn in itertools.product(
            KEY_FORMS, FORMS["norm"], FORMS["normalization"], FORMS["ffn"]):
        form = {"norm": norm, "normalization": normalization, "ffn": ffn}
        names = block_param_names(norm=norm, normalization=normalization,
                                  ffn="swiglu" if ffn == "swiglu" else "mlp", **variant)
        if variant and names == _entries(form):  # the variant changes no key of this form
            continue
        p = _probe_p(names, INNER)
        if names not in outs:
            try:
                outs[names] = _run(pair, call, p, x)
            except KeyError as e:
                key = e.args[0] if e.args else None
                if key not in OPS["block"].params:
                    return None, (f"its forward reads p[{key!r}], no key of the protocol's "
                                  "block p (block_param_names): the key set cannot be decided; "
                                  "write the block row by hand")
                outs[names], raised = None, one_line(e)
            except Exception as e:  # noqa: BLE001 -- not this key set, or it does not run
                outs[names], raised = None, one_line(e)
        if outs[names] is None:
            continue
        for causal, rope in itertools.product(FORMS["causal"], ROPES):
            form = {**form, "causal": causal, "rope": rope}
            dev = _dev(outs[names], _reference(x, p, form, n_heads=N_HEADS))
            if dev <= BLOCK_RTOL:
                return _FnFound(form, names, declares, dev, outs[names]), ""
            if dev < closest[0]:
                closest = (dev, form)
    if closest[1] is None:
        return None, f"its forward raised {raised} on every key set of p tried"
    return None, no_form(closest, ", RoPE none/interleaved/half; p keyed by the protocol's "
                         "names", f" rope={closest[1]['rope']}")


def _mask(pair: _Pair, call: dict, found: _FnFound, x, p):
    """How the forward's mask argument is given the protocol's: ("", "") as it is, a converter
    of blocks.MASKS (name, source), or None (no mask argument, or no format matches)."""
    if "mask" not in call:
        return None
    key = key_mask()
    try:
        if _dev(_run(pair, call, p, x, key),
                _reference(x, p, found.form, key, n_heads=N_HEADS)) <= BLOCK_RTOL:
            return "", ""
    except Exception:  # noqa: BLE001 -- not the protocol's format
        pass
    return first_mask(lambda own: _run(pair, call, p, x, own), found.form, p, x, N_HEADS)


def _backward(pair: _Pair, call: dict, found: _FnFound, x, p) -> tuple[tuple, list[str], str]:
    """(``again``, evidence, why there is no row or ""): the backward's call by its parameters'
    names, run once; what it returns is looked at for its structure alone, never its values."""
    params = [q for q in inspect.signature(pair.bwd).parameters.values()
              if q.kind in (q.POSITIONAL_OR_KEYWORD, q.POSITIONAL_ONLY)]
    returned = found.returned
    cached = isinstance(returned, tuple) and len(returned) == 2
    again = _roles(params, {own: k for k, own in call.items()}, cached)
    shown = f"{pair.bwd_name}({', '.join(q.name for q in params)})"
    if again.count("dout") != 1:
        return again, [], (f"its backward {shown} takes "
                           f"{'no' if 'dout' not in again else 'more than one'} upstream "
                           "gradient I can tell")
    out = returned[0] if isinstance(returned, tuple) else returned
    dout = np.random.default_rng(2).standard_normal(np.shape(out))
    given = {"x": x, "p": p, "dout": dout, "out": out, "n_heads": N_HEADS, "eps": PROTOCOL_EPS,
             "mask": None, "rope_base": _rope_base(),
             "forward[1]": returned[1] if cached else None}
    try:
        back = pair.bwd(*(given[r] for r in again))
    except Exception as e:  # noqa: BLE001 -- its backward fails: say so, map nothing
        return again, [], f"its backward {shown} raised {one_line(e)}"
    if not (isinstance(back, tuple) and len(back) == 2 and isinstance(back[0], np.ndarray)
            and back[0].shape == x.shape and isinstance(back[1], Mapping)):
        what = type(back).__name__ + (f" of {len(back)}" if isinstance(back, tuple) else "")
        return again, [], (f"its backward {shown} returns a {what}: expected (dx, a dict of "
                           "the gradients keyed like p); write the block row by hand")
    evidence = [f"backward {shown}: again={again!r} (by the parameters' names); it returns (dx, "
                "a dict), passed on as the protocol's (dx, grads): no gradient is compared "
                "with anything here (minibert check judges them)"]
    lost, extra = sorted(set(p) - set(back[1])), sorted(set(back[1]) - set(p))
    if lost or extra:
        evidence.append(f"its grads' keys are not p's (missing {lost}, extra {extra}): "
                        "minibert check will say so")
    return again, evidence, ""


def _describe(form: dict, names: tuple, variant: dict) -> str:
    ffn = "swiglu" if form["ffn"] == "swiglu" else f"ffn activation {form['ffn']}"
    given = ", ".join(f"{k}={v}" for k, v in variant.items())
    keys = f"{len(names)} keys" + (f", block_param_names({given})" if variant else "")
    return (f"norm={form['norm']}, {form['normalization']}, {ffn}, causal={form['causal']}, "
            f"rope={form['rope']}, with p keyed by the protocol's names ({keys})")


def _mapping(pair: _Pair, call: dict, found: _FnFound) -> tuple[FnBlockMapping | None, str]:
    x = np.random.default_rng(1).standard_normal((B, T, H))
    p = _probe_p(found.names, INNER)
    mask = _mask(pair, call, found, x, p)
    again, back_evidence, why = _backward(pair, call, found, x, p)
    if why:
        return None, why
    converter = mask if mask and mask[0] else None
    fixed, declares = form_rows(found.form, converter)
    if found.form["rope"]:  # RoPE is the attention's option, reaching the block (also)
        fixed["rope"] = found.form["rope"]
        declares["attention"] = {"rope": found.form["rope"]}
    for op, options in found.declares.items():
        declares.setdefault(op, {}).update(options)
    inputs = tuple(k for k in ("x", "p", *KEYWORDS) if k in call and (k != "mask" or mask))
    m = FnBlockMapping("block", None, {}, owner=pair.owner, fwd_name=pair.fwd_name,
                       bwd_name=pair.bwd_name, call=call, fixed=fixed, declares=declares,
                       inputs=inputs, again=again if again != ("dout",) else (),
                       output=0 if isinstance(found.returned, tuple) else None)
    if converter:
        m.mask_name, m.mask_source = converter
        m.needs_numpy = True
    variant = next(v for v, d in KEY_FORMS if d == found.declares)
    kw = ", ".join(f"{call[k]}={k}" for k in inputs[2:])
    m.evidence.append(f"{pair.owner + '.' if pair.owner else ''}{pair.fwd_name}(x, p"
                      f"{', ' + kw if kw else ''}) equals the reference block_forward to "
                      f"{found.dev:.1e} (relative, float64) in the form "
                      f"{_describe(found.form, found.names, variant)}")
    if mask == ("", ""):
        m.evidence.append(f"its {call['mask']!r} takes the protocol's [B, T] key mask as it is "
                          "(its masked forward equals the reference's on a padded key)")
    elif converter:
        m.evidence.append(f"its {call['mask']!r}: {converter[0]} (its masked forward equals "
                          "the reference's on a padded key and on causal calls)")
    elif "mask" in call:
        m.evidence.append(f"its {call['mask']!r} is left at its default (none of the mask "
                          "formats tried matches): calls with a mask are not applicable")
    m.evidence += back_evidence
    return m, ""


def infer_function_blocks(mod, functions) -> tuple[list[FnBlockMapping], list[str], set]:
    """(the block row of the first pair of :func:`candidate_pairs` that maps, why each other
    is not, the names of the module-level forwards tried)."""
    rows: list[FnBlockMapping] = []
    why, tried = [], set()
    for pair in candidate_pairs(mod, functions):
        if not pair.owner:
            tried.add(pair.fwd_name)
        call = _reads_as_block(pair.fwd)
        found, reason = _search(pair, call)
        if found is not None and rows:
            rows[0].evidence.append(f"also a block: {pair.label}")
            continue
        if found is not None:
            m, reason = _mapping(pair, call, found)
            if m is not None:
                rows.append(m)
                continue
        why.append(f"block: functions {pair.label}: {reason}")
    return rows, why, tried
