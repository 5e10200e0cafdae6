"""``minibert adapter infer``'s block row of a block written as a forward/backward function pair
(minibert_spec.suite.infer.fnblocks): the pair held by a module-level SimpleNamespace
(tests/examples/realstyle_llama_block.py: pre-RMSNorm, causal RoPE-half attention, SwiGLU;
tests/examples/realstyle_plain_ln_block.py: post-LN, LayerNorms without affine) or defined at
module level, its form and p's key set found by its forward alone; the adapter written is green
on the correct build and red on the planted bug; a pair that is no block, of a form none of those
tried, or reading keys of its own gets no row and a reason."""

from __future__ import annotations

import numpy as np
import pytest

from minibert_spec.suite.infer import infer, infer_source
from minibert_spec.suite.infer.blocks import BLOCK_RTOL
from minibert_spec.suite.infer.fnblocks import FnBlockMapping
from minibert_spec.suite.infer.probes import Mapping_
from minibert_spec.suite.infer.render import capabilities
from tests.examples import realstyle_llama_block as llama
from tests.examples import realstyle_plain_ln_block as plain
from tests.suite.infer_support import exec_source, load_source
from tests.unshrunk import check_implementation

EXAMPLES = {"llama": llama, "plain_ln": plain}


def _block_row(module) -> tuple[FnBlockMapping | None, list[str]]:
    mappings, missing = infer(module)
    rows = [m for m in mappings if m.op == "block"]
    assert len(rows) <= 1, rows
    return (rows[0] if rows else None), missing


def test_the_llama_pair_gets_its_hand_adapters_form():
    m, missing = _block_row(llama)
    assert isinstance(m, FnBlockMapping), missing
    assert (m.owner, m.fwd_name, m.bwd_name) == ("correct", "block_forward", "block_backward")
    # the hand declaration's block form and RoPE convention (half, not interleaved: the probe's
    # heads have d_k = 4, where the two conventions differ)
    assert m.declares["block"] == llama.CAPABILITIES["block"]
    assert m.declares["attention"] == {"rope": "half"}
    assert m.fixed == {"norm": "pre", "normalization": "rmsnorm", "ffn": "swiglu",
                       "causal": True, "rope": "half"}
    assert m.inputs == ("x", "p", "n_heads", "mask", "eps", "rope_base")
    assert m.again == ("dout", "forward[1]") and m.output == 0 and not m.mask_name
    # the buggy build reads as a block too: said, never silently chosen between
    assert "also a block: buggy.block_forward, buggy.block_backward" in m.evidence


def test_the_affine_free_pair_is_declared_without_affine():
    m, missing = _block_row(plain)
    assert isinstance(m, FnBlockMapping), missing
    assert m.declares["layernorm"] == {"affine": False}
    assert m.declares["block"] == {"norm": "post", "causal": False}
    assert m.fixed == {"norm": "post", "causal": False}
    assert m.inputs == ("x", "p", "n_heads", "mask", "eps")
    assert any("block_param_names(ln_affine=False)" in e for e in m.evidence), m.evidence
    # the written CAPABILITIES: the layernorm row's and the block row's declarations of
    # layernorm, one entry
    assert "CAPABILITIES = {'layernorm': {'affine': False}, 'block':" in infer_source(
        plain.__name__)


def test_the_written_llama_adapter_serves_the_reference_form():
    from minibert_reference import block_forward, block_param_names
    from minibert_reference.ops import block_param_shapes

    adapter = exec_source(infer_source(llama.__name__))
    names = block_param_names(norm="pre", normalization="rmsnorm", ffn="swiglu")
    rng = np.random.default_rng(3)
    p = {n: rng.standard_normal(s) / 3 + (n.endswith("gamma")) for n, s in
         block_param_shapes(names, 16, 24).items()}
    x, mask = rng.standard_normal((2, 5, 16)), np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    got = adapter.block_forward(x, p, n_heads=2, mask=mask, eps=1e-6)[0]
    want = block_forward(x, p, n_heads=2, mask=mask, eps=1e-6, norm="pre", causal=True,
                         normalization="rmsnorm", ffn="swiglu", rope="half")[0]
    assert np.max(np.abs(got - want)) <= BLOCK_RTOL * np.max(np.abs(want))


@pytest.mark.slow  # a whole block's FD, twice: >= 5 s (issue 40)
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_inferred_block_is_green_on_correct_and_red_on_the_planted_bug(name, monkeypatch):
    """The same adapter is written whether the module's ``correct`` is its correct build or its
    buggy one (the backward is never compared with anything), and minibert check turns the bug
    red under it."""
    module = EXAMPLES[name]
    source = infer_source(module.__name__)
    report = check_implementation(exec_source(source), ops=["block"], kinds=["fd"])
    assert report.verdicts()["block"] == "ok", report.summary()
    monkeypatch.setattr(module, "correct", module.buggy)
    assert infer_source(module.__name__) == source
    report = check_implementation(exec_source(source), ops=["block"], kinds=["fd"])
    assert report.verdicts()["block"] == "FAIL", report.summary()


# near misses: module-level pairs (the functions' own module), each with no row and its reason
HEAD = """
import numpy as np
from tests.examples import realstyle_llama_block as llama

"""
NEAR_MISSES = {
    # reads as a block (x, p, n_heads) but is none: the closest form said
    "not_a_block": ("""
def block_forward(x, p, *, n_heads, mask=None, eps=1e-12):
    return 2 * x, x

def block_backward(dout, cache):
    return 2 * dout, {}
""", "its forward equals no block form tried"),
    # LLaMA's block with its RMSNorm eps fixed at 1e-5 in the code: a form none of those tried
    "fixed_eps": ("""
def block_forward(x, p, *, n_heads, mask=None):
    return llama.correct.block_forward(x, p, n_heads=n_heads, mask=mask, eps=1e-5)

def block_backward(dout, cache):
    return llama.correct.block_backward(dout, cache)
""", "closest norm=pre rmsnorm swiglu causal=True rope=half"),
    # p keyed by names of its own: its key set cannot be decided
    "own_keys": ("""
def block_forward(x, p, *, n_heads):
    return x + x @ p["wq"], x

def block_backward(dout, cache):
    return dout, {}
""", "reads p['wq'], no key of the protocol's block p"),
    # the block's forward, a backward returning its gradients as a tuple: no row
    "tuple_grads": ("""
def block_forward(x, p, *, n_heads, mask=None, eps=1e-12, rope_base=10000.0):
    return llama.correct.block_forward(x, p, n_heads=n_heads, mask=mask, eps=eps,
                                       rope_base=rope_base)

def block_backward(dout, cache):
    dx, grads = llama.correct.block_backward(dout, cache)
    return (dx, *grads.values())
""", "returns a tuple of 14: expected (dx, a dict"),
}


@pytest.mark.parametrize("name", sorted(NEAR_MISSES))
def test_a_near_miss_gets_no_row_and_a_reason(name, tmp_path, monkeypatch):
    body, reason = NEAR_MISSES[name]
    module = load_source(tmp_path, monkeypatch, HEAD + body, f"near_miss_{name}")
    m, missing = _block_row(module)
    assert m is None
    said = [line for line in missing if line.startswith("block: functions block_forward, "
                                                        "block_backward: ")]
    assert len(said) == 1 and reason in said[0], missing
    # the pair's reason replaces the generic "match no op" line
    assert not any(line.startswith("functions block_forward") for line in missing), missing


def test_a_module_level_pair_maps_and_an_imported_namespace_is_not_opened(tmp_path,
                                                                           monkeypatch):
    """The LLaMA pair at module level maps (no owner); the example's namespaces imported into
    another module hold functions of the example's, not the module's: not tried."""
    module = load_source(tmp_path, monkeypatch, HEAD + """
from tests.examples.realstyle_llama_block import correct

def block_forward(x, p, *, n_heads, mask=None, eps=1e-12, rope_base=10000.0):
    return llama.correct.block_forward(x, p, n_heads=n_heads, mask=mask, eps=eps,
                                       rope_base=rope_base)

def block_backward(dout, cache):
    return llama.correct.block_backward(dout, cache)
""", "module_level_llama")
    m, missing = _block_row(module)
    assert isinstance(m, FnBlockMapping) and m.owner == "" and m.fixed["rope"] == "half"
    assert not any("also a block" in e for e in m.evidence), m.evidence
    source = infer_source(module.__name__)
    assert "impl.block_forward(x, p, n_heads=n_heads" in source, source
    assert "backward=impl.block_backward" in source, source


def test_two_rows_declaring_one_op_are_merged():
    rows = [Mapping_("layernorm", None, {}, declares={"layernorm": {"eps": 1e-5}}),
            Mapping_("block", None, {}, declares={"block": {"norm": "post"},
                                                  "layernorm": {"affine": False}})]
    assert capabilities(rows) == {"layernorm": {"eps": 1e-5, "affine": False},
                                  "block": {"norm": "post"}}
