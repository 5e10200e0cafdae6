"""The op table: every row of the protocol -- its protocol names, differentiable inputs, equation
IDs, parameter names, the ``minibert_reference`` module that defines it and its contract in words --
and the lookups derived from it.  An op's inputs to check come from its case families
(spec/suite/strategies/), not from here.  A built-in op declared in spec/builtin/ brings its own
row (its declaration's ``row``), placed after the row it names in ``after``."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from minibert_reference.ops import ATTENTION_PARAMS, FFN_PARAMS, block_param_names
from minibert_spec.builtin import NOTHING_TO_GUARD, declarations


@dataclass(frozen=True)
class Op:
    """One row of the protocol.

    names:     the protocol names an implementation needs for this op (all, or it is n/a)
    inputs:    the differentiable inputs of the forward, in argument order: the backward returns
               one gradient per entry, in this order (``None`` for an absent optional input)
    equations: the derivation IDs of spec/equations this op realises
    params:    parameter names the op takes (attention weights; every key a block's local dict
               ``p`` may carry, in any of its variants: ``layer()`` maps them one by one)
    module:    the module of ``minibert_reference`` that defines the names
    optional:  protocol names an implementation may add (never needed: the suite falls back to
               ``names`` without them; one it provides is checked against them)
    """

    name: str
    names: tuple[str, ...]
    inputs: tuple[str, ...] = ()
    equations: tuple[str, ...] = ()
    params: tuple[str, ...] = ()
    module: str = "ops"
    optional: tuple[str, ...] = ()
    # why the row has no numerical guard of its own (a guard of guards.py's GUARDS names the rows
    # it changes; every other row says why it needs none, or NOTHING_TO_GUARD)
    unguarded: str = field(default="", compare=False)
    # an op acting on the last axis alone: the forward's arguments carrying the leading axes,
    # which the suite reshapes to a rank the implementation declares (CAPABILITIES["ranks"])
    ranks: tuple[str, ...] = field(default=(), compare=False)
    # the contract in words (the protocol table of docs/check-your-implementation.md and
    # ``minibert adapter`` print it): the
    # forward's signature and output, and what the backward returns when it is not one
    # gradient per entry of ``inputs``
    doc: str = field(default="", compare=False)
    backward_doc: str = field(default="", compare=False)

    # cached (frozen rows, their names fixed): read ~100,000 times per judging run
    @functools.cached_property
    def args(self) -> tuple[str, ...]:
        """The forward's positional arguments, in order (the proxy names a call's arguments by
        them): read from the reference's own signature, their one definition."""
        return forward_args(self.module, self.pair[0]) if self.pair else ()

    @functools.cached_property
    def pair(self) -> tuple[str, str] | None:
        """(forward name, backward name) of an op pair, else None."""
        fwd = next((n for n in self.names if n.endswith("_forward")), None)
        bwd = next((n for n in self.names if n.endswith("_backward")), None)
        return (fwd, bwd) if fwd and bwd else None

    def returns(self) -> str:
        """What the backward returns, in words (generated from ``inputs`` unless the row says
        otherwise)."""
        if self.backward_doc:
            return self.backward_doc
        if self.pair is None:
            return ""
        return "(" + ", ".join(f"d{n}" for n in self.inputs) + ("," if len(self.inputs) == 1
                                                                 else "") + ")"


@functools.cache
def forward_args(module: str, name: str) -> tuple[str, ...]:
    import importlib
    import inspect

    params = inspect.signature(getattr(importlib.import_module(f"minibert_reference.{module}"),
                                       name)).parameters.values()
    return tuple(p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD)


def _pair(stem: str) -> tuple[str, str]:
    return (f"{stem}_forward", f"{stem}_backward")


_ATTENTION_EQUATIONS = (
    "attention.qkv", "attention.scores", "attention.context", "attention.output",
    "attention.backward.dW_o", "attention.backward.dV", "attention.backward.dP",
    "attention.backward.dS", "attention.backward.dQ", "attention.backward.dK",
    "attention.backward.dx", "attention.causal", "attention.noproj", "attention.single_head",
    "attention.per_head")


_HAND_TABLE = (
    # first: the first row of a report, the whole-model verdict that says which rows to read next
    Op("whole_model", ("whole_model_loss_and_grads",), (), (), module="model",
       unguarded="the user's own model: judged as it computes, guards and all",
       doc="whole_model_loss_and_grads(params, batch) -> (loss, grads): any architecture, "
           "declared from the function you have, minibert_spec.suite.whole_model(loss_and_grads"
           "(params, ids, targets, ...) -> (loss, grads), params) or a forward(params, ...) -> "
           "(loss, cache) / backward([dloss,] cache) -> grads pair (minibert check "
           "mymodel:loss_and_grads: the module's params or init_params()); judged by finite "
           "differences of the loss in every parameter tensor, float64 (float32-only code as it "
           "is, above a stated rounding floor), grads keyed, shaped and typed like params",
       backward_doc="grads keyed like params"),
    Op("embedding", _pair("embedding"), ("W",), ("embedding.forward", "embedding.backward"),
       unguarded=NOTHING_TO_GUARD,
       doc="embedding_forward(ids [B,T] int, W [V,H]) -> W[ids] [B,T,H]"),
    Op("position_embedding", _pair("position_embedding"), ("x", "W_pos"),
       ("position.learned.forward", "position.learned.backward"),
       unguarded=NOTHING_TO_GUARD,
       doc="position_embedding_forward(x [B,T,H], W_pos [T_max,H]) -> x + W_pos[:T]"),
    Op("sinusoidal_position", ("sinusoidal_encoding", *_pair("sinusoidal_position")), ("x",),
       ("position.sinusoidal",),
       unguarded=NOTHING_TO_GUARD,
       doc="sinusoidal_encoding(T, d, dtype) -> PE [T,d] (sin on even features, cos on odd); "
           "sinusoidal_position_forward(x [B,T,H]) -> x + PE"),
    Op("linear", _pair("linear"), ("x", "W", "b"),
       ("linear.forward", "linear.backward.dx", "linear.backward.dW", "linear.backward.db"),
       unguarded=NOTHING_TO_GUARD,
       ranks=("x",),
       doc="linear_forward(x [...,n], W [n,m], b [m] or None) -> x W + b [...,m]"),
    Op("layernorm", _pair("layernorm"), ("x", "gamma", "beta"),
       ("layernorm.forward", "layernorm.backward.dx", "layernorm.backward.dgamma",
        "layernorm.backward.dbeta", "layernorm.plain"),
       unguarded="eps inside the square root is its argument (eps = 0 a declared variant)",
       ranks=("x",),
       doc="layernorm_forward(x [...,N], gamma [N], beta [N], eps=1e-12) -> gamma * x_hat + beta "
           "(biased variance); variants: gamma = beta = None (no affine map), eps = 0"),
    Op("softmax", _pair("softmax"), ("x",), ("softmax.forward", "softmax.backward"),
       ranks=("x", "mask"),
       doc="softmax_forward(x [...,n], mask=None) -> softmax over the last axis; mask (bool, x's "
           "shape) keeps True entries"),
    Op("softmax_jacobian", ("softmax_jacobian",), (), ("softmax.jacobian",),
       unguarded=NOTHING_TO_GUARD,
       doc="softmax_jacobian(p [...,n]) -> J [...,n,n], J = diag(p) - p p^T"),
    Op("relu", _pair("relu"), ("x",), ("relu.forward", "relu.backward"),
       unguarded=NOTHING_TO_GUARD,
       ranks=("x",),
       doc="relu_forward(x) -> max(x, 0)"),
    Op("tanh", _pair("tanh"), ("x",), ("tanh.forward", "tanh.backward"),
       unguarded=NOTHING_TO_GUARD,
       ranks=("x",),
       doc="tanh_forward(x) -> tanh(x)"),
    Op("heads", ("split_heads", "merge_heads"), ("x",),
       ("attention.split_heads", "attention.merge_heads"),
       unguarded=NOTHING_TO_GUARD,
       doc="split_heads(x [B,T,H], n_heads) -> [B,A,T,d_k]; merge_heads is its inverse"),
    Op("attention", _pair("attention"), ("x", *ATTENTION_PARAMS), _ATTENTION_EQUATIONS,
       ATTENTION_PARAMS,
       unguarded="divides the scores by sqrt(d_k), a constant >= 1; its softmax's denominator is "
                 ">= 1 after the max shift (a softmax_eps is judged on the softmax row)",
       doc="attention_forward(x [B,T,H], W_q, W_k, W_v, W_o [H,H], b_q, b_k, b_v, b_o [H] or "
           "None, *, n_heads, mask=None) -> multi-head self-attention [B,T,H]; mask [B,T] marks "
           "the keys that may be attended; variants: causal=True, W_o = b_o = None (no output "
           "projection), per-head weights [A,H,d_k]"),
    Op("ffn", _pair("ffn"), ("x", *FFN_PARAMS), ("ffn.forward", "ffn.backward", "ffn.no_b2",
                                                  "relu2.forward", "relu2.backward"),
       FFN_PARAMS,
       unguarded=NOTHING_TO_GUARD,
       ranks=("x",),
       doc="ffn_forward(x, W_1 [H,I], b_1 [I], W_2 [I,H], b_2 [H], activation=\"relu\") -> "
           "act(x W_1 + b_1) W_2 + b_2; variants: b_1 = None, b_2 = None, activation="
           "\"gelu\"|\"gelu_tanh\"|\"relu2\" (squared ReLU)"),
    Op("block", _pair("block"), ("x", "p"), ("block.postln", "residual.forward",
                                            "residual.backward", "block.backward",
                                            "block.preln", "block.preln_backward",
                                            "block.innerln", "block.innerln_backward"),
       tuple(dict.fromkeys(block_param_names(norm="pre_final")
                           + block_param_names(ffn="swiglu", swiglu_bias=True))),
       unguarded="its LayerNorms' eps is its argument; its attention as attention",
       doc="block_forward(x [B,T,H], p, *, n_heads, mask=None, eps=1e-12) -> post-LN block LN2(h "
           "+ FFN(h)), h = LN1(x + MHA(x)); p is a dict keyed attn.W_q .. attn.b_o, ln1.gamma, "
           'ln1.beta, ffn.W_1 .. ffn.b_2, ln2.gamma, ln2.beta; variants: norm="pre" (h + '
           'FFN(LN2(h)), h = x + MHA(LN1(x))), norm="pre_final" (then LN_f, keys ln_f.gamma, '
           'ln_f.beta), norm="inner" (h + LN2(FFN(h)), h = x + LN1(MHA(x))), causal=True, '
           'normalization="rmsnorm" (no *.beta), ffn="swiglu" (LLaMA: keys swiglu.W_1 gate, '
           "swiglu.W_3 up, swiglu.W_2 down in place of ffn.*), and its parts' own "
           "(minibert_reference.ops.block_param_names): no attn.W_o/attn.b_o, no attn.b_*, no "
           "ffn.b_1 / "
           "ffn.b_2, activation=",
       backward_doc="(dx, grads) with grads keyed like p"),
    Op("pooler", _pair("pooler"), ("h", "W", "b"), ("pooler.forward",),
       unguarded=NOTHING_TO_GUARD,
       doc="pooler_forward(h [B,T,H], W [H,H], b [H]) -> tanh(h[:, 0] W + b) [B,H]"),
    Op("gelu", _pair("gelu"), ("x",), ("gelu.forward.erf", "gelu.backward.erf",
                                       "gelu.forward.tanh", "gelu.backward.tanh"),
       unguarded="divides by the constant sqrt(2) (erf) or sqrt(2 / pi) (tanh) only",
       doc='gelu_forward(x, approximate="none"|"tanh") -> x Phi(x) (erf) or its tanh '
           "approximation (Hugging Face gelu_new)"),
    Op("token_type", _pair("token_type_embedding"), ("x", "W_type"),
       ("token_type.forward", "token_type.backward"),
       unguarded=NOTHING_TO_GUARD,
       doc="token_type_embedding_forward(x [B,T,H], type_ids [B,T] int, W_type [n_types,H]) -> x "
           "+ W_type[type_ids]"),
    Op("embedding_ln", _pair("embedding_ln"), ("W_word", "W_pos", "W_type", "gamma", "beta"),
       ("embedding_ln.forward", "embedding_ln.backward"),
       unguarded="its LayerNorm's eps is its argument",
       doc="embedding_ln_forward(ids, type_ids, W_word [V,H], W_pos [T_max,H], W_type "
           "[n_types,H], gamma, beta, eps=1e-12) -> LN(W_word[ids] + W_pos[:T] + "
           "W_type[type_ids])"),
    Op("mlm_head", _pair("mlm_head"), ("h", "W_t", "b_t", "gamma", "beta", "W_word", "b_dec"),
       ("mlm_head.forward", "mlm_head.backward", "mlm_head.decoder"),
       unguarded="its LayerNorm's eps is its argument",
       doc="mlm_head_forward(h [...,H], W_t [H,H], b_t, gamma, beta, W_word [V,H], b_dec [V], *, "
           'eps=1e-12, activation="gelu") -> LN(act(h W_t + b_t)) W_word^T + b_dec (the decoder '
           "tied to the word embeddings)",
       backward_doc="(dh, dW_t, db_t, dgamma, dbeta, dW_word, db_dec), dW_word the decoder's "
                    "share only"),
    Op("classifier", _pair("classifier"), ("h", "W_p", "b_p", "W_c", "b_c"),
       ("classifier.forward", "classifier.backward"),
       unguarded=NOTHING_TO_GUARD,
       doc="classifier_forward(h [B,T,H], W_p [H,H], b_p, W_c [H,C], b_c [C]) -> tanh(h[:, 0] W_p"
           " + b_p) W_c + b_c [B,C]"),
    Op("cross_entropy", _pair("cross_entropy"), ("logits",),
       ("loss.ce.mean", "loss.ce.sum", "loss.ce.backward.mean", "loss.ce.backward.sum",
        "loss.ce.probs", "loss.ce.probs_dp", "loss.ce.probs_dlogits"),
       ranks=("logits", "labels"),
       doc="cross_entropy_forward(logits [...,V], labels [...], *, ignore_index=-100, "
           'reduction="mean"|"sum") -> scalar ("mean" divides by the positions whose label is not'
           " ignore_index); variants: without ignore_index (predicted rows only), "
           'input="probabilities" (softmax output in, dL/dp out) or "probabilities_dlogits" '
           "(dL/dlogits out)",
       backward_doc="(dlogits,) from a scalar dloss"),
    Op("mse", _pair("mse"), ("y_hat", "y"), ("loss.mse", "loss.mse.backward"),
       unguarded="divides by y.size, a count >= 1 (an empty y is refused)",
       ranks=("y_hat", "y"),
       doc="mse_forward(y_hat, y) -> scalar sum((y_hat - y)^2) / y.size",
       backward_doc="(dy_hat, dy) from a scalar dloss"),
    Op("linear_cross_entropy", _pair("linear_cross_entropy"), ("x", "W", "b"),
       ("linear_ce.forward", "linear_ce.backward"),
       ranks=("x", "labels"),
       doc="linear_cross_entropy_forward(x [...,n], W [n,V], b [V] or None, labels [...], *, "
           "ignore_index=-100, reduction) -> cross_entropy(x W + b, labels) (the Mini-BERT head "
           "fused with its loss)",
       backward_doc="(dx, dW, db) from a scalar dloss"),
    Op("model", ("param_shapes", "init_params", "embed", "forward", "backward", "loss",
                 "loss_and_grads"), (), ("mlm_head.tied", "model.backward"), module="model",
       unguarded="its ops' guards (the loss rows', its LayerNorms' eps)",
       doc="param_shapes(config), init_params(config, seed, dtype), embed(params, config, "
           "input_ids), forward(params, config, input_ids, attention_mask, *, token_type_ids, "
           "inputs_embeds) -> (out, cache), backward(dout, cache, d_pooled=None) -> (grads, "
           "d_embeddings), loss(...), loss_and_grads(...) -> (loss, grads, d_embeddings); params "
           "a flat dict of dotted names"),
    Op("decoder", ("decoder_forward", "decoder_backward", "decoder_loss_and_grads"), (),
       ("decoder.forward", "decoder.backward", "decoder.tied", "decoder.causal"),
       module="decoder", optional=("decoder_loss",),
       unguarded="its ops' guards (the next-token loss's, its norms' eps)",
       doc="decoder_forward(params, config, input_ids [B,T]) -> (logits [B,T,V], cache), a causal "
           "decoder of minibert_reference.config.DecoderConfig (presets gpt2(), llama(); the "
           "fields position, final_norm, head_bias compose the ports' forms): token (+ learned "
           "or sinusoidal position) embeddings -> pre-norm causal blocks -> final norm (or none) "
           "-> LM head (tied: logits = h W_E^T; + b with head_bias); "
           "decoder_loss_and_grads(params, config, input_ids, labels=None, *, ignore_index=-100)"
           " -> (loss, grads), next-token cross-entropy (labels default to the "
           "ids, shifted: logits[:, t] predict labels[:, t+1]); params: embeddings.token.W [V,H], "
           "embeddings.position.W [T_max,H] (learned positions, with or without RoPE; RoPE on "
           "q, k by config.rope_convention), layers.{i}.<a pre-norm block's p: attn.W_q.. "
           "[in,out], ln1.*, ffn.* or swiglu.W_1 (gate), W_3 (up), W_2 (down), ln2.*>, "
           "final_ln.gamma (.beta) with the final norm, lm_head.W [V,H] when untied, lm_head.b "
           "[V] with the head's bias (minibert_reference.decoder.param_shapes; "
           "reference/hf/decoder.py maps each to Hugging Face's GPT-2 / LLaMA names); the cache "
           "is the implementation's own (whatever its decoder_backward reads); optional: "
           "decoder_loss(params, config, input_ids, labels=None, *, ignore_index=-100) -> loss, "
           "the same loss without the backward (the finite differences of the loss call it when "
           "present, after checking it against decoder_loss_and_grads' loss)",
       backward_doc="decoder_backward(dlogits, cache) -> grads, keyed like params (a tied table: "
                    "both uses summed)"),
    Op("adam", ("adam_init", "adam_step"), (), ("optim.adam", "optim.adamw"), module="optim",
       doc="adam_init(params) -> state {step, m, v}; adam_step(params, grads, state, *, lr, "
           "beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, no_decay) -> (params, state), "
           "pure, bias-corrected, decoupled decay"),
    Op("schedule", ("warmup_linear_lr",), (), ("schedule.warmup_linear",), module="optim",
       unguarded="divides by warmup_steps and total_steps - warmup_steps, integers >= 1",
       doc="warmup_linear_lr(step, *, peak_lr, warmup_steps, total_steps) -> lr of the 0-based "
           "step (linear warmup to the peak, then linear decay to 0)"),
    Op("clip", ("global_grad_norm", "clip_by_global_norm"), (), ("clip.global_norm",),
       module="optim",
       doc="global_grad_norm(grads) -> float; clip_by_global_norm(grads, max_norm, *, eps=0) -> "
           "(grads scaled by one factor when the norm exceeds max_norm, the norm before)"),
    Op("accumulation", ("accumulate_gradients", "init_params", "loss_and_grads"), (),
       ("accum.grad_mean",), module="accumulation",
       unguarded="the mean over the micro-batches' predicted tokens: the loss rows' mean_eps",
       doc="accumulate_gradients(impl, params, config, micro_batches) -> (loss, grads): the full "
           "batch's mean loss and gradient (needs init_params and loss_and_grads)"),
)


def _with_declared(rows: tuple[Op, ...], decls) -> tuple[Op, ...]:
    """The hand-written rows with the row of each built-in op's declaration (spec/builtin/)
    inserted after the row it names in ``after`` -- a hand row or another declaration's, in
    whichever module order (a declaration is placed once the row it follows is)."""
    out, pending = list(rows), list(decls)
    while pending:
        names = [row.name for row in out]
        ready = [d for d in pending if d.after in names]
        if not ready:
            decl = pending[0]
            raise ValueError(f"spec/builtin/{decl.name}.py: after: {decl.after!r} is not a row "
                             "of the op table")
        for decl in ready:
            out.insert([row.name for row in out].index(decl.after) + 1, Op(**decl.row))
            pending.remove(decl)
    return tuple(out)


_TABLE = _with_declared(_HAND_TABLE, declarations())
_undocumented = [op.name for op in _TABLE if not op.doc]
if _undocumented:
    raise ValueError(f"spec/protocol/table.py: rows without their contract in words: "
                     f"{_undocumented}")
OPS: dict[str, Op] = {op.name: op for op in _TABLE}
# the rows the suite reshapes to a declared rank -> the arguments carrying the leading axes
RANK_ADAPTABLE: dict[str, tuple[str, ...]] = {op.name: op.ranks for op in _TABLE if op.ranks}

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


def op_of_name(name: str) -> Op | None:
    """The op a protocol name belongs to (the first, for names several ops share)."""
    return next((op for op in _TABLE if name in op.names), None)


def reference_modules() -> dict[str, str]:
    """Alias -> module of ``minibert_reference`` that defines protocol names (for the mutation
    catalog)."""
    return {op.module: f"minibert_reference.{op.module}" for op in _TABLE}


def protocol_markdown() -> str:
    """The op table as a Markdown table (docs/check-your-implementation.md)."""
    rows = ["| op | what to provide | backward returns |", "|---|---|---|"]
    for op in _TABLE:
        doc = op.doc.replace("|", "\\|")
        rows.append(f"| `{op.name}` | {doc} | {op.returns().replace('|', '/')} |")
    return "\n".join(rows)

