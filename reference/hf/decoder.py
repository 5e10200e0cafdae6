"""The decoder's parameter names <-> Hugging Face's GPT2LMHeadModel / LlamaForCausalLM state
dicts: the one map (:func:`hf_names`), and the two conversions it drives (our parameters to a
state dict, and a dict of Hugging Face tensors -- gradients -- back to our names).

Each of our tensors is one Hugging Face tensor, transposed where Hugging Face stores a linear
layer as ``[out, in]`` (LLaMA's ``nn.Linear``; GPT-2's ``Conv1D`` is ``[in, out]`` like ours),
or one third of GPT-2's fused ``c_attn`` (``[W_q | W_k | W_v]`` along its columns, its bias
likewise).  A tied LM head is the token table (``lm_head.weight`` is not a tensor of its own).
NumPy only.
"""

from __future__ import annotations

import numpy as np

from minibert_reference.config import DecoderConfig
from minibert_reference.decoder import param_shapes

SAME, TRANSPOSED = "same", "transposed"  # how one of our tensors sits in Hugging Face's
QKV = ("q", "k", "v")  # the thirds of GPT-2's c_attn, in its column order


def hf_names(config: DecoderConfig) -> dict[str, tuple[str, str]]:
    """Our parameter name -> (Hugging Face name, how): ``same``, ``transposed`` or ``qkv:K``
    (column third K of GPT-2's fused c_attn).  GPT-2 names for learned positions, LLaMA's for
    RoPE (the two forms Hugging Face has)."""
    if config.position not in ("learned", "rope") or not config.final_norm or config.head_bias:
        raise ValueError(f"config: expected GPT-2's or LLaMA's form (learned or RoPE positions, "
                         f"the final norm, a head without bias), got position="
                         f"{config.position!r}, final_norm={config.final_norm}, head_bias="
                         f"{config.head_bias}: Hugging Face has no such model")
    gpt2 = config.position == "learned"
    names: dict[str, tuple[str, str]] = {}
    if gpt2:
        names["embeddings.token.W"] = ("transformer.wte.weight", SAME)
        names["embeddings.position.W"] = ("transformer.wpe.weight", SAME)
        names["final_ln.gamma"] = ("transformer.ln_f.weight", SAME)
        names["final_ln.beta"] = ("transformer.ln_f.bias", SAME)
    else:
        names["embeddings.token.W"] = ("model.embed_tokens.weight", SAME)
        names["final_ln.gamma"] = ("model.norm.weight", SAME)
    names["lm_head.W"] = ("lm_head.weight", SAME)  # [V, H] on both sides
    for i in range(config.n_layers):
        ours = f"layers.{i}."
        if gpt2:
            hf = f"transformer.h.{i}."
            for k, q in enumerate(QKV):
                names[f"{ours}attn.W_{q}"] = (f"{hf}attn.c_attn.weight", f"qkv:{k}")
                names[f"{ours}attn.b_{q}"] = (f"{hf}attn.c_attn.bias", f"qkv:{k}")
            names[f"{ours}attn.W_o"] = (f"{hf}attn.c_proj.weight", SAME)
            names[f"{ours}attn.b_o"] = (f"{hf}attn.c_proj.bias", SAME)
            for ln, n in (("ln1", "ln_1"), ("ln2", "ln_2")):
                names[f"{ours}{ln}.gamma"] = (f"{hf}{n}.weight", SAME)
                names[f"{ours}{ln}.beta"] = (f"{hf}{n}.bias", SAME)
            for w, n in (("1", "c_fc"), ("2", "c_proj")):
                names[f"{ours}ffn.W_{w}"] = (f"{hf}mlp.{n}.weight", SAME)
                names[f"{ours}ffn.b_{w}"] = (f"{hf}mlp.{n}.bias", SAME)
        else:
            hf = f"model.layers.{i}."
            for q in ("q", "k", "v", "o"):
                names[f"{ours}attn.W_{q}"] = (f"{hf}self_attn.{q}_proj.weight", TRANSPOSED)
                names[f"{ours}attn.b_{q}"] = (f"{hf}self_attn.{q}_proj.bias", SAME)
            names[f"{ours}ln1.gamma"] = (f"{hf}input_layernorm.weight", SAME)
            names[f"{ours}ln2.gamma"] = (f"{hf}post_attention_layernorm.weight", SAME)
            # SwiGLU: (silu(x W_1) * (x W_3)) W_2 (LlamaMLP's gate, up, down)
            for w, n in (("1", "gate_proj"), ("3", "up_proj"), ("2", "down_proj")):
                names[f"{ours}swiglu.W_{w}"] = (f"{hf}mlp.{n}.weight", TRANSPOSED)
                names[f"{ours}swiglu.b_{w}"] = (f"{hf}mlp.{n}.bias", SAME)
    return {k: names[k] for k in param_shapes(config)}  # every one of ours, in their order


def _third(how: str) -> int | None:
    return int(how.split(":")[1]) if how.startswith("qkv:") else None


def to_hf(params: dict, config: DecoderConfig) -> dict[str, np.ndarray]:
    """Our parameters as a Hugging Face state dict (c_attn's thirds concatenated; the tied LM
    head left to Hugging Face's own tying)."""
    out: dict[str, np.ndarray] = {}
    thirds: dict[str, dict[int, np.ndarray]] = {}
    for ours, (theirs, how) in hf_names(config).items():
        k = _third(how)
        if k is not None:
            thirds.setdefault(theirs, {})[k] = params[ours]
        else:
            out[theirs] = params[ours].T if how == TRANSPOSED else params[ours]
    for theirs, parts in thirds.items():
        out[theirs] = np.concatenate([parts[k] for k in range(len(QKV))], axis=-1)
    return out


def from_hf(tensors: dict, config: DecoderConfig) -> dict[str, np.ndarray]:
    """Hugging Face tensors (a state dict's, or their gradients) under our names, in
    param_shapes order: each its tensor, transposed back, or its third of c_attn."""
    out = {}
    for ours, (theirs, how) in hf_names(config).items():
        a = np.asarray(tensors[theirs])
        k = _third(how)
        if k is not None:
            a = np.split(a, len(QKV), axis=-1)[k]
        elif how == TRANSPOSED:
            a = a.T
        out[ours] = np.ascontiguousarray(a)
    return out
