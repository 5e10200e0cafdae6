"""PyTorch as an independent oracle: every op and the whole encoder rebuilt from torch's own
modules and functions (``F.embedding``, ``F.linear``, ``F.layer_norm``, ``F.softmax``,
``F.multi_head_attention_forward``, ``nn.TransformerEncoderLayer``, ``F.cross_entropy``,
``F.mse_loss``) from the same NumPy arrays, with gradients from ``torch.autograd``.

Nothing here restates a formula of ``reference/``: where torch has the op, torch's op is used;
the only hand-written pieces are plumbing (weight layout ``[n_in, n_out]`` vs torch's
``[n_out, n_in]``, masks' True/False convention, the sinusoidal table, which torch lacks).

Imported only by the oracle checks when they run (the ``oracle`` extra): ``reference/`` never
imports torch, and loading the suite does not either.  To measure how far an implementation is
from torch (every comparison the oracle checks make, both dtypes)::

    MINIBERT_ORACLE_REPORT=/tmp/oracle.jsonl minibert check reference --kinds oracle
    python -m minibert_spec.suite.torch_oracle summarize /tmp/oracle.jsonl
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import warnings
from collections.abc import Callable, Mapping

import numpy as np
import torch
import torch.nn.functional as F

from minibert_spec.numerics.asserts import assert_close, assert_finite
from minibert_spec.protocol import IGNORE_INDEX
from minibert_spec.suite.torch_swiglu import block_swiglu, swiglu, weight  # noqa: F401
from minibert_spec.tolerances import ORACLE_FLOOR_ULPS, ORACLE_RTOL_F32, ORACLE_RTOL_F64

# Checks run one process per core (xdist, minibert check's workers): torch's own thread pool
# would oversubscribe.
torch.set_num_threads(1)


# --------------------------------------------------------------------------- plumbing
def tensor(a, requires_grad: bool = False) -> torch.Tensor:
    """A torch copy of a NumPy array (same dtype); integer arrays become int64 indices."""
    a = np.asarray(a)
    if np.issubdtype(a.dtype, np.integer):
        return torch.from_numpy(a.astype(np.int64))
    if a.dtype == np.bool_:
        return torch.from_numpy(a.copy())
    return torch.from_numpy(a.copy()).requires_grad_(requires_grad)


def vjp(fn: Callable[..., torch.Tensor], inputs: Mapping[str, object], dout,
        wrt: tuple[str, ...], *, backward: bool = True
        ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Run ``fn(**inputs)`` in torch and backpropagate ``dout`` (same shape as the output).

    Returns (output, {name: gradient}) for every name in ``wrt``; an input the output does not
    depend on gets an exact zero gradient.  Non-array inputs (ints, None, strings) pass through.
    ``backward=False``: the output alone, ``{}`` for the gradients (a forward comparison: the
    same forward, ``wrt`` still requiring grad, without the backward it would not read).
    """
    args = {}
    for name, value in inputs.items():
        if isinstance(value, np.ndarray):
            args[name] = tensor(value, requires_grad=name in wrt)
        else:
            args[name] = value
    out = fn(**args)
    if not backward:
        return out.detach().numpy(), {}
    out.backward(tensor(np.asarray(dout, dtype=out.detach().numpy().dtype)))
    grads = {}
    for name in wrt:
        g = args[name].grad
        grads[name] = (np.zeros_like(inputs[name]) if g is None else g.detach().numpy())
    return out.detach().numpy(), grads


def tolerance(dtype) -> float:
    """The relative tolerance of the oracle comparison for ``dtype`` (see allowed_error)."""
    if np.dtype(dtype) == np.float64:
        return ORACLE_RTOL_F64
    if np.dtype(dtype) == np.float32:
        return ORACLE_RTOL_F32
    raise ValueError(f"dtype: expected float32 or float64, got {dtype}")


def deviation(ours, theirs) -> dict[str, float]:
    """Measured disagreement: max absolute, max element-wise relative (entries with
    |theirs| > 0 only) and norm-wise relative (max |diff| / max |theirs|)."""
    a = np.asarray(ours, dtype=np.float64)
    b = np.asarray(theirs, dtype=np.float64)
    diff = np.abs(a - b)
    scale = float(np.max(np.abs(b), initial=0.0))
    nz = np.abs(b) > 0
    return {
        "max_abs": float(diff.max(initial=0.0)),
        "max_rel": float((diff[nz] / np.abs(b[nz])).max()) if nz.any() else 0.0,
        "normwise_rel": float(diff.max(initial=0.0) / scale) if scale > 0 else 0.0,
        "scale": scale,
    }


def rounding_floor(dtype, inputs_scale: float) -> float:
    """The absolute error below which two correct evaluations cannot be told apart:
    ORACLE_FLOOR_ULPS units of roundoff of the dtype times the magnitude of the values the op
    computes with (``inputs_scale``: the largest |entry| of its inputs and upstream gradient),
    and never below the dtype's smallest normal number (results in the denormal range have
    no relative precision left: ours 0.0 against torch's 2.8e-45 is the same number)."""
    info = np.finfo(np.dtype(dtype))
    return max(float(info.tiny), ORACLE_FLOOR_ULPS * float(info.eps) * float(inputs_scale))


def allowed_error(theirs: np.ndarray, dtype, scale: float = 0.0,
                  inputs_scale: float = 0.0) -> np.ndarray:
    """The admissible |ours - theirs|: ``rtol max(max|theirs|, scale)`` for every entry, with
    the oracle rtol of the dtype, and at least :func:`rounding_floor` (a result that is tiny
    only because terms of the inputs' size cancelled, GELU's tail at x = -5 in float64 or a
    float32 pooler output of 2e-4 from terms of 2, carries the rounding of those terms: a scale
    of 0 must never demand more than the dtype can resolve).

    The relative tolerance applies to the magnitude of the whole tensor, not entry by entry:
    an entry's rounding error is ~u times the magnitudes summed into it, not times its own
    value.  Entries that come out of cancellation (a LayerNorm dx, the embedding row of a token
    seen once, most of dW_1) carry the error of the large terms that cancelled, in torch as in
    NumPy, so an element-wise rule would need an absolute floor to pass them -- and a fixed
    floor fails correct code as soon as gradients grow (``reduction="sum"``, an O(1) upstream
    gradient on 8192 logits) and means nothing when they shrink.  ``scale`` (the largest
    |entry| among all the outputs of the same backward call) is for gradients that are exactly
    0 in exact arithmetic -- the key bias (softmax is shift invariant), W_q when every key is
    equal -- which are rounding noise on both sides, of the size of the other gradients.
    """
    mag = float(np.max(np.abs(np.asarray(theirs, dtype=np.float64)), initial=0.0))
    return np.full(np.shape(theirs), max(tolerance(dtype) * max(mag, scale),
                                         rounding_floor(dtype, inputs_scale)))


def assert_oracle(name: str, ours, theirs, dtype=None, scale: float = 0.0,
                  inputs_scale: float = 0.0, allowance=0.0) -> None:
    """``ours`` within ``allowed_error`` of torch's ``theirs``, with the dtype and shape of
    ``theirs``; the message names the tensor, the worst index and both values.  ``allowance``
    (scalar or per entry) is added for a declared guard (spec/protocol/guards.py), derived from its
    value -- never a widened tolerance for everyone."""
    if ours is None:
        raise AssertionError(f"{name}: got None, torch has an array of shape {np.shape(theirs)}")
    ours = np.asarray(ours)
    theirs = np.asarray(theirs)
    dtype = np.dtype(dtype if dtype is not None else theirs.dtype)
    if ours.shape != theirs.shape:
        raise AssertionError(f"{name}: shape {ours.shape}, torch {theirs.shape}")
    if ours.dtype != dtype:
        if not (ours.shape == () and dtype == np.float32 and ours.dtype == np.float64):
            raise AssertionError(f"{name}: dtype {ours.dtype}, expected {dtype}")
        # a documented convention, not a failure: a scalar loss accumulated and returned in
        # float64 from float32 inputs (issue 11); it is still judged at float32's tolerance,
        # and the number it changes is reported
        warnings.warn(f"convention: {name} is a float64 scalar from float32 inputs (value "
                      f"{float(ours):.9g}; float32 rounding would change it by "
                      f"{abs(float(ours) - float(np.float32(ours))):.1e})", stacklevel=2)
    a = ours.astype(np.float64)
    b = theirs.astype(np.float64)
    assert_finite(a, b, name, got_name="ours", want_name="torch")
    allowed = allowed_error(b, dtype, scale, inputs_scale) + allowance
    _record(name, dtype, a, b, scale, allowed)
    d = deviation(a, b)
    assert_close(a, b, rtol=0.0, atol=allowed, what=f"{name} ({dtype}) differs from torch",
                 got_name="ours", want_name="torch",
                 rule=f"rtol {tolerance(dtype):.0e} of the scale, floor "
                      f"{rounding_floor(dtype, inputs_scale):.1e}; max abs {d['max_abs']:.3e}, "
                      f"max |torch| {d['scale']:.3e}, call scale {scale:.3e}")


def assert_gradients(label: str, ours: Mapping, theirs: Mapping, order, dtype,
                     exactly_zero: Callable[[str], bool], against: str = "torch") -> None:
    """Every gradient of ``order`` (backward order) against the oracle's: each relative to its
    own magnitude and not identically 0 on the oracle's side, except those whose exact value is
    0 (``exactly_zero``: rounding noise on both sides, judged against the scale of the whole
    backward).  Every tensor is checked and the failures listed in that order, so the first
    names where the gradient first goes wrong."""
    order = list(order)
    call_scale = grad_scale(theirs[n] for n in order)
    failures = []
    for name in order:
        zero = exactly_zero(name)
        try:
            assert_oracle(f"{label} d{name}", ours[name], theirs[name], dtype,
                          call_scale if zero else 0.0)
            if not zero:
                assert_nontrivial(f"{label} d{name}", theirs[name], dtype)
        except AssertionError as e:
            failures.append(str(e))
    if failures:
        raise AssertionError(f"{label}: {len(failures)} of {len(order)} gradients differ from "
                             f"{against} (backward order, the first is where it starts):\n"
                             + "\n".join(failures))


def inputs_scale(*values) -> float:
    """The largest |entry| among an op's array inputs (and upstream gradient): the magnitude
    of what it computes with, for :func:`rounding_floor`."""
    out = 0.0
    for v in values:
        if isinstance(v, dict):
            out = max(out, inputs_scale(*v.values()))
        elif isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.floating) and v.size:
            out = max(out, float(np.max(np.abs(v))))
        elif isinstance(v, (float, np.floating)):
            out = max(out, abs(float(v)))
    return out


def grad_scale(grads) -> float:
    """The largest |entry| among a backward call's gradients (the float32 scale)."""
    return max((float(np.max(np.abs(g), initial=0.0)) for g in grads if g is not None),
               default=0.0)


def assert_nontrivial(name: str, theirs, dtype) -> None:
    """torch's value is not identically 0: the case exercises the gradient (a tensor that is 0
    in exact arithmetic is compared against the call's scale instead, see allowed_error)."""
    scale = float(np.max(np.abs(theirs), initial=0.0))
    if not scale > 0:
        raise AssertionError(f"{name} ({np.dtype(dtype).name}): torch's values are all 0, "
                             "the case does not exercise this gradient")


# Measured deviations go to this file (JSON lines) when the variable is set; summarise with
# ``python -m minibert_spec.suite.torch_oracle summarize FILE``.
REPORT_ENV = "MINIBERT_ORACLE_REPORT"


def _record(name: str, dtype, a: np.ndarray, b: np.ndarray, scale: float,
            allowed: np.ndarray) -> None:
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    d = deviation(a, b)
    used = max(d["scale"], scale)
    row = {"name": name, "dtype": str(dtype), **d,
           "rel_to_scale": d["max_abs"] / used if used > 0 else 0.0,
           "of_allowed": float(np.max(np.abs(a - b) / allowed, initial=0.0))}
    with open(path, "a") as fh:  # one short line per write: safe across xdist workers
        fh.write(json.dumps(row) + "\n")


# --------------------------------------------------------------------------- ops
def embedding(ids, W):
    return F.embedding(ids, W)


def learned_position(x, W_pos):
    positions = torch.arange(x.shape[1])
    return x + F.embedding(positions, W_pos)[None]


def sinusoidal_table(T: int, d: int, dtype=torch.float64) -> torch.Tensor:
    """The NumPy-Transformer document's table, written as the PyTorch tutorials write it
    (exp/log form of the frequencies, rather than a power): [T, d], float64 then cast."""
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    inv_freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float64) * (-math.log(10000.0) / d))
    pe = torch.zeros(T, d, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * inv_freq)
    pe[:, 1::2] = torch.cos(pos * inv_freq[: d // 2])
    return pe.to(dtype)


def sinusoidal_position(x):
    return x + sinusoidal_table(x.shape[1], x.shape[2], x.dtype)[None]


def _positions(positions, T: int) -> torch.Tensor:
    """The protocol's positions argument as a [T] int64 tensor: None -> 0..T-1, an int p0 ->
    p0..p0+T-1, else the positions themselves (plumbing, not RoPE's maths)."""
    if positions is None:
        return torch.arange(T)
    if isinstance(positions, int):
        return torch.arange(positions, positions + T)
    return positions


@functools.cache
def _llama_rotary(d: int, base: float):
    """transformers' own LlamaRotaryEmbedding for head dimension d and rope_theta = base, from a
    random small config (nothing downloaded)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(hidden_size=2 * d, num_attention_heads=2, head_dim=d, rope_theta=base,
                         intermediate_size=4, num_hidden_layers=1, vocab_size=8)
    return LlamaRotaryEmbedding(config)


def llama_cos_sin(rotary, x, position_ids, d: int, base: float):
    """cos, sin [B, T, d] of transformers' LlamaRotaryEmbedding ``rotary`` for ``x``'s dtype:
    the module's own in float32; in float64 the same angles (position times 1 / base^(2i/d),
    the formula checked against the module's inv_freq buffer) formed in float64, where the
    module would round them to float32."""
    if x.dtype == torch.float32:
        return rotary(x, position_ids)
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    if not torch.allclose(inv_freq.float(), rotary.inv_freq.float(), rtol=1e-6, atol=0):
        raise AssertionError(f"LlamaRotaryEmbedding's inv_freq {rotary.inv_freq.tolist()} is "
                             f"not 1 / base^(2i/d)")
    freqs = position_ids.to(torch.float64)[..., None] * inv_freq  # [B, T, d/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [B, T, d], as the module forms it
    return emb.cos(), emb.sin()


def rope_half(x, positions=None, *, base=10000.0, convention="half"):
    """Half-split RoPE as transformers' LLaMA applies it: cos and sin from LlamaRotaryEmbedding,
    then apply_rotary_pos_emb (``q cos + rotate_half(q) sin``) over x [..., T, d].

    LlamaRotaryEmbedding computes its frequencies and angles in float32 whatever the input's
    dtype (``.float()``): in float64 the twin forms the same angles, position times its
    inv_freq buffer's formula, in float64 (that formula is checked against the module's own
    float32 buffer here) -- a float32 angle would be the inaccurate side, as GELU's is."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    T, d = x.shape[-2:]
    rotary = _llama_rotary(int(d), float(base))
    pos = _positions(positions, T)
    cos, sin = llama_cos_sin(rotary, x, pos[None], d, float(base))  # [1, T, d]
    lead = x.reshape(-1, T, d)  # apply_rotary_pos_emb broadcasts cos [1, T, d] over dim 1
    q, _ = apply_rotary_pos_emb(lead[None], lead[None], cos, sin, unsqueeze_dim=1)
    return q[0].reshape(x.shape)


def rope_interleaved(x, positions=None, *, base=10000.0, convention="interleaved"):
    """Interleaved RoPE as Meta's LLaMA code writes it: feature pairs (2i, 2i+1) viewed as
    complex numbers (``torch.view_as_complex``) times ``torch.polar(1, m theta_i)``
    (``precompute_freqs_cis``, ``apply_rotary_emb``), autograd through the complex product."""
    T, d = x.shape[-2:]
    freqs = 1.0 / (float(base) ** (torch.arange(0, d, 2, dtype=torch.float64)[: d // 2] / d))
    angles = torch.outer(_positions(positions, T).to(torch.float64), freqs)  # [T, d/2]
    freqs_cis = torch.polar(torch.ones_like(angles), angles).to(
        torch.complex64 if x.dtype == torch.float32 else torch.complex128)
    x_c = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2))
    return torch.view_as_real(x_c * freqs_cis).reshape(x.shape)


def linear(x, W, b=None):
    return F.linear(x, weight(W), b)


def layernorm(x, gamma, beta, eps=1e-12):
    return F.layer_norm(x, (x.shape[-1],), gamma, beta, eps)


def _keep(mask):
    """A mask as torch booleans, True = kept (the protocol also takes 0/1 integers)."""
    return None if mask is None else mask.bool()


def softmax(x, mask=None):
    if mask is not None:
        x = x.masked_fill(~_keep(mask), float("-inf"))
    return F.softmax(x, dim=-1)


def relu(x):
    return F.relu(x)


def tanh(x):
    return torch.tanh(x)


def causal_mask(T: int) -> torch.Tensor:
    """torch's boolean attention mask of a causal attention: True where query i may *not*
    attend key j (j > i), as ``nn.Transformer.generate_square_subsequent_mask`` marks it."""
    return torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)


def attention(x, W_q, W_k, W_v, W_o, b_q=None, b_k=None, b_v=None, b_o=None, *, n_heads,
              mask=None, causal=False, rope=None, rope_base=10000.0):
    """torch's multi-head attention (the functional form of nn.MultiheadAttention) with
    separate Q/K/V projections.  ``mask`` [B, T] True = may be attended; torch's
    key_padding_mask is the opposite (True = ignore).  ``causal``: torch's attn_mask of a
    causal attention; ``W_o`` None: the identity as torch's output projection (y = C);
    ``rope`` (which torch's has not): :func:`rope_attention`."""
    if rope is not None:
        return rope_attention(x, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, n_heads=n_heads,
                              mask=mask, causal=causal, rope=rope, rope_base=rope_base)
    biases = (b_q, b_k, b_v)
    if any(b is None for b in biases) and not all(b is None for b in biases):
        raise ValueError("b_q, b_k, b_v: torch's attention takes all three or none")
    in_proj_bias = None if b_q is None else torch.cat(biases)
    H = x.shape[-1]
    W_out = torch.eye(H, dtype=x.dtype) if W_o is None else weight(W_o)
    q = x.transpose(0, 1)  # torch wants [T, B, H]
    y, _ = F.multi_head_attention_forward(
        q, q, q, H, n_heads, None, in_proj_bias, None, None, False, 0.0, W_out, b_o,
        training=False, key_padding_mask=None if mask is None else ~_keep(mask),
        need_weights=False,
        attn_mask=causal_mask(x.shape[1]) if causal else None,
        use_separate_proj_weight=True, q_proj_weight=weight(W_q), k_proj_weight=weight(W_k),
        v_proj_weight=weight(W_v))
    return y.transpose(0, 1)  # [B, T, H]


def rope_attention(x, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, *, n_heads, mask, causal, rope,
                   rope_base):
    """LLaMA's attention: q, k turned by the RoPE twin of ``rope`` at positions 0..T-1, then
    F.scaled_dot_product_attention, its boolean attn_mask True where a key may be attended."""
    (B, T, H), A = x.shape, n_heads

    def heads(W, b):  # [B, T, H] -> [B, A, T, d_k]: head a owns columns a*d_k .. (a+1)*d_k
        return F.linear(x, weight(W), b).reshape(B, T, A, H // A).transpose(1, 2)

    turn = rope_half if rope == "half" else rope_interleaved
    q, k = (turn(heads(W, b), base=rope_base) for W, b in ((W_q, b_q), (W_k, b_k)))
    allowed = torch.ones(B, 1, T, T, dtype=torch.bool)  # [B, 1, T_q, T_k]
    if mask is not None:
        allowed = allowed & _keep(mask)[:, None, None, :]
    if causal:
        allowed = allowed & ~causal_mask(T)
    C = F.scaled_dot_product_attention(q, k, heads(W_v, b_v), attn_mask=allowed)
    C = C.transpose(1, 2).reshape(B, T, H)  # merge the heads
    return C if W_o is None else F.linear(C, weight(W_o), b_o)


def activation_of(x, activation: str):
    """The protocol's activations as torch has them (relu, gelu, gelu_tanh, relu2: squared
    ReLU as the nanoGPT speedrun writes it)."""
    if activation == "relu":
        return F.relu(x)
    if activation == "relu2":
        return F.relu(x).square()
    return F.gelu(x, approximate="tanh" if activation == "gelu_tanh" else "none")


def ffn(x, W_1, b_1, W_2, b_2, activation="relu"):
    return F.linear(activation_of(F.linear(x, weight(W_1), b_1), activation), weight(W_2), b_2)


_STANDARD_BLOCK = ("attn.W_o", "ffn.b_1", "ffn.b_2", "ln1.beta")


def block(x, p: Mapping[str, torch.Tensor], *, n_heads, mask=None, eps=1e-12, norm="post",
          causal=False, activation="relu", normalization="layernorm", rope=None,
          rope_base=10000.0):
    """torch's own encoder layer (``nn.TransformerEncoderLayer``, ReLU, no dropout; post-LN, or
    ``norm_first=True`` for norm "pre" / "pre_final", the latter followed by F.layer_norm with
    ``ln_f.*``, as ``nn.TransformerEncoder(norm=...)`` ends a pre-LN stack) run with our
    parameters (``torch.func.functional_call``); ``causal``: its causal ``src_mask``.
    Unbiased attention is torch's attention with zero biases.  A block the encoder layer cannot
    be (GELU, RMSNorm, no W_o, no FFN bias, norm "inner": x + LN(f(x)), RoPE) is composed from
    torch's functions instead (:func:`composed_block`)."""
    if activation != "relu" or normalization != "layernorm" or norm == "inner" or rope or any(
            k not in p for k in _STANDARD_BLOCK):
        return composed_block(x, p, n_heads=n_heads, mask=mask, eps=eps, norm=norm,
                              causal=causal, activation=activation, normalization=normalization,
                              rope=rope, rope_base=rope_base)
    H = x.shape[-1]
    I = p["ffn.W_1"].shape[1]
    layer = _encoder_layer(H, n_heads, I, eps, x.dtype, norm_first=norm != "post")
    zeros = torch.zeros(H, dtype=x.dtype)
    b = {n: p.get(f"attn.{n}", zeros) for n in ("b_q", "b_k", "b_v", "b_o")}
    state = {
        "self_attn.in_proj_weight": torch.cat([weight(p["attn.W_q"]), weight(p["attn.W_k"]),
                                               weight(p["attn.W_v"])]),
        "self_attn.in_proj_bias": torch.cat([b["b_q"], b["b_k"], b["b_v"]]),
        "self_attn.out_proj.weight": weight(p["attn.W_o"]),
        "self_attn.out_proj.bias": b["b_o"],
        "linear1.weight": weight(p["ffn.W_1"]), "linear1.bias": p["ffn.b_1"],
        "linear2.weight": weight(p["ffn.W_2"]), "linear2.bias": p["ffn.b_2"],
        "norm1.weight": p["ln1.gamma"], "norm1.bias": p["ln1.beta"],
        "norm2.weight": p["ln2.gamma"], "norm2.bias": p["ln2.beta"],
    }
    key_padding_mask = None if mask is None else ~_keep(mask)
    out = torch.func.functional_call(
        layer, state, (x,), {"src_key_padding_mask": key_padding_mask,
                             "src_mask": causal_mask(x.shape[1]) if causal else None})
    if norm == "pre_final":
        out = F.layer_norm(out, (H,), p["ln_f.gamma"], p["ln_f.beta"], eps)
    return out


def composed_block(x, p: Mapping[str, torch.Tensor], *, n_heads, mask=None, eps=1e-12,
                   norm="post", causal=False, activation="relu", normalization="layernorm",
                   rope=None, rope_base=10000.0):
    """A block of any declared variant from torch's functions: :func:`attention` (torch's
    multi-head attention; W_o absent: the identity; ``rope``: :func:`rope_attention`), F.linear
    and the activation,
    F.layer_norm or F.rms_norm; the residual sums where ``norm`` puts them."""
    H = x.shape[-1]

    def normed(v, name):
        if normalization == "rmsnorm":
            return F.rms_norm(v, (H,), p[f"{name}.gamma"], eps)
        return F.layer_norm(v, (H,), p.get(f"{name}.gamma"), p.get(f"{name}.beta"), eps)

    def mha(v):
        return attention(v, *(p.get(f"attn.{n}") for n in ("W_q", "W_k", "W_v", "W_o", "b_q",
                                                             "b_k", "b_v", "b_o")),
                         n_heads=n_heads, mask=mask, causal=causal, rope=rope,
                         rope_base=rope_base)

    def mlp(v):
        if "swiglu.W_1" in p:  # block.ffn "swiglu": LLaMA's feed-forward part
            return block_swiglu(v, p)
        return ffn(v, p["ffn.W_1"], p.get("ffn.b_1"), p["ffn.W_2"], p.get("ffn.b_2"),
                   activation)

    if norm == "post":
        h = normed(x + mha(x), "ln1")
        return normed(h + mlp(h), "ln2")
    if norm == "inner":  # x + LN(f(x)): each sublayer's output normalised before the sum
        h = x + normed(mha(x), "ln1")
        return h + normed(mlp(h), "ln2")
    h = x + mha(normed(x, "ln1"))
    out = h + mlp(normed(h, "ln2"))
    return normed(out, "ln_f") if norm == "pre_final" else out


def block_flat(x, *, n_heads, mask=None, eps=1e-12, norm="post", causal=False,
               activation="relu", normalization="layernorm", rope=None, rope_base=10000.0,
               ffn="mlp", **p):
    """:func:`block` with the parameters as keywords (the block's case family passes each
    parameter as a differentiable input of its own; ``ffn`` is what its keys say)."""
    return block(x, p, n_heads=n_heads, mask=mask, eps=eps, norm=norm, causal=causal,
                 activation=activation, normalization=normalization, rope=rope,
                 rope_base=rope_base)


_LAYERS: dict = {}


def _encoder_layer(H, n_heads, I, eps, dtype, norm_first=False):
    key = (H, n_heads, I, eps, dtype, norm_first)
    if key not in _LAYERS:
        layer = torch.nn.TransformerEncoderLayer(
            H, n_heads, dim_feedforward=I, dropout=0.0, activation="relu", layer_norm_eps=eps,
            batch_first=True, norm_first=norm_first, dtype=dtype)
        layer.eval()  # no dropout; the fused fast path is off anyway: our inputs need grads
        _LAYERS[key] = layer
    return _LAYERS[key]


def pooler(h, W, b=None):
    return torch.tanh(F.linear(h[:, 0], weight(W), b))


def gelu(x, approximate="none"):
    return F.gelu(x, approximate=approximate)


def token_type(x, type_ids, W_type):
    return x + F.embedding(type_ids, W_type)


def embedding_ln(ids, type_ids, W_word, W_pos, W_type, gamma, beta, eps=1e-12):
    T = ids.shape[1]
    e = F.embedding(ids, W_word) + W_pos[:T] + F.embedding(type_ids, W_type)
    return F.layer_norm(e, (W_word.shape[1],), gamma, beta, eps)


def mlm_head(h, W_t, b_t, gamma, beta, W_word, b_dec, *, eps=1e-12, activation="gelu"):
    """The tied decoder is F.linear with the [V, H] table itself as torch's [out, in] weight."""
    a = activation_of(F.linear(h, weight(W_t), b_t), activation)
    n = F.layer_norm(a, (h.shape[-1],), gamma, beta, eps)
    return F.linear(n, W_word, b_dec)


def classifier(h, W_p, b_p, W_c, b_c):
    return F.linear(pooler(h, W_p, b_p), weight(W_c), b_c)


def cross_entropy(logits, labels, *, ignore_index=IGNORE_INDEX, reduction="mean"):
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=ignore_index,
                           reduction=reduction)


def cross_entropy_probabilities(logits, labels, *, ignore_index=IGNORE_INDEX, reduction="mean",
                                input="probabilities"):  # noqa: A002 (the protocol's keyword)
    """The loss of softmax output p (passed as ``logits``, the protocol's first argument):
    F.nll_loss of log p, its gradient dL/dp."""
    V = logits.shape[-1]
    return F.nll_loss(torch.log(logits).reshape(-1, V), labels.reshape(-1),
                      ignore_index=ignore_index, reduction=reduction)


class _LogPassingLogitGradient(torch.autograd.Function):
    """log p whose backward hands the gradient on unchanged: the gradient reaching p is then
    dL/d(log p), the logit gradient (softmax(log p) = p)."""

    @staticmethod
    def forward(ctx, p):
        return torch.log(p)

    @staticmethod
    def backward(ctx, grad):
        return grad


def cross_entropy_probabilities_dlogits(logits, labels, *, ignore_index=IGNORE_INDEX,
                                        reduction="mean",
                                        input="probabilities_dlogits"):  # noqa: A002
    """The composed form: p in (as ``logits``), F.cross_entropy of the logits log p, and its
    gradient w.r.t. those logits (p - onehot) handed back as the gradient of p."""
    return cross_entropy(_LogPassingLogitGradient.apply(logits), labels,
                         ignore_index=ignore_index, reduction=reduction)


def linear_cross_entropy(x, W, b, labels, *, ignore_index=IGNORE_INDEX, reduction="mean"):
    """F.linear then F.cross_entropy: the fused op's unfused torch counterpart."""
    return cross_entropy(linear(x, W, b), labels, ignore_index=ignore_index,
                         reduction=reduction)


def mse(y_hat, y):
    return F.mse_loss(y_hat, y, reduction="mean")


# --------------------------------------------------------------------------- whole model
def model_forward(params: Mapping[str, torch.Tensor], config, input_ids=None,
                  attention_mask=None, *, inputs_embeds=None):
    """The encoder of ``config`` in torch from a flat parameter dict of tensors.

    Returns (output, input_embeddings) where output is [B, T, V] logits (head "mlm") or
    [B, T, H] hidden states (head "none"), and input_embeddings is the token + position sum
    that enters the first block (retain_grad'ed, so its .grad is the input gradient).
    """
    if inputs_embeds is None:
        x = F.embedding(input_ids, params["embeddings.token.W"])
        if config.position == "learned":
            x = learned_position(x, params["embeddings.position.W"])
        else:
            x = sinusoidal_position(x)
    else:
        x = inputs_embeds
    if x.requires_grad:
        x.retain_grad()
    mask = None if attention_mask is None else attention_mask.bool()
    h = x
    for i in range(config.n_layers):
        prefix = f"layers.{i}."
        p = {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}
        h = block(h, p, n_heads=config.n_heads, mask=mask, eps=config.ln_eps)
    if config.final_layernorm:
        h = layernorm(h, params["final_ln.gamma"], params["final_ln.beta"], config.ln_eps)
    if config.head == "mlm":
        h = linear(h, params["mlm.W"], params["mlm.b"])
    return h, x


def model_loss_and_grads(params: Mapping[str, np.ndarray], config, input_ids, *,
                         attention_mask=None, labels=None, targets=None, reduction="mean",
                         ignore_index=IGNORE_INDEX, dout=None):
    """Loss (CE for head "mlm", MSE for head "none") and its gradients in torch.

    Returns dict(output, loss, grads={name: array}, d_embeddings).  With ``dout`` given, the
    output is backpropagated with ``dout`` instead of the loss (loss is then None).
    """
    tp = {k: tensor(v, requires_grad=True) for k, v in params.items()}
    out, x = model_forward(tp, config, tensor(input_ids),
                           None if attention_mask is None else tensor(attention_mask))
    value = None
    if dout is not None:
        out.backward(tensor(dout))
    else:
        if config.head == "mlm":
            value = cross_entropy(out, tensor(labels), ignore_index=ignore_index,
                                  reduction=reduction)
        else:
            value = mse(out, tensor(targets))
        value.backward()
    grads = {k: (np.zeros_like(params[k]) if t.grad is None else t.grad.numpy())
             for k, t in tp.items()}
    return dict(output=out.detach().numpy(),
                loss=None if value is None else value.detach().numpy(),
                grads=grads, d_embeddings=x.grad.numpy())


@contextlib.contextmanager
def watch_blocks(H: int, n_heads: int, I: int, eps: float, dtype=torch.float64,
                 norm_first: bool = False):
    """Record, for every block run inside the context, the smallest |ReLU pre-activation| and
    the smallest standard deviation of a LayerNorm input row: gradients are only comparable
    when no ReLU sits on its kink and no LayerNorm row is (nearly) constant."""
    stats: dict[str, list[float]] = {"relu": [], "ln_std": []}
    layer = _encoder_layer(H, n_heads, I, eps, dtype, norm_first)

    def on_relu(_module, _inputs, output):  # linear1's output is the ReLU's input
        stats["relu"].append(float(output.detach().abs().min()))

    def on_norm(_module, inputs):
        stats["ln_std"].append(float(inputs[0].detach().std(dim=-1, unbiased=False).min()))

    handles = [layer.linear1.register_forward_hook(on_relu),
               layer.norm1.register_forward_pre_hook(on_norm),
               layer.norm2.register_forward_pre_hook(on_norm)]
    try:
        yield stats
    finally:
        for h in handles:
            h.remove()


def model_conditioning(params: Mapping[str, np.ndarray], config, input_ids,
                       attention_mask=None) -> dict[str, float]:
    """min |ReLU pre-activation| and min LayerNorm-input row std over every block (float64)."""
    tp = {k: tensor(np.asarray(v, dtype=np.float64)) for k, v in params.items()}
    with watch_blocks(config.hidden, config.n_heads, config.intermediate, config.ln_eps) as st:
        model_forward(tp, config, tensor(input_ids),
                      None if attention_mask is None else tensor(attention_mask))
    if len(st["relu"]) != config.n_layers:
        raise AssertionError(f"expected {config.n_layers} blocks, saw {len(st['relu'])}")
    return {k: min(v) for k, v in st.items()}


# --------------------------------------------------------------------------- report
def summarize(path: str) -> str:
    """The worst measured deviations from torch recorded in ``path`` (see REPORT_ENV), per
    tensor kind (example sizes, model cases and layer numbers folded together) and dtype.

    Columns: max |ours - torch|; that divided by the scale the rule uses (the tensor's max
    |torch|, or the backward's for exactly-zero gradients, see ``allowed_error``); the max
    element-wise relative error (entries with torch != 0); and the largest fraction of the
    allowed error used (> 1 would have failed)."""
    import re

    cols = ("max_abs", "rel_to_scale", "max_rel", "of_allowed")
    worst: dict[tuple[str, str], dict[str, float]] = {}
    with open(path) as fh:
        for line in fh:
            row = json.loads(line)
            name = re.sub(r"\[[^]]*=[^]]*\]", "", row["name"])  # op sizes
            name = re.sub(r"layers\.\d+\.", "layers.*.", name)
            name = re.sub(r"^(mini_bert|seed001)(-small)?", r"model \1", name)
            w = worst.setdefault((name, row["dtype"]), dict.fromkeys(cols, 0.0) | {"n": 0})
            w["n"] += 1
            for k in cols:
                w[k] = max(w[k], row[k])
    lines = [f"{'tensor':44s} {'dtype':8s} {'n':>4s} {'max_abs':>9s} {'rel2scale':>9s} "
             f"{'elem_rel':>9s} {'of_allowed':>10s}"]
    for (name, dtype), w in sorted(worst.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        lines.append(f"{name:44s} {dtype:8s} {w['n']:4d} {w['max_abs']:9.2e} "
                     f"{w['rel_to_scale']:9.2e} {w['max_rel']:9.2e} {w['of_allowed']:10.2e}")
    for dtype in sorted({d for _, d in worst}):
        for part, test in (("ops", lambda n: not n.startswith("model")),
                           ("model", lambda n: n.startswith("model"))):
            rows = [w for (n, d), w in worst.items() if d == dtype and test(n)]
            if rows:
                lines.append(
                    f"worst {dtype} {part}: max_abs {max(w['max_abs'] for w in rows):.2e}, "
                    f"rel to scale {max(w['rel_to_scale'] for w in rows):.2e}, "
                    f"of allowed {max(w['of_allowed'] for w in rows):.2e}")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 3 or sys.argv[1] != "summarize":
        sys.exit("usage: python -m minibert_spec.suite.torch_oracle summarize FILE\n"
                 f"  (FILE written by a test run with {REPORT_ENV}=FILE)")
    print(summarize(sys.argv[2]))
