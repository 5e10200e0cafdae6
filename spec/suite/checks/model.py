"""The whole model: directional finite differences of every parameter tensor and of the input
embeddings (minibert_spec.numerics.finite_differences.model_gradcheck), every small preset and four
tiny configurations (the quick run's), float64; gradient bookkeeping, purity, float32 and linearity;
the two CE reductions; the inputs_embeds path against the input_ids path; gradient accumulation.
Fixed checks, written by hand: a model is no op pair with a case family."""

from __future__ import annotations

import functools

import numpy as np
from hypothesis import strategies as st

from minibert_reference.config import PRESETS, bert_tiny, mini_bert, seed001
from minibert_spec.numerics import identities as inv
from minibert_spec.numerics.fdcheck import assert_f32_close, max_abs
from minibert_spec.numerics.finite_differences import (
    assert_all_passed,
    check_gradients,
    loss_kwargs,
    model_gradcheck,
    random_batch,
    random_params,
    split_batch,
    uneven_mlm_batch,
)
from minibert_spec.numerics.identities import require
from minibert_spec.protocol import IGNORE_INDEX
from minibert_spec.suite.registry import check
from minibert_spec.tolerances import F64_IDENTITY_RTOL

# bert_base (110M parameters): finite differences and float64 identities over it are out of
# reach here
SMALL_PRESETS = sorted(p for p in PRESETS if p != "bert_base")
# every head at a size the quick run checks in milliseconds (the classifier head only here)
_TINY = dict(n_layers=2, hidden=8, n_heads=2, intermediate=16, max_len=8, vocab_size=13)
TINY_CONFIGS = {
    "tiny_mini_bert": lambda: mini_bert(**_TINY), "tiny_seed001": lambda: seed001(**_TINY),
    "tiny_bert_tiny": lambda: bert_tiny(**_TINY),
    "tiny_bert_classifier": lambda: bert_tiny(**_TINY, head="classifier", num_labels=3,
                                              activation="gelu_tanh")}
CONFIGS = {**{p: PRESETS[p] for p in SMALL_PRESETS}, **TINY_CONFIGS}
DTYPES = [np.float32, np.float64]

LOSS_IDS = {"mini_bert": ("loss.ce.mean", "loss.ce.backward.mean"),
            "seed001": ("loss.mse", "loss.mse.backward"),
            "bert_tiny": ("loss.ce.mean", "loss.ce.backward.mean", "mlm_head.tied")}
MODEL_IDS = ("block.postln", "residual.forward", "residual.backward", "model.backward")


def _quick(kw) -> bool:
    return kw["config"] in TINY_CONFIGS


def mini_bert_size(kw) -> bool:
    """A case at the mini_bert preset's own size (V=8192, H=192): seconds whatever the
    examples drawn, so in the deep tier alone; the tiny configurations and the smaller
    presets stand for the whole model in the standard one."""
    return "mini_bert" in (kw.get("config"), kw.get("preset"), kw.get("name"))


@functools.cache
def _random_params(impl, config_name, seed):
    return random_params(impl, CONFIGS[config_name](), seed)


def model_case(impl, config_name, dtype=np.float64, B=2, T=6, seed=0):
    """(config, random float64 params (gamma != 1, biases != 0) cast to ``dtype``, ids, the
    loss keywords of a padded batch)."""
    config = CONFIGS[config_name]()
    params = {k: v.astype(dtype) for k, v in _random_params(impl, config_name, seed).items()}
    batch = random_batch(config, B, T, seed)
    kw = loss_kwargs(config, batch)
    if "targets" in kw:
        kw["targets"] = kw["targets"].astype(dtype)
    if "token_type_ids" in batch:
        kw["token_type_ids"] = batch["token_type_ids"]
    return config, params, batch["input_ids"], kw


def _cases():
    """(config, B, T, reduction, seed, n_dirs): B > 1, T = 1 and T > 1 for both presets, and
    the summed reduction of the Mini-BERT MLM loss.  One random direction per tensor: the
    mini_bert tables (8192 x 192) dominate the cost, and every tensor is also covered at other
    shapes by the smoke test and, op by op, element-wise by the fd[<op>] checks.  The tiny
    configurations take two directions."""
    cases = [("mini_bert", 2, 1, "sum"), ("mini_bert", 3, 5, "mean"),
             ("seed001", 2, 1, "mean"), ("seed001", 3, 5, "mean"),
             ("bert_tiny", 2, 1, "mean"), ("bert_tiny", 3, 5, "mean")]
    out = [(f"{name}-B{B}-T{T}-{r}", dict(config=name, B=B, T=T, reduction=r, seed=B * 10 + T,
                                          n_dirs=1)) for name, B, T, r in cases]
    return out + [(f"{name}-B2-T6-mean", dict(config=name, B=2, T=6, reduction="mean", seed=1,
                                              n_dirs=2)) for name in TINY_CONFIGS]


def _loss_ids(kw):
    base = kw["config"].removeprefix("tiny_")
    if base not in LOSS_IDS:
        return MODEL_IDS
    return MODEL_IDS + (LOSS_IDS[base] if kw["reduction"] == "mean"
                        else ("loss.ce.sum", "loss.ce.backward.sum"))


@check("fd", "model", cases=_cases(), equations=_loss_ids, ops=("model",), quick=_quick,
       deep=mini_bert_size)
def model_gradients_match_finite_differences(impl, config, B, T, reduction, seed, n_dirs):
    """Every parameter tensor and the input embeddings, float64, padded batch."""
    cfg = CONFIGS[config]()
    results = model_gradcheck(impl, cfg, B=B, T=T, seed=seed, n_dirs=n_dirs,
                              reduction=reduction)
    checked = {r.tensor for r in results}
    expected = set(impl.param_shapes(cfg)) | {"input_embeddings"}
    assert checked == expected, f"checked tensors differ from the parameters: {checked ^ expected}"
    assert_all_passed(results)


@check("fd", "model.gradcheck", cases=[(p, {"preset": p}) for p in SMALL_PRESETS],
       ops=("model",), deep=mini_bert_size)
def model_gradcheck_cli_sizes(impl, preset):
    """The whole-model gradient check `minibert gradcheck` runs (B=2, T=8, one direction)."""
    config = PRESETS[preset]()
    results = model_gradcheck(impl, config, B=2, T=8, seed=0, n_dirs=1)
    expected = len(impl.param_shapes(config)) + 1
    assert len(results) == expected, f"{len(results)} tensors checked, expected {expected}"
    assert_all_passed(results)


def _bits(a):
    return (np.asarray(a).dtype, np.asarray(a).shape, np.asarray(a).tobytes())


def _to64(value):
    if isinstance(value, np.ndarray) and value.dtype == np.float32:
        return value.astype(np.float64)
    return value


def _close(got, want, scale, what):
    np.testing.assert_allclose(got, want, rtol=0, atol=F64_IDENTITY_RTOL * max(1.0, scale),
                               err_msg=what)


@check("invariant", "model.sum_is_n_times_mean", ops=("model", "cross_entropy"),
       equations=("loss.ce.mean", "loss.ce.sum", "loss.ce.backward.mean", "loss.ce.backward.sum"))
def model_sum_reduction_is_n_times_mean(impl):
    """Summed CE over the N predicted positions (BERT MLM slides) is N times the mean (Mini-BERT
    derivation §4): the loss and every gradient scale by N exactly."""
    config, params, ids, kw = model_case(impl, "mini_bert", B=3, T=5, seed=1)
    n = int(np.sum(kw["labels"] != IGNORE_INDEX))
    assert n > 1, f"the batch predicts {n} tokens; the check needs several"
    l_mean, g_mean, e_mean = impl.loss_and_grads(params, config, ids, **kw)
    l_sum, g_sum, e_sum = impl.loss_and_grads(params, config, ids, reduction="sum", **kw)
    _close(l_sum, n * l_mean, abs(l_sum), "loss")
    scale = max(float(np.abs(g).max()) for g in (e_sum, *g_sum.values()))
    for name in g_mean:
        _close(g_sum[name], n * g_mean[name], scale, name)
    _close(e_sum, n * e_mean, scale, "input embeddings")


@check("invariant", "model.inputs_embeds_path", cases=[(p, {"preset": p}) for p in SMALL_PRESETS],
       ops=("model",), deep=mini_bert_size)
def inputs_embeds_path_matches_input_ids_path(impl, preset):
    """forward(inputs_embeds=embed(ids)) gives the logits/hidden states, loss, block gradients
    and input gradient of forward(ids); the embedding tables, bypassed, get exactly zero."""
    config, params, ids, kw = model_case(impl, preset, B=3, T=5, seed=1)
    types = {k: kw.pop(k) for k in list(kw) if k == "token_type_ids"}
    x = impl.embed(params, config, ids, **types)
    assert x.shape == ids.shape + (config.hidden,) and x.dtype == np.float64, (
        f"embed: {x.shape} {x.dtype}, expected {ids.shape + (config.hidden,)} float64")
    out_ids, _ = impl.forward(params, config, ids, kw["attention_mask"], **types)
    out_emb, _ = impl.forward(params, config, None, kw["attention_mask"], inputs_embeds=x)
    _close(out_emb, out_ids, float(np.abs(out_ids).max()), "forward output")
    l_ids, g_ids, e_ids = impl.loss_and_grads(params, config, ids, **kw, **types)
    l_emb, g_emb, e_emb = impl.loss_and_grads(params, config, inputs_embeds=x, **kw)
    _close(l_emb, l_ids, abs(l_ids), "loss")
    scale = max(float(np.abs(g).max()) for g in (e_ids, *g_ids.values()))
    _close(e_emb, e_ids, scale, "input embeddings")
    assert list(g_emb) == list(params), "gradient keys (or their order) differ from params"
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


# --------------------------------------------------------------------------- accumulation
TINY = mini_bert(n_layers=1, hidden=8, n_heads=2, intermediate=16, max_len=8, vocab_size=13)
TINY_MSE = seed001(n_layers=1, hidden=8, n_heads=2, intermediate=16, max_len=8, vocab_size=13)
ACCUM = dict(equations=("accum.grad_mean",), ops=("accumulation",))


def _accum_batch(seed=0):
    b = uneven_mlm_batch(TINY, seed=seed)
    return b["input_ids"], b["attention_mask"], b["labels"]


def _split(ids, mask, labels, bounds):
    return split_batch({"input_ids": ids, "attention_mask": mask, "labels": labels}, bounds)


@check("invariant", "accumulation.uneven_and_empty", quick=True,
       **ACCUM)
def accumulation_equals_full_batch_with_uneven_and_empty_micro_batches(impl):
    """Micro-batches with 1, 6+0 (row 2 empty), 3+2 masked tokens, and row 2 alone (0 tokens):
    the accumulated loss and gradient equal the full batch's."""
    params = random_params(impl, TINY, seed=0)
    ids, mask, labels = _accum_batch()
    for bounds in ([0, 1, 3, 5], [0, 2, 3, 5], [0, 1, 2, 3, 4, 5]):
        require(inv.accumulation_matches_full_batch(impl, params, TINY,
                                                    _split(ids, mask, labels, bounds)))


@check("invariant", "accumulation.not_mean_of_means", **ACCUM)
def mean_of_micro_batch_means_would_be_wrong(impl):
    """The derivation's §8.2 recipe (average the micro-batch means) weights tokens unevenly:
    the accumulated loss must differ from it on this data."""
    params = random_params(impl, TINY, seed=1)
    ids, mask, labels = _accum_batch(seed=1)
    micro = list(_split(ids, mask, labels, [0, 1, 4, 5]))
    naive = np.mean([float(impl.loss(params, TINY, m["input_ids"], labels=m["labels"],
                                     attention_mask=m["attention_mask"])) for m in micro])
    loss, _ = impl.accumulate_gradients(impl, params, TINY, micro)
    assert abs(naive - loss) > 1e3 * F64_IDENTITY_RTOL * abs(loss), (
        f"accumulated loss {float(loss)!r} equals the mean of micro-batch means {naive!r}")


@check("fd", "accumulation", **ACCUM)
def accumulated_gradient_matches_finite_differences(impl):
    """The accumulated gradient against central differences of the full-batch loss."""
    params = random_params(impl, TINY, seed=2)
    ids, mask, labels = _accum_batch(seed=2)
    micro = _split(ids, mask, labels, [0, 2, 3, 5])
    _, grads = impl.accumulate_gradients(impl, params, TINY, micro)

    def full_loss(**p):
        return impl.loss(p, TINY, ids, labels=labels, attention_mask=mask)

    assert_all_passed(check_gradients(full_loss, params, grads, rng=np.random.default_rng(0),
                                      op="accumulate_gradients"))


@check("invariant", "accumulation.any_partition", given={"data": st.data()}, **ACCUM)
def accumulation_any_partition(impl, data):
    """Any partition of a random padded batch into micro-batches gives the full batch's loss
    and gradient."""
    B = data.draw(st.integers(2, 5), label="B")
    cuts = sorted(data.draw(st.sets(st.integers(1, B - 1), max_size=B - 1), label="cuts"))
    seed = data.draw(st.integers(0, 2**16), label="seed")
    rng = np.random.default_rng(seed)
    T = 5
    ids = rng.integers(0, 4, size=(B, T))
    mask = (np.arange(T)[None, :] < rng.integers(1, T + 1, size=B)[:, None]).astype(np.int64)
    picked = (rng.random((B, T)) < rng.random(B)[:, None]) & (mask == 1)
    picked[0, 0] = True  # the logical batch predicts something
    labels = np.where(picked, rng.integers(0, TINY.vocab_size, size=(B, T)), IGNORE_INDEX)
    params = random_params(impl, TINY, seed=seed % 7)
    require(inv.accumulation_matches_full_batch(impl, params, TINY,
                                                _split(ids, mask, labels, [0, *cuts, B])))


@check("invariant", "accumulation.mse_weights", quick=True, **ACCUM)
def accumulation_mse_head_weights_by_element_count(impl):
    """The MSE head: micro-batches of 1 and 4 rows weigh by their element counts."""
    params = random_params(impl, TINY_MSE, seed=3)
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 6, size=(5, 6))
    targets = rng.standard_normal((5, 6, TINY_MSE.hidden))
    micro = [{"input_ids": ids[a:b], "targets": targets[a:b]} for a, b in ((0, 1), (1, 5))]
    require(inv.accumulation_matches_full_batch(impl, params, TINY_MSE, micro))


# --------------------------------------------------------------------------- BERT switches
@check("invariant", "model.token_types", ops=("model", "token_type"),
       equations=("token_type.forward",))
def token_types_default_to_zero_and_matter(impl):
    """Token types default to 0, type 1 changes the output, a type id past the table (or a
    model without a type table given type ids) is refused."""
    from minibert_reference.config import bert_tiny

    config = bert_tiny(head="none", pooler=True)
    no_types = mini_bert(vocab_size=50)
    params = random_params(impl, config, seed=2)
    ids = np.random.default_rng(3).integers(0, config.vocab_size, size=(2, 5))
    h0, _ = impl.forward(params, config, ids)
    h_zero, _ = impl.forward(params, config, ids, token_type_ids=np.zeros_like(ids))
    h_one, _ = impl.forward(params, config, ids, token_type_ids=np.ones_like(ids))
    np.testing.assert_array_equal(h0, h_zero, err_msg="default token types are not all 0")
    assert h0.shape == (2, 5, config.hidden), f"hidden states {h0.shape}"
    assert np.abs(h0 - h_one).max() > 1e-3, "token type 1 does not change the output"
    from minibert_spec.numerics.asserts import raises

    with raises(ValueError, match="token_type_ids"):
        impl.forward(params, config, ids, token_type_ids=np.full_like(ids, 2))
    with raises(ValueError, match="token_type_ids"):
        impl.forward(impl.init_params(no_types), no_types, ids,
                     token_type_ids=np.zeros_like(ids))


@check("fd", "model.pooled_output", ops=("model", "pooler"), equations=("pooler.forward",))
def pooled_output_gradient_reaches_every_tensor(impl):
    """head "none" with the pooler: backward(dH, cache, d_pooled) adds the pooler's path; the
    directional derivative of <h, dH> + <pooled, dP> matches central differences."""
    from minibert_reference.config import bert_tiny
    from minibert_spec.numerics.finite_differences import directional_check

    config = bert_tiny(head="none", pooler=True, n_layers=1)
    params = random_params(impl, config, seed=6)
    rng = np.random.default_rng(7)
    ids = rng.integers(0, config.vocab_size, size=(2, 4))
    types = np.array([[0, 0, 1, 1], [0, 1, 1, 1]])
    dH, dP = rng.standard_normal((2, 4, config.hidden)), rng.standard_normal((2, config.hidden))

    _, cache = impl.forward(params, config, ids, token_type_ids=types)
    grads, _ = impl.backward(dH, cache, d_pooled=dP)
    assert np.abs(grads["pooler.W"]).max() > 0, "d pooler.W is identically 0"
    results = []
    for name in ("pooler.W", "embeddings.type.W", "layers.0.attn.W_o"):
        def f(v, _name=name):
            h, c = impl.forward({**params, _name: v}, config, ids, token_type_ids=types)
            return float((h * dH).sum() + (c.pooled * dP).sum())

        results.append(directional_check(f, params[name], grads[name], rng=rng, n_dirs=1,
                                         op="model[pooled]", tensor=name))
    assert_all_passed(results)


# --------------------------------------------------------------------------- bookkeeping
@check("invariant", "model.gradient_bookkeeping",
       cases=[(f"{c}-{np.dtype(d).name}", {"config": c, "dtype": d})
              for c in CONFIGS for d in DTYPES], ops=("model",), quick=_quick,
       deep=mini_bert_size)
def model_grads_match_params_keys_shapes_dtypes(impl, config, dtype):
    """Gradients have exactly the parameters' keys, shapes and dtypes, are finite, and every
    tensor takes part in the loss (a name mismatch that zeroes a gradient fails)."""
    name = config
    config, params, ids, kw = model_case(impl, name, dtype)
    initial = impl.init_params(config, seed=0, dtype=dtype)
    wrong = sorted({str(np.asarray(v).dtype) for v in initial.values()} - {np.dtype(dtype).name})
    assert not wrong, f"init_params(dtype={np.dtype(dtype).name}) gave {wrong} parameters"
    assert set(params) == set(impl.param_shapes(config)), (
        f"init_params keys differ from param_shapes: "
        f"{sorted(set(params) ^ set(impl.param_shapes(config)))}")
    require(inv.model_gradient_bookkeeping(impl, params, config, ids, kw)[:2])
    loss, grads, d_emb = impl.loss_and_grads(params, config, ids, **kw)
    assert np.asarray(loss).dtype == dtype, f"loss dtype {np.asarray(loss).dtype}, expected {dtype}"
    bad = [k for k, g in grads.items() if not np.all(np.isfinite(g))]
    assert not bad, f"non-finite gradients: {bad[:5]}"
    assert d_emb.shape == ids.shape + (config.hidden,) and d_emb.dtype == dtype, (
        f"d_embeddings {d_emb.shape} {d_emb.dtype}, expected {ids.shape + (config.hidden,)} "
        f"{dtype}")
    # every tensor takes part in the loss: a name mismatch that silently zeroes a gradient fails
    for name, g in grads.items():
        if name != "embeddings.position.W":  # rows >= T are legitimately 0, the rest are not
            assert np.any(g != 0), f"{name}: gradient is identically zero"


@check("invariant", "model.bit_identical_and_pure",
       cases=[(p, {"preset": p}) for p in SMALL_PRESETS], ops=("model",), deep=mini_bert_size)
def model_identical_calls_bit_identical_and_pure(impl, preset):
    """Two identical loss_and_grads calls give the same bits and leave params untouched."""
    config, params, ids, kw = model_case(impl, preset, np.float64)
    before = {k: v.copy() for k, v in params.items()}
    l1, g1, e1 = impl.loss_and_grads(params, config, ids, **kw)
    l2, g2, e2 = impl.loss_and_grads(params, config, ids, **kw)
    assert _bits(l1) == _bits(l2) and _bits(e1) == _bits(e2), (
        f"two identical calls differ: loss {l1!r} vs {l2!r}, or their input gradients")
    for name in g1:
        assert _bits(g1[name]) == _bits(g2[name]), name
    for name, v in params.items():
        assert _bits(v) == _bits(before[name]), f"params[{name!r}] was modified"


@check("invariant", "model.float32_vs_float64",
       cases=[(p, {"preset": p}) for p in SMALL_PRESETS], ops=("model",), deep=mini_bert_size)
def model_float32_agrees_with_float64(impl, preset):
    """float32 params (rounded from the float64 ones) through the same code: logits, loss,
    every gradient and the input gradient agree with the float64 run on those rounded values."""
    config, p32, ids, kw32 = model_case(impl, preset, np.float32)
    p64 = {k: v.astype(np.float64) for k, v in p32.items()}
    kw64 = {k: _to64(v) for k, v in kw32.items()}
    out64, _ = impl.forward(p64, config, ids, kw64["attention_mask"])
    out32, _ = impl.forward(p32, config, ids, kw32["attention_mask"])
    assert_f32_close(out32, out64, max_abs(out64), f"{preset}: forward output")
    l64, g64, e64 = impl.loss_and_grads(p64, config, ids, **kw64)
    l32, g32, e32 = impl.loss_and_grads(p32, config, ids, **kw32)
    assert_f32_close(l32, l64, abs(float(l64)), f"{preset}: loss")
    scale = max_abs(e64, *g64.values())
    for name in g64:
        assert_f32_close(g32[name], g64[name], scale, f"{preset}: d{name}")
    assert_f32_close(e32, e64, scale, f"{preset}: d input_embeddings")


@check("invariant", "model.backward_linear_in_upstream",
       cases=[(p, {"preset": p}) for p in SMALL_PRESETS], ops=("model",), deep=mini_bert_size)
def model_backward_zero_and_linear_in_upstream(impl, preset):
    """backward(0) == 0 exactly and backward is linear in the upstream gradient."""
    config, params, ids, kw = model_case(impl, preset, np.float64)
    out, cache = impl.forward(params, config, ids, kw["attention_mask"])
    rng = np.random.default_rng(7)
    d1, d2 = rng.standard_normal(out.shape), rng.standard_normal(out.shape)
    g0, e0 = impl.backward(np.zeros_like(out), cache)
    nonzero = [k for k, g in g0.items() if np.any(g != 0)] + (["d_embeddings"]
                                                               if np.any(e0 != 0) else [])
    assert not nonzero, f"backward(0) is not 0 for {nonzero[:5]}"
    a, b = 0.7, -1.3
    g1, e1 = impl.backward(d1, cache)
    g2, e2 = impl.backward(d2, cache)
    g12, e12 = impl.backward(a * d1 + b * d2, cache)
    pairs = [(g12[n], a * g1[n] + b * g2[n], np.abs(a * g1[n]) + np.abs(b * g2[n]))
             for n in g1] + [(e12, a * e1 + b * e2, np.abs(a * e1) + np.abs(b * e2))]
    scale = max(float(t.max()) for _, _, t in pairs)
    for got, want, _ in pairs:
        np.testing.assert_allclose(got, want, rtol=0, atol=F64_IDENTITY_RTOL * scale)
