"""The training loop: checkpoint round trip, bit-exact resume, a regression guard on the first
10 steps, the seed-001 reconstruction experiment, plots, fill-mask and the CLI.

Everything runs on tiny float64 models and synthetic ids (no tokenizer, no corpus) except the
CLI smoke test.  The loop orchestrates the implementation under test (``impl``).
"""

import json

import numpy as np
import pytest

from minibert_reference.config import mini_bert
from minibert_reference.train import data as D
from minibert_reference.train.loop import (
    TrainConfig,
    heldout_set,
    load_state,
    save_state,
    seed001_experiment,
    train,
)
from minibert_spec.tolerances import REGRESSION_RTOL_F64

TINY = mini_bert(n_layers=2, hidden=8, n_heads=2, intermediate=16, max_len=8, vocab_size=23)


def _data(n=40, seed=123):
    """Synthetic token lists packed into rows of T = 8 (repeats, padding, [SEP]s)."""
    rng = np.random.default_rng(seed)
    lists = [list(rng.integers(D.N_SPECIAL, TINY.vocab_size, size=rng.integers(2, 9)))
             for _ in range(n)]
    return D.build_sequences(lists, TINY.max_len)


def _tcfg(**kw):
    base = dict(steps=10, batch_size=4, accum_steps=2, peak_lr=1e-2, warmup_steps=3,
                weight_decay=0.01, max_grad_norm=1.0, eval_every=5, eval_rows=8,
                ckpt_every=100, seed=0, dtype="float64")
    return TrainConfig(**{**base, **kw})


def _quiet(*_a, **_k):
    pass


def _assert_states_identical(a, b):
    assert a.step == b.step
    for d1, d2 in ((a.params, b.params), (a.opt_state["m"], b.opt_state["m"]),
                   (a.opt_state["v"], b.opt_state["v"])):
        assert list(d1) == list(d2)
        for k in d1:
            assert d1[k].dtype == d2[k].dtype and np.array_equal(d1[k], d2[k]), k
    assert a.rng.bit_generator.state == b.rng.bit_generator.state
    assert a.history == b.history


def test_checkpoint_round_trip(impl, tmp_path):
    tcfg = _tcfg(steps=4)
    state = train(impl, TINY, tcfg, _data(), log=_quiet)
    path = str(tmp_path / "ck.safetensors")
    save_state(path, state, TINY, tcfg, tokenizer_json='{"x": 1}')
    loaded, cfg, tcfg2, tok = load_state(path)
    assert cfg == TINY and tcfg2 == tcfg and tok == '{"x": 1}'
    _assert_states_identical(state, loaded)
    with open(path, "rb") as fh:  # safetensors: 8-byte header length then JSON, never pickle
        n = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(n))
    assert header["__metadata__"]["format"].startswith("minibert-checkpoint")
    assert header["param/mlm.W"]["dtype"] == "F64"


@pytest.mark.equation("optim.adamw", "schedule.warmup_linear", "clip.global_norm")
def test_resume_is_bit_exact(impl, tmp_path):
    """N steps in one go == k steps, checkpoint, load, N - k more (float64, bit for bit)."""
    tcfg = _tcfg(steps=7)
    data = _data()
    held = heldout_set(*_data(8, seed=9), rows=8, seed=0, vocab_size=TINY.vocab_size)
    straight = train(impl, TINY, tcfg, data, held, log=_quiet)
    path = str(tmp_path / "ck.safetensors")
    first = train(impl, TINY, tcfg, data, held, stop_after=3, checkpoint_path=path, log=_quiet)
    assert first.step == 3
    resumed, cfg, tcfg2, _ = load_state(path)
    resumed = train(impl, cfg, tcfg2, data, held, state=resumed, log=_quiet)
    _assert_states_identical(straight, resumed)


# Regression guard. The numbers below were generated once by running this exact configuration with
# the reference implementation (commit "Training tests", full MLM head; the sparse head the
# trainer now uses reproduces them), so they guard against *changes* of the training dynamics;
# they are not independent evidence of correctness (the oracle and FD tests are). Tiny shapes keep
# every BLAS call single-threaded and the values thread-count independent; the tolerance allows
# for another BLAS's summation order.
REGRESSION_LOSSES = [
    3.1734527633822576, 3.143600705941253, 3.1137550833181065, 3.1056588631486233,
    3.0965898113832484, 3.0636379198523565, 3.0910425593258015, 2.991160497587272,
    3.120047394396424, 3.0405384084526497,
]
REGRESSION_PARAM_SUM = 39.48901356299112
REGRESSION_PARAM_SQ = 41.4561902919683


def _checksums(params):
    keys = sorted(params)
    return (float(sum(np.sum(params[k]) for k in keys)),
            float(sum(np.sum(params[k] * params[k]) for k in keys)))


@pytest.mark.equation("optim.adamw", "schedule.warmup_linear", "clip.global_norm")
def test_regression_first_10_steps(impl):
    state = train(impl, TINY, _tcfg(), _data(), log=_quiet)
    np.testing.assert_allclose(state.history["loss"], REGRESSION_LOSSES,
                               rtol=REGRESSION_RTOL_F64)
    s, sq = _checksums(state.params)
    np.testing.assert_allclose([s, sq], [REGRESSION_PARAM_SUM, REGRESSION_PARAM_SQ],
                               rtol=REGRESSION_RTOL_F64)


def test_training_reduces_heldout_loss(impl):
    """A tiny model on a learnable toy language (each row repeats one token) gets better than
    the unigram baseline: the whole loop (masking, accumulation, clipping, schedule) works."""
    rng = np.random.default_rng(0)
    lists = [[int(t)] * 6 for t in rng.integers(D.N_SPECIAL, TINY.vocab_size, size=200)]
    ids, mask = D.build_sequences(lists, TINY.max_len)
    held = heldout_set(ids[-40:], mask[-40:], rows=40, seed=0, vocab_size=TINY.vocab_size)
    tcfg = _tcfg(steps=120, batch_size=8, accum_steps=1, peak_lr=3e-2, warmup_steps=10,
                 eval_every=120)
    state = train(impl, TINY, tcfg, (ids[:-40], mask[:-40]), held, log=_quiet)
    baseline = D.unigram_baseline(D.unigram_log_probs(ids[:-40], mask[:-40], TINY.vocab_size),
                                  held["labels"])
    assert state.history["eval_loss"][-1] < 0.7 * baseline  # untrained: ~ baseline


def test_seed001_experiment_small():
    res = seed001_experiment(epochs=6, n_seqs=16, seq_len=8, batch_size=8)
    assert len(res["curve"]) == 7
    assert res["final_mse"] < res["initial_mse"] < res["pe_only_baseline"]
    assert res["pe_only_baseline"] < res["zeros_baseline"]
    assert res["claimed"] == 0.0043


def test_attention_maps_rows_sum_to_one_and_plots(impl, tmp_path):
    pytest.importorskip("matplotlib")
    from minibert_reference.train import plots

    params = impl.init_params(TINY, seed=0, dtype=np.float64)
    ids, mask = D.build_sequences([[5, 6, 7, 8, 9]], TINY.max_len)
    maps = plots.attention_maps(impl, params, TINY, ids, mask)
    assert maps.shape == (TINY.n_layers, 1, TINY.n_heads, TINY.max_len, TINY.max_len)
    np.testing.assert_allclose(maps.sum(axis=-1), 1.0, rtol=1e-12)
    assert np.all(maps[..., mask[0] == 0] == 0)  # padded keys get no attention
    plots.plot_attention(str(tmp_path / "a.png"), maps, [str(i) for i in ids[0]])
    hist = {"step": list(range(60)), "loss": list(np.linspace(5, 3, 60)), "eval_step": [30, 60],
            "eval_loss": [4.0, 3.5]}
    plots.plot_loss_curve(str(tmp_path / "l.png"), hist, baseline=4.2)
    for name in ("a.png", "l.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fill_mask_top_k(impl):
    pytest.importorskip("tokenizers")
    from minibert_spec.cli.fill_mask import fill_mask

    text = "the quick brown fox jumps over the lazy dog . " * 10
    tok = D.train_tokenizer([text], vocab_size=60, min_frequency=1)
    cfg = TINY.replace(vocab_size=tok.get_vocab_size())
    params = impl.init_params(cfg, seed=0, dtype=np.float64)
    # the special tokens the model must never propose made its likeliest, so that a fill_mask
    # that proposed them would show it (a random model alone rarely ranks them in its top 3)
    params["mlm.b"] = params["mlm.b"].copy()
    params["mlm.b"][:D.N_SPECIAL] = 50.0
    out = fill_mask(impl, params, cfg, tok, "the [MASK] fox", top_k=3)
    assert len(out) == 1 and out[0][0] == 2  # [CLS] the [MASK]
    probs = [p for _, p in out[0][1]]
    assert len(probs) == 3 and probs == sorted(probs, reverse=True) and sum(probs) <= 1
    assert not {t for t, _ in out[0][1]} & set(D.SPECIAL_TOKENS)
    with pytest.raises(ValueError, match="MASK"):
        fill_mask(impl, params, cfg, tok, "no mask here")


@pytest.mark.slow  # the slow tier: ~5 s, a training run end to end through the CLI
def test_cli_train_then_fill_mask(tmp_path, capsys):
    """`minibert train` on a user's text file (the full Mini-BERT preset, 2 steps), then
    `minibert fill-mask` on its checkpoint."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("matplotlib")
    from minibert_spec.cli import main

    text = tmp_path / "t.txt"
    sentences = [f"the function number {i} returns a list of values to the caller ."
                 for i in range(60)]
    text.write_text("\n\n".join(sentences))
    run = tmp_path / "run"
    assert main(["train", "--files", str(text), "--run-dir", str(run), "--steps", "2",
                 "--warmup", "1", "--eval-every", "2", "--eval-rows", "4", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "unigram-frequency baseline" in out and "held-out MLM loss" in out
    for name in ("tokenizer.json", "checkpoint.safetensors", "loss_curve.png", "attention.png",
                 "history.json", "corpus.txt"):
        assert (run / name).exists(), name
    assert main(["fill-mask", str(run / "checkpoint.safetensors"), "the [MASK] returns",
                 "-k", "2"]) == 0
    assert "[MASK] at position 2" in capsys.readouterr().out


def test_seed001_claim_depends_on_the_undefined_embedding_scale():
    """Verdict on the NumPy-Transformer document's "MSE 0.0043 after 500 epochs": the document
    fixes neither the data nor the embedding scale, and the number means nothing without them.
    With BERT-sized embeddings (std 0.02) the target is almost the positional encoding, and
    outputting PE alone already scores ~0.0004, ten times better than the claim; with unit
    embeddings predicting zeros scores ~1.5.  (Measured 500-epoch runs, in the training note:
    std 1.0 -> 0.020, std 0.02 -> 0.00027.)"""
    small = seed001_experiment(epochs=0, embed_std=0.02)
    unit = seed001_experiment(epochs=0, embed_std=1.0)
    assert small["pe_only_baseline"] < small["claimed"] / 5
    assert unit["zeros_baseline"] > 1.0 and unit["pe_only_baseline"] > 0.5
