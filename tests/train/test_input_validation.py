"""Issue 13, validation outside ops/model: the optimizer, data masking, sequence building,
unigram statistics and tokenizer/RNG/JSON loading keep the ops' promise (a ValueError that
names the argument), and LayerNorm / cross-entropy stay finite in the reported cases.
Fuzzed with Hypothesis where the input space is wide."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minibert_reference
from minibert_reference import optim
from minibert_reference.train import data as D
from minibert_reference.train.fileio import loads_json

BAD_VALUES = [math.nan, math.inf, -math.inf]
BAD_DTYPES = [np.float16, np.complex128, np.int64]


def _params(dtype=np.float64):
    rng = np.random.default_rng(0)
    return {"a.W": rng.normal(size=(3, 4)).astype(dtype), "a.b": rng.normal(size=4).astype(dtype)}


# --------------------------------------------------------------------------- optimizer
@settings(max_examples=40, deadline=None)
@given(which=st.sampled_from(["params", "grads", "m", "v"]), key=st.sampled_from(["a.W", "a.b"]),
       value=st.sampled_from(BAD_VALUES), flat=st.integers(0, 3))
def test_adam_rejects_nonfinite(which, key, value, flat):
    """Finding: adam_step passed NaN/inf through."""
    p = _params()
    g = {k: np.ones_like(v) for k, v in p.items()}
    s = optim.adam_init(p)
    target = {"params": p, "grads": g, "m": s["m"], "v": s["v"]}[which]
    target[key] = target[key].copy()
    target[key].reshape(-1)[flat] = value
    with pytest.raises(ValueError, match="expected finite values"):
        optim.adam_step(p, g, s, lr=1e-3)


@pytest.mark.parametrize("dtype", BAD_DTYPES)
def test_adam_rejects_non_float_dtypes(dtype):
    """Finding: adam_step accepted float16/complex/int (int failed inside NumPy)."""
    p = {k: v.astype(dtype) for k, v in _params().items()}
    g = {k: np.ones_like(v) for k, v in p.items()}
    with pytest.raises(ValueError, match="float32 or float64"):
        optim.adam_step(p, g, optim.adam_init(p), lr=1e-3)


def test_adam_rejects_eps_zero():
    """Finding: eps=0 was accepted (NaN wherever a gradient is 0)."""
    p = _params()
    g = {k: np.zeros_like(v) for k, v in p.items()}
    with pytest.raises(ValueError, match="eps"):
        optim.adam_step(p, g, optim.adam_init(p), lr=1e-3, eps=0.0)


@pytest.mark.parametrize("value", BAD_VALUES)
def test_clip_rejects_nonfinite(value):
    """Finding: one inf gradient became NaN everywhere through clipping."""
    g = {k: np.ones_like(v) for k, v in _params().items()}
    g["a.b"][1] = value
    with pytest.raises(ValueError, match=r"grads\['a.b'\]: expected finite values"):
        optim.clip_by_global_norm(g, 1.0)


@pytest.mark.parametrize("dtype", BAD_DTYPES)
def test_clip_rejects_non_float_dtypes(dtype):
    g = {k: np.ones(v.shape, dtype=dtype) for k, v in _params().items()}
    with pytest.raises(ValueError, match="float32 or float64"):
        optim.clip_by_global_norm(g, 1.0)


# --------------------------------------------------------------------------- data
def _ids(B=4, T=10, seed=0):
    return np.random.default_rng(seed).integers(D.N_SPECIAL, 30, size=(B, T))


@settings(max_examples=40, deadline=None)
@given(bad=st.one_of(st.integers(-10**6, -1), st.integers(30, 10**6)), pos=st.integers(0, 39))
def test_mask_tokens_rejects_out_of_range_ids(bad, pos):
    """Finding: mask_tokens accepted out-of-range and negative ids."""
    ids = _ids()
    ids.reshape(-1)[pos] = bad
    with pytest.raises(ValueError, match="input_ids: expected ids in"):
        D.mask_tokens(ids, np.ones_like(ids), np.random.default_rng(0), vocab_size=30)


@pytest.mark.parametrize("ignore_index", [0, 5, 29])
def test_mask_tokens_rejects_a_real_token_as_ignore_index(ignore_index):
    """Finding: an ignore_index that is a real token was accepted."""
    ids = _ids()
    with pytest.raises(ValueError, match="ignore_index"):
        D.mask_tokens(ids, np.ones_like(ids), np.random.default_rng(0), vocab_size=30,
                      ignore_index=ignore_index)


@pytest.mark.parametrize("kw", [{"mask_prob": math.nan}, {"mask_frac": math.nan},
                                {"vocab_size": 3.5}])
def test_mask_tokens_rejects_bad_settings(kw):
    ids = _ids()
    with pytest.raises(ValueError):
        D.mask_tokens(ids, np.ones_like(ids), np.random.default_rng(0),
                      **{"vocab_size": 30, **kw})


@pytest.mark.parametrize("lists", [[[5.7, 6.2]], [[5, -1]], [[True, 5]], [[[5, 6]]],
                                   [np.array([5.0, 6.0])]])
def test_build_sequences_rejects_non_integer_ids(lists):
    """Finding: build_sequences truncated float ids."""
    with pytest.raises(ValueError, match=r"token_lists\[0\]"):
        D.build_sequences(lists, 8)


def test_unigram_statistics_reject_out_of_range_ids():
    ids = _ids()
    ids[0, 0] = 99
    with pytest.raises(ValueError, match="input_ids"):
        D.unigram_log_probs(ids, np.ones_like(ids), 30)
    log_p = D.unigram_log_probs(_ids(), np.ones_like(ids), 30)
    with pytest.raises(ValueError, match="labels"):
        D.unigram_baseline(log_p, np.array([5, 31]))


@pytest.mark.parametrize("text", ["", "{", "[]", '{"model": 3}', "null"])
def test_tokenizer_json_errors_are_named(text):
    """Finding: tokenizer errors surfaced as a bare Exception."""
    pytest.importorskip("tokenizers")
    with pytest.raises(ValueError, match="^tokenizer: "):
        D.tokenizer_from_json(text)


@pytest.mark.parametrize("text", ["", "{", "[1]", "nan", b"\xff"])
def test_json_loading_errors_are_named(text):
    """Finding: JSON errors surfaced as bare JSONDecodeError / KeyError."""
    with pytest.raises(ValueError, match="^history: expected"):
        loads_json("history", text)


# --------------------------------------------------------------------------- ops numerics
@pytest.mark.parametrize("scale", [1e19, 1e25, 1e37])
def test_float32_layernorm_is_stable_for_huge_inputs(scale):
    """Finding: float32 LayerNorm silently returned beta once the squared deviations
    overflowed (|x| >~ 1e19)."""
    rng = np.random.default_rng(0)
    x64 = rng.normal(size=(3, 16))
    x = (x64 * scale).astype(np.float32)
    gamma = np.ones(16, np.float32)
    beta = np.zeros(16, np.float32)
    y, _ = minibert_reference.layernorm_forward(x, gamma, beta)
    x_hat = (x64 - x64.mean(-1, keepdims=True)) / x64.std(-1, keepdims=True)
    np.testing.assert_allclose(y, x_hat, rtol=0, atol=1e-5)
    dx, _, _ = minibert_reference.layernorm_backward(np.ones_like(x), _)
    assert np.isfinite(dx).all()


def test_layernorm_unchanged_bit_for_bit_in_the_normal_range():
    """The safe variance path is exact (power-of-two scaling): moderate inputs that take it
    give the same bits as inputs that do not."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 32)).astype(np.float32)
    g, b = rng.normal(size=32).astype(np.float32), rng.normal(size=32).astype(np.float32)
    y, _ = minibert_reference.layernorm_forward(x, g, b, eps=0.0)
    big = np.float32(2.0 ** 40)
    y_big, _ = minibert_reference.layernorm_forward(x * big, g, b, eps=0.0)
    assert np.array_equal(y, y_big)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropy_finite_with_extreme_ignored_row(dtype):
    """Finding: cross-entropy was NaN when an *ignored* row had extreme logits (-inf * 0)."""
    big = np.finfo(dtype).max * 0.75  # logits - max overflows to -inf at the ignored label
    logits = np.zeros((2, 5), dtype)
    logits[1, 0], logits[1, 1] = -big, big
    labels = np.array([2, -100])
    for reduction in ("mean", "sum"):
        loss, cache = minibert_reference.cross_entropy_forward(logits, labels, reduction=reduction)
        assert np.isfinite(loss) and np.isclose(loss, np.log(5)), reduction
        (d,) = minibert_reference.cross_entropy_backward(dtype(1.0), cache)
        assert np.isfinite(d).all() and not d[1].any()
