"""Hugging Face checkpoint directories without transformers: our save_pretrained's layout is read
back exactly, names with or without ``bert.``, buffers skipped, TF-era gamma/beta names, and every
malformed directory is a ValueError that names the tensor or says how to convert."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("safetensors")

from safetensors.numpy import load_file, save_file  # noqa: E402

import minibert_reference  # noqa: E402
from minibert_reference.config import bert_tiny  # noqa: E402
from minibert_spec.numerics.finite_differences import random_params  # noqa: E402


@pytest.fixture
def saved(tmp_path):
    config = bert_tiny(n_layers=1, vocab_size=20, max_len=8)
    params = random_params(minibert_reference, config, seed=0)
    minibert_reference.save_pretrained(params, config, tmp_path)
    return tmp_path, config, params


def _rewrite(path, edit):
    tensors = load_file(str(path / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"))


def test_round_trip_is_exact_in_both_dtypes(saved):
    path, config, params = saved
    for dtype in (np.float64, np.float32):
        config2, params2 = minibert_reference.load_pretrained(path, dtype=dtype)
        assert config2 == config and list(params2) == list(params)
        for k in params:
            assert params2[k].dtype == dtype and params2[k].flags.c_contiguous
            np.testing.assert_array_equal(params2[k], params[k].astype(dtype), err_msg=k)


def test_layout_names_and_transposes(saved):
    path, config, params = saved
    tensors = load_file(str(path / "model.safetensors"))
    q = tensors["bert.encoder.layer.0.attention.self.query.weight"]
    np.testing.assert_array_equal(q, params["layers.0.attn.W_q"].T)  # [out, in] on disk
    assert "cls.predictions.decoder.weight" not in tensors  # tied: absent, as transformers saves
    assert json.loads((path / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]


def test_prefix_buffers_decoder_and_tf_names_accepted(saved):
    path, config, params = saved

    def edit(t):
        for k in list(t):  # BertModel-style names (no prefix) for the body
            if k.startswith("bert."):
                t[k[5:]] = t.pop(k)
        t["embeddings.position_ids"] = np.arange(8, dtype=np.int64)[None]
        t["cls.predictions.decoder.weight"] = t["embeddings.word_embeddings.weight"]
        t["cls.predictions.decoder.bias"] = t["cls.predictions.bias"]
        t["embeddings.LayerNorm.gamma"] = t.pop("embeddings.LayerNorm.weight")
        t["embeddings.LayerNorm.beta"] = t.pop("embeddings.LayerNorm.bias")

    _rewrite(path, edit)
    _, params2 = minibert_reference.load_pretrained(path, dtype=np.float64)
    assert all(np.array_equal(params2[k], params[k]) for k in params)


@pytest.mark.parametrize("case,expected", [
    ("unknown", "unknown tensor 'cls.seq_relationship.weight'"),
    ("missing", "missing tensor 'encoder.layer.0.output.dense.bias'"),
    ("shape", "tensor 'encoder.layer.0.intermediate.dense.weight' has shape (16, 32)"),
    ("untied", "tensor 'cls.predictions.decoder.weight' differs"),
])
def test_malformed_tensors_are_named(saved, case, expected):
    path, *_ = saved

    def edit(t):
        if case == "unknown":
            t["cls.seq_relationship.weight"] = np.zeros((2, 16), np.float64)
        elif case == "missing":
            del t["bert.encoder.layer.0.output.dense.bias"]
        elif case == "shape":
            w = "bert.encoder.layer.0.intermediate.dense.weight"
            t[w] = np.ascontiguousarray(t[w].T)
        else:
            t["cls.predictions.decoder.weight"] = t["bert.embeddings.word_embeddings.weight"] + 1

    _rewrite(path, edit)
    with pytest.raises(ValueError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        minibert_reference.load_pretrained(path)


def test_pickle_only_directory_says_how_to_convert(tmp_path, saved):
    path, *_ = saved
    (path / "model.safetensors").unlink()
    (path / "pytorch_model.bin").write_bytes(b"not unpickled")
    with pytest.raises(ValueError, match="never unpickles.*save_pretrained.*safe_serialization"):
        minibert_reference.load_pretrained(path)


def test_bad_config_and_directory(tmp_path, saved):
    with pytest.raises(ValueError, match="expected a checkpoint directory"):
        minibert_reference.load_pretrained(tmp_path / "nope")
    path, *_ = saved
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "hidden_act": "swish"}))
    with pytest.raises(ValueError, match="hidden_act 'swish'"):
        minibert_reference.load_pretrained(path)
    with pytest.raises(ValueError, match="only the BERT architecture"):
        minibert_reference.save_pretrained(minibert_reference.init_params(minibert_reference.mini_bert()),
                                  minibert_reference.mini_bert(), tmp_path / "x")
