"""The adapter protocol: the one op table, and how an implementation under test is loaded.

Any NumPy implementation can be put under test: ``pytest --impl package.module:object`` (or the
environment variable ``MINIBERT_IMPL``, as array-api-tests selects its module with
``ARRAY_API_TESTS_MODULE``) and ``minibert check package.module:object``.  The object is a module,
a class instance or any namespace; the suite only ever reads attributes from it.

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

Op pairs (forward arguments -> output; what backward returns)
* ``embedding_forward(ids [B,T] int, W [V,H])`` -> ``W[ids]`` [B,T,H]; backward ``(dW,)``
* ``position_embedding_forward(x [B,T,H], W_pos [T_max,H])`` -> ``x + W_pos[:T]``;
  backward ``(dx, dW_pos)``
* ``sinusoidal_encoding(T, d, dtype)`` -> PE [T,d] (sin on even features, cos on odd);
  ``sinusoidal_position_forward(x [B,T,H])`` -> ``x + PE``; backward ``(dx,)``
* ``linear_forward(x [...,n], W [n,m], b [m] or None)`` -> ``x W + b`` [...,m];
  backward ``(dx, dW, db)``
* ``layernorm_forward(x [...,N], gamma [N], beta [N], eps=1e-12)`` -> ``gamma * x_hat + beta``
  with the biased variance; backward ``(dx, dgamma, dbeta)``
* ``softmax_forward(x [...,n], mask=None)`` -> softmax over the last axis, ``mask`` (bool, x's
  shape) keeps True entries; backward ``(dx,)``
* ``relu_forward(x)``, ``tanh_forward(x)`` -> elementwise; backward ``(dx,)``
* ``gelu_forward(x, approximate="none"|"tanh")`` -> ``x Phi(x)`` (erf) or its tanh
  approximation (Hugging Face ``gelu_new``); backward ``(dx,)``
* ``token_type_embedding_forward(x [B,T,H], type_ids [B,T] int, W_type [n_types,H])`` ->
  ``x + W_type[type_ids]``; backward ``(dx, dW_type)``
* ``embedding_ln_forward(ids, type_ids, W_word [V,H], W_pos [T_max,H], W_type [n_types,H],
  gamma, beta, eps=1e-12)`` -> ``LN(W_word[ids] + W_pos[:T] + W_type[type_ids])``;
  backward ``(dW_word, dW_pos, dW_type, dgamma, dbeta)``
* ``mlm_head_forward(h [...,H], W_t [H,H], b_t, gamma, beta, W_word [V,H], b_dec [V], *,
  eps=1e-12, activation="gelu")`` -> ``LN(act(h W_t + b_t)) W_word^T + b_dec`` (BERT's head,
  the decoder tied to the word embeddings); backward ``(dh, dW_t, db_t, dgamma, dbeta,
  dW_word, db_dec)`` with dW_word the decoder's share only
* ``classifier_forward(h [B,T,H], W_p [H,H], b_p, W_c [H,C], b_c [C])`` ->
  ``tanh(h[:, 0] W_p + b_p) W_c + b_c`` [B,C]; backward ``(dh, dW_p, db_p, dW_c, db_c)``
* ``split_heads(x [B,T,H], n_heads)`` -> [B,A,T,d_k]; ``merge_heads`` is its inverse
* ``attention_forward(x [B,T,H], W_q, W_k, W_v, W_o [H,H], b_q, b_k, b_v, b_o [H] or None, *,
  n_heads, mask=None)`` -> multi-head self-attention [B,T,H], ``mask`` [B,T] marks the keys that
  may be attended; backward ``(dx, dW_q, dW_k, dW_v, dW_o, db_q, db_k, db_v, db_o)``
* ``ffn_forward(x, W_1 [H,I], b_1 [I], W_2 [I,H], b_2 [H])`` -> ``ReLU(x W_1 + b_1) W_2 + b_2``;
  backward ``(dx, dW_1, db_1, dW_2, db_2)``
* ``block_forward(x [B,T,H], p, *, n_heads, mask=None, eps=1e-12)`` -> post-LN block
  ``LN2(h + FFN(h))`` with ``h = LN1(x + MHA(x))``; ``p`` is a dict with keys ``attn.W_q`` ..
  ``attn.b_o``, ``ln1.gamma``, ``ln1.beta``, ``ffn.W_1`` .. ``ffn.b_2``, ``ln2.gamma``,
  ``ln2.beta``; backward ``(dx, grads)`` with grads keyed like ``p``
* ``pooler_forward(h [B,T,H], W [H,H], b [H])`` -> ``tanh(h[:, 0] W + b)`` [B,H];
  backward ``(dh, dW, db)``
* ``cross_entropy_forward(logits [...,V], labels [...], *, ignore_index=-100,
  reduction="mean"|"sum")`` -> scalar ("mean" divides by the number of positions whose label is
  not ``ignore_index``); backward ``(dlogits,)``
* ``mse_forward(y_hat, y)`` -> scalar ``sum((y_hat - y)^2) / y.size``; backward ``(dy_hat, dy)``
* ``linear_cross_entropy_forward(x [...,n], W [n,V], b [V] or None, labels [...], *,
  ignore_index=-100, reduction="mean"|"sum")`` -> ``cross_entropy(x W + b, labels)`` (the
  Mini-BERT head fused with its loss: no [...,V] array need be kept); backward ``(dx, dW, db)``

Loss backwards take the upstream gradient as a scalar: ``cross_entropy_backward(dloss, cache)``.

Model entry points (config is ``reference.config.BertConfig``; params a flat dict of dotted names)
--------------------------------------------------------------------------------------------------
* ``param_shapes(config) -> dict[name, shape]``; ``init_params(config, seed, dtype) -> params``
* ``embed(params, config, input_ids) -> [B,T,H]`` (token + position embeddings)
* ``forward(params, config, input_ids, attention_mask, *, token_type_ids=None,
  inputs_embeds=None) -> (out, cache)``; out is the logits, the last hidden states [B,T,H]
  (head "none"; ``cache.pooled`` holds the pooler's output when ``config.pooler``) or the class
  logits [B,C] (head "classifier")
* ``backward(dout, cache, d_pooled=None) -> (grads, d_embeddings)``; grads has exactly the keys,
  shapes and dtypes of params
* ``load_pretrained(path, dtype)`` / ``save_pretrained(params, config, path)``: Hugging Face
  BERT directories (``reference.hf``)
* ``loss(params, config, input_ids=None, *, labels=None, targets=None, attention_mask=None,
  inputs_embeds=None, reduction="mean")`` and ``loss_and_grads(...) -> (loss, grads,
  d_embeddings)`` with the same arguments

Optimizer (``reference.optim``)
-------------------------------
* ``adam_init(params) -> state``;  ``adam_step(params, grads, state, *, lr, beta1, beta2, eps,
  weight_decay, no_decay) -> (params, state)`` (decoupled weight decay, bias-corrected moments)
* ``warmup_linear_lr(step, *, peak_lr, warmup_steps, total_steps) -> float``
* ``global_grad_norm(grads) -> float``;  ``clip_by_global_norm(grads, max_norm) -> (grads, norm)``
* ``accumulate_gradients(impl, params, config, micro_batches) -> (loss, grads)``: micro-batches
  are dicts of ``input_ids``, ``labels`` (MLM) or ``targets`` (MSE), optional
  ``attention_mask``; the result is the full batch's mean loss and gradient (needs the model
  entry points ``init_params`` and ``loss_and_grads``)

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
  oracle passes ``eps=1e-6`` (torch's ``clip_grad_norm_`` guard); the checks call it without
  ``eps``, and a guard of your own there is reported as a convention with the relative change
  it makes.

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
    }

The checks adapt instead of failing on what was never claimed: a call with a bias, mask or
weight decay the implementation does not claim is *not applicable* (skipped / ``n/a``), the
conformance examples use ``None`` biases and no mask, and inputs of a rank an op does not accept
are reshaped to one it does (leading axes of 1 added, or merged) for the ops that act on the
last axis alone (linear, layernorm, softmax, relu, tanh, ffn, cross_entropy, mse,
linear_cross_entropy), with the output and gradients reshaped back.  Conventions the
documents allow are reported as conventions, with the number they change, never as
failures: a scalar loss promoted to float64
and a divisor guard in clipping (within ``CLIP_NORM_RTOL``) always; ``lr(0) = 0`` when declared
in ``"conventions"`` (undeclared, it is indistinguishable from the off-by-one it is in the
reference, and fails naming the declaration).

The op table
============
:data:`OPS` is the one definition of "op" in the project: for each conformance row its protocol
names, its differentiable inputs (the order of the backward's gradients), the equation IDs it
realises, its parameter names and the ``reference`` module that defines it.  The conformance
checker, the finite-difference, invariant and oracle tests, the mutation catalog and the audit
all derive from it: adding an op is one entry here plus its maths (``reference``), its SymPy
file (``spec/equations/<prefix>.py``) and its strategies (``tests/strategies.py``).

An entry's ``example`` builds small fixed-seed inputs (NumPy only) from which ``minibert check``
runs the op's backward against finite differences without any op-specific code; op-specific
identities attach to the op by name (``@invariant("op")`` in :mod:`spec.invariants`).
"""


from __future__ import annotations

import functools
import importlib
import inspect
import unittest
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from reference.ops import ATTENTION_PARAMS, FFN_PARAMS, IGNORE_INDEX, block_param_names
from spec.tolerances import KINK_MARGIN

__all__ = ["IGNORE_INDEX", "OPS", "Op", "Example", "EQUATION_OPS", "op_of_equation", "op_registrar",
           "reference_modules", "NotApplicable", "ImplProxy", "ImplementationExit", "load_impl",
           "resolve", "provides", "unwrap", "label_of", "not_applicable_message", "capabilities",
           "install_interrupt_flag", "ImplLoadError", "ImplementationHung"]


@dataclass(frozen=True)
class Example:
    """Fixed-seed inputs of an op pair: the differentiable inputs by forward argument name (in
    the order of the backward's gradients; None for an absent optional input) and the other
    keyword arguments of the forward (ids, masks, labels, n_heads, reduction, ...)."""

    inputs: dict
    fixed: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Op:
    """One row of the protocol.

    names:     the protocol names an implementation needs for this op (all, or it is n/a)
    inputs:    the differentiable inputs of the forward, in argument order: the backward returns
               one gradient per entry, in this order (``None`` for an absent optional input)
    equations: the derivation IDs of spec/equations this op realises
    params:    parameter names the op takes (attention weights, a block's local dict keys)
    module:    the module of ``reference`` that defines the names
    example:   ``rng -> inputs`` for the generic backward-vs-FD check of ``minibert check``:
               small float64 inputs built from ``rng`` (NumPy only), as a dict of the
               differentiable inputs, an ``(inputs, fixed kwargs)`` pair, or a list of pairs
               (one per variant: masked, reduction, ...); None for ops checked otherwise
    """

    name: str
    names: tuple[str, ...]
    inputs: tuple[str, ...] = ()
    equations: tuple[str, ...] = ()
    params: tuple[str, ...] = ()
    module: str = "ops"
    example: Callable[[np.random.Generator], object] | None = field(default=None, compare=False)

    @property
    def pair(self) -> tuple[str, str] | None:
        """(forward name, backward name) of an op pair, else None."""
        fwd = next((n for n in self.names if n.endswith("_forward")), None)
        bwd = next((n for n in self.names if n.endswith("_backward")), None)
        return (fwd, bwd) if fwd and bwd else None

    def examples(self, rng: np.random.Generator) -> list[Example]:
        """The op's fixed-seed inputs, normalised to a list of :class:`Example` ([] if none)."""
        if self.example is None:
            return []
        built = self.example(rng)
        if isinstance(built, dict):
            built = [(built, {})]
        elif isinstance(built, tuple):
            built = [built]
        return [Example(dict(inputs), dict(fixed)) for inputs, fixed in built]


def _pair(stem: str) -> tuple[str, str]:
    return (f"{stem}_forward", f"{stem}_backward")


# --------------------------------------------------------------------------- fixed-seed inputs
# Small float64 inputs for the suite's fixed-seed FD checks (spec/suite/checks/examples.py);
# the op's identities get the same inputs (spec/invariants.py).
def _away_from_zero(rng, shape, low=0.1, high=2.0):
    return rng.choice([-1.0, 1.0], size=shape) * rng.uniform(low, high, size=shape)


def _embedding_example(rng):
    W = rng.standard_normal((6, 4))  # id 5 never occurs
    ids = np.array([[0, 3, 3, 1, 0], [3, 3, 2, 0, 4]])  # repeated ids within and across rows
    return {"W": W}, {"ids": ids}


def _layernorm_example(rng):
    x = rng.standard_normal((2, 3, 6)) * 2 + 1
    gamma, beta = 1 + 0.5 * rng.standard_normal(6), 0.3 * rng.standard_normal(6)  # never 1 / 0
    return {"x": x, "gamma": gamma, "beta": beta}


def _softmax_example(rng):
    x = rng.standard_normal((2, 3, 5)) * 2
    mask = rng.random((2, 3, 5)) < 0.6
    mask[..., 0] = True
    return [({"x": x}, {}), ({"x": x}, {"mask": mask})]


def attention_example(rng, H=6):
    """x [2, 4, H] and every attention weight and bias, in the forward's order."""
    ws = {n: rng.standard_normal((H, H)) * 0.6 for n in ("W_q", "W_k", "W_v", "W_o")}
    bs = {n: 0.3 * rng.standard_normal(H) for n in ("b_q", "b_k", "b_v", "b_o")}
    return {"x": rng.standard_normal((2, 4, H)), **ws, **bs}


def _attention_example(rng):
    inputs = attention_example(rng)
    mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0]])
    return [(inputs, {"n_heads": 2, "mask": m}) for m in (None, mask)]


def _ffn_example(rng, margin=100 * KINK_MARGIN):
    for _ in range(100):  # keep every ReLU pre-activation away from the kink
        x, W_1, b_1 = (rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 8)),
                       0.3 * rng.standard_normal(8))
        if np.min(np.abs(x @ W_1 + b_1)) > margin:
            break
    return {"x": x, "W_1": W_1, "b_1": b_1, "W_2": rng.standard_normal((8, 4)),
            "b_2": 0.3 * rng.standard_normal(4)}


def _cross_entropy_example(rng):
    logits = rng.standard_normal((2, 4, 5)) * 2
    labels = np.array([[1, IGNORE_INDEX, 4, 4], [IGNORE_INDEX, IGNORE_INDEX, 0, 2]])
    return [({"logits": logits}, {"labels": labels, "reduction": r}) for r in ("mean", "sum")]


def _linear_cross_entropy_example(rng):
    inputs = {"x": rng.standard_normal((2, 3, 4)), "W": rng.standard_normal((4, 5)),
              "b": rng.standard_normal(5)}
    labels = np.array([[1, IGNORE_INDEX, 4], [0, 4, IGNORE_INDEX]])
    return [(inputs, {"labels": labels, "reduction": r}) for r in ("mean", "sum")]


def _gelu_example(rng):
    x = rng.standard_normal((2, 3, 4)) * 2
    return [({"x": x}, {"approximate": a}) for a in ("none", "tanh")]


def _token_type_example(rng):
    type_ids = np.array([[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]])  # repeated segment ids
    return ({"x": rng.standard_normal((2, 5, 4)), "W_type": rng.standard_normal((3, 4))},
            {"type_ids": type_ids})  # segment 2 never occurs


def _embedding_ln_example(rng):
    H = 5
    ids = np.array([[0, 3, 3, 1], [3, 2, 0, 4]])
    type_ids = np.array([[0, 0, 1, 1], [0, 1, 1, 1]])
    inputs = {"W_word": rng.standard_normal((6, H)), "W_pos": rng.standard_normal((5, H)),
              "W_type": rng.standard_normal((2, H)), "gamma": 1 + 0.5 * rng.standard_normal(H),
              "beta": 0.3 * rng.standard_normal(H)}
    return inputs, {"ids": ids, "type_ids": type_ids}


def _mlm_head_example(rng):
    H, V = 4, 7
    inputs = {"h": rng.standard_normal((2, 3, H)), "W_t": rng.standard_normal((H, H)),
              "b_t": 0.3 * rng.standard_normal(H), "gamma": 1 + 0.5 * rng.standard_normal(H),
              "beta": 0.3 * rng.standard_normal(H), "W_word": rng.standard_normal((V, H)),
              "b_dec": 0.3 * rng.standard_normal(V)}
    return [(inputs, {"activation": a}) for a in ("gelu", "gelu_tanh")]


def _classifier_example(rng):
    H, C = 4, 3
    return {"h": rng.standard_normal((2, 3, H)), "W_p": rng.standard_normal((H, H)),
            "b_p": 0.3 * rng.standard_normal(H), "W_c": rng.standard_normal((H, C)),
            "b_c": 0.3 * rng.standard_normal(C)}


_ATTENTION_EQUATIONS = (
    "attention.qkv", "attention.scores", "attention.context", "attention.output",
    "attention.backward.dW_o", "attention.backward.dV", "attention.backward.dP",
    "attention.backward.dS", "attention.backward.dQ", "attention.backward.dK",
    "attention.backward.dx")

_TABLE = (
    Op("embedding", _pair("embedding"), ("W",), ("embedding.forward", "embedding.backward"),
       example=_embedding_example),
    Op("position_embedding", _pair("position_embedding"), ("x", "W_pos"),
       ("position.learned.forward", "position.learned.backward"),
       example=lambda rng: {"x": rng.standard_normal((3, 4, 5)),
                            "W_pos": rng.standard_normal((6, 5))}),
    Op("sinusoidal_position", ("sinusoidal_encoding", *_pair("sinusoidal_position")), ("x",),
       ("position.sinusoidal",), example=lambda rng: {"x": rng.standard_normal((2, 7, 6))}),
    Op("linear", _pair("linear"), ("x", "W", "b"),
       ("linear.forward", "linear.backward.dx", "linear.backward.dW", "linear.backward.db"),
       example=lambda rng: {"x": rng.standard_normal((2, 3, 4)), "W": rng.standard_normal((4, 5)),
                            "b": rng.standard_normal(5)}),
    Op("layernorm", _pair("layernorm"), ("x", "gamma", "beta"),
       ("layernorm.forward", "layernorm.backward.dx", "layernorm.backward.dgamma",
        "layernorm.backward.dbeta"), example=_layernorm_example),
    Op("softmax", _pair("softmax"), ("x",), ("softmax.forward", "softmax.backward"),
       example=_softmax_example),
    Op("softmax_jacobian", ("softmax_jacobian",), (), ("softmax.jacobian",)),
    Op("relu", _pair("relu"), ("x",), ("relu.forward", "relu.backward"),
       example=lambda rng: {"x": _away_from_zero(rng, (2, 3, 4))}),
    Op("tanh", _pair("tanh"), ("x",), ("tanh.forward", "tanh.backward"),
       example=lambda rng: {"x": rng.standard_normal((2, 3, 4))}),
    Op("heads", ("split_heads", "merge_heads"), ("x",),
       ("attention.split_heads", "attention.merge_heads")),
    Op("attention", _pair("attention"), ("x", *ATTENTION_PARAMS), _ATTENTION_EQUATIONS,
       ATTENTION_PARAMS, example=_attention_example),
    Op("ffn", _pair("ffn"), ("x", *FFN_PARAMS), ("ffn.forward", "ffn.backward"), FFN_PARAMS,
       example=_ffn_example),
    Op("block", _pair("block"), ("x", "p"), ("block.postln", "residual.forward",
                                            "residual.backward", "block.backward"),
       block_param_names(attn_bias=True)),
    Op("pooler", _pair("pooler"), ("h", "W", "b"), ("pooler.forward",),
       example=lambda rng: {"h": rng.standard_normal((2, 3, 4)), "W": rng.standard_normal((4, 4)),
                            "b": 0.3 * rng.standard_normal(4)}),
    Op("gelu", _pair("gelu"), ("x",), ("gelu.forward.erf", "gelu.backward.erf",
                                       "gelu.forward.tanh", "gelu.backward.tanh"),
       example=_gelu_example),
    Op("token_type", _pair("token_type_embedding"), ("x", "W_type"),
       ("token_type.forward", "token_type.backward"), example=_token_type_example),
    Op("embedding_ln", _pair("embedding_ln"), ("W_word", "W_pos", "W_type", "gamma", "beta"),
       ("embedding_ln.forward", "embedding_ln.backward"), example=_embedding_ln_example),
    Op("mlm_head", _pair("mlm_head"), ("h", "W_t", "b_t", "gamma", "beta", "W_word", "b_dec"),
       ("mlm_head.forward", "mlm_head.backward", "mlm_head.decoder"),
       example=_mlm_head_example),
    Op("classifier", _pair("classifier"), ("h", "W_p", "b_p", "W_c", "b_c"),
       ("classifier.forward", "classifier.backward"), example=_classifier_example),
    Op("cross_entropy", _pair("cross_entropy"), ("logits",),
       ("loss.ce.mean", "loss.ce.sum", "loss.ce.backward.mean", "loss.ce.backward.sum"),
       example=_cross_entropy_example),
    Op("mse", _pair("mse"), ("y_hat", "y"), ("loss.mse", "loss.mse.backward"),
       example=lambda rng: {"y_hat": rng.standard_normal((2, 3, 4)),
                            "y": rng.standard_normal((2, 3, 4))}),
    Op("linear_cross_entropy", _pair("linear_cross_entropy"), ("x", "W", "b"),
       ("linear_ce.forward", "linear_ce.backward"), example=_linear_cross_entropy_example),
    Op("model", ("param_shapes", "init_params", "embed", "forward", "backward", "loss",
                 "loss_and_grads"), (), ("mlm_head.tied", "model.backward"), module="model"),
    Op("adam", ("adam_init", "adam_step"), (), ("optim.adam", "optim.adamw"), module="optim"),
    Op("schedule", ("warmup_linear_lr",), (), ("schedule.warmup_linear",), module="optim"),
    Op("clip", ("global_grad_norm", "clip_by_global_norm"), (), ("clip.global_norm",),
       module="optim"),
    Op("accumulation", ("accumulate_gradients", "init_params", "loss_and_grads"), (),
       ("accum.grad_mean",), module="accumulation"),
)

OPS: dict[str, Op] = {op.name: op for op in _TABLE}

# equation ID -> op row (derived: an ID belongs to exactly one op)
EQUATION_OPS: dict[str, str] = {}
for _op in _TABLE:
    for _eq in _op.equations:
        if _eq in EQUATION_OPS:
            raise ValueError(f"equations: {_eq!r} is claimed by ops {EQUATION_OPS[_eq]!r} "
                             f"and {_op.name!r}")
        EQUATION_OPS[_eq] = _op.name


def op_of_equation(equation: str) -> str | None:
    """'layernorm.backward.dx' -> 'layernorm'; None for IDs of no op (spec machinery)."""
    return EQUATION_OPS.get(equation)


def op_registrar(registry: dict, kind: str):
    """A decorator factory ``kind("op", ...)`` that appends the decorated function to
    ``registry[op]`` for each op of the table, in registration order (``@invariant`` and
    ``@bespoke`` are two of them); an op not in the table is a ValueError."""

    def decorator(*ops: str):
        unknown = [op for op in ops if op not in OPS]
        if unknown:
            raise ValueError(f"{kind}: {unknown} are not ops of spec.protocol.OPS")

        def register(f):
            for op in ops:
                registry.setdefault(op, []).append(f)
            return f

        return register

    return decorator


def op_of_name(name: str) -> Op | None:
    """The op a protocol name belongs to (the first, for names several ops share)."""
    return next((op for op in _TABLE if name in op.names), None)


def reference_modules() -> dict[str, str]:
    """Alias -> module of ``reference`` that defines protocol names (for the mutation catalog)."""
    return {op.module: f"reference.{op.module}" for op in _TABLE}


# --------------------------------------------------------------------------- subset handling
class NotApplicable(unittest.SkipTest):
    """The implementation lacks a protocol name the check needs, or does not claim a capability
    it uses.  A ``unittest.SkipTest``: Hypothesis re-raises it at once (no shrinking of a
    missing name) and pytest reports it as a skip with its reason."""


def not_applicable_message(label: str, name: str) -> str:
    return f"not applicable: {label} lacks {name}"


class ImplementationExit(Exception):
    """Implementation code raised a BaseException that is not an Exception (``SystemExit``,
    ``KeyboardInterrupt`` not caused by a real Ctrl-C, ``GeneratorExit``): converted to an
    ordinary failure of the check that called it, so that no harness mistakes it for the end of
    the run (``sys.exit(0)`` inside an op must never read as success)."""


class ImplementationHung(Exception):
    """A protocol name that ran past a check's time limit is called again: failed at once."""


# SIGINT seen by this process (install_interrupt_flag): a KeyboardInterrupt from a real Ctrl-C
# still stops the run; one raised by implementation code is a failure like any other.
_SIGINT_SEEN = False


def install_interrupt_flag() -> None:
    """Record real Ctrl-Cs (main thread only; a no-op elsewhere)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGINT)
    if getattr(previous, "_minibert_flag", False):
        return

    def handler(signum, frame):
        global _SIGINT_SEEN
        _SIGINT_SEEN = True
        if callable(previous):
            return previous(signum, frame)
        raise KeyboardInterrupt

    handler._minibert_flag = True
    signal.signal(signal.SIGINT, handler)


def _converted(name: str, e: BaseException) -> BaseException | None:
    """The ImplementationExit for a BaseException raised by implementation code, else None
    (Exceptions, the harness's own outcomes -- pytest.skip, time-outs -- and real Ctrl-Cs)."""
    if isinstance(e, Exception):
        return None
    if isinstance(e, KeyboardInterrupt) and _SIGINT_SEEN:
        return None
    if isinstance(e, (SystemExit, KeyboardInterrupt, GeneratorExit)) or (
            type(e).__name__ == "Exit" and type(e).__module__.startswith("_pytest")):
        return ImplementationExit(f"{name} raised {type(e).__name__}"
                                  + (f"({e})" if str(e) else "") + " inside the implementation")
    return None


DEFAULT_CAPABILITIES = {"attention_bias": True, "key_mask": True, "weight_decay": True,
                        "ranks": {}, "conventions": ()}
# conventions an implementation may declare (CAPABILITIES["conventions"])
CONVENTIONS = frozenset({"lr(0)=0"})
# ops that act on the last axis alone: any rank can be reshaped to one the implementation
# accepts; the names of their forward arguments (in protocol order) that carry the leading axes
RANK_ADAPTABLE = {"linear": ("x",), "layernorm": ("x",), "softmax": ("x", "mask"),
                  "relu": ("x",), "tanh": ("x",), "ffn": ("x",),
                  "cross_entropy": ("logits", "labels"), "mse": ("y_hat", "y"),
                  "linear_cross_entropy": ("x", "labels")}
_FORWARD_ARGS = {"linear": ("x", "W", "b"), "layernorm": ("x", "gamma", "beta", "eps"),
                 "softmax": ("x", "mask"), "relu": ("x",), "tanh": ("x",),
                 "ffn": ("x", "W_1", "b_1", "W_2", "b_2"), "cross_entropy": ("logits", "labels"),
                 "mse": ("y_hat", "y"), "linear_cross_entropy": ("x", "W", "b", "labels")}


def capabilities(impl) -> dict:
    """The implementation's CAPABILITIES (object, else its module) over the defaults."""
    obj = unwrap(impl)
    declared = getattr(obj, "CAPABILITIES", None)
    if declared is None and not inspect.ismodule(obj):
        declared = getattr(inspect.getmodule(type(obj)), "CAPABILITIES", None)
    caps = {**DEFAULT_CAPABILITIES, **(declared or {})}
    unknown = sorted(set(caps) - set(DEFAULT_CAPABILITIES))
    if unknown:
        raise ValueError(f"CAPABILITIES: unknown keys {unknown}; expected some of "
                         f"{sorted(DEFAULT_CAPABILITIES)}")
    unknown = sorted(set(caps["conventions"]) - CONVENTIONS)
    if unknown:
        raise ValueError(f"CAPABILITIES: unknown conventions {unknown}; expected some of "
                         f"{sorted(CONVENTIONS)}")
    return caps


def not_claimed_message(label: str, what: str) -> str:
    return f"not applicable: {label} does not claim {what} (CAPABILITIES)"


class _RankCache:
    """The cache of a rank-adapted forward: the implementation's cache and the shapes to undo."""

    def __init__(self, inner, lead, target):
        self.inner, self.lead, self.target = inner, lead, target


def _target_lead(lead: tuple, ranks) -> tuple | None:
    """Leading shape of rank r-1 for an accepted rank r: pad with 1s or merge leading axes."""
    ranks = sorted(int(r) for r in ranks)
    if len(lead) + 1 in ranks:
        return None
    bigger = [r for r in ranks if r > len(lead) + 1]
    if bigger:
        return (1,) * (bigger[0] - 1 - len(lead)) + lead
    r = ranks[-1]
    if r < 1:
        raise ValueError(f"CAPABILITIES ranks: expected ranks >= 1, got {ranks}")
    keep = lead[len(lead) - (r - 2):] if r >= 2 else ()
    merged = int(np.prod(lead[:len(lead) - len(keep)], dtype=np.int64))
    return ((merged,) + tuple(keep)) if r >= 2 else ()


class ImplProxy:
    """Wraps an implementation; reading a name it lacks calls ``on_missing(message)`` (the
    conftest passes ``pytest.skip``, the checker raises :class:`NotApplicable`), so a missing
    name can never make a check pass silently.

    Every protocol function read through the proxy is wrapped: its name is recorded when it is
    called (:meth:`calls`, so a verdict credits only the ops a test actually ran), a
    ``SystemExit``/``KeyboardInterrupt`` it raises becomes :class:`ImplementationExit`, and
    the implementation's CAPABILITIES are applied (unclaimed biases, masks, weight decay are
    not applicable; ranks are adapted)."""

    def __init__(self, obj, label: str, on_missing: Callable[[str], object] | None = None):
        object.__setattr__(self, "_impl_obj", obj)
        object.__setattr__(self, "_impl_label", label)
        object.__setattr__(self, "_impl_on_missing", on_missing or _raise_not_applicable)
        object.__setattr__(self, "_impl_called", {})  # ordered set of names called
        object.__setattr__(self, "_impl_active", [])  # the protocol names executing now
        object.__setattr__(self, "_impl_hung", {})  # name -> the check it did not return in
        # the names executing when a harness interrupt (a time limit) went through them
        object.__setattr__(self, "_impl_interrupted", [])
        object.__setattr__(self, "_impl_wrapped", {})
        object.__setattr__(self, "_impl_caps", capabilities(obj))

    def __getattr__(self, name: str):
        obj = object.__getattribute__(self, "_impl_obj")
        try:
            value = resolve(obj, name)
        except AttributeError:
            # Probes by Python, pytest or Hypothesis (e.g. hypothesis_internal_is_this_a_mock_check)
            # are not protocol names: answer them like any object would.
            if name.startswith(("_", "hypothesis_")) or name in _HOST_PROBES:
                raise
        else:
            if name.startswith("_") or not callable(value) or inspect.isclass(value):
                return value
            cache = object.__getattribute__(self, "_impl_wrapped")
            hit = cache.get(name)
            if hit is None or hit[0] is not value:
                hit = cache[name] = (value, self._wrap(name, value))
            return hit[1]
        label = object.__getattribute__(self, "_impl_label")
        object.__getattribute__(self, "_impl_on_missing")(not_applicable_message(label, name))
        raise NotApplicable(not_applicable_message(label, name))  # on_missing returned

    def __repr__(self) -> str:
        return f"<impl {object.__getattribute__(self, '_impl_label')}>"

    # ---------------------------------------------------------------- bookkeeping
    def calls(self) -> list[str]:
        """Protocol names called through the proxy since the last :meth:`reset_calls`."""
        return list(object.__getattribute__(self, "_impl_called"))

    def reset_calls(self) -> None:
        object.__getattribute__(self, "_impl_called").clear()

    def active(self) -> list[str]:
        """The protocol names executing right now, outermost first (a time-out names them)."""
        return list(object.__getattribute__(self, "_impl_active"))

    def mark_hung(self, where: str) -> list[str]:
        """The names executing now did not return within ``where``'s time limit: later calls
        of them fail at once (ImplementationHung) instead of hanging again.  Returns them."""
        active = object.__getattribute__(self, "_impl_active")
        hung = object.__getattribute__(self, "_impl_hung")
        interrupted = object.__getattribute__(self, "_impl_interrupted")
        names = list(interrupted or active)
        interrupted.clear()
        for name in names:
            hung.setdefault(name, where)
        active.clear()
        return names

    def _not_claimed(self, what: str):
        label = object.__getattribute__(self, "_impl_label")
        object.__getattribute__(self, "_impl_on_missing")(not_claimed_message(label, what))
        raise NotApplicable(not_claimed_message(label, what))

    def _wrap(self, name: str, fn):
        called = object.__getattribute__(self, "_impl_called")
        caps = object.__getattribute__(self, "_impl_caps")
        op = op_of_name(name)
        adapt = None
        if op is not None and name.endswith(("_forward", "_backward")):
            adapt = self._adapter(op.name, name, caps)
        elif name == "adam_step" and not caps["weight_decay"]:
            def adapt(args, kwargs):
                if kwargs.get("weight_decay"):
                    self._not_claimed("weight_decay (AdamW)")
                kwargs = {k: v for k, v in kwargs.items()
                          if k not in ("weight_decay", "no_decay")}
                return args, kwargs, None

        active = object.__getattribute__(self, "_impl_active")
        hung = object.__getattribute__(self, "_impl_hung")
        interrupted = object.__getattribute__(self, "_impl_interrupted")

        @functools.wraps(fn)
        def call(*args, **kwargs):
            called[name] = None
            if name in hung:
                raise ImplementationHung(f"{name} did not return within the time limit in "
                                         f"{hung[name]}: not called again")
            if adapt is not None:
                args, kwargs, post = adapt(args, kwargs)
            else:
                post = None
            active.append(name)
            try:
                out = fn(*args, **kwargs)
            except BaseException as e:
                converted = _converted(name, e)
                if converted is not None:
                    raise converted from e
                if not isinstance(e, Exception) and not interrupted:
                    interrupted.extend(active)  # a time limit: where it found the code
                raise
            finally:
                if active and active[-1] == name:
                    active.pop()
            return post(out) if post is not None else out

        return call

    def _adapter(self, op: str, name: str, caps: dict):
        """(args, kwargs) -> (args, kwargs, post) applying CAPABILITIES to one op function."""
        checks = []
        if op in ("attention", "block") and name.endswith("_forward"):
            if not caps["attention_bias"]:
                def no_bias(args, kwargs):
                    biases = (list(args[5:9]) + [kwargs.get(b) for b in ("b_q", "b_k", "b_v",
                                                                        "b_o")]
                              if op == "attention" else
                              [v for k, v in dict(args[1] if len(args) > 1 else
                                                  kwargs.get("p", {})).items()
                               if k.startswith("attn.b_")])
                    if any(b is not None for b in biases):
                        self._not_claimed("attention_bias (an attention with biases)")
                checks.append(no_bias)
            if not caps["key_mask"]:
                def no_mask(args, kwargs):
                    if kwargs.get("mask") is not None:
                        self._not_claimed("key_mask (a masked attention)")
                checks.append(no_mask)
        if op == "softmax" and name.endswith("_forward") and not caps["key_mask"]:
            def no_softmax_mask(args, kwargs):
                if (args[1] if len(args) > 1 else kwargs.get("mask")) is not None:
                    self._not_claimed("key_mask (a masked softmax)")
            checks.append(no_softmax_mask)
        ranks = caps["ranks"].get(op)
        rank_fwd = ranks and op in RANK_ADAPTABLE and name.endswith("_forward")
        rank_bwd = ranks and op in RANK_ADAPTABLE and name.endswith("_backward")
        if not (checks or rank_fwd or rank_bwd):
            return None

        def adapt(args, kwargs):
            for check in checks:
                check(args, kwargs)
            if rank_fwd:
                return self._rank_forward(op, ranks, args, kwargs)
            if rank_bwd and len(args) >= 2 and isinstance(args[1], _RankCache):
                return self._rank_backward(op, args, kwargs)
            return args, kwargs, None

        return adapt

    @staticmethod
    def _rank_forward(op, ranks, args, kwargs):
        names = _FORWARD_ARGS[op]
        bound = dict(zip(names, args))
        primary = bound.get(names[0], kwargs.get(names[0]))
        lead = tuple(np.shape(primary)[:-1])
        target = _target_lead(lead, ranks)
        if target is None:
            return args, kwargs, None

        def reshape(a):
            if isinstance(a, np.ndarray) and a.shape[:len(lead)] == lead:
                return a.reshape(target + a.shape[len(lead):])
            return a

        ranked = RANK_ADAPTABLE[op]
        args = tuple(reshape(a) if n in ranked else a for n, a in zip(names, args)) + args[
            len(names):]
        kwargs = {k: reshape(v) if k in ranked else v for k, v in kwargs.items()}

        def post(result):
            out, cache = result
            if np.ndim(out) > 0:
                out = np.asarray(out)
                out = out.reshape(lead + out.shape[len(target):])
            return out, _RankCache(cache, lead, target)

        return args, kwargs, post

    @staticmethod
    def _rank_backward(op, args, kwargs):
        dout, rc = args[0], args[1]
        if isinstance(dout, np.ndarray) and dout.ndim > 0:
            dout = dout.reshape(rc.target + dout.shape[len(rc.lead):])
        ranked = RANK_ADAPTABLE[op]
        inputs = OPS[op].inputs

        def post(grads):
            return tuple(g.reshape(rc.lead + g.shape[len(rc.target):])
                         if isinstance(g, np.ndarray) and i < len(inputs)
                         and inputs[i] in ranked else g for i, g in enumerate(grads))

        return (dout, rc.inner, *args[2:]), kwargs, post


SUBNAMESPACES = ("optim",)
# Hypothesis looks these up on a test's first argument (its executor hooks).
_HOST_PROBES = frozenset({"execute_example", "setup_example", "teardown_example"})


def resolve(obj, name: str):
    """``obj.<name>``, else ``obj.optim.<name>`` (a package may keep its optimizer in a
    submodule): raises AttributeError when neither exists."""
    try:
        return getattr(obj, name)
    except AttributeError:
        pass
    if not name.startswith("_"):
        for sub in SUBNAMESPACES:
            ns = getattr(obj, sub, None)
            if ns is None and inspect.ismodule(obj) and getattr(obj, "__path__", None):
                try:  # a package's submodule that nothing imported yet
                    ns = importlib.import_module(f"{obj.__name__}.{sub}")
                except ImportError:
                    ns = None
            if ns is not None and hasattr(ns, name):
                return getattr(ns, name)
    raise AttributeError(f"{label_of(obj)} has no attribute {name!r}")


def _has(obj, name: str) -> bool:
    try:
        resolve(obj, name)
        return True
    except AttributeError:
        return False


def _raise_not_applicable(message: str):
    raise NotApplicable(message)


class ImplLoadError(Exception):
    """The implementation could not be loaded; the message is one line."""


def load_impl(spec: str):
    """'pkg.mod' -> the module; 'pkg.mod:obj' -> attribute obj of it (dotted paths allowed).

    Any failure -- a missing module, a module raising (even ``SystemExit``) on import, a
    missing attribute -- raises :class:`ImplLoadError` with a one-line reason."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not all(p.isidentifier() for p in module_name.split(".")):
        raise ImplLoadError(f"impl: expected package.module[:object], got {spec!r}")
    try:
        obj = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise ImplLoadError(f"impl: cannot import {module_name!r}: {e}") from None
    except BaseException as e:  # noqa: BLE001 -- a module raising on import is a load failure
        if isinstance(e, KeyboardInterrupt) and _SIGINT_SEEN:
            raise
        where = ""
        tb = e.__traceback__
        while tb is not None:
            where = f" ({tb.tb_frame.f_code.co_filename}:{tb.tb_lineno})"
            tb = tb.tb_next
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ImplLoadError(f"impl: importing {module_name!r} raised {type(e).__name__}"
                            + (f": {msg}" if msg else "") + where) from None
    for part in filter(None, attr.split(".")):
        try:
            obj = getattr(obj, part)
        except BaseException as e:  # noqa: BLE001
            if isinstance(e, KeyboardInterrupt) and _SIGINT_SEEN:
                raise
            raise ImplLoadError(f"impl: {spec!r}: cannot read {part!r}: "
                                f"{type(e).__name__}: {e}") from None
    return obj


def unwrap(impl):
    """The object behind an :class:`ImplProxy` (or ``impl`` itself)."""
    return impl._impl_obj if isinstance(impl, ImplProxy) else impl


def provides(impl, *names: str) -> bool:
    """True when the implementation has every one of ``names`` (never skips)."""
    obj = unwrap(impl)
    return all(_has(obj, n) for n in names)


def label_of(impl) -> str:
    if isinstance(impl, ImplProxy):
        return impl._impl_label
    return getattr(impl, "__name__", type(impl).__name__)


