"""The trainer's held-out evaluation (minibert_reference.train.loop.evaluate): the loss over every
held-out token at once, not the mean of per-batch means."""

from __future__ import annotations

import numpy as np
import pytest

from minibert_reference.config import mini_bert
from minibert_spec.numerics.finite_differences import random_params
from minibert_spec.protocol import IGNORE_INDEX

TINY = mini_bert(n_layers=1, hidden=8, n_heads=2, intermediate=16, max_len=6, vocab_size=11)


@pytest.mark.equation("loss.ce.mean")
@pytest.mark.parametrize("batch_size", [1, 2, 4])
def test_evaluate_is_the_loss_over_every_held_out_token(impl, batch_size):
    """Held-out rows predicting 1, 5, 0, 0, 2, 3 tokens (a batch with none when batch_size is
    1 or 2): evaluate() equals the mean cross-entropy over all of them at once, not the mean of
    per-batch means."""
    from minibert_reference.train.loop import evaluate

    params = random_params(impl, TINY, seed=3)
    rng = np.random.default_rng(3)
    ids = rng.integers(0, TINY.vocab_size, size=(6, 6))
    mask = np.ones((6, 6), dtype=np.int64)
    mask[4, 5:] = 0
    labels = np.full((6, 6), IGNORE_INDEX)
    for row, n in enumerate([1, 5, 0, 0, 2, 3]):
        pos = rng.choice(int(mask[row].sum()), size=n, replace=False)
        labels[row, pos] = rng.integers(0, TINY.vocab_size, size=n)
    whole = float(impl.loss(params, TINY, ids, labels=labels, attention_mask=mask))
    got = evaluate(impl, params, TINY, ids, mask, labels, batch_size=batch_size)
    assert got == pytest.approx(whole, rel=1e-12)
