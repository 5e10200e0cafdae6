"""A LayerNorm whose eps is fixed in its code (issue 28): ``CAPABILITIES = {"layernorm": {"eps":
1e-6}}`` declares it, and every check that runs the implementation's LayerNorm -- the op, the
block, the embedding and MLM-head LayerNorms, the model and its oracles -- computes at that eps
(tests/examples/pinned_eps.py: the reference with every LayerNorm pinned at 1e-6).  Declared it
is green; undeclared, declared with another value, or declared with a real LayerNorm bug it is
red; a declaration that is no eps is refused in one line."""

from __future__ import annotations

import math

import numpy as np
import pytest

from minibert_spec.protocol import ImplProxy, NotApplicable, capabilities
from minibert_spec.protocol.capabilities import DeclarationError
from tests.examples import pinned_eps
from tests.unshrunk import check_implementation

ROWS = ["layernorm", "block", "embedding_ln", "mlm_head", "model"]
KINDS = ["fd", "invariant", "sympy", "oracle.forward", "oracle.backward"]


@pytest.fixture(scope="module")
def declared():
    return check_implementation(pinned_eps.declared, ops=ROWS, kinds=KINDS)


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_the_declared_module_is_green_on_every_layernorm_row(declared):
    failed = [f"{r.id}: {r.message[:300]}" for r in declared.failures()]
    assert not failed, "\n".join(failed)
    grid = declared.grid()
    assert {op: declared.verdict(grid[op]) for op in ROWS} == dict.fromkeys(ROWS, "ok")
    ran = {r.id for r in declared.results if r.outcome == "passed"}
    # each row is checked at the declared eps, not skipped: FD and both oracle columns ran
    for op, family in (("layernorm", "layernorm"), ("block", "block_bias"),
                       ("embedding_ln", "embedding_ln"), ("mlm_head", "mlm_head_gelu")):
        assert {f"fd[{family}]", f"oracle.forward[{family}-f64]",
                f"oracle.backward[{family}-f64]"} <= ran, (op, sorted(ran))
    assert {"sympy[layernorm.forward]", "sympy[layernorm.backward.dx]"} <= ran
    assert any(i.startswith("oracle.backward[model.bert-") for i in ran)
    assert any(i.startswith("oracle.backward[model.dout-") for i in ran)


@pytest.mark.slow  # its fixture runs every layernorm row (48 s): the slow tier (issue 40)
def test_a_check_about_another_eps_says_the_declaration_fixes_it(declared):
    by_id = {r.id: r for r in declared.results}
    inside = by_id["invariant[layernorm.eps_inside_sqrt-1e-05]"]
    assert inside.outcome == "n/a" and "eps fixed at 1e-06 by the declaration" in inside.message
    # nothing at another eps is red or silently passed: it is n/a and names the declared value
    for r in declared.results:
        if r.outcome == "n/a" and "eps" in r.message and "affine" not in r.message:
            assert "eps fixed at 1e-06 by the declaration" in r.message, r.message


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_the_same_module_undeclared_is_red_on_every_layernorm_row():
    report = check_implementation(pinned_eps.undeclared, ops=ROWS,
                                  kinds=["invariant", "oracle.forward"])
    grid = report.grid()
    assert {op: report.verdict(grid[op]) for op in ROWS} == dict.fromkeys(ROWS, "FAIL")
    (normalises,) = [r for r in report.results if r.id == "invariant[layernorm.normalises]"]
    # the second way the fault shows: the eps = 0 call names the constant the code fixes
    assert normalises.outcome == "failed"
    assert "fixes it at 1e-06" in normalises.message
    assert "CAPABILITIES['layernorm'] = {'eps': 1e-06}" in normalises.message


def test_a_declaration_does_not_whitewash_a_wrong_value():
    """Declared 1e-5, fixed at 1e-6 in the code: every row computing at 1e-5 is red."""
    report = check_implementation(pinned_eps.misdeclared, ops=["layernorm", "block"],
                                  kinds=["oracle.forward", "sympy"])
    grid = report.grid()
    assert report.verdict(grid["layernorm"]) == "FAIL"
    assert report.verdict(grid["block"]) == "FAIL"
    assert any(r.id == "sympy[layernorm.forward]" and r.outcome == "failed"
               for r in report.results)


def test_a_real_layernorm_bug_stays_red_with_the_eps_declared():
    """gamma pulled outside the feature means in the backward: red on the layernorm row (FD and
    the oracle), with its eps declared; the forward is right and stays green."""
    report = check_implementation(pinned_eps.buggy, ops=["layernorm"],
                                  kinds=["fd", "oracle.forward", "oracle.backward"])
    outcomes = {r.id: r.outcome for r in report.results}
    assert outcomes["fd[layernorm]"] == "failed"
    assert outcomes["oracle.backward[layernorm-f64]"] == "failed"
    assert outcomes["oracle.forward[layernorm-f64]"] == "passed"


@pytest.mark.parametrize("value", [0.0, -1e-6, math.nan, math.inf, "1e-6", 1, 0, np.int64(3),
                                   (1e-6, True), (True, 1e-6), [1e-6], None])
def test_a_declared_eps_that_is_no_eps_is_refused_in_one_line(value):
    impl = pinned_eps.build(declared=None)
    impl.CAPABILITIES = {"layernorm": {"eps": value}}
    with pytest.raises(DeclarationError) as e:
        capabilities(impl)
    text = str(e.value)
    assert "\n" not in text and text.startswith("CAPABILITIES['layernorm']['eps']: expected")
    assert "positive finite float" in text and f"got {value!r}" in text, text


@pytest.mark.parametrize("value", [1e-6, np.float32(1e-8), 1e-12, True, False, (True, False)])
def test_a_number_or_the_options_own_values_are_taken(value):
    impl = pinned_eps.build(declared=None)
    impl.CAPABILITIES = {"layernorm": {"eps": value}}
    got = capabilities(impl)["layernorm"]["eps"]
    assert got == (value if isinstance(value, tuple) else (value,))


def test_the_proxy_takes_the_declared_eps_alone():
    """A call at the declared eps reaches the code; one at another eps, or leaving eps out (the
    code's own default), is n/a naming the declared value -- for the op and for a composite."""
    proxy = ImplProxy(pinned_eps.declared, "pinned")
    x, g, b = np.random.default_rng(0).standard_normal((3, 2, 4)) + [[[0.0]], [[1.0]], [[0.0]]]
    y, _ = proxy.layernorm_forward(x, g[0], b[0], 1e-6)
    assert y.shape == x.shape
    for call in (lambda: proxy.layernorm_forward(x, g[0], b[0], 1e-5),
                 lambda: proxy.layernorm_forward(x, g[0], b[0]),
                 lambda: proxy.layernorm_forward(x, g[0], b[0], eps=0.0)):
        with pytest.raises(NotApplicable, match=r"eps fixed at 1e-06 by the declaration"):
            call()
    ids = np.array([[0, 1]])
    W = np.random.default_rng(1).standard_normal((3, 4))
    with pytest.raises(NotApplicable, match=r"embedding_ln .*the call leaves eps out"):
        proxy.embedding_ln_forward(ids, ids * 0, W, W, W[:1], g[0], b[0])
    proxy.embedding_ln_forward(ids, ids * 0, W, W, W[:1], g[0], b[0], 1e-6)
