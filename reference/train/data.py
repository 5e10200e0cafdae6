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

import json

import numpy as np

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(len(SPECIAL_TOKENS))
N_SPECIAL = len(SPECIAL_TOKENS)
IGNORE_INDEX = -100


# --------------------------------------------------------------------------- tokenizer
def train_tokenizer(paragraphs, vocab_size: int = 8192, *, min_frequency: int = 2):
    """A BERT-style WordPiece tokenizer (lower-cased, accents stripped) trained on ``paragraphs``.

    Returns a ``tokenizers.Tokenizer`` whose ids 0..4 are the special tokens above."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if vocab_size <= N_SPECIAL:
        raise ValueError(f"vocab_size: expected > {N_SPECIAL} (the special tokens), "
                         f"got {vocab_size}")
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                        special_tokens=list(SPECIAL_TOKENS), show_progress=False)
    tok.train_from_iterator(list(paragraphs), trainer=trainer)
    check_tokenizer(tok)
    return tok


def check_tokenizer(tok) -> None:
    for i, name in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(name) != i:
            raise ValueError(f"tokenizer: expected {name} to have id {i}, "
                             f"got {tok.token_to_id(name)}")


def tokenizer_from_json(text: str):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(text)
    check_tokenizer(tok)
    return tok


def tokenizer_to_json(tok) -> str:
    return tok.to_str()


def load_or_train_tokenizer(path: str, paragraphs, vocab_size: int = 8192):
    """The tokenizer cached at ``path`` (tokenizer.json), trained and saved there if absent."""
    import os

    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            return tokenizer_from_json(fh.read())
    tok = train_tokenizer(paragraphs, vocab_size)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(tokenizer_to_json(tok))
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
    if seq_len < 3:
        raise ValueError(f"seq_len: expected >= 3 ([CLS], one token, [SEP]), got {seq_len}")
    width = seq_len - 2
    rows: list[list[int]] = []
    row: list[int] = []
    for ids in token_lists:
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
    if not (0 < mask_prob <= 1 and 0 <= mask_frac and 0 <= random_frac
            and mask_frac + random_frac <= 1):
        raise ValueError(f"mask_prob, mask_frac, random_frac: expected 0 < mask_prob <= 1 and "
                         f"mask_frac + random_frac <= 1, got {mask_prob}, {mask_frac}, "
                         f"{random_frac}")
    if vocab_size <= N_SPECIAL:
        raise ValueError(f"vocab_size: expected > {N_SPECIAL}, got {vocab_size}")
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
    tokens = input_ids[(attention_mask != 0) & ~special_mask(input_ids)]
    counts = np.bincount(tokens, minlength=vocab_size).astype(np.float64)
    counts[:N_SPECIAL] = 0.0
    counts[N_SPECIAL:] += 1.0
    with np.errstate(divide="ignore"):
        return np.log(counts / counts.sum())


def unigram_baseline(log_probs: np.ndarray, labels: np.ndarray,
                     ignore_index: int = IGNORE_INDEX) -> float:
    """Cross-entropy (nats) of predicting each masked label from token frequencies alone."""
    picked = labels[labels != ignore_index]
    if picked.size == 0:
        raise ValueError("labels: expected at least one masked position, got none")
    return float(-log_probs[picked].mean())


def rng_state_to_json(rng: np.random.Generator) -> str:
    return json.dumps(rng.bit_generator.state)


def rng_from_json(text: str) -> np.random.Generator:
    state = json.loads(text)
    bitgen = getattr(np.random, state["bit_generator"])()
    bitgen.state = state
    return np.random.Generator(bitgen)
