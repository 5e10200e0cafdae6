"""The chain-rule proofs of block.backward, model.backward and decoder.backward (arbitrary
stages as undefined SymPy functions) refute a wrongly wired backward: each bug below is one a
hand-written backward can have, and each is caught."""

from __future__ import annotations

import pytest
import sympy as sp

from minibert_spec.equations._sym import Stage, chain_equal
from minibert_spec.equations.block import (
    block_backward_composed,
    postln_stream,
    prove_block_backward,
)
from minibert_spec.equations.model import model_backward_composed, prove_model_backward


def test_the_code_order_is_proven():
    assert prove_block_backward().status == "proven"
    assert prove_model_backward().status == "proven"


def _block(skip_ffn=True, skip_attn=True, ln1_at_r2=False):
    def composed(x, dout, stages):
        mha, ln1, ffn, ln2 = stages
        n = len(x)
        r1, h, r2 = postln_stream(x, stages)
        dr2, dp_ln2 = ln2.vjp(r2, dout)
        dh_ffn, dp_ffn = ffn.vjp(h, dr2)
        dh = [(dr2[i] if skip_ffn else 0) + dh_ffn[i] for i in range(n)]
        dr1, dp_ln1 = ln1.vjp(r2 if ln1_at_r2 else r1, dh)  # r2: LN2's cache for LN1
        dx_attn, dp_mha = mha.vjp(x, dr1)
        dx = [(dr1[i] if skip_attn else 0) + dx_attn[i] for i in range(n)]
        return dx, [dp_mha, dp_ln1, dp_ffn, dp_ln2]
    return composed


def test_block_proof_is_the_reference_composition():
    x, d = sp.symbols("x0:2", real=True), sp.symbols("d0:2", real=True)
    stages = tuple(Stage(n, 2, (sp.Symbol(f"p{n}"),)) for n in "ALFN")
    a, b = block_backward_composed(list(x), list(d), stages), _block()(list(x), list(d), stages)
    assert all(chain_equal(u, v) for u, v in zip(a[0], b[0]))


def test_block_proof_refutes_miswired_backwards():
    for bug in (dict(skip_ffn=False), dict(skip_attn=False), dict(ln1_at_r2=True)):
        proof = prove_block_backward(_block(**bug))
        assert proof.status == "refuted", bug


def test_model_proof_is_the_reference_composition():
    from minibert_spec.equations.model import _parts
    parts = _parts()
    a, b = model_backward_composed(*parts), _model(*parts)
    assert a.keys() == b.keys() and all(chain_equal(a[k], b[k]) for k in a)


def test_model_proof_refutes_miswired_backwards():
    def layer_order(p, emb, blocks, head, ell):  # each block's backward at the other's cache
        return _model(p, emb, blocks, head, ell, swap=True)

    def untied(p, emb, blocks, head, ell):  # the decoder's share of the word table dropped
        return _model(p, emb, blocks, head, ell, tied=False)

    assert prove_model_backward(lambda *a: _model(*a)).status == "proven"  # the test's copy
    assert prove_model_backward(layer_order).status == "refuted"
    assert prove_model_backward(untied).status == "refuted"


def _model(p, emb, blocks, head, ell, *, swap=False, tied=True):
    hs = [list(emb)]
    for b in blocks:
        hs.append(b(hs[-1]))
    logits = head(hs[-1])
    u = sp.symbols("z0:2", real=True)
    dlogits = [sp.diff(ell(*u), uk).subs(dict(zip(u, logits))) for uk in u]
    dh, (d_head, d_dec) = head.vjp(hs[-1], dlogits)
    grads = {"p_head": d_head}
    for i in reversed(range(len(blocks))):
        at = hs[len(blocks) - 1 - i] if swap else hs[i]
        dh, (grads[f"p_{i + 1}"],) = blocks[i].vjp(at, dh)
    for name in ("p_word", "p_pos"):
        grads[name] = sp.Add(*[dh[j] * sp.diff(emb[j], p[name]) for j in range(2)])
    if tied:
        grads["p_word"] += d_dec
    return grads


def test_partials_keep_different_partials_apart():
    x, y = sp.symbols("x y", real=True)
    f = sp.Function("f")
    a = sp.diff(f(x, y), x).subs({x: y ** 2})
    b = sp.diff(f(x, y), y).subs({x: y ** 2})
    assert chain_equal(a, a) and not chain_equal(a, b)
    assert not chain_equal(sp.diff(f(x, y), x).subs({x: 1}), sp.diff(f(x, y), x).subs({x: 2}))


def _decoder(p, emb, blocks, final, head, ell, *, chain=True, final_norm=True, tied=True):
    """decoder.backward's composition with one switch per bug: ``chain`` False hands every
    block the top gradient (dx not reassigned), ``final_norm`` False skips LN_f's backward,
    ``tied`` False drops the lookup's share of the token table."""
    from minibert_spec.equations.decoder import N, decoder_forward_staged

    logits, xs, h = decoder_forward_staged(emb, blocks, final, head)
    u = sp.symbols(f"z0:{N}", real=True)
    dlogits = [sp.diff(ell(*u), uk).subs(dict(zip(u, logits))) for uk in u]
    dh, (d_head,) = head.vjp(h, dlogits)
    dx, (d_norm,) = final.vjp(xs[-1], dh)
    dx = dx if final_norm else dh
    grads, top = {"p_norm": d_norm}, dx
    for i in reversed(range(len(blocks))):
        dxi, (grads[f"p_{i + 1}"],) = blocks[i].vjp(xs[i], dx if chain else top)
        dx = dxi if chain else top
    for name in ("p_tok", "p_pos"):
        grads[name] = sp.Add(*[dx[j] * sp.diff(emb[j], p[name]) for j in range(N)])
    grads["p_tok"] = grads["p_tok"] + d_head if tied else d_head
    return grads


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_decoder_proof_refutes_the_catalog_bugs():
    from minibert_spec.equations.decoder import prove_decoder_backward

    assert prove_decoder_backward().status == "proven"
    assert prove_decoder_backward(lambda *a: _decoder(*a)).status == "proven"  # the copy
    for bug in (dict(chain=False), dict(final_norm=False), dict(tied=False)):
        assert prove_decoder_backward(lambda *a, b=bug: _decoder(*a, **b)).status == "refuted", bug
