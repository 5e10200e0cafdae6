"""The op table: every row of the protocol -- its protocol names, differentiable inputs, equation
IDs, parameter names, the ``reference`` module that defines it, a fixed-seed example and its
contract in words -- and the lookups derived from it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from reference.ops import ATTENTION_PARAMS, FFN_PARAMS, IGNORE_INDEX, block_param_names
from spec.tolerances import KINK_MARGIN


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
    # the contract in words (README's protocol table and ``minibert adapter`` print it): the
    # forward's signature and output, and what the backward returns when it is not one
    # gradient per entry of ``inputs``
    doc: str = field(default="", compare=False)
    backward_doc: str = field(default="", compare=False)

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


    def returns(self) -> str:
        """What the backward returns, in words (generated from ``inputs`` unless the row says
        otherwise)."""
        if self.backward_doc:
            return self.backward_doc
        if self.pair is None:
            return ""
        return "(" + ", ".join(f"d{n}" for n in self.inputs) + ("," if len(self.inputs) == 1
                                                                 else "") + ")"


def _pair(stem: str) -> tuple[str, str]:
    return (f"{stem}_forward", f"{stem}_backward")


# --------------------------------------------------------------------------- fixed-seed inputs
# Small float64 inputs for the suite's fixed-seed FD checks (spec/suite/checks/examples.py);
# the op's identities get the same inputs (spec/numerics/identities.py).
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
    "attention.backward.dx", "attention.causal")


# The contract of each row, in words.  One place: the README's protocol table is generated from
# these (``python -m spec.protocol --markdown``; tests/test_protocol_doc.py fails when the README
# is stale).
_DOCS = {
    "embedding": ("embedding_forward(ids [B,T] int, W [V,H]) -> W[ids] [B,T,H]", ""),
    "position_embedding": ("position_embedding_forward(x [B,T,H], W_pos [T_max,H]) -> "
                           "x + W_pos[:T]", ""),
    "sinusoidal_position": ("sinusoidal_encoding(T, d, dtype) -> PE [T,d] (sin on even "
                            "features, cos on odd); sinusoidal_position_forward(x [B,T,H]) -> "
                            "x + PE", ""),
    "linear": ("linear_forward(x [...,n], W [n,m], b [m] or None) -> x W + b [...,m]", ""),
    "layernorm": ("layernorm_forward(x [...,N], gamma [N], beta [N], eps=1e-12) -> "
                  "gamma * x_hat + beta (biased variance); variants: gamma = beta = None "
                  "(no affine map), eps = 0", ""),
    "softmax": ("softmax_forward(x [...,n], mask=None) -> softmax over the last axis; mask "
                "(bool, x's shape) keeps True entries", ""),
    "softmax_jacobian": ("softmax_jacobian(p [...,n]) -> J [...,n,n], J = diag(p) - p p^T", ""),
    "relu": ("relu_forward(x) -> max(x, 0)", ""),
    "tanh": ("tanh_forward(x) -> tanh(x)", ""),
    "heads": ("split_heads(x [B,T,H], n_heads) -> [B,A,T,d_k]; merge_heads is its inverse", ""),
    "attention": ("attention_forward(x [B,T,H], W_q, W_k, W_v, W_o [H,H], b_q, b_k, b_v, b_o "
                  "[H] or None, *, n_heads, mask=None) -> multi-head self-attention [B,T,H]; "
                  "mask [B,T] marks the keys that may be attended; variants: causal=True, "
                  "W_o = b_o = None (no output projection), per-head weights [A,H,d_k]", ""),
    "ffn": ("ffn_forward(x, W_1 [H,I], b_1 [I], W_2 [I,H], b_2 [H]) -> "
            "ReLU(x W_1 + b_1) W_2 + b_2; variant: b_2 = None", ""),
    "block": ("block_forward(x [B,T,H], p, *, n_heads, mask=None, eps=1e-12) -> post-LN block "
              "LN2(h + FFN(h)), h = LN1(x + MHA(x)); p is a dict keyed attn.W_q .. attn.b_o, "
              "ln1.gamma, ln1.beta, ffn.W_1 .. ffn.b_2, ln2.gamma, ln2.beta; variants: "
              'norm="pre" (h + FFN(LN2(h)), h = x + MHA(LN1(x))), norm="pre_final" (then '
              "LN_f, keys ln_f.gamma, ln_f.beta), causal=True",
              "(dx, grads) with grads keyed like p"),
    "pooler": ("pooler_forward(h [B,T,H], W [H,H], b [H]) -> tanh(h[:, 0] W + b) [B,H]", ""),
    "gelu": ('gelu_forward(x, approximate="none"|"tanh") -> x Phi(x) (erf) or its tanh '
             "approximation (Hugging Face gelu_new)", ""),
    "token_type": ("token_type_embedding_forward(x [B,T,H], type_ids [B,T] int, "
                   "W_type [n_types,H]) -> x + W_type[type_ids]", ""),
    "embedding_ln": ("embedding_ln_forward(ids, type_ids, W_word [V,H], W_pos [T_max,H], "
                     "W_type [n_types,H], gamma, beta, eps=1e-12) -> "
                     "LN(W_word[ids] + W_pos[:T] + W_type[type_ids])", ""),
    "mlm_head": ("mlm_head_forward(h [...,H], W_t [H,H], b_t, gamma, beta, W_word [V,H], "
                 'b_dec [V], *, eps=1e-12, activation="gelu") -> '
                 "LN(act(h W_t + b_t)) W_word^T + b_dec (the decoder tied to the word "
                 "embeddings)", "(dh, dW_t, db_t, dgamma, dbeta, dW_word, db_dec), dW_word the "
                 "decoder's share only"),
    "classifier": ("classifier_forward(h [B,T,H], W_p [H,H], b_p, W_c [H,C], b_c [C]) -> "
                   "tanh(h[:, 0] W_p + b_p) W_c + b_c [B,C]", ""),
    "cross_entropy": ("cross_entropy_forward(logits [...,V], labels [...], *, "
                      'ignore_index=-100, reduction="mean"|"sum") -> scalar ("mean" divides by '
                      "the positions whose label is not ignore_index); variants: without "
                      'ignore_index (predicted rows only), input="probabilities" (softmax '
                      'output in, dL/dp out) or "probabilities_dlogits" (dL/dlogits out)',
                      "(dlogits,) from a scalar dloss"),
    "mse": ("mse_forward(y_hat, y) -> scalar sum((y_hat - y)^2) / y.size",
            "(dy_hat, dy) from a scalar dloss"),
    "linear_cross_entropy": ("linear_cross_entropy_forward(x [...,n], W [n,V], b [V] or None, "
                             "labels [...], *, ignore_index=-100, reduction) -> "
                             "cross_entropy(x W + b, labels) (the Mini-BERT head fused with its "
                             "loss)", "(dx, dW, db) from a scalar dloss"),
    "model": ("param_shapes(config), init_params(config, seed, dtype), embed(params, config, "
              "input_ids), forward(params, config, input_ids, attention_mask, *, "
              "token_type_ids, inputs_embeds) -> (out, cache), backward(dout, cache, "
              "d_pooled=None) -> (grads, d_embeddings), loss(...), loss_and_grads(...) -> "
              "(loss, grads, d_embeddings); params a flat dict of dotted names", ""),
    "adam": ("adam_init(params) -> state {step, m, v}; adam_step(params, grads, state, *, lr, "
             "beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, no_decay) -> (params, state), "
             "pure, bias-corrected, decoupled decay", ""),
    "schedule": ("warmup_linear_lr(step, *, peak_lr, warmup_steps, total_steps) -> lr of the "
                 "0-based step (linear warmup to the peak, then linear decay to 0)", ""),
    "clip": ("global_grad_norm(grads) -> float; clip_by_global_norm(grads, max_norm, *, eps=0) "
             "-> (grads scaled by one factor when the norm exceeds max_norm, the norm before)",
             ""),
    "accumulation": ("accumulate_gradients(impl, params, config, micro_batches) -> (loss, "
                     "grads): the full batch's mean loss and gradient (needs init_params and "
                     "loss_and_grads)", ""),
}

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
                                            "residual.backward", "block.backward",
                                            "block.preln", "block.preln_backward"),
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
       ("loss.ce.mean", "loss.ce.sum", "loss.ce.backward.mean", "loss.ce.backward.sum",
        "loss.ce.probs", "loss.ce.probs_dp", "loss.ce.probs_dlogits"),
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

_undocumented = sorted({op.name for op in _TABLE} ^ set(_DOCS))
if _undocumented:
    raise ValueError(f"spec/protocol/table.py: rows and _DOCS differ: {_undocumented}")
_TABLE = tuple(replace(op, doc=_DOCS[op.name][0], backward_doc=_DOCS[op.name][1])
               for op in _TABLE)
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



def protocol_markdown() -> str:
    """The op table as a Markdown table (README "Check your implementation")."""
    rows = ["| op | what to provide | backward returns |", "|---|---|---|"]
    for op in _TABLE:
        doc = op.doc.replace("|", "\\|")
        rows.append(f"| `{op.name}` | {doc} | {op.returns().replace('|', '/')} |")
    return "\n".join(rows)

