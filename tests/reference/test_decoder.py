"""The reference's causal decoder (reference/decoder.py): its parameters follow the config's
parts, every entry point refuses bad input with a ValueError naming the argument, and the
next-token loss reads position t's logits against label t + 1 only.  Its gradients are judged
by the suite's decoder row (finite differences, transformers; tests/suite/test_suite_reference.py
runs them on the reference)."""

from __future__ import annotations

import numpy as np
import pytest

from minibert_reference import decoder as D
from minibert_reference.config import DecoderConfig, gpt2, llama
from minibert_reference.ops import IGNORE_INDEX

TINY = gpt2(n_layers=1, hidden=8, n_heads=2, intermediate=12, max_len=6, vocab_size=7)


def _params(config=TINY, dtype=np.float64):
    return D.init_params(config, seed=0, dtype=dtype)


def test_parameters_follow_the_parts():
    names = set(D.param_shapes(TINY))
    assert {"embeddings.token.W", "embeddings.position.W", "layers.0.attn.b_q",
            "layers.0.ffn.b_2", "final_ln.beta"} <= names and "lm_head.W" not in names
    lean = TINY.replace(attn_bias=False, mlp_bias=False, normalization="rmsnorm",
                        tie_embeddings=False)
    names = set(D.param_shapes(lean))
    assert "lm_head.W" in names and D.param_shapes(lean)["lm_head.W"] == (7, 8)
    assert not any(n.endswith(("beta", ".b_q", ".b_1", ".b_2")) for n in names), sorted(names)
    # a layer is a block row's p: the same names as minibert_reference.ops.block_param_names
    from minibert_reference.ops import block_param_names

    layer = {n[len("layers.0."):] for n in names if n.startswith("layers.0.")}
    assert layer == set(block_param_names(False, "pre", b_1=False, b_2=False,
                                          normalization="rmsnorm"))
    shapes = D.param_shapes(llama(hidden=8, intermediate=12))
    assert "embeddings.position.W" not in shapes and "lm_head.W" in shapes
    assert {n[len("layers.0."):] for n in shapes if n.startswith("layers.0.")} == set(
        block_param_names(False, "pre", normalization="rmsnorm", ffn="swiglu"))
    assert shapes["layers.0.swiglu.W_3"] == (8, 12) and shapes["layers.0.swiglu.W_2"] == (12, 8)
    biased = D.param_shapes(llama(hidden=8, intermediate=12, mlp_bias=True))
    assert biased["layers.1.swiglu.b_3"] == (12,)


@pytest.mark.parametrize("call, match", [
    (lambda p, ids: D.decoder_forward(p, object(), ids), "config: expected a minibert_reference"),
    (lambda p, ids: D.decoder_forward(p, TINY, ids + 7), r"input_ids: .*\[0, 7\)"),
    (lambda p, ids: D.decoder_forward(p, TINY, np.zeros((1, 7), int)),
     r"input_ids: sequence length 7 exceeds config.max_len=6"),
    (lambda p, ids: D.decoder_forward({k: v for k, v in p.items() if k != "final_ln.beta"},
                                      TINY, ids), r"params: .*missing \['final_ln.beta'\]"),
    (lambda p, ids: D.decoder_forward({**p, "final_ln.beta": p["final_ln.beta"]
                                       .astype(np.float32)}, TINY, ids),
     r"params\['final_ln.beta'\]: expected dtype float64"),
    (lambda p, ids: D.decoder_loss(p, TINY, ids[:, :1]), r"input_ids: a next-token loss needs "
                                                         r"T >= 2"),
    (lambda p, ids: D.decoder_loss(p, TINY, ids, ids[:, :2]), r"labels: expected shape"),
    (lambda p, ids: D.decoder_loss(p, TINY, ids, np.full_like(ids, IGNORE_INDEX)),
     r"labels: the mean needs at least one position"),
    (lambda p, ids: D.decoder_backward(np.zeros((2, 4, 7)), D.decoder_forward(p, TINY, ids)[1]),
     r"dlogits: expected shape \(2, 5, 7\)"),
])
def test_bad_input_is_a_value_error_naming_the_argument(call, match):
    ids = np.random.default_rng(0).integers(0, 7, size=(2, 5))
    with pytest.raises(ValueError, match=match):
        call(_params(), ids)


def test_config_refuses_what_no_decoder_is():
    with pytest.raises(ValueError, match="normalization: expected 'layernorm' or 'rmsnorm'"):
        DecoderConfig(normalization="batchnorm")
    with pytest.raises(ValueError, match="d_k = hidden / n_heads must be even"):
        llama(hidden=6, n_heads=2)
    with pytest.raises(ValueError, match="tie_embeddings: expected True or False"):
        gpt2(tie_embeddings=1)


def test_the_last_position_predicts_nothing_and_labels_are_shifted():
    """Changing the label at position 0 (no position predicts it) or the logits' input at the
    last position's label slot changes nothing; the loss is the mean over labels[:, 1:]."""
    p = _params()
    ids = np.array([[1, 2, 3, 4], [4, 3, 2, 1]])
    base = D.decoder_loss(p, TINY, ids)
    assert D.decoder_loss(p, TINY, ids, np.where(np.arange(4) == 0, 6, ids)) == base
    logits, _ = D.decoder_forward(p, TINY, ids)
    z = logits[:, :-1] - logits[:, :-1].max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    want = -np.take_along_axis(logp, ids[:, 1:, None], -1).mean()
    np.testing.assert_allclose(base, want, rtol=1e-13)
    # the next-token loss's gradient of the last position's logits is exactly 0: its row of
    # the tied table's head share gets nothing from position T-1
    labels = np.array([[IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX, 5], [IGNORE_INDEX] * 4])
    loss, grads = D.decoder_loss_and_grads(p, TINY, ids, labels)
    assert np.isfinite(loss) and set(grads) == set(p)


def test_float32_stays_float32():
    p = _params(dtype=np.float32)
    ids = np.array([[1, 2, 3]])
    logits, _ = D.decoder_forward(p, TINY, ids)
    loss, grads = D.decoder_loss_and_grads(p, TINY, ids)
    assert logits.dtype == np.float32 and np.asarray(loss).dtype == np.float32
    assert {g.dtype for g in grads.values()} == {np.dtype(np.float32)}


def test_llama_parts_refuse_bad_keywords():
    """The LLaMA pieces a decoder layer passes down (attention's rope, the block's ffn) name the
    argument and what it expected."""
    from minibert_reference.ops import attention_forward, block_forward, block_param_names

    rng = np.random.default_rng(0)
    x, W = rng.standard_normal((2, 3, 8)), rng.standard_normal((8, 8))
    with pytest.raises(ValueError, match=r"rope: expected None or one of \('interleaved', "
                                         r"'half'\), got 'spiral'"):
        attention_forward(x, W, W, W, W, n_heads=2, rope="spiral")
    with pytest.raises(ValueError, match=r"n_heads: RoPE .* d_k = H / n_heads must be even, "
                                         r"got H=8, n_heads=8"):
        attention_forward(x, W, W, W, W, n_heads=8, rope="half")
    with pytest.raises(ValueError, match=r"rope_base: expected a finite number > 1, got 1.0"):
        attention_forward(x, W, W, W, W, n_heads=2, rope="half", rope_base=1.0)
    names = block_param_names(False, "pre", normalization="rmsnorm", ffn="swiglu")
    p = {n: rng.standard_normal(s) for n, s in D.ops.block_param_shapes(names, 8, 12).items()}
    with pytest.raises(ValueError, match=r"ffn: expected one of \('mlp', 'swiglu'\), got 'moe'"):
        block_forward(x, p, n_heads=2, norm="pre", normalization="rmsnorm", ffn="moe")
    with pytest.raises(ValueError, match=r"swiglu.W_3"):
        block_forward(x, {**p, "swiglu.W_3": p["swiglu.W_3"][:, :5]}, n_heads=2, norm="pre",
                      normalization="rmsnorm", ffn="swiglu")
    with pytest.raises(ValueError, match=r"p: expected the keys .*ffn='mlp'.*missing "
                                         r"\['ffn.W_1', 'ffn.W_2'\]"):
        block_forward(x, p, n_heads=2, norm="pre", normalization="rmsnorm")
    out, _ = block_forward(x, p, n_heads=2, norm="pre", normalization="rmsnorm", ffn="swiglu",
                           rope="half", causal=True)
    assert out.shape == x.shape


# --------------------------------------------------------------------------- the ports' forms
def test_config_refuses_forms_no_decoder_has():
    with pytest.raises(ValueError, match=r"position: expected 'learned', 'rope', 'learned_rope', "
                                         r"'sinusoidal' or 'none', got 'alibi'"):
        gpt2(position="alibi")
    with pytest.raises(ValueError, match="final_norm: expected True or False, got 0"):
        gpt2(final_norm=0)
    with pytest.raises(ValueError, match="head_bias: expected True or False, got 'yes'"):
        gpt2(head_bias="yes")
    with pytest.raises(ValueError, match="d_k = hidden / n_heads must be even"):
        gpt2(position="learned_rope", hidden=6, n_heads=2)


def test_the_forms_parameters():
    """A position table with learned positions only (with or without RoPE), the final norm's
    parameters only with it, the head's bias [V] only with it (tied or untied)."""
    ports = TINY.replace(position="learned_rope", final_norm=False, head_bias=True,
                         tie_embeddings=False)
    shapes = D.param_shapes(ports)
    assert shapes["embeddings.position.W"] == (6, 8) and shapes["lm_head.b"] == (7,)
    assert shapes["lm_head.W"] == (7, 8) and not any(n.startswith("final_ln") for n in shapes)
    for position in ("sinusoidal", "none", "rope"):
        assert "embeddings.position.W" not in D.param_shapes(TINY.replace(position=position))
    tied = D.param_shapes(TINY.replace(head_bias=True))
    assert tied["lm_head.b"] == (7,) and "lm_head.W" not in tied
    assert list(D.param_shapes(TINY)) == list(D.param_shapes(gpt2(
        n_layers=1, hidden=8, n_heads=2, intermediate=12, max_len=6, vocab_size=7,
        final_norm=True, head_bias=False)))  # the defaults are GPT-2's form, unchanged


def _logits(config, params, ids):
    return D.decoder_forward(params, config, ids)[0]


def test_each_form_is_the_standard_one_at_equal_values():
    """Identities between forms, written from their definitions (not from the code): the
    sinusoidal form is the learned one with the table set to the sin/cos encoding; learned +
    RoPE with a zero table is RoPE alone; a head bias adds b to every position's logits; no
    positions is learned positions with a zero table."""
    from minibert_reference.ops import sinusoidal_encoding

    ids = np.random.default_rng(1).integers(0, 7, size=(2, 5))
    p = D.init_params(TINY, seed=1, dtype=np.float64)
    pe = sinusoidal_encoding(6, 8)
    table = {**p, "embeddings.position.W": pe}
    sin = TINY.replace(position="sinusoidal")
    np.testing.assert_allclose(_logits(sin, {k: v for k, v in p.items()
                                             if k != "embeddings.position.W"}, ids),
                               _logits(TINY, table, ids), rtol=0, atol=1e-12)
    zero = {**p, "embeddings.position.W": np.zeros((6, 8))}
    no_table = {k: v for k, v in p.items() if k != "embeddings.position.W"}
    np.testing.assert_allclose(_logits(TINY.replace(position="none"), no_table, ids),
                               _logits(TINY, zero, ids), rtol=0, atol=1e-12)
    np.testing.assert_allclose(_logits(TINY.replace(position="learned_rope"), zero, ids),
                               _logits(TINY.replace(position="rope"), no_table, ids),
                               rtol=0, atol=1e-12)
    b = np.random.default_rng(2).standard_normal(7)
    np.testing.assert_allclose(_logits(TINY.replace(head_bias=True), {**p, "lm_head.b": b}, ids),
                               _logits(TINY, p, ids) + b, rtol=0, atol=1e-12)


def test_without_the_final_norm_the_head_reads_the_last_block():
    """No final norm: the logits are the last block's output times the head (the blocks run
    here through the public block op), not the normed model's."""
    from minibert_reference.ops import block_forward

    config = TINY.replace(final_norm=False, tie_embeddings=False)
    p = D.init_params(config, seed=3, dtype=np.float64)
    ids = np.array([[1, 2, 3, 4], [4, 4, 0, 6]])
    x = p["embeddings.token.W"][ids] + p["embeddings.position.W"][:4]
    for i in range(config.n_layers):
        layer = {k[len(f"layers.{i}."):]: v for k, v in p.items() if k.startswith(f"layers.{i}.")}
        x, _ = block_forward(x, layer, n_heads=2, eps=config.ln_eps, activation="gelu_tanh",
                             norm="pre", causal=True)
    logits, cache = D.decoder_forward(p, config, ids)
    np.testing.assert_allclose(logits, x @ p["lm_head.W"].T, rtol=0, atol=1e-12)
    assert cache.final is None
    normed = TINY.replace(tie_embeddings=False)
    q = {**p, "final_ln.gamma": np.ones(8), "final_ln.beta": np.zeros(8)}
    assert not np.allclose(_logits(normed, q, ids), logits)
