"""A deterministic WordPiece vocabulary learner.

The HF ``tokenizers`` WordPiece trainer breaks ties between equally frequent pairs in an order
that changes from process to process, so two trainings on the same text can give different
vocabularies (measured: 1 run in 3 differed on 3,000 paragraphs, V = 2,000), and two fresh
training runs with one seed differ.  This learner runs the same algorithm -- byte-pair-style
merges of the most frequent adjacent pair, continuation pieces prefixed ``##``, pairs seen fewer
than ``min_frequency`` times never merged -- with ties broken by the pieces' text, so the same
paragraphs always give the same vocabulary.  Normalisation and pre-tokenisation are the HF
BERT ones (deterministic), and the result is an ordinary HF WordPiece tokenizer.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict

PREFIX = "##"


def word_counts(paragraphs, normalizer, pre_tokenizer) -> Counter:
    counts: Counter = Counter()
    for p in paragraphs:
        for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(p)):
            counts[w] += 1
    return counts


def _pieces(word: str) -> list[str]:
    return [word[0]] + [PREFIX + c for c in word[1:]]


def _merged(a: str, b: str) -> str:
    return a + b[len(PREFIX):]


def learn_vocab(counts: Counter, vocab_size: int, specials, *, min_frequency: int = 2) -> list[str]:
    """Tokens in id order: ``specials``, the alphabet (most frequent first, ties by text), then
    one token per merge, until ``vocab_size`` tokens or no pair is frequent enough.

    The alphabet is every piece of the initial segmentation plus every character as a bare
    piece (count 0 when it never starts a word), as the HF trainer builds it.  Where the
    alphabet alone exceeds ``vocab_size``, the HF trainer keeps all of it (a larger vocabulary
    than asked); here the most frequent pieces are kept.  The rule is written as its
    definition in ``minibert_spec.equations.wordpiece`` (``greedy_vocab``)."""
    words = sorted(counts)  # a fixed order: the result never depends on dict iteration
    freq = [counts[w] for w in words]
    seqs = [_pieces(w) for w in words]
    symbol_freq: Counter = Counter()
    for s, f in zip(seqs, freq):
        for sym in s:
            symbol_freq[sym] += f
    for w in words:  # every character also as a word start (the HF trainer's alphabet), so a
        for c in w[1:]:  # word that begins with one seen only inside words is not [UNK]
            symbol_freq[c] += 0
    room = vocab_size - len(specials)
    alphabet = sorted(symbol_freq, key=lambda t: (-symbol_freq[t], t))[:max(room, 0)]
    vocab = list(specials) + alphabet
    known = set(vocab)
    pair_count: Counter = Counter()
    where: dict = defaultdict(set)  # pair -> indices of words that contain it
    for i, (s, f) in enumerate(zip(seqs, freq)):
        for pair in zip(s, s[1:]):
            pair_count[pair] += f
            where[pair].add(i)
    heap = [(-c, a, b) for (a, b), c in pair_count.items()]
    heapq.heapify(heap)
    while len(vocab) < vocab_size and heap:
        neg, a, b = heapq.heappop(heap)
        if pair_count.get((a, b), 0) != -neg or -neg <= 0:
            continue  # a stale entry: the count changed after it was pushed
        if -neg < min_frequency:
            break
        new = _merged(a, b)
        if new not in known:
            known.add(new)
            vocab.append(new)
        changed = set()
        for i in sorted(where.pop((a, b), ())):
            s, f = seqs[i], freq[i]
            for pair in zip(s, s[1:]):  # take the word's pairs out ...
                pair_count[pair] -= f
                changed.add(pair)
            out, j = [], 0
            while j < len(s):
                if j + 1 < len(s) and s[j] == a and s[j + 1] == b:
                    out.append(new)
                    j += 2
                else:
                    out.append(s[j])
                    j += 1
            seqs[i] = out
            for pair in zip(out, out[1:]):  # ... and the merged word's back in
                pair_count[pair] += f
                where[pair].add(i)
                changed.add(pair)
        pair_count.pop((a, b), None)
        for pair in changed:
            c = pair_count.get(pair, 0)
            if c > 0:
                heapq.heappush(heap, (-c, *pair))
            else:
                pair_count.pop(pair, None)
    return vocab
