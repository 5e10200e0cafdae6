"""The ``block`` row of :mod:`minibert_spec.suite.infer`: a transformer block class
(``x [B, T, H] -> [B, T, H]``).  A block holds too many parameters of one shape to try every
placement as the per-op probes do, so each is placed by *name*: an array attribute whose path
reads as a group and a parameter of the protocol's (``ln_1_g``, ``attn_wq``, ``mlp_w_fc``), of
the entry's shape or the transposed one.  Each placement is run in every form of the
reference's ``block_forward`` and kept only where the output equals it (float64,
:data:`BLOCK_RTOL`): the one numeric evidence.  Gradients are mapped by shape and name after
one backward, never by value.  A forward's own mask argument gets the first of :data:`MASKS`
whose masked forward equals the reference's (padding and causal), else masked calls are n/a."""

from __future__ import annotations

import inspect
import itertools
import re
from dataclasses import dataclass

import numpy as np

from minibert_spec.suite.infer.backward import _grad_candidates, read_conventions
from minibert_spec.suite.infer.probes import (
    BACKWARDS,
    EPS_NAMES,
    FORWARDS,
    GRAD_DEPTH,
    PROTOCOL_EPS,
    Mapping_,
    deviation,
    one_line,
)
from minibert_spec.suite.infer.subjects import ClassLayer, _arrays, _method

# the probe: B, T, H, n_heads and the FFN's inner size all distinct, so a size names its axis
B, T, H, N_HEADS, INNER = 2, 3, 8, 4, 12
# the class's output must equal the reference's to this (float64): tight, so that a norm's
# eps fixed in the code (1e-5 against the protocol's 1e-12) is a different form, not a match
BLOCK_RTOL = 1e-9
FORMS = {"norm": ("post", "pre", "pre_final", "inner"),
         "normalization": ("layernorm", "rmsnorm"), "causal": (False, True),
         "ffn": ("relu", "gelu", "gelu_tanh", "relu2", "swiglu")}  # an MLP's activations, SwiGLU
HEAD_NAMES = ("n_heads", "n_head", "num_heads", "nhead", "nheads", "heads", "num_attention_heads")
RNG_NAMES = ("rng", "generator", "random_state", "rs")
SEED_NAMES = ("seed",)
MASK_NAMES = ("mask", "attn_mask", "attention_mask", "key_padding_mask", "padding_mask")

# how an attribute path may spell a group of the block's p and a parameter of it (lower case,
# "_" and "." removed): the path reads as one group spelling followed by one parameter spelling
GROUPS = {"attn": ("attn", "attention", "att", "selfattn", "mha", "sa", ""),
          "ln1": ("ln1", "norm1", "layernorm1", "lnattn", "attnnorm", "inputlayernorm"),
          "ln2": ("ln2", "norm2", "layernorm2", "lnmlp", "mlpnorm", "lnffn", "ffnnorm",
                  "postattentionlayernorm"),
          "ln_f": ("lnf", "normf", "finalnorm", "lnfinal"),
          "ffn": ("ffn", "mlp", "ff", "feedforward", ""),
          "swiglu": ("swiglu", "ffn", "mlp", "ff", "feedforward", "")}


def _proj(letter: str, word: str) -> tuple[str, ...]:
    return (f"w{letter}", letter, f"{letter}w", word, f"{letter}weight", f"{word}weight",
            f"{letter}proj", f"{letter}projweight", f"w{word}")


def _bias(letter: str, word: str) -> tuple[str, ...]:
    return (f"b{letter}", f"{letter}b", f"{letter}bias", f"{word}bias", f"{letter}projbias",
            f"b{word}")


PARAMS = {"attn": {"W_q": _proj("q", "query"), "W_k": _proj("k", "key"),
                   "W_v": _proj("v", "value"), "W_o": _proj("o", "out") + ("wproj", "outproj"),
                   "b_q": _bias("q", "query"), "b_k": _bias("k", "key"),
                   "b_v": _bias("v", "value"), "b_o": _bias("o", "out") + ("bproj", "projbias")},
          "ln": {"gamma": ("gamma", "g", "weight", "w", "scale"), "beta": ("beta", "b", "bias")},
          "ffn": {"W_1": ("w1", "wfc", "fc1", "fc1weight", "cfc", "cfcweight", "win", "wup",
                          "linear1", "linear1weight", "lin1"),
                  "b_1": ("b1", "bfc", "fc1bias", "cfcbias", "bin", "bup", "linear1bias"),
                  "W_2": ("w2", "wproj", "fc2", "fc2weight", "cproj", "cprojweight", "wout",
                          "wdown", "linear2", "linear2weight", "lin2"),
                  "b_2": ("b2", "bproj", "fc2bias", "cprojbias", "bout", "bdown",
                          "linear2bias")},
          "swiglu": {"W_1": ("w1", "wgate", "gate", "gateproj", "gateprojweight"),
                     "W_3": ("w3", "wup", "up", "upproj", "upprojweight"),
                     "W_2": ("w2", "wdown", "down", "downproj", "downprojweight")}}

# the mask formats tried for a forward's own mask argument: (name, source); the source is
# written into the adapter as it is, and compiled here to be tried (so what is tried is what
# is written)
_MASK_BODY = """\
    keep = np.tril(np.ones((T, T), bool)) if causal else np.ones((T, T), bool)
    if mask is not None:
        keep = keep & (np.asarray(mask) != 0)[:, None, None, :]
"""
MASKS = tuple(
    (sig.partition("(")[0], f'def {sig}:\n    """[B, 1, T, T]{doc}"""\n{_MASK_BODY}'
     f"    return {value}[(None,) * (4 - keep.ndim)]\n")
    for sig, doc, value in (
        ("additive_mask(mask, causal, T, dtype)",
         ": 0 where a query may attend a key, -1e9 elsewhere.",
         "np.where(keep, 0.0, -1e9).astype(dtype)"),
        ("keep_mask(mask, causal, T)", " booleans: True where a query may attend a key.", "keep"),
        ("masked_out(mask, causal, T)", " booleans: True where a query may NOT attend a key.",
         "~keep")))


@dataclass
class BlockMapping(Mapping_):
    """A block row: the constructor's source, the mask converter's (if any)."""

    new_source: str = ""
    mask_source: str = ""  # the converter's def, written before the layer() call
    mask_name: str = ""
    needs_numpy: bool = False


def _norm(path: str) -> str:
    return re.sub(r"[._\[\]]", "", path.lower())


def _entry_names(entry: str) -> set[str]:
    """The spellings of a block's p entry (``attn.W_q``) an attribute path may have."""
    group, param = entry.split(".")
    kind = "ln" if group.startswith("ln") else group
    return {g + q for g in GROUPS[group] for q in PARAMS[kind].get(param, ())}


def _entries(form: dict) -> tuple[str, ...]:
    from minibert_reference.ops import block_param_names

    return block_param_names(norm=form["norm"], normalization=form["normalization"],
                             ffn="swiglu" if form["ffn"] == "swiglu" else "mlp")


def _placement(arrays: dict, entries, inner: int, square_t: bool):
    """({entry: path}, transposed entries): each entry at the one array its spelling names, of
    its shape or transposed; None when one names several, or a weight is named by none."""
    from minibert_reference.ops import block_param_shapes

    shapes = block_param_shapes(entries, H, inner)
    placed, transposed = {}, []
    for e in entries:
        shape = shapes[e]
        names = _entry_names(e)
        hits = [p for p, a in arrays.items() if _norm(p) in names and a.shape in
                (shape, shape[::-1])]
        if len(hits) > 1:
            return None
        if not hits:
            if ".b_" in e or e == "attn.W_o":  # a part without biases (or W_o): fewer keys
                continue
            return None
        placed[e] = hits[0]
        a_shape = arrays[hits[0]].shape
        if (len(shape) == 2 and a_shape != shape) or (square_t and e.startswith("attn.W")):
            transposed.append(e)
    return placed, tuple(transposed)


@dataclass
class _Build:
    cls: type
    kwargs: dict  # the constructor's arguments on the probe
    exprs: dict  # each argument's expression in the adapter (protocol arguments)


def _builds(cls):
    """Ways to build the class: n_heads, an rng or seed, an eps by name; the other sizes
    drawn from H, the inner size and n_heads (each naming its axis)."""
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):
        return
    fixed, exprs, sized = {}, {}, []
    for p in sig.parameters.values():
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            continue
        n = p.name.lower()
        if n in HEAD_NAMES:
            fixed[p.name], exprs[p.name] = N_HEADS, "n_heads"
        elif n in RNG_NAMES:  # weights drawn at construction are overwritten by params
            fixed[p.name], exprs[p.name] = np.random.default_rng(0), "np.random.default_rng(0)"
        elif n in SEED_NAMES:
            fixed[p.name], exprs[p.name] = 0, "0"
        elif n in EPS_NAMES:
            fixed[p.name], exprs[p.name] = PROTOCOL_EPS, "eps"
        elif p.default is p.empty:
            sized.append(p.name)
    if len(sized) > 3:
        return
    for combo in itertools.product((H, INNER, N_HEADS), repeat=len(sized)):
        kw = dict(zip(sized, combo))
        yield _Build(cls, {**fixed, **kw}, {**exprs, **{k: _size_expr(v) for k, v in kw.items()}})


def _size_expr(size: int) -> str:
    # INNER's expression is fixed once the FFN's entries are known (_inner_expr)
    return {H: "x.shape[-1]", N_HEADS: "n_heads", INNER: "INNER"}[size]


def _inner(arrays: dict) -> int:
    """The FFN's inner size the class built: the other axis of its [H, I] / [I, H] weights."""
    sizes = [s for a in arrays.values() if a.ndim == 2 and H in a.shape and a.shape != (H, H)
             for s in a.shape if s != H]
    return max(set(sizes), key=sizes.count) if sizes else INNER


def _probe_p(entries, inner: int, seed: int = 0) -> dict:
    from minibert_reference.ops import block_param_shapes

    rng = np.random.default_rng(seed)
    p = {}
    for e, s in block_param_shapes(entries, H, inner).items():
        v = rng.standard_normal(s)
        p[e] = 1 + 0.5 * v if e.endswith("gamma") else v / np.sqrt(s[0]) if len(s) == 2 else v
    return p


def _reference(x, p, form, mask=None, causal=None, n_heads=N_HEADS):
    """The reference block's output in ``form`` (its ``rope``, where the form has one: the
    function pairs' search, fnblocks.py, on heads of its own size)."""
    from minibert_reference import block_forward

    ffn = form["ffn"]
    return block_forward(x, p, n_heads=n_heads, eps=PROTOCOL_EPS, mask=mask,
                         causal=form["causal"] if causal is None else causal, norm=form["norm"],
                         normalization=form["normalization"],
                         ffn="swiglu" if ffn == "swiglu" else "mlp",
                         activation="relu" if ffn == "swiglu" else ffn, rope=form.get("rope"))[0]


def _dev(got, want) -> float:
    """The forward's output (item 0 of a tuple) against ``want``: inf where it is no array."""
    got = got[0] if isinstance(got, tuple) and got else got
    return deviation(got, want) if isinstance(got, np.ndarray) else np.inf


def _run(build: _Build, placed: dict, transposed, p: dict, x, *args):
    """(what the forward returned, the object) with ``p`` placed on a fresh object."""
    from minibert_spec.suite.adapters import set_path

    obj = build.cls(**build.kwargs)
    for e, path in placed.items():
        set_path(obj, path, p[e].T.copy() if e in transposed else p[e].copy())
    return getattr(obj, _method(build.cls, FORWARDS))(x.copy(), *args), obj


@dataclass
class _Found:
    build: _Build
    form: dict
    placed: dict
    transposed: tuple
    inner: int
    dev: float


def _search(cls) -> tuple[_Found | None, str]:
    """The first (build, form, placement) equal to the reference; else None and why."""
    x = np.random.default_rng(1).standard_normal((B, T, H))
    closest, placed_any, raised = (np.inf, None), False, ""
    for build in _builds(cls):
        try:
            arrays = _arrays(build.cls(**build.kwargs), GRAD_DEPTH)
        except Exception:  # noqa: BLE001 -- these sizes do not build it
            continue
        inner = _inner(arrays)
        for square_t, norm, normalization, ffn in itertools.product(
                (False, True), FORMS["norm"], FORMS["normalization"], FORMS["ffn"]):
            form = {"norm": norm, "normalization": normalization, "ffn": ffn}
            got = _placement(arrays, _entries(form), inner, square_t)
            if got is None:
                continue
            placed, transposed = got
            placed_any = True
            p = {e: v for e, v in _probe_p(_entries(form), inner).items() if e in placed}
            for causal in FORMS["causal"]:
                form = {**form, "causal": causal}
                try:
                    want = _reference(x, p, form)
                    out, _ = _run(build, placed, transposed, p, x)
                except Exception as e:  # noqa: BLE001 -- not this form, or it does not run
                    raised = one_line(e)
                    continue
                dev = _dev(out, want)
                if dev <= BLOCK_RTOL:
                    return _Found(build, form, placed, transposed, inner, dev), ""
                if dev < closest[0]:
                    closest = (dev, form)
    if not placed_any:
        return None, ""
    if closest[1] is None:
        hint = ("; a mask argument without a default? write the block row and its mask "
                "converter by hand") if "required positional argument" in raised else ""
        return None, f"no block form of its parameters runs (its forward raised {raised}{hint})"
    return None, no_form(closest)


def no_form(closest: tuple, tried: str = "", shown: str = "") -> str:
    """Why no block form matched: the forms tried (and ``tried``), the closest (and ``shown``)."""
    dev, f = closest
    return (f"its forward equals no block form tried (norm {'/'.join(FORMS['norm'])}, "
            f"LayerNorm/RMSNorm, ffn {'/'.join(FORMS['ffn'])}, causal or not{tried}): closest "
            f"norm={f['norm']} {f['normalization']} {f['ffn']} causal={f['causal']}{shown}, "
            f"relative deviation {dev:.1e}")


def _grad_aliases(path: str) -> set[str]:
    """The spellings of the gradient of the parameter at ``path``: ``d`` or ``grad`` before
    its last part, ``grad`` after it, or a ``grad(s)`` object holding it."""
    *head, last = path.split(".")
    h, last = _norm(".".join(head)), _norm(last)
    return {h + "d" + last, h + "grad" + last, h + last + "grad", h + "grads" + last,
            "grads" + h + last, "d" + h + last}


def _grads(build, found: _Found, x, mask_args) -> tuple[dict, list[str], object]:
    """({entry: gradient path}, what could not be mapped, the object) after one backward on
    dout; by shape, ties broken by the parameter's path spelled as a gradient."""
    p = {e: v for e, v in _probe_p(_entries(found.form), found.inner).items()
         if e in found.placed}
    returned, obj = _run(build, found.placed, found.transposed, p, x, *mask_args)
    before = _arrays(obj, GRAD_DEPTH + 1)
    bwd = getattr(obj, _method(build.cls, BACKWARDS))
    dout = np.random.default_rng(2).standard_normal((B, T, H))
    back = bwd(dout)
    after = _arrays(obj, GRAD_DEPTH + 1)
    changed = {q: a for q, a in after.items() if q not in found.placed.values()
               and (q not in before or before[q] is not a)}
    grads, missing = {}, []
    for e, path in found.placed.items():
        cands = _grad_candidates(changed, back, after[path].shape)
        if len(cands) > 1:
            aliases = _grad_aliases(path) | {_norm(e)}
            cands = [c for c in cands if _norm(re.sub(r"^return\[1\]", "", c)) in aliases]
        if len(cands) == 1:
            grads[e] = cands[0]
        else:
            missing.append(f"block: the gradient of {e} (at .{path}): {len(cands)} candidates")
    return grads, missing, obj


def _compile_mask(source: str):
    scope = {"np": np}
    exec(source, scope)  # noqa: S102 -- our own converter's source, from MASKS
    return next(v for k, v in scope.items() if k != "np" and callable(v))


def _mask(build, found: _Found, x) -> tuple[str, str] | None:
    """(name, source) of the first MASKS converter equal to the reference's, or None."""
    fwd = inspect.signature(getattr(build.cls, _method(build.cls, FORWARDS)))
    if len(fwd.parameters) < 3 or list(fwd.parameters)[2] not in MASK_NAMES:
        return None
    p = {e: v for e, v in _probe_p(_entries(found.form), found.inner).items()
         if e in found.placed}
    return first_mask(lambda own: _run(build, found.placed, found.transposed, p, x, own)[0],
                      found.form, p, x)


def key_mask() -> np.ndarray:
    """The protocol's key mask on the probe: the first sequence's last key padded."""
    key = np.ones((B, T), np.int64)
    key[0, -1] = 0
    return key


def first_mask(run, form: dict, p: dict, x, n_heads: int = N_HEADS) -> tuple[str, str] | None:
    """(name, source) of the first converter of MASKS under which ``run`` (the forward given
    its own mask) equals the reference's on a padded key -- and, for a form that is not causal,
    on causal calls too (a mask that builds the triangle) -- or None."""
    key = key_mask()
    cases = [(key, form["causal"])] + ([(None, True), (key, True)] if not form["causal"]
                                       else [])
    for name, source in MASKS:
        try:
            if all(_dev(run(converted(source, m, c, x)),
                        _reference(x, p, form, m, c, n_heads)) <= BLOCK_RTOL for m, c in cases):
                return name, source
        except Exception:  # noqa: BLE001 -- not this format
            continue
    return None


def converted(source: str, mask, causal: bool, x):
    """The converter of ``source`` (MASKS) applied to the protocol's key ``mask`` (None: the
    unmasked call) and ``causal``: the forward's own mask, as the adapter will pass it."""
    conv = _compile_mask(source)
    kw = inspect.signature(conv).parameters
    return conv(**{k: v for k, v in {"mask": mask, "causal": causal, "T": T,
                                     "dtype": x.dtype}.items() if k in kw})


def form_rows(form: dict, mask: tuple[str, str] | None) -> tuple[dict, dict]:
    """(layer()'s ``fixed``, the ``CAPABILITIES`` entries) of a block found in ``form``, its
    mask converted by ``mask`` (MASKS' (name, source), or None): the form computed is fixed and
    declared; causal is left free only where the converter builds the triangle itself."""
    ffn = "swiglu" if form["ffn"] == "swiglu" else "mlp"
    fixed: dict = {"norm": form["norm"]}
    if form["normalization"] != "layernorm":
        fixed["normalization"] = form["normalization"]
    if ffn == "swiglu":
        fixed["ffn"] = "swiglu"
    elif form["ffn"] != "relu":
        fixed["activation"] = form["ffn"]
    causal: object = form["causal"]
    if mask is None or form["causal"]:
        fixed["causal"] = form["causal"]
    elif "causal" in mask[1].split(")")[0]:  # the converter builds the triangle too
        causal = (False, True)
    block = {"norm": form["norm"], "causal": causal,
             **({"normalization": "rmsnorm"} if form["normalization"] == "rmsnorm" else {}),
             **({"ffn": "swiglu"} if ffn == "swiglu" else {})}
    declares = {"block": block, **({"key_mask": True} if mask else {}),
                **({"ffn": {"activation": form["ffn"]}} if "activation" in fixed else {})}
    return fixed, declares


def _mapping(cls, found: _Found) -> tuple[BlockMapping, list[str]]:
    build, form = found.build, found.form
    x = np.random.default_rng(1).standard_normal((B, T, H))
    fwd = inspect.signature(getattr(cls, _method(cls, FORWARDS)))
    mask = _mask(build, found, x)
    m = BlockMapping("block", cls, dict(build.exprs), dict(found.placed),
                     transposed=found.transposed)
    mask_args = []
    if mask is not None:
        m.mask_name, m.mask_source = mask
        mask_args = [converted(mask[1], None, form["causal"], x)]
    grads, missing, obj = _grads(build, found, x, mask_args)
    m.grads = grads
    ffn = "swiglu" if form["ffn"] == "swiglu" else "mlp"
    # the form the class computes: fixed (calls in another are n/a) and declared
    m.fixed, m.declares = form_rows(form, mask)
    inner = next((f"p[{e!r}].shape[1]" for e in ("ffn.W_1", "swiglu.W_1") if e in found.placed),
                 None)
    m.ctor = {k: inner if v == "INNER" else v for k, v in m.ctor.items()}
    args = sorted({a for v in m.ctor.values() for a in ("x", "p", "n_heads", "eps")
                   if re.search(rf"\b{a}\b", v)})
    m.new_source = f"lambda {', '.join(args)}: "
    m.needs_numpy = "np." in "".join(m.ctor.values()) or bool(mask)
    m.evidence.append(
        f"{cls.__name__}({', '.join(f'{k}={v}' for k, v in build.exprs.items())}).forward equals "
        f"the reference block_forward to {found.dev:.1e} (relative, float64) in the form "
        f"norm={form['norm']}, {form['normalization']}, "
        f"{'swiglu' if ffn == 'swiglu' else 'ffn activation ' + form['ffn']}, "
        f"causal={form['causal']}, with each entry of p at the attribute its name reads as "
        f"({len(found.placed)} entries)" + (f"; {', '.join(found.transposed)} stored transposed"
                                             if found.transposed else ""))
    absent = [e for e in _entries(form) if e not in found.placed]
    if absent:
        m.evidence.append(f"no attribute for {', '.join(absent)}: calls with them are not "
                          "applicable")
    if mask is not None:
        m.evidence.append(f"its forward's mask argument: {mask[0]} (its masked forward equals "
                          "the reference's on a padded key and on causal calls)")
    elif len(fwd.parameters) > 2:
        m.evidence.append(f"its forward's {list(fwd.parameters)[2]!r} is left at its default "
                          "(none of the mask formats tried matches): calls with a mask are not "
                          "applicable; write layer(mask=...) by hand for them")
    m.evidence.append(f"grads by shape, ties by the parameter's name ({len(grads)} of "
                      f"{len(found.placed)}); never by value")
    read_conventions(m, ClassLayer(cls).source())
    return m, missing


def infer_blocks(classes) -> tuple[list[BlockMapping], dict, list[str]]:
    """(the block row found -- the first class that maps --, {class: why it is not a block
    row} for the classes whose attributes read as a block's, what could not be mapped)."""
    rows, why, missing = [], {}, []
    for cls in classes:
        if _method(cls, FORWARDS) is None or _method(cls, BACKWARDS) is None:
            continue
        found, reason = _search(cls)
        if found is None:
            if reason:
                why[cls] = f"class {cls.__name__}: {reason}"
            continue
        if rows:
            rows[0].evidence.append(f"also a block: {cls.__name__}")
            continue
        try:
            m, miss = _mapping(cls, found)
        except Exception as e:  # noqa: BLE001 -- its backward failed: say so, map nothing
            why[cls] = f"class {cls.__name__}: its backward raised {type(e).__name__}: {e}"
            continue
        if miss and not m.grads:
            why[cls] = miss[0]
            continue
        rows.append(m)
        missing += miss
    return rows, why, missing
