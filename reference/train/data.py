"""Data for masked-language-model training: a WordPiece tokenizer, fixed-length sequences with an
attention mask, MLM masking, and the unigram-frequency baseline.

The HuggingFace ``tokenizers`` library is imported lazily (only the tokenizer functions need it);
masking, batching and the baseline are NumPy.

Conventions
-----------
* Special tokens, in id order: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4.
* Paragraphs are packed into rows ``[CLS] para_1 [SEP] para_2 [SEP] ...`` of at most T tokens,
  padded with [PAD] (attention mask 0) to T.
* Masking (BERT): of each sequence's non-special, non-padding positions, exactly
  ``max(1, round(0.15 n))`` are chosen uniformly (so every sequence predicts something); each
  chosen position becomes [MASK] with probability 0.8, a random non-special token with 0.1, and
  stays itself with 0.1.  Labels hold the original id at chosen positions and the ignore index
  everywhere else.  Everything is drawn from the ``numpy.random.Generator`` passed in.
"""

from __future__ import annotations

import numpy as np

from minibert_reference.ops import IGNORE_INDEX
from minibert_reference.train.fileio import atomic_write, loads_json, read_user_text

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(len(SPECIAL_TOKENS))
N_SPECIAL = len(SPECIAL_TOKENS)


# --------------------------------------------------------------------------- tokenizer
def train_tokenizer(paragraphs, vocab_size: int = 8192, *, min_frequency: int = 2):
    """A BERT-style WordPiece tokenizer (lower-cased, accents stripped) trained on ``paragraphs``.

    Deterministic: the vocabulary comes from ``minibert_reference.train.wordpiece`` (the HF
    trainer's algorithm with ties broken by text; the HF trainer itself gives a different vocabulary
    from run to run).  Returns a ``tokenizers.Tokenizer`` whose ids 0..4 are the special tokens
    above."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    from minibert_reference.train.wordpiece import learn_vocab, word_counts

    _check_vocab_size(vocab_size)
    normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    counts = word_counts(list(paragraphs), normalizer, pre_tokenizer)
    if not counts:
        raise ValueError("paragraphs: expected text with at least one word, got none")
    vocab = learn_vocab(counts, vocab_size, SPECIAL_TOKENS, min_frequency=min_frequency)
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(list(SPECIAL_TOKENS))  # "[MASK]" in a text stays one token
    check_tokenizer(tok)
    return tok


def check_tokenizer(tok) -> None:
    for i, name in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(name) != i:
            raise ValueError(f"tokenizer: expected {name} to have id {i}, "
                             f"got {tok.token_to_id(name)}")


def tokenizer_from_json(text: str, *, name: str = "tokenizer"):
    """A tokenizer from its JSON text; anything else is a ValueError naming ``name``."""
    from tokenizers import Tokenizer

    if not isinstance(text, str):
        raise ValueError(f"{name}: expected tokenizer JSON text, got {type(text).__name__}")
    try:
        tok = Tokenizer.from_str(text)
    except Exception as e:  # tokenizers raises a bare Exception for malformed JSON
        raise ValueError(f"{name}: expected a tokenizers JSON document, got one it cannot "
                         f"read ({str(e)[:120]})") from None
    check_tokenizer(tok)
    return tok


def tokenizer_to_json(tok) -> str:
    return tok.to_str()


def load_or_train_tokenizer(path: str, paragraphs, vocab_size: int = 8192):
    """The tokenizer cached at ``path`` (tokenizer.json), trained and saved there if absent."""
    import os

    if os.path.exists(path):
        return tokenizer_from_json(read_user_text(path, "a tokenizers JSON file"), name=path)
    tok = train_tokenizer(paragraphs, vocab_size)
    atomic_write(path, tokenizer_to_json(tok))
    return tok


def encode_text(tok, text: str) -> list[int]:
    """Token ids of ``text`` without [CLS]/[SEP]; "[MASK]" in the text becomes the mask id."""
    return tok.encode(text, add_special_tokens=False).ids


# --------------------------------------------------------------------------- sequences
def build_sequences(token_lists, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Pack token lists into rows ``[CLS] a [SEP] b [SEP] ...`` of at most ``seq_len`` tokens,
    padded with [PAD] (attention mask 0).  A list longer than ``seq_len - 2`` is cut into chunks;
    a chunk that does not fit in the current row starts the next one (greedy, in order), so most
    rows are nearly full and padding is only at their ends.

    Returns (input_ids [N, T] int64, attention_mask [N, T] int8)."""
    if not isinstance(seq_len, (int, np.integer)) or isinstance(seq_len, bool) or seq_len < 3:
        raise ValueError(f"seq_len: expected an integer >= 3 ([CLS], one token, [SEP]), "
                         f"got {seq_len!r}")
    width = seq_len - 2
    rows: list[list[int]] = []
    row: list[int] = []
    for i, ids in enumerate(token_lists):
        ids = _check_id_list(f"token_lists[{i}]", ids)
        for lo in range(0, len(ids), width):
            chunk = list(ids[lo:lo + width])
            if row and len(row) + len(chunk) + 1 > seq_len:
                rows.append(row)
                row = []
            if not row:
                row = [CLS_ID]
            row += chunk + [SEP_ID]
    if row:
        rows.append(row)
    if not rows:
        raise ValueError("token_lists: expected at least one non-empty token list, got none")
    input_ids = np.full((len(rows), seq_len), PAD_ID, dtype=np.int64)
    attention_mask = np.zeros((len(rows), seq_len), dtype=np.int8)
    for i, r in enumerate(rows):
        input_ids[i, :len(r)] = r
        attention_mask[i, :len(r)] = 1
    return input_ids, attention_mask


def _check_id_list(name: str, ids) -> list[int]:
    """Non-negative integer ids (a float or bool id is a bug upstream, never truncated)."""
    if not isinstance(ids, np.ndarray) and any(isinstance(t, (bool, np.bool_)) for t in ids):
        raise ValueError(f"{name}: expected integer token ids, got a bool")
    arr = np.asarray(ids)
    if arr.ndim != 1 or (arr.size and (not np.issubdtype(arr.dtype, np.integer)
                                       or arr.dtype == np.bool_)):
        raise ValueError(f"{name}: expected a flat list of integer token ids, got "
                         f"{arr.dtype} with shape {arr.shape}")
    if arr.size and arr.min() < 0:
        raise ValueError(f"{name}: expected ids >= 0, got {int(arr.min())}")
    return [int(t) for t in arr]


def tokenize_paragraphs(tok, paragraphs, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    encs = tok.encode_batch(list(paragraphs), add_special_tokens=False)
    return build_sequences([e.ids for e in encs if e.ids], seq_len)


# --------------------------------------------------------------------------- MLM masking
def special_mask(input_ids: np.ndarray) -> np.ndarray:
    """True where the id is a special token ([PAD], [UNK] excluded: an unknown word is text)."""
    return (input_ids == PAD_ID) | (input_ids == CLS_ID) | (input_ids == SEP_ID) | (
        input_ids == MASK_ID)


def mask_tokens(input_ids, attention_mask, rng: np.random.Generator, *, vocab_size: int,
                mask_prob: float = 0.15, mask_frac: float = 0.8, random_frac: float = 0.1,
                ignore_index: int = IGNORE_INDEX):
    """BERT's MLM corruption.  Returns (corrupted_ids, labels), both [B, T] int64.

    ``attention_mask`` 0 marks padding, never chosen.  See the module docstring for the rule.
    """
    input_ids = np.asarray(input_ids)
    if input_ids.ndim != 2 or not np.issubdtype(input_ids.dtype, np.integer):
        raise ValueError(f"input_ids: expected a [B, T] integer array, got "
                         f"{getattr(input_ids, 'shape', None)} {getattr(input_ids, 'dtype', '')}")
    attention_mask = np.asarray(attention_mask)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask: expected shape {input_ids.shape}, "
                         f"got {attention_mask.shape}")
    if not all(isinstance(v, (int, float, np.floating)) and np.isfinite(v)
               for v in (mask_prob, mask_frac, random_frac)) or not (
            0 < mask_prob <= 1 and 0 <= mask_frac and 0 <= random_frac
            and mask_frac + random_frac <= 1):
        raise ValueError(f"mask_prob, mask_frac, random_frac: expected 0 < mask_prob <= 1 and "
                         f"mask_frac + random_frac <= 1, got {mask_prob}, {mask_frac}, "
                         f"{random_frac}")
    _check_vocab_size(vocab_size)
    if input_ids.size and (input_ids.min() < 0 or input_ids.max() >= vocab_size):
        bad = input_ids[(input_ids < 0) | (input_ids >= vocab_size)][0]
        raise ValueError(f"input_ids: expected ids in [0, {vocab_size}), got {int(bad)}")
    if not np.all((attention_mask == 0) | (attention_mask == 1)):
        raise ValueError(f"attention_mask: expected only 0/1 values, got "
                         f"{np.unique(attention_mask)[:5]}")
    if not isinstance(ignore_index, (int, np.integer)) or 0 <= ignore_index < vocab_size:
        raise ValueError(f"ignore_index: expected an integer outside [0, {vocab_size}) (it must "
                         f"not be a real token), got {ignore_index!r}")
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
    B, T = input_ids.shape
    candidates = (attention_mask != 0) & ~special_mask(input_ids)  # [B, T]
    n_cand = candidates.sum(axis=1)
    n_pick = np.where(n_cand > 0, np.maximum(1, np.rint(mask_prob * n_cand)), 0).astype(int)
    # a uniform random subset of n_pick candidates per row: the n_pick smallest random keys
    keys = rng.random((B, T))
    keys[~candidates] = 2.0  # after every candidate
    rank = np.argsort(np.argsort(keys, axis=1, kind="stable"), axis=1, kind="stable")
    chosen = rank < n_pick[:, None]  # [B, T]
    u = rng.random((B, T))
    to_mask = chosen & (u < mask_frac)
    to_random = chosen & (u >= mask_frac) & (u < mask_frac + random_frac)
    random_ids = rng.integers(N_SPECIAL, vocab_size, size=(B, T))
    corrupted = np.where(to_mask, MASK_ID, np.where(to_random, random_ids, input_ids))
    labels = np.where(chosen, input_ids, ignore_index)
    return corrupted.astype(np.int64), labels.astype(np.int64)


# --------------------------------------------------------------------------- baseline
def unigram_log_probs(input_ids, attention_mask, vocab_size: int) -> np.ndarray:
    """log p(v) of the training set's non-special token frequencies, add-one smoothed over the
    non-special ids (a held-out token never seen in training keeps a finite loss)."""
    _check_vocab_size(vocab_size)
    input_ids, attention_mask = np.asarray(input_ids), np.asarray(attention_mask)
    if not np.issubdtype(input_ids.dtype, np.integer) or attention_mask.shape != input_ids.shape:
        raise ValueError(f"input_ids, attention_mask: expected integer ids and a mask of the "
                         f"same shape, got {input_ids.dtype} {input_ids.shape} and "
                         f"{attention_mask.shape}")
    tokens = input_ids[(attention_mask != 0) & ~special_mask(input_ids)]
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(f"input_ids: expected ids in [0, {vocab_size}), got values in "
                         f"[{int(tokens.min())}, {int(tokens.max())}]")
    counts = np.bincount(tokens, minlength=vocab_size).astype(np.float64)
    counts[:N_SPECIAL] = 0.0
    counts[N_SPECIAL:] += 1.0
    with np.errstate(divide="ignore"):
        return np.log(counts / counts.sum())


def unigram_baseline(log_probs: np.ndarray, labels: np.ndarray,
                     ignore_index: int = IGNORE_INDEX) -> float:
    """Cross-entropy (nats) of predicting each masked label from token frequencies alone."""
    labels = np.asarray(labels)
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels: expected integer labels, got dtype {labels.dtype}")
    picked = labels[labels != ignore_index]
    if picked.size == 0:
        raise ValueError("labels: expected at least one masked position, got none")
    if picked.min() < 0 or picked.max() >= log_probs.shape[-1]:
        raise ValueError(f"labels: expected ids in [0, {log_probs.shape[-1]}) or "
                         f"{ignore_index}, got values in [{int(picked.min())}, "
                         f"{int(picked.max())}]")
    return float(-log_probs[picked].mean())


def _check_vocab_size(vocab_size) -> None:
    if (not isinstance(vocab_size, (int, np.integer)) or isinstance(vocab_size, bool)
            or vocab_size <= N_SPECIAL):
        raise ValueError(f"vocab_size: expected an integer > {N_SPECIAL}, got {vocab_size!r}")


# The bit generators a checkpoint may name: the file chooses among these, never an arbitrary
# attribute of numpy.random.
BIT_GENERATORS = {"PCG64": np.random.PCG64, "PCG64DXSM": np.random.PCG64DXSM,
                  "Philox": np.random.Philox, "SFC64": np.random.SFC64,
                  "MT19937": np.random.MT19937}


def rng_state_to_json(rng: np.random.Generator) -> str:
    import json

    return json.dumps(rng.bit_generator.state)


def rng_from_json(text: str) -> np.random.Generator:
    """The generator whose state ``rng_state_to_json`` wrote; ValueError for anything else."""
    state = loads_json("rng", text)
    name = state.get("bit_generator")
    if name not in BIT_GENERATORS:
        raise ValueError(f"rng: expected bit_generator in {sorted(BIT_GENERATORS)}, "
                         f"got {name!r}")
    bitgen = BIT_GENERATORS[name]()
    try:
        bitgen.state = state
    except (TypeError, ValueError, KeyError, OverflowError) as e:
        raise ValueError(f"rng: expected a valid {name} state, got one numpy rejects "
                         f"({type(e).__name__}: {e})") from None
    return np.random.Generator(bitgen)
