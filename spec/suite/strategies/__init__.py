"""Hypothesis strategies of the judging suite: the inputs every op check draws.

Everything here is plain NumPy + Hypothesis: no import of ``minibert_reference``'s maths, so a
strategy draws the same data whatever implementation is under test.  Conventions:

* float64 arrays, bounded, finite: small ones element by element (explicit bounded
  ``elements=``, ``fill=st.nothing()``, no NaN/inf, no subnormals), larger ones uniform from one
  drawn seed (:func:`arrays`); small sides so element-wise finite differences stay cheap.
* Shapes: B >= 1 and T >= 1 (T = 1 included), d_k = 1 allowed.
* Upstream gradients are random and never all ones (nor constant, which is all-ones rescaled).
* gamma is random and varies across features (never the initial 1), beta is never all 0.
* Non-smooth points are kept out of the sample: ReLU pre-activations at least
  ``KINK_MARGIN`` from 0, LayerNorm rows with variance at least ``LN_MIN_VAR``.
* An op case is an :class:`OpCase`: the differentiable inputs by forward argument name, the
  non-differentiable ones (ids, masks, labels, n_heads), and an upstream gradient.
* ``@cases("op", "variant", **strategy_kwargs)`` on an op's case strategy registers a case
  family of a row of ``minibert_spec.protocol.OPS``: the FD and generic invariant checks
  (spec/suite/checks/fd.py, invariants.py) run every registered family, with the check name
  ``op_variant`` (or ``op``).
* Variants an implementation may not support (masks, biases, the op variants of
  ``minibert_spec.protocol.capabilities.VARIANTS``) are parameters of a family, decided before
  anything is drawn: ``needs`` (what the implementation must declare, else the check is not
  applicable with the reason) and ``resolve`` (the options that follow the implementation: a family
  about causal attention draws biases only for an implementation that has them).
* The smoothness filters of composite ops (the block) run the protocol's reference ops, so a
  filter never calls the implementation in a form it does not declare.

The package, by module: ``kit`` (the bounds, the building blocks, :class:`OpCase`,
:class:`CaseFamily`, ``@cases`` and the registry it fills, :data:`FAMILIES`), then the case
families by section: ``embeddings`` (and RoPE), ``norms`` (linear, LayerNorm, RMSNorm, softmax,
ReLU, tanh), ``attention``, ``blocks`` (FFN, SwiGLU, block, pooler), ``losses`` and ``bert_ops``
(GELU, SiLU, token type, embeddings + LayerNorm, MLM head, classifier).  Every name of every
module, private ones included, is importable from here.
"""

# ruff: noqa: F401
# (every import below is a re-export: the names of the one module this package was)

# The modules in the order of the one file they were: each ``@cases`` registers its families
# into kit.FAMILIES as its module runs, and that order is every family's and check's order.
# isort: off
from minibert_spec.suite.strategies.kit import (
    CaseFamily, DOUT_BOUND, ELEMENTWISE_MAX_SIZE, EXAMPLE_SEED, FAMILIES, MAX_B, MAX_D_K, MAX_HEADS,
    MAX_T, N_DIRECTIONS, OpCase, SEEDED_FROM, VALUE_BOUND, _SEEDED_DRAWS, _away_from_zero,
    _gamma_beta, _lead_shapes, _seed, _seeded_before, _softmax_rows, arrays, away_from_zero,
    batch_seq, betas, cases, ce_labels, families, family, fixed_cases, fixed_examples, floats,
    gammas, head_dims, key_masks, layernorm_inputs, np_arrays, ops_without_cases, relu_inputs,
    reused, row_masks, scalar_upstream, seeded_arrays, sizes, token_ids, upstream, upstream_like,
    variant_kwargs)
from minibert_spec.suite.strategies.embeddings import (
    _embedding_example, embedding_cases, position_embedding_cases, rope_bases,
    sinusoidal_position_cases)
from minibert_spec.suite.strategies.norms import (
    _LN, _layernorm_example, _layernorm_scale, _linear_example, _softmax_example, drawn_eps,
    layernorm_cases, layernorm_eps, linear_cases, relu_cases, softmax_cases, tanh_cases)
from minibert_spec.suite.strategies.attention import (
    ATTENTION_BIASES, ATTENTION_WEIGHTS, _ATTN, _FOLLOW, _HEADS, _NOT_STANDARD, _attention_example,
    _attention_example_params, _attention_needs, _example_mask, _probability_rows_example,
    attention_cases, attention_params, causal_key_masks, heads_cases, probability_rows,
    with_and_without_mask)
from minibert_spec.suite.strategies.blocks import (
    BLOCK_KEYWORDS, BLOCK_STANDARD, _BLOCK, _INNER, _PARTS, _POST, _PRE, _block_example,
    _block_fixed, _block_needs, _block_weights, _but, _case_conditioning, _ffn_example,
    _pooler_example, block_adapter, block_backward_scale, block_cases,
    block_conditioning, block_norm_amplification, block_smooth, block_variant, ffn_cases,
    ffn_params, pooler_cases, relu_preactivation_ok)
from minibert_spec.suite.strategies.losses import (
    _CE, _CE_LABELS, _IGNORING, _PROBS, _cross_entropy_example, _cross_entropy_probs_example,
    _gathered, _linear_cross_entropy_example, _probs, _probs_omit, cross_entropy_cases,
    cross_entropy_probs_cases, linear_cross_entropy_cases, mse_cases)
from minibert_spec.suite.strategies.bert_ops import (
    GELU_SLOPE_MAX, _GELU, _MLM, _classifier_example, _embedding_ln_example, _mlm_head_example,
    _mlm_head_ln_input, _mlm_head_scale, _token_type_example, classifier_cases, embedding_ln_cases,
    embedding_ln_smooth, gelu_cases, mlm_head_cases, mlm_head_smooth, token_type_cases)
# the built-in ops' declared families (spec/builtin/), registered on import
from minibert_spec.suite.strategies import builtin as _builtin  # noqa: F401
# isort: on
