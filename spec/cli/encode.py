"""``minibert encode CHECKPOINT_DIR "text" ...``: sentence embeddings from a Hugging Face BERT
directory (config.json + model.safetensors + vocab.txt), the [CLS] hidden state or the mean of
the unpadded tokens' last hidden states, optionally L2-normalised; printed, or saved as .npy."""

from __future__ import annotations


def register(sub) -> None:
    e = sub.add_parser("encode", help="sentence embeddings from a Hugging Face BERT directory",
                       description=__doc__)
    e.add_argument("checkpoint", help="Hugging Face BERT directory")
    e.add_argument("texts", nargs="+", help="one or more sentences")
    e.add_argument("--pooling", choices=["cls", "mean"], default="cls")
    e.add_argument("--normalize", action="store_true", help="L2-normalise each embedding")
    e.add_argument("--output", "-o", help="save the [N, H] float32 array (.npy format) to "
                                           "exactly this file")
    e.set_defaults(func=run)


def sentence_embeddings(checkpoint, texts, pooling: str = "cls", normalize: bool = False):
    """[N, H] float32: the encoder body of the checkpoint (its head, if any, unused)."""
    import numpy as np

    import minibert_reference
    from minibert_reference.hf.tokenizer import encode, load_tokenizer

    config, params = minibert_reference.load_pretrained(checkpoint)
    body = config.replace(head="none", pooler=False)
    params = {k: v for k, v in params.items() if k in minibert_reference.param_shapes(body)}
    batch = encode(load_tokenizer(checkpoint, max_len=config.max_len), texts)
    h, _ = minibert_reference.forward(params, body, batch["input_ids"], batch["attention_mask"],
                             token_type_ids=batch["token_type_ids"])  # [N, T, H]
    if pooling == "cls":
        out = h[:, 0]
    else:
        m = batch["attention_mask"][..., None].astype(h.dtype)
        out = (h * m).sum(axis=1) / m.sum(axis=1)
    if normalize:
        out = out / np.linalg.norm(out, axis=-1, keepdims=True)
    return out.astype(np.float32)


def output_path(value: str) -> str:
    """The file ``--output`` names, exactly (np.save would append .npy to a name without it
    and report the name it was given); a directory or a missing folder is a user error."""
    import os

    if os.path.isdir(value):
        raise ValueError(f"--output: expected a file path, got the directory {value!r} (name "
                         f"a file in it, e.g. {os.path.join(value, 'embeddings.npy')!r})")
    parent = os.path.dirname(os.path.abspath(value))
    if not os.path.isdir(parent):
        raise ValueError(f"--output: expected a path in an existing folder, got {value!r} "
                         f"({parent!r} does not exist)")
    return value


def run(args) -> int:
    import numpy as np

    # a mistake is a ValueError: minibert's one line on stderr, exit 2 (minibert_spec.cli.main)
    out = None if args.output is None else output_path(args.output)
    emb = sentence_embeddings(args.checkpoint, args.texts, args.pooling, args.normalize)
    if out is not None:
        from minibert_reference.train.fileio import atomic_path

        with atomic_path(out) as tmp, open(tmp, "wb") as fh:
            np.save(fh, emb)  # a file object: written as named, no suffix added
        print(f"saved {emb.shape[0]} x {emb.shape[1]} embeddings to {out}")
    else:
        for text, row in zip(args.texts, emb):
            print(f"{text!r}: [{', '.join(f'{v:.4f}' for v in row[:6])}, ...] "
                  f"(dim {row.size}, norm {float(np.linalg.norm(row)):.4f})")
    return 0
