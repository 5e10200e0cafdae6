"""The WordPiece tokenizer of a Hugging Face BERT directory, built from its ``vocab.txt`` with
``tokenizers``' BertWordPiece (lower-casing as ``tokenizer_config.json`` says, default True):
single sentences or sentence pairs -> ``input_ids``, ``token_type_ids`` (0 for the first
sentence and its [CLS]/[SEP], 1 for the second) and an ``attention_mask``, padded to the
longest row with [PAD] and truncated to ``max_len``.  A ``tokenizer.json``'s own padding and
truncation settings are never used: only ``vocab.txt`` is read."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from minibert_reference.train.fileio import read_user_json, read_user_text


def load_tokenizer(path, *, max_len: int = 512):
    """A ``tokenizers`` BertWordPieceTokenizer for the directory ``path`` (needs vocab.txt)."""
    from tokenizers import BertWordPieceTokenizer

    path = Path(path)
    vocab = path / "vocab.txt"
    if not vocab.is_file():
        raise ValueError(f"{path}: no vocab.txt (the WordPiece vocabulary of the checkpoint)")
    # read here first: the file tokenizers reads next is UTF-8 text, not empty, of a sane size
    read_user_text(vocab, "a WordPiece vocabulary (one token per line)")
    lowercase = True
    cfg = path / "tokenizer_config.json"
    if cfg.exists():
        lowercase = read_user_json(cfg, "a tokenizer config").get("do_lower_case", True)
        if not isinstance(lowercase, bool):
            raise ValueError(f"{cfg}: do_lower_case: expected true or false, got {lowercase!r}")
    try:
        tok = BertWordPieceTokenizer(str(vocab), lowercase=lowercase, strip_accents=None,
                                     clean_text=True, handle_chinese_chars=True)
    except Exception as e:  # noqa: BLE001 -- tokenizers raises a bare Exception
        raise ValueError(f"{vocab}: expected a WordPiece vocabulary, got one tokenizers cannot "
                         f"read ({str(e)[:120]})") from None
    for special in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"):
        if tok.token_to_id(special) is None:
            raise ValueError(f"{vocab}: the special token {special} is missing")
    tok.no_padding()
    tok.enable_truncation(max_length=max_len)
    return tok


def encode(tok, texts, pairs=None) -> dict[str, np.ndarray]:
    """[CLS] a [SEP] (b [SEP]) per row -> int64 ``input_ids``, ``token_type_ids`` and
    ``attention_mask`` [B, T], padded with [PAD] to the longest row."""
    texts = [texts] if isinstance(texts, str) else list(texts)
    if pairs is not None:
        pairs = [pairs] if isinstance(pairs, str) else list(pairs)
        if len(pairs) != len(texts):
            raise ValueError(f"pairs: expected {len(texts)} second sentences, got {len(pairs)}")
        encodings = tok.encode_batch(list(zip(texts, pairs)))
    else:
        encodings = tok.encode_batch(texts)
    T = max(len(e.ids) for e in encodings)
    pad = tok.token_to_id("[PAD]")
    ids = np.full((len(encodings), T), pad, dtype=np.int64)
    types = np.zeros((len(encodings), T), dtype=np.int64)
    mask = np.zeros((len(encodings), T), dtype=np.int64)
    for b, e in enumerate(encodings):
        n = len(e.ids)
        ids[b, :n], types[b, :n], mask[b, :n] = e.ids, e.type_ids, 1
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
