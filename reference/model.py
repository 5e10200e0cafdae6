"""The encoder composed from the op pairs: embeddings -> L post-LN blocks -> final LayerNorm ->
head, and the backward in reverse order.

Parameters are one flat ``dict[str, ndarray]`` with stable dotted names; ``backward`` returns a
dict with exactly the same keys, shapes and dtypes, plus the gradient w.r.t. the input
embeddings (the sum of token and position embeddings fed to the first block).

The head is chosen once per config, by :func:`head_kind`, from the table :data:`HEADS`: each
kind is a :class:`HeadKind` record of its parameters, its output shape, what its loss compares
with, and its forward / backward / loss functions.  Nothing else asks which head a config has.

Each entry point checks its arguments once (``check_inputs`` / ``check_loss_inputs``) and runs
an unchecked body (``run_forward``, ``run_backward``, ``run_loss``, ``run_loss_backward``) on
the checked :class:`Batch`; the bodies call the ops' kernels (``minibert_reference.ops``) and
nothing else.  Those six functions are the seam ``minibert_reference.data_parallel`` composes: it
runs the same bodies on batch shards, from outside (the package's public ``forward``, ``loss``, ...
are its wrappers).  The model runs in the calling thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from minibert_reference import ops
from minibert_reference.config import BertConfig
from minibert_reference.ops import IGNORE_INDEX
from minibert_reference.registry import implements
from minibert_reference.validate import (
    FLOAT_DTYPES,
    as_float_array,
    as_index_array,
    as_mask,
    check_param_dict,
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
    block = ops.block_param_shapes(ops.block_param_names(config.attn_bias), H, I)
    for i in range(config.n_layers):
        shapes.update({f"layers.{i}.{name}": shape for name, shape in block.items()})
    if config.final_layernorm:
        shapes["final_ln.gamma"] = (H,)
        shapes["final_ln.beta"] = (H,)
    shapes.update(head_kind(config).param_shapes(config))
    return shapes


def init_params(config: BertConfig, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """BERT initialisation: weights ~ N(0, init_std^2), biases 0, LayerNorm gamma 1 / beta 0."""
    return init_from_shapes(param_shapes(config), config.init_std, seed, dtype)


def init_from_shapes(shapes: dict, init_std: float, seed: int = 0,
                     dtype=np.float32) -> dict[str, np.ndarray]:
    """Parameters of ``shapes`` (name -> shape, in order): weights ~ N(0, init_std^2), biases
    0 (last name component ``b`` or ``b_*``), gamma 1, beta 0."""
    dtype = np.dtype(dtype)
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype: expected float32 or float64, got {dtype}")
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed: expected an integer >= 0, got {seed!r}")
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in shapes.items():
        leaf = name.rsplit(".", 1)[1]
        if leaf == "gamma":
            value = np.ones(shape)
        elif leaf == "beta" or leaf.startswith("b"):
            value = np.zeros(shape)
        else:
            value = rng.normal(0.0, init_std, size=shape)
        params[name] = value.astype(dtype)
    return params


def check_params(params, config: BertConfig) -> np.dtype:
    """Exactly the expected names and shapes, one float dtype, finite values."""
    return check_param_dict(params, param_shapes(config))


def _layer_params(params, i: int) -> dict[str, np.ndarray]:
    """Layer i's parameters by their local names (``attn.W_q``, ``ln1.gamma``, ...)."""
    prefix = f"layers.{i}."
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}



class Batch(NamedTuple):
    """The entry points' arguments after their checks (``check_inputs``, ``check_loss_inputs``):
    what the unchecked bodies take.  ``rows`` cuts a batch shard."""

    dtype: np.dtype  # of every parameter
    head: HeadKind  # the config's head, chosen once (head_kind)
    input_ids: np.ndarray | None  # [B, T]; None when inputs_embeds replace the embeddings
    inputs_embeds: np.ndarray | None  # [B, T, H]
    attention_mask: np.ndarray | None  # bool [B, T]; None: every key attended
    token_type_ids: np.ndarray | None  # [B, T]; None without token types
    labels: np.ndarray | None = None  # [B, T] (token labels) or [B] (class labels)
    targets: np.ndarray | None = None  # [B, T, H] (MSE targets of the hidden states)

    @property
    def size(self) -> int:
        """B, the number of sequences."""
        return len(self.input_ids if self.input_ids is not None else self.inputs_embeds)

    def rows(self, rows: slice) -> Batch:
        """The sequences ``rows`` of every array."""
        return self._replace(**{k: None if v is None else v[rows]
                                for k, v in self._asdict().items() if k not in ("dtype", "head")})


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
    head_kind: HeadKind | None  # the head that ran; None: the caller ran it fused with its loss
    head: object  # its cache: LinearCache / MLMHeadCache / ClassifierCache / PoolerCache / None
    pooled: np.ndarray | None  # the pooler's output [B, H] (the pooled hidden-states head)
    out_shape: tuple


class LossCache(NamedTuple):
    head: HeadKind  # whose loss ran (its loss_backward runs the backward)
    model: ModelCache  # the encoder's cache (fused MLM head) or the whole model's
    loss: object  # CrossEntropyCache / MSECache / LinearCrossEntropyCache
    rows: np.ndarray | None  # the [B*T] rows the fused head ran on (predicted only), or None


# --------------------------------------------------------------------------- checks
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


def check_inputs(params, config: BertConfig, input_ids=None, attention_mask=None, *,
                 token_type_ids=None, inputs_embeds=None) -> Batch:
    """Every argument of ``forward`` checked once: the Batch the bodies run on (the config's
    head kind, the attention mask as bool or None when it attends everywhere, token types with
    their default).  Raises ValueError naming the argument."""
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
    return Batch(dtype, head_kind(config), input_ids, inputs_embeds, attention_mask,
                 token_type_ids)


def check_loss_inputs(params, config: BertConfig, input_ids=None, *, labels=None, targets=None,
                      attention_mask=None, token_type_ids=None, inputs_embeds=None,
                      reduction: str = "mean", ignore_index: int = IGNORE_INDEX,
                      labelled_rows_only: bool = False) -> Batch:
    """Every argument of ``loss`` / ``loss_and_grads`` checked once: ``check_inputs``' Batch
    with the labels or targets its head's loss compares with, and the reduction checked.
    ``labelled_rows_only``: for ``masked_lm_loss_and_grads``, whose head must be able to run on
    the labelled positions alone (the Mini-BERT head) from input ids."""
    if labelled_rows_only:
        if not head_kind(config).labelled_rows_only:
            raise ValueError(f"config: expected head 'mlm' with mlm_style 'linear', got "
                             f"head={config.head!r}, mlm_style={config.mlm_style!r}")
        if input_ids is None:
            raise ValueError("input_ids: expected an integer array [B, T], got None")
    batch = check_inputs(params, config, input_ids, attention_mask,
                         token_type_ids=token_type_ids, inputs_embeds=inputs_embeds)
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction: expected 'mean' or 'sum', got {reduction!r}")
    x = batch.input_ids if batch.input_ids is not None else batch.inputs_embeds
    out_shape = batch.head.out_shape(config, *x.shape[:2])
    if batch.head.target == "labels":
        if labels is None:
            raise ValueError(f"labels: required for head {config.head!r}, got None")
        ops._check_ce_labels(labels, out_shape[:-1], out_shape[-1], ignore_index, reduction)
        return batch._replace(labels=labels)
    if targets is None:
        raise ValueError(f"targets: required for head {config.head!r}, got None")
    as_float_array("targets", targets, shape=out_shape, dtype=batch.dtype)
    return batch._replace(targets=targets)


def check_backward(dout, cache, d_pooled=None) -> None:
    """``backward``'s arguments against the forward's cache (a ModelCache, or anything with its
    ``out_shape``, ``dtype`` and ``pooled``)."""
    as_float_array("dout", dout, shape=cache.out_shape, dtype=cache.dtype)
    if d_pooled is not None:
        if cache.pooled is None:
            raise ValueError("d_pooled: the forward computed no pooled output")
        as_float_array("d_pooled", d_pooled, shape=cache.pooled.shape, dtype=cache.dtype)


# --------------------------------------------------------------------------- the heads
# What sits on the last hidden states h [B, T, H].  Each head is a forward/backward pair and a
# loss pair, unchecked like the ops' kernels.  A head's forward returns (out, its cache, the
# pooled output or None); its backward (dh [B, T, H], the gradients of its parameters).  A
# head's loss returns (value, LossCache); its loss_backward (grads, d_embeddings), the model's
# backward included.
def _linear_head_forward(params, config: BertConfig, h):
    """Mini-BERT's head: one untied linear layer to the vocabulary, logits [B, T, V]."""
    out, c_head = ops._linear_forward(h, params["mlm.W"], params["mlm.b"])  # [B, T, V]
    return out, c_head, None


def _linear_head_backward(dout, c_head, d_pooled):
    dh, dW, db = ops._linear_backward(dout, c_head)
    return dh, {"mlm.W": dW, "mlm.b": db}


def _bert_mlm_head_forward(params, config: BertConfig, h):
    """BERT's MLM head: dense -> activation -> LayerNorm -> the decoder tied to the word
    embeddings, logits [B, T, V]."""
    out, c_head = ops._mlm_head_forward(
        h, params["mlm.transform.W"], params["mlm.transform.b"], params["mlm.ln.gamma"],
        params["mlm.ln.beta"], params["embeddings.token.W"], params["mlm.b"],
        eps=config.ln_eps, activation=config.activation)  # [B, T, V], tied decoder
    return out, c_head, None


def _bert_mlm_head_backward(dout, c_head, d_pooled):
    """The decoder's share of the word-embedding table's gradient comes back under the table's
    name: ``run_backward`` adds it to the lookup's share."""
    (dh, dW_t, db_t, dgamma, dbeta, dW_decoder, db_dec) = ops._mlm_head_backward(dout, c_head)
    return dh, {"mlm.transform.W": dW_t, "mlm.transform.b": db_t, "mlm.ln.gamma": dgamma,
                "mlm.ln.beta": dbeta, "mlm.b": db_dec, "embeddings.token.W": dW_decoder}


def _classifier_head_forward(params, config: BertConfig, h):
    """The tanh pooler on [CLS] and a linear classifier: class logits [B, num_labels]."""
    out, c_head = ops._classifier_forward(h, params["pooler.W"], params["pooler.b"],
                                          params["classifier.W"], params["classifier.b"])
    return out, c_head, None


def _classifier_head_backward(dout, c_head, d_pooled):
    dh, dW_p, db_p, dW_c, db_c = ops._classifier_backward(dout, c_head)
    return dh, {"pooler.W": dW_p, "pooler.b": db_p, "classifier.W": dW_c, "classifier.b": db_c}


def _hidden_states_forward(params, config: BertConfig, h):
    """No head: the last hidden states [B, T, H] are the output."""
    return h, None, None


def _hidden_states_backward(dout, c_head, d_pooled):
    return dout, {}


def _pooled_hidden_states_forward(params, config: BertConfig, h):
    """The last hidden states [B, T, H], and the tanh pooler's output [B, H] beside them
    (BertModel's pooler_output)."""
    pooled, c_pool = ops._pooler_forward(h, params["pooler.W"], params["pooler.b"])
    return h, c_pool, pooled


def _pooled_hidden_states_backward(dout, c_pool, d_pooled):
    """dh: the hidden states' own gradient plus the pooler's (d_pooled default 0)."""
    if d_pooled is None:
        d_pooled = np.zeros_like(c_pool.tanh.y)  # [B, H], the pooled output's dtype
    dh_pool, dW, db = ops._pooler_backward(d_pooled, c_pool)
    return dout + dh_pool, {"pooler.W": dW, "pooler.b": db}


def _fused_linear_ce_loss(params, config: BertConfig, batch: Batch, reduction: str,
                          ignore_index: int, *, grad: bool = True, predicted_only: bool = False):
    """Mini-BERT's head fused with its cross-entropy (``ops._linear_cross_entropy_forward``: no
    second [B, T, V] array), on every position or, ``predicted_only``, on the positions with a
    label (the others contribute nothing to the loss, nor get a gradient: 85% of the head's
    work in MLM training; original BERT gathers the masked positions the same way).  ``grad``
    False: the loss alone (its cache cannot run the backward)."""
    h, cache = run_forward(params, config, batch, head=False)  # [B, T, H]
    h_rows, labels = ops._rows(h), batch.labels.reshape(-1)  # [B*T, H], [B*T]
    rows = None
    if predicted_only:
        rows = np.flatnonzero(labels != ignore_index)
        h_rows, labels = h_rows[rows], labels[rows]
    value, c_loss = ops._linear_cross_entropy_forward(
        h_rows, params["mlm.W"], params["mlm.b"], labels, ignore_index=ignore_index,
        reduction=reduction, grad=grad)
    return value, LossCache(batch.head, cache, c_loss, rows)


def _fused_linear_ce_loss_backward(dloss, cache: LossCache):
    dh_rows, dW, db = ops._linear_cross_entropy_backward(dloss, cache.loss)
    B, T, H = cache.model.out_shape
    if cache.rows is not None:  # the rows the head skipped get no gradient
        dh = np.zeros((B * T, H), dtype=dh_rows.dtype)
        dh[cache.rows] = dh_rows
        dh_rows = dh
    grads, d_embeddings = run_backward(dh_rows.reshape(B, T, H), cache.model)
    grads["mlm.W"], grads["mlm.b"] = dW, db
    return {name: grads[name] for name in param_shapes(cache.model.config)}, d_embeddings


def _cross_entropy_loss(params, config: BertConfig, batch: Batch, reduction: str,
                        ignore_index: int, *, grad: bool = True, predicted_only: bool = False):
    """Cross-entropy of the head's logits vs the labels ([B, T] token or [B] class labels)."""
    out, cache = run_forward(params, config, batch)
    value, c_loss = ops._cross_entropy_forward(out, batch.labels, ignore_index=ignore_index,
                                               reduction=reduction)
    return value, LossCache(batch.head, cache, c_loss, None)


def _cross_entropy_loss_backward(dloss, cache: LossCache):
    (dout,) = ops._cross_entropy_backward(dloss, cache.loss)
    return run_backward(dout, cache.model)


def _mse_loss(params, config: BertConfig, batch: Batch, reduction: str, ignore_index: int, *,
              grad: bool = True, predicted_only: bool = False):
    """MSE of the last hidden states vs the targets [B, T, H] (always a mean)."""
    out, cache = run_forward(params, config, batch)
    value, c_loss = ops._mse_forward(out, batch.targets)
    return value, LossCache(batch.head, cache, c_loss, None)


def _mse_loss_backward(dloss, cache: LossCache):
    dout, _ = ops._mse_backward(dloss, cache.loss)
    return run_backward(dout, cache.model)


class HeadKind(NamedTuple):
    """One row of :data:`HEADS`: everything the model needs to know about a head."""

    name: str
    param_shapes: Callable  # (config) -> {name: shape} of the head's own parameters
    out_shape: Callable  # (config, B, T) -> the shape of forward's output
    target: str  # what the loss compares with: "labels" (cross-entropy) or "targets" (MSE)
    forward: Callable  # (params, config, h) -> (out, head cache, pooled or None)
    backward: Callable  # (dout, head cache, d_pooled) -> (dh, head grads)
    loss: Callable  # (params, config, batch, reduction, ignore_index, *, grad, predicted_only)
    loss_backward: Callable  # (dloss, LossCache) -> (grads, d_embeddings)
    labelled_rows_only: bool = False  # its loss can run on the labelled positions alone


def _vocab_logits_shape(config: BertConfig, B: int, T: int) -> tuple:
    return (B, T, config.vocab_size)


def _hidden_shape(config: BertConfig, B: int, T: int) -> tuple:
    return (B, T, config.hidden)


def _pooler_shapes(config: BertConfig) -> dict:
    return {"pooler.W": (config.hidden, config.hidden), "pooler.b": (config.hidden,)}


HEADS: dict[str, HeadKind] = {kind.name: kind for kind in (
    HeadKind("mlm_linear",  # Mini-BERT (the Mini-BERT derivation): its loss runs fused
             lambda c: {"mlm.W": (c.hidden, c.vocab_size), "mlm.b": (c.vocab_size,)},
             _vocab_logits_shape, "labels", _linear_head_forward, _linear_head_backward,
             _fused_linear_ce_loss, _fused_linear_ce_loss_backward, labelled_rows_only=True),
    HeadKind("mlm_bert",  # BERT: transform + LayerNorm; the decoder is embeddings.token.W
             lambda c: {"mlm.transform.W": (c.hidden, c.hidden), "mlm.transform.b": (c.hidden,),
                        "mlm.ln.gamma": (c.hidden,), "mlm.ln.beta": (c.hidden,),
                        "mlm.b": (c.vocab_size,)},
             _vocab_logits_shape, "labels", _bert_mlm_head_forward, _bert_mlm_head_backward,
             _cross_entropy_loss, _cross_entropy_loss_backward),
    HeadKind("classifier",  # the BERT-base blog's tanh pooler + classifier
             lambda c: {**_pooler_shapes(c), "classifier.W": (c.hidden, c.num_labels),
                        "classifier.b": (c.num_labels,)},
             lambda c, B, T: (B, c.num_labels), "labels", _classifier_head_forward,
             _classifier_head_backward, _cross_entropy_loss, _cross_entropy_loss_backward),
    HeadKind("hidden_states",  # the NumPy-Transformer document's MSE reconstruction
             lambda c: {}, _hidden_shape, "targets", _hidden_states_forward,
             _hidden_states_backward, _mse_loss, _mse_loss_backward),
    HeadKind("pooled_hidden_states",  # BertModel: hidden states + pooler_output
             _pooler_shapes, _hidden_shape, "targets", _pooled_hidden_states_forward,
             _pooled_hidden_states_backward, _mse_loss, _mse_loss_backward),
)}


def head_kind(config: BertConfig) -> HeadKind:
    """The config's head, the one place that reads ``head``, ``mlm_style`` and ``pooler``
    (``mlm_style`` matters for head "mlm" only, ``pooler`` for head "none" only: the
    classifier always pools)."""
    if config.head == "mlm":
        return HEADS["mlm_linear" if config.mlm_style == "linear" else "mlm_bert"]
    if config.head == "classifier":
        return HEADS["classifier"]
    return HEADS["pooled_hidden_states" if config.pooler else "hidden_states"]


# --------------------------------------------------------------------------- the forward
# Unchecked, like the ops' kernels (see minibert_reference.ops): the entry points check their
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


def run_forward(params, config: BertConfig, batch: Batch, *, head: bool = True):
    """``forward``'s body on a checked Batch: embeddings -> L post-LN blocks -> final LayerNorm
    -> the batch's head (``head`` False: the last hidden states [B, T, H], for a head fused with
    its loss).  Returns (out, ModelCache)."""
    c_emb = None
    if batch.input_ids is not None:
        x, c_emb = _embed(params, config, batch.input_ids, batch.token_type_ids)  # [B, T, H]
    else:
        x = batch.inputs_embeds
    h = x
    c_blocks = []
    for i in range(config.n_layers):
        h, c = ops._block_forward(h, _layer_params(params, i), n_heads=config.n_heads,
                                  mask=batch.attention_mask, eps=config.ln_eps,
                                  activation=config.activation)  # [B, T, H]
        c_blocks.append(c)
    c_final = None
    if config.final_layernorm:
        h, c_final = ops._layernorm_forward(h, params["final_ln.gamma"],
                                            params["final_ln.beta"], config.ln_eps)
    out, kind, c_head, pooled = h, None, None, None
    if head:
        kind = batch.head
        out, c_head, pooled = kind.forward(params, config, h)
    return out, ModelCache(config=config, dtype=batch.dtype, embeddings=c_emb, blocks=c_blocks,
                           final_ln=c_final, head_kind=kind, head=c_head, pooled=pooled,
                           out_shape=out.shape)


def run_loss(params, config: BertConfig, batch: Batch, reduction: str, ignore_index: int, *,
             grad: bool = True, predicted_only: bool = False):
    """``loss``'s body on a checked Batch (``check_loss_inputs``): the scalar loss of the
    batch's head and its LossCache.  ``predicted_only`` (a head with ``labelled_rows_only``):
    the head runs on the labelled positions alone; ``grad`` False: the loss alone, whose cache
    may not run the backward."""
    return batch.head.loss(params, config, batch, reduction, ignore_index, grad=grad,
                           predicted_only=predicted_only)


# --------------------------------------------------------------------------- the backward
@implements("mlm_head.tied", "model.backward")
def run_backward(dout, cache, d_pooled=None):
    """``backward``'s body: the forward's kernels in reverse order.  Returns (grads,
    d_embeddings [B, T, H]); grads in ``param_shapes`` order, without the head's tensors when
    the forward ran without it.

    With the BERT MLM head the word-embedding table is used twice, by the lookup and by the
    decoder: its gradient is the sum of both shares."""
    config = cache.config
    dh, head_grads = dout, {}
    if cache.head_kind is not None:  # None: the caller ran the head fused with its loss
        dh, head_grads = cache.head_kind.backward(dout, cache.head, d_pooled)
    grads: dict[str, np.ndarray] = {}
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
    for name, share in head_grads.items():
        # a table the head shares with the encoder (the tied decoder): lookup share + head share
        grads[name] = grads[name] + share if name in grads else share
    return {name: grads[name] for name in shapes if name in grads}, d_embeddings


def run_loss_backward(dloss, cache: LossCache):
    """The gradients of ``dloss`` times the loss (``dloss`` a scalar of the parameters'
    dtype): (grads, d_embeddings), the loss's backward then the model's."""
    return cache.head.loss_backward(dloss, cache)


# --------------------------------------------------------------------------- entry points
def embed(params, config: BertConfig, input_ids, *, token_type_ids=None) -> np.ndarray:
    """The input embeddings [B, T, H] that the first block receives: token + position
    (+ token type, LayerNorm'ed for BERT)."""
    check_params(params, config)
    _check_ids(input_ids, config)
    token_type_ids = _check_token_types(token_type_ids, config, input_ids.shape)
    return _embed(params, config, input_ids, token_type_ids)[0]


def forward(params, config: BertConfig, input_ids=None, attention_mask=None, *,
            token_type_ids=None, inputs_embeds=None):
    """ids [B, T] -> logits [B, T, V] (head "mlm"), the last hidden states [B, T, H] (head
    "none"; with ``config.pooler`` the cache's ``pooled`` [B, H] holds the pooler's output) or
    class logits [B, num_labels] (head "classifier").  Returns (out, ModelCache).

    ``token_type_ids`` [B, T] (segment ids, default 0) for configs with token types.
    ``inputs_embeds`` [B, T, H] replaces the whole embedding layer (what the first block
    receives); the embedding tables then get zero gradients.
    ``attention_mask`` [B, T]: 1 for tokens that may be attended, 0 for padding.
    Every argument is checked here, once; the layers below run unchecked kernels.
    """
    batch = check_inputs(params, config, input_ids, attention_mask,
                         token_type_ids=token_type_ids, inputs_embeds=inputs_embeds)
    return run_forward(params, config, batch)


def backward(dout, cache, d_pooled=None):
    """dout: gradient w.r.t. forward's output; ``d_pooled`` [B, H]: w.r.t. the pooler's output
    (head "none" with config.pooler; default 0).  Returns (grads, d_embeddings [B, T, H])."""
    check_backward(dout, cache, d_pooled)
    return run_backward(dout, cache, d_pooled)


def loss(params, config: BertConfig, input_ids=None, *, labels=None, targets=None,
         attention_mask=None, token_type_ids=None, inputs_embeds=None, reduction: str = "mean",
         ignore_index: int = IGNORE_INDEX):
    """The scalar training loss, forward only (what finite differences evaluate): head "mlm":
    masked cross-entropy of the logits vs the labels [B, T]; "classifier": cross-entropy of
    the class logits vs the labels [B]; "none": MSE of the hidden states vs the targets
    [B, T, H]."""
    batch = check_loss_inputs(params, config, input_ids, labels=labels, targets=targets,
                              attention_mask=attention_mask, token_type_ids=token_type_ids,
                              inputs_embeds=inputs_embeds, reduction=reduction,
                              ignore_index=ignore_index)
    return run_loss(params, config, batch, reduction, ignore_index, grad=False)[0]


def loss_and_grads(params, config: BertConfig, input_ids=None, *, labels=None, targets=None,
                   attention_mask=None, token_type_ids=None, inputs_embeds=None,
                   reduction: str = "mean", ignore_index: int = IGNORE_INDEX):
    """One forward + backward of ``loss``.  Returns (loss, grads, d_embeddings)."""
    batch = check_loss_inputs(params, config, input_ids, labels=labels, targets=targets,
                              attention_mask=attention_mask, token_type_ids=token_type_ids,
                              inputs_embeds=inputs_embeds, reduction=reduction,
                              ignore_index=ignore_index)
    value, cache = run_loss(params, config, batch, reduction, ignore_index)
    return (value, *run_loss_backward(batch.dtype.type(1.0), cache))


def masked_lm_loss_and_grads(params, config: BertConfig, input_ids, *, labels,
                             attention_mask=None, token_type_ids=None, reduction: str = "mean",
                             ignore_index: int = IGNORE_INDEX):
    """``loss_and_grads`` for the Mini-BERT MLM head, computing the head only where a label is
    predicted: the same loss and gradients up to summation order, without the logits of the
    positions that contribute nothing.  Returns (loss, grads, d_embeddings)."""
    batch = check_loss_inputs(params, config, input_ids, labels=labels,
                              attention_mask=attention_mask, token_type_ids=token_type_ids,
                              reduction=reduction, ignore_index=ignore_index,
                              labelled_rows_only=True)
    value, cache = run_loss(params, config, batch, reduction, ignore_index, predicted_only=True)
    return (value, *run_loss_backward(batch.dtype.type(1.0), cache))
