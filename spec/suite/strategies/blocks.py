"""Case families of the FFN, SwiGLU, the transformer block (every norm placement and
part variant, with its adapter, smoothness filter and backward scale) and the pooler."""

from __future__ import annotations

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from minibert_spec.suite.strategies.attention import (
    _FOLLOW,
    _HEADS,
    ATTENTION_BIASES,
    ATTENTION_WEIGHTS,
    _attention_example_params,
    _example_mask,
    causal_key_masks,
    with_and_without_mask,
)
from minibert_spec.suite.strategies.embeddings import rope_bases
from minibert_spec.suite.strategies.kit import (
    OpCase,
    _seed,
    arrays,
    batch_seq,
    betas,
    cases,
    fixed_examples,
    gammas,
    head_dims,
    key_masks,
    sizes,
    upstream,
    upstream_like,
)
from minibert_spec.suite.strategies.norms import layernorm_eps
from minibert_spec.tolerances import KINK_MARGIN, LN_MIN_VAR


# --------------------------------------------------------------------------- ffn / block
@st.composite
def ffn_params(draw, H: int, I: int) -> dict:
    """W_1 [H, I], b_1 [I] (kept off 0 so a zero input is not at the kink), W_2 [I, H], b_2."""
    return {"W_1": draw(arrays((H, I))), "b_1": draw(arrays((I,), margin=KINK_MARGIN)),
            "W_2": draw(arrays((I, H))), "b_2": draw(arrays((H,)))}


# the FFN activations with a kink at 0, whose pre-activations the families keep KINK_MARGIN
# from it: ReLU's derivative jumps there, squared ReLU's second derivative does (a central
# difference straddling 0 is then O(h) off instead of O(h^2), in every one of its gradients)
KINKED_ACTIVATIONS = ("relu", "relu2")


def relu_preactivation_ok(x: np.ndarray, W_1: np.ndarray, b_1: np.ndarray | None) -> bool:
    """The FFN's ReLU (or squared ReLU) pre-activation x W_1 + b_1 is at least KINK_MARGIN
    from 0 everywhere."""
    return bool(np.min(np.abs(x @ W_1 + (0 if b_1 is None else b_1))) > KINK_MARGIN)


def _ffn_example(rng, b_1: bool = True, b_2: bool = True, activation: str = "relu"):
    for _ in range(100):  # keep every ReLU pre-activation away from the kink
        x, W_1, b_1_ = (rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 8)),
                        0.3 * rng.standard_normal(8))
        if np.min(np.abs(x @ W_1 + (b_1_ if b_1 else 0))) > 100 * KINK_MARGIN:
            break
    inputs = {"x": x, "W_1": W_1, "b_1": b_1_ if b_1 else None,
              "W_2": rng.standard_normal((8, 4)),
              "b_2": 0.3 * rng.standard_normal(4) if b_2 else None}
    fixed = {} if activation == "relu" else {"activation": activation}
    return OpCase(inputs, fixed, upstream_like(rng, (2, 3, 4)))


# squared ReLU's derivation is the ffn row's (it has no op of its own): the family that runs it
# is tagged with it, the others, which run ReLU or GELU, are not (as none is with GELU's)
_NOT_RELU2 = ("relu2.forward", "relu2.backward")


@cases("ffn", needs={"ffn.b_2": True}, resolve=("ffn.b_1", "ffn.activation"), also=("relu",),
       torch="ffn", omit=("ffn.no_b2", *_NOT_RELU2))
@cases("ffn", "nob2", needs={"ffn.b_2": False}, resolve=("ffn.b_1", "ffn.activation"),
       also=("relu",), torch="ffn", omit=_NOT_RELU2)
@cases("ffn", "nobias", needs={"ffn.b_1": False, "ffn.b_2": False},
       resolve=("ffn.activation",), also=("relu",), torch="ffn",
       omit=("ffn.no_b2", *_NOT_RELU2))
# the other activations, each in an FFN of its own: the families above follow the declaration
# to ReLU wherever it is declared, so an FFN that ignored ``activation`` was green (issue 41)
@cases("ffn", "gelu", needs={"ffn.activation": "gelu"}, resolve=("ffn.b_1", "ffn.b_2"),
       torch="ffn", omit=("ffn.no_b2", *_NOT_RELU2))
@cases("ffn", "gelu_tanh", needs={"ffn.activation": "gelu_tanh"},
       resolve=("ffn.b_1", "ffn.b_2"), torch="ffn", omit=("ffn.no_b2", *_NOT_RELU2))
@cases("ffn", "relu2", needs={"ffn.activation": "relu2"}, resolve=("ffn.b_1", "ffn.b_2"),
       torch="ffn", omit=("ffn.no_b2",))
@fixed_examples(_ffn_example)
@st.composite
def ffn_cases(draw, b_1: bool = True, b_2: bool = True, activation: str = "relu") -> OpCase:
    """``b_1``/``b_2`` False: the FFN without that bias (None); ``activation`` as the
    implementation declares it (passed when not ReLU)."""
    B, T = draw(batch_seq())
    H, I = draw(sizes(1, 4)), draw(sizes(1, 5))
    inputs = {"x": draw(arrays((B, T, H))), **draw(ffn_params(H, I))}
    if not b_1:
        inputs["b_1"] = None
    if not b_2:
        inputs["b_2"] = None
    if activation in KINKED_ACTIVATIONS:
        assume(relu_preactivation_ok(inputs["x"], inputs["W_1"], inputs["b_1"]))
    fixed = {} if activation == "relu" else {"activation": activation}
    return OpCase(inputs, fixed, draw(upstream((B, T, H))), draw(_seed()))


def _block_weights(seed: int, H: int, I: int, names: tuple) -> dict:
    """A block's attention and FFN weights (those of ``names``) from one drawn seed, bounded as
    the attention and FFN families draw them element by element (|W_q..| <= 1, |W_1..| <= 2,
    b_1 off ReLU's kink): drawing the ~15 tensors of a block element by element was most of
    the time of its oracle checks, and a block's failure is localised by its ops' own
    families, not by shrinking its weights."""
    rng = np.random.default_rng(seed)
    p = {n: rng.uniform(-1.0, 1.0, (H, H)) for n in ATTENTION_WEIGHTS}
    if "attn.b_q" in names:
        p.update({n: rng.uniform(-1.0, 1.0, H) for n in ATTENTION_BIASES})
    p = {f"attn.{k}": v for k, v in p.items()}
    p.update({"ffn.W_1": rng.uniform(-2.0, 2.0, (H, I)),
              "ffn.b_1": rng.choice([-1.0, 1.0], I) * rng.uniform(2 * KINK_MARGIN, 2.0, I),
              "ffn.W_2": rng.uniform(-2.0, 2.0, (I, H)), "ffn.b_2": rng.uniform(-2.0, 2.0, H)})
    if "swiglu.W_1" in names:  # drawn after the FFN's: an FFN block's weights stay as they were
        # bounded as the SwiGLU families draw them (|W| <= 1.5); SiLU has no kink to keep off
        p.update({f"swiglu.{n}": rng.uniform(-1.5, 1.5, shape) for n, shape in
                  (("W_1", (H, I)), ("W_2", (I, H)), ("W_3", (H, I)))})
    return {n: p[n] for n in names if n in p}


def block_variant(bias: bool = True, norm: str = "post", W_o: bool = True, b_1: bool = True,
                  b_2: bool = True, normalization: str = "layernorm", affine: bool = True,
                  ffn: str = "mlp") -> dict:
    """The keywords of minibert_reference.ops.block_param_names (the one definition of a block's
    names) for a block family's variant parameters (``affine``: layernorm.affine's; ``ffn``
    "swiglu": LLaMA's bias-free SwiGLU, swiglu.W_1, W_2, W_3)."""
    return dict(attn_bias=bias, norm=norm, W_o=W_o, b_1=b_1, b_2=b_2,
                normalization=normalization, ln_affine=affine, ffn=ffn)


def block_adapter(impl):
    """block_forward(x, p, ...) with p a dict -> forward(x, **p) and a tuple backward."""

    def forward(x, *, n_heads, mask=None, eps=1e-12, **p):
        variant = {k: p.pop(k) for k in BLOCK_KEYWORDS if k in p}
        out, cache = impl.block_forward(x, p, n_heads=n_heads, mask=mask, eps=eps, **variant)
        return out, (cache, tuple(p))

    def backward(dout, cache):
        cache, names = cache
        dx, grads = impl.block_backward(dout, cache)
        if set(grads) != set(names):
            raise AssertionError(f"block_backward: grads keys {sorted(grads)} != params "
                                 f"{sorted(names)}")
        return (dx, *(grads[n] for n in names))

    return forward, backward


# the keywords a block's variant passes to block_forward (its own options' and its parts'),
# each only when not the standard form
BLOCK_STANDARD = {"norm": "post", "causal": False, "activation": "relu",
                  "normalization": "layernorm", "rope": None, "rope_base": 10000.0,
                  "ffn": "mlp"}
BLOCK_KEYWORDS = tuple(BLOCK_STANDARD)


def block_conditioning(x, p: dict, *, n_heads: int, mask=None, causal=False, norm="post",
                       eps=1e-12, activation="relu", normalization="layernorm", rope=None,
                       rope_base=10000.0, ffn="mlp") -> tuple[float, float]:
    """(smallest row variance of a LayerNorm input -- the mean square of an RMSNorm input --,
    smallest |ReLU or squared ReLU pre-activation|, inf for a smooth activation or SwiGLU)
    through one block, computed with the protocol's reference ops (float64): where the block is
    smooth."""
    from minibert_reference import ops  # the one definition of each op (a filter, not a judgement)

    attn = [p.get(f"attn.{n}") for n in ATTENTION_WEIGHTS + ATTENTION_BIASES]
    ffn_kind, ffn = ffn, [p.get(f"ffn.{n}") for n in ("W_1", "b_1", "W_2", "b_2")]
    variances, kinks = [], []

    def ln(v, name):
        centred = v if normalization == "rmsnorm" else v - v.mean(axis=-1, keepdims=True)
        variances.append(float(np.min((centred * centred).mean(axis=-1))))
        return ops._norm_forward(v, p, name, eps, normalization)[0]

    def ffn_of(v):
        if ffn_kind == "swiglu":  # SiLU is smooth: no kink to keep off
            kinks.append(np.inf)
            return ops._mlp_forward(v, p, activation, ffn_kind)[0]
        pre = v @ ffn[0] + (0 if ffn[1] is None else ffn[1])
        kinks.append(float(np.min(np.abs(pre))) if activation in KINKED_ACTIVATIONS
                     else np.inf)
        return ops._ffn_forward(v, *ffn, activation)[0]

    def mha(v):
        return ops._attention_forward(v, *attn, n_heads=n_heads, mask=mask, causal=causal,
                                      rope=rope, rope_base=rope_base)[0]

    if norm == "post":
        h = ln(x + mha(x), "ln1")
        ln(h + ffn_of(h), "ln2")
    elif norm == "inner":
        h = x + ln(mha(x), "ln1")
        ln(ffn_of(h), "ln2")
    else:
        h = x + mha(ln(x, "ln1"))
        out = h + ffn_of(ln(h, "ln2"))
        if norm == "pre_final":
            ln(out, "ln_f")
    return min(variances), min(kinks)


def _case_conditioning(case: OpCase) -> tuple[float, float]:
    """block_conditioning of a block family's case (its inputs and fixed arguments)."""
    p, f = case.inputs, case.fixed
    mask = None if f["mask"] is None else np.asarray(f["mask"], bool)
    return block_conditioning(p["x"], p, n_heads=f["n_heads"], mask=mask, eps=f["eps"],
                              **{k: f[k] for k in BLOCK_KEYWORDS if k in f})


def block_smooth(case: OpCase) -> bool:
    """Every normalisation input has row variance (RMSNorm: mean square) >= LN_MIN_VAR and the
    FFN's ReLU pre-activation is >= KINK_MARGIN from 0 (computed with the protocol's reference
    ops: the filter never calls the implementation in a form it does not declare)."""
    var, kink = _case_conditioning(case)
    return var >= LN_MIN_VAR and kink > KINK_MARGIN


def block_backward_scale(case: OpCase) -> float:
    """The magnitude of the terms a block's backward sums inside its normalisations (the
    family's ``backward_scale``; the LayerNorm families' rule, minibert_spec.tolerances.
    layernorm_backward_scale, applied to the block): each normalisation's dx sums terms of
    |gamma dy| / sigma, sigma the smallest row deviation (RMSNorm: root mean square) of the
    normalisation inputs, from block_conditioning (the protocol's reference ops in float64: a
    filter's computation, never a judgement), and dy bounded by the upstream gradient for the
    last normalisation and, for the one before it, by the last one's terms (its dy is what the
    last one's backward returned): the two factors 2 |gamma| / sigma in series.
    Float32 rounds those terms and every gradient upstream of a normalisation carries that
    rounding: without it the float32-vs-float64 invariant was red on the reference's own
    blocks (3 of 4 seeds at 100 examples, up to 7e-3 relative on dx)."""
    return float(np.abs(case.dout).max()) * block_norm_amplification(case)


def block_norm_amplification(case: OpCase) -> float:
    """How much a block's two normalisations in series can amplify a perturbation of the first
    one's input (block_backward_scale's rule, which applies it to dout): one normalisation
    multiplies it by up to 2 |gamma| / sigma (sigma the smallest row deviation -- RMSNorm: root
    mean square -- of the normalisation inputs, from block_conditioning in float64), the one
    after it by the same factor again where it exceeds 1.  The float32 invariant at a large
    mean (minibert_spec.suite.checks.invariants) scales its floor by it: float32 rounding of
    a large constant, added before the first normalisation, reaches the output so amplified."""
    var, _ = _case_conditioning(case)
    # LayerNorms without affine (no *.gamma): gamma = 1
    gamma = max((float(np.abs(v).max()) for k, v in case.inputs.items()
                 if k.endswith(".gamma")), default=1.0)
    # one normalisation's amplification
    factor = 2.0 * gamma / float(np.sqrt(var + case.fixed["eps"]))
    return factor * max(1.0, factor)


def _block_fixed(n_heads: int, mask, eps: float, **variant) -> dict:
    """A block case's fixed arguments: each keyword of the variant only when it is not the
    standard form (an implementation with one form is called without it)."""
    return {"n_heads": n_heads, "mask": mask, "eps": eps,
            **{k: v for k, v in variant.items() if v != BLOCK_STANDARD[k]}}


def _block_example(rng, bias: bool, masked: bool, norm: str = "post", causal: bool = False,
                   W_o: bool = True, b_1: bool = True, b_2: bool = True,
                   activation: str = "relu", normalization: str = "layernorm",
                   heads: str = "fused", rope: str | None = None, affine: bool = True,
                   ffn: str = "mlp"):
    from minibert_reference.ops import block_param_names

    H, I = (8 if rope else 6), 12  # with RoPE, d_k even in both head layouts
    a = _attention_example_params(rng, H, bias=True)
    p = {f"attn.{k}": v for k, v in a.items() if k != "x"}
    p["ln1.gamma"], p["ln1.beta"] = 1 + 0.4 * rng.standard_normal(H), 0.2 * rng.standard_normal(H)
    p["ffn.W_1"], p["ffn.b_1"] = 0.5 * rng.standard_normal((H, I)), 0.2 * rng.standard_normal(I)
    p["ffn.W_2"], p["ffn.b_2"] = 0.5 * rng.standard_normal((I, H)), 0.2 * rng.standard_normal(H)
    p["ln2.gamma"], p["ln2.beta"] = 1 + 0.4 * rng.standard_normal(H), 0.2 * rng.standard_normal(H)
    p["ln_f.gamma"], p["ln_f.beta"] = 1 + 0.4 * rng.standard_normal(H), 0.2 * rng.standard_normal(H)
    if ffn == "swiglu":  # after the others: an FFN block's example stays as it was
        p.update({f"swiglu.{n}": 0.5 * rng.standard_normal(shape) for n, shape in
                  (("W_1", (H, I)), ("W_2", (I, H)), ("W_3", (H, I)))})
    names = block_param_names(**block_variant(bias, norm, W_o, b_1, b_2, normalization, affine,
                                              ffn))
    inputs = {"x": a["x"], **{n: p[n] for n in names}}
    fixed = _block_fixed(1 if heads == "single" else 2, _example_mask(3) if masked else None,
                         1e-12, norm=norm, causal=causal, activation=activation,
                         normalization=normalization, rope=rope,
                         rope_base=100.0 if rope else 10000.0, ffn=ffn)
    return OpCase(inputs, fixed, upstream_like(rng, (2, 4, H)))


_BLOCK = dict(
    adapter=block_adapter, smooth=block_smooth, torch="block_flat",
    backward_scale=block_backward_scale,
    # a LayerNorm over 2 features maps every row to gamma * (+-1, -+1) + beta: its Jacobian is 0
    # (up to eps), so every gradient upstream of it is a pure cancellation, ~0 in float64 and
    # rounding noise of O(u * terms) in float32
    f32_ok=lambda case: case.inputs["x"].shape[-1] >= 3,
    elementwise_max=0, n_dirs=2)  # ~20 tensors through a whole block: directional only
_INNER = ("block.innerln", "block.innerln_backward")  # the x + LN(f(x)) block's IDs
_POST = ("block.preln", "block.preln_backward") + _INNER  # not exercised by a post-LN family
_PRE = ("block.postln", "block.backward") + _INNER  # not exercised by a pre-LN family
# the options of a block's parts (and its own normalisation) that every block family takes as
# the implementation declares them: a block is checked as the variants its parts declare (one
# head for a single-head attention)
_PARTS = ("attention.W_o", "ffn.b_1", "ffn.b_2", "ffn.activation", "block.normalization",
          "layernorm.affine", "block.ffn") \
    + _HEADS


def _block_needs(bias: bool, masked: bool) -> dict:
    return {"block.norm": "post", "block.causal": False,
            **({"attention_bias": True} if bias else {}), **({"key_mask": True} if masked else {})}


def _but(*keys: str) -> tuple[str, ...]:
    """The block's followed options except those a family fixes."""
    return tuple(k for k in ("block.norm", "block.causal") + _PARTS if k not in keys) + _FOLLOW



@cases("block", "nobias", bias=False, masked=False, omit=_POST,
       needs=_block_needs(False, False), resolve=_PARTS, **_BLOCK)
@cases("block", "nobias_mask", bias=False, masked=True, omit=_POST,
       needs=_block_needs(False, True), resolve=_PARTS, **_BLOCK)
@cases("block", "bias", bias=True, masked=False, omit=_POST, needs=_block_needs(True, False),
       resolve=_PARTS, **_BLOCK)
@cases("block", "bias_mask", bias=True, masked=True, omit=_POST,
       needs=_block_needs(True, True), resolve=_PARTS, **_BLOCK)
@with_and_without_mask("block", "preln", omit=_PRE, needs={"block.norm": "pre"},
                       resolve=_but("block.norm"), **_BLOCK)
@with_and_without_mask("block", "preln_final", omit=_PRE, needs={"block.norm": "pre_final"},
                       resolve=_but("block.norm"), **_BLOCK)
@with_and_without_mask("block", "innerln", omit=_PRE[:2] + _POST[:2],
                       needs={"block.norm": "inner"},
                       resolve=_but("block.norm"), **_BLOCK)
@with_and_without_mask("block", "causal", omit=_POST, needs={"block.causal": True},
                       resolve=_but("block.causal"), **_BLOCK)
# the parts' own variants, each checked inside a block: no W_o and no FFN biases (bias-free
# linears); GPT-2's block (causal, pre-LN with its final LN, gelu_new); RMSNorm's
@with_and_without_mask("block", "lean", omit=_POST,
                       needs={"attention.W_o": False, "ffn.b_1": False, "ffn.b_2": False},
                       resolve=_but("attention.W_o", "ffn.b_1", "ffn.b_2"), **_BLOCK)
# LayerNorms without gamma and beta (layernorm.affine False) inside the block
@with_and_without_mask("block", "lnplain", omit=_POST, needs={"layernorm.affine": False},
                       resolve=_but("layernorm.affine"), **_BLOCK)
@with_and_without_mask("block", "gpt2", omit=_PRE,
                       needs={"block.norm": "pre_final", "block.causal": True,
                              "ffn.activation": "gelu_tanh"},
                       resolve=_but("block.norm", "block.causal", "ffn.activation"), **_BLOCK)
@with_and_without_mask("block", "rmsnorm", omit=_PRE,
                       needs={"block.norm": "pre_final", "block.normalization": "rmsnorm"},
                       resolve=_but("block.norm", "block.normalization"), **_BLOCK)
# LLaMA's attention inside a block: causal, RoPE on q and k, one family per pair convention
@with_and_without_mask("block", "causal_rope_half", omit=_POST,
                       needs={"block.causal": True, "attention.rope": "half"},
                       resolve=_but("block.causal"), torch_requires=("transformers",), **_BLOCK)
@with_and_without_mask("block", "causal_rope_interleaved", omit=_POST,
                       needs={"block.causal": True, "attention.rope": "interleaved"},
                       resolve=_but("block.causal"), **_BLOCK)
# LLaMA's block: pre-norm RMSNorms, causal attention with RoPE on q and k (Hugging Face's
# half-split pairs), SwiGLU without biases (swiglu.W_1 gate, W_3 up, W_2 down); block.ffn
# first, so an implementation without SwiGLU is told that first
@with_and_without_mask("block", "llama_swiglu", omit=_PRE,
                       needs={"block.ffn": "swiglu", "block.norm": "pre",
                              "block.normalization": "rmsnorm", "block.causal": True,
                              "attention.rope": "half"},
                       resolve=_but("block.ffn", "block.norm", "block.normalization",
                                    "block.causal"), torch_requires=("transformers",), **_BLOCK)
@fixed_examples(_block_example)
@st.composite
def block_cases(draw, bias: bool, masked: bool, norm: str = "post", causal: bool = False,
                W_o: bool = True, b_1: bool = True, b_2: bool = True, activation: str = "relu",
                normalization: str = "layernorm", heads: str = "fused",
                rope: str | None = None, affine: bool = True, ffn: str = "mlp") -> OpCase:
    """x plus every block parameter as a differentiable input named by its local name; the
    variant (``norm``, ``causal``, ``normalization``; the parts' ``W_o``, ``b_1``, ``b_2``,
    ``activation``) decides the names (minibert_reference.ops.block_param_names, the one definition)
    and the keywords passed when not the standard; ``heads`` "single": one head; ``rope``:
    RoPE on the attention's queries and keys at a drawn ``rope_base`` (d_k even); ``ffn``
    "swiglu": SwiGLU's weights in place of the FFN's.

    The ReLU and LayerNorm conditions depend on the attention output, so the strategy filters
    them (``block_smooth`` above)."""
    from minibert_reference.ops import block_param_names

    B, T = draw(batch_seq())
    A, d_k = draw(head_dims())
    if rope is not None:
        d_k += d_k % 2  # RoPE turns pairs of features
    if heads == "single":
        A, d_k = 1, A * d_k
    H = A * d_k
    assume(H >= 2)  # a LayerNorm over one feature is constant: nothing to differentiate
    I = draw(sizes(1, 5))
    names = block_param_names(**block_variant(bias, norm, W_o, b_1, b_2, normalization, affine,
                                              ffn))
    p = _block_weights(draw(_seed()), H, I, names)
    for ln in ("ln1", "ln2", "ln_f"):
        if f"{ln}.gamma" in names:
            p[f"{ln}.gamma"] = draw(gammas(H))
        if f"{ln}.beta" in names:
            p[f"{ln}.beta"] = draw(betas(H))
    inputs = {"x": draw(arrays((B, T, H))), **{n: p[n] for n in names}}
    mask = None
    if masked:
        mask = draw(causal_key_masks(B, T) if causal else key_masks(B, T))
    fixed = _block_fixed(A, mask, draw(layernorm_eps()), norm=norm, causal=causal,
                         activation=activation, normalization=normalization, rope=rope,
                         rope_base=10000.0 if rope is None else draw(rope_bases()), ffn=ffn)
    return OpCase(inputs, fixed, draw(upstream((B, T, H))), draw(_seed()))


def _pooler_example(rng, bias: bool = True):
    inputs = {"h": rng.standard_normal((2, 3, 4)), "W": rng.standard_normal((4, 4)),
              "b": 0.3 * rng.standard_normal(4) if bias else None}
    return OpCase(inputs, {}, upstream_like(rng, (2, 4)))


@cases("pooler", also=("tanh",), torch="pooler")
@cases("pooler", "nobias", bias=False, also=("tanh",), torch="pooler")
@fixed_examples(_pooler_example)
@st.composite
def pooler_cases(draw, bias: bool = True) -> OpCase:
    B, T = draw(batch_seq())
    H = draw(sizes(1, 4))
    inputs = {"h": draw(arrays((B, T, H))), "W": draw(arrays((H, H))),
              "b": draw(arrays((H,))) if bias else None}
    return OpCase(inputs, {}, draw(upstream((B, H))), draw(_seed()))
