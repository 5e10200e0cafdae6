"""The one map from the decoder's parameter names to Hugging Face's GPT-2 and LLaMA state dicts
(reference/hf/decoder.py): every tensor of transformers' model is covered exactly once (a tied
head excepted), each of ours is one of theirs or one third of GPT-2's c_attn, and the two
conversions it drives are inverses."""

from __future__ import annotations

import os

import numpy as np
import pytest

from minibert_reference import decoder as D
from minibert_reference.config import gpt2, llama
from minibert_reference.hf.decoder import from_hf, hf_names, to_hf

transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SIZES = dict(n_layers=2, hidden=8, n_heads=2, intermediate=12, max_len=6, vocab_size=11)
CONFIGS = {"gpt2": gpt2(**SIZES), "llama": llama(**SIZES),
           "llama_tied": llama(**SIZES, tie_embeddings=True)}


def _state_dict_shapes(config) -> dict:
    from minibert_spec.suite.checks.oracle_decoder import hf_model

    params = D.init_params(config, seed=0, dtype=np.float64)
    return {k: tuple(v.shape) for k, v in hf_model(config, params, np.float64)
            .state_dict().items()}


@pytest.mark.parametrize("name", CONFIGS)
def test_every_transformers_tensor_is_covered_once(name):
    config = CONFIGS[name]
    theirs = _state_dict_shapes(config)
    names = hf_names(config)
    assert set(names) == set(D.param_shapes(config))
    used = [t for t, _ in names.values()]
    tied = {"lm_head.weight"} if config.tie_embeddings else set()
    assert set(used) | tied == set(theirs), set(used) ^ set(theirs)
    for t in set(used):
        count, how = used.count(t), {h for n, (u, h) in names.items() if u == t}
        assert count == 1 or (count == 3 and all(h.startswith("qkv:") for h in how)), (t, how)


def _round_trip(config):
    """Random parameters, their state dict, and the check that from_hf(to_hf(p)) is p."""
    p = {k: np.random.default_rng(0).standard_normal(v) for k, v in
         D.param_shapes(config).items()}
    state = to_hf(p, config)
    back = from_hf(state, config)
    assert list(back) == list(p) and all(np.array_equal(back[k], p[k]) for k in p)
    return p, state


def test_the_conversions_are_inverses_and_c_attn_is_q_k_v():
    config = CONFIGS["gpt2"]
    p, state = _round_trip(config)
    W = state["transformer.h.0.attn.c_attn.weight"]
    assert W.shape == (8, 24)
    assert np.array_equal(W[:, 8:16], p["layers.0.attn.W_k"])
    assert np.array_equal(state["transformer.h.1.attn.c_attn.bias"][16:], p["layers.1.attn.b_v"])


def test_llama_linears_are_transposed_and_swiglu_is_gate_up_down():
    config = CONFIGS["llama"]
    p, state = _round_trip(config)
    mlp = "model.layers.1.mlp."
    for ours, theirs in (("swiglu.W_1", "gate_proj"), ("swiglu.W_3", "up_proj"),
                         ("swiglu.W_2", "down_proj")):
        assert np.array_equal(state[f"{mlp}{theirs}.weight"], p[f"layers.1.{ours}"].T), ours
    assert np.array_equal(state["model.layers.0.self_attn.o_proj.weight"],
                          p["layers.0.attn.W_o"].T)


@pytest.mark.parametrize("changes", [dict(position="learned_rope"), dict(position="sinusoidal"),
                                     dict(position="none"), dict(final_norm=False),
                                     dict(head_bias=True)])
def test_a_form_hugging_face_lacks_is_refused(changes):
    """No GPT-2 or LLaMA of transformers is a decoder of the ports' forms: the map says so
    instead of mapping some of the tensors."""
    with pytest.raises(ValueError, match=r"config: expected GPT-2's or LLaMA's form .* Hugging "
                                         r"Face has no such model"):
        hf_names(gpt2(**SIZES, **changes))
