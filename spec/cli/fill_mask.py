"""``minibert fill-mask CHECKPOINT "the cat sat on the [MASK] ."``: the top-k tokens the trained
model predicts at every [MASK], with their probabilities."""

from __future__ import annotations


def register(sub) -> None:
    f = sub.add_parser("fill-mask", help="top-k predictions for each [MASK] in a sentence",
                       description=__doc__)
    f.add_argument("checkpoint", help="checkpoint.safetensors written by minibert train, or a "
                                      "Hugging Face BertForMaskedLM directory")
    f.add_argument("text", help='text with one or more [MASK], e.g. "the [MASK] returns a list"')
    f.add_argument("--top-k", "-k", type=int, default=5,
                   help="predictions per [MASK], 1 to the vocabulary size (default: %(default)s)")
    f.set_defaults(func=run)


def fill_mask(impl, params, config, tok, text: str, top_k: int = 5):
    """[(position, [(token, probability), ...]), ...] for each [MASK] in ``text``."""
    import numpy as np

    from minibert_reference.train import data as D

    n_vocab = min(tok.get_vocab_size(), config.vocab_size) - D.N_SPECIAL
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= n_vocab:
        raise ValueError(f"top_k: expected an integer in [1, {n_vocab}] (the proposable "
                         f"tokens), got {top_k!r}")
    ids = [D.CLS_ID, *D.encode_text(tok, text)[:config.max_len - 2], D.SEP_ID]
    positions = [i for i, t in enumerate(ids) if t == D.MASK_ID]
    if not positions:
        hint = (" ([MASK] is case-sensitive: write it in capitals)"
                if "[mask]" in text.lower() else "")
        raise ValueError(f"text: expected at least one [MASK] within the first "
                         f"{config.max_len - 2} tokens, got {text!r}{hint}")
    logits, _ = impl.forward(params, config, np.array([ids]))  # [1, T, V]
    # never propose [PAD], [CLS], ..., nor the rows of the table the tokenizer never uses
    never = [*range(D.N_SPECIAL), *range(tok.get_vocab_size(), logits.shape[-1])]
    return _top_k(logits[0], positions, never, tok, top_k)


def _top_k(logits, positions, never, tok, top_k: int):
    """[(position, [(token, probability), ...]), ...]: the softmax of each position's logits
    [T, V] without the ids ``never``, its ``top_k`` best (ties in id order)."""
    import numpy as np

    out = []
    for pos in positions:
        z = logits[pos].astype(np.float64)
        z[never] = -np.inf
        p = np.exp(z - z.max())
        p /= p.sum()
        best = np.argsort(-p, kind="stable")[:top_k]
        out.append((pos, [(tok.id_to_token(int(i)), float(p[i])) for i in best]))
    return out


def fill_mask_hf(directory, text: str, top_k: int = 5):
    """fill_mask for a Hugging Face BertForMaskedLM directory (its vocab.txt tokenizer)."""
    import numpy as np

    import minibert_reference
    from minibert_reference.hf.tokenizer import encode, load_tokenizer

    config, params = minibert_reference.load_pretrained(directory)
    if config.head != "mlm":
        raise ValueError(f"{directory}: not a masked-LM checkpoint (no cls.predictions.*)")
    tok = load_tokenizer(directory, max_len=config.max_len)
    batch = encode(tok, [text])
    mask_id = tok.token_to_id("[MASK]")
    positions = np.flatnonzero(batch["input_ids"][0] == mask_id).tolist()
    if not positions:
        raise ValueError(f"text: expected at least one [MASK], got {text!r}")
    logits, _ = minibert_reference.forward(params, config, batch["input_ids"],
                                           batch["attention_mask"],
                                           token_type_ids=batch["token_type_ids"])
    special = [tok.token_to_id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")]
    return _top_k(logits[0], positions, special, tok, top_k)


def run(args) -> int:
    from pathlib import Path

    import minibert_reference
    from minibert_reference.train import data as D
    from minibert_reference.train.loop import load_state

    if Path(args.checkpoint).is_dir():  # a Hugging Face directory
        # a ValueError (no config.json, a pickle-only directory, ...) is a user mistake: main()
        # prints it as one line and exits 2
        results, at = fill_mask_hf(args.checkpoint, args.text, args.top_k), ""
    else:
        state, config, _, tok_json = load_state(args.checkpoint)
        if tok_json is None:
            raise ValueError(f"checkpoint: expected a stored tokenizer in {args.checkpoint!r}, "
                             f"got none (trained on synthetic ids?); use a run of minibert train")
        tok = D.tokenizer_from_json(tok_json, name="checkpoint tokenizer")
        results = fill_mask(minibert_reference, state.params, config, tok, args.text, args.top_k)
        at = f" (step {state.step})"
    for pos, preds in results:
        print(f"[MASK] at position {pos}{at}:")
        for token, p in preds:
            print(f"  {token:<16} {p:.4f}")
    return 0
