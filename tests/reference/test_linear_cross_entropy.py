"""The reference's blocked schedule of the fused linear + cross-entropy op pair, across its block
boundaries (issue "Evidence for the code added last round": chunked and blocked loops).

The op runs the cross-entropy ``block_rows`` rows at a time (default ~1 MiB of logits, 32 rows
of Mini-BERT's V = 8192): here the block size is shrunk to ``K`` rows, so that row counts below,
at, just above and several times the block size -- with an uneven last block, and blocks whose
rows are all ignored -- are reached with small arrays.  Every result is compared in float64 with
the unfused public op pairs (linear_forward -> cross_entropy_forward / _backward ->
linear_backward), which the finite-difference and oracle tests check on their own.  The last
tests reach the default block size through the model (V = 8192).

The generic evidence for the op pair (finite differences, invariants, the torch oracle) comes
from its case families in spec/suite/strategies/ like every op's; this file is the reference's own
(``block_rows`` is a reference keyword, not part of the protocol).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import minibert_reference
from minibert_reference import ops
from minibert_spec.numerics.finite_differences import random_batch, random_params
from minibert_spec.numerics.identities import close, require
from minibert_spec.protocol import IGNORE_INDEX
from minibert_spec.tolerances import F32_VS_F64_RTOL, F64_IDENTITY_RTOL

EQUATIONS = pytest.mark.equation("linear_ce.forward", "linear_ce.backward")
K = 4  # rows per block in these tests
# rows N: one row, below, at, just above, twice, twice + 1, several with an uneven last block
ROWS = [1, K - 1, K, K + 1, 2 * K, 2 * K + 1, 3 * K + 2]
H, V = 3, 7


def _close(got, want, what):
    """float64 identity: equal up to summation order, relative to the tensor's magnitude."""
    require([close("linear_cross_entropy", what, got, want)])


def _problem(N, bias, seed=0):
    """x [N, H], W, b (or None), labels with ignored rows in several blocks and, from two blocks
    on, one block whose rows are all ignored (it adds nothing to the loss)."""
    rng = np.random.default_rng(seed + N)
    x, W = rng.standard_normal((N, H)), rng.standard_normal((H, V))
    b = rng.standard_normal(V) if bias else None
    labels = rng.integers(0, V, size=N)
    labels[1::3] = IGNORE_INDEX
    if N >= 2 * K:
        labels[K:2 * K] = IGNORE_INDEX  # the second block predicts nothing
    labels[0] = 2  # the mean needs one predicted row
    return x, W, b, labels


def _composed(x, W, b, labels, reduction, dloss):
    """The unfused public op pairs: (loss, dx, dW, db)."""
    logits, c_lin = ops.linear_forward(x, W, b)
    loss, c_ce = ops.cross_entropy_forward(logits, labels, reduction=reduction)
    (dlogits,) = ops.cross_entropy_backward(dloss, c_ce)
    return (loss, *ops.linear_backward(dlogits, c_lin))


# the fused schedule against the op pairs it composes: evidence for theirs too (its blocks run
# the cross-entropy's "sum" whatever the reduction, the op pairs here the reduction itself)
@EQUATIONS
@pytest.mark.equation("loss.ce.mean", "loss.ce.sum", "loss.ce.backward.mean",
                      "loss.ce.backward.sum", "linear.backward.dx", "linear.backward.dW",
                      "linear.backward.db")
@pytest.mark.parametrize("N", ROWS)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_blocks_equal_the_op_pairs_across_block_boundaries(N, reduction, bias):
    x, W, b, labels = _problem(N, bias)
    dloss = -0.37  # a random upstream gradient (not 1): it must reach every gradient
    inputs = copy.deepcopy((x, W, b, labels))
    loss, cache = minibert_reference.linear_cross_entropy_forward(x, W, b, labels,
                                                                  reduction=reduction,
                                                                  block_rows=K)
    dx, dW, db = minibert_reference.linear_cross_entropy_backward(dloss, cache)
    for a, before in zip((x, W, b, labels), inputs):  # nothing passed in is modified
        np.testing.assert_array_equal(a, before)
    want = _composed(x, W, b, labels, reduction, dloss)
    assert loss.dtype == np.float64
    _close(loss, want[0], f"loss, N={N}")
    for name, got, w in zip(("dx", "dW", "db"), (dx, dW, db), want[1:]):
        if w is None:
            assert got is None, f"{name} without a bias"
        else:
            _close(got, w, f"{name}, N={N}")


@EQUATIONS
@pytest.mark.parametrize("N", [K + 1, 3 * K + 2])
def test_leading_axes_are_rows(N):
    """x [B, T, H] and labels [B, T]: the rows are flattened across the batch axis, so a block
    may hold the end of one sequence and the start of the next; dx keeps x's shape."""
    x, W, b, labels = _problem(N * 2, True)
    x3, labels2 = x.reshape(2, N, H), labels.reshape(2, N)
    loss, cache = minibert_reference.linear_cross_entropy_forward(x3, W, b, labels2, block_rows=K)
    dx, dW, db = minibert_reference.linear_cross_entropy_backward(0.8, cache)
    want = _composed(x, W, b, labels, "mean", 0.8)
    _close(loss, want[0], "loss")
    _close(dx, want[1].reshape(x3.shape), "dx")
    _close(dW, want[2], "dW")
    _close(db, want[3], "db")


@EQUATIONS
def test_float32_stays_float32_and_near_float64():
    x, W, b, labels = _problem(3 * K + 2, True, seed=1)
    want = minibert_reference.linear_cross_entropy_backward(
        1 / 7, minibert_reference.linear_cross_entropy_forward(x, W, b, labels, block_rows=K)[1])
    loss32, cache = minibert_reference.linear_cross_entropy_forward(
        *(a.astype(np.float32) for a in (x, W, b)), labels, block_rows=K)
    got = minibert_reference.linear_cross_entropy_backward(np.float32(1 / 7), cache)
    assert loss32.dtype == np.float32
    for g32, g64 in zip(got, want):
        assert g32.dtype == np.float32
        np.testing.assert_allclose(g32, g64, rtol=0,
                                   atol=F32_VS_F64_RTOL * float(np.max(np.abs(g64))))


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_block_rows_is_validated(bad):
    x, W, b, labels = _problem(K, True)
    with pytest.raises(ValueError, match="block_rows"):
        minibert_reference.linear_cross_entropy_forward(x, W, b, labels, block_rows=bad)


# --------------------------------------------------------------- the default block size
BIG_V = minibert_reference.mini_bert(n_layers=1, hidden=8, n_heads=2, intermediate=16, max_len=8,
                            vocab_size=8192)


@EQUATIONS
def test_default_block_size_splits_large_vocabularies():
    """V = 8192 float64: the default block is 16 rows (1 MiB), so 3 * 16 + 5 rows make four
    blocks, the last one uneven."""
    rows = ops.CE_BLOCK_BYTES // (8192 * 8)
    assert rows == 16
    rng = np.random.default_rng(3)
    N = 3 * rows + 5
    x, W = rng.standard_normal((N, 8)), 0.3 * rng.standard_normal((8, 8192))
    b, labels = rng.standard_normal(8192), rng.integers(0, 8192, size=N)
    labels[::4] = IGNORE_INDEX
    loss, cache = minibert_reference.linear_cross_entropy_forward(x, W, b, labels)
    want = _composed(x, W, b, labels, "mean", 0.5)
    _close(loss, want[0], "loss")
    for name, got, w in zip(("dx", "dW", "db"), minibert_reference.linear_cross_entropy_backward(
            0.5, cache), want[1:]):
        _close(got, w, name)


@EQUATIONS
@pytest.mark.parametrize("entry", ["loss_and_grads", "masked_lm_loss_and_grads"])
def test_model_head_across_default_blocks(entry):
    """The Mini-BERT head at V = 8192 runs the fused op on 24 rows (all positions) or on the
    18 predicted ones (the trainer's masked head): two blocks of 16 rows, the last uneven.
    Loss and every gradient equal forward's logits through the public cross-entropy and
    backward."""
    config = BIG_V
    params = random_params(minibert_reference, config, seed=5)
    batch = random_batch(config, B=3, T=8, seed=5)
    labels = batch["input_ids"].copy()
    labels.reshape(-1)[::4] = IGNORE_INDEX  # 18 of 24 positions predicted
    got = getattr(minibert_reference, entry)(params, config, batch["input_ids"], labels=labels)
    logits, cache = minibert_reference.forward(params, config, batch["input_ids"])
    want, c_ce = ops.cross_entropy_forward(logits, labels)
    grads, d_emb = minibert_reference.backward(ops.cross_entropy_backward(1.0, c_ce)[0], cache)
    _close(got[0], want, "loss")
    largest = max(float(np.max(np.abs(g))) for g in grads.values())
    assert list(got[1]) == list(grads)
    for k in grads:
        if k.endswith("attn.b_k"):  # exactly 0 in exact arithmetic: rounding noise both sides
            assert float(np.max(np.abs(got[1][k]))) <= F64_IDENTITY_RTOL * largest, k
        else:
            _close(got[1][k], grads[k], k)
    _close(got[2], d_emb, "d_embeddings")
