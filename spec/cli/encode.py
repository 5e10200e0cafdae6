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
    e.add_argument("--output", "-o", help="save the [N, H] float32 array to this .npy file")
    e.set_defaults(func=run)


def sentence_embeddings(checkpoint, texts, pooling: str = "cls", normalize: bool = False):
    """[N, H] float32: the encoder body of the checkpoint (its head, if any, unused)."""
    import numpy as np

    import reference
    from reference.hf.tokenizer import encode, load_tokenizer

    config, params = reference.load_pretrained(checkpoint)
    body = config.replace(head="none", pooler=False)
    params = {k: v for k, v in params.items() if k in reference.param_shapes(body)}
    batch = encode(load_tokenizer(checkpoint, max_len=config.max_len), texts)
    h, _ = reference.forward(params, body, batch["input_ids"], batch["attention_mask"],
                             token_type_ids=batch["token_type_ids"])  # [N, T, H]
    if pooling == "cls":
        out = h[:, 0]
    else:
        m = batch["attention_mask"][..., None].astype(h.dtype)
        out = (h * m).sum(axis=1) / m.sum(axis=1)
    if normalize:
        out = out / np.linalg.norm(out, axis=-1, keepdims=True)
    return out.astype(np.float32)


def run(args) -> int:
    import numpy as np

    try:
        emb = sentence_embeddings(args.checkpoint, args.texts, args.pooling, args.normalize)
    except ValueError as e:
        print(f"error: {e}")
        return 1
    if args.output:
        np.save(args.output, emb)
        print(f"saved {emb.shape[0]} x {emb.shape[1]} embeddings to {args.output}")
    else:
        for text, row in zip(args.texts, emb):
            print(f"{text!r}: [{', '.join(f'{v:.4f}' for v in row[:6])}, ...] "
                  f"(dim {row.size}, norm {float(np.linalg.norm(row)):.4f})")
    return 0
