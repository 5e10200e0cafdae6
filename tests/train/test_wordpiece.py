"""The WordPiece learner (``minibert_reference.train.wordpiece.learn_vocab``) gives the right
vocabulary. (Reached through its module, so a mutant swapped in after import is the one that runs.)

Three independent references:

* hand-made corpora whose merges are worked out by hand below (and in
  ``spec/equations/wordpiece.py``'s worked example): a pair seen exactly ``min_frequency`` times
  merges, ties are ordered by text as documented;
* the rule's definition, ``minibert_spec.equations.wordpiece.greedy_vocab`` (every pair recounted at
every
  step, no heap, no incremental counts), on random corpora full of ties;
* the Hugging Face ``tokenizers`` WordPiece trainer on corpora where no tie decides a merge (its
  own tie order depends on hash order): the same tokens, the same merges in the same order.  The
  alphabet's order is a documented difference (HF: characters by code point, then the ``##``
  pieces as first met; ours: by count, then text), so the alphabet is compared as a set.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minibert_reference.train import wordpiece as W
from minibert_spec.equations.wordpiece import (
    EXAMPLE_COUNTS,
    EXAMPLE_MIN_FREQUENCY,
    EXAMPLE_VOCAB,
    alphabet,
    greedy_vocab,
    merges,
)

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
vocab_eq = pytest.mark.equation("wordpiece.vocab")


@vocab_eq
def test_the_worked_example():
    """spec/equations/wordpiece.py derives it by hand: alphabet c, ##a, ##b, ##d, a, b, d (count,
    then text), then "ab" (a tie at 2 broken by text) and "cd" (seen exactly min_frequency = 2
    times)."""
    got = W.learn_vocab(Counter(EXAMPLE_COUNTS), 100, SPECIALS,
                      min_frequency=EXAMPLE_MIN_FREQUENCY)
    assert got == list(SPECIALS) + EXAMPLE_VOCAB


# aaaa x1 -> [a, ##a, ##a, ##a];  aab x2 -> [a, ##a, ##b];  ba x1 -> [b, ##a]
# alphabet: ##a 3+2+1 = 6, a 1+2 = 3, ##b 2, b 1  ->  ##a, a, ##b, b
# pairs: (a, ##a) 1+2 = 3, (##a, ##a) 2 (two overlapping in aaaa), (##a, ##b) 2, (b, ##a) 1
#   merge (a, ##a) -> aa:  aaaa -> [aa, ##a, ##a], aab -> [aa, ##b], ba -> [b, ##a]
#   pairs now: (aa, ##b) 2, (aa, ##a) 1, (##a, ##a) 1, (b, ##a) 1
# min_frequency 3: (a, ##a) is seen exactly 3 times and merges; the best is then 2 < 3: stop.
# min_frequency 2: also (aa, ##b) -> aab (seen exactly 2 times); then the best is 1: stop.
# min_frequency 1: then a three-way tie at 1, by text ##a < aa < b: (##a, ##a) -> ##aa, so
#   aaaa -> [aa, ##aa]; then (aa, ##aa) 1 and (b, ##a) 1, aa < b: aaaa; then ba.
HAND = {"aaaa": 1, "aab": 2, "ba": 1}
HAND_ALPHABET = ["##a", "a", "##b", "b"]
HAND_MERGES = {3: ["aa"], 2: ["aa", "aab"], 1: ["aa", "aab", "##aa", "aaaa", "ba"]}


@vocab_eq
@pytest.mark.parametrize("min_frequency", sorted(HAND_MERGES))
def test_hand_corpus(min_frequency):
    got = W.learn_vocab(Counter(HAND), 100, SPECIALS, min_frequency=min_frequency)
    assert got == list(SPECIALS) + HAND_ALPHABET + HAND_MERGES[min_frequency]


@vocab_eq
def test_vocab_size_cuts_the_merges_and_the_alphabet():
    """Room for two merges: the first two of min_frequency 1; room for three pieces: the three
    most frequent of the alphabet, no merge."""
    n = len(SPECIALS) + len(HAND_ALPHABET)
    assert W.learn_vocab(Counter(HAND), n + 2, SPECIALS, min_frequency=1) == (
        list(SPECIALS) + HAND_ALPHABET + HAND_MERGES[1][:2])
    assert W.learn_vocab(Counter(HAND), len(SPECIALS) + 3, SPECIALS, min_frequency=1) == (
        list(SPECIALS) + HAND_ALPHABET[:3])


words = st.text(alphabet="abc#", min_size=1, max_size=6)
corpora = st.dictionaries(words, st.integers(1, 5), min_size=1, max_size=10)


@vocab_eq
@given(counts=corpora, min_frequency=st.integers(1, 4), extra=st.integers(0, 30),
       n_specials=st.integers(0, 2))
def test_the_definition_on_random_corpora(counts, min_frequency, extra, n_specials):
    """Tiny alphabets (a, b, c and '#', which looks like the continuation prefix), repeated and
    overlapping pairs, ties everywhere: the learner's heap and incremental counts give the
    definition's vocabulary exactly."""
    specials = SPECIALS[:n_specials]
    size = n_specials + extra
    assert W.learn_vocab(Counter(counts), size, specials, min_frequency=min_frequency) == (
        greedy_vocab(counts, size, specials, min_frequency=min_frequency))


# --------------------------------------------------------------------------- the HF trainer
def _hf_vocab(text, vocab_size, min_frequency, normalizer=None, pre_tokenizer=None):
    """The Hugging Face WordPiece trainer's vocabulary (token list in id order)."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordPiece(unk_token="[UNK]"))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer or tokenizers.pre_tokenizers.WhitespaceSplit()
    trainer = tokenizers.trainers.WordPieceTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIALS),
        show_progress=False)
    tok.train_from_iterator(text if isinstance(text, list) else [text], trainer)
    vocab = tok.get_vocab()
    return sorted(vocab, key=vocab.get)


def _assert_same_as_hf(ours, theirs, counts):
    """Same specials first, the same alphabet (as a set), then the same merges in order."""
    n = len(SPECIALS) + len(alphabet(counts))
    assert theirs[:len(SPECIALS)] == ours[:len(SPECIALS)] == list(SPECIALS)
    assert sorted(theirs[len(SPECIALS):n]) == sorted(ours[len(SPECIALS):n]), "alphabets differ"
    assert theirs[n:] == ours[n:], "merges differ"


def _text(counts):
    return " ".join(w for w in sorted(counts) for _ in range(counts[w]))


def _until_first_tie(counts, min_frequency):
    """The merge steps before the first one a tie decides (the generator is lazy: the steps
    after it are never computed)."""
    out = []
    for step in merges(counts, min_frequency=min_frequency):
        if step[3] > 1:
            break
        out.append(step)
    return out


def _tie_free_stop(counts):
    """(min_frequency, merges) that make the learning stop on its own before any tied step,
    with its last merge seen exactly min_frequency times: the last drop in the merge counts
    before the first tie.  None if there is none."""
    steps = list(merges(counts, min_frequency=1))
    first_tie = next((i for i, s in enumerate(steps) if s[3] > 1), len(steps))
    drops = [j for j in range(1, first_tie + 1)
             if j == len(steps) or steps[j][2] < steps[j - 1][2]]
    if not drops:
        return None
    j = drops[-1]
    return steps[j - 1][2], steps[:j]


@vocab_eq
@pytest.mark.oracle
@pytest.mark.parametrize("counts, min_frequency, last", [
    pytest.param(HAND, 3, "aa", id="hand"), pytest.param({"xy": 2, "xz": 1}, 2, "xy", id="xy")])
def test_hf_trainer_merges_a_pair_seen_exactly_min_frequency_times(counts, min_frequency, last):
    """Corpora where no tie decides a merge: the HF trainer merges the pair seen exactly
    min_frequency times ((a, ##a) 3 times in the hand corpus; (x, ##y) twice) and stops, as the
    learner does.  y and z never start a word: both alphabets still hold them bare."""
    assert all(step[3] == 1 for step in merges(counts, min_frequency=min_frequency))
    theirs = _hf_vocab(_text(counts), 100, min_frequency)
    ours = W.learn_vocab(Counter(counts), 100, SPECIALS, min_frequency=min_frequency)
    _assert_same_as_hf(ours, theirs, counts)
    assert ours[-1] == theirs[-1] == last


def _random_corpus(seed, n_words=300, letters="abcdefgh"):
    """Zipf-distributed counts over random words: large, mostly distinct pair counts."""
    import numpy as np

    rng = np.random.default_rng(seed)
    counts = Counter()
    for _ in range(n_words):
        w = "".join(rng.choice(list(letters), size=int(rng.integers(1, 8))))
        counts[w] += int(min(rng.zipf(1.3), 500))
    return dict(counts)


@vocab_eq
@pytest.mark.oracle
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_hf_trainer_on_tie_free_corpora(seed):
    """Two cuts of one random corpus, each before the first merge a tie decides: full vocabulary
    (vocab_size stops it) and min_frequency (the last drop in the counts stops it, its last
    merge seen exactly min_frequency times)."""
    counts = _random_corpus(seed)
    steps = _until_first_tie(counts, 1)
    k = len(steps)
    assert k >= 10, f"seed {seed}: only {k} merges before the first tie"
    new = list(dict.fromkeys(a + b[2:] for a, b, _, _ in steps[:k]))
    size = len(SPECIALS) + len(alphabet(counts)) + len(new)
    ours = W.learn_vocab(Counter(counts), size, SPECIALS, min_frequency=1)
    _assert_same_as_hf(ours, _hf_vocab(_text(counts), size, 1), counts)
    min_frequency, done = _tie_free_stop(counts)
    assert done[-1][2] == min_frequency and len(done) >= 5
    ours = W.learn_vocab(Counter(counts), 10**6, SPECIALS, min_frequency=min_frequency)
    _assert_same_as_hf(ours, _hf_vocab(_text(counts), 10**6, min_frequency), counts)
    assert len(ours) == len(SPECIALS) + len(alphabet(counts)) + len(
        dict.fromkeys(a + b[2:] for a, b, _, _ in done))


@vocab_eq
@pytest.mark.oracle
def test_train_tokenizer_matches_hf_on_real_text():
    """The product path (``train_tokenizer``: BERT normalizer and pre-tokenizer, the learner,
    an HF WordPiece model) on the standard library's pydoc topics, cut before the first tied
    merge: the HF trainer's tokens, and its merges in the same order."""
    tokenizers = pytest.importorskip("tokenizers")
    import pydoc_data.topics

    from minibert_reference.train import data as D

    paragraphs = [pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)]
    normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    counts = W.word_counts(paragraphs, normalizer, pre_tokenizer)
    steps = _until_first_tie(counts, 2)
    k = len(steps)
    assert k >= 40, f"only {k} merges before the first tie"  # 60 on Python 3.11
    size = len(SPECIALS) + len(alphabet(counts)) + len(
        dict.fromkeys(a + b[2:] for a, b, _, _ in steps[:k]))
    tok = D.train_tokenizer(paragraphs, vocab_size=size, min_frequency=2)
    vocab = tok.get_vocab()
    ours = sorted(vocab, key=vocab.get)
    theirs = _hf_vocab(paragraphs, size, 2, normalizer, pre_tokenizer)
    assert len(ours) == len(theirs) == size
    _assert_same_as_hf(ours, theirs, counts)
