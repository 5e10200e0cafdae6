"""The causal decoder row (reference/decoder.py; ``decoder_forward``, ``decoder_backward``,
``decoder_loss_and_grads``): directional finite differences of every parameter through the
whole model (its forward/backward under a random upstream gradient, and its next-token loss),
float64, random weights; the gradient's bookkeeping, causality, the tied table's two shares,
purity and float32.  Fixed checks written by hand, as the encoder's (a model is no op pair
with a case family); the torch oracles (transformers, the composed decoder) are
spec/suite/checks/oracle_decoder.py.

A decoder is checked as its parts declare: each *form* (GPT-2, LLaMA, and the forms ports
write: learned + RoPE positions, sinusoidal positions, none, a squared-ReLU MLP) is a preset of
minibert_reference.config, some of whose options it needs (GPT-2's LayerNorm and learned
positions, LLaMA's RMSNorm, SwiGLU and RoPE: :data:`FORMS`) and the others it takes from the
implementation's declarations, through the one variant table (:func:`decoder_config`): a GPT-2
without biases declares ``attention_bias: False`` and ``ffn: {b_1: False, b_2: False}`` and is
checked without them; a decoder with learned + RoPE positions, no final norm and a biased head
of its own declares ``decoder: {position: "learned_rope", final_norm: False, head_bias: True,
tied: False}`` and is checked in that form (:data:`PREFERS`: what a form takes where the
implementation declares several).  A decoder declaring the combinations it has
(``CAPABILITIES["decoder_forms"]``: a recorded one's, those its logits confirmed) is checked in
those only: each form in the first that has what the form needs, n/a where none has
(:func:`form_capabilities`).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from minibert_reference.config import DecoderConfig, gpt2, llama
from minibert_reference.decoder import init_params
from minibert_spec.numerics.asserts import assert_close
from minibert_spec.numerics.fdcheck import assert_f32_close, max_abs
from minibert_spec.numerics.finite_differences import assert_all_passed, check_gradients, randomized
from minibert_spec.protocol import (
    IGNORE_INDEX,
    ImplProxy,
    NotApplicable,
    capabilities,
    label_of,
    not_claimed_message,
)
from minibert_spec.protocol.capabilities import DECODER_FORMS, resolve_variant, unmet
from minibert_spec.protocol.composed import ModelOfRows, Refused, composed_model
from minibert_spec.protocol.proxy import provides
from minibert_spec.protocol.table import OPS
from minibert_spec.protocol.variants import with_pinned_config
from minibert_spec.suite.registry import check
from minibert_spec.tolerances import F64_IDENTITY_RTOL

# Hugging Face's two forms: their positions (each form's own), the final norm, a head without bias
_HF = {"decoder.final_norm": True, "decoder.head_bias": False}
# form -> (preset, what the form needs declared, the decoder's own first: an implementation of
# another form reads which one it declares): the rest follows the declarations.  The forms
# after GPT-2 and LLaMA are those ports write, which transformers has no model of (their
# oracle is the decoder composed in torch: spec/suite/checks/oracle_decoder.py)
FORMS = {
    "gpt2": (gpt2, {"decoder.position": "learned", **_HF, "block.normalization": "layernorm"}),
    "llama": (llama, {"decoder.position": "rope", **_HF, "block.normalization": "rmsnorm",
                      "block.ffn": "swiglu"}),
    # a GPT port adding RoPE (tests/examples/wm_decoder.py): the table and rotary q/k, RMSNorm
    "learned_rope": (partial(llama, position="learned_rope", ffn="mlp"),
                     {"decoder.position": "learned_rope", "block.normalization": "rmsnorm",
                      "block.ffn": "mlp"}),
    # the NumPy-Transformer documents' positions in a GPT-2
    "sinusoidal": (partial(gpt2, position="sinusoidal"),
                   {"decoder.position": "sinusoidal", "block.normalization": "layernorm"}),
    # no positions (NoPE) in a LLaMA
    "nope": (partial(llama, position="none"),
             {"decoder.position": "none", "block.normalization": "rmsnorm",
              "block.ffn": "swiglu"}),
    # the nanoGPT speedrun's (and Primer's) MLP: squared ReLU, in a LLaMA with RoPE and RMSNorm
    "relu2": (partial(llama, ffn="mlp", activation="relu2"),
              {"decoder.position": "rope", "block.normalization": "rmsnorm", "block.ffn": "mlp",
               "ffn.activation": "relu2"}),
}
# form -> the decoder options it takes where the implementation declares them (else the first
# it declares): GPT-2 tied, LLaMA untied; the ports' forms each away from the standard in
# what they are about (no final norm, a head bias), so that every declared option is run
PREFERS = {
    "gpt2": {"tied": True},
    "llama": {"tied": False},
    "learned_rope": {"tied": False, "final_norm": False, "head_bias": True},
    "sinusoidal": {"tied": True, "final_norm": True, "head_bias": True},
    "nope": {"tied": False, "final_norm": False, "head_bias": False},
    "relu2": {"tied": False, "final_norm": True, "head_bias": False},
}
# the decoder options of the declarations -> the config's fields
_OPTION_FIELDS = {"tied": "tie_embeddings", "final_norm": "final_norm", "head_bias": "head_bias"}
# small enough for finite differences of every tensor in milliseconds, every piece present:
# d_k even (RoPE), H >= 3 (a LayerNorm over 2 features has a zero Jacobian), repeated ids
SIZES = dict(n_layers=2, hidden=8, n_heads=2, intermediate=12, max_len=8, vocab_size=11)
# the config's numbers off the presets' defaults (LLaMA 3's rope_theta): a decoder whose blocks
# dropped rope_base was green at 10000 (issue 41).  The norm's eps is each preset's own (1e-5,
# 1e-6): a decoder that fixes one is off in the other form
NUMBERS = dict(rope_base=500000.0)
CASES = [("B2-T6", dict(B=2, T=6, seed=0)), ("B3-T2", dict(B=3, T=2, seed=1))]
EQUATIONS = ("decoder.forward", "decoder.backward", "decoder.tied")


def decoder_config(impl, form: str, needs: dict | None = None, **changes) -> DecoderConfig:
    """The form's preset at SIZES with what the implementation declares: attention biases
    (the attention_bias claim), the feed-forward part's biases as it has them (an MLP's:
    ffn.b_1 and b_2, both or neither; LLaMA's SwiGLU: swiglu.bias); for an MLP its activation
    (the preset's -- gelu_new, squared ReLU in the relu2 form -- where declared, else its
    first); with RoPE its convention (Hugging Face's half-split where declared, else the
    interleaved pairs); the head (tied or not), the final norm and the head's bias as the form
    prefers where declared (:data:`PREFERS`)."""
    preset, _ = FORMS[form]
    caps = form_capabilities(impl, form, needs)
    chosen = {field: _preferred(caps["decoder"][option], PREFERS[form].get(option))
              for option, field in _OPTION_FIELDS.items()}
    if preset().rope:
        conventions = [c for c in ("half", "interleaved") if c in caps["attention"]["rope"]]
        if not conventions:
            raise NotApplicable(not_claimed_message(label_of(impl), "RoPE (it declares "
                                                    "attention.rope=None only)"))
        chosen["rope_convention"] = conventions[0]
    if preset().ffn == "swiglu":
        chosen["mlp_bias"] = bool(resolve_variant(caps, "swiglu")["bias"])
    else:
        ffn = resolve_variant(caps, "ffn")
        mlp_bias = bool(ffn["b_1"] and ffn["b_2"])
        missing = unmet(caps, {"ffn.b_1": mlp_bias, "ffn.b_2": mlp_bias})
        if missing:
            raise NotApplicable(not_claimed_message(label_of(impl), missing + " (a decoder's "
                                                    "FFN has both biases or neither)"))
        chosen.update(mlp_bias=mlp_bias,
                      activation=_preferred(caps["ffn"]["activation"], preset().activation))
    config = preset(**{**SIZES, **NUMBERS, "attn_bias": bool(caps["attention_bias"]), **chosen,
                       **changes})
    return with_pinned_config(caps, config)  # a LayerNorm eps fixed in the code: at it


def form_capabilities(impl, form: str, needs: dict | None = None) -> dict:
    """The declaration the form is run in: the implementation's, or where it declares the
    combinations it was confirmed in (``decoder_forms``: a recorded decoder's), the first of
    them with what the form (and ``needs``) needs -- none: n/a, never a cross of them run."""
    caps = capabilities(impl)
    if not caps[DECODER_FORMS]:
        return caps
    wanted = {**FORMS[form][1], **(needs or {})}
    found = next((c for c in caps[DECODER_FORMS] if unmet(c, wanted) is None), None)
    if found is None:
        said = (f"the {form} form: none of its {len(caps[DECODER_FORMS])} {DECODER_FORMS} (the "
                f"combinations it was confirmed in) has {_said(wanted)}")
        raise NotApplicable(not_claimed_message(label_of(impl), said))
    return found


def _said(needs: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in needs.items())


def _preferred(declared: tuple, prefer):
    """The value a form prefers where it is declared, else the first declared."""
    return prefer if prefer in declared else declared[0]


def decoder_params(config: DecoderConfig, seed: int = 0, dtype=np.float64,
                   weight_scale: float = 15.0) -> dict[str, np.ndarray]:
    """Random parameters of the protocol's names (minibert_reference.decoder.param_shapes): gamma !=
    1,
    biases != 0, weights ~ N(0, (0.02 * weight_scale)^2) so attention is far from uniform."""
    p = randomized(init_params(config, seed=seed, dtype=np.float64), seed, weight_scale)
    return {k: v.astype(dtype) for k, v in p.items()}


def decoder_batch(config: DecoderConfig, B: int, T: int, seed: int = 0):
    """(ids [B, T] with repeated ids, labels: the ids with ~1/4 of the positions ignored, at
    least one predicted position 1..T-1 per batch)."""
    rng = np.random.default_rng(seed + 2)
    ids = rng.integers(0, min(config.vocab_size, max(2, B * T // 2)), size=(B, T))
    labels = np.where(rng.random((B, T)) < 0.25, IGNORE_INDEX, ids)
    labels[0, T - 1] = ids[0, T - 1]  # something to predict
    return ids, labels


def _cases(forms=FORMS):
    return [(f"{form}-{label}", dict(form=form, **kw)) for form in forms for label, kw in CASES]


def _quick(kw) -> bool:
    return kw.get("seed", 0) == 0


# --------------------------------------------------------------------------- finite differences
@check("fd", "decoder", cases=_cases(), ops=("decoder",), equations=EQUATIONS,
       needs=lambda kw: FORMS[kw["form"]][1], quick=_quick)
def decoder_gradients_match_finite_differences(impl, form, B, T, seed):
    """Every parameter tensor through the whole model: decoder_backward(dlogits) against
    central differences of sum(logits * dlogits), float64, a random upstream gradient on
    every position (the last included), random weights."""
    config = decoder_config(impl, form)
    params = decoder_params(config, seed)
    ids, _ = decoder_batch(config, B, T, seed)
    logits, cache = impl.decoder_forward(params, config, ids)
    dlogits = np.random.default_rng(seed + 3).standard_normal(np.shape(logits))
    grads = impl.decoder_backward(dlogits, cache)
    _same_keys(grads, params)

    def objective(**p):
        return float(np.sum(np.asarray(impl.decoder_forward(p, config, ids)[0]) * dlogits))

    assert_all_passed(check_gradients(objective, params, grads, n_dirs=2, op=f"decoder[{form}]",
                                      rng=np.random.default_rng(seed + 4)))


@check("fd", "decoder.loss", cases=_cases(), ops=("decoder",), equations=EQUATIONS,
       needs=lambda kw: FORMS[kw["form"]][1])
def decoder_loss_gradients_match_finite_differences(impl, form, B, T, seed):
    """The next-token loss (labels with ignored positions) and its gradients: every parameter
    tensor against central differences of the loss, float64."""
    config = decoder_config(impl, form)
    params = decoder_params(config, seed)
    ids, labels = decoder_batch(config, B, T, seed)
    value, grads = impl.decoder_loss_and_grads(params, config, ids, labels)
    _same_keys(grads, params)
    loss = loss_of(impl, config, ids, labels, params, value, seed)
    assert_all_passed(check_gradients(loss, params, grads, n_dirs=2,
                                      op=f"decoder[{form}] loss",
                                      rng=np.random.default_rng(seed + 5)))


# the loss without its backward, which an implementation may provide (the protocol's optional
# name of the decoder row): the finite differences evaluate the loss ~100 times a check, and
# each backward of decoder_loss_and_grads there was thrown away
(LOSS_ONLY,) = OPS["decoder"].optional


def loss_of(impl, config, ids, labels, params, value, seed: int):
    """The loss the finite differences differentiate, ``loss(**params) -> float``: the
    implementation's loss-only :data:`LOSS_ONLY` where it provides one, else the loss of
    ``decoder_loss_and_grads`` (its gradients computed and dropped).  A loss-only function is
    trusted only as the same function as the full one: it must give the full one's ``value``
    at ``params`` and the full one's loss at a second point (each parameter moved by ~1e-2
    from a generator of its own: the check's own draws are untouched), within
    F64_IDENTITY_RTOL (the same loss, in float64, by another path) -- else the check fails,
    naming both values; never a gradient judged against another function than its own."""
    def full(**p):
        return float(impl.decoder_loss_and_grads(p, config, ids, labels)[0])

    if not provides(impl, LOSS_ONLY):
        return full
    only = getattr(impl, LOSS_ONLY)

    def loss(**p):
        return float(only(p, config, ids, labels))

    rng = np.random.default_rng(seed + 6)
    moved = {k: v + 1e-2 * rng.standard_normal(np.shape(v)) for k, v in params.items()}
    for where, p, want in (("at the check's parameters", params, float(value)),
                           ("at parameters moved by ~1e-2", moved, full(**moved))):
        got = loss(**p)
        assert abs(got - want) <= F64_IDENTITY_RTOL * max(1.0, abs(want)), (
            f"{LOSS_ONLY} gives {got!r} {where}, decoder_loss_and_grads' loss {want!r}: the "
            f"loss alone is not the loss whose gradients are checked (|difference| "
            f"{abs(got - want):.2e} > {F64_IDENTITY_RTOL:g} x max(1, |loss|))")
    return loss


def _same_keys(grads, params) -> None:
    if not isinstance(grads, dict) or set(grads) != set(params):
        got = sorted(grads) if isinstance(grads, dict) else type(grads).__name__
        raise AssertionError(f"decoder gradients: keys {got} differ from the parameters' "
                             f"{sorted(params)}")


# --------------------------------------------------------------------------- invariants
@check("invariant", "decoder.gradient_bookkeeping",
       cases=[(f"{form}-{d}", dict(form=form, dtype=t)) for form in FORMS
              for d, t in (("f64", np.float64), ("f32", np.float32))],
       ops=("decoder",), equations=("decoder.backward",), needs=lambda kw: FORMS[kw["form"]][1])
def decoder_grads_match_params_keys_shapes_dtypes(impl, form, dtype):
    """The gradients have exactly the parameters' keys, shapes and dtypes, are finite, and
    every tensor takes part (a name mismatch that zeroes a gradient fails); the loss keeps the
    dtype (a float64 scalar from float32 is the documented convention)."""
    config = decoder_config(impl, form)
    params = decoder_params(config, 1, dtype)
    ids, labels = decoder_batch(config, 2, 5, 1)
    loss, grads = impl.decoder_loss_and_grads(params, config, ids, labels)
    _same_keys(grads, params)
    for name, p in params.items():
        g = np.asarray(grads[name])
        assert g.shape == p.shape and g.dtype == p.dtype, (
            f"d{name}: shape {g.shape} dtype {g.dtype}, expected {p.shape} {p.dtype}")
        assert np.all(np.isfinite(g)), f"d{name}: non-finite entries"
        rows = g[:ids.shape[1]] if name == "embeddings.position.W" else g  # later rows: 0
        assert np.any(rows != 0), f"d{name}: identically zero"
    assert np.asarray(loss).dtype in (dtype, np.float64), f"loss dtype {np.asarray(loss).dtype}"


@check("invariant", "decoder.causal", cases=[(form, dict(form=form)) for form in FORMS],
       ops=("decoder",), equations=("decoder.causal",), needs=lambda kw: FORMS[kw["form"]][1],
       quick=True)
def decoder_logits_read_earlier_ids_only(impl, form):
    """Changing the ids from position t on leaves the logits of positions < t unchanged (a
    causal mask in the wrong direction, or none, changes them) and changes those at t (the
    model does read its own token)."""
    config = decoder_config(impl, form)
    params = decoder_params(config, 2)
    ids, _ = decoder_batch(config, 2, 6, 2)
    logits = np.asarray(impl.decoder_forward(params, config, ids)[0])
    scale = max_abs(logits)
    for t in (1, 3, 5):
        later = ids.copy()
        later[:, t:] = (ids[:, t:] + 1 + np.arange(ids.shape[1] - t)) % config.vocab_size
        changed = np.asarray(impl.decoder_forward(params, config, later)[0])
        assert_close(changed[:, :t], logits[:, :t], rtol=0, atol=F64_IDENTITY_RTOL * scale,
                     what=f"decoder[{form}]: logits[:, :{t}] after ids[:, {t}:] changed (the "
                          "earlier positions must not see later tokens)",
                     got_name="after", want_name="before")
        assert np.abs(changed[:, t] - logits[:, t]).max() > 1e-6 * scale, (
            f"decoder[{form}]: logits[:, {t}] did not change when ids[:, {t}] did")


@check("invariant", "decoder.tied", cases=[(form, dict(form=form)) for form in FORMS],
       ops=("decoder",), equations=("decoder.tied",), needs=lambda kw: FORMS[kw["form"]][1])
def tied_gradient_is_the_sum_of_both_uses(impl, form):
    """The tied table's gradient equals the untied model's two gradients at the same values
    (lm_head.W = embeddings.token.W): the lookup's share plus the head's, each nonzero."""
    caps = form_capabilities(impl, form)
    missing = unmet(caps, {"decoder.tied": True}) or unmet(caps, {"decoder.tied": False})
    if missing:
        raise NotApplicable(not_claimed_message(label_of(impl), missing + ": the two uses are "
                                                "told apart by the untied model"))
    tied = decoder_config(impl, form, tie_embeddings=True)
    untied = tied.replace(tie_embeddings=False)
    params = decoder_params(tied, 3)
    ids, labels = decoder_batch(tied, 2, 5, 3)
    _, g_tied = impl.decoder_loss_and_grads(params, tied, ids, labels)
    twin = {**params, "lm_head.W": params["embeddings.token.W"].copy()}
    _, g_untied = impl.decoder_loss_and_grads(twin, untied, ids, labels)
    lookup, head = g_untied["embeddings.token.W"], g_untied["lm_head.W"]
    assert np.any(lookup != 0) and np.any(head != 0), "a share of the table is identically 0"
    assert_close(g_tied["embeddings.token.W"], lookup + head, rtol=0,
                 atol=F64_IDENTITY_RTOL * max_abs(lookup, head),
                 what=f"decoder[{form}] d embeddings.token.W (tied) vs the lookup's share + the "
                      "head's (untied)", got_name="tied", want_name="sum")


@check("invariant", "decoder.bit_identical_and_pure",
       cases=[(form, dict(form=form)) for form in FORMS], ops=("decoder",),
       needs=lambda kw: FORMS[kw["form"]][1])
def decoder_calls_are_bit_identical_and_pure(impl, form):
    """Two identical loss_and_grads calls give the same bits and leave params untouched."""
    config = decoder_config(impl, form)
    params = decoder_params(config, 4)
    before = {k: v.copy() for k, v in params.items()}
    ids, labels = decoder_batch(config, 2, 5, 4)
    l1, g1 = impl.decoder_loss_and_grads(params, config, ids, labels)
    l2, g2 = impl.decoder_loss_and_grads(params, config, ids, labels)
    assert np.asarray(l1).tobytes() == np.asarray(l2).tobytes(), f"loss {l1!r} vs {l2!r}"
    for name in g1:
        assert np.asarray(g1[name]).tobytes() == np.asarray(g2[name]).tobytes(), (
            f"d{name} differs between two identical calls")
    for name, v in params.items():
        assert np.array_equal(v, before[name]), f"params[{name!r}] was modified"


@check("invariant", "decoder.float32_vs_float64",
       cases=[(form, dict(form=form)) for form in FORMS], ops=("decoder",),
       needs=lambda kw: FORMS[kw["form"]][1])
def decoder_float32_agrees_with_float64(impl, form):
    """float32 parameters through the same code: logits, loss and every gradient agree with
    the float64 run on the same (rounded) values."""
    config = decoder_config(impl, form)
    p32 = decoder_params(config, 5, np.float32)
    p64 = {k: v.astype(np.float64) for k, v in p32.items()}
    ids, labels = decoder_batch(config, 2, 5, 5)
    out64 = np.asarray(impl.decoder_forward(p64, config, ids)[0])
    out32 = np.asarray(impl.decoder_forward(p32, config, ids)[0])
    assert_f32_close(out32, out64, max_abs(out64), f"decoder[{form}] logits")
    l64, g64 = impl.decoder_loss_and_grads(p64, config, ids, labels)
    l32, g32 = impl.decoder_loss_and_grads(p32, config, ids, labels)
    assert_f32_close(l32, l64, abs(float(l64)), f"decoder[{form}] loss")
    scale = max_abs(*g64.values())
    for name in g64:
        assert_f32_close(g32[name], g64[name], scale, f"decoder[{form}] d{name}")



# ------------------------------------------------------------------ the decoder row's whole model
class DecoderRowModel(ModelOfRows):
    """``minibert check X --model`` where X provides the decoder row: its own
    ``decoder_loss_and_grads`` at the first form of :data:`FORMS` it declares
    (:func:`decoder_config`, at :data:`SIZES`), judged as any whole model (directional FD per
    tensor, then element-wise at the worst).  The decoder row's checks judge every declared
    form; this one is the model-level verdict, the first row of the report."""

    def __init__(self, obj, label: str | None = None):
        self.label = label or label_of(obj)
        self.proxy = ImplProxy(obj, self.label)
        caps = capabilities(obj)
        declared = caps[DECODER_FORMS] or (caps,)  # the combinations it was confirmed in
        self.form = next((f for f, (_, needs) in FORMS.items()
                          if any(unmet(c, needs) is None for c in declared)), None)
        if self.form is None:
            raise Refused(f"--model: {self.label}'s decoder row declares none of the decoder "
                          f"forms ({', '.join(FORMS)}): nothing to judge it in")
        self.config = decoder_config(self.proxy, self.form)
        config, proxy = self.config, self.proxy

        def loss_and_grads(params, ids, labels):
            return proxy.decoder_loss_and_grads(params, config, ids, labels)

        super().__init__(loss_and_grads, decoder_params(config),
                         batch={"ids": "ids", "labels": "labels"}, vocab=config.vocab_size,
                         max_len=config.max_len, name=f"decoder({self.label})")

    def describe(self) -> str:
        return (f"the decoder row's model ({self.label}.decoder_loss_and_grads in the "
                f"{self.form} form: {self.config.n_layers} layers, H={self.config.hidden}, "
                f"V={self.config.vocab_size})")

    def look_next(self) -> str:
        return (f"the model is the implementation's decoder row: look next at its checks "
                f"(minibert check {self.label} --ops decoder) and at the op rows its layers "
                f"use, if it provides them")


def model_of_rows(obj, label: str | None = None) -> ModelOfRows:
    """The whole model ``minibert check X --model`` judges where X is no model declaration:
    its decoder row's model where it provides one (:class:`DecoderRowModel`), else the model
    composed of its op rows (minibert_spec.protocol.composed.composed_model)."""
    if provides(obj, *OPS["decoder"].names):
        return DecoderRowModel(obj, label)
    return composed_model(obj, label)
