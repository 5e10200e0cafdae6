"""The tokenizer of a Hugging Face BERT directory and the CLI on it: ``minibert encode`` and
``minibert fill-mask DIR`` (a random model and a tiny vocab.txt in a temporary directory, no
network).  The tokenizer is compared with transformers' own BertTokenizerFast on the same
vocab.txt when transformers is installed."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")

import minibert_reference  # noqa: E402
from minibert_reference.hf.tokenizer import encode, load_tokenizer  # noqa: E402
from minibert_spec.cli import main  # noqa: E402
from minibert_spec.numerics.finite_differences import random_params  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "##s", "big", ".", "park", "in"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
TEXTS = ["The cat sat on the mat.", "A dog ran", "cats"]


@pytest.fixture
def checkpoint(tmp_path):
    config = minibert_reference.bert_tiny(vocab_size=len(VOCAB), pad_token_id=0)
    params = random_params(minibert_reference, config, seed=5)
    minibert_reference.save_pretrained(params, config, tmp_path)
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    return tmp_path, config, params


def test_tokenizer_pairs_padding_and_types(checkpoint):
    path, *_ = checkpoint
    tok = load_tokenizer(path)
    b = encode(tok, TEXTS[:2], pairs=["in the park", "a big dog"])
    cls, sep, pad = (VOCAB.index(t) for t in ("[CLS]", "[SEP]", "[PAD]"))
    row = b["input_ids"][0].tolist()
    assert row[0] == cls and row.count(sep) == 2
    first_sep = row.index(sep)
    assert b["token_type_ids"][0, : first_sep + 1].tolist() == [0] * (first_sep + 1)
    assert set(b["token_type_ids"][0, first_sep + 1:][b["attention_mask"][0, first_sep + 1:]
                                                      == 1].tolist()) == {1}
    short = int(b["attention_mask"][1].sum())
    assert short < b["input_ids"].shape[1] and set(b["input_ids"][1, short:].tolist()) == {pad}
    assert encode(tok, ["cats"])["input_ids"][0].tolist() == [cls, VOCAB.index("cat"),
                                                             VOCAB.index("##s"), sep]
    transformers = pytest.importorskip("transformers")
    hf = transformers.BertTokenizerFast(str(path / "vocab.txt"), do_lower_case=True)
    theirs = hf(TEXTS[:2], ["in the park", "a big dog"], padding=True, return_tensors="np")
    for k in ("input_ids", "token_type_ids", "attention_mask"):
        np.testing.assert_array_equal(b[k], theirs[k], err_msg=k)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_encode_cli_embeddings(checkpoint, tmp_path_factory, pooling):
    path, config, params = checkpoint
    out = tmp_path_factory.mktemp("emb") / "emb.npy"
    assert main(["encode", str(path), *TEXTS, "--pooling", pooling, "--normalize",
                 "--output", str(out)]) == 0
    emb = np.load(out)
    assert emb.shape == (len(TEXTS), config.hidden) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-6)
    # each sentence alone (no padding) gives the same embedding as in the padded batch
    body = config.replace(head="none")
    body_params = {k: v.astype(np.float32) for k, v in params.items()
                   if k in minibert_reference.param_shapes(body)}
    tok = load_tokenizer(path)
    for i, text in enumerate(TEXTS):
        b = encode(tok, [text])
        h, _ = minibert_reference.forward(body_params, body, b["input_ids"], b["attention_mask"],
                                 token_type_ids=b["token_type_ids"])
        v = h[0, 0] if pooling == "cls" else h[0].mean(axis=0)
        np.testing.assert_allclose(emb[i], v / np.linalg.norm(v), rtol=0, atol=1e-5)


def test_fill_mask_cli_on_hf_directory(checkpoint, capsys):
    path, config, params = checkpoint
    # the special tokens made the model's likeliest: fill-mask must still propose none of them
    biased = dict(params, **{"mlm.b": params["mlm.b"].copy()})
    biased["mlm.b"][[VOCAB.index(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")]] = 50
    minibert_reference.save_pretrained(biased, config, path)
    assert main(["fill-mask", str(path), "the [MASK] sat on the mat .", "-k", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "[MASK] at position 2:" and len(lines) == 4
    assert all(line.split()[0] in WORDS for line in lines[1:])
    assert main(["fill-mask", str(path), "no mask here"]) == 2  # a user mistake: one line, exit 2
