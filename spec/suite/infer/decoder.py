"""The ``decoder`` row of :mod:`minibert_spec.suite.infer`: a whole decoder-only LM written over
one dict of parameters under its own names, adapted by
:func:`minibert_spec.suite.adapters.decoder` (a name map, fused and transposed tensors, the
model's loss).

It reads a *parameter source* (a function without required arguments, ``init_params()``, or a
module-level dict of arrays; without one, a model class's keys recorded:
:mod:`~minibert_spec.suite.infer.decoder_recorded`), a *model* and a *loss*
(:mod:`~minibert_spec.suite.infer.decoder_models`).  It decides

1. the name map, by name and shape (:func:`_read_local`, :func:`_read_whole`): names read as no
   protocol name, or as one twice, are tried on the free protocol names of their shape in every
   order (at most :data:`MAX_MAPS`);
2. the form: the parts present say the norm, the FFN, the biases, the final norm and the head;
   the forward decides the rest (positions, RoPE's convention, the MLP's activation, a norm's
   eps fixed in the code).  A map and form stand only where the model's logits, through the
   very ``decoder()`` call written, equal ``decoder_forward``'s (float64, :data:`DECODER_RTOL`);
3. the loss: the module's function (or the class's method) whose value equals the reference's
   ``decoder_loss`` on those logits.

Gradients are never compared: the backward is wired as the model gives it and judged by
``minibert check``, so that no bug of it is inferred away.  Where something cannot be decided
there is no row, and one line says why.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

import numpy as np

from minibert_reference.config import DecoderConfig
from minibert_reference.decoder import decoder_forward, decoder_loss, param_shapes
from minibert_spec.suite.adapter_decoder import decoder
from minibert_spec.suite.infer.decoder_models import find_loss
from minibert_spec.suite.infer.probes import FIXED_EPS, FORWARD_RTOL, deviation
from minibert_spec.suite.infer.training import TrainingMapping, executed

# the model's logits must equal the reference's to this (float64): tight, so that a norm's eps
# fixed in the code (1e-6 against 1e-5 changes unit-variance rows by ~5e-6) and GELU's two forms
# (~3e-4) are different forms, not one
DECODER_RTOL = 1e-9
# the most name maps tried by the forward where the names leave a choice
MAX_MAPS = 120
# the probe's batch: B, T distinct from every size, T within any position table
B, T = 2, 5
# a rope_base off the default, so that a builder dropping its keyword is seen (issue 41)
PROBE_ROPE_BASE = 500000.0
ACTIVATIONS = ("gelu_tanh", "gelu", "relu", "relu2")
# a class of the module named like one of these and no decoder found: its reason is said
DECODER_WORDS = re.compile(r"gpt|decoder|llama|causallm|languagemodel", re.IGNORECASE)


@dataclass
class DecoderMapping(TrainingMapping):
    """The decoder row: the adapter's lines (the ``decoder(...)`` call the evidence ran), its
    evidence and declaration (rendered like the training rows': their text as it is)."""

    names: dict = field(default_factory=dict)
    fused: dict = field(default_factory=dict)
    transposed: tuple = ()
    loss: str | None = None  # the loss's expression (None: not found)


# ------------------------------------------------------------------------ reading the names
# a name's last part saying what the tensor is
KINDS = {"w": "W", "weight": "W", "kernel": "W", "b": "b", "bias": "b", "g": "gamma",
         "gamma": "gamma", "scale": "gamma", "beta": "beta"}


def _kind(name: str) -> tuple[str | None, str]:
    """(what the name's last part says the tensor is -- "W", "b", "gamma", "beta" or None --
    and the stem: the other parts joined, lower case)."""
    tokens = [t for t in re.split(r"[._\-]+", name.lower()) if t]
    if len(tokens) > 1 and tokens[-1] in KINDS:
        return KINDS[tokens[-1]], "".join(tokens[:-1])
    return None, "".join(tokens)


def _read_local(name: str, swiglu: bool):
    """A block's tensor (the local part of a per-layer name) as protocol name(s): a local name,
    or a tuple of them for a fused tensor; None where the name says nothing known."""
    kind, stem = _kind(name)
    norm = re.search(r"(ln|norm|layernorm|rmsnorm)(1|2|f)?$|^(ln|norm)(1|2)|inputlayernorm|"
                     r"postattentionlayernorm|attnnorm|ffnnorm|mlpnorm", stem)
    if norm:
        which = "ln1" if re.search(r"1|input|attnnorm", stem) else \
            "ln2" if re.search(r"2|post|ffnnorm|mlpnorm", stem) else None
        if which is None:
            return None
        return f"{which}.{'beta' if kind in ('b', 'beta') else 'gamma'}"
    bias = kind == "b"
    if re.search(r"attn|attention|^sa", stem):
        role = re.sub(r"^.*?(attn|attention)", "", stem) or stem
        if re.search(r"cattn|qkv|inproj", role):
            return tuple(f"attn.{'b' if bias else 'W'}_{r}" for r in "qkv")
        for letter, spellings in (("q", r"q|query|wq|qproj"), ("k", r"k|key|wk|kproj"),
                                  ("v", r"v|value|wv|vproj"),
                                  ("o", r"o|out|wo|oproj|cproj|proj|outproj|dense")):
            if re.fullmatch(spellings, role):
                return f"attn.{'b' if bias else 'W'}_{letter}"
        return None
    if re.search(r"mlp|ffn|ff|feedforward", stem):
        role = re.sub(r"^.*?(mlp|ffn|feedforward|ff)", "", stem)
        roles = ((1, r"gate|gateproj|w1|wgate"), (3, r"up|upproj|w3|wup"),
                 (2, r"down|downproj|w2|wdown")) if swiglu else \
            ((1, r"fc|cfc|fc1|w1|in|up|wfc|win|wup|linear1|lin1|cfc"),
             (2, r"proj|cproj|fc2|w2|out|down|wproj|wout|wdown|linear2|lin2"))
        part = "swiglu" if swiglu else "ffn"
        for index, spellings in roles:
            if re.fullmatch(spellings, role):
                return f"{part}.{'b' if bias else 'W'}_{index}"
    return None


def _read_whole(name: str):
    """A whole tensor's name (no layer index) as a protocol name, or None."""
    kind, stem = _kind(name)
    if re.fullmatch(r"wte|tokemb\w*|tokenemb\w*|embedtokens|wordemb\w*|emb|embed|embedding|"
                    r"embeddings|we", stem):
        return "embeddings.token.W"
    if re.fullmatch(r"wpe|posemb\w*|positionemb\w*|positionalemb\w*|pe|wp", stem):
        return "embeddings.position.W"
    if re.fullmatch(r"lnf|normf|finalnorm|finalln|norm|ln|finallayernorm", stem):
        return f"final_ln.{'beta' if kind in ('b', 'beta') else 'gamma'}"
    if re.fullmatch(r"lmhead|head|output|unembed|out|wout|bout", stem):
        return "lm_head.b" if kind == "b" or stem == "bout" else "lm_head.W"
    return None


def _layer_pattern(name: str) -> tuple[str, int | None]:
    """(the name with its layer index as ``{i}``, the index): the first dotted part that is a
    number (``h.0.attn.q.w``); (name, None) for a whole tensor."""
    parts = name.split(".")
    for k, part in enumerate(parts):
        if part.isdigit():
            return ".".join([*parts[:k], "{i}", *parts[k + 1:]]), int(part)
    return name, None


@dataclass
class Inventory:
    """The model's parameters read: whole names and per-layer patterns with their shapes,
    the number of layers, and how each name reads (None: not at all)."""

    shapes: dict  # pattern -> shape (layer 0's for a per-layer one)
    layers: int
    read: dict  # pattern -> protocol name, tuple (fused) or None


def inventory(params: dict) -> Inventory | str:
    """The names as patterns, each read; a reason where layers differ in their names."""
    per: dict = {}
    whole: dict = {}
    for name, value in params.items():
        pattern, index = _layer_pattern(name)
        if index is None:
            whole[name] = np.shape(value)
        else:
            per.setdefault(pattern, {})[index] = np.shape(value)
    indices = {i for by in per.values() for i in by}
    layers = len(indices)
    if indices != set(range(layers)) or any(set(by) != indices for by in per.values()):
        return "the per-layer names are not the same in layers 0 .. L-1"
    shapes = {**whole, **{p: by[0] for p, by in per.items()}}
    swiglu = any("gate" in p.lower() for p in per)
    read = {p: (_read_local(p.split("{i}.", 1)[-1], swiglu) if p in per else _read_whole(p))
            for p in shapes}
    return Inventory(shapes, layers, read)


# ------------------------------------------------------------------------ sizes and maps
def _sizes(inv: Inventory) -> dict | str:
    """The config's sizes from the tensors read as the token table, the position table and
    the FFN's first matrix; a reason where they are not found."""
    by = {v: p for p, v in inv.read.items() if isinstance(v, str)}
    if "embeddings.token.W" not in by:
        return "no tensor reads as the token embedding (wte, tok_emb, embed_tokens, ...)"
    V, H = inv.shapes[by["embeddings.token.W"]]
    sizes = dict(vocab_size=V, hidden=H, n_layers=inv.layers)
    first = by.get("ffn.W_1") or by.get("swiglu.W_1")
    if first is None or H not in inv.shapes[first]:
        return "no tensor reads as the FFN's first matrix (c_fc, fc, w1, gate_proj, ...)"
    shape = inv.shapes[first]
    sizes["intermediate"] = shape[1] if shape[0] == H else shape[0]
    if "embeddings.position.W" in by:
        sizes["max_len"] = inv.shapes[by["embeddings.position.W"]][0]
    return sizes


def _form(read: dict) -> dict:
    """The config's fields the parts present decide."""
    names = {n for v in read.values() if v for n in ((v,) if isinstance(v, str) else v)}
    # without a table the positions are the forward's to decide (_form_configs), none of them
    # a parameter: not the config's default (learned), whose table no name would fill
    return dict(position="learned" if "embeddings.position.W" in names else "rope",
                normalization="layernorm" if {"ln1.beta", "ln2.beta"} & names else "rmsnorm",
                ffn="swiglu" if "swiglu.W_1" in names else "mlp",
                attn_bias="attn.b_q" in names,
                mlp_bias=bool({"ffn.b_1", "swiglu.b_1"} & names),
                final_norm="final_ln.gamma" in names, tie_embeddings="lm_head.W" not in names,
                head_bias="lm_head.b" in names)


def _protocol_shapes(config: DecoderConfig) -> dict:
    """Protocol pattern (a block's local name, or a whole name) -> shape."""
    out = {}
    for name, shape in param_shapes(config).items():
        if name.startswith("layers.0."):
            out[name[len("layers.0."):]] = shape
        elif not name.startswith("layers."):
            out[name] = shape
    return out


def _layout(own: tuple, want: tuple) -> bool | None:
    """False: the protocol's layout; True: transposed; None: neither."""
    if own == want:
        return False
    return True if len(own) == 2 and own == want[::-1] else None


def name_maps(inv: Inventory, config: DecoderConfig):
    """Each candidate map (names, fused, transposed) whose shapes fit the config's: the names
    read where they read, the rest (or one read twice) tried on the free protocol names; a
    square matrix in the layout of the non-square ones of its kind (one convention)."""
    want = _protocol_shapes(config)
    fixed, fused, loose = {}, {}, []
    claimed = [n for v in inv.read.values() if v for n in ((v,) if isinstance(v, str) else v)]
    twice = {n for n in claimed if claimed.count(n) > 1}
    for pattern, read in inv.read.items():
        if isinstance(read, tuple) and not twice & set(read) and all(r in want for r in read):
            fused[pattern] = read
        elif isinstance(read, str) and read not in twice and read in want:
            fixed[read] = pattern
        else:
            loose.append(pattern)
    free = [n for n in want if n not in fixed and n not in {r for v in fused.values()
                                                             for r in v}]
    if len(loose) != len(free):
        return
    tried = 0
    for order in itertools.permutations(free):
        names = {**fixed, **dict(zip(order, loose))}
        layout = _layouts(inv, names, fused, want)
        if layout is None:
            continue
        for transposed in layout:
            yield names, fused, transposed
            tried += 1
        if tried >= MAX_MAPS:
            return


def _layouts(inv: Inventory, names: dict, fused: dict, want: dict):
    """The candidate ``transposed`` tuples of a map (None: a shape does not fit)."""
    flips, square = [], []
    for protocol, own in names.items():
        shape = inv.shapes[own]
        flip = _layout(shape, want[protocol])
        if flip is None:
            return None
        if len(shape) == 2 and shape[0] == shape[1] and "W_" in protocol:
            square.append(own)
        elif flip:
            flips.append(own)
    for own, parts in fused.items():
        shape = inv.shapes[own]
        joined = (*want[parts[0]][:-1], sum(want[p][-1] for p in parts))
        flip = _layout(shape, joined)
        if flip is None:
            return None
        if flip:
            flips.append(own)
    linear = [own for own in flips if "{i}" in own]  # the block's weights: one convention
    first = (tuple(flips) + tuple(square)) if linear else tuple(flips)
    other = tuple(flips) if linear else tuple(flips) + tuple(square)
    return [first] + ([other] if square and other != first else [])


# ------------------------------------------------------------------------ the evidence
def _probe_params(config: DecoderConfig, seed: int = 0) -> dict:
    """Float64 parameters of the protocol's names, every tensor distinct (gains away from 1,
    biases away from 0), so that a misplaced one changes the logits."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in param_shapes(config).items():
        v = rng.standard_normal(shape) * (0.5 if len(shape) == 2 else 0.3)
        out[name] = 1 + v if name.endswith("gamma") else v
    return out


def _ids(config: DecoderConfig, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, config.vocab_size, (B, T))


def _mapped_forward(model, names, fused, transposed):
    """The decoder_forward of a candidate map: the very ``decoder()`` call written (its
    backward and loss left out: never run here)."""
    return decoder(model, lambda dlogits, cache: None, names=names, fused=fused,
                   transposed=transposed, loss=lambda logits: (0.0, logits)).decoder_forward


def _form_configs(base: DecoderConfig, has_table: bool):
    """The forms the forward decides: the positions (a table alone or with RoPE; without one
    RoPE, sinusoidal or none), RoPE's convention, the MLP's activation."""
    positions = ("learned", "learned_rope") if has_table else ("rope", "sinusoidal", "none")
    for position in positions:
        rope = position in ("rope", "learned_rope")
        for convention in ("half", "interleaved") if rope else ("half",):
            for activation in ACTIVATIONS if base.ffn == "mlp" else ("gelu_tanh",):
                yield base.replace(position=position, rope_convention=convention,
                                   activation=activation)


def _matches(model, maps, base: DecoderConfig, has_table: bool, eps_fixed: bool) -> list:
    """([(deviation, map, config)] of every map and form whose logits equal the reference's to
    DECODER_RTOL -- each eps of FIXED_EPS where the builder takes none --, the closest)."""
    ids = _ids(base)
    hits, closest = [], []
    for names, fused, transposed in maps:
        for config in _form_configs(base, has_table):
            params = _probe_params(config)
            for eps in (FIXED_EPS if eps_fixed else (config.ln_eps,)):
                c = config.replace(ln_eps=eps) if eps_fixed and eps > 0 else config
                if eps_fixed and eps == 0:
                    continue  # the reference's norms take eps > 0
                want = decoder_forward(params, c, ids)[0]
                try:
                    got = _mapped_forward(model, names, fused, transposed)(params, c, ids)[0]
                except Exception:  # noqa: BLE001 -- this map or form does not run
                    break
                dev = deviation(got, want)
                closest.append((dev, c))
                if dev <= DECODER_RTOL:
                    hits.append((dev, (names, fused, transposed), c))
                elif dev > FORWARD_RTOL:
                    break  # far off: another eps will not bring it
    return hits, min(closest, key=lambda dc: dc[0], default=None)


def _describe(config: DecoderConfig) -> str:
    rope = f" (RoPE {config.rope_convention})" if config.rope else ""
    ffn = "SwiGLU" if config.ffn == "swiglu" else f"an MLP of {config.activation}"
    return (f"positions {config.position}{rope}, {config.normalization}, {ffn}, "
            f"{'a final norm' if config.final_norm else 'no final norm'}, "
            f"{'a tied' if config.tie_embeddings else 'an untied'} head "
            f"{'with' if config.head_bias else 'without'} bias")


def _declares(config: DecoderConfig, eps_fixed: float | None) -> dict:
    """The row's CAPABILITIES: its one form."""
    caps = {"decoder": {"position": config.position, "final_norm": config.final_norm,
                        "head_bias": config.head_bias, "tied": config.tie_embeddings},
            "block": {"normalization": config.normalization, "ffn": config.ffn},
            "attention": {"rope": config.rope_convention if config.rope else None},
            "attention_bias": config.attn_bias, "key_mask": False}
    if config.ffn == "mlp":
        caps["ffn"] = {"activation": config.activation}
        if not config.mlp_bias:
            caps["ffn"].update(b_1=False, b_2=False)
    else:
        caps["swiglu"] = {"bias": config.mlp_bias}
    if eps_fixed is not None and config.normalization == "layernorm":
        caps["layernorm"] = {"eps": eps_fixed}
    return caps


# ------------------------------------------------------------------------ the row
def decoder_rows(mod, expr: str, origin: str, params: dict,
                 models: list) -> tuple[list[DecoderMapping], list[str]]:
    """The row of the parameters ``params`` (named ``expr`` in a reason, ``origin`` in the
    evidence) and the module's ``models``: each model tried until one's logits equal the
    reference's under one map."""
    inv = inventory(params)
    if isinstance(inv, str):
        return [], [f"decoder: {expr}: {inv}"]
    if not models and not any(v == "embeddings.token.W" for v in inv.read.values()):
        return [], []  # a parameter dict, but no decoder's (an encoder's, an optimizer's)
    sizes = _sizes(inv)
    if isinstance(sizes, str):
        return [], [f"decoder: {expr}: {sizes}"]
    if not models:
        return [], [f"decoder: {expr} gives a decoder's parameters, but no function without "
                    "arguments returns its (forward, backward) pair, and no class with a "
                    "forward and a backward is built on the dict"]
    form = _form(inv.read)
    H = sizes["hidden"]
    heads = next((a for a in (2, 4, 1) if H % a == 0 and (H // a) % 2 == 0), 1)
    base = DecoderConfig(**sizes, **form, n_heads=heads, rope_base=PROBE_ROPE_BASE,
                         ln_eps=1e-5 if form["normalization"] == "layernorm" else 1e-6)
    maps = list(name_maps(inv, base))
    if not maps:
        unread = [p for p, v in inv.read.items() if v is None]
        return [], [f"decoder: {expr}: no map of its names onto the protocol's fits their "
                    f"shapes (names read as none: {', '.join(unread) or 'none'})"]
    has_table = "embeddings.position.W" in inv.read.values()
    tried = []
    for model in models:
        if "config.n_heads" not in model.keywords.values():
            tried.append(f"{model.label} takes no number of heads")
            continue
        run = executed(model.source(), mod)["decoder_model"]
        eps_fixed = "config.ln_eps" not in model.keywords.values()
        hits, closest = _matches(run, maps, base, has_table, eps_fixed)
        if not hits:
            tried.append(f"{model.label}: "
                         + (f"closest {_describe(closest[1])} at {closest[0]:.1e}"
                            if closest else "its forward does not run on the names read"))
            continue
        if any("config.rope_base" in v for v in model.keywords.values()) and \
                not any(h[2].rope for h in hits):
            # the forms without RoPE alone declared, a bug in its RoPE would never be run
            tried.append(f"{model.label} takes a RoPE base, but its logits equal the "
                         "reference's in no form with RoPE (half or interleaved)")
            continue
        maps_hit = {repr(h[1]) for h in hits}
        if len(maps_hit) > 1:
            return [], [f"decoder: {len(maps_hit)} maps of {expr}'s names give the reference's "
                        "logits: not decided (write names= by hand)"]
        # several positions matching: the model takes the form from the config (a RoPE base
        # or None), each confirmed, all declared; two activations cannot both match
        activations = sorted({h[2].activation for h in hits})
        if len(activations) > 1:
            return [], [f"decoder: {model.label}'s logits equal the reference's with the "
                        f"activations {activations}: not decided"]
        # an eps fixed in the code below ~1e-9 is not told from its neighbours on rows of unit
        # variance (nor by the check's): the closest is kept, the others named
        best = min(hits, key=lambda h: h[0])
        also = sorted({h[2].ln_eps for h in hits} - {best[2].ln_eps})
        m = _mapping(mod, model, run, origin, inv, best, eps_fixed, also)
        _declare_positions(m, [h[2] for h in hits])
        return [m], []
    return [], [f"decoder: {expr} gives a decoder's parameters, but no model's logits equal "
                f"the reference decoder_forward's ({'; '.join(tried)})"]


def _mapping(mod, model, run, origin: str, inv: Inventory, hit, eps_fixed: bool,
             also: list) -> DecoderMapping:
    dev, (names, fused, transposed), config = hit
    params, ids = _probe_params(config), _ids(config)
    logits, cache = _mapped_forward(run, names, fused, transposed)(params, config, ids)
    loss = find_loss(model.losses(mod), mod, logits, cache.cache,
                     ids, lambda labels: decoder_loss(params, config, ids, labels), DECODER_RTOL)
    evidence = [
        f"decoder: names and shapes from {origin} ({len(inv.shapes)} names, "
        f"{inv.layers} layers: H={config.hidden}, V={config.vocab_size}, "
        f"I={config.intermediate}); the model: {model.label}",
        "decoder: each name read as the protocol's by its spelling and shape"
        + (f"; {', '.join(f'{k} joins {list(v)}' for k, v in fused.items())}" if fused else "")
        + (f"; {', '.join(transposed)} stored transposed" if transposed else ""),
        f"decoder: its logits, the reference's parameters mapped through this very decoder() "
        f"call (B={B}, T={T}, n_heads={config.n_heads}, rope_base={config.rope_base:g}), equal "
        f"minibert_reference.decoder.decoder_forward's to {dev:.1e} (relative, float64) in "
        f"the form {_describe(config)}, and in no other form or map tried",
    ]
    if eps_fixed:
        evidence.append(f"decoder: no eps argument: its norms' eps is fixed in the code at "
                        f"{config.ln_eps:g} (of {', '.join(f'{e:g}' for e in FIXED_EPS)} the "
                        "closest"
                        + (f"; {', '.join(f'{e:g}' for e in also)} within {DECODER_RTOL:g} too"
                           if also else f"; no other within {DECODER_RTOL:g}")
                        + "; the check's configs of this form "
                        + ("pinned to it: declared" if config.normalization == "layernorm"
                           else "keep their own eps: a fixed eps off it is red there") + ")")
    if loss is None:
        evidence.append("decoder: no function of the module gives the reference's next-token "
                        "loss: decoder_loss_and_grads is not applicable")
    else:
        evidence.append(f"decoder: {loss[1]}")
    evidence.append("decoder: the gradients are never compared: the backward is the model's "
                    "own, judged by minibert check")
    code = model.source() + "\n\n" + _call(names, fused, transposed, model.backward_source,
                                            loss and loss[0])
    return DecoderMapping("decoder", code, evidence,
                          _declares(config, config.ln_eps if eps_fixed else None),
                          names=names, fused=fused, transposed=transposed,
                          loss=loss and loss[0])


def _declare_positions(m: DecoderMapping, configs: list) -> None:
    """Every position form (and RoPE convention) whose logits matched, declared: one as it
    is, several as a tuple (the model follows the config's)."""
    positions = tuple(dict.fromkeys(c.position for c in configs))
    ropes = tuple(dict.fromkeys(c.rope_convention if c.rope else None for c in configs))
    if len(positions) > 1 or len(ropes) > 1:
        m.declares["decoder"]["position"] = positions if len(positions) > 1 else positions[0]
        m.declares["attention"]["rope"] = ropes if len(ropes) > 1 else ropes[0]
        m.evidence.append(f"decoder: the logits equal the reference's in the positions "
                          f"{', '.join(positions)} (RoPE {', '.join(map(str, ropes))}) alike: "
                          "the model follows the config's form, each declared")


def _call(names: dict, fused: dict, transposed: tuple, backward: str,
          loss_expr: str | None) -> str:
    """The ``decoder(...)`` call (its loss a not-applicable stand-in where none matched)."""
    lines = []
    if loss_expr is None:
        lines += ["def _no_loss(logits):  # the module's loss was not found",
                  "    from minibert_spec.protocol import NotApplicable",
                  "    raise NotApplicable('not applicable: no loss of the module matched')",
                  "", ""]
    body = [f"decoder_model, {backward}", f"names={_dict_source(names)}"]
    if fused:
        body.append(f"fused={_dict_source(fused)}")
    if transposed:
        body.append(f"transposed={transposed!r}")
    body.append(f"loss={loss_expr or '_no_loss'}")
    return "\n".join(lines) + \
        "decoder_forward, decoder_backward, decoder_loss_and_grads = decoder(\n    " + \
        ",\n    ".join(body) + ")"


def _dict_source(d: dict) -> str:
    """A dict's source, one entry a line (a name map is read entry by entry)."""
    return "{\n" + "".join(f"        {k!r}: {v!r},\n" for k, v in d.items()) + "    }"
