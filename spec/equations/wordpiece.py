"""The WordPiece vocabulary (the BERT masked-LM slides: "tokens are WordPiece subword units").

The rule, as the Hugging Face ``tokenizers`` WordPiece trainer runs it (its BPE trainer with the
continuation prefix ``##``): every word starts as its characters, all but the first prefixed
``##``; the alphabet is every piece seen plus every character bare; then, repeatedly, the most
frequent adjacent pair of pieces (counted over every word, weighted by the word's count) is
merged everywhere, left to right, and the merged piece (``a`` + ``##b`` -> ``ab``) joins the
vocabulary -- until the vocabulary is full or the most frequent pair is seen fewer than
``min_frequency`` times (a pair seen exactly ``min_frequency`` times is merged).  The trainer
breaks ties by token ids that depend on hash order; the reference
(``minibert_reference.train.wordpiece.learn_vocab``) breaks them by text: alphabet by count, then
text; pairs by count, then the first piece's text, then the second's.

:func:`greedy_vocab` is that rule written as its definition -- every pair recounted from
scratch at every step, no incremental counts, no heap -- for the worked example below and for
the tests that hold the fast learner to it (``tests/train/test_wordpiece.py``).
"""

from __future__ import annotations

from collections import Counter

from minibert_spec.equations import Equation, Proof, register
from minibert_spec.sources import SLIDES

PREFIX = "##"


def pieces(word: str) -> list[str]:
    """A word's initial pieces: its first character, then each later one prefixed ``##``."""
    return [word[0]] + [PREFIX + c for c in word[1:]]


def alphabet(counts) -> list[str]:
    """Every initial piece, and every character also bare (a word may start with it), by count
    of the initial pieces (0 for a bare character that never starts a word) descending, then
    text."""
    n: Counter = Counter()
    for w, f in counts.items():
        for p in pieces(w):
            n[p] += f
        for c in w:
            n[c] += 0
    return sorted(n, key=lambda t: (-n[t], t))


def merges(counts, *, min_frequency: int):
    """The merge steps, in order: ``(a, b, count, tied)`` with ``tied`` the number of pairs that
    share the largest count (1: no tie decided this step).  Every pair is recounted from
    scratch at every step; stops when the best pair is seen fewer than ``min_frequency``
    times or no pair is left."""
    words = {w: pieces(w) for w in counts}
    while True:
        pair_count: Counter = Counter()
        for w, s in words.items():
            for pair in zip(s, s[1:]):
                pair_count[pair] += counts[w]
        if not pair_count:
            return
        (a, b), n = min(pair_count.items(), key=lambda kv: (-kv[1], kv[0]))
        if n < min_frequency:
            return
        yield a, b, n, sum(c == n for c in pair_count.values())
        merged = a + b[len(PREFIX):]
        for w, s in words.items():  # left to right: [a, ##a, ##a] with (##a, ##a) -> [a, ##aa]
            out: list[str] = []
            for piece in s:  # an unmerged a before this b: merge (a merged piece is never a)
                if out and out[-1] == a and piece == b:
                    out[-1] = merged
                else:
                    out.append(piece)
            words[w] = out


def greedy_vocab(counts, vocab_size: int, specials=(), *, min_frequency: int = 2) -> list[str]:
    """The vocabulary in id order: ``specials``, the alphabet, then the piece of each merge
    that is new.  Slow on purpose: the definition, not an implementation."""
    vocab = list(specials) + alphabet(counts)[:max(vocab_size - len(specials), 0)]
    if len(vocab) < vocab_size:
        for a, b, _, _ in merges(counts, min_frequency=min_frequency):
            merged = a + b[len(PREFIX):]
            if merged not in vocab:
                vocab.append(merged)
            if len(vocab) >= vocab_size:
                break
    return vocab


# The worked example, derived by hand (min_frequency 2, room for everything):
#   ab x2 -> [a, ##b]   ba x1 -> [b, ##a]   ca x1 -> [c, ##a]   cd x2 -> [c, ##d]
# alphabet counts: c 3; ##a 2, ##b 2, ##d 2, a 2; b 1; d 0 (only ever inside a word) -> by
# count, ties by text ('#' < 'a'): c, ##a, ##b, ##d, a, b, d   (first-seen order would put a
# before ##b and ##a)
# pairs: (a, ##b) 2, (c, ##d) 2, (b, ##a) 1, (c, ##a) 1
#   merge 1: a tie at 2, broken by text: (a, ##b) -> "ab"
#   merge 2: (c, ##d), seen exactly min_frequency = 2 times -> "cd"
#   then the best pair is seen once < 2: stop.
EXAMPLE_COUNTS = {"ab": 2, "ba": 1, "ca": 1, "cd": 2}
EXAMPLE_MIN_FREQUENCY = 2
EXAMPLE_VOCAB = ["c", "##a", "##b", "##d", "a", "b", "d", "ab", "cd"]


def _prove_example() -> Proof:
    got = greedy_vocab(EXAMPLE_COUNTS, 100, min_frequency=EXAMPLE_MIN_FREQUENCY)
    if got != EXAMPLE_VOCAB:
        return Proof("refuted", (len(EXAMPLE_COUNTS),),
                     f"the definition gives {got}, derived by hand {EXAMPLE_VOCAB}")
    return Proof("proven", (len(EXAMPLE_COUNTS),),
                 "the worked example: alphabet ties by text, a count tie by text, a pair seen "
                 "exactly min_frequency times merged")


register(Equation(
    "wordpiece.vocab", "WordPiece vocabulary: greedy merges of the most frequent pair",
    (f"{SLIDES} (tokens)",),
    r"(a, b)^* = \arg\max_{(a, b)} \sum_w n_w \, \#\{(a, b) \in w\},\ "
    r"\text{merge while } \max \ge \text{min\_frequency}",
    _prove_example, impl_hint="minibert_reference.train.wordpiece:learn_vocab",
    numeric_na="a discrete algorithm on word counts, not a map on arrays: "
               "tests/train/test_wordpiece.py holds the learner to greedy_vocab (random "
               "corpora, ties included) and to the Hugging Face trainer (tie-free corpora)",
    note="ties by text (the HF trainer breaks them by hash-ordered ids)"))
