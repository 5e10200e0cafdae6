"""Hugging Face directories a user may hand to ``load_pretrained`` that are not what they claim
(issue 24, items 3-5): a crafted ``config.json`` is refused from the headers before anything
per-layer is built; every error names the file and the field as written in it; ``config.json``
or a sharded index that is empty, not UTF-8 or not JSON is one clear error; bfloat16 and
float16 weights -- as ``transformers`` writes them -- load, converted exactly."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

pytest.importorskip("safetensors")

import minibert_reference  # noqa: E402
import minibert_reference.hf.checkpoint as hfc  # noqa: E402
from minibert_reference.config import bert_tiny  # noqa: E402
from minibert_spec.numerics.finite_differences import random_params  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# BertConfig's own names: an error that shows one speaks the reference's language, not the file's
INTERNAL = re.compile(r"\b(n_layers|n_heads|max_len|ln_eps|init_std)\b|\b(intermediate|hidden)[=:]")


@pytest.fixture
def saved(tmp_path):
    config = bert_tiny(n_layers=2, vocab_size=20, max_len=8)
    minibert_reference.save_pretrained(random_params(minibert_reference, config, seed=0), config,
                                       tmp_path)
    return tmp_path


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    for k, v in changes.items():
        if v is _DROP:
            cfg.pop(k)
        else:
            cfg[k] = v
    (path / "config.json").write_text(json.dumps(cfg))


_DROP = object()


@pytest.mark.parametrize("layers", [400, 100_000])
def test_crafted_layer_count_refused_before_anything_is_built(saved, monkeypatch, layers):
    """400 declared layers took 13.5 s to refuse and 100,000 gave no answer in 60 s (the
    names were built per layer, quadratically).  Refused now from the tensors' headers: the
    per-parameter table is never built (param_shapes is not called)."""
    _edit_config(saved, num_hidden_layers=layers)
    calls = []
    real = hfc.param_shapes

    def spy(config):
        calls.append(config.n_layers)
        assert config.n_layers <= 2, f"param_shapes built for {config.n_layers} layers"
        return real(config)

    monkeypatch.setattr(hfc, "param_shapes", spy)
    with pytest.raises(ValueError) as e:
        minibert_reference.load_pretrained(saved)
    msg = str(e.value)
    assert str(saved / "config.json") in msg and "num_hidden_layers" in msg and str(layers) in msg
    assert "2 layer(s)" in msg and not calls


@pytest.mark.parametrize("changes,field", [
    (dict(num_attention_heads=5), "num_attention_heads"),
    (dict(num_attention_heads=0), "num_attention_heads"),
    (dict(hidden_size=_DROP), "hidden_size"),
    (dict(num_hidden_layers="3"), "num_hidden_layers"),
    (dict(intermediate_size=-4), "intermediate_size"),
    (dict(max_position_embeddings=True), "max_position_embeddings"),
    (dict(vocab_size=99), "vocab_size"),
    (dict(hidden_size=32), "hidden_size"),
    (dict(intermediate_size=64), "intermediate_size"),
    (dict(type_vocab_size=0), "type_vocab_size"),
    (dict(layer_norm_eps="abc"), "layer_norm_eps"),
    (dict(layer_norm_eps=0), "layer_norm_eps"),
    (dict(layer_norm_eps=-1e-12), "layer_norm_eps"),
    (dict(initializer_range=None), "initializer_range"),
    (dict(pad_token_id=20), "pad_token_id"),
    (dict(pad_token_id="0"), "pad_token_id"),
    (dict(hidden_act=["gelu"]), "hidden_act"),
    # a decoder BERT carrying only one of the two flags (issue 41)
    (dict(is_decoder=True), "is_decoder"),
    (dict(add_cross_attention=True), "add_cross_attention"),
])
def test_config_errors_name_the_file_and_the_field_as_written(saved, changes, field):
    _edit_config(saved, **changes)
    with pytest.raises(ValueError) as e:
        minibert_reference.load_pretrained(saved)
    msg = str(e.value)
    assert "config.json" in msg and field in msg, msg
    assert not INTERNAL.search(msg), msg


@pytest.mark.parametrize("content,expected", [
    (b"", "empty file"),
    (b"   \n", "empty file"),
    (b"\xff\xfe{\x00}\x00", "UTF-8"),
    (b'{"hidden_size": 16,', "valid JSON"),
    (b"[1, 2]", "JSON object"),
])
@pytest.mark.parametrize("which", ["config.json", "model.safetensors.index.json"])
def test_unreadable_json_is_one_error_naming_the_file(saved, content, expected, which):
    if which != "config.json":  # a sharded directory: the index instead of one weights file
        (saved / "model.safetensors").rename(saved / "model-00001-of-00001.safetensors")
    (saved / which).write_bytes(content)
    with pytest.raises(ValueError) as e:
        minibert_reference.load_pretrained(saved)
    assert str(saved / which) in str(e.value) and expected in str(e.value), str(e.value)


def test_sharded_index_naming_a_missing_or_outside_shard(saved):
    (saved / "model.safetensors").rename(saved / "model-00001-of-00001.safetensors")
    index = saved / "model.safetensors.index.json"
    for shard in ("model-00002-of-00002.safetensors", "../model.safetensors"):
        index.write_text(json.dumps({"weight_map": {"a": shard}}))
        with pytest.raises(ValueError, match="weight_map: expected shard files"):
            minibert_reference.load_pretrained(saved)
    index.write_text(json.dumps({"weight_map": {"bert.x": "model-00001-of-00001.safetensors"}}))
    with pytest.raises(ValueError, match="'bert.x' is not in the shard"):
        minibert_reference.load_pretrained(saved)


def test_weights_file_that_is_not_safetensors_is_named(saved):
    (saved / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="model.safetensors: expected a safetensors file"):
        minibert_reference.load_pretrained(saved)


def test_bf16_raw_bits_convert_exactly():
    """The conversion on every bf16 pattern class: the float32 whose upper half the bits are."""
    bits = np.array([0x0000, 0x8000, 0x3F80, 0xC020, 0x4049, 0x0001, 0x807F, 0x7F80, 0xFF80,
                     0x7F7F], dtype=np.uint16)  # 0, -0, 1, -2.5, 3.14, subnormals, inf, max
    values = (bits.astype(np.uint32) * 65536).view(np.float32)
    assert values[2] == 1.0 and values[3] == -2.5 and np.isinf(values[7])
    np.testing.assert_array_equal(hfc.bf16_to_float32(bits), values)
    assert np.isnan(hfc.bf16_to_float32(np.array([0x7FC0], np.uint16)))[0]


def _transformers_checkpoints(tmp_path):
    """A BertForMaskedLM with random weights saved by transformers itself, in float32 and cast
    to bfloat16 and float16 (``save_pretrained``, as published checkpoints are written)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=32,
                                  max_position_embeddings=16)
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(cfg).eval()
    with torch.no_grad():  # LayerNorm weights away from 1 and biases away from 0
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "float32")
    out = {"float32": (model, tmp_path / "float32")}
    for name, dt in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        low = transformers.BertForMaskedLM(cfg).to(dt).eval()
        low.load_state_dict({k: v.to(dt) for k, v in model.state_dict().items()})
        low.save_pretrained(tmp_path / name)
        assert json.loads((tmp_path / name / "config.json").read_text())["dtype"] == name
        out[name] = (low, tmp_path / name)
    return torch, out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bf16_and_f16_checkpoints_from_transformers_load(tmp_path, dtype):
    """Each low-precision checkpoint loads; its parameters are exactly torch's own values of
    the stored tensors, and match the float32 original to the format's precision (unit
    roundoff 2^-8 for bfloat16's 8 significant bits, 2^-11 for float16's 11, plus half of
    float16's subnormal spacing 2^-24: bfloat16 keeps float32's exponent range, float16 not)."""
    torch, ckpts = _transformers_checkpoints(tmp_path)
    config32, p32 = minibert_reference.load_pretrained(ckpts["float32"][1], dtype=dtype)
    names = hfc._hf_names(config32)
    for name, u, tiny in (("bfloat16", 2.0 ** -8, 0.0), ("float16", 2.0 ** -11, 2.0 ** -25)):
        model, path = ckpts[name]
        config, params = minibert_reference.load_pretrained(path, dtype=dtype)
        assert config == config32 and list(params) == list(p32)
        state = model.state_dict()
        for ours, (theirs, transposed) in names.items():
            a = params[ours]
            assert a.dtype == dtype and a.flags.c_contiguous, ours
            key = theirs if theirs.startswith("cls.") else "bert." + theirs
            stored = state[key].to(torch.float64).numpy()
            np.testing.assert_array_equal(a, (stored.T if transposed else stored).astype(dtype),
                                          err_msg=f"{name} {ours}")
            np.testing.assert_allclose(a, p32[ours], rtol=u, atol=tiny,
                                       err_msg=f"{name} {ours}")
        assert any(not np.array_equal(params[k], p32[k]) for k in params)  # really rounded


def test_bf16_checkpoint_forward_matches_transformers(tmp_path):
    """The bf16 checkpoint's weights, loaded into the reference, give transformers' own
    hidden states for those weights (run in float32 by torch: the weights are what matters)."""
    torch, ckpts = _transformers_checkpoints(tmp_path)
    model, path = ckpts["bfloat16"]
    config, params = minibert_reference.load_pretrained(path, dtype=np.float64)
    ids = np.random.default_rng(0).integers(0, 40, size=(2, 7))
    body = config.replace(head="none", pooler=False)
    h, _ = minibert_reference.forward({k: v for k, v in params.items()
                              if k in minibert_reference.param_shapes(body)}, body, ids,
                             np.ones_like(ids), token_type_ids=np.zeros_like(ids))
    with torch.no_grad():
        theirs = model.to(torch.float64).bert(torch.from_numpy(ids)).last_hidden_state.numpy()
    np.testing.assert_allclose(h, theirs, rtol=0, atol=1e-10)


def test_integer_parameter_tensor_is_named(saved):
    from safetensors.numpy import load_file, save_file

    t = load_file(str(saved / "model.safetensors"))
    w = "bert.embeddings.LayerNorm.weight"
    t[w] = np.ones(t[w].shape, dtype=np.int32)
    save_file(t, str(saved / "model.safetensors"))
    with pytest.raises(ValueError, match=f"tensor '{w}' has dtype I32, expected a float"):
        minibert_reference.load_pretrained(saved)
