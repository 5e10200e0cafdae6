"""Every file a user hands over is read through one guarded reader
(minibert_reference.train.fileio.read_user_text / read_user_json): a Hugging Face ``config.json`` or
sharded index, ``tokenizer_config.json``, ``vocab.txt``, a ``tokenizer.json`` and a checkpoint's
metadata.  Not JSON, not UTF-8, empty, too large or nested 100,000 deep is one ValueError
naming the file and the problem -- never a JSONDecodeError, UnicodeDecodeError or RecursionError
from inside a library -- and the CLI prints it as one line."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

import minibert_reference  # noqa: E402
from minibert_reference.hf.tokenizer import load_tokenizer  # noqa: E402
from minibert_reference.train import checkpoint as C  # noqa: E402
from minibert_reference.train.fileio import (  # noqa: E402
    MAX_JSON_DEPTH,
    MAX_TEXT_BYTES,
    json_depth,
    loads_json,
    read_user_text,
)
from minibert_spec.numerics.finite_differences import random_params  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat"]
DEEP = ("[" * 100_000 + "]" * 100_000).encode()  # the JSON decoder's recursion gives up
DEEPISH = ('{"a": ' * (MAX_JSON_DEPTH + 1) + "1" + "}" * (MAX_JSON_DEPTH + 1)).encode()
NOT_UTF8 = b"\xff\xfe{\x00}\x00"


@pytest.fixture
def hf_dir(tmp_path):
    config = minibert_reference.bert_tiny(vocab_size=len(VOCAB), pad_token_id=0)
    minibert_reference.save_pretrained(random_params(minibert_reference, config, seed=0), config,
                                       tmp_path)
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    return tmp_path


def _refused(call, path, problem) -> str:
    with pytest.raises(ValueError) as e:
        call()
    msg = str(e.value)
    assert str(path) in msg and problem in msg and "\n" not in msg, msg
    return msg


@pytest.mark.parametrize("content, problem", [
    (DEEP, "nested at most 100 levels deep, got more than the JSON decoder can follow"),
    (DEEPISH, f"nested at most 100 levels deep, got {MAX_JSON_DEPTH + 1}"),
])
@pytest.mark.parametrize("which", ["config.json", "model.safetensors.index.json"])
def test_hf_json_nested_too_deep(hf_dir, which, content, problem):
    if which != "config.json":  # a sharded directory: the index instead of one weights file
        (hf_dir / "model.safetensors").rename(hf_dir / "model-00001-of-00001.safetensors")
    (hf_dir / which).write_bytes(content)
    _refused(lambda: minibert_reference.load_pretrained(hf_dir), hf_dir / which, problem)


@pytest.mark.parametrize("content, problem", [
    (b'{"do_lower_case": true', "a tokenizer config in valid JSON"),
    (NOT_UTF8, "in UTF-8"),
    (DEEP, "nested at most 100 levels deep"),
    (b"", "empty file"),
    (b'["do_lower_case"]', "(a JSON object), got a JSON array"),
    (b'{"do_lower_case": "no"}', "do_lower_case: expected true or false, got 'no'"),
])
def test_tokenizer_config(hf_dir, content, problem):
    (hf_dir / "tokenizer_config.json").write_bytes(content)
    _refused(lambda: load_tokenizer(hf_dir), hf_dir / "tokenizer_config.json", problem)


@pytest.mark.parametrize("content, problem", [
    (NOT_UTF8 + b"\n[PAD]\n", "in UTF-8, got undecodable bytes at offset 0"),
    (b"", "got an empty file"),
    (b"\n \n", "got an empty file"),
])
def test_vocab(hf_dir, content, problem):
    (hf_dir / "vocab.txt").write_bytes(content)
    _refused(lambda: load_tokenizer(hf_dir), hf_dir / "vocab.txt", problem)


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path):
    big = tmp_path / "tokenizer.json"
    with open(big, "wb") as fh:  # sparse: nothing is written or read
        fh.truncate(MAX_TEXT_BYTES + 1)
    _refused(lambda: read_user_text(big, "a tokenizers JSON file"), big,
             f"got a file of {MAX_TEXT_BYTES + 1} bytes")


def test_a_directory_or_missing_file_is_unreadable(tmp_path):
    for path in (tmp_path, tmp_path / "missing.json"):
        _refused(lambda p=path: read_user_text(p, "a tokenizer config"), path,
                 "got an unreadable file")


def test_tokenizer_json_for_training(tmp_path, capsys):
    """``minibert train --tokenizer FILE``: one line naming the file, exit 2, before any run."""
    from minibert_spec.cli import main

    bad = tmp_path / "tokenizer.json"
    for content, problem in ((NOT_UTF8, "in UTF-8"), (b"", "empty file")):
        bad.write_bytes(content)
        capsys.readouterr()
        code = main(["train", "--run-dir", str(tmp_path / "run"), "--tokenizer", str(bad),
                     "--steps", "2", "--warmup", "1", "--no-progress"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1, err
        assert str(bad) in err and problem in err, err
        assert not (tmp_path / "run").exists()


def test_depth_counts_arrays_and_objects():
    assert [json_depth(x) for x in (1, [], {}, [[]], {"a": [1, {"b": 2}]})] == [0, 1, 1, 2, 3]
    assert loads_json("x", '{"a": [[1]]}') == {"a": [[1]]}


def test_checkpoint_metadata_nested_too_deep(tmp_path):
    """A checkpoint whose (hash-valid) history is JSON nested 100,000 deep: one line naming
    the checkpoint, not a RecursionError."""
    from safetensors import safe_open
    from safetensors.numpy import load_file

    config = minibert_reference.bert_tiny(n_layers=1, vocab_size=len(VOCAB))
    params = minibert_reference.init_params(config)
    good = str(tmp_path / "good.safetensors")
    C.save_checkpoint(good, params, minibert_reference.adam_init(params), rng_state="{}",
                      model_config=config.to_dict())
    with safe_open(good, framework="numpy") as f:
        meta = dict(f.metadata())
    meta["history"] = DEEP.decode()
    record = json.loads(meta["sha256"])
    record[C.META + "history"] = C.sha256_text(meta["history"])
    meta["sha256"] = json.dumps(record, sort_keys=True)
    bad = str(tmp_path / "deep.safetensors")
    C.write_safetensors(bad, load_file(good), meta)
    _refused(lambda: C.load_checkpoint(bad), bad, "nested at most 100 levels deep")
