"""The optimizer's fast paths against its readable specification: ``adam_step`` (fused, chunked,
pure) and ``adam_step_inplace`` (the same kernel writing into the caller's arrays) equal
``adam_step_textbook`` (the derivation's §5.1 line by line) step after step, with decoupled
weight decay, an exempt tensor and mixed-magnitude gradients."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from minibert_reference import optim as O
from minibert_spec.tolerances import F32_VS_F64_RTOL, F64_IDENTITY_RTOL

SHAPES = {"w": (7, 5), "b": (5,), "emb": (11, 3)}


def _problem(seed, dtype):
    rng = np.random.default_rng(seed)
    params = {k: rng.standard_normal(s).astype(dtype) for k, s in SHAPES.items()}
    grads = [{k: (rng.choice([-1.0, 1.0], s) * 10.0 ** rng.uniform(-5, 1, s)).astype(dtype)
              for k, s in SHAPES.items()} for _ in range(6)]
    return params, grads


KW = dict(lr=3e-3, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.05, no_decay=("b",))


@pytest.mark.equation("optim.adam", "optim.adamw")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fused_and_inplace_equal_the_textbook_float64(seed):
    params, grads = _problem(seed, np.float64)
    p_ref, s_ref = params, O.adam_init(params)
    p_fast, s_fast = copy.deepcopy(params), O.adam_init(params)
    p_in, s_in = copy.deepcopy(params), O.adam_init(params)
    for g in grads:
        before = copy.deepcopy(p_fast)
        p_ref, s_ref = O.adam_step_textbook(p_ref, g, s_ref, **KW)
        p_fast, s_fast = O.adam_step(p_fast, g, s_fast, **KW)
        assert all(np.array_equal(before[k], p) for k, p in before.items())  # pure: a new dict
        s_in = O.adam_step_inplace(p_in, g, s_in, **KW)
        assert s_in["step"] == s_ref["step"] == s_fast["step"]
        for k in SHAPES:
            scale = np.max(np.abs(p_ref[k]))
            for got in (p_fast[k], p_in[k]):
                np.testing.assert_allclose(got, p_ref[k], rtol=0,
                                           atol=F64_IDENTITY_RTOL * scale, err_msg=k)
            for mom in ("m", "v"):
                for got in (s_fast[mom][k], s_in[mom][k]):
                    np.testing.assert_allclose(got, s_ref[mom][k], rtol=F64_IDENTITY_RTOL,
                                               atol=0, err_msg=f"{mom}[{k}]")


@pytest.mark.parametrize("seed", [0, 1])
def test_inplace_float32_stays_float32_and_near_float64(seed):
    params, grads = _problem(seed, np.float32)
    p64 = {k: v.astype(np.float64) for k, v in params.items()}
    s64, s32 = O.adam_init(p64), O.adam_init(params)
    for g in grads:
        p64, s64 = O.adam_step_textbook(p64, {k: v.astype(np.float64) for k, v in g.items()},
                                        s64, **KW)
        s32 = O.adam_step_inplace(params, g, s32, **KW)
    for k in SHAPES:
        assert params[k].dtype == np.float32 and s32["m"][k].dtype == np.float32
        np.testing.assert_allclose(params[k], p64[k], rtol=F32_VS_F64_RTOL,
                                   atol=F32_VS_F64_RTOL * np.max(np.abs(p64[k])))


def test_inplace_rejects_bad_gradients_and_strided_params():
    params, grads = _problem(0, np.float64)
    state = O.adam_init(params)
    bad = {**grads[0], "w": np.full(SHAPES["w"], np.nan)}
    with pytest.raises(ValueError, match="w"):
        O.adam_step_inplace(params, bad, state)
    strided = {**params, "w": np.asfortranarray(params["w"])}
    with pytest.raises(ValueError, match="contiguous"):
        O.adam_step_inplace(strided, grads[0], O.adam_init(strided))
