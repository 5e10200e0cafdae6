"""Issue 39, the adapter forms met on real code: ``layer(..., fixed=)`` together with the
matching ``CAPABILITIES``; ``layer(..., mask=)`` turning the suite's ``[B, T]`` key mask and
``causal`` into a class's own mask; ``optimizer()`` with hyperparameters passed to the step and
a step counter kept outside the update."""

from __future__ import annotations

import types

import numpy as np
import pytest

from minibert_reference import ops as R
from minibert_spec.protocol.capabilities import DeclarationError, capabilities
from minibert_spec.suite.adapters import layer, optimizer
from tests.unshrunk import check_implementation

FFN_NAMES = ("W_1", "b_1", "W_2", "b_2")


class TanhFFN:
    """An FFN class that computes GELU's tanh form only (GPT-2's MLP): no activation keyword."""

    def __init__(self, W_1, b_1, W_2, b_2):
        self.W_1, self.b_1, self.W_2, self.b_2 = W_1, b_1, W_2, b_2

    def forward(self, x):
        y, self.cache = R.ffn_forward(x, self.W_1, self.b_1, self.W_2, self.b_2,
                                      activation="gelu_tanh")
        return y

    def backward(self, dy):
        dx, self.dW_1, self.db_1, self.dW_2, self.db_2 = R.ffn_backward(dy, self.cache)
        return dx


def _tanh_ffn_module(declared) -> types.ModuleType:
    m = types.ModuleType("tanh_ffn")
    if declared is not None:
        m.CAPABILITIES = {"ffn": {"activation": declared}}
    m.ffn_forward, m.ffn_backward = layer("ffn", TanhFFN, fixed={"activation": "gelu_tanh"},
                                          grads={n: f"d{n}" for n in FFN_NAMES})
    return m


# ----------------------------------------------------------------- fixed= and CAPABILITIES
def test_fixed_with_the_matching_capability_is_accepted_and_judged():
    """The docs' pattern: was refused (exit 2) -- the suite leaves activation= out for a single
    declared form and the adapter's signature still defaulted to relu."""
    m = _tanh_ffn_module("gelu_tanh")
    assert capabilities(m)["ffn"]["activation"] == ("gelu_tanh",)
    y, _ = m.ffn_forward(np.ones((2, 3)), np.ones((3, 4)), np.zeros(4), np.ones((4, 3)),
                         np.zeros(3))  # no activation=: the declared form
    assert y.shape == (2, 3)
    report = check_implementation(m, ops=["ffn"], kinds=["fd"], quick=True)
    assert report.verdicts()["ffn"] == "ok", report.summary()
    assert sum(r.outcome == "passed" for r in report.results) >= 2


@pytest.mark.parametrize("declared, got", [("gelu", "'gelu'"), (None, "'relu' (the default"),
                                           (["gelu_tanh", "relu"], "('relu', 'gelu_tanh')")])
def test_fixed_contradicting_the_capability_is_refused_naming_both(declared, got):
    with pytest.raises(DeclarationError) as e:
        capabilities(_tanh_ffn_module(declared))
    text = str(e.value)
    assert "\n" not in text
    assert f"CAPABILITIES['ffn']['activation']: got {got}" in text, text
    assert "fixed={'activation': 'gelu_tanh'}" in text, text


# ----------------------------------------------------------------- layer(..., mask=)
ATTN = ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o")


def _attention_module(converter, bugs=()) -> types.ModuleType:
    """realstyle_causal_attn's class under another converter."""
    from tests.examples import realstyle_causal_attn as ex

    m = types.ModuleType("converted_attention")
    m.CAPABILITIES = ex.CAPABILITIES
    m.attention_forward, m.attention_backward = layer(
        "attention", lambda W_q, b_q, b_k, b_v, b_o, n_heads: ex.CausalSelfAttention(
            W_q.shape[0], n_heads, bias=b_q is not None),
        params={n: n for n in ATTN}, grads={n: f"d{n}" for n in ATTN}, mask=converter)
    return m


def _call(m, mask=None, causal=False):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4))
    p = {n: rng.standard_normal((4, 4) if n[0] == "W" else (4,)) for n in ATTN}
    return m.attention_forward(x, **p, n_heads=2, mask=mask, causal=causal)


def test_the_converted_mask_is_what_the_class_gets():
    from tests.examples import realstyle_causal_attn as ex

    mask = np.array([[1, 1, 0], [1, 0, 1]])
    for causal in (False, True):
        y, _ = _call(_attention_module(ex.additive_mask), mask, causal)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((2, 3, 4))
        p = {n: rng.standard_normal((4, 4) if n[0] == "W" else (4,)) for n in ATTN}
        want, _ = R.attention_forward(x, *(p[n] for n in ATTN), n_heads=2, mask=mask,
                                      causal=causal)
        np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)


def _raises(mask, causal, T):
    return 1 / 0


def _transposed(mask, causal, T):
    return np.ones((T, 2)) if mask is None else np.asarray(mask, float).T


@pytest.mark.parametrize("converter, says", [
    (_raises, "the mask converter _raises (test_adapter_forms.py:"),
    (_transposed, "the mask converter _transposed (test_adapter_forms.py:")])
def test_a_converter_that_raises_or_returns_a_wrong_shape_is_red_naming_it(converter, says):
    from minibert_spec.suite.adapter_masks import MaskConverterError

    with pytest.raises(MaskConverterError) as e:
        _call(_attention_module(converter), np.array([[1, 1, 0], [1, 0, 1]]))
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)
    report = check_implementation(_attention_module(converter), ops=["attention"],
                                  kinds=["fd"], quick=True)
    assert report.verdicts()["attention"] == "FAIL", report.summary()
    failed = report.failures()
    assert failed and all(says in r.message.splitlines()[0] for r in failed), [
        r.message for r in failed]
    assert not any(r.outcome == "passed" for r in report.results if "mask" in r.id)


def test_a_converter_returning_none_for_a_mask_is_red():
    from minibert_spec.suite.adapter_masks import MaskConverterError

    with pytest.raises(MaskConverterError, match=r"<lambda> .* returned None for mask \[2, 3\]"):
        _call(_attention_module(lambda mask, causal: None), np.ones((2, 3)))
    assert _call(_attention_module(lambda mask, causal: None))[0].shape == (2, 3, 4)


def test_a_mask_the_converter_ignores_is_not_applicable_never_dropped():
    from minibert_spec.protocol import NotApplicable

    causal_only = _attention_module(lambda causal, T: np.where(
        np.tril(np.ones((T, T), bool)) | (not causal), 0.0, -1e9))
    _call(causal_only, causal=True)
    with pytest.raises(NotApplicable, match="takes no mask"):
        _call(causal_only, np.ones((2, 3)))


def test_layer_refuses_a_mask_converter_it_cannot_use():
    with pytest.raises(ValueError, match=r"mask= converts .* got linear_forward"):
        layer("linear", lambda W: None, mask=lambda mask: mask)
    with pytest.raises(ValueError, match=r"mask= takes \['m', 'causal'\]: expected parameters "
                                         r"among \['mask', 'causal', 'T', 'dtype'\]"):
        layer("attention", lambda W_q: None, mask=lambda m, causal: m)
    with pytest.raises(ValueError, match="mask= expected a callable"):
        layer("attention", lambda W_q: None, mask="additive")


@pytest.mark.slow  # the slow tier: two attention rows, ~20 s each
@pytest.mark.parametrize("bugs", [set(), {"attention"}])
def test_a_class_attention_with_its_own_additive_mask_is_judged(bugs, monkeypatch):
    """Its masked and causal families run (green when right), a backward bug is red naming the
    tensor, the index and both values."""
    from tests.examples import realstyle_causal_attn as ex
    from tests.suite.test_adapters import NAMED

    monkeypatch.setattr(ex, "BUGS", bugs)
    report = check_implementation(ex, ops=["attention"], kinds=["fd", "oracle", "invariant"])
    by_id = {r.id: r.outcome for r in report.results}
    families = ["fd[attention_bias_mask]", "fd[attention_causal]", "fd[attention_causal_mask]",
                "oracle.backward[attention_causal_mask-f64]", "invariant[attention.causal]",
                "invariant[attention.padding_ignored]"]
    if not bugs:
        assert report.verdicts()["attention"] == "ok", report.summary()
        assert all(by_id[i] == "passed" for i in families), {i: by_id[i] for i in families}
    else:
        assert report.verdicts()["attention"] == "FAIL", report.summary()
        assert by_id["fd[attention_causal_mask]"] == "failed"
        assert any(NAMED.search(r.message) for r in report.failures()), [
            r.message[:300] for r in report.failures()]


# ----------------------------------------------------------------- optimizer(): the step's own
def _steps(impl, n=3):
    """``n`` steps of ``impl`` and of the reference from the same start, with the suite's
    keywords (lr passed to each step), and the parameters they were given."""
    import minibert_reference

    rng = np.random.default_rng(1)
    params = {"w": rng.standard_normal((3, 2)), "b": rng.standard_normal(2)}
    before = {k: v.copy() for k, v in params.items()}
    p, state = params, impl.adam_init(params)
    ref_p, ref_state = params, minibert_reference.adam_init(params)
    for step in range(n):
        g = {k: rng.standard_normal(v.shape) for k, v in params.items()}
        lr = 0.05 / (step + 1)  # a schedule's value: different at each step
        p, state = impl.adam_step(p, g, state, lr=lr, beta1=0.8, beta2=0.9, eps=1e-6)
        ref_p, ref_state = minibert_reference.adam_step(ref_p, g, ref_state, lr=lr, beta1=0.8,
                                                        beta2=0.9, eps=1e-6, weight_decay=0.0)
    return p, ref_p, state, params, before


@pytest.mark.parametrize("name", ["realstyle_step_kwargs", "realstyle_loop_counter"])
def test_step_keywords_and_an_outside_counter_match_the_reference(name, monkeypatch):
    import importlib

    impl = importlib.import_module(f"tests.examples.{name}")
    monkeypatch.setattr(impl, "BUGS", set())
    p, ref_p, state, params, before = _steps(impl)
    for k in p:
        np.testing.assert_allclose(p[k], ref_p[k], rtol=1e-12, err_msg=k)
    assert state["step"] == 3  # the steps the suite counted for the loop
    assert all(np.array_equal(params[k], before[k]) for k in params)  # nothing in place


def test_the_counter_convention_is_what_the_update_is_given():
    """The 1-based update declared 0-based divides by 1 - beta ** 0: never equal to the
    reference; declared as it is, equal."""
    from tests.examples.realstyle_step_kwargs import Adam

    hyper = {"lr": "lr=", ("beta1", "beta2"): "betas", "eps": "eps"}
    seen = []

    class Recording(Adam):
        def step(self, params, grads, lr, t):
            seen.append((lr, t))
            super().step(params, grads, lr, t)

    for first_t in (1, 0):
        seen.clear()
        impl = types.SimpleNamespace(**dict(zip(("adam_init", "adam_step"), optimizer(
            Recording, hyper=hyper, m="m", v="v", t="t=", first_t=first_t))))
        with np.errstate(divide="ignore", invalid="ignore"):
            p, ref_p, *_ = _steps(impl)
        assert [t for _, t in seen] == [first_t, first_t + 1, first_t + 2]
        assert [lr for lr, _ in seen] == [0.05, 0.025, 0.05 / 3]
        assert np.allclose(p["w"], ref_p["w"], rtol=1e-12) == (first_t == 1)


def test_optimizer_refuses_an_outside_counter_without_its_convention():
    with pytest.raises(ValueError, match=r"t='t=': a counter kept outside the update: expected "
                                         r"first_t=0 or 1 .* got first_t=None"):
        optimizer(lambda ps: None, hyper={"lr": "lr="}, m="m", v="v", t="t=")
    with pytest.raises(ValueError, match=r"each_args \('param', 't'\): .* got first_t=2"):
        optimizer(lambda ps: None, hyper={"lr": "lr"}, m="m", v="v", each="update",
                  each_args=("param", "t"), first_t=2)
    with pytest.raises(ValueError, match=r"first_t=1 is for a counter kept outside .* got "
                                         r"t='step_count', the optimizer's own"):
        optimizer(lambda ps: None, hyper={"lr": "lr"}, m="m", v="v", t="step_count", first_t=1)


@pytest.mark.parametrize("name", ["realstyle_step_kwargs", "realstyle_loop_counter"])
@pytest.mark.parametrize("bugs", [set(), {"adam"}])
def test_an_outside_counter_example_is_judged_on_the_adam_row(name, bugs, monkeypatch):
    """--quick: the first-step invariant (the bias-corrected first step moves by lr)."""
    impl = _example(name, bugs, monkeypatch)
    report = check_implementation(impl, ops=["adam"], quick=True)
    assert report.verdicts()["adam"] == ("FAIL" if bugs else "ok"), report.summary()
    outcome = {r.id: r.outcome for r in report.results}["invariant[adam.first_step]"]
    assert outcome == ("failed" if bugs else "passed")
    if bugs:
        assert all("index (0, 0): got " in r.message and ", expected 1" in r.message
                   for r in report.failures()), [r.message[:300] for r in report.failures()]


@pytest.mark.parametrize("name", ["realstyle_step_kwargs", "realstyle_loop_counter"])
@pytest.mark.parametrize("bugs", [set(), {"adam"}])
def test_an_outside_counter_example_agrees_with_torch_and_sympy(name, bugs, monkeypatch):
    """The oracle and SymPy columns (0.2-0.3 s each once torch is imported)."""
    report = check_implementation(_example(name, bugs, monkeypatch), ops=["adam"])
    assert report.verdicts()["adam"] == ("FAIL" if bugs else "ok"), report.summary()
    outcome = {r.id: r.outcome for r in report.results}
    assert outcome["oracle.forward[adam-default]"] == ("failed" if bugs else "passed")
    if bugs:
        messages = [r.message for r in report.failures() if r.id.startswith("oracle")]
        assert messages and all("vs torch: worst at index (0, " in m for m in messages), messages
    else:
        assert outcome["sympy[optim.adam]"] == "passed"


def _example(name, bugs, monkeypatch):
    import importlib

    impl = importlib.import_module(f"tests.examples.{name}")
    monkeypatch.setattr(impl, "BUGS", bugs)
    return impl


class PaddingOnly:
    """A decoder's attention that builds its own causal mask and takes the key padding alone
    (``forward(x, pad)``, pad [B, T] of 1/0): ``fixed={"causal": True}, mask=lambda mask:
    mask``."""

    def __init__(self, n_embd, n_head):
        from tests.examples.realstyle_causal_attn import CausalSelfAttention, additive_mask

        self.inner, self.additive = CausalSelfAttention(n_embd, n_head), additive_mask

    def forward(self, x, pad):
        T = x.shape[-2]
        return self.inner.forward(x, self.additive(pad, True, T, x.dtype))

    def backward(self, dout):
        return self.inner.backward(dout)


def test_a_class_with_its_own_causal_mask_takes_the_padding_alone():
    m = types.ModuleType("padding_only")
    m.CAPABILITIES = {"attention": {"causal": True}}
    m.attention_forward, m.attention_backward = layer(
        "attention", lambda W_q, n_heads: PaddingOnly(W_q.shape[0], n_heads),
        params={n: f"inner.{n}" for n in ATTN}, grads={n: f"inner.d{n}" for n in ATTN},
        fixed={"causal": True}, mask=lambda mask: mask)
    assert capabilities(m)["attention"]["causal"] == (True,)
    mask = np.array([[1, 1, 0], [1, 0, 1]])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4))
    p = {n: rng.standard_normal((4, 4) if n[0] == "W" else (4,)) for n in ATTN}
    y, _ = m.attention_forward(x, **p, n_heads=2, mask=mask)  # no causal=: the declared form
    want, _ = R.attention_forward(x, *(p[n] for n in ATTN), n_heads=2, mask=mask, causal=True)
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
    report = check_implementation(m, ops=["attention"], kinds=["fd"], quick=True)
    assert report.verdicts()["attention"] == "ok", report.summary()
    assert {r.id: r.outcome for r in report.results}["fd[attention_causal_mask]"] == "passed"


@pytest.mark.parametrize("name", ["realstyle_causal_attn", "realstyle_step_kwargs",
                                  "realstyle_loop_counter"])
def test_the_new_forms_adapters_are_a_few_lines(name):
    from tests import ROOT
    from tests.suite.test_adapters import _adapter_lines

    assert _adapter_lines(ROOT / "tests" / "examples" / f"{name}.py") <= 15


def test_a_converter_shows_the_keywords_it_reads_in_the_adapted_signature():
    """causal= is hidden from a class layer that cannot take it (its CAPABILITIES form is the
    one it computes); a converter reading causal makes the class take it, on a block too."""
    import inspect

    for op in ("attention", "block"):
        plain, _ = layer(op, lambda n_heads: None)
        converted, _ = layer(op, lambda n_heads: None, mask=lambda mask, causal, T: None)
        assert "causal" not in inspect.signature(plain).parameters
        assert "causal" in inspect.signature(converted).parameters


def test_a_nan_from_the_code_is_red_in_the_sympy_column(monkeypatch):
    """Found with the off-by-one example: NaN parameters after three steps compared as 'no
    error' (max |a - b| of NaN is NaN, and NaN > tol is False) -- a green SymPy column."""
    impl = _example("realstyle_step_kwargs", {"adam"}, monkeypatch)
    report = check_implementation(impl, ids=["sympy[optim.adam]"])
    (result,) = report.results
    assert result.outcome == "failed", result.message
    assert "code nan, sympy " in result.message and "allowed nan" not in result.message
