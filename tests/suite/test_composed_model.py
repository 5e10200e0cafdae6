"""Issue 39: the whole-model verdict for code written as op rows (spec/protocol/composed.py): a
tiny model composed of the implementation's own rows, the reference's standing in for the
others, judged by the ``whole_model`` row.  Green on the correct builds of the realstyle
examples, classy_adapter and the reference; red on each planted backward bug, naming a tensor,
an index and both values; the implementation's rows are the ones called (a composition that
quietly used the reference's would be green on every bug: shown below); no usable row is a
refusal in one line, exit 2."""

from __future__ import annotations

import re

import pytest

from minibert_spec.protocol import composed as C
from minibert_spec.protocol import load_impl
from minibert_spec.protocol.composed import composed_model
from minibert_spec.protocol.table import OPS
from minibert_spec.suite import check_implementation
from minibert_spec.suite.checks.decoder import DecoderRowModel, model_of_rows
from minibert_spec.suite.run import check_settings

SETTINGS = check_settings(max_examples=3)
RED = re.compile(r"whole model: d/d(?P<tensor>\S+) at index (?P<index>\([\d, ]+\)): analytic "
                 r"(?P<a>\S+), finite difference (?P<n>\S+) \(")

# spec -> the rows of its own the composed model must call
GREEN = {
    "tests.examples.realstyle_microgpt_norm:correct": ("rmsnorm",),
    "tests.examples.realstyle_plain_ln_block:correct": ("block",),
    "tests.examples.realstyle_llama_block:correct": ("block",),
    "tests.examples.realstyle_causal_attn": ("attention",),
    "tests.examples.realstyle_lm_head_loss:correct": ("linear_cross_entropy",),
    "tests.examples.realstyle_block_mask": ("block",),
    "tests.examples.realstyle_tutorial": ("layernorm", "attention", "linear"),  # Linear: no b
    "tests.examples.realstyle_numpy_transformer": ("embedding", "relu"),
    # its softmax computes the reference attention's probabilities (it has no attention row)
    "tests.examples.realstyle_minigpt": ("softmax", "ffn", "cross_entropy"),
    "tests.examples.classy_adapter": ("embedding", "layernorm", "softmax", "linear", "relu",
                                      "cross_entropy"),
    # every row a place: its block, then a block of its parts per FFN row, rmsnorm the final
    "minibert_reference": ("embedding", "position_embedding", "block", "layernorm", "attention",
                           "ffn", "swiglu", "linear", "gelu", "rmsnorm", "linear_cross_entropy"),
}
# the planted backward bugs (each example's docstring): (spec, its BUGS switched on, the row)
BUGGY = [
    ("tests.examples.realstyle_microgpt_norm:buggy", None, "rmsnorm"),
    ("tests.examples.realstyle_plain_ln_block:buggy", None, "block"),
    ("tests.examples.realstyle_llama_block:buggy", None, "block"),
    ("tests.examples.realstyle_lm_head_loss:buggy", None, "linear_cross_entropy"),
    ("tests.examples.broken_impl", None, "layernorm"),  # classy_adapter with its LayerNorm bug
    ("tests.examples.realstyle_causal_attn", "attention", "attention"),
    ("tests.examples.realstyle_tutorial", "linear", "linear"),
    ("tests.examples.realstyle_tutorial", "layernorm", "layernorm"),
    ("tests.examples.realstyle_tutorial", "attention", "attention"),
    ("tests.examples.realstyle_numpy_transformer", "embedding", "embedding"),
    ("tests.examples.realstyle_numpy_transformer", "relu", "relu"),
    ("tests.examples.realstyle_minigpt", "ffn", "ffn"),
    ("tests.examples.realstyle_minigpt", "softmax", "softmax"),  # inside the attention
]


def _switched_on(monkeypatch, spec: str, bug: str | None) -> None:
    """The example's planted bug as MINIBERT_EXAMPLE_BUGS=<bug> switches it on (its BUGS set,
    read at call time)."""
    if bug is not None:
        import importlib

        module = importlib.import_module(spec.partition(":")[0])
        monkeypatch.setattr(module, "BUGS", {bug})


def _fd(model):
    return check_implementation(model, oracle="off", settings=SETTINGS)


def _called(model) -> set[str]:
    return set(model.proxy.calls())


@pytest.mark.parametrize("spec", list(GREEN))
def test_the_composed_model_of_correct_rows_is_green(spec):
    model = composed_model(load_impl(spec), spec)
    report = _fd(model)
    assert report.exit_code() == 0, report.summary()
    assert report.verdicts() == {"whole_model": "ok"}
    own = [op for op, who in model.rows.items() if who == "implementation"]
    assert set(GREEN[spec]) == set(own)
    # each of its rows was called, forward and backward, through its own proxy
    for op in own:
        assert set(OPS[op].pair) <= _called(model), (op, _called(model))
    line = next(c for r in report.results for c in r.conventions if "composed model" in c)
    assert f"the implementation's rows {', '.join(own)}" in line


@pytest.mark.parametrize(("spec", "bug", "row"), BUGGY)
def test_a_planted_bug_in_a_row_is_red_naming_a_tensor_an_index_and_both_values(
        spec, bug, row, monkeypatch):
    _switched_on(monkeypatch, spec, bug)
    model = composed_model(load_impl(spec), spec)
    assert model.rows[row] == "implementation"
    report = _fd(model)
    assert report.exit_code() == 1
    (red,) = [r for r in report.results if r.outcome == "failed"]
    assert red.id == "fd[whole_model]"
    m = RED.search(red.message)
    assert m and m["tensor"] in model.params, red.message
    assert float(m["a"]) != float(m["n"])
    # the red says which of its rows to read: the planted bug's among them
    assert re.search(rf"--ops [\w ]*\b{row}\b", red.message), red.message


def test_a_composition_that_used_the_reference_in_place_of_the_rows_would_be_green(
        monkeypatch):
    """The red above needs the implementation's own rows: composed of the reference's alone
    (the bug the checks guard against), the planted bug is green -- so the tests above can fail
    on that mistake."""
    spec = "tests.examples.realstyle_microgpt_norm:buggy"
    monkeypatch.setattr(C.ComposedModel, "_row", lambda self, op: (
        self.rows.setdefault(op, "implementation" if op in self.own else "reference"),
        tuple(getattr(C._reference(op), n) for n in OPS[op].pair))[1])
    model = composed_model(load_impl(spec), spec)
    assert model.rows["rmsnorm"] == "implementation"  # what its report would claim
    assert _fd(model).exit_code() == 0  # yet green: the bug never ran
    assert not _called(model)  # and the proxy says so: the green-path test above fails


def test_a_model_is_composed_in_the_declared_form():
    """LLaMA's block declares pre-norm, causal, RMSNorm, SwiGLU, RoPE half: its keys and the
    reference's final norm follow; microgpt's gainless RMSNorm gets no gamma."""
    llama = composed_model(load_impl("tests.examples.realstyle_llama_block:correct"))
    assert llama.block_form == {"norm": "pre", "causal": True, "normalization": "rmsnorm",
                                "ffn": "swiglu", "rope": "half"}
    assert "layers.1.swiglu.W_3" in llama.params and "final_ln.beta" not in llama.params
    assert "rope=half" in llama.describe()
    micro = composed_model(load_impl("tests.examples.realstyle_microgpt_norm:correct"))
    assert not any("gamma" in k for k in micro.params)


def test_a_softmax_row_computes_the_reference_attentions_probabilities():
    """realstyle_minigpt has a softmax row (attention scores only: ranks (4,), a key mask) and
    no attention: its softmax runs inside the reference's attention, and the verdict names it
    among its rows (its planted softmax bug: red, BUGGY above)."""
    model = composed_model(load_impl("tests.examples.realstyle_minigpt"))
    assert model.unused == [] and model.softmax_inside
    assert model.rows["softmax"] == "implementation" and model.rows["attention"] == "reference"
    assert "attention (its softmax inside)" in model.describe()


def _softmax_row(**caps):
    """The reference's softmax as an implementation's row, with ``caps`` declared."""
    import types

    import minibert_reference

    return types.SimpleNamespace(softmax_forward=minibert_reference.softmax_forward,
                                 softmax_backward=minibert_reference.softmax_backward,
                                 CAPABILITIES=caps)


def test_a_softmax_alone_is_composed_and_its_mask_is_the_scores_shape():
    """A softmax row alone makes a model (the rest the reference's); in a causal attention it
    gets the causal mask in the scores' shape, as the protocol's softmax takes it (the
    reference's softmax_forward refuses any other shape)."""
    for causal in (False, True):
        impl = _softmax_row(attention={"causal": (causal,)})
        model = composed_model(impl, "softmax_only")
        assert model.softmax_inside and model.attn["causal"] is causal
        assert _fd(model).exit_code() == 0
        assert {"softmax_forward", "softmax_backward"} <= _called(model)


def test_a_softmax_it_cannot_place_is_named_with_the_reason():
    """A causal attention masks its scores: a softmax that does not claim a mask is not called
    with one.  A declared softmax_eps: its row accepts the max-held derivative, eps-sized terms
    from the one the model's finite differences see (a red on correct code, guarded_rows')."""
    impl = _softmax_row(attention={"causal": (True,)}, key_mask=False)
    model = composed_model(impl, "unmasked")
    assert model.unused == ["softmax"] and not model.softmax_inside
    assert "softmax (the causal attention masks its scores" in model.describe()
    model = composed_model(load_impl("tests.examples.guarded_rows"))
    assert "softmax" in model.unused and not model.softmax_inside
    assert "softmax (its declared softmax_eps" in model.describe()
    assert _fd(model).exit_code() == 0


def test_the_reference_attention_takes_its_softmax_as_an_argument():
    """attention's ``softmax`` argument: its own pair given reproduces the default exactly (one
    definition of attention's maths, the softmax swapped in), and a wrong softmax backward
    given is the one the attention's backward runs."""
    import numpy as np

    from minibert_reference.ops import _attention_backward, _attention_forward
    from minibert_reference.ops.activations import _softmax_backward, _softmax_forward

    rng = np.random.default_rng(0)
    x, dy = rng.standard_normal((2, 2, 5, 8))
    W = [rng.standard_normal((8, 8)) for _ in range(4)]
    kw = {"n_heads": 2, "causal": True, "mask": np.array([[True] * 5, [True] * 3 + [False] * 2])}
    y, cache = _attention_forward(x, *W, **kw)
    y2, cache2 = _attention_forward(x, *W, **kw, softmax=(_softmax_forward, _softmax_backward))
    assert cache.softmax is None and np.array_equal(y, y2)
    for g, g2 in zip(_attention_backward(dy, cache), _attention_backward(dy, cache2)):
        assert g is g2 is None or np.array_equal(g, g2)
    _, wrong = _attention_forward(x, *W, **kw, softmax=(
        _softmax_forward, lambda dp, c: (c.p * dp,)))  # the Jacobian's subtraction dropped
    assert not np.allclose(_attention_backward(dy, wrong)[0], _attention_backward(dy, cache)[0])


def _f32_layernorm(bug: bool):
    """A LayerNorm computing in float32 whatever it is given (the reference's, cast)."""
    import types

    import numpy as np

    import minibert_reference as R

    def forward(x, gamma, beta, eps=1e-12):
        return R.layernorm_forward(*(a.astype(np.float32) for a in (x, gamma, beta)), eps)

    def backward(dy, cache):
        dx, dgamma, dbeta = R.layernorm_backward(dy.astype(np.float32), cache)
        return dx, dgamma * np.float32(1.01 if bug else 1.0), dbeta

    return types.SimpleNamespace(layernorm_forward=forward, layernorm_backward=backward)


def test_float32_only_rows_make_a_float32_model_judged_above_its_floor():
    """Mixed with the reference's float64 rows, float32 rows would be float32 noise under
    float64 differences (a red on correct code): the model runs at float32 params, its floor
    stated; a 1 % dgamma error is still red."""
    model = composed_model(_f32_layernorm(bug=False), "f32")
    assert model.f32 and all(v.dtype.name == "float32" for v in model.params.values())
    report = _fd(model)
    assert report.exit_code() == 0, report.summary()
    assert any("float32 code run as it is" in c for r in report.results for c in r.conventions)
    red = _fd(composed_model(_f32_layernorm(bug=True), "f32"))
    assert red.exit_code() == 1
    assert "gamma" in next(r.message for r in red.results if r.outcome == "failed")


def test_a_row_that_raises_is_red_not_a_refusal():
    """Only a form the implementation does not declare refuses the composition; a row that
    raises (a ValueError included, whatever the dtype) is the checks' to judge: red."""
    import types

    import minibert_reference

    def backward(dy, cache):
        raise ValueError("dy: broken")

    impl = types.SimpleNamespace(relu_forward=minibert_reference.relu_forward,
                                 relu_backward=backward)
    report = _fd(composed_model(impl, "raising"))
    assert report.exit_code() == 1
    assert "dy: broken" in next(r.message for r in report.results if r.outcome == "failed")


def test_no_usable_row_is_a_refusal_in_one_line():
    import types

    import minibert_reference

    heads_only = types.SimpleNamespace(split_heads=minibert_reference.split_heads,
                                       merge_heads=minibert_reference.merge_heads)
    with pytest.raises(ValueError, match=r"provides no whole model and no op row a composed "
                                         r"model can use") as e:
        composed_model(heads_only, "heads_only")
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_the_command_line_composes_op_rows(capsys):
    """``minibert check tests.examples.realstyle_microgpt_norm:correct --model``: green with the
    rows named; ``:buggy`` red; a module of no usable row exit 2 with its one line."""
    from minibert_spec.cli import main

    assert main(["check", "tests.examples.realstyle_microgpt_norm:correct", "--model",
                 "--oracle", "off"]) == 0
    out = capsys.readouterr().out
    assert "the implementation's rows rmsnorm" in " ".join(out.split())
    assert main(["check", "tests.examples.realstyle_microgpt_norm:buggy", "--model",
                 "--oracle", "off"]) == 1
    capsys.readouterr()
    assert main(["check", "tests.examples.hostile_nothing", "--model", "--oracle", "off"]) == 2
    err = capsys.readouterr().err
    assert "provides no whole model and no op row a composed model can use" in err


# the decoder row's own model (spec/suite/checks/decoder.py DecoderRowModel): realstyle_gpt is a
# whole decoder written as one class, adapted to the decoder row alone
GPT = "tests.examples.realstyle_gpt"


def test_a_decoder_row_is_judged_as_its_own_model_and_green_when_correct():
    model = model_of_rows(load_impl(GPT), GPT)
    assert isinstance(model, DecoderRowModel) and model.form == "gpt2"
    report = _fd(model)
    assert report.exit_code() == 0, report.summary()
    assert report.verdicts() == {"whole_model": "ok"}
    line = next(c for r in report.results for c in r.conventions if "decoder row's model" in c)
    assert "realstyle_gpt.decoder_loss_and_grads in the gpt2 form" in line


@pytest.mark.parametrize(("bug", "tensors"), [
    ("final_ln", None),  # the final norm's Jacobian skipped: every tensor before it
    ("tied", {"embeddings.token.W"}),  # the tied table's head share overwrote its input share
])
def test_a_planted_backward_bug_of_the_decoder_row_is_red_naming_tensor_index_and_values(
        bug, tensors, monkeypatch):
    _switched_on(monkeypatch, GPT, bug)
    model = model_of_rows(load_impl(GPT), GPT)
    report = _fd(model)
    assert report.exit_code() == 1
    (red,) = [r for r in report.results if r.outcome == "failed"]
    m = RED.search(red.message)
    assert m and m["tensor"] in model.params, red.message
    assert float(m["a"]) != float(m["n"])
    assert tensors is None or m["tensor"] in tensors, red.message
    assert f"minibert check {GPT} --ops decoder" in red.message


def test_op_rows_without_a_decoder_row_are_still_composed():
    spec = "tests.examples.realstyle_microgpt_norm:correct"
    assert type(model_of_rows(load_impl(spec), spec)) is C.ComposedModel
