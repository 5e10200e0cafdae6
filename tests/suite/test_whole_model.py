"""Issue 39: the whole-model verdict for any architecture (the ``whole_model`` row,
spec/suite/checks/wholemodel.py) from the function a user has, ``loss_and_grads(params,
batch...)`` or a forward / backward pair.  Correct models are green (a NumPy encoder, a
GPT-style decoder with learned positions and RoPE, the reference adapted in a line, float32-only
code with its stated floor); each planted backward bug is red naming the tensor, the index and
both values, and says which op rows to read next; the gradient's bookkeeping and the inputs'
purity are reds naming what is wrong; declarations the suite cannot take are refused in one
line."""

from __future__ import annotations

import re

import numpy as np
import pytest

from minibert_spec.numerics.finite_differences import gradcheck_dict, gradient_bookkeeping
from minibert_spec.suite import check_implementation, parametrize_with_checks, whole_model
from minibert_spec.suite.run import check_settings
from tests.examples import wm_decoder, wm_encoder

# the fixed example and three drawn ones: every planted bug shows on the fixed one already
SETTINGS = check_settings(max_examples=3)
RED = re.compile(r"whole model: d/d(?P<tensor>\S+) at index (?P<index>\([\d, ]+\)): analytic "
                 r"(?P<a>\S+), finite difference (?P<n>\S+) \((?P<k>\d+) of (?P<m>\d+) parameter")


def _report(model, ids=None):
    return check_implementation(model, oracle="off", settings=SETTINGS, ids=ids)


def _results(model, ids=None) -> dict:
    return {r.id: r for r in _report(model, ids).results}


def _encoder(bug=None, dtype=None):
    return whole_model(wm_encoder.make(bug, dtype), wm_encoder.init_params())


def _decoder(bug=None):
    forward, backward = wm_decoder.make(bug)
    return whole_model(forward=forward, backward=backward, params=wm_decoder.init_params())


@pytest.mark.parametrize("model", [
    pytest.param(lambda: "tests.examples.wm_encoder:loss_and_grads", id="encoder-bare-function"),
    pytest.param(lambda: "tests.examples.wm_decoder:MODEL", id="decoder-rope-pair"),
    pytest.param(lambda: "tests.examples.wm_reference:MODEL", id="reference-in-a-line"),
])
def test_a_correct_model_is_green(model):
    report = _report(model())
    assert report.exit_code() == 0, report.summary() + "\n" + "\n".join(
        f"{r.id}: {r.message}" for r in report.results)
    assert [op for op in report.verdicts()] == ["whole_model"]  # its row alone, and first
    assert {r.id: r.outcome for r in report.results} == {
        "fd[whole_model]": "passed", "invariant[whole_model.grads_match_params]": "passed",
        "invariant[whole_model.inputs_untouched]": "passed"}


def test_float32_only_code_runs_as_it_is_with_a_stated_floor():
    one = check_settings(max_examples=1)  # float32 costs ~3x (noise measured, wider steps)
    results = {r.id: r for r in check_implementation(_encoder(dtype=np.float32), oracle="off",
                                                     settings=one).results}
    fd = results["fd[whole_model]"]
    assert fd.outcome == "passed", fd.message
    floor = [c for c in fd.conventions if c.startswith("float32 code run as it is")]
    assert floor and "rounding floor of" in floor[0] and "not seen" in floor[0], fd.conventions
    # the floor is no blanket: the same float32 code with a backward bug is red
    red = check_implementation(_encoder("attn_scale", np.float32), oracle="off", settings=one,
                               ids=["fd[whole_model]"]).results[0]
    assert red.outcome == "failed" and RED.search(red.message), red.message


# (model, bug, the tensor the red names or None when the bug reaches several, a row to read)
BUGS = [
    (_encoder, "layernorm", None, "layernorm"),
    (_encoder, "attn_scale", None, "attention"),
    (_encoder, "gelu", None, "gelu"),
    (_encoder, "head_bias", "head.b", "cross_entropy"),
    (_decoder, "rope", None, "rope"),
    (_decoder, "head_bias", "lm_head.b", "cross_entropy"),
    (_decoder, "rmsnorm", None, "rmsnorm"),
    (_decoder, "wpe", "wpe", "position_embedding"),
]


@pytest.mark.parametrize("make, bug, tensor, row", BUGS,
                         ids=[f"{m.__name__[1:]}-{b}" for m, b, _, _ in BUGS])
def test_each_planted_backward_bug_is_red_naming_tensor_index_and_values(make, bug, tensor,
                                                                          row):
    results = _results(make(bug))
    fd = results["fd[whole_model]"]
    assert fd.outcome == "failed", f"{bug}: {fd.outcome}"
    m = RED.search(fd.message)
    assert m, fd.message
    if tensor is not None:
        assert m["tensor"] == tensor, fd.message
    a, n = float(m["a"]), float(m["n"])
    assert abs(a - n) > 1e-3 * max(abs(a), abs(n)), fd.message  # both values, and they differ
    disagree = re.search(r"^disagree: (.*) \(float64", fd.message, re.M)
    assert disagree and m["tensor"] in disagree.group(1).split(", "), fd.message
    assert re.search(rf"look next at the op rows [a-z_, ]*\b{row}\b", fd.message), fd.message
    # a gradient bug is no bookkeeping or purity problem
    assert results["invariant[whole_model.grads_match_params]"].outcome == "passed"
    assert results["invariant[whole_model.inputs_untouched]"].outcome == "passed"


def test_a_bug_only_in_ropes_backward_is_red_at_model_level_and_points_at_attention():
    """The RoPE backward turns the gradient the wrong way; its forward is right, so the loss is
    right and only the gradients of q and k, and what lies before them, are wrong: wrong up to
    the last layer's fused q/k/v projection, right from its output projection on."""
    fd = _results(_decoder("rope"))["fd[whole_model]"]
    assert fd.outcome == "failed"
    assert "wrong up to 'h.1.attn.c_attn.b', right from 'h.1.attn.c_proj.w' on" in fd.message
    assert "look next at the op rows attention, rope, softmax" in fd.message


@pytest.mark.slow  # the slow tier: two runs of the attention row (~20 s)
def test_the_op_rows_localise_the_rope_backward_bug_the_model_row_points_at():
    """The same decoder's attention, as its own op pair (``wm_decoder.ATTENTION``, the code the
    model runs), is judged by the causal RoPE rows (issue 39): correct, green; with the RoPE
    backward bug the model-level row saw, red in FD and the float64 oracle, naming dq's
    tensors (q and its bias), an index and both values -- the forward and the key path of
    the value stay green."""
    settings = check_settings(shrink=False, derandomize=True)
    report = check_implementation(wm_decoder.ATTENTION, ops=["attention"], settings=settings)
    assert report.verdicts()["attention"] == "ok", report.summary()
    assert {r.id for r in report.results if r.outcome == "passed"} >= {
        "fd[attention_causal_rope_half]", "oracle.backward[attention_causal_rope_half-f64]"}
    failed = {r.id: r.message for r in check_implementation(
        wm_decoder.ATTENTION_ROPE_BUG, ops=["attention"], settings=settings).failures()}
    assert {"fd[attention_causal_rope_half]",
            "oracle.backward[attention_causal_rope_half-f64]"} <= set(failed), sorted(failed)
    assert not [i for i in failed if i.startswith("oracle.forward")], sorted(failed)
    fd = failed["fd[attention_causal_rope_half]"]
    assert re.search(r"d/d(W_q|b_q)\b.*at index \(\d+(, \d+)*,?\): analytic -?\d\.\d+e[-+]\d+, "
                     r"finite difference -?\d\.\d+e[-+]\d+", fd), fd
    assert "d/dW_v" not in fd.split("worst")[0], fd  # the value path is right


def _wrapped(change):
    """The correct encoder's loss_and_grads with ``change(params, batch, grads)`` applied."""
    fn = wm_encoder.make()

    def loss_and_grads(params, input_ids, attention_mask, labels):
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
        loss, grads = fn(params, **batch)
        return loss, change(params, batch, grads)
    return whole_model(loss_and_grads, wm_encoder.init_params())


def _drop(p, b, g):
    return {k: v for k, v in g.items() if k != "layers.1.mlp.b1"}


def _extra(p, b, g):
    return {**g, "head.bias": g["head.b"]}


def _transposed(p, b, g):
    return {**g, "head.w": g["head.w"].T.copy()}


def _float32(p, b, g):
    return {**g, "pos_emb": g["pos_emb"].astype(np.float32)}


def _nan(p, b, g):
    g["tok_emb"][2, 3] = np.nan
    return g


def _mutates_params(p, b, g):
    p["head.b"][0] += 1.0
    return g


def _mutates_batch(p, b, g):
    b["attention_mask"][0, 0] = 0
    return g


@pytest.mark.parametrize("change, check, needle", [
    (_drop, "grads_match_params", "grads lacks 'layers.1.mlp.b1'"),
    (_extra, "grads_match_params", "grads has 'head.bias', which is not a parameter"),
    (_transposed, "grads_match_params", "grads['head.w']: shape (11, 8), expected (8, 11)"),
    (_float32, "grads_match_params", "grads['pos_emb']: dtype float32, expected float64"),
    (_nan, "grads_match_params", "grads['tok_emb']: not finite at index (2, 3): nan"),
    (_mutates_params, "inputs_untouched", "params['head.b'] changed at index (0,)"),
    (_mutates_batch, "inputs_untouched", "the batch['attention_mask'] changed at index (0, 0)"),
], ids=["missing-key", "extra-key", "shape", "dtype", "non-finite", "params", "batch"])
def test_bookkeeping_and_purity_reds_name_what_is_wrong(change, check, needle):
    # the purity check alone where the gradients are right: FD would only agree, at length
    ids = None if check == "grads_match_params" else [f"invariant[whole_model.{check}]"]
    results = _results(_wrapped(change), ids)
    r = results[f"invariant[whole_model.{check}]"]
    assert r.outcome == "failed" and needle in r.message, r.message
    # the FD check never runs on malformed gradients: it is red with the same reason
    if check == "grads_match_params":
        assert needle in results["fd[whole_model]"].message


def test_gradcheck_dict_localises_the_worst_tensor_to_its_index():
    """The numerics alone (FD of any function of a dict of arrays): f = sum(a * w) + |b|^2 / 2,
    a backward with one wrong entry of w is named at that index with both values."""
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(5)}
    a = rng.standard_normal((3, 4))

    def f(p):
        return float(np.sum(a * p["w"]) + 0.5 * np.sum(p["b"] ** 2))

    good = {"w": a.copy(), "b": params["b"].copy()}
    assert not gradcheck_dict(f, params, good, rng=rng).failed
    bad = {"w": a.copy(), "b": params["b"].copy()}
    bad["w"][2, 1] += 0.5
    res = gradcheck_dict(f, params, bad, rng=rng)
    assert [r.tensor for r in res.failed] == ["w"]
    assert res.worst.mode == "elementwise" and res.worst.index == (2, 1)
    assert res.worst.analytic == pytest.approx(a[2, 1] + 0.5)
    assert res.worst.numeric == pytest.approx(a[2, 1], rel=1e-6)
    # float32 in: run as float32, a floor stated, the wrong entry still found
    p32 = {k: v.astype(np.float32) for k, v in params.items()}
    res32 = gradcheck_dict(f, p32, bad, rng=rng)
    assert res32.dtype == "float32" and res32.noise > 0 and "float32" in res32.floor_note()
    assert res32.worst.index == (2, 1)


def test_gradient_bookkeeping_names_each_problem():
    p = {"w": np.zeros((2, 3)), "b": np.zeros(3)}
    assert gradient_bookkeeping(p, {"w": np.zeros((2, 3)), "b": np.zeros(3)}) == []
    assert gradient_bookkeeping(p, [np.zeros(3)]) == [
        "grads: expected a dict keyed like params, got list"]
    assert gradient_bookkeeping(p, {"w": np.zeros((3, 2)), "c": 1}) == [
        "grads lacks 'b' (a parameter: its gradient is missing)",
        "grads has 'c', which is not a parameter",
        "grads['w']: shape (3, 2), expected (2, 3) (the parameter's)"]


def _no_ids(params, batch):
    return 0.0, {}


@pytest.mark.parametrize("kwargs, needle", [
    (dict(loss_and_grads=_no_ids), "cannot tell what _no_ids's argument 'batch' holds: "
                                   "declare it in a line"),
    (dict(loss_and_grads=_no_ids, batch={"batch": "tokens"}),
     "batch: 'batch': expected one of ['ids', 'labels', 'mask'], got 'tokens'"),
    (dict(loss_and_grads=_no_ids, batch={"x": "ids"}), "batch: _no_ids has no argument 'x'"),
    (dict(loss_and_grads=wm_encoder.loss_and_grads, params={"w": np.zeros((3, 3))}),
     "vocab: no token table among the params"),
    (dict(loss_and_grads=wm_encoder.loss_and_grads, params={"w": np.zeros(3, dtype=int)}),
     "params['w']: expected a float32 or float64 NumPy array, got int64"),
    (dict(), "whole_model: expected loss_and_grads, or forward and backward"),
])
def test_a_declaration_the_suite_cannot_take_is_refused_in_one_line(kwargs, needle):
    kwargs.setdefault("params", wm_encoder.init_params())
    with pytest.raises(ValueError) as e:
        whole_model(**kwargs)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_declared_dict_batch_is_drawn_in_its_form():
    """A batch the signature cannot tell, declared in one line: the function gets a dict."""
    fn = wm_encoder.make()
    seen = []

    def step(params, batch):
        seen.append(sorted(batch))
        return fn(params, batch["x"], batch["m"], batch["y"])

    model = whole_model(step, wm_encoder.init_params(),
                        batch={"batch": {"x": "ids", "y": "labels", "m": "mask"}})
    assert _report(model).exit_code() == 0
    assert seen[0] == ["m", "x", "y"]


def test_a_bare_function_without_params_in_its_module_could_not_be_checked():
    report = check_implementation("minibert_spec.protocol.wholemodel:look_next", oracle="off")
    assert report.exit_code() == 2
    assert "has no params to check look_next at" in report.load_error


# the five lines of docs/check-your-implementation.md, on the decoder
@parametrize_with_checks(wm_decoder.MODEL, oracle="off")
def test_decoder_with_parametrize_with_checks(check):
    check()


def test_model_refuses_ops(capsys):
    from minibert_spec.cli import main

    assert main(["check", "tests.examples.wm_decoder:MODEL", "--model", "--ops", "linear"]) == 2
    assert "--model: runs the whole_model row alone" in capsys.readouterr().err


@pytest.mark.slow
def test_the_command_line_judges_a_whole_model(capsys):
    """``minibert check mymodel:MODEL --model``: worker processes, the table, exit 1 on the
    RoPE bug with its red, 0 on the correct decoder."""
    from minibert_spec.cli import main

    assert main(["check", "tests.examples.wm_decoder:MODEL", "--model", "--oracle", "off"]) == 0
    capsys.readouterr()
    assert main(["check", "tests.examples.wm_decoder:MODEL_ROPE_BUG", "--model", "--oracle",
                 "off", "--format", "json"]) == 1
    out = capsys.readouterr().out
    assert "look next at the op rows attention, rope, softmax" in out


def test_a_module_with_op_pairs_and_a_whole_model_gets_both_rows_the_model_first():
    """``WHOLE_MODEL = whole_model(...)`` beside op pairs: the whole_model row is the first of
    the report, beside the op rows; a bug in the model is red there and nowhere else."""
    import types

    import minibert_reference

    def impl(model):
        return types.SimpleNamespace(relu_forward=minibert_reference.relu_forward,
                                     relu_backward=minibert_reference.relu_backward,
                                     WHOLE_MODEL=model)

    report = check_implementation(impl(wm_decoder.MODEL), oracle="off", settings=SETTINGS,
                                  ops=["relu", "whole_model"], kinds=["fd", "invariant"])
    assert list(report.verdicts().items())[:2] == [("whole_model", "ok"), ("relu", "ok")]
    red = check_implementation(impl(wm_decoder.MODEL_ROPE_BUG), oracle="off",
                               settings=SETTINGS, ops=["relu", "whole_model"], kinds=["fd"])
    assert red.verdicts() == {"whole_model": "FAIL", "relu": "ok"}
