"""The whole model: directional finite differences of every parameter tensor and of the input
embeddings (spec.numerics.finite_differences.model_gradcheck), every small preset, float64;
the two CE reductions; the inputs_embeds path against the input_ids path; gradient accumulation."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from reference.config import PRESETS, mini_bert, seed001
from spec.numerics import identities as inv
from spec.numerics.finite_differences import (
    assert_all_passed,
    check_gradients,
    model_gradcheck,
    random_batch,
    random_params,
    split_batch,
    uneven_mlm_batch,
)
from spec.numerics.identities import require
from spec.protocol import IGNORE_INDEX
from spec.suite.registry import check
from spec.tolerances import F64_IDENTITY_RTOL

# bert_base (110M parameters): finite differences and float64 identities over it are out of
# reach here
SMALL_PRESETS = sorted(p for p in PRESETS if p != "bert_base")

LOSS_IDS = {"mini_bert": ("loss.ce.mean", "loss.ce.backward.mean"),
            "seed001": ("loss.mse", "loss.mse.backward"),
            "bert_tiny": ("loss.ce.mean", "loss.ce.backward.mean", "mlm_head.tied")}
MODEL_IDS = ("block.postln", "residual.forward", "residual.backward", "model.backward")


def _cases():
    """(preset, B, T, reduction): B > 1, T = 1 and T > 1 for both presets, and the summed
    reduction of the Mini-BERT MLM loss.  One random direction per tensor: the mini_bert
    tables (8192 x 192) dominate the cost, and every tensor is also covered at other shapes by
    the smoke test and, op by op, element-wise by the fd[<op>] checks."""
    cases = [("mini_bert", 2, 1, "sum"), ("mini_bert", 3, 5, "mean"),
             ("seed001", 2, 1, "mean"), ("seed001", 3, 5, "mean"),
             ("bert_tiny", 2, 1, "mean"), ("bert_tiny", 3, 5, "mean")]
    return [(f"{preset}-B{B}-T{T}-{reduction}", dict(preset=preset, B=B, T=T, reduction=reduction))
            for preset, B, T, reduction in cases]


def _loss_ids(kw):
    return MODEL_IDS + (LOSS_IDS[kw["preset"]] if kw["reduction"] == "mean"
                        else ("loss.ce.sum", "loss.ce.backward.sum"))


@check("fd", "model", cases=_cases(), equations=_loss_ids, ops=("model",))
def model_gradients_match_finite_differences(impl, preset, B, T, reduction):
    """Every parameter tensor and the input embeddings, float64, padded batch."""
    config = PRESETS[preset]()
    results = model_gradcheck(impl, config, B=B, T=T, seed=B * 10 + T, n_dirs=1,
                              reduction=reduction)
    checked = {r.tensor for r in results}
    expected = set(impl.param_shapes(config)) | {"input_embeddings"}
    assert checked == expected, f"checked tensors differ from the parameters: {checked ^ expected}"
    assert_all_passed(results)


@check("fd", "model.gradcheck", cases=[(p, {"preset": p}) for p in SMALL_PRESETS],
       ops=("model",))
def model_gradcheck_cli_sizes(impl, preset):
    """The whole-model gradient check `minibert gradcheck` runs (B=2, T=8, one direction)."""
    config = PRESETS[preset]()
    results = model_gradcheck(impl, config, B=2, T=8, seed=0, n_dirs=1)
    expected = len(impl.param_shapes(config)) + 1
    assert len(results) == expected, f"{len(results)} tensors checked, expected {expected}"
    assert_all_passed(results)


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


@check("invariant", "model.sum_is_n_times_mean", ops=("model", "cross_entropy"),
       equations=("loss.ce.mean", "loss.ce.sum", "loss.ce.backward.mean", "loss.ce.backward.sum"))
def model_sum_reduction_is_n_times_mean(impl):
    """Summed CE over the N predicted positions (BERT MLM slides) is N times the mean (Mini-BERT
    derivation §4): the loss and every gradient scale by N exactly."""
    config, params, batch = _setup(impl, "mini_bert")
    kw = _kw(config, batch)
    n = int(np.sum(batch["labels"] != IGNORE_INDEX))
    assert n > 1, f"the batch predicts {n} tokens; the check needs several"
    l_mean, g_mean, e_mean = impl.loss_and_grads(params, config, batch["input_ids"], **kw)
    l_sum, g_sum, e_sum = impl.loss_and_grads(params, config, batch["input_ids"],
                                              reduction="sum", **kw)
    _close(l_sum, n * l_mean, abs(l_sum), "loss")
    scale = max(float(np.abs(g).max()) for g in (e_sum, *g_sum.values()))
    for name in g_mean:
        _close(g_sum[name], n * g_mean[name], scale, name)
    _close(e_sum, n * e_mean, scale, "input embeddings")


@check("invariant", "model.inputs_embeds_path", cases=[(p, {"preset": p}) for p in SMALL_PRESETS],
       ops=("model",))
def inputs_embeds_path_matches_input_ids_path(impl, preset):
    """forward(inputs_embeds=embed(ids)) gives the logits/hidden states, loss, block gradients
    and input gradient of forward(ids); the embedding tables, bypassed, get exactly zero."""
    config, params, batch = _setup(impl, preset)
    ids, kw = batch["input_ids"], _kw(config, batch)
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


@check("invariant", "accumulation.uneven_and_empty", **ACCUM)
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


@check("invariant", "accumulation.mse_weights", **ACCUM)
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
    from reference.config import bert_tiny

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
    from spec.numerics.asserts import raises

    with raises(ValueError, match="token_type_ids"):
        impl.forward(params, config, ids, token_type_ids=np.full_like(ids, 2))
    with raises(ValueError, match="token_type_ids"):
        impl.forward(impl.init_params(no_types), no_types, ids,
                     token_type_ids=np.zeros_like(ids))


@check("fd", "model.pooled_output", ops=("model", "pooler"), equations=("pooler.forward",))
def pooled_output_gradient_reaches_every_tensor(impl):
    """head "none" with the pooler: backward(dH, cache, d_pooled) adds the pooler's path; the
    directional derivative of <h, dH> + <pooled, dP> matches central differences."""
    from reference.config import bert_tiny
    from spec.numerics.finite_differences import directional_check

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
