"""The causal decoder against ``transformers``: GPT2LMHeadModel (and LlamaForCausalLM) built
from a config with random weights (no hub access: ``HF_HUB_OFFLINE=1``, nothing downloaded),
dropout 0, eager attention, float64 and float32; our random parameters copied into it through
the one name map (reference/hf/decoder.py), and its gradients read back through it.

Compared: the logits at every position, the next-token loss (labels with ignored positions)
and every parameter gradient -- the tied table's is the single ``wte.weight.grad``, where
torch accumulates both uses -- within ORACLE_RTOL_F64 (1e-10) / ORACLE_RTOL_F32 of each
tensor's magnitude (spec/suite/torch_oracle.allowed_error).  The key bias's exact gradient is 0
(softmax is shift invariant along the keys): it is rounding noise on both sides, judged against
the scale of the whole backward.

The loss is Hugging Face's own shift (position t predicts label t + 1; a label of -100 is not
predicted) taken on the model's logits in the case's dtype: ``ForCausalLMLoss`` upcasts the
logits to float32 (``logits.float()``), so ``model(labels=...)``'s loss of a float64 model is
float32 -- 1e-7 off, which would hide nothing and fail everything.

The decoder forms transformers has no model of (learned + RoPE, sinusoidal or no positions, no
final norm, a head bias: the ports' forms of spec/suite/checks/decoder.py) meet the decoder
composed from torch's functions instead (:func:`composed_decoder`, ``decoder.composed``
checks), compared the same way.
"""

from __future__ import annotations

import os

import numpy as np

from minibert_reference.hf.decoder import from_hf, to_hf
from minibert_spec.protocol import IGNORE_INDEX
from minibert_spec.suite.checks.decoder import FORMS, decoder_batch, decoder_config, decoder_params
from minibert_spec.suite.registry import check, lazy_module

torch = lazy_module("torch")
transformers = lazy_module("transformers")
to = lazy_module("minibert_spec.suite.torch_oracle")

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DTYPES = (("f64", np.float64), ("f32", np.float32))
# the decoder forms transformers has a model of; the ports' forms (learned + RoPE, sinusoidal or
# no positions, no final norm, a head bias) have none: they meet the decoder composed from
# torch's own functions instead (:func:`composed_decoder`, the decoder.composed checks)
ORACLE_FORMS = ("gpt2", "llama")
COMPOSED_FORMS = tuple(form for form in FORMS if form not in ORACLE_FORMS)
# what transformers' model of each form can be: LLaMA rotates Hugging Face's half-split pairs
# (GPT-2 without biases is transformers' GPT-2 with zero biases: hf_model)
ORACLE_NEEDS = {"llama": {"attention.rope": "half"}}


def hf_model(config, params: dict, dtype):
    """The transformers model of ``config``'s form with our parameters: GPT2LMHeadModel
    (learned positions) or LlamaForCausalLM (RoPE), dropout 0, eager attention, tied as the
    config says."""
    common = dict(vocab_size=config.vocab_size, attn_implementation="eager",
                  tie_word_embeddings=config.tie_embeddings, bos_token_id=0, eos_token_id=0)
    if config.position == "learned":
        hf_config = transformers.GPT2Config(
            n_positions=config.max_len, n_embd=config.hidden, n_layer=config.n_layers,
            n_head=config.n_heads, n_inner=config.intermediate,
            activation_function={"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu",
                                 "relu2": "relu2"}[
                config.activation], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            layer_norm_epsilon=config.ln_eps, **common)
        model = transformers.GPT2LMHeadModel(hf_config)
    else:
        hf_config = transformers.LlamaConfig(
            hidden_size=config.hidden, intermediate_size=config.intermediate,
            num_hidden_layers=config.n_layers, num_attention_heads=config.n_heads,
            num_key_value_heads=config.n_heads, max_position_embeddings=config.max_len,
            rms_norm_eps=config.ln_eps, attention_bias=config.attn_bias,
            mlp_bias=config.mlp_bias, attention_dropout=0.0, hidden_act="silu",
            rope_parameters={"rope_type": "default", "rope_theta": config.rope_base}, **common)
        model = transformers.LlamaForCausalLM(hf_config)
    assert model.config._attn_implementation == "eager", (
        f"transformers chose {model.config._attn_implementation!r} attention, not eager")
    if config.position == "rope" and dtype == np.float64:
        _llama_in_float64(model, config)
    model = model.to(torch.float64 if dtype == np.float64 else torch.float32).eval()
    state = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in to_hf(params,
                                                                            config).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    # GPT-2's Conv1D always has a bias: a GPT-2 declared without one is transformers' with 0
    no_bias = [k for k in missing if config.position == "learned" and k.endswith(".bias")]
    named = dict(model.named_parameters())
    with torch.no_grad():
        for k in no_bias:
            named[k].zero_()
    allowed = ({"lm_head.weight"} if config.tie_embeddings else set()) | set(no_bias)
    assert not unexpected and set(missing) <= allowed, (
        f"the name map does not cover transformers' model: missing {missing}, unexpected "
        f"{unexpected}")
    return model


def _llama_in_float64(model, config) -> None:
    """LlamaForCausalLM rounds three things to float32 whatever the model's dtype: RoPE's angles
    (LlamaRotaryEmbedding), each RMSNorm's statistics (LlamaRMSNorm) and the eager softmax
    (``softmax(..., dtype=torch.float32)``) -- 1e-6 off in float64, which would hide nothing and
    fail everything.  For the float64 run the same formulas run in float64: the angles as
    torch_oracle.llama_cos_sin forms them, torch's F.rms_norm with the module's own weight, and
    torch's scaled_dot_product_attention (transformers' "sdpa", float64 on the CPU) instead of
    the eager kernel.  The float32 run is transformers' eager model unchanged."""
    F = torch.nn.functional
    rotary = model.model.rotary_emb

    class Rotary64(torch.nn.Module):
        def forward(self, x, position_ids):
            return to.llama_cos_sin(rotary, x, position_ids, config.d_k, config.rope_base)

    class RMSNorm64(torch.nn.Module):
        def __init__(self, norm):
            super().__init__()
            self.weight, self.eps = norm.weight, norm.variance_epsilon

        def forward(self, x):
            return F.rms_norm(x, x.shape[-1:], self.weight, self.eps)

    model.model.rotary_emb = Rotary64()
    for name, module in list(model.named_modules()):
        if type(module).__name__ == "LlamaRMSNorm":
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent), leaf, RMSNorm64(module))
    model.set_attn_implementation("sdpa")


def hf_shift_loss(logits, labels):
    """transformers' causal-LM loss (ForCausalLMLoss: labels padded with -100 and shifted
    left, mean over the predicted positions) in the logits' own dtype."""
    F = torch.nn.functional
    shifted = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), shifted.reshape(-1),
                           ignore_index=IGNORE_INDEX)


def transformers_run(config, params: dict, ids, labels, dtype) -> dict:
    """logits, loss and every parameter gradient under our names, from transformers."""
    model = hf_model(config, params, dtype)
    out = model(input_ids=torch.from_numpy(ids))
    loss = hf_shift_loss(out.logits, torch.from_numpy(labels))
    loss.backward()
    named = dict(model.named_parameters())
    grads = {n: (torch.zeros_like(t) if t.grad is None else t.grad).numpy()
             for n, t in named.items()}
    if config.tie_embeddings:  # one tensor: lm_head.weight is wte/embed_tokens itself
        grads.setdefault("lm_head.weight", grads[next(iter(named))])
    return dict(logits=out.logits.detach().numpy(), loss=loss.detach().numpy(),
                grads=from_hf(grads, config))


def exactly_zero(name: str) -> bool:
    """The key bias: softmax is shift invariant along the keys, its gradient is exactly 0."""
    return name.endswith("attn.b_k")


def _compare(impl, part, form, dtype, run, zero, against: str) -> None:
    """The implementation's decoder of ``form`` against an oracle's on the same random weights
    and batch: ``run(config, params, ids, labels)`` -> the oracle's logits, next-token loss
    and gradients; the logits (every position) and the loss ("forward"), or every parameter
    gradient ("backward"), the gradients ``zero(config, name)`` names judged as exactly 0."""
    config = decoder_config(impl, form, ORACLE_NEEDS.get(form))
    params = decoder_params(config, 6, dtype, weight_scale=15.0)
    ids, labels = decoder_batch(config, 3, 7, 6)
    theirs = run(config, params, ids, labels)
    label = f"decoder[{form}]"
    if part == "forward":
        logits, _ = impl.decoder_forward(params, config, ids)
        to.assert_oracle(f"{label} logits", logits, theirs["logits"], dtype)
        loss, _ = impl.decoder_loss_and_grads(params, config, ids, labels)
        to.assert_oracle(f"{label} loss", np.asarray(loss), theirs["loss"], dtype)
        return
    _, grads = impl.decoder_loss_and_grads(params, config, ids, labels)
    assert set(grads) == set(params), (
        f"{label}: gradient keys {sorted(grads)} differ from the parameters' {sorted(params)}")
    to.assert_gradients(label, grads, theirs["grads"], reversed(list(params)), dtype,
                        lambda name: zero(config, name), against=against)


@check("oracle.forward|oracle.backward", "decoder.hf", kinds_arg="part", ops=("decoder",),
       requires=("torch", "transformers"),
       equations=("decoder.forward", "decoder.backward", "decoder.tied", "decoder.causal"),
       needs=lambda kw: {**FORMS[kw["form"]][1], **ORACLE_NEEDS.get(kw["form"], {})},
       cases=[(f"{form}-{d}", dict(form=form, dtype=t)) for form in ORACLE_FORMS
              for d, t in DTYPES])
def decoder_against_transformers(impl, part, form, dtype):
    """Random weights copied into transformers' model of the form: logits (every position)
    and the next-token loss ("forward"), every parameter gradient ("backward")."""
    _compare(impl, part, form, dtype,
             lambda config, params, ids, labels: transformers_run(config, params, ids, labels,
                                                                  dtype),
             lambda config, name: exactly_zero(name), against="transformers")


# --------------------------------------------------------------------------- the ports' forms
def composed_decoder(params: dict, config, ids):
    """The decoder of ``config`` composed from torch's functions (the suite's twins: F.embedding,
    the learned or sinusoidal table, the causal attention with RoPE where the config has it,
    F.layer_norm / F.rms_norm, the MLP or LLaMA's own MLP, F.linear for the head and its bias):
    logits [B, T, V] of torch tensors ``params``."""
    x = to.embedding(ids, params["embeddings.token.W"])
    if config.position_table:
        x = to.learned_position(x, params["embeddings.position.W"])
    elif config.position == "sinusoidal":
        x = to.sinusoidal_position(x)
    rope = config.rope_convention if config.rope else None
    for i in range(config.n_layers):
        p = {k[len(f"layers.{i}."):]: v for k, v in params.items()
             if k.startswith(f"layers.{i}.")}
        x = _composed_layer(x, p, config, rope)
    if config.final_norm:
        x = _normed(x, params, "final_ln", config)
    table = params["embeddings.token.W" if config.tie_embeddings else "lm_head.W"]
    return torch.nn.functional.linear(x, table, params.get("lm_head.b"))


def _normed(x, p: dict, name: str, config):
    F, H = torch.nn.functional, x.shape[-1]
    if config.normalization == "rmsnorm":
        return F.rms_norm(x, (H,), p[f"{name}.gamma"], config.ln_eps)
    return F.layer_norm(x, (H,), p[f"{name}.gamma"], p[f"{name}.beta"], config.ln_eps)


def _composed_layer(x, p: dict, config, rope):
    """One causal pre-norm layer: x + attention(norm1(x)), then + FFN(norm2(.))."""
    h = x + to.attention(_normed(x, p, "ln1", config),
                         *(p.get(f"attn.{n}") for n in ("W_q", "W_k", "W_v", "W_o", "b_q",
                                                          "b_k", "b_v", "b_o")),
                         n_heads=config.n_heads, causal=True, rope=rope,
                         rope_base=config.rope_base)
    n = _normed(h, p, "ln2", config)
    if config.ffn == "swiglu":
        return h + to.block_swiglu(n, p)
    return h + to.ffn(n, p["ffn.W_1"], p.get("ffn.b_1"), p["ffn.W_2"], p.get("ffn.b_2"),
                      config.activation)


def composed_run(config, params: dict, ids, labels) -> dict:
    """logits, the next-token loss (transformers' shift) and every gradient, from torch."""
    tp = {k: to.tensor(v, requires_grad=True) for k, v in params.items()}
    logits = composed_decoder(tp, config, torch.from_numpy(ids))
    loss = hf_shift_loss(logits, torch.from_numpy(labels))
    loss.backward()
    return dict(logits=logits.detach().numpy(), loss=loss.detach().numpy(),
                grads={k: t.grad.numpy() for k, t in tp.items()})


@check("oracle.forward|oracle.backward", "decoder.composed", kinds_arg="part", ops=("decoder",),
       requires=("torch", "transformers"),
       equations=("decoder.forward", "decoder.backward", "decoder.causal"),
       needs=lambda kw: FORMS[kw["form"]][1],
       cases=[(f"{form}-{d}", dict(form=form, dtype=t)) for form in COMPOSED_FORMS
              for d, t in DTYPES])
def decoder_against_composed_torch(impl, part, form, dtype):
    """The forms transformers has no model of, against the decoder composed from torch's
    functions: logits (every position) and the next-token loss ("forward"), every parameter
    gradient ("backward"), as the transformers checks compare them."""
    # the key bias's exact gradient is 0 without RoPE only: turned by position, it is not a
    # shift along the keys
    _compare(impl, part, form, dtype, composed_run,
             lambda config, name: exactly_zero(name) and not config.rope, against="torch")
