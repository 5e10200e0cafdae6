"""Bad input that still got through (issue 24, items 5, 7 and 9): each a named ValueError, or
for the CLI one line on stderr and exit 2, never a silent NaN, a dropped imaginary part or a
raw TypeError; and ``minibert encode -o`` writes exactly the file it reports."""

from __future__ import annotations

import json

import numpy as np
import pytest

import minibert_reference
from minibert_reference.config import BertConfig, bert_tiny, mini_bert, seed001


# --------------------------------------------------------------------------- item 5: ln_eps
@pytest.mark.parametrize("make", [BertConfig, mini_bert, seed001, bert_tiny])
@pytest.mark.parametrize("eps", [0, 0.0, -1e-12, float("nan"), float("inf"), "1e-5", None])
def test_ln_eps_must_be_a_finite_positive_number(make, eps):
    """eps = 0 made forward return NaN on a constant row, silently."""
    with pytest.raises(ValueError, match=r"^ln_eps: expected a finite number > 0"):
        make(ln_eps=eps)


def test_ln_eps_zero_config_json_is_refused(tmp_path):
    pytest.importorskip("safetensors")
    config = bert_tiny(n_layers=1, vocab_size=20, max_len=8)
    from minibert_spec.numerics.finite_differences import random_params

    minibert_reference.save_pretrained(random_params(minibert_reference, config, seed=0), config,
                                       tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "layer_norm_eps": 0}))
    with pytest.raises(ValueError, match=r"config.json: layer_norm_eps: expected a finite "):
        minibert_reference.load_pretrained(tmp_path)


# --------------------------------------------------------------------------- item 9
def _ce_cache():
    logits = np.random.default_rng(0).standard_normal((2, 3, 5))
    return minibert_reference.cross_entropy_forward(logits, np.array([[1, 2, -100], [0, 4, 3]]))[1]


def _mse_cache():
    rng = np.random.default_rng(1)
    return minibert_reference.mse_forward(rng.standard_normal((2, 3)),
                                          rng.standard_normal((2, 3)))[1]


@pytest.mark.parametrize("backward,cache", [(minibert_reference.cross_entropy_backward, _ce_cache),
                                            (minibert_reference.mse_backward, _mse_cache)])
@pytest.mark.parametrize("dloss", [1 + 2j, np.complex128(1.0), np.array(1j), True])
def test_complex_or_bool_dloss_is_refused(backward, cache, dloss):
    """A complex dloss lost its imaginary part silently."""
    with pytest.raises(ValueError, match=r"^dloss: expected a finite real scalar"):
        backward(dloss, cache())


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float16, np.complex128, "banana"])
def test_sinusoidal_encoding_refuses_non_float_dtypes(dtype):
    """An int table is sin/cos truncated to 0 and +-1; float16 was accepted too."""
    with pytest.raises(ValueError, match=r"^dtype: expected float32 or float64"):
        minibert_reference.sinusoidal_encoding(8, 6, dtype)


@pytest.mark.parametrize("T,d,name", [(2.5, 4, "T"), (4, True, "d"), (0, 4, "T"), (4, "8", "d")])
def test_sinusoidal_encoding_sizes_are_positive_integers(T, d, name):
    with pytest.raises(ValueError, match=rf"^{name}: expected a positive integer"):
        minibert_reference.sinusoidal_encoding(T, d)


def test_sinusoidal_encoding_float_dtypes_still_agree():
    a32 = minibert_reference.sinusoidal_encoding(5, 6, np.float32)
    a64 = minibert_reference.sinusoidal_encoding(np.int64(5), 6)
    assert a32.dtype == np.float32 and a64.dtype == np.float64
    np.testing.assert_array_equal(a32, a64.astype(np.float32))


@pytest.mark.parametrize("seed", ["a", 1.5, -1, None, True, [1, 2]])
def test_init_params_seed_is_a_named_error(seed):
    with pytest.raises(ValueError, match=r"^seed: expected an integer >= 0"):
        minibert_reference.init_params(bert_tiny(n_layers=1), seed=seed)


def _adam_inputs():
    rng = np.random.default_rng(2)
    params = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(4)}
    grads = {k: rng.standard_normal(p.shape) for k, p in params.items()}
    state = minibert_reference.adam_init(params)
    state["v"] = {k: rng.random(p.shape) for k, p in params.items()}
    return params, grads, state


def test_negative_second_moment_is_refused_with_its_index():
    """A negative v became sqrt(negative) = NaN in every later update, silently."""
    params, grads, state = _adam_inputs()
    state["v"]["w"][1, 2] = -1e-3
    with pytest.raises(ValueError, match=r"^state\['v'\]\['w'\]: expected values >= 0 .* "
                                         r"got -0.001 at index \(1, 2\)"):
        minibert_reference.adam_step(params, grads, state, lr=1e-3)
    state["v"]["w"][1, 2] = 0.0  # zero (and -0.0) is a valid second moment
    state["v"]["b"][0] = -0.0
    new, _ = minibert_reference.adam_step(params, grads, state, lr=1e-3)
    assert all(np.isfinite(a).all() for a in new.values())


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float16, np.bool_])
def test_adam_init_refuses_non_float_params(dtype):
    """Integer moments would truncate every update to zero."""
    with pytest.raises(ValueError, match=r"^params\['w'\]: expected a float32 or float64"):
        minibert_reference.adam_init({"b": np.zeros(3), "w": np.ones((2, 2), dtype=dtype)})


def test_adam_init_refuses_non_arrays():
    with pytest.raises(ValueError, match=r"^params\['w'\]: expected a float32 or float64 "
                                         r"ndarray, got list"):
        minibert_reference.adam_init({"w": [1.0, 2.0]})


# --------------------------------------------------------------------------- item 7: encode
@pytest.fixture
def hf_dir(tmp_path):
    pytest.importorskip("tokenizers")
    pytest.importorskip("safetensors")
    from minibert_spec.numerics.finite_differences import random_params

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat"]
    config = bert_tiny(vocab_size=len(vocab), pad_token_id=0)
    path = tmp_path / "ckpt"
    minibert_reference.save_pretrained(random_params(minibert_reference, config, seed=5), config,
                                       path)
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return path


def _encode(capsys, *argv):
    from minibert_spec.cli import main

    code = main(["encode", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_encode_errors_are_one_line_on_stderr_exit_2(tmp_path, capsys):
    """They were printed on stdout with exit 1, unlike every other command."""
    code, out, err = _encode(capsys, tmp_path / "missing", "the cat")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("minibert encode: error: path: expected a checkpoint directory")


@pytest.mark.parametrize("name", ["emb", "emb.npy", "emb.bin"])
def test_encode_writes_exactly_the_reported_path(hf_dir, tmp_path, capsys, name):
    """-o emb wrote emb.npy and reported emb."""
    target = tmp_path / "out" / name
    target.parent.mkdir()
    code, out, err = _encode(capsys, hf_dir, "the cat", "the sat cat", "-o", target)
    assert code == 0 and err == ""
    assert out.strip() == f"saved 2 x 16 embeddings to {target}"
    assert sorted(p.name for p in target.parent.iterdir()) == [name]  # nothing else written
    assert np.load(target).shape == (2, 16)


def test_encode_output_directory_or_missing_folder_is_refused(hf_dir, tmp_path, capsys):
    """-o somedir reported somedir and wrote somedir.npy beside it."""
    somedir = tmp_path / "somedir"
    somedir.mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = _encode(capsys, hf_dir, "the cat", "-o", somedir)
    assert code == 2 and out == "" and "--output: expected a file path, got the directory" in err
    code, out, err = _encode(capsys, hf_dir, "the cat", "-o", tmp_path / "no" / "emb.npy")
    assert code == 2 and "--output: expected a path in an existing folder" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before and not any(somedir.iterdir())
