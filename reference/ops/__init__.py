"""Op pairs, llm.c style: ``X_forward(...) -> (out, cache)``, ``X_backward(dout, cache) -> grads``.

Conventions
-----------
* Pure functions, no hidden state: everything backward needs travels in ``cache``, a
  ``typing.NamedTuple`` whose field names are the derivation's (``LayerNormCache(x_hat, rstd,
  gamma)``).  Backwards read the fields by name.  The cache is opaque to the adapter protocol:
  only this package reads it (and, for the reference only, the claims ledger).
* A backward returns a tuple with one gradient per differentiable input of the forward, in the
  forward's argument order (``None`` where an optional input such as a bias was ``None``).
* float32 and float64 go through the same code; the dtype of the inputs is the dtype of every
  output (no silent casts, mixing dtypes is a ValueError).
* Shapes in comments: B batch, T sequence, H hidden, A heads, d_k = H / A, I intermediate, V vocab.
* Equation IDs (``@implements``) name the derivation in ``spec/`` each function realises; they sit
  on the kernels, which hold the maths.

Validation at the edge: kernels and public ops
----------------------------------------------
Every op comes in two layers, side by side:

* ``_X_forward(...)`` / ``_X_backward(dout, cache)`` -- the *kernel*: the maths only, no argument
  checks.  Kernels call kernels.  Private to the ``minibert_reference`` package
  (``minibert_reference.model`` composes them), never part of ``__all__``.
* ``X_forward`` / ``X_backward`` -- the *public op* of the protocol: checks every argument once
  (a ValueError naming the argument, see ``minibert_reference.validate``) and calls its kernel.
  Argument checks shared with composite ops live in ``_check_X`` helpers.

A composite op (attention, ffn, block, pooler) checks its own arguments once and then runs kernels
only; ``minibert_reference.model.forward`` checks params, ids and mask once and then runs kernels
only.

Sections
--------
One module per section, each op's kernels, public pair, cache and argument checks together; this
package re-exports every name of every section, so ``minibert_reference.ops.<name>`` reaches
each of them:

* ``_common`` -- ``IGNORE_INDEX``, ``_rows``, ``_sum_to_last``;
* ``embeddings`` -- token, tied, learned and sinusoidal position embeddings, BERT's token types
  and embedding LayerNorm;  ``rope`` -- rotary position embedding;
* ``linear``;  ``norms`` -- LayerNorm, RMSNorm;  ``activations`` -- softmax, ReLU, tanh, GELU,
  SiLU;
* ``attention``;  ``ffn`` -- the MLP and SwiGLU;  ``blocks`` -- the transformer blocks;
* ``heads`` -- pooler, MLM head, classifier;  ``losses`` -- cross-entropy (plain, next-token,
  fused with the linear map) and MSE.
"""

from __future__ import annotations

# Every name of the one-file module this package was (issue 38 split it by section), kernels,
# caches and tables included: minibert_reference.model and .decoder compose the kernels as
# ``ops._X``, the mutation catalog targets ``"ops._layernorm_backward"``, tests import them by
# name.  A kernel that another section calls is imported there by name too, so a mutant swaps it
# in every namespace that holds it (minibert_spec.mutants.activate).
import math  # noqa: F401 -- the module's own imports stay names of it (ops.np in test adapters)
from typing import NamedTuple  # noqa: F401

import numpy as np  # noqa: F401

from minibert_reference.ops._common import IGNORE_INDEX, _rows, _sum_to_last  # noqa: F401
from minibert_reference.ops.activations import (  # noqa: F401
    _ERF_N,
    _ERF_ORDER,
    _ERF_STEPS,
    _ERF_TABLE,
    _ERF_XMAX,
    _INV_SQRT_2PI,
    _SQRT_HALF,
    _TANH_C,
    _TANH_K,
    ACTIVATIONS,
    GeluCache,
    Relu2Cache,
    ReluCache,
    SiLUCache,
    SoftmaxCache,
    TanhCache,
    _activation_backward,
    _activation_forward,
    _check_activation,
    _check_approximate,
    _erf_taylor_table,
    _gelu_backward,
    _gelu_forward,
    _relu2_backward,
    _relu2_forward,
    _relu_backward,
    _relu_forward,
    _silu_backward,
    _silu_forward,
    _softmax_backward,
    _softmax_forward,
    _tanh_backward,
    _tanh_forward,
    erf,
    gelu_backward,
    gelu_forward,
    relu_backward,
    relu_forward,
    silu_backward,
    silu_forward,
    softmax_backward,
    softmax_forward,
    softmax_jacobian,
    tanh_backward,
    tanh_forward,
)
from minibert_reference.ops.attention import (  # noqa: F401
    ATTENTION_PARAMS,
    AttentionCache,
    _attention_backward,
    _attention_forward,
    _causal_mask,
    _check_attention,
    _check_heads,
    _fused_qkv,
    _merge_heads,
    _split_heads,
    attention_backward,
    attention_forward,
    merge_heads,
    split_heads,
)
from minibert_reference.ops.blocks import (  # noqa: F401
    BLOCK_FFNS,
    BLOCK_NORMALIZATIONS,
    BLOCK_NORMS,
    BLOCK_PARTS,
    BlockCache,
    InnerLNBlockCache,
    PreLNBlockCache,
    _attention_of,
    _block_backward,
    _block_forward,
    _block_variant,
    _check_block,
    _ffn_of,
    _innerln_block_backward,
    _innerln_block_forward,
    _mlp_backward,
    _mlp_forward,
    _norm_backward,
    _norm_forward,
    _part_grads,
    _preln_block_backward,
    _preln_block_forward,
    block_backward,
    block_forward,
    block_param_names,
    block_param_shapes,
)
from minibert_reference.ops.embeddings import (  # noqa: F401
    EmbeddingCache,
    EmbeddingLNCache,
    PositionEmbeddingCache,
    SinusoidalPositionCache,
    TiedEmbeddingCache,
    TokenTypeCache,
    _check_embedding_ln,
    _embedding_backward,
    _embedding_forward,
    _embedding_ln_backward,
    _embedding_ln_forward,
    _position_embedding_backward,
    _position_embedding_forward,
    _sinusoidal_encoding,
    _sinusoidal_position_backward,
    _sinusoidal_position_forward,
    _tied_embedding_backward,
    _tied_embedding_forward,
    _token_type_embedding_backward,
    _token_type_embedding_forward,
    embedding_backward,
    embedding_forward,
    embedding_ln_backward,
    embedding_ln_forward,
    position_embedding_backward,
    position_embedding_forward,
    sinusoidal_encoding,
    sinusoidal_position_backward,
    sinusoidal_position_forward,
    tied_embedding_backward,
    tied_embedding_forward,
    token_type_embedding_backward,
    token_type_embedding_forward,
)
from minibert_reference.ops.ffn import (  # noqa: F401
    FFN_PARAMS,
    SWIGLU_PARAMS,
    FFNCache,
    SwiGLUCache,
    _check_ffn_params,
    _ffn_backward,
    _ffn_forward,
    _swiglu_backward,
    _swiglu_forward,
    ffn_backward,
    ffn_forward,
    swiglu_backward,
    swiglu_forward,
)
from minibert_reference.ops.heads import (  # noqa: F401
    ClassifierCache,
    MLMHeadCache,
    PoolerCache,
    _classifier_backward,
    _classifier_forward,
    _mlm_head_backward,
    _mlm_head_forward,
    _pooler_backward,
    _pooler_forward,
    classifier_backward,
    classifier_forward,
    mlm_head_backward,
    mlm_head_forward,
    pooler_backward,
    pooler_forward,
)
from minibert_reference.ops.linear import (  # noqa: F401
    LinearCache,
    _check_linear,
    _linear_backward,
    _linear_forward,
    linear_backward,
    linear_forward,
)
from minibert_reference.ops.losses import (  # noqa: F401
    CE_BLOCK_BYTES,
    CE_INPUTS,
    CrossEntropyCache,
    LinearCrossEntropyCache,
    MSECache,
    NextTokenCache,
    ProbsCrossEntropyCache,
    _check_ce_labels,
    _check_probabilities,
    _cross_entropy_backward,
    _cross_entropy_forward,
    _cross_entropy_probs_backward,
    _cross_entropy_probs_forward,
    _linear_cross_entropy_backward,
    _linear_cross_entropy_forward,
    _mse_backward,
    _mse_forward,
    _next_token_cross_entropy_backward,
    _next_token_cross_entropy_forward,
    _scalar,
    cross_entropy_backward,
    cross_entropy_forward,
    linear_cross_entropy_backward,
    linear_cross_entropy_forward,
    mse_backward,
    mse_forward,
    next_token_cross_entropy_backward,
    next_token_cross_entropy_forward,
)
from minibert_reference.ops.norms import (  # noqa: F401
    LayerNormCache,
    RMSNormCache,
    _check_eps,
    _check_layernorm_params,
    _layernorm_backward,
    _layernorm_forward,
    _layernorm_forward_scaled,
    _rmsnorm_backward,
    _rmsnorm_forward,
    layernorm_backward,
    layernorm_forward,
    rmsnorm_backward,
    rmsnorm_forward,
)
from minibert_reference.ops.rope import (  # noqa: F401
    ROPE_CONVENTIONS,
    RoPECache,
    _check_rope_base,
    _rope_angles,
    _rope_backward,
    _rope_forward,
    _rope_pairs,
    _rope_positions,
    _rotate,
    rope_backward,
    rope_forward,
)
from minibert_reference.registry import implements  # noqa: F401
from minibert_reference.validate import (  # noqa: F401
    FLOAT_DTYPES,
    as_float_array,
    as_index_array,
    as_mask,
)

__all__ = [
    "embedding_forward",
    "embedding_backward",
    "tied_embedding_forward",
    "tied_embedding_backward",
    "position_embedding_forward",
    "position_embedding_backward",
    "sinusoidal_encoding",
    "sinusoidal_position_forward",
    "sinusoidal_position_backward",
    "rope_forward",
    "rope_backward",
    "ROPE_CONVENTIONS",
    "linear_forward",
    "linear_backward",
    "layernorm_forward",
    "layernorm_backward",
    "rmsnorm_forward",
    "rmsnorm_backward",
    "softmax_forward",
    "softmax_backward",
    "softmax_jacobian",
    "relu_forward",
    "relu_backward",
    "tanh_forward",
    "tanh_backward",
    "gelu_forward",
    "gelu_backward",
    "silu_forward",
    "silu_backward",
    "token_type_embedding_forward",
    "token_type_embedding_backward",
    "embedding_ln_forward",
    "embedding_ln_backward",
    "mlm_head_forward",
    "mlm_head_backward",
    "classifier_forward",
    "classifier_backward",
    "ACTIVATIONS",
    "split_heads",
    "merge_heads",
    "attention_forward",
    "attention_backward",
    "ffn_forward",
    "ffn_backward",
    "swiglu_forward",
    "swiglu_backward",
    "block_param_names",
    "block_param_shapes",
    "block_forward",
    "block_backward",
    "pooler_forward",
    "pooler_backward",
    "cross_entropy_forward",
    "cross_entropy_backward",
    "next_token_cross_entropy_forward",
    "next_token_cross_entropy_backward",
    "linear_cross_entropy_forward",
    "linear_cross_entropy_backward",
    "mse_forward",
    "mse_backward",
    "IGNORE_INDEX",
    "ATTENTION_PARAMS",
    "FFN_PARAMS",
    "SWIGLU_PARAMS",
]
