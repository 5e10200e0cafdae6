"""Data pipeline: MLM masking statistics and rules, sequence packing with an attention mask, the
WordPiece tokenizer's special tokens, the unigram baseline, the corpus split.

Data helpers are tooling, imported directly (the model itself is only reached through ``impl``).
"""

import numpy as np
import pytest

from minibert_reference.train import corpus
from minibert_reference.train import data as D

V = 50


def _rows(B=400, T=32, seed=0):
    """Packed-looking rows: [CLS] words [SEP] words [SEP] [PAD]..., varied lengths."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(D.N_SPECIAL, V, size=(B, T))
    lengths = rng.integers(4, T + 1, size=B)
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.int8)
    ids[:, 0] = D.CLS_ID
    ids[np.arange(B), lengths - 1] = D.SEP_ID
    ids[np.arange(B), lengths // 2] = D.SEP_ID  # a second segment
    ids[rng.random((B, T)) < 0.02] = D.UNK_ID  # unknown words are text, maskable
    ids[mask == 0] = D.PAD_ID
    return ids, mask


def test_masking_rules_and_statistics():
    ids, mask = _rows(B=4000)  # ~11k chosen positions: 5 sigma of 80% is ~2%
    corrupted, labels = D.mask_tokens(ids, mask, np.random.default_rng(1), vocab_size=V)
    candidates = (mask == 1) & ~np.isin(ids, [D.PAD_ID, D.CLS_ID, D.SEP_ID, D.MASK_ID])
    chosen = labels != D.IGNORE_INDEX
    # never a special token or padding; labels = original ids exactly where chosen
    assert not np.any(chosen & ~candidates)
    assert np.array_equal(labels[chosen], ids[chosen])
    assert np.all(labels[~chosen] == D.IGNORE_INDEX)
    assert np.array_equal(corrupted[~chosen], ids[~chosen])  # unchosen positions untouched
    # 15% of each row's candidates (rounded, at least one)
    n_cand = candidates.sum(axis=1)
    assert np.array_equal(chosen.sum(axis=1), np.maximum(1, np.rint(0.15 * n_cand)))
    # 80 / 10 / 10 among the chosen: binomial bounds at 5 sigma
    n = int(chosen.sum())
    to_mask = np.sum(corrupted[chosen] == D.MASK_ID)
    changed = np.sum((corrupted[chosen] != D.MASK_ID) & (corrupted[chosen] != ids[chosen]))
    for count, p in ((to_mask, 0.8), (changed, 0.1 * (1 - 1 / (V - D.N_SPECIAL)))):
        assert abs(count - p * n) < 5 * np.sqrt(n * p * (1 - p)), (count, p, n)
    # random replacements are ordinary tokens
    replaced = chosen & (corrupted != D.MASK_ID) & (corrupted != ids)
    assert np.all(corrupted[replaced] >= D.N_SPECIAL) and np.all(corrupted[replaced] < V)


def test_masking_positions_are_uniform_over_candidates():
    """Each position of a full row is chosen ~15% of the time (no positional bias)."""
    T = 20
    ids = np.full((4000, T), 7)
    mask = np.ones_like(ids)
    _, labels = D.mask_tokens(ids, mask, np.random.default_rng(2), vocab_size=V)
    freq = (labels != D.IGNORE_INDEX).mean(axis=0)
    assert np.allclose(freq, 3 / T, atol=5 * np.sqrt(0.15 * 0.85 / 4000))


def test_masking_is_deterministic_under_a_seed():
    ids, mask = _rows(B=16)
    a = D.mask_tokens(ids, mask, np.random.default_rng(5), vocab_size=V)
    b = D.mask_tokens(ids, mask, np.random.default_rng(5), vocab_size=V)
    c = D.mask_tokens(ids, mask, np.random.default_rng(6), vocab_size=V)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[1], c[1])


def test_masking_rejects_bad_input():
    ids, mask = _rows(B=2)
    with pytest.raises(ValueError, match="attention_mask"):
        D.mask_tokens(ids, mask[:, :3], np.random.default_rng(0), vocab_size=V)
    with pytest.raises(ValueError, match="mask_prob"):
        D.mask_tokens(ids, mask, np.random.default_rng(0), vocab_size=V, mask_prob=0.0)


def test_packing_cls_sep_and_padding():
    ids, mask = D.build_sequences([[5, 6, 7], [8] * 10, [9, 10]], seq_len=6)
    assert ids.tolist() == [[2, 5, 6, 7, 3, 0], [2, 8, 8, 8, 8, 3], [2, 8, 8, 8, 8, 3],
                            [2, 8, 8, 3, 0, 0], [2, 9, 10, 3, 0, 0]]
    assert np.array_equal(mask, (ids != D.PAD_ID).astype(np.int8))
    ids, mask = D.build_sequences([[5], [6], [7]], seq_len=8)  # several paragraphs per row
    assert ids.tolist() == [[2, 5, 3, 6, 3, 7, 3, 0]]


def test_padding_is_honoured_by_the_model(impl):
    """Changing padded ids changes nothing at real positions (attention mask + key masking)."""
    from minibert_reference.config import mini_bert

    cfg = mini_bert(n_layers=1, hidden=8, n_heads=2, intermediate=16, max_len=8, vocab_size=V)
    params = impl.init_params(cfg, seed=0, dtype=np.float64)
    ids, mask = D.build_sequences([[5, 6, 7], [8, 9, 10, 11, 12]], seq_len=8)
    out1, _ = impl.forward(params, cfg, ids, mask)
    ids2 = np.where(mask == 1, ids, 17)
    out2, _ = impl.forward(params, cfg, ids2, mask)
    real = mask.astype(bool)
    np.testing.assert_array_equal(out1[real], out2[real])


TEXT = ("the quick brown fox jumps over the lazy dog . "
        "a function returns a value to its caller . the caller uses the value . ") * 20


def test_tokenizer_special_ids_and_mask_token():
    pytest.importorskip("tokenizers")
    tok = D.train_tokenizer([TEXT, "every function has a name ."], vocab_size=120,
                            min_frequency=1)
    assert [tok.token_to_id(t) for t in D.SPECIAL_TOKENS] == list(range(5))
    assert tok.get_vocab_size() <= 120
    ids = D.encode_text(tok, "the lazy [MASK] returns a value .")
    assert ids.count(D.MASK_ID) == 1 and D.CLS_ID not in ids
    tok2 = D.tokenizer_from_json(D.tokenizer_to_json(tok))
    assert tok2.encode("the quick fox").ids == tok.encode("the quick fox").ids


def test_unigram_baseline_by_hand():
    # training tokens: 5 x3, 6 x1 (specials and padding ignored); add-one over ids 5..7
    ids = np.array([[D.CLS_ID, 5, 5, 6, D.SEP_ID, D.PAD_ID], [D.CLS_ID, 5, D.SEP_ID, 0, 0, 0]])
    mask = (ids != D.PAD_ID).astype(np.int8)
    logp = D.unigram_log_probs(ids, mask, vocab_size=8)
    p = np.array([4, 2, 1]) / 7
    np.testing.assert_allclose(np.exp(logp[5:]), p, rtol=1e-12)
    assert np.all(np.isneginf(logp[:5]))
    labels = np.array([[-100, 5, -100, 7, -100, -100]])
    assert D.unigram_baseline(logp, labels) == pytest.approx(-(np.log(4 / 7) + np.log(1 / 7)) / 2)


def test_corpus_paragraphs_dedup_and_split():
    texts = ["Hello there, this is a paragraph of prose.\n\nHELLO there,  this is a paragraph "
             "of prose.\n\n>>> print('code is dropped here and now')\n\nx = 1 + 2 * (3 / 4) "
             "- [5] {6} <7>\n\nAnother paragraph of plain English text here."]
    paras = corpus.paragraphs(texts)
    assert paras == ["Hello there, this is a paragraph of prose.",
                     "Another paragraph of plain English text here."]
    many = [f"paragraph number {i} has some words in it" for i in range(400)]
    train, held = corpus.split(many, 0.1)
    assert set(train).isdisjoint(held) and len(train) + len(held) == 400
    assert 20 < len(held) < 60
    assert corpus.split(many, 0.1) == (train, held)


def test_rng_state_round_trip():
    rng = np.random.default_rng(11)
    rng.random(5)
    clone = D.rng_from_json(D.rng_state_to_json(rng))
    assert np.array_equal(rng.random(10), clone.random(10))
