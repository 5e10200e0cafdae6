"""``layer()`` and ``optimizer()`` take every shape real class-style code has
(tests/examples/layer_shapes.py): each correct example is green in its row, each buggy one red
on exactly its op with a message naming the tensor, the index and both values.  Then the
pieces: attribute paths through lists and dicts, an optional bias through a missing
sub-object, a single-use layer's accumulation check, a per-position loss reduced by the suite,
and the optimizers kept pure."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

from minibert_spec.suite.adapters import get_path, layer, optimizer, path_parts, set_path
from tests.examples import layer_shapes
from tests.examples.layer_shapes import BLOCK_CAPS, OPS, OPTIMIZERS, _block_entries, _ops, build
from tests.suite.test_variants import NAMES_TENSOR_INDEX_VALUES
from tests.unshrunk import check_implementation

LAYER_KINDS = ["fd", "invariant", "oracle.forward", "oracle.backward"]


def _report(shape: str, buggy: bool):
    op = OPS[shape]
    kinds = None if shape in OPTIMIZERS else LAYER_KINDS
    return op, check_implementation(build(shape, buggy), ops=[op], kinds=kinds)


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("shape", sorted(OPS))
def test_the_correct_shape_is_green_in_its_row(shape):
    op, report = _report(shape, buggy=False)
    failed = [f"{r.id}: {r.message[:300]}" for r in report.failures()]
    assert report.verdicts()[op] == "ok" and not failed, "\n".join(failed)
    assert report.counts().get("passed", 0) >= 4, report.counts()


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("shape", sorted(OPS))
def test_the_buggy_shape_is_red_on_its_op_naming_tensor_index_and_values(shape):
    op, report = _report(shape, buggy=True)
    assert report.verdicts()[op] == "FAIL", report.summary()
    failed = report.failures()
    assert failed and all(r.ops == (op,) for r in failed)
    named = [r for r in failed if NAMES_TENSOR_INDEX_VALUES.search(r.message)]
    assert named, "no red names the tensor, the index and both values:\n" + "\n".join(
        f"{r.id}: {r.message[:300]}" for r in failed)


# --------------------------------------------------------------------------- paths
def test_paths_reach_through_lists_dicts_and_every_item():
    class Box:
        pass

    heads = [Box(), Box()]
    obj = Box()
    obj.heads, obj.p = heads, {"attn.W_q": 1}
    assert path_parts("heads[*].W") == ["heads", "*", "W"]
    assert path_parts("p['attn.W_q']") == ["p", "attn.W_q"]
    set_path(obj, "heads[*].W", np.arange(6).reshape(2, 3))
    assert np.array_equal(heads[1].W, [3, 4, 5])
    assert np.array_equal(get_path(obj, "heads[*].W"), np.arange(6).reshape(2, 3))
    set_path(obj, "heads[0].b", 7)
    assert get_path(obj, "heads[0].b") == 7 and get_path(obj, "p['attn.W_q']") == 1
    with pytest.raises(ValueError, match=r"path 'heads\[x\]'.*stuck at '\[x\]'"):
        path_parts("heads[x]")


def test_an_absent_bias_through_a_missing_sub_object_is_skipped():
    """set_path(obj, "b.value", None) where the layer was built without a bias (b is None, or
    no b at all): nothing to set, and no AttributeError."""
    lin = layer_shapes.ParamLinear(3, 2, bias=False)
    set_path(lin, "b.value", None)  # b is None
    del lin.b
    set_path(lin, "b.value", None)  # no b at all
    with pytest.raises(AttributeError):
        set_path(lin, "b.value", np.zeros(2))  # a value needs its place


def test_a_class_that_always_has_a_bias_is_na_for_a_call_without_one():
    from minibert_spec.protocol import NotApplicable

    fwd, _ = layer("linear", lambda W: layer_shapes.ParamLinear(*W.shape),
                   params={"W": "W.value", "b": "b.value"}, grads={"W": "W.grad", "b": "b.grad"})
    with pytest.raises(NotApplicable, match="always has b"):
        fwd(np.ones((2, 3)), np.ones((3, 2)), None)


def test_layer_refuses_a_malformed_path_at_declaration():
    with pytest.raises(ValueError, match="path 'W..grad'"):
        layer("linear", lambda W: None, grads={"W": "W..grad"})


# --------------------------------------------------------------------------- single use
def test_a_single_use_layer_gets_a_na_accumulation_check_with_its_reason():
    report = check_implementation(build("single_use"), ids=["invariant[linear.grad_accumulates]"])
    (r,) = report.results
    assert r.outcome == "n/a" and "single use" in r.message and "frees" in r.message, r.message
    # undeclared, the second backward of the check fails on the freed activation: the
    # declaration is what makes the layer checkable
    fwd, bwd = layer("linear", lambda W, b: layer_shapes.FreeingLinear(W, b),
                     grads={"W": "dW", "b": "db"})
    impl = type("Undeclared", (), {"linear_forward": staticmethod(fwd),
                                   "linear_backward": staticmethod(bwd)})()
    report = check_implementation(impl, ids=["invariant[linear.grad_accumulates]"])
    (r,) = report.failures()
    assert "AttributeError" in r.message


# --------------------------------------------------------------------------- reduction
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_a_per_position_loss_is_reduced_by_the_suite(reduction):
    """Declared reduction "none": the proxy takes the mean (over the kept positions) or the
    sum of the per-position losses, and hands the backward per-position weights -- equal to
    the reference's reduced loss and gradient."""
    import minibert_reference
    from minibert_spec.protocol import ImplProxy

    rng = np.random.default_rng(3)
    logits, labels = rng.standard_normal((2, 3, 5)), np.array([[0, -100, 4], [2, 2, -100]])
    want, cache = minibert_reference.cross_entropy_forward(logits, labels, reduction=reduction)
    (want_d,) = minibert_reference.cross_entropy_backward(0.7, cache)
    proxy = ImplProxy(build("per_position"), "per_position")
    got, c = proxy.cross_entropy_forward(logits, labels, reduction=reduction)
    (got_d,) = proxy.cross_entropy_backward(0.7, c)
    np.testing.assert_allclose(got, want, rtol=1e-13)
    np.testing.assert_allclose(got_d, want_d, rtol=1e-12, atol=1e-16)


def test_a_mean_only_loss_gets_its_sum_from_the_suite():
    """Declared reduction "mean" (no keyword): the sum is the mean times the kept positions."""
    import minibert_reference
    from minibert_spec.protocol import ImplProxy

    rng = np.random.default_rng(4)
    logits, labels = rng.standard_normal((1, 4, 3)), np.array([[0, 1, 2, 2]])
    impl = build("again_loss")  # a mean-only loss on probabilities
    proxy = ImplProxy(impl, "mean_only")
    got, c = proxy.cross_entropy_forward(logits, labels, reduction="sum")
    (got_d,) = proxy.cross_entropy_backward(1.3, c)
    want, cache = minibert_reference.cross_entropy_forward(logits, labels, reduction="sum")
    (want_d,) = minibert_reference.cross_entropy_backward(1.3, cache)
    np.testing.assert_allclose(got, want, rtol=1e-13)
    np.testing.assert_allclose(got_d, want_d, rtol=1e-12, atol=1e-16)


# --------------------------------------------------------------------------- optimizers
@pytest.mark.parametrize("shape", OPTIMIZERS)
def test_every_optimizer_shape_is_pure_and_matches_the_reference(shape):
    import minibert_reference

    impl = build(shape)
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((3, 2)), "b": rng.standard_normal(2)}
    before = {k: v.copy() for k, v in params.items()}
    state = impl.adam_init(params)
    ref_state = minibert_reference.adam_init(params)
    p, ref_p = params, params
    for step in range(3):
        g = {k: rng.standard_normal(v.shape) for k, v in params.items()}
        p, state = impl.adam_step(p, g, state, lr=0.05, beta1=0.8, beta2=0.9, eps=1e-6)
        ref_p, ref_state = minibert_reference.adam_step(ref_p, g, ref_state, lr=0.05, beta1=0.8,
                                               beta2=0.9, eps=1e-6, weight_decay=0.0)
        for k in params:
            np.testing.assert_allclose(p[k], ref_p[k], rtol=1e-12, err_msg=f"{k} step {step}")
    assert state["step"] == 3
    assert all(np.array_equal(params[k], before[k]) for k in params)  # nothing in place


def test_optimizer_refuses_two_shapes_at_once():
    with pytest.raises(ValueError, match="different shapes"):
        optimizer(lambda ps: None, hyper={"lr": "lr"}, m="m", v="v", params="params",
                  each="update")


# --------------------------------------------------------------------------- a block's p
def _block_call(shape, drop=(), add=()):
    from minibert_reference.ops import block_param_names, block_param_shapes

    rng = np.random.default_rng(5)
    names = [n for n in block_param_names(attn_bias=False) if n not in drop] + list(add)
    p = {k: rng.standard_normal(s) for k, s in block_param_shapes(tuple(names), 4, 6).items()}
    return build(shape).block_forward(rng.standard_normal((2, 3, 4)), p, n_heads=2)


@pytest.mark.parametrize("shape", ["block_entries", "block_parts"])
def test_an_entry_of_p_the_block_has_no_place_for_or_always_has_is_na(shape):
    """p's entries are the layer's arguments one by one: an entry the mapping has no path
    for is never dropped silently, and one the class always has is never left at its own
    value -- the call is n/a, naming the entry."""
    from minibert_spec.protocol import NotApplicable

    with pytest.raises(NotApplicable, match=r"no place for p\['attn.b_q'\]"):
        _block_call(shape, add=("attn.b_q",))
    with pytest.raises(NotApplicable, match="always has ffn.b_2; called with a p without"):
        _block_call(shape, drop=("ffn.b_2",))


def test_a_block_declaration_naming_no_entry_of_p_is_refused():
    with pytest.raises(ValueError, match=r"not arguments .* nor keys of its p .*attn\.W_q"):
        layer("block", lambda n_heads: None, params={"attn.Wq": "attn.W_q"})
    with pytest.raises(ValueError, match=r"parts\['attn'\].*expected \(a path, a forward"):
        layer("block", lambda n_heads: None, parts={"attn": ("attn", print)})
    ffn, _ = layer("ffn", lambda: None, params={"W_1": "a"}, grads={"W_1": "return[1]"})
    with pytest.raises(ValueError, match="out of the block's reach"):
        layer("block", lambda n_heads: None, parts={"ffn": ("ffn", ffn)})


def test_a_block_layer_s_accumulation_is_checked_through_the_suite_s_adapter():
    """The block's cases call it through the suite's dict adapter (its parameters as one p):
    the accumulation check builds the same call and reads the layer's attributes underneath.
    As declared it is green (it was n/a, "not checked"); the same class declared
    accumulate=True, while its sub-layers replace their gradients, is red naming an entry."""
    for shape in ("block_parts", "block_entries"):
        report = check_implementation(build(shape), ids=["invariant[block.grad_accumulates]"])
        (r,) = report.results
        assert r.outcome == "passed", (shape, r.message)
    misdeclared = SimpleNamespace(**_ops("block", *_block_entries(False, accumulate=True),
                                         BLOCK_CAPS))
    report = check_implementation(misdeclared, ids=["invariant[block.grad_accumulates]"])
    (r,) = report.results
    assert r.outcome == "failed", r.message
    assert "should be g(d1) + g(d2)" in r.message and "replaces it (= instead of +=)" in r.message
    assert re.search(r"block: d(attn|ffn|ln\d)\.\w+ \(layer attribute '", r.message), r.message
