"""The whole model: directional finite differences of every parameter tensor and of the input
embeddings (spec.gradcheck.model_gradcheck), both presets, float64; the two CE reductions; the
inputs_embeds path against the input_ids path."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from reference.config import PRESETS
from spec.gradcheck import assert_all_passed, model_gradcheck, random_batch, random_params
from spec.tolerances import F64_IDENTITY_RTOL

# bert_base (110M parameters) is built and run by tests/test_bert.py; finite differences and
# float64 identities over it are out of reach here
SMALL_PRESETS = sorted(p for p in PRESETS if p != "bert_base")

LOSS_IDS = {"mini_bert": ("loss.ce.mean", "loss.ce.backward.mean"),
            "seed001": ("loss.mse", "loss.mse.backward"),
            "bert_tiny": ("loss.ce.mean", "loss.ce.backward.mean", "mlm_head.tied")}
MODEL_IDS = ("block.postln", "residual.forward", "residual.backward", "model.backward")


def _cases():
    """(preset, B, T, reduction): B > 1, T = 1 and T > 1 for both presets, and the summed
    reduction of the Mini-BERT MLM loss.  One random direction per tensor: the mini_bert
    tables (8192 x 192) dominate the cost, and every tensor is also covered at other shapes by
    the smoke test and, op by op, element-wise in test_ops_fd."""
    cases = [("mini_bert", 2, 1, "sum"), ("mini_bert", 3, 5, "mean"),
             ("seed001", 2, 1, "mean"), ("seed001", 3, 5, "mean"),
             ("bert_tiny", 2, 1, "mean"), ("bert_tiny", 3, 5, "mean")]
    out = []
    for preset, B, T, reduction in cases:
        loss_ids = LOSS_IDS[preset] if reduction == "mean" else ("loss.ce.sum",
                                                                   "loss.ce.backward.sum")
        out.append(pytest.param(preset, B, T, reduction, id=f"{preset}-B{B}-T{T}-{reduction}",
                                marks=pytest.mark.equation(*MODEL_IDS, *loss_ids)))
    return out


@pytest.mark.parametrize("preset,B,T,reduction", _cases())
def test_model_gradients_match_finite_differences(impl, preset, B, T, reduction):
    """Every parameter tensor and the input embeddings, float64, padded batch."""
    config = PRESETS[preset]()
    results = model_gradcheck(impl, config, B=B, T=T, seed=B * 10 + T, n_dirs=1,
                              reduction=reduction)
    assert {r.tensor for r in results} == set(impl.param_shapes(config)) | {"input_embeddings"}
    assert_all_passed(results)


@functools.cache
def _setup(impl, preset, B=3, T=5, seed=1):
    config = PRESETS[preset]()
    return config, random_params(impl, config, seed), random_batch(config, B, T, seed)


def _kw(config, batch):
    kw = dict(attention_mask=batch["attention_mask"])
    if config.head == "mlm":
        kw["labels"] = batch["labels"]
    else:
        kw["targets"] = batch["targets"]
    if "token_type_ids" in batch:
        kw["token_type_ids"] = batch["token_type_ids"]
    return kw


def _close(got, want, scale, what):
    np.testing.assert_allclose(got, want, rtol=0, atol=F64_IDENTITY_RTOL * max(1.0, scale),
                               err_msg=what)


@pytest.mark.equation("loss.ce.mean", "loss.ce.sum", "loss.ce.backward.mean",
                      "loss.ce.backward.sum")
def test_model_sum_reduction_is_n_times_mean(impl):
    """Summed CE over the N predicted positions (BERT MLM slides) is N times the mean (Mini-BERT
    derivation §4): the loss and every gradient scale by N exactly."""
    config, params, batch = _setup(impl, "mini_bert")
    kw = _kw(config, batch)
    n = int(np.sum(batch["labels"] != -100))
    assert n > 1
    l_mean, g_mean, e_mean = impl.loss_and_grads(params, config, batch["input_ids"], **kw)
    l_sum, g_sum, e_sum = impl.loss_and_grads(params, config, batch["input_ids"],
                                              reduction="sum", **kw)
    _close(l_sum, n * l_mean, abs(l_sum), "loss")
    scale = max(float(np.abs(g).max()) for g in (e_sum, *g_sum.values()))
    for name in g_mean:
        _close(g_sum[name], n * g_mean[name], scale, name)
    _close(e_sum, n * e_mean, scale, "input embeddings")


@pytest.mark.parametrize("preset", SMALL_PRESETS)
def test_inputs_embeds_path_matches_input_ids_path(impl, preset):
    """forward(inputs_embeds=embed(ids)) gives the logits/hidden states, loss, block gradients
    and input gradient of forward(ids); the embedding tables, bypassed, get exactly zero."""
    config, params, batch = _setup(impl, preset)
    ids, kw = batch["input_ids"], _kw(config, batch)
    types = {k: kw.pop(k) for k in list(kw) if k == "token_type_ids"}
    x = impl.embed(params, config, ids, **types)
    assert x.shape == ids.shape + (config.hidden,) and x.dtype == np.float64
    out_ids, _ = impl.forward(params, config, ids, kw["attention_mask"], **types)
    out_emb, _ = impl.forward(params, config, None, kw["attention_mask"], inputs_embeds=x)
    _close(out_emb, out_ids, float(np.abs(out_ids).max()), "forward output")
    l_ids, g_ids, e_ids = impl.loss_and_grads(params, config, ids, **kw, **types)
    l_emb, g_emb, e_emb = impl.loss_and_grads(params, config, inputs_embeds=x, **kw)
    _close(l_emb, l_ids, abs(l_ids), "loss")
    scale = max(float(np.abs(g).max()) for g in (e_ids, *g_ids.values()))
    _close(e_emb, e_ids, scale, "input embeddings")
    assert list(g_emb) == list(params)
    tied = config.head == "mlm" and config.mlm_style == "bert"
    for name in params:
        if tied and name == "embeddings.token.W":
            # the tied table is also the MLM decoder: the bypassed path keeps that share only
            assert np.any(g_emb[name] != 0), f"{name}: the decoder's share is missing"
            assert np.any(g_ids[name] != g_emb[name]), f"{name}: the lookup's share is missing"
        elif name.startswith("embeddings."):
            assert np.all(g_emb[name] == 0), f"{name}: bypassed table got a gradient"
            assert np.any(g_ids[name] != 0), f"{name}: the ids path should reach the table"
        else:
            _close(g_emb[name], g_ids[name], scale, name)
