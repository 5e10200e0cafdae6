"""The adapter protocol: the one op table, and how an implementation under test is reached.

Any NumPy implementation can be put under test: ``minibert check package.module:object``,
``pytest --minibert-impl package.module:object``, or ``parametrize_with_checks(module)`` in a
test file of its own (minibert_spec.suite).  The object is a module, a class instance or any
namespace; the suite only ever reads attributes from it.

The package: :mod:`~minibert_spec.protocol.table` (the op table),
:mod:`~minibert_spec.protocol.capabilities` (what an implementation may declare it lacks),
:mod:`~minibert_spec.protocol.proxy` (how every check reaches it),
:mod:`~minibert_spec.protocol.loading` (``package.module[:object]``).

Adapter protocol
================
An implementation provides any subset of the names below.  A test or check that touches a name
the implementation lacks is reported as *not applicable* ("not applicable: <impl> lacks
<name>"), never as passed.

Conventions for every op pair
-----------------------------
* ``X_forward(...) -> (out, cache)`` and ``X_backward(dout, cache) -> tuple of gradients``: one
  gradient per differentiable input of the forward, in the forward's argument order, ``None``
  for an optional bias that was ``None``.  ``cache`` is opaque to the suite (a tuple, a dict, an
  object: anything), but two forwards must not share it: the suite runs forward several times
  before calling backward, so a cache kept on ``self`` must belong to a fresh object per call
  (see tests/examples/ for that adaptation).
* Inputs are ``numpy.ndarray``; float32 and float64 are both accepted and every output has the
  dtype of the inputs (finite differences run in float64 only).  Integer ids/labels are any
  integer dtype; masks are bool or 0/1 integers.
* Bad input raises ``ValueError`` naming the argument (expected vs actual).
* Shapes: B batch, T sequence, H hidden, A heads, d_k = H / A, I intermediate, V vocabulary.

The rows
--------
Every row of the op table (:mod:`minibert_spec.protocol.table`: names, differentiable inputs,
equation IDs, a fixed-seed example and the contract in words) -- op pairs, the model entry points
(``param_shapes``, ``init_params``, ``embed``, ``forward``, ``backward``, ``loss``,
``loss_and_grads`` over a flat dict of dotted parameter names; config is
``minibert_reference.config.BertConfig``), the optimizer (``adam_init``, ``adam_step``,
``warmup_linear_lr``, ``global_grad_norm``, ``clip_by_global_norm``) and
``accumulate_gradients``.  ``python -m minibert_spec.protocol`` prints them (``--markdown``: the
table of docs/check-your-implementation.md, generated from the rows; a test fails when that file is
stale).  Loss backwards take the upstream gradient as a scalar:
``cross_entropy_backward(dloss, cache)``.

These names may live on the object itself or on its ``optim`` attribute / submodule.

The optimizer contract (what the checks and the oracle tests rely on):

* ``adam_init(params)`` returns the state ``{"step": 0, "m": {name: zeros}, "v": {name:
  zeros}}`` (the oracle compares ``m`` and ``v`` with torch.optim's ``exp_avg`` and
  ``exp_avg_sq`` and ``step`` with the number of steps taken; extra keys are allowed, e.g. your
  optimizer object); ``adam_step`` is *pure*: it returns new ``params`` and a new ``state`` and
  mutates none of ``params``, ``grads``, ``state`` (copy first if your optimizer updates in
  place); the first call after ``adam_init`` is step t = 1 (bias correction ``1 - beta^t``);
  float32 parameters stay float32 (the moments too).  Optional: an ``out=(params, state)``
  keyword writing the result into those arrays (an earlier step's, which the caller no longer
  needs) instead of new ones; the trainer passes it when the signature has it (the reference's
  double buffering), and calls ``adam_step`` without it otherwise.
* Keywords the tests pass: ``lr``, ``beta1``, ``beta2``, ``eps``, ``weight_decay``,
  ``no_decay``; defaults ``beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0`` (``lr`` is
  always given).  ``no_decay`` is a collection of parameter names (or a predicate ``name ->
  bool``) excluded from weight decay; decay is decoupled: ``p - lr * (update + wd * p)``.
  Without ``no_decay`` the default rule applies (BERT's; the oracle compares it with
  torch.optim.AdamW parameter groups): no decay for the embedding tables (``embeddings.*``),
  LayerNorm ``gamma``/``beta`` and biases (last name component ``b`` or ``b_*``).
* ``warmup_linear_lr`` of the 0-based step: rising linearly to ``peak_lr`` over
  ``warmup_steps``, then linearly to 0 at ``total_steps``; the reference's lr(0) is
  ``peak / warmup``.  ``lr(0) = 0`` (the derivation's ``peak * s / warmup``) is a *convention*
  when declared (``CAPABILITIES["conventions"]``), reported with the first step's lr it changes.
* ``global_grad_norm`` is the 2-norm over all tensors; ``clip_by_global_norm(grads, max_norm,
  *, eps=0.0)`` scales every tensor by one factor ``max_norm / (norm + eps)`` when ``norm >
  max_norm`` and returns ``(grads, norm before clipping)``, without mutating its input.  The
  oracle passes ``eps=1e-6`` (torch's ``clip_grad_norm_`` guard); without an ``eps`` keyword it
  runs torch with your declared guard (``CAPABILITIES["guards"]["clip_eps"]``, default 0,
  spec/protocol/guards.py).  The checks call it without ``eps``: a guard of your own must be
  declared (undeclared, it is a failure naming the eps it implies).
* An ``adam_step`` without a ``no_decay`` keyword gets the no-decay set applied by the suite
  (spec/protocol/optim_contract.py: ``lr * wd * p`` added back after the step), reported as a
  convention.

Capabilities (partial support)
------------------------------
An implementation may declare what it does *not* support with a ``CAPABILITIES`` dict (on the
object, or its module); absent keys take the defaults below, so an adapter without it claims
everything::

    CAPABILITIES = {
        "attention_bias": False,       # attention / block without b_q, b_k, b_v, b_o
        "key_mask": False,             # attention / block / softmax without a mask
        "weight_decay": False,         # adam_step without weight_decay / no_decay keywords
        "ranks": {"linear": (3,)},     # ranks of the first input an op accepts
        "conventions": ("lr(0)=0",),   # documented conventions this implementation follows
        "guards": {"log_eps": 1e-12},  # numerical guards (spec/protocol/guards.py)
        "arrays": "torch",             # computes on torch tensors (spec/protocol/arrays.py)
    }

The declaration is read in one place, :func:`~minibert_spec.protocol.capabilities.capabilities`, and
validated in full before any check runs: anything it cannot take (a malformed or out-of-range
value, a declared keyword option the forward's signature contradicts, a ``CAPABILITIES`` whose
reading raises) is a :class:`~minibert_spec.protocol.capabilities.DeclarationError` naming the key,
the value and what is accepted, on which every entry point stops.

Variants (``CAPABILITIES[op] = {option: value or tuple of values}``, the table of options in
:data:`~minibert_spec.protocol.capabilities.VARIANTS`, adapted in
:mod:`~minibert_spec.protocol.variants`): layernorm ``affine``/``eps``, ffn ``b_2``, attention
``W_o``/``causal``/``heads``, block ``norm`` (post, pre, pre_final)/``causal``, cross_entropy
``ignore_index``/``input`` (logits, probabilities, probabilities_dlogits).  Absent pieces are passed
as None (and their gradients are None); a keyword option (causal=, norm=, input=) is passed to an
implementation declaring several forms and left out for one declaring a single form; per-head
weights and probability losses are adapted.  Each check says which forms it needs (``Check.needs``)
and is not applicable, before anything is drawn, to an implementation that does not declare them.

The checks adapt instead of failing on what was never claimed: a call with a bias, mask or
weight decay the implementation does not claim is *not applicable* (skipped / ``n/a``), the
conformance examples use ``None`` biases and no mask, and inputs of a rank an op does not accept
are reshaped to one it does (leading axes of 1 added, or merged) for the ops that act on the
last axis alone (linear, layernorm, softmax, relu, tanh, ffn, cross_entropy, mse,
linear_cross_entropy), with the output and gradients reshaped back.  Conventions the
documents allow are reported as conventions, with the number they change, never as
failures: a scalar loss promoted to float64 always; declared numerical guards (``"guards"``,
spec/protocol/guards.py); ``lr(0) = 0`` when declared in ``"conventions"`` (undeclared, it is
indistinguishable from the off-by-one it is in the reference, and fails naming the declaration).

The op table
============
:data:`OPS` is the one definition of "op" in the project: for each conformance row its protocol
names, its differentiable inputs (the order of the backward's gradients), the equation IDs it
realises, its parameter names and the ``minibert_reference`` module that defines it.  The
conformance checker, the finite-difference, invariant and oracle tests, the mutation catalog and the
audit all derive from it: adding an op is one row (with its contract in words) plus its maths
(``minibert_reference``), its SymPy file (``spec/equations/<prefix>.py``) and its case family with
its fixed-seed cases and its torch twin (``spec/suite/strategies/``): the finite-difference,
oracle and generic invariant checks then run it without op-specific code.
"""

from __future__ import annotations

from minibert_reference.ops import IGNORE_INDEX
from minibert_spec.protocol.capabilities import (
    CONVENTIONS,
    DEFAULT_CAPABILITIES,
    RANK_ADAPTABLE,
    DeclarationError,
    capabilities,
    not_claimed_message,
)
from minibert_spec.protocol.loading import ImplLoadError, load_impl
from minibert_spec.protocol.proxy import (
    ImplementationAbort,
    ImplementationExit,
    ImplementationHung,
    ImplProxy,
    NotApplicable,
    install_interrupt_flag,
    label_of,
    not_applicable_message,
    provides,
    resolve,
    sigint_seen,
    unwrap,
)
from minibert_spec.protocol.table import (
    EQUATION_OPS,
    OPS,
    Op,
    op_of_equation,
    op_of_name,
    protocol_markdown,
    reference_modules,
)

__all__ = ["IGNORE_INDEX", "OPS", "Op", "EQUATION_OPS", "op_of_equation",
           "op_of_name", "reference_modules",
           "protocol_markdown", "NotApplicable", "ImplProxy", "ImplementationAbort",
           "ImplementationExit", "ImplementationHung", "load_impl",
           "ImplLoadError", "resolve", "provides", "unwrap", "label_of", "not_applicable_message",
           "not_claimed_message", "capabilities", "install_interrupt_flag", "sigint_seen",
           "CONVENTIONS", "DEFAULT_CAPABILITIES", "RANK_ADAPTABLE", "DeclarationError"]
