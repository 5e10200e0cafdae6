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
(GELU, SiLU, token type, embeddings + LayerNorm, MLM head, classifier), then ``builtin`` (the
built-in ops' declared families, spec/builtin/).  The package's own names are those the suite
and its tests read; anything else is imported from its module.
"""

# ruff: noqa: F401
# (every import below is a re-export)

# The modules in the order of the one file they were: each ``@cases`` registers its families
# into kit.FAMILIES as its module runs, and that order is every family's and check's order.
# isort: off
from minibert_spec.suite.strategies.kit import (
    FAMILIES, SEEDED_FROM, CaseFamily, OpCase, families, family, fixed_cases, floats,
    ops_without_cases, variant_kwargs)
from minibert_spec.suite.strategies import embeddings as _embeddings
from minibert_spec.suite.strategies.norms import layernorm_cases
from minibert_spec.suite.strategies.attention import heads_cases, probability_rows
from minibert_spec.suite.strategies.blocks import (
    BLOCK_KEYWORDS, BLOCK_STANDARD, block_norm_amplification)
from minibert_spec.suite.strategies import losses as _losses, bert_ops as _bert_ops
from minibert_spec.suite.strategies import builtin as _builtin
# isort: on
