"""The protocol's variants (issue 23): implementations in the styles real code is written in
(tests/examples/variant_styles.py) are checked *as* their variant -- green in the row they
provide with no false red, n/a with the reason where a check does not apply, and their one bug
red on exactly its op with a message naming the tensor, the index and both values.  Then the
declarations themselves: validated, decided before any draw, and adapted exactly."""

from __future__ import annotations

import re

import numpy as np
import pytest

import minibert_reference
from minibert_spec.protocol import ImplProxy, NotApplicable, capabilities
from minibert_spec.protocol.capabilities import VARIANTS, declared_variants, resolve_variant, unmet
from minibert_spec.protocol.variants import from_per_head, to_per_head
from minibert_spec.suite.registry import select
from tests.examples.variant_styles import STYLES, build
from tests.unshrunk import check_implementation

KINDS = ["fd", "invariant", "oracle.forward", "oracle.backward"]
# "d/d<tensor> ... at index (i, j): analytic A, finite difference B" (FD), or the oracle's
# "<tensor> ... index ... ours A torch B": a tensor, an index, two numbers
NUMBER = r"-?\d+(\.\d+)?(e[-+]?\d+)?"
NAMES_TENSOR_INDEX_VALUES = re.compile(
    rf"(d/?d?\w+|\bd\w+|forward).*(\[|\()\d+(, ?\d+)*,?(\]|\)).*{NUMBER}.*{NUMBER}", re.S)


def _report(style: str, buggy: bool):
    op = STYLES[style][1]
    return op, check_implementation(build(style, buggy), ops=[op], kinds=KINDS)


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("style", sorted(STYLES))
def test_the_correct_style_is_green_in_its_row(style):
    op, report = _report(style, buggy=False)
    failed = [f"{r.id}: {r.message[:300]}" for r in report.failures()]
    assert report.verdict(report.grid()[op]) == "ok" and not failed, "\n".join(failed)
    assert report.counts().get("passed", 0) >= 5, report.counts()
    for r in report.results:  # what does not apply says why, from the declaration
        if r.outcome == "n/a":
            assert "does not claim" in r.message or "lacks" in r.message, r.message


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("style", sorted(STYLES))
def test_the_buggy_style_is_red_on_its_op_naming_tensor_index_and_values(style):
    op, report = _report(style, buggy=True)
    assert report.verdict(report.grid()[op]) == "FAIL", report.summary()
    failed = report.failures()
    assert failed and all(r.ops == (op,) for r in failed)
    named = [r for r in failed if NAMES_TENSOR_INDEX_VALUES.search(r.message)]
    assert named, "no red names the tensor, the index and both values:\n" + "\n".join(
        f"{r.id}: {r.message[:300]}" for r in failed)


def test_a_loss_dividing_by_shape0_is_caught_in_the_layout_that_shows_it():
    """The adapter's choice of layout used to decide whether this bug showed: [N, V] hides it
    (shape[0] = N), [1, N, V] shows it.  Both layouts run, by construction."""
    impl = build("rows_loss", buggy=True)
    report = check_implementation(impl, match=r"^oracle\.forward\[cross_entropy_(rows|batch)_")
    outcomes = {r.id: r.outcome for r in report.results}
    assert outcomes["oracle.forward[cross_entropy_rows_mean-f64]"] == "passed"
    assert outcomes["oracle.forward[cross_entropy_batch_mean-f64]"] == "failed"
    assert outcomes["oracle.forward[cross_entropy_batch_sum-f64]"] == "passed"


def test_the_gpt_block_is_reached_and_the_post_ln_checks_say_why_not():
    report = check_implementation(build("gpt_block"), ops=["block"], kinds=["fd"])
    by_id = {r.id: r for r in report.results}
    assert by_id["fd[block_preln_final]"].outcome == "passed"
    assert by_id["fd[block_causal]"].outcome == "passed"
    post = by_id["fd[block_bias]"]
    assert post.outcome == "n/a" and "post-LN" in post.message and "block.norm=pre_final" in \
        post.message


def test_a_block_is_checked_as_the_variants_its_parts_declare():
    """The lean block declares nothing on the block row itself: its attention has no W_o, its
    FFN no biases and exact GELU, its norms are RMSNorms.  Every block family draws p as those
    parts declare (minibert_reference.ops.block_param_names), and a call carrying a piece a part
    does
    not declare is n/a, naming the part."""
    from minibert_spec.suite.strategies import families

    impl = build("lean_block")
    caps = capabilities(impl)
    by_name = {f.name: f for f in families()}
    for name in ("block_nobias", "block_bias", "block_lean"):
        case = by_name[name].examples(caps)[0]
        assert not {"attn.W_o", "attn.b_o", "ffn.b_1", "ffn.b_2", "ln1.beta", "ln2.beta"} & set(
            case.inputs), (name, sorted(case.inputs))
        assert {"attn.W_q", "ffn.W_1", "ffn.W_2", "ln1.gamma", "ln2.gamma"} <= set(case.inputs)
        assert case.fixed.get("activation") == "gelu" and case.fixed["normalization"] == "rmsnorm"
    case = by_name["block_bias"].examples(caps)[0]
    p = {k: v for k, v in case.inputs.items() if k != "x"}
    proxy = ImplProxy(impl, "lean")
    with pytest.raises(NotApplicable, match=r"ffn with b_2 \(the call passes ffn\.b_2\)"):
        proxy.block_forward(case.inputs["x"], {**p, "ffn.b_2": np.zeros(6)}, n_heads=2,
                            activation="gelu", normalization="rmsnorm")
    with pytest.raises(NotApplicable, match=r"block LayerNorms"):
        proxy.block_forward(case.inputs["x"], p, n_heads=2, activation="gelu")
    out, _ = proxy.block_forward(case.inputs["x"], p, n_heads=2, activation="gelu",
                                 normalization="rmsnorm")  # single forms: keywords left out
    assert out.shape == case.inputs["x"].shape


# --------------------------------------------------------------------------- no skip by chance
def test_variant_checks_are_decided_before_any_draw():
    """A check that needs what an implementation does not declare is n/a before it runs: its
    body (and Hypothesis) is never entered, so the outcome cannot depend on a draw."""
    calls = []

    class NoMask:
        CAPABILITIES = {"key_mask": False}

        def block_forward(self, *a, **k):
            calls.append("forward")
            raise AssertionError("must not be called")

        block_backward = block_forward

    report = check_implementation(NoMask(), ops=["block"],
                                  match=r"mask|oracle\.forward\[block_bias-f64")
    masked = [r for r in report.results if re.search(r"\[block_\w*_mask\b", r.id)]
    assert masked and all(r.outcome == "n/a" for r in masked)
    # a variant's masked family (block_causal_mask) may name the variant it lacks first
    assert all("key_mask" in r.message for r in masked
               if re.search(r"\[block_(no)?bias_mask\b", r.id)), masked
    assert not any(r.outcome == "n/a" and "key_mask" in r.message
                   for r in report.results if r not in masked)


def test_every_block_oracle_case_is_a_check_of_its_own():
    pattern = r"^oracle\.forward\[block_(no)?bias"
    ids = {c.id for c in select(match=pattern)}
    assert ids == {f"oracle.forward[block_{b}{m}-{d}]" for d in ("f64", "f32")
                   for b in ("bias", "nobias") for m in ("_mask", "")}
    for c in select(match=pattern):
        assert ("key_mask" in c.needs) == ("_mask-" in c.id), c.id


# --------------------------------------------------------------------------- the declarations
def test_declarations_are_validated_naming_what_is_wrong():
    class Bad:
        CAPABILITIES = {"layernorm": {"affine": "no"}}

    with pytest.raises(ValueError, match=r"CAPABILITIES\['layernorm'\]\['affine'\].*\[True, "
                                         r"False\]"):
        capabilities(Bad())
    Bad.CAPABILITIES = {"attention": {"alibi": True}}
    with pytest.raises(ValueError, match="unknown options.*alibi"):
        capabilities(Bad())


def test_the_reference_declares_and_passes_every_variant_it_implements():
    caps = capabilities(minibert_reference)
    for op, options in VARIANTS.items():
        for name, option in options.items():
            if (op, name) != ("attention", "heads"):  # a layout the proxy adapts
                if name == "reduction":  # the keyword; the other forms the proxy derives
                    assert caps[op][name] == ("keyword",), (op, name)
                elif name == "ignore_index":  # cross_entropy, linear_cross_entropy
                    assert caps[op][name] == (True,)
                else:
                    assert caps[op][name] == option.values, (op, name)
    assert resolve_variant(caps, "block") == {"norm": "post", "causal": False,
                                              "normalization": "layernorm", "ffn": "mlp"}
    assert unmet(caps, {"block.norm": "pre_final", "attention.causal": True}) is None
    lines = declared_variants(capabilities(build("gpt_block")))
    assert any("block.norm=pre_final" in line for line in lines["block"])


def test_per_head_layout_round_trips_exactly():
    rng = np.random.default_rng(0)
    H, A = 6, 3
    for name in ("W_q", "W_k", "W_v", "W_o", "b_q", "b_o"):
        a = rng.standard_normal((H, H) if name.startswith("W") else (H,))
        per = to_per_head(name, a, A)
        assert per.shape == {"W_o": (A, H // A, H), "b_o": (H,)}.get(
            name, (A, H, H // A) if name.startswith("W") else (A, H // A))
        assert np.array_equal(from_per_head(name, per, H), a)
    # head 1's query columns are W_q[:, 2:4]
    W = rng.standard_normal((H, H))
    assert np.array_equal(to_per_head("W_q", W, A)[1], W[:, 2:4])


def test_a_probability_loss_is_composed_with_the_protocols_softmax():
    """Called with logits (every standard check), a loss declared on probabilities gets
    softmax(logits), and its dL/dp comes back through softmax's backward: equal to the
    reference's logits loss and gradient."""
    rng = np.random.default_rng(1)
    logits, labels = rng.standard_normal((4, 5)), np.array([0, 3, 3, 1])
    want, cache = minibert_reference.cross_entropy_forward(logits, labels)
    (want_d,) = minibert_reference.cross_entropy_backward(0.7, cache)
    for style in ("probs_loss", "probs_loss_dlogits"):
        proxy = ImplProxy(build(style), style)
        got, c = proxy.cross_entropy_forward(logits, labels)
        (got_d,) = proxy.cross_entropy_backward(0.7, c)
        np.testing.assert_allclose(got, want, rtol=1e-13)
        np.testing.assert_allclose(got_d, want_d, rtol=1e-12, atol=1e-15)
        with pytest.raises(NotApplicable, match="ignore_index"):  # it has none
            proxy.cross_entropy_forward(logits, np.array([0, -100, 3, 1]))


def _clipped_ce_module(tmp_path, monkeypatch, name: str, caps: dict):
    """A cross-entropy on np.clip(p, 1e-7, 1 - 1e-7), the two-sided clip real code writes."""
    import importlib
    import textwrap

    (tmp_path / f"{name}.py").write_text(textwrap.dedent(f"""
        import numpy as np

        CAPABILITIES = {caps!r}

        def cross_entropy_forward(logits, labels, *, ignore_index=-100, reduction="mean"):
            z = logits - logits.max(-1, keepdims=True)
            p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
            keep = labels != ignore_index
            safe = np.where(keep, labels, 0)
            p_label = np.take_along_axis(p, safe[..., None], -1)[..., 0]
            n = max(int(keep.sum()), 1) if reduction == "mean" else 1
            loss = -(np.log(np.clip(p_label, 1e-7, 1 - 1e-7)) * keep).sum() / n
            return loss.astype(logits.dtype), (p, safe, keep, n)

        def cross_entropy_backward(dloss, cache):
            p, safe, keep, n = cache
            d = p.copy()
            np.put_along_axis(d, safe[..., None],
                              np.take_along_axis(d, safe[..., None], -1) - 1, -1)
            return (d * keep[..., None] * d.dtype.type(dloss / n),)
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module(name)


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_a_two_sided_probability_clip_is_judged_as_declared(tmp_path, monkeypatch):
    """np.clip(p, eps, 1 - eps) declared as guards prob_clip_both: green, judged against the
    same clipped formula; undeclared, the loss at a confident correct prediction (-log(1 -
    eps) > 0 where the true loss is ~0) is red."""
    declared = _clipped_ce_module(tmp_path, monkeypatch, "ce_clip_declared",
                                  {"guards": {"prob_clip_both": 1e-7}})
    report = check_implementation(declared, ops=["cross_entropy"])
    assert report.verdicts()["cross_entropy"] == "ok", report.summary()
    bare = _clipped_ce_module(tmp_path, monkeypatch, "ce_clip_bare", {})
    report = check_implementation(bare, ops=["cross_entropy"])
    assert report.verdicts()["cross_entropy"] == "FAIL", report.summary()
