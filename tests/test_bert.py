"""The bert_base preset builds and runs; the BERT switches keep their contracts (token types
default to 0, the head-off forward returns the last hidden states, pooled output and its
gradient)."""

from __future__ import annotations

import numpy as np
import pytest

from reference.config import bert_base, bert_tiny
from spec.gradcheck import random_params


@pytest.mark.slow
def test_bert_base_builds_and_runs_B1_T128(impl):
    config = bert_base()
    params = impl.init_params(config, seed=0, dtype=np.float32)
    assert sum(v.size for v in params.values()) == 109_482_240
    ids = np.random.default_rng(0).integers(0, config.vocab_size, size=(1, 128))
    h, cache = impl.forward(params, config, ids, np.ones_like(ids))
    assert h.shape == (1, 128, 768) and h.dtype == np.float32 and np.all(np.isfinite(h))
    assert cache.pooled.shape == (1, 768)


def test_token_types_default_to_zero_and_matter(impl):
    config = bert_tiny(head="none", pooler=True)
    params = random_params(impl, config, seed=2)
    ids = np.random.default_rng(3).integers(0, config.vocab_size, size=(2, 5))
    h0, _ = impl.forward(params, config, ids)
    h_zero, _ = impl.forward(params, config, ids, token_type_ids=np.zeros_like(ids))
    h_one, _ = impl.forward(params, config, ids, token_type_ids=np.ones_like(ids))
    np.testing.assert_array_equal(h0, h_zero)
    assert h0.shape == (2, 5, config.hidden) and np.abs(h0 - h_one).max() > 1e-3
    with pytest.raises(ValueError, match="token_type_ids"):
        impl.forward(params, config, ids, token_type_ids=np.full_like(ids, 2))
    with pytest.raises(ValueError, match="token_type_ids"):
        impl.forward(impl.init_params(impl.mini_bert(vocab_size=50)), impl.mini_bert(
            vocab_size=50), ids, token_type_ids=np.zeros_like(ids))


@pytest.mark.equation("pooler.forward")
def test_pooled_output_gradient_reaches_every_tensor(impl):
    """head "none" with the pooler: backward(dH, cache, d_pooled) adds the pooler's path; the
    directional derivative of <h, dH> + <pooled, dP> matches central differences."""
    config = bert_tiny(head="none", pooler=True, n_layers=1)
    params = random_params(impl, config, seed=6)
    rng = np.random.default_rng(7)
    ids = rng.integers(0, config.vocab_size, size=(2, 4))
    types = np.array([[0, 0, 1, 1], [0, 1, 1, 1]])
    dH, dP = rng.standard_normal((2, 4, config.hidden)), rng.standard_normal((2, config.hidden))

    def f(p):
        h, cache = impl.forward(p, config, ids, token_type_ids=types)
        return float((h * dH).sum() + (cache.pooled * dP).sum())

    _, cache = impl.forward(params, config, ids, token_type_ids=types)
    grads, _ = impl.backward(dH, cache, d_pooled=dP)
    assert np.abs(grads["pooler.W"]).max() > 0
    for name in ("pooler.W", "embeddings.type.W", "layers.0.attn.W_o"):
        u = rng.standard_normal(params[name].shape)
        eps = 1e-5
        fd = (f({**params, name: params[name] + eps * u})
              - f({**params, name: params[name] - eps * u})) / (2 * eps)
        assert abs(fd - float((grads[name] * u).sum())) <= 1e-7 * max(1.0, abs(fd)), name
