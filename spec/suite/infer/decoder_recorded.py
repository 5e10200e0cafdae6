"""The decoder row (:mod:`minibert_spec.suite.infer.decoder`) of a module without a parameter
source -- a port that loads its weights: the model class's keys recorded
(:mod:`~minibert_spec.suite.infer.recording`) in each form the class shows, each set judged as a
parameter source's by its logits, the sets that match joined into one row declaring every form
they showed -- and, as ``decoder_forms``, the combinations they showed, the only ones the check
runs (:func:`confirmed_forms`: never a cross of two sets' forms no logits confirmed); no row
where a set matches in no form, or a RoPE base the class takes is never confirmed (a bug there
would be declared away).  :func:`infer_decoder` is every module's row."""

from __future__ import annotations

import inspect

import numpy as np

from minibert_reference.config import DecoderConfig
from minibert_spec.protocol.capabilities import DECODER_FORMS
from minibert_spec.suite.infer import recording
from minibert_spec.suite.infer.decoder import (
    DECODER_WORDS,
    PROBE_ROPE_BASE,
    DecoderMapping,
    _call,
    _ids,
    _layer_pattern,
    _protocol_shapes,
    _read_local,
    _read_whole,
    decoder_rows,
)
from minibert_spec.suite.infer.decoder_models import (
    builders,
    class_models,
    no_arg_functions,
    param_source,
)

# the sizes a model class is built at to record its keys: each distinct (V, H, I, T_max, 3H,
# the probe's B and T), H // 2 even for RoPE
RECORD_CONFIG = DecoderConfig(n_layers=2, hidden=8, n_heads=2, intermediate=12, max_len=10,
                              vocab_size=11, position="rope", rope_base=PROBE_ROPE_BASE)


def _read_key(key: str, swiglu: bool | None = None):
    """A model's key (``h.0.attn.q.w``) read as a protocol name, a fused tuple or None (its
    FFN read as SwiGLU's where ``swiglu``; None: where the key is a gate)."""
    pattern, index = _layer_pattern(key)
    if index is None:
        return _read_whole(key)
    return _read_local(pattern.split("{i}.", 1)[-1],
                       "gate" in pattern.lower() if swiglu is None else swiglu)


def _key_shapes(key) -> list:
    """The shapes a recorded key may have, the likeliest first: the protocol's of what it
    reads as (RECORD_CONFIG's sizes), then transposed; a key read as nothing any of them."""
    if not isinstance(key, str):
        return []
    want = {}
    for ffn in ("mlp", "swiglu"):
        want.update(_protocol_shapes(RECORD_CONFIG.replace(
            ffn=ffn, tie_embeddings=False, head_bias=True, position="learned")))
    read = _read_key(key)
    if isinstance(read, tuple) and all(r in want for r in read):
        shapes = [(*want[read[0]][:-1], sum(want[r][-1] for r in read))]
    elif isinstance(read, str) and read in want:
        shapes = [want[read]]
    else:
        shapes = list(dict.fromkeys(want.values()))
    return list(dict.fromkeys([*shapes, *(s[::-1] for s in shapes if len(s) == 2)]))


def _class_builder(model, config: DecoderConfig, ids: np.ndarray):
    """The user's class built on a dict at ``config`` (its arguments as the adapter writes
    them) and its forward on ``ids``: the logits, or an error."""
    kwargs = {k: eval(expr, {"config": config})  # noqa: S307 -- our own text (CONFIG_KEYWORDS)
              for k, expr in model.keywords.items()}

    def build(weights):
        logits = getattr(model.cls(**{model.params_arg: weights}, **kwargs), model.forward)(ids)
        if np.shape(logits) != (*ids.shape, config.vocab_size):
            raise ValueError(f"logits of shape {np.shape(logits)}")
        return logits

    return build


def recorded_sets(model) -> tuple[list, list]:
    """([(label, shapes)] the class's forward runs through on a recording dict -- each key
    only asked left out, and added with the biases of its weights; each MLP also respelt as
    SwiGLU; tied and untied where it takes ``tied`` -- each pruned to the keys that change
    the logits, [why a set did not grow])."""
    ties = (True, False) if "config.tie_embeddings" in model.keywords.values() else (True,)
    sets, why = {}, []
    for tied in ties:
        config = RECORD_CONFIG.replace(tie_embeddings=tied)
        build = _class_builder(model, config, _ids(config))
        for policy in (recording.PRESENT, recording.ABSENT):
            grown = recording.grow(build, _key_shapes, policy)
            if grown.reason is None and policy == recording.PRESENT:
                more = recording.grow(build, _key_shapes, policy, {
                    **grown.shapes, **recording.bias_siblings(grown.shapes, _key_shapes)})
                grown = more if more.reason is None else grown
            if grown.reason is not None:
                why.append(f"tied={tied}, keys only asked {policy}: {grown.reason}")
                continue
            variants = [(grown.shapes, "")]
            for spelling in recording.SWIGLU_SPELLINGS:
                respelt = recording.swiglu_respelt(grown.shapes, _read_key, spelling)
                g = respelt and recording.grow(build, _key_shapes, policy, respelt)
                if g and g.reason is None:
                    variants.append((g.shapes, f", its MLP respelt {'/'.join(spelling)}"))
            for shapes, respelt in variants:
                kept = recording.prune(build, shapes, policy)
                gated = any("gate" in k.lower() for k in kept)
                if respelt and any(str(_read_key(k, gated)).startswith("ffn.") for k in kept):
                    continue  # the model went back to its MLP: no SwiGLU of that spelling
                sets.setdefault(frozenset(kept), (f"tied={tied}, keys only asked {policy}"
                                                  f"{respelt}", kept))
    return list(sets.values()), why


def recorded_decoder(mod) -> tuple[list[DecoderMapping], list[str]]:
    """The row of a module without a parameter source: each model class's keys recorded
    (:func:`recorded_sets`), each set judged as a parameter source's (its logits against the
    reference's), the sets that match joined into one row declaring every form they showed
    (and the combinations they showed: :func:`confirmed_forms`)."""
    named = [c.__name__ for _, c in inspect.getmembers(mod, inspect.isclass)
             if c.__module__ == mod.__name__ and DECODER_WORDS.search(c.__name__)]
    models = sorted((m for m in class_models(mod) if "config.n_heads" in m.keywords.values()),
                    key=lambda m: m.name not in named)
    said = []
    for model in models:
        sets, why = recorded_sets(model)
        hits, misses = [], []
        for label, shapes in sets:
            origin = (f"the keys impl.{model.name}(...).{model.forward} looked up in a "
                      f"recording dict ({label})")
            rows, reasons = decoder_rows(mod, f"{model.name} ({label})", origin,
                                         recording.arrays(shapes), [model])
            hits += rows
            misses += reasons
        if hits:
            refused = _partly(hits, misses)
            return ([], [refused]) if refused else _joined(model, hits)
        said += misses or why
    if not named:
        return [], []
    return [], [f"decoder: class {named[0]} may be a decoder, but the module has no parameter "
                "source to read its names and shapes from (a function without arguments "
                "returning the model's dict of arrays, e.g. init_params()), and recording its "
                "lookups found none that gives the reference's logits"
                + (f" ({said[0]})" if said else "")]


def _partly(hits: list, misses: list) -> str | None:
    """Why a class some of whose recorded sets match is given no row: another set's logits
    equal the reference's in no form -- a bug there (declared away, were it left out) or a form
    the reference lacks, not told apart."""
    if hits and misses:
        return (f"{misses[0]}; the other sets match: not decided (a bug in that form, or a "
                "form the reference lacks; write the adapter by hand)")
    return None


def _as_tuple(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def _joined(model, rows: list[DecoderMapping]) -> tuple[list[DecoderMapping], list[str]]:
    """One row of the recorded sets' rows: their name maps joined, every form declared, the
    combinations confirmed as ``decoder_forms`` (where more than one)."""
    names, fused, transposed = {}, {}, []
    for m in rows:
        for which, into in ((m.names, names), (m.fused, fused)):
            for k, v in which.items():
                if into.setdefault(k, v) != v:
                    return [], [f"decoder: the recorded sets map {k} to {into[k]} and to {v}: "
                                "not decided (write names= by hand)"]
        transposed += [t for t in m.transposed if t not in transposed]
    loss = next((m.loss for m in rows if m.loss), None)
    code = model.source() + "\n\n" + _call(names, fused, tuple(transposed),
                                            model.backward_source, loss)
    evidence = [e for m in rows for e in m.evidence]
    declares = _joined_declares([m.declares for m in rows])
    forms = confirmed_forms([m.declares for m in rows])
    if len(forms) > 1:
        declares[DECODER_FORMS] = forms
    evidence.append(f"decoder: {len(rows)} recorded sets each matched the reference in its "
                    f"form: every form declared, as {len(forms)} {DECODER_FORMS} (sets apart "
                    "in one option alone joined): the check runs each of its forms in one of "
                    "them, never in a combination the logits did not confirm")
    return [DecoderMapping("decoder", code, list(dict.fromkeys(evidence)), declares,
                           names=names, fused=fused, transposed=tuple(transposed),
                           loss=loss)], []


def _joined_declares(declared: list) -> dict:
    """The rows' CAPABILITIES joined: each option every value declared (one: as it is, an MLP's
    biases made explicit first); attention biases claimed where a row has them; a fixed eps
    the first row's."""
    out: dict = {}
    for caps in map(_explicit, declared):
        for key, value in caps.items():
            if isinstance(value, dict):
                for option, v in value.items():
                    out.setdefault(key, {}).setdefault(option, []).append(v)
            else:
                out.setdefault(key, []).append(value)
    joined = {key: {o: _values(vs) for o, vs in value.items()} if isinstance(value, dict)
              else any(value) if key == "attention_bias" else value[0]
              for key, value in out.items()}
    if "layernorm" in joined:
        joined["layernorm"] = next(c["layernorm"] for c in declared if "layernorm" in c)
    return joined


def _explicit(caps: dict) -> dict:
    """A row's CAPABILITIES (copied) with an MLP's biases made explicit."""
    caps = {k: dict(v) if isinstance(v, dict) else v for k, v in caps.items()}
    if "ffn" in caps:
        caps["ffn"] = {"b_1": True, "b_2": True, **caps["ffn"]}
    return caps


def confirmed_forms(declared: list) -> tuple:
    """The rows' CAPABILITIES as the combinations the logits confirmed (``decoder_forms``):
    two apart in one option's values alone joined -- the product of the joined one's options
    is still exactly what was confirmed (a form's tied and untied head) -- never more.  The
    LayerNorm eps the joined declaration fixes (the first row's) is every form's."""
    forms: list = []
    for caps in map(_explicit, declared):
        flat = {(k, o): _as_tuple(v) for k, vs in caps.items() if k != "layernorm"
                for o, v in (vs.items() if isinstance(vs, dict) else [(None, vs)])}
        forms = _join_one_apart([*forms, flat])
    return tuple(_nested(f) for f in forms)


def _join_one_apart(forms: list) -> list:
    """The last form joined into the first other one it is one option apart from (or equal
    to), and so on while any joins; else the list as it is."""
    *others, new = forms
    for i, other in enumerate(others):
        if other.keys() != new.keys():
            continue
        apart = [k for k in new if set(new[k]) != set(other[k])]
        if not apart or (len(apart) == 1 and apart[0][1] is not None):  # claims: one value
            joined = {**other, **{k: (*other[k], *(v for v in new[k] if v not in other[k]))
                                  for k in apart}}
            return _join_one_apart([*others[:i], *others[i + 1:], joined])
    return forms


def _nested(flat: dict) -> dict:
    """A flat form ({(op, option): values}, {(claim, None): (value,)}) as CAPABILITIES."""
    out: dict = {}
    for (key, option), values in flat.items():
        if option is None:
            out[key] = values[0]
        else:
            out.setdefault(key, {})[option] = _values([values])
    return out


def _values(values: list):
    """The distinct values (a tuple's each), one as it is, several as a tuple."""
    flat = list(dict.fromkeys(x for v in values for x in _as_tuple(v)))
    return flat[0] if len(flat) == 1 else tuple(flat)


# ------------------------------------------------------------------------ the row
def infer_decoder(mod) -> tuple[list[DecoderMapping], list[str]]:
    """([the decoder row] or [], [why not]) for the module: nothing at all where it shows no
    decoder (no parameter source, no class named like one)."""
    functions = no_arg_functions(mod)
    source = param_source(mod, functions)
    if source is None:
        return recorded_decoder(mod)
    expr, params = source
    return decoder_rows(mod, expr, f"impl.{expr}", params,
                        [*builders(functions), *class_models(mod)])
