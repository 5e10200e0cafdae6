"""The encoder composed from the op pairs.

Parameters are one flat ``dict[str, ndarray]`` with stable dotted names; ``backward`` returns a
dict with exactly the same keys, shapes and dtypes, plus the gradient w.r.t. the input
embeddings (the sum of token and position embeddings fed to the first block).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from reference import ops, parallel
from reference.config import BertConfig
from reference.registry import implements
from reference.validate import (
    FLOAT_DTYPES,
    as_float_array,
    as_index_array,
    as_mask,
    check_all_finite,
)


def param_shapes(config: BertConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter, in a stable order."""
    H, I, V = config.hidden, config.intermediate, config.vocab_size
    shapes: dict[str, tuple[int, ...]] = {"embeddings.token.W": (V, H)}
    if config.position == "learned":
        shapes["embeddings.position.W"] = (config.max_len, H)
    if config.type_vocab_size:
        shapes["embeddings.type.W"] = (config.type_vocab_size, H)
    if config.embedding_layernorm:
        shapes["embeddings.ln.gamma"] = (H,)
        shapes["embeddings.ln.beta"] = (H,)
    for i in range(config.n_layers):
        for name in ops.block_param_names(config.attn_bias):
            if name.startswith("attn.W"):
                shape = (H, H)
            elif name in ("ffn.W_1",):
                shape = (H, I)
            elif name in ("ffn.b_1",):
                shape = (I,)
            elif name in ("ffn.W_2",):
                shape = (I, H)
            else:  # attention biases, b_2, LayerNorm gamma/beta
                shape = (H,)
            shapes[f"layers.{i}.{name}"] = shape
    if config.final_layernorm:
        shapes["final_ln.gamma"] = (H,)
        shapes["final_ln.beta"] = (H,)
    if config.head == "mlm" and config.mlm_style == "linear":
        shapes["mlm.W"] = (H, V)
        shapes["mlm.b"] = (V,)
    elif config.head == "mlm":  # BERT: transform + LayerNorm; the decoder is embeddings.token.W
        shapes.update({"mlm.transform.W": (H, H), "mlm.transform.b": (H,),
                       "mlm.ln.gamma": (H,), "mlm.ln.beta": (H,), "mlm.b": (V,)})
    if config.head == "classifier" or (config.head == "none" and config.pooler):
        shapes["pooler.W"] = (H, H)
        shapes["pooler.b"] = (H,)
    if config.head == "classifier":
        shapes["classifier.W"] = (H, config.num_labels)
        shapes["classifier.b"] = (config.num_labels,)
    return shapes


def init_params(config: BertConfig, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """BERT initialisation: weights ~ N(0, init_std^2), biases 0, LayerNorm gamma 1 / beta 0."""
    dtype = np.dtype(dtype)
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype: expected float32 or float64, got {dtype}")
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed: expected an integer >= 0, got {seed!r}")
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in param_shapes(config).items():
        leaf = name.rsplit(".", 1)[1]
        if leaf == "gamma":
            value = np.ones(shape)
        elif leaf == "beta" or leaf.startswith("b"):
            value = np.zeros(shape)
        else:
            value = rng.normal(0.0, config.init_std, size=shape)
        params[name] = value.astype(dtype)
    return params


def check_params(params, config: BertConfig) -> np.dtype:
    """Exactly the expected names and shapes, one float dtype, finite values."""
    if not isinstance(params, dict):
        raise ValueError(f"params: expected a dict of arrays, got {type(params).__name__}")
    expected = param_shapes(config)
    missing = sorted(set(expected) - set(params))
    extra = sorted(set(params) - set(expected))
    if missing or extra:
        raise ValueError(f"params: expected the keys of param_shapes(config); "
                         f"missing {missing}, unexpected {extra}")
    dtype = None
    for name, shape in expected.items():
        as_float_array(f"params[{name!r}]", params[name], shape=shape, dtype=dtype, finite=False)
        dtype = params[name].dtype
    check_all_finite({f"params[{name!r}]": params[name] for name in expected})
    return dtype


def _block_params(params, i: int) -> dict[str, np.ndarray]:
    prefix = f"layers.{i}."
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


class EmbeddingsCache(NamedTuple):
    token: ops.EmbeddingCache | ops.EmbeddingLNCache  # the whole BERT embedding layer with LN
    position: ops.PositionEmbeddingCache | ops.SinusoidalPositionCache | None
    token_type: ops.TokenTypeCache | None


class ModelCache(NamedTuple):
    config: BertConfig
    dtype: np.dtype  # of every parameter
    embeddings: EmbeddingsCache | None  # None when inputs_embeds replaced the tables
    blocks: list  # one ops.BlockCache per layer, in forward order
    final_ln: ops.LayerNormCache | None  # None without config.final_layernorm
    head: object  # LinearCache / MLMHeadCache / ClassifierCache; None for head "none"
    pooler: ops.PoolerCache | None  # head "none" with config.pooler
    pooled: np.ndarray | None  # the pooler's output [B, H] (head "none" with config.pooler)
    out_shape: tuple


class ShardedCache(NamedTuple):
    """``forward``'s cache when it ran as batch shards (``reference.parallel`` workers > 1): one
    ModelCache per shard; ``backward`` runs the shards' backwards the same way."""

    shards: tuple  # slices of the batch axis
    caches: tuple  # ModelCache of each shard
    dtype: np.dtype
    out_shape: tuple
    pooled: np.ndarray | None  # [B, H], the shards' pooled outputs concatenated


def _cut(rows: slice, *arrays):
    """The rows of each array (None stays None)."""
    return tuple(None if a is None else a[rows] for a in arrays)


def _check_ids(input_ids, config: BertConfig) -> None:
    as_index_array("input_ids", input_ids, ndim=2, low=0, high=config.vocab_size)
    if input_ids.shape[1] > config.max_len:
        raise ValueError(f"input_ids: sequence length {input_ids.shape[1]} exceeds "
                         f"config.max_len={config.max_len}")


def _check_token_types(token_type_ids, config: BertConfig, shape):
    """token_type_ids [B, T] in [0, type_vocab_size), default all 0; None without types."""
    if not config.type_vocab_size:
        if token_type_ids is not None:
            raise ValueError("token_type_ids: the config has no token types "
                             "(type_vocab_size=0), got an array")
        return None
    if token_type_ids is None:
        return np.zeros(shape, dtype=np.int64)
    return as_index_array("token_type_ids", token_type_ids, shape=shape, low=0,
                          high=config.type_vocab_size)


# --------------------------------------------------------------------------- kernels
# Unchecked, like the ops' kernels (see reference.ops): forward() and backward() check their
# arguments once, then run these.
def _embed(params, config: BertConfig, input_ids, token_type_ids=None):
    """The input embeddings [B, T, H]: token + position (+ token type), LayerNorm'ed for BERT."""
    if config.embedding_layernorm:
        x, c = ops._embedding_ln_forward(
            input_ids, token_type_ids, params["embeddings.token.W"],
            params["embeddings.position.W"], params["embeddings.type.W"],
            params["embeddings.ln.gamma"], params["embeddings.ln.beta"], config.ln_eps)
        return x, EmbeddingsCache(token=c, position=None, token_type=None)
    x, c_tok = ops._embedding_forward(input_ids, params["embeddings.token.W"])  # [B, T, H]
    if config.position == "learned":
        x, c_pos = ops._position_embedding_forward(x, params["embeddings.position.W"])
    else:
        x, c_pos = ops._sinusoidal_position_forward(x)
    c_type = None
    if config.type_vocab_size:
        x, c_type = ops._token_type_embedding_forward(x, token_type_ids,
                                                      params["embeddings.type.W"])
    return x, EmbeddingsCache(token=c_tok, position=c_pos, token_type=c_type)


def _blog_block_forward(z, x, p, config: BertConfig, mask):
    """One layer of the BERT-base blog's forward as written: concatenated heads with no output
    projection, LN(X + Z~), ReLU FFN, LN(X + Z_out) -- the residual is the embeddings X in every
    layer.  Uses the same weights as the real block (W^O, b_o unused).  Inference only."""
    attn = [p.get(f"attn.{n}") for n in ("W_q", "W_k", "W_v")]
    bias = [p.get(f"attn.{n}") for n in ("b_q", "b_k", "b_v")]
    H = z.shape[-1]
    eye = np.eye(H, dtype=z.dtype)  # no W^O: the identity in its place, no b_o
    a, _ = ops._attention_forward(z, *attn, eye, *bias, None, n_heads=config.n_heads, mask=mask)
    zb, _ = ops._layernorm_forward(x + a, p["ln1.gamma"], p["ln1.beta"], config.ln_eps)
    f, _ = ops._ffn_forward(zb, *(p[f"ffn.{n}"] for n in ops.FFN_PARAMS), "relu")
    out, _ = ops._layernorm_forward(x + f, p["ln2.gamma"], p["ln2.beta"], config.ln_eps)
    return out


def _forward(params, config: BertConfig, dtype, input_ids, attention_mask, inputs_embeds,
             token_type_ids=None):
    """embeddings -> L post-LN blocks -> final LayerNorm -> head."""
    c_emb = None
    if input_ids is not None:
        x, c_emb = _embed(params, config, input_ids, token_type_ids)  # [B, T, H]
    else:
        x = inputs_embeds
    h = x
    c_blocks = []
    for i in range(config.n_layers):
        if config.blog_literal:
            h = _blog_block_forward(h, x, _block_params(params, i), config, attention_mask)
            continue
        h, c = ops._block_forward(h, _block_params(params, i), n_heads=config.n_heads,
                                  mask=attention_mask, eps=config.ln_eps,
                                  activation=config.activation)  # [B, T, H]
        c_blocks.append(c)
    c_final = None
    if config.final_layernorm:
        h, c_final = ops._layernorm_forward(h, params["final_ln.gamma"],
                                            params["final_ln.beta"], config.ln_eps)
    c_head = c_pool = pooled = None
    out = h
    if config.head == "mlm" and config.mlm_style == "linear":
        out, c_head = ops._linear_forward(h, params["mlm.W"], params["mlm.b"])  # [B, T, V]
    elif config.head == "mlm":
        out, c_head = ops._mlm_head_forward(
            h, params["mlm.transform.W"], params["mlm.transform.b"], params["mlm.ln.gamma"],
            params["mlm.ln.beta"], params["embeddings.token.W"], params["mlm.b"],
            eps=config.ln_eps, activation=config.activation)  # [B, T, V], tied decoder
    elif config.head == "classifier":
        out, c_head = ops._classifier_forward(h, params["pooler.W"], params["pooler.b"],
                                              params["classifier.W"], params["classifier.b"])
    elif config.pooler:
        pooled, c_pool = ops._pooler_forward(h, params["pooler.W"], params["pooler.b"])
    return out, ModelCache(config=config, dtype=dtype, embeddings=c_emb, blocks=c_blocks,
                           final_ln=c_final, head=c_head, pooler=c_pool, pooled=pooled,
                           out_shape=out.shape)


@implements("mlm_head.tied", "model.backward")
def _backward(dout, cache, d_pooled=None):
    """The forward's kernels in reverse order.  Returns (grads, d_embeddings [B, T, H]).

    With the BERT MLM head the word-embedding table is used twice, by the lookup and by the
    decoder: its gradient is the sum of both shares."""
    config = cache.config
    if config.blog_literal:
        raise ValueError("config.blog_literal: the blog's literal forward is inference only")
    grads: dict[str, np.ndarray] = {}
    dh = dout
    dW_decoder = None
    if config.head == "mlm" and config.mlm_style == "linear":
        dh, grads["mlm.W"], grads["mlm.b"] = ops._linear_backward(dout, cache.head)
    elif config.head == "mlm":
        (dh, grads["mlm.transform.W"], grads["mlm.transform.b"], grads["mlm.ln.gamma"],
         grads["mlm.ln.beta"], dW_decoder, grads["mlm.b"]) = ops._mlm_head_backward(
            dout, cache.head)
    elif config.head == "classifier":
        (dh, grads["pooler.W"], grads["pooler.b"], grads["classifier.W"],
         grads["classifier.b"]) = ops._classifier_backward(dout, cache.head)
    elif cache.pooler is not None:
        if d_pooled is None:
            d_pooled = np.zeros(cache.pooled.shape, dtype=cache.dtype)
        dh_pool, grads["pooler.W"], grads["pooler.b"] = ops._pooler_backward(d_pooled,
                                                                             cache.pooler)
        dh = dout + dh_pool
    if cache.final_ln is not None:
        dh, grads["final_ln.gamma"], grads["final_ln.beta"] = ops._layernorm_backward(
            dh, cache.final_ln)
    for i in reversed(range(config.n_layers)):
        dh, g = ops._block_backward(dh, cache.blocks[i])  # [B, T, H]
        grads.update({f"layers.{i}.{k}": v for k, v in g.items()})
    d_embeddings = dh
    shapes = param_shapes(config)
    if cache.embeddings is not None:
        c_tok, c_pos, c_type = cache.embeddings
        if config.embedding_layernorm:
            (grads["embeddings.token.W"], grads["embeddings.position.W"],
             grads["embeddings.type.W"], grads["embeddings.ln.gamma"],
             grads["embeddings.ln.beta"]) = ops._embedding_ln_backward(dh, c_tok)
        else:
            dx = dh
            if c_type is not None:
                dx, grads["embeddings.type.W"] = ops._token_type_embedding_backward(dx, c_type)
            if config.position == "learned":
                dx, grads["embeddings.position.W"] = ops._position_embedding_backward(dx, c_pos)
            else:
                (dx,) = ops._sinusoidal_position_backward(dx, c_pos)
            (grads["embeddings.token.W"],) = ops._embedding_backward(dx, c_tok)
    else:  # inputs_embeds bypassed the tables: they did not influence the output
        for name in shapes:
            if name.startswith("embeddings."):
                grads[name] = np.zeros(shapes[name], dtype=cache.dtype)
    if config.pad_token_id is not None and cache.embeddings is not None:
        # nn.Embedding(padding_idx): the padding token's row gets no gradient from the lookup
        grads["embeddings.token.W"][config.pad_token_id] = 0
    if dW_decoder is not None:  # the tied table: lookup share + decoder share
        grads["embeddings.token.W"] = grads["embeddings.token.W"] + dW_decoder
    return {name: grads[name] for name in shapes}, d_embeddings


# --------------------------------------------------------------------------- entry points
def embed(params, config: BertConfig, input_ids, *, token_type_ids=None) -> np.ndarray:
    """The input embeddings [B, T, H] that the first block receives: token + position
    (+ token type, LayerNorm'ed for BERT)."""
    check_params(params, config)
    _check_ids(input_ids, config)
    token_type_ids = _check_token_types(token_type_ids, config, input_ids.shape)
    return _embed(params, config, input_ids, token_type_ids)[0]


def _check_inputs(params, config: BertConfig, input_ids, attention_mask, token_type_ids,
                  inputs_embeds):
    """Every argument of ``forward`` checked once; returns (dtype, attention_mask as bool or None,
    token_type_ids with their default, (B, T))."""
    dtype = check_params(params, config)
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("input_ids, inputs_embeds: expected exactly one of them, got "
                         + ("both" if input_ids is not None else "neither"))
    if input_ids is not None:
        as_index_array("input_ids", input_ids, ndim=2, low=0, high=config.vocab_size)
        B, T = input_ids.shape
    else:
        as_float_array("inputs_embeds", inputs_embeds, ndim=3, dtype=dtype)
        B, T, H = inputs_embeds.shape
        if H != config.hidden:
            raise ValueError(f"inputs_embeds: expected shape (B, T, {config.hidden}), "
                             f"got {inputs_embeds.shape}")
    if T < 1 or B < 1:
        raise ValueError(f"input_ids: expected B >= 1 and T >= 1, got shape {(B, T)}")
    if T > config.max_len:
        name = "input_ids" if input_ids is not None else "inputs_embeds"
        raise ValueError(f"{name}: sequence length {T} exceeds config.max_len={config.max_len}")
    if attention_mask is not None:
        attention_mask = as_mask("attention_mask", attention_mask, shape=(B, T))
        empty = np.flatnonzero(~attention_mask.any(axis=-1))
        if empty.size:
            raise ValueError(f"attention_mask: expected at least one attended (1) position per "
                             f"sequence, rows {empty.tolist()} have none")
        if attention_mask.all():  # every key attended: the same as no mask, without its passes
            attention_mask = None
    ops._check_eps(config.ln_eps)
    if input_ids is not None:
        token_type_ids = _check_token_types(token_type_ids, config, (B, T))
    elif token_type_ids is not None:
        raise ValueError("token_type_ids: inputs_embeds already holds the token types")
    return dtype, attention_mask, token_type_ids, (B, T)


def forward(params, config: BertConfig, input_ids=None, attention_mask=None, *,
            token_type_ids=None, inputs_embeds=None):
    """ids [B, T] -> logits [B, T, V] (head "mlm"), the last hidden states [B, T, H] (head
    "none"; with ``config.pooler`` the cache's ``pooled`` [B, H] holds the pooler's output) or
    class logits [B, num_labels] (head "classifier").

    ``token_type_ids`` [B, T] (segment ids, default 0) for configs with token types.
    ``inputs_embeds`` [B, T, H] replaces the whole embedding layer (what the first block
    receives); the embedding tables then get zero gradients.
    ``attention_mask`` [B, T]: 1 for tokens that may be attended, 0 for padding.
    Every argument is checked here, once; the layers below run unchecked kernels.
    """
    dtype, attention_mask, token_type_ids, (B, _) = _check_inputs(
        params, config, input_ids, attention_mask, token_type_ids, inputs_embeds)
    args = (input_ids, attention_mask, inputs_embeds, token_type_ids)
    shards = parallel.row_shards(B)
    if len(shards) == 1:
        return _forward(params, config, dtype, *args)
    pieces = parallel.pmap(lambda rows: _forward(params, config, dtype, *_cut(rows, *args)),
                           shards)
    out = np.concatenate([o for o, _ in pieces])
    caches = tuple(c for _, c in pieces)
    pooled = None if caches[0].pooled is None else np.concatenate([c.pooled for c in caches])
    return out, ShardedCache(tuple(shards), caches, dtype, out.shape, pooled)


def _backward_any(dout, cache, d_pooled=None):
    """``_backward`` of a ModelCache, or of each shard of a ShardedCache (the shards' gradients
    summed in shard order, their d_embeddings concatenated)."""
    if not isinstance(cache, ShardedCache):
        return _backward(dout, cache, d_pooled)

    def shard(i):
        rows = cache.shards[i]
        return _backward(dout[rows], cache.caches[i], None if d_pooled is None else d_pooled[rows])

    pieces = parallel.pmap(shard, range(len(cache.shards)))
    return _sum_grads([g for g, _ in pieces]), np.concatenate([d for _, d in pieces])


def backward(dout, cache, d_pooled=None):
    """dout: gradient w.r.t. forward's output; ``d_pooled`` [B, H]: w.r.t. the pooler's output
    (head "none" with config.pooler; default 0).  Returns (grads, d_embeddings [B, T, H])."""
    as_float_array("dout", dout, shape=cache.out_shape, dtype=cache.dtype)
    if d_pooled is not None:
        if cache.pooled is None:
            raise ValueError("d_pooled: the forward computed no pooled output")
        as_float_array("d_pooled", d_pooled, shape=cache.pooled.shape, dtype=cache.dtype)
    return _backward_any(dout, cache, d_pooled)


def _check_loss_args(config: BertConfig, out_shape, dtype, labels, targets, reduction,
                     ignore_index) -> None:
    """labels (heads "mlm", "classifier") or targets (head "none") for an output of
    ``out_shape``, and the reduction."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction: expected 'mean' or 'sum', got {reduction!r}")
    if config.head in ("mlm", "classifier"):
        if labels is None:
            raise ValueError(f"labels: required for head {config.head!r}, got None")
        ops._check_ce_labels(labels, out_shape[:-1], out_shape[-1], ignore_index, reduction)
        return
    if targets is None:
        raise ValueError("targets: required for head 'none', got None")
    as_float_array("targets", targets, shape=out_shape, dtype=dtype)


def _loss_forward(out, config: BertConfig, labels, targets, reduction, ignore_index):
    """head "mlm": masked cross-entropy of logits vs ``labels`` [B, T];
    head "classifier": cross-entropy of the class logits vs ``labels`` [B];
    head "none": MSE of hidden states vs constant ``targets`` [B, T, H].
    Checks labels / targets; ``out`` comes from the checked forward."""
    _check_loss_args(config, out.shape, out.dtype, labels, targets, reduction, ignore_index)
    if config.head in ("mlm", "classifier"):
        return ops._cross_entropy_forward(out, labels, ignore_index=ignore_index,
                                          reduction=reduction)
    return ops._mse_forward(out, targets)


def _loss_backward(config: BertConfig, dtype, c_loss):
    """d loss / d out for an upstream gradient of 1."""
    if config.head in ("mlm", "classifier"):
        (dout,) = ops._cross_entropy_backward(dtype.type(1.0), c_loss)
    else:
        dout, _ = ops._mse_backward(dtype.type(1.0), c_loss)
    return dout


def _out_shape(config: BertConfig, B: int, T: int) -> tuple:
    if config.head == "mlm":
        return (B, T, config.vocab_size)
    if config.head == "classifier":
        return (B, config.num_labels)
    return (B, T, config.hidden)


def loss(params, config: BertConfig, input_ids=None, *, labels=None, targets=None,
         attention_mask=None, token_type_ids=None, inputs_embeds=None, reduction: str = "mean",
         ignore_index: int = ops.IGNORE_INDEX):
    """The scalar training loss, forward only (what finite differences evaluate).  With several
    workers, each batch shard's summed loss is computed on its own and the sum divided once."""
    dtype, attention_mask, token_type_ids, (B, T) = _check_inputs(
        params, config, input_ids, attention_mask, token_type_ids, inputs_embeds)
    _check_loss_args(config, _out_shape(config, B, T), dtype, labels, targets, reduction,
                     ignore_index)
    args = (input_ids, attention_mask, inputs_embeds, token_type_ids)
    shards = parallel.row_shards(B)
    fused = _fused_mlm_head(config)
    if len(shards) == 1 and not fused:
        out, _ = _forward(params, config, dtype, *args)
        return _loss_forward(out, config, labels, targets, reduction, ignore_index)[0]
    body, body_config = _encoder(params, config)

    def shard_total(rows):  # the shard's summed loss
        lab, tgt = _cut(rows, labels, targets)
        if fused:  # the encoder, then the blocked cross-entropy, forward only
            h, _ = _forward(body, body_config, dtype, *_cut(rows, *args))
            return _linear_cross_entropy(ops._rows(h), params["mlm.W"], params["mlm.b"],
                                         lab.reshape(-1), ignore_index=ignore_index)[0]
        out, _ = _forward(params, config, dtype, *_cut(rows, *args))
        if config.head in ("mlm", "classifier"):
            return float(ops._cross_entropy_forward(out, lab, ignore_index=ignore_index,
                                                    reduction="sum")[0])
        return float(ops._mse_forward(out, tgt)[0]) * tgt.size  # the op's mean, undone

    total = sum(parallel.pmap(shard_total, shards))
    return dtype.type(total / _denominator(config, labels, targets, reduction, ignore_index))


def _denominator(config: BertConfig, labels, targets, reduction, ignore_index) -> int:
    """What a summed loss is divided by: the predicted positions (cross-entropy "mean"), 1
    ("sum"), every target element (MSE, always a mean)."""
    if config.head == "none":
        return targets.size
    return int(np.count_nonzero(labels != ignore_index)) if reduction == "mean" else 1


def loss_and_grads(params, config: BertConfig, input_ids=None, *, labels=None, targets=None,
                   attention_mask=None, token_type_ids=None, inputs_embeds=None,
                   reduction: str = "mean", ignore_index: int = ops.IGNORE_INDEX):
    """One forward + backward of ``loss``.  Returns (loss, grads, d_embeddings)."""
    if _fused_mlm_head(config):
        return _mlm_loss_and_grads(params, config, input_ids, labels, attention_mask,
                                   token_type_ids, inputs_embeds, reduction, ignore_index,
                                   predicted_only=False)
    out, cache = forward(params, config, input_ids, attention_mask, token_type_ids=token_type_ids,
                         inputs_embeds=inputs_embeds)
    value, c_loss = _loss_forward(out, config, labels, targets, reduction, ignore_index)
    grads, d_embeddings = _backward_any(_loss_backward(config, cache.dtype, c_loss), cache)
    return value, grads, d_embeddings


def masked_lm_loss_and_grads(params, config: BertConfig, input_ids, *, labels,
                             attention_mask=None, token_type_ids=None, reduction: str = "mean",
                             ignore_index: int = ops.IGNORE_INDEX):
    """``loss_and_grads`` for the MLM head, computing the head only where a label is predicted.

    Same loss and gradients as ``loss_and_grads(..., labels=labels)`` (up to summation order):
    positions with ``ignore_index`` contribute nothing to the loss, so their logits -- 85% of
    the [B, T, V] tensor in MLM training -- need not exist (original BERT gathers the masked
    positions the same way).  Returns (loss, grads, d_embeddings).
    """
    if not _fused_mlm_head(config):
        raise ValueError(f"config: expected head 'mlm' with mlm_style 'linear', got "
                         f"head={config.head!r}, mlm_style={config.mlm_style!r}")
    if input_ids is None:
        raise ValueError("input_ids: expected an integer array [B, T], got None")
    return _mlm_loss_and_grads(params, config, input_ids, labels, attention_mask, token_type_ids,
                               None, reduction, ignore_index, predicted_only=True)


# ------------------------------------------------------------- the MLM head with its loss
def _fused_mlm_head(config: BertConfig) -> bool:
    """The Mini-BERT head (one linear layer to the vocabulary): its loss_and_grads goes through
    ``_linear_cross_entropy``."""
    return config.head == "mlm" and config.mlm_style == "linear" and not config.blog_literal


# Logits rows per cross-entropy block: ~1 MiB (32 rows of V = 8192 float32), which stays in a
# core's L2 through the block's passes (measured: the unblocked CE over [512, 8192] reads and
# writes 16 MiB per pass from L3/DRAM).
_CE_BLOCK_BYTES = 1 << 20


def _encoder(params, config: BertConfig):
    """The MLM model's encoder alone: (its parameters, the config with the head switched
    off)."""
    return ({k: v for k, v in params.items() if not k.startswith("mlm.")},
            config.replace(head="none"))


def _linear_cross_entropy(h, W, b, labels, *, ignore_index: int, dloss=None):
    """The summed cross-entropy of the logits ``h @ W + b`` [N, V] against ``labels`` [N] and
    its gradients for an upstream gradient ``dloss`` (1/N_masked for a mean over a larger
    batch): ``(total, dh, dW, db)``, ``total`` a Python float; ``dloss`` None: the forward
    only, ``(total, None, None, None)``.

    The linear and cross-entropy op pairs composed (their kernels, called here), scheduled for
    speed: the cross-entropy runs block by block of rows, so a block of logits stays in cache
    through its forward and backward passes, and each block's gradient overwrites its logits
    (no second [N, V] array).  Equal to linear_forward -> cross_entropy_forward/backward ->
    linear_backward up to float rounding (tests/test_fast_paths.py).
    """
    N, V = h.shape[0], W.shape[1]
    logits, c_lin = ops._linear_forward(h, W, b)  # [N, V]
    rows = max(1, _CE_BLOCK_BYTES // (V * logits.itemsize))
    total = 0.0
    for lo in range(0, N, rows):
        blk = slice(lo, lo + rows)
        value, c_ce = ops._cross_entropy_forward(logits[blk], labels[blk],
                                                 ignore_index=ignore_index, reduction="sum")
        total += float(value)
        if dloss is not None:  # the block's dlogits
            (logits[blk],) = ops._cross_entropy_backward(logits.dtype.type(dloss), c_ce)
    if dloss is None:
        return total, None, None, None
    dh, dW, db = ops._linear_backward(logits, c_lin)  # logits holds dlogits now
    return total, dh, dW, db


def _mlm_loss_and_grads(params, config, input_ids, labels, attention_mask, token_type_ids,
                        inputs_embeds, reduction, ignore_index, *, predicted_only: bool):
    """Checks every argument once, then runs ``_mlm_shard`` on each batch shard (one per
    worker, ``reference.parallel``) and sums the shards' losses and gradients in shard order.
    Each shard's gradient already carries the whole batch's 1/N_masked."""
    dtype, attention_mask, token_type_ids, (B, T) = _check_inputs(
        params, config, input_ids, attention_mask, token_type_ids, inputs_embeds)
    _check_loss_args(config, _out_shape(config, B, T), dtype, labels, None, reduction,
                     ignore_index)
    denom = _denominator(config, labels, None, reduction, ignore_index)
    body, body_config = _encoder(params, config)

    def shard(rows: slice):
        return _mlm_shard(body, body_config, dtype, params["mlm.W"], params["mlm.b"],
                          *_cut(rows, input_ids, labels, attention_mask, token_type_ids,
                                inputs_embeds), ignore_index, 1.0 / denom, predicted_only)

    pieces = parallel.pmap(shard, parallel.row_shards(B))
    total, grads, d_embeddings = pieces[0]
    if len(pieces) > 1:
        total = sum(p[0] for p in pieces)
        _sum_grads([p[1] for p in pieces])
        d_embeddings = np.concatenate([p[2] for p in pieces])  # [B, T, H], shard by shard
    return dtype.type(total / denom), {name: grads[name] for name in param_shapes(config)}, \
        d_embeddings


def _mlm_shard(body, body_config, dtype, W, b, input_ids, labels, attention_mask,
               token_type_ids, inputs_embeds, ignore_index, dloss, predicted_only):
    """One shard: the encoder (head switched off) -> ``_linear_cross_entropy`` on every position,
    or on the predicted ones only (``predicted_only``) -> the encoder's backward.  Returns
    (summed loss, grads, d_embeddings)."""
    h, cache = _forward(body, body_config, dtype, input_ids, attention_mask, inputs_embeds,
                        token_type_ids)  # [B, T, H]
    h_rows, flat_labels = ops._rows(h), labels.reshape(-1)  # [B*T, H], [B*T]
    if predicted_only:  # the other rows contribute nothing to the loss, nor get a gradient
        sel = np.flatnonzero(flat_labels != ignore_index)
        dh = np.zeros_like(h_rows)
        if sel.size:
            total, dh[sel], dW, db = _linear_cross_entropy(
                h_rows[sel], W, b, flat_labels[sel], ignore_index=ignore_index, dloss=dloss)
        else:  # a shard (or a "sum" batch) with nothing to predict
            total, dW, db = 0.0, np.zeros_like(W), np.zeros_like(b)
    else:
        total, dh, dW, db = _linear_cross_entropy(h_rows, W, b, flat_labels,
                                                  ignore_index=ignore_index, dloss=dloss)
    grads, d_embeddings = _backward(dh.reshape(h.shape), cache)
    grads["mlm.W"], grads["mlm.b"] = dW, db
    return total, grads, d_embeddings


def _sum_grads(pieces: list[dict]) -> dict:
    """Adds every gradient dict of ``pieces`` into the first, tensor by tensor in piece order
    (the tensors split among the workers); returns the first."""
    acc = pieces[0]

    def add(k):
        for other in pieces[1:]:
            np.add(acc[k], other[k], out=acc[k])

    parallel.map_keys(add, acc)
    return acc
