"""LLaMA's feed-forward part as transformers has it (``LlamaMLP``), a leaf of
:mod:`minibert_spec.suite.torch_oracle` (which re-exports it): the SwiGLU op's twin and, for a
block whose ``p`` holds ``swiglu.*``, the block's feed-forward part.  Also the weight layout
both use (ours ``[n_in, n_out]``, torch's ``[n_out, n_in]``)."""

from __future__ import annotations

import functools
from collections.abc import Mapping

import torch

# the names of a block's SwiGLU weights after "swiglu.", in swiglu()'s argument order
SWIGLU_ARGS = ("W_1", "W_2", "W_3", "b_1", "b_2", "b_3")


def weight(W: torch.Tensor) -> torch.Tensor:
    """Our linear weights are [n_in, n_out] (y = x W); torch's are [n_out, n_in]."""
    return W.t()


@functools.cache
def _llama_mlp(H: int, I: int, bias: bool):
    """transformers' own LlamaMLP (gate, up and down projections, SiLU), from a random small
    config (nothing downloaded); ``mlp_bias`` when the biases are given."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    # head_dim: the MLP has no attention, but the config validates RoPE's rotary dimension,
    # which must be even -- left to default (H / heads) an odd H is refused, a false red on a
    # correct SwiGLU of odd width
    config = LlamaConfig(hidden_size=H, intermediate_size=I, mlp_bias=bias, hidden_act="silu",
                         num_attention_heads=1, head_dim=2, num_hidden_layers=1, vocab_size=8)
    return LlamaMLP(config)


def swiglu(x, W_1, W_2, W_3, b_1=None, b_2=None, b_3=None):
    """LlamaMLP, down(silu(gate(x)) * up(x)), run with our weights (functional_call): W_1 is
    its gate_proj, W_3 its up_proj, W_2 its down_proj."""
    H, I = W_1.shape
    bias = b_1 is not None
    state = {"gate_proj.weight": weight(W_1), "up_proj.weight": weight(W_3),
             "down_proj.weight": weight(W_2)}
    if bias:
        state.update({"gate_proj.bias": b_1, "up_proj.bias": b_3, "down_proj.bias": b_2})
    return torch.func.functional_call(_llama_mlp(int(H), int(I), bias), state, (x,))


def block_swiglu(x, p: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """A block's feed-forward part when it is SwiGLU (block.ffn "swiglu": ``p`` holds
    ``swiglu.W_1`` gate, ``swiglu.W_3`` up, ``swiglu.W_2`` down, biases where present)."""
    return swiglu(x, *(p.get(f"swiglu.{n}") for n in SWIGLU_ARGS))
