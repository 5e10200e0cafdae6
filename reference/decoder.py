"""A causal decoder composed from the op pairs, in the two forms Hugging Face has (the
config's presets, minibert_reference.config.gpt2 / llama) and the forms ports write:

* GPT-2: token + learned position embeddings -> L pre-LN blocks (causal biased attention, a
  gelu_new MLP) -> the final LayerNorm -> the LM head tied to the token embedding ->
  next-token cross-entropy;
* LLaMA: token embedding -> L pre-RMSNorm blocks (causal attention with RoPE on q and k, no
  biases, a SwiGLU FFN) -> the final RMSNorm -> an LM head (its own, or tied) -> next-token
  cross-entropy;
* any of those with other positions (``position``: learned + RoPE, the fixed sinusoidal table,
  none), without the final norm (``final_norm=False``) or with a bias on the LM head
  (``head_bias``: logits = h W^T + b, tied or untied).

Parameters are one flat ``dict[str, ndarray]`` with stable dotted names (:func:`param_shapes`);
each maps to one tensor of Hugging Face's GPT2LMHeadModel / LlamaForCausalLM (or one third of
GPT-2's fused ``c_attn``): the map is written once, in reference/hf/decoder.py.

* ``embeddings.token.W`` [V, H] (wte / embed_tokens), ``embeddings.position.W`` [T_max, H]
  (wpe; learned positions, with or without RoPE, only);
* ``layers.{i}.<name>``, a pre-LN block's parameters (minibert_reference.ops.block_param_names: the
  block's own dict, so a layer is a ``block`` row's ``p``): ``attn.W_q .. attn.W_o`` [H, H]
  (x W: [in, out]) and ``attn.b_*`` [H] (with biases), ``ln1.gamma`` (``ln1.beta`` for
  LayerNorm), ``ffn.W_1`` [H, I], ``ffn.b_1``, ``ffn.W_2`` [I, H], ``ffn.b_2`` (with biases)
  or SwiGLU's ``swiglu.W_1`` (gate) and ``swiglu.W_3`` (up) [H, I], ``swiglu.W_2`` (down)
  [I, H] (``swiglu.b_*`` with biases), ``ln2.*``;
* ``final_ln.gamma`` (``final_ln.beta``): ln_f / norm (with the final norm only);
* ``lm_head.W`` [V, H] (untied only; stored like the embedding table: logits = h W^T);
* ``lm_head.b`` [V] (with the head's bias only, tied or untied).

``backward`` returns a dict with exactly the same keys, shapes and dtypes.  With the tied head
the token table is used twice, by the lookup and by the logits: its gradient is the sum of
both shares (the equation ``decoder.tied``).

Each entry point checks its arguments once, then runs the unchecked bodies (``run_forward``,
``run_backward``), which call the ops' kernels and nothing else.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from minibert_reference import ops
from minibert_reference.config import DecoderConfig
from minibert_reference.model import init_from_shapes
from minibert_reference.ops import IGNORE_INDEX
from minibert_reference.registry import implements
from minibert_reference.validate import as_float_array, as_index_array, check_param_dict

__all__ = ["param_shapes", "init_params", "decoder_forward", "decoder_backward",
           "decoder_loss", "decoder_loss_and_grads"]


def layer_names(config: DecoderConfig) -> tuple[str, ...]:
    """One layer's local parameter names: a pre-LN block of the config's parts."""
    return ops.block_param_names(config.attn_bias, "pre", b_1=config.mlp_bias,
                                 b_2=config.mlp_bias, normalization=config.normalization,
                                 ffn=config.ffn, swiglu_bias=config.mlp_bias)


def param_shapes(config: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter, in a stable order."""
    _check_config(config)
    H, V = config.hidden, config.vocab_size
    shapes: dict[str, tuple[int, ...]] = {"embeddings.token.W": (V, H)}
    if config.position_table:
        shapes["embeddings.position.W"] = (config.max_len, H)
    block = ops.block_param_shapes(layer_names(config), H, config.intermediate)
    for i in range(config.n_layers):
        shapes.update({f"layers.{i}.{name}": shape for name, shape in block.items()})
    if config.final_norm:
        shapes["final_ln.gamma"] = (H,)
        if config.normalization == "layernorm":
            shapes["final_ln.beta"] = (H,)
    if not config.tie_embeddings:
        shapes["lm_head.W"] = (V, H)
    if config.head_bias:
        shapes["lm_head.b"] = (V,)
    return shapes


def init_params(config: DecoderConfig, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Weights ~ N(0, init_std^2), biases 0, norm gamma 1 / beta 0."""
    return init_from_shapes(param_shapes(config), config.init_std, seed, dtype)


class DecoderCache(NamedTuple):
    config: DecoderConfig
    dtype: np.dtype  # of every parameter
    token: ops.EmbeddingCache
    # the learned table's, the sinusoidal table's, or None (RoPE alone, no positions)
    position: ops.PositionEmbeddingCache | ops.SinusoidalPositionCache | None
    blocks: list  # one ops.PreLNBlockCache per layer, in forward order
    final: ops.LayerNormCache | ops.RMSNormCache | None  # None without the final norm
    head: ops.LinearCache  # logits = h W^T (+ b), W the token table (tied) or lm_head.W


class LossCache(NamedTuple):
    model: DecoderCache
    loss: ops.NextTokenCache  # of logits[:, :-1] against labels[:, 1:]


# --------------------------------------------------------------------------- the bodies
def _layer_params(params, i: int) -> dict[str, np.ndarray]:
    """Layer i's parameters by their local names (``attn.W_q``, ``ln1.gamma``, ...)."""
    prefix = f"layers.{i}."
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


def _block_keywords(config: DecoderConfig) -> dict:
    """What every layer is: a causal pre-LN block of the config's parts."""
    rope = config.rope_convention if config.rope else None
    return dict(n_heads=config.n_heads, eps=config.ln_eps, activation=config.activation,
                norm="pre", causal=True, normalization=config.normalization, ffn=config.ffn,
                rope=rope, rope_base=config.rope_base)


def _head_table(params, config: DecoderConfig) -> np.ndarray:
    """The LM head's [V, H] matrix: the token embedding (tied) or lm_head.W."""
    return params["embeddings.token.W" if config.tie_embeddings else "lm_head.W"]


def _positions_forward(x, params, config: DecoderConfig):
    """The embedding's positions: the learned table's rows, the sinusoidal table, or nothing
    (RoPE turns q and k inside the blocks; "none" has the causal mask alone)."""
    if config.position_table:
        return ops._position_embedding_forward(x, params["embeddings.position.W"])
    if config.position == "sinusoidal":
        return ops._sinusoidal_position_forward(x)
    return x, None


def _positions_backward(dx, cache, grads: dict):
    """dx through the embedding's positions (the learned table's gradient into ``grads``)."""
    if isinstance(cache, ops.PositionEmbeddingCache):
        dx, grads["embeddings.position.W"] = ops._position_embedding_backward(dx, cache)
    elif cache is not None:
        (dx,) = ops._sinusoidal_position_backward(dx, cache)
    return dx


@implements("decoder.forward", "decoder.causal")
def run_forward(params, config: DecoderConfig, input_ids):
    """ids [B, T] -> logits [B, T, V]: x_0 = W_E[ids] (+ positions), x_l = B_l(x_{l-1}) (each
    a causal pre-LN block: position t reads positions <= t only), h = LN_f(x_L) (or x_L
    without the final norm), logits = h W^T (+ b) with W = W_E when tied.  Returns (logits,
    DecoderCache)."""
    x, c_tok = ops._embedding_forward(input_ids, params["embeddings.token.W"])  # [B, T, H]
    x, c_pos = _positions_forward(x, params, config)
    c_blocks = []
    for i in range(config.n_layers):
        x, c = ops._block_forward(x, _layer_params(params, i), **_block_keywords(config))
        c_blocks.append(c)
    h, c_final = x, None
    if config.final_norm:
        h, c_final = ops._norm_forward(x, params, "final_ln", config.ln_eps,
                                       config.normalization)
    logits, c_head = ops._linear_forward(h, _head_table(params, config).T,
                                         params.get("lm_head.b"))  # [B, T, V]
    return logits, DecoderCache(config, np.dtype(logits.dtype), c_tok, c_pos, c_blocks,
                                c_final, c_head)


@implements("decoder.backward", "decoder.tied")
def run_backward(dlogits, cache: DecoderCache) -> dict[str, np.ndarray]:
    """The forward's kernels in reverse: the head, the final norm, the blocks from the last to
    the first (the residual stream carries dx through each), the embeddings.  The tied table
    gets the lookup's share plus the head's (dW_E = E^T(dx_0) + dlogits^T h)."""
    config = cache.config
    dh, dW_head_t, db_head = ops._linear_backward(dlogits, cache.head)  # dh [B, T, H], [H, V]
    dx, grads = dh, {}
    if cache.final is not None:
        dx, grads = ops._norm_backward(dh, cache.final, "final_ln")
    if db_head is not None:
        grads["lm_head.b"] = db_head
    for i in reversed(range(config.n_layers)):
        dx, g = ops._block_backward(dx, cache.blocks[i])  # [B, T, H]
        grads.update({f"layers.{i}.{k}": v for k, v in g.items()})
    dx = _positions_backward(dx, cache.position, grads)
    (grads["embeddings.token.W"],) = ops._embedding_backward(dx, cache.token)
    head_share = np.ascontiguousarray(dW_head_t.T)  # [V, H]
    if config.tie_embeddings:  # one table, two uses: the lookup's share + the head's
        grads["embeddings.token.W"] = grads["embeddings.token.W"] + head_share
    else:
        grads["lm_head.W"] = head_share
    return {name: grads[name] for name in param_shapes(config)}


def run_loss(params, config: DecoderConfig, input_ids, labels, ignore_index: int):
    """Next-token cross-entropy: the logits at position t predict labels[t + 1] (Hugging
    Face's shift), mean over the predicted positions.  Returns (loss, LossCache)."""
    logits, cache = run_forward(params, config, input_ids)
    value, c_loss = ops._next_token_cross_entropy_forward(logits, labels,
                                                          ignore_index=ignore_index)
    return value, LossCache(cache, c_loss)


def run_loss_backward(dloss, cache: LossCache) -> dict[str, np.ndarray]:
    """The gradients of ``dloss`` times the loss; the last position predicts nothing, so its
    logits' gradient is exactly 0."""
    (dlogits,) = ops._next_token_cross_entropy_backward(dloss, cache.loss)  # [B, T, V]
    return run_backward(dlogits, cache.model)


# --------------------------------------------------------------------------- checks
def _check_config(config) -> None:
    if not isinstance(config, DecoderConfig):
        raise ValueError(f"config: expected a minibert_reference.config.DecoderConfig, got "
                         f"{type(config).__name__}")


def check_inputs(params, config: DecoderConfig, input_ids) -> np.dtype:
    """params (exactly param_shapes(config), one float dtype, finite) and ids [B, T] in [0, V)
    with T <= max_len; returns the parameters' dtype."""
    dtype = check_param_dict(params, param_shapes(config))
    as_index_array("input_ids", input_ids, ndim=2, low=0, high=config.vocab_size)
    if input_ids.shape[1] > config.max_len:
        raise ValueError(f"input_ids: sequence length {input_ids.shape[1]} exceeds "
                         f"config.max_len={config.max_len}")
    return dtype


def _labels(input_ids, labels, config: DecoderConfig, ignore_index: int):
    """The labels (default: the ids themselves, shifted inside the loss) checked: [B, T], and
    at least one predicted position among 1..T-1."""
    if input_ids.shape[1] < 2:
        raise ValueError(f"input_ids: a next-token loss needs T >= 2 (position t predicts t + "
                         f"1), got shape {input_ids.shape}")
    labels = input_ids if labels is None else labels
    as_index_array("labels", labels, shape=input_ids.shape, low=0, high=config.vocab_size,
                   allow=(ignore_index,))
    ops._check_ce_labels(labels[:, 1:], labels[:, 1:].shape, config.vocab_size, ignore_index,
                         "mean")
    return labels


# --------------------------------------------------------------------------- entry points
def decoder_forward(params, config: DecoderConfig, input_ids):
    """ids [B, T] -> (logits [B, T, V], cache)."""
    check_inputs(params, config, input_ids)
    return run_forward(params, config, input_ids)


def decoder_backward(dlogits, cache: DecoderCache) -> dict[str, np.ndarray]:
    """dlogits [B, T, V] -> the gradient of every parameter (param_shapes' keys)."""
    as_float_array("dlogits", dlogits, shape=cache.head.x.shape[:-1] + (cache.head.W.shape[1],),
                   dtype=cache.dtype)
    return run_backward(dlogits, cache)


def decoder_loss(params, config: DecoderConfig, input_ids, labels=None, *,
                 ignore_index: int = IGNORE_INDEX):
    """The next-token loss alone (labels default to the ids; labels[t + 1] is position t's
    target, ``ignore_index`` marks positions not predicted)."""
    check_inputs(params, config, input_ids)
    labels = _labels(input_ids, labels, config, ignore_index)
    return run_loss(params, config, input_ids, labels, ignore_index)[0]


def decoder_loss_and_grads(params, config: DecoderConfig, input_ids, labels=None, *,
                           ignore_index: int = IGNORE_INDEX):
    """One forward + backward of ``decoder_loss``.  Returns (loss, grads)."""
    dtype = check_inputs(params, config, input_ids)
    labels = _labels(input_ids, labels, config, ignore_index)
    value, cache = run_loss(params, config, input_ids, labels, ignore_index)
    return value, run_loss_backward(dtype.type(1.0), cache)
