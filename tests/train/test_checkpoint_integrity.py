"""Training checkpoints and run directories (issue 21's checkpoint item, issue 24's poor cases).

* Integrity: one changed byte in any stored tensor (parameters, both Adam moments) or in any
  metadata field (the RNG state, step, configs, history, thread counts, tokenizer, the hash
  record itself) is refused on load, naming what changed.  The catalog mutant
  ``checkpoint_hash_params_only`` (the hash verifies only the parameter tensors) is killed here.
* The file's bytes are a function of the state: two processes saving one state write one file.
* A hash-valid file that holds no trainable state (NaN, negative second moments, thread counts
  like ``{"workers": -3}``) is refused by name, not blamed later on ``--lr``.
* A run directory always leads somewhere: a run killed during setup says ``--force`` from both
  ``train`` and ``train --resume``; a locked directory names the process holding it; the
  temporary files of a killed save are removed at the next start.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests import ROOT

pytest.importorskip("safetensors")

import minibert_reference  # noqa: E402
from minibert_reference.train import checkpoint as C  # noqa: E402
from minibert_reference.train.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from minibert_reference.train.loop import train  # noqa: E402
from tests.train import interrupt_worker as W  # noqa: E402
from tests.train import test_train_safety as S  # noqa: E402
from tests.train.test_train_safety import FAST  # noqa: E402


def _quiet(*_a, **_k):
    pass


def make_checkpoint_bytes(directory) -> bytes:
    """A real training checkpoint (2 steps of the tiny float64 model: moments non-zero, a
    history, an RNG state part-way through) as bytes."""
    config, tcfg, data = W.tiny_setup()
    path = os.path.join(directory, "ck.safetensors")
    train(minibert_reference, config, tcfg, data, checkpoint_path=path, stop_after=2, log=_quiet)
    return open(path, "rb").read()


@pytest.fixture(scope="module")
def checkpoint_bytes(tmp_path_factory):
    return make_checkpoint_bytes(tmp_path_factory.mktemp("ck"))


def _layout(raw: bytes) -> tuple[int, dict]:
    """(start of the data, the JSON header) of a safetensors file."""
    n = int.from_bytes(raw[:8], "little")
    return 8 + n, json.loads(raw[8:8 + n])


def _other(c: str) -> str:
    """Another character of the same kind (the header stays valid JSON, same length)."""
    if c.isdigit():
        return str((int(c) + 1) % 10)
    if c.isalpha():
        return c.swapcase()
    return {"{": "[", "}": "]", "[": "{", "]": "}"}.get(c, "x")


def _refused(path: str) -> str:
    """The error load_checkpoint gives, or "" when the file loads."""
    try:
        load_checkpoint(path)
    except ValueError as e:
        return str(e)
    return ""


@pytest.mark.equation("checkpoint.integrity")
def test_a_changed_byte_in_any_tensor_is_refused(checkpoint_bytes, tmp_path):
    """Issue 21: a bit flip in an Adam moment loaded silently when only parameters were
    hashed.  Each tensor in turn gets one byte of its data flipped."""
    start, header = _layout(checkpoint_bytes)
    keys = sorted(k for k in header if k != "__metadata__")
    assert {k.split("/")[0] for k in keys} == {"param", "adam_m", "adam_v"}
    loaded = []
    path = str(tmp_path / "flipped.safetensors")
    for key in keys:
        begin, end = header[key]["data_offsets"]
        raw = bytearray(checkpoint_bytes)
        raw[start + (begin + end) // 2] ^= 0x01  # a low mantissa bit: finite, hash differs
        open(path, "wb").write(bytes(raw))
        msg = _refused(path)
        if not msg:
            loaded.append(key)
        else:
            assert f"tensor {key!r} whose content hash does not match" in msg, msg
    assert not loaded, f"{len(loaded)} of {len(keys)} tensors load with a flipped byte: {loaded}"


@pytest.mark.equation("checkpoint.integrity")
def test_a_changed_byte_in_any_metadata_field_is_refused(checkpoint_bytes, tmp_path):
    """Each metadata field in turn -- the RNG state, step, configs, history, thread counts,
    extra, the tokenizer when present, the hash record itself -- gets one character of its
    value changed (a digit to another digit, a letter's case)."""
    start, header = _layout(checkpoint_bytes)
    meta = header["__metadata__"]
    assert {"rng", "step", "model_config", "train_config", "history", "threads", "sha256",
            "format"} <= set(meta)
    text = checkpoint_bytes[8:start].decode("utf-8")
    loaded = []
    path = str(tmp_path / "edited.safetensors")
    for field, value in sorted(meta.items()):
        encoded = json.dumps(value)[1:-1]  # the value as it appears in the header
        at = text.index(f'"{field}":"{encoded}') + len(f'"{field}":"')
        # a character of the value itself, not of an escape sequence (\" \\ \n ...)
        spots = [at + i for i, c in enumerate(encoded)
                 if c not in '\\"' and (i == 0 or encoded[i - 1] != "\\")]
        i = spots[len(spots) // 2]
        edited = text[:i] + _other(text[i]) + text[i + 1:]
        assert json.loads(edited)["__metadata__"][field] != value
        open(path, "wb").write(checkpoint_bytes[:8] + edited.encode() + checkpoint_bytes[start:])
        msg = _refused(path)
        if not msg:
            loaded.append(field)
    assert not loaded, f"metadata fields that load with a changed byte: {loaded}"


SAVE_SCRIPT = """
import sys
import numpy as np
import minibert_reference
from minibert_reference.config import bert_tiny
from minibert_reference.train.checkpoint import save_checkpoint
config = bert_tiny(n_layers=1)
params = minibert_reference.init_params(config, seed=0, dtype=np.float64)
state = minibert_reference.adam_init(params)
save_checkpoint(sys.argv[1], params, state, rng_state='{"a": 1}',
                model_config=config.to_dict(), train_config={"steps": 3, "seed": 0},
                history={"loss": [1.5]}, extra={"corpus_sha256": "00"}, tokenizer_json="{}")
"""


def test_one_state_saved_by_two_processes_gives_identical_bytes(tmp_path):
    """Checkpoints equal in content were not byte-identical (safetensors writes metadata in a
    per-process hash order), so sha256sum disagreed with "identical"."""
    digests = []
    for i in range(2):
        path = str(tmp_path / f"ck{i}.safetensors")
        subprocess.run([sys.executable, "-c", SAVE_SCRIPT, path], cwd=ROOT, check=True,
                       env={**os.environ, "PYTHONHASHSEED": str(i + 1)})
        digests.append(hashlib.sha256(open(path, "rb").read()).hexdigest())
        assert load_checkpoint(path)["history"] == {"loss": [1.5]}
    assert digests[0] == digests[1]


def _tiny_state(change=None):
    config = minibert_reference.bert_tiny(n_layers=1)
    params = minibert_reference.init_params(config, seed=0, dtype=np.float64)
    state = minibert_reference.adam_init(params)
    for (group, name), value in (change or {}).items():
        d = params if group == "param" else state[group]
        d[name] = d[name].copy()
        d[name].reshape(-1)[3] = value
    return config, params, state


@pytest.mark.parametrize("group,value", [("param", np.nan), ("m", np.inf), ("v", -1e-6)])
def test_a_hash_valid_checkpoint_without_a_trainable_state_is_refused(tmp_path, group, value):
    """A NaN in a loaded checkpoint surfaced at the first step as "diverged; lower --lr"."""
    config, params, state = _tiny_state({(group, "mlm.b"): value})
    path = str(tmp_path / "ck.safetensors")
    save_checkpoint(path, params, state, rng_state="{}", model_config=config.to_dict())
    stored = {"param": "param", "m": "adam_m", "v": "adam_v"}[group]
    msg = _refused(path)
    assert f"tensor '{stored}/mlm.b' holding" in msg and "at index (3,)" in msg, msg
    assert "--lr" not in msg


@pytest.mark.parametrize("threads", [{"workers": -3, "blas": 1}, {"workers": 2},
                                     {"workers": "2", "blas": None}, [2, 1]])
def test_invalid_thread_counts_are_refused(tmp_path, monkeypatch, threads):
    """{"workers": -3} was ignored silently (the resume fell back to auto)."""
    config, params, state = _tiny_state()
    monkeypatch.setattr(C, "thread_counts", lambda: threads)
    path = str(tmp_path / "ck.safetensors")
    save_checkpoint(path, params, state, rng_state="{}", model_config=config.to_dict())
    monkeypatch.undo()
    assert C.recorded_threads(path) is None
    assert "threads" in _refused(path)


# --------------------------------------------------------------------------- run directories
def _cli(capsys, *args):
    from minibert_spec.cli import main

    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """A finished 2-step CLI run of the Mini-BERT preset (tests/train/test_train_safety.py's)."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("matplotlib")
    tmp = tmp_path_factory.mktemp("run")
    run = str(tmp / "run")
    assert S._cli(["train", "--files", S._text_file(tmp), "--run-dir", run, *FAST]) == 0
    return run


@pytest.mark.slow  # the slow tier (conftest.py): a training run killed at many moments
def test_a_run_killed_during_setup_goes_somewhere(tmp_path, cli_run, capsys):
    """After a kill before the first checkpoint (corpus.txt and tokenizer.json written),
    `train` said "pass --resume or --force" and `--resume` said "drop --resume": a circle.
    Both now say --force, which starts the run."""
    run = str(tmp_path / "run")
    os.makedirs(run)
    for f in ("corpus.txt", "tokenizer.json"):
        shutil.copy(os.path.join(cli_run, f), run)
    code, _, err = _cli(capsys, "train", "--run-dir", run, *FAST)
    assert code == 2 and "--force" in err and "pass --resume" not in err, err
    code, _, err = _cli(capsys, "train", "--run-dir", run, "--resume", *FAST)
    assert code == 2 and "--force" in err and "drop --resume" not in err, err
    code, _, err = _cli(capsys, "train", "--run-dir", run, "--force", *FAST)
    assert code == 0 and os.path.isfile(os.path.join(run, "checkpoint.safetensors")), err


def test_the_lock_message_names_the_process_holding_it(cli_run, tmp_path, capsys):
    """A second run blocked by the lock reported "internal error RunLocked ... please report
    it"."""
    run = shutil.copytree(cli_run, tmp_path / "run")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; "
         "from minibert_reference.train.fileio import RunLock; "
         "lock = RunLock(sys.argv[1]).acquire(); print('locked', flush=True); time.sleep(120)",
         str(run)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        code, _, err = _cli(capsys, "train", "--run-dir", str(run), "--resume", *FAST)
    finally:
        holder.kill()
        holder.wait()
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "internal error" not in err and f"pid {holder.pid}: " in err and "RunLock" in err, err


@pytest.mark.slow  # the slow tier: >= 4.5 s of the default run (issue 40)
def test_temporary_files_of_a_killed_save_are_removed_at_the_next_start(cli_run, tmp_path,
                                                                        capsys):
    """kill -9 during a save left 54 MB temporary files that nothing cleaned."""
    run = str(shutil.copytree(cli_run, tmp_path / "run"))
    stale = [".checkpoint.safetensors.x1y2z3.tmp", ".history.json.abc.tmp"]
    for name in stale:
        with open(os.path.join(run, name), "wb") as fh:
            fh.write(b"\0" * 1024)
    keep = os.path.join(run, "notes.tmp")  # not one of ours: left alone
    open(keep, "w").write("mine")
    code, out, err = _cli(capsys, "train", "--run-dir", run, "--resume", *FAST)
    assert code == 0, err
    assert not any(os.path.exists(os.path.join(run, n)) for n in stale)
    assert os.path.exists(keep) and "removed 2 temporary file(s)" in out


def test_a_resumed_checkpoint_with_nan_is_named_by_the_cli(cli_run, tmp_path, capsys):
    """The CLI side of the NaN case: one line naming the tensor, exit 2, not exit 3 with
    "lower --lr"."""
    run = str(shutil.copytree(cli_run, tmp_path / "run"))
    path = os.path.join(run, "checkpoint.safetensors")
    ck = load_checkpoint(path)
    ck["params"]["mlm.b"][5] = np.nan
    unfinished = {**ck["train_config"], "steps": 4}  # so that the resume runs a step
    save_checkpoint(path, ck["params"], ck["opt_state"], rng_state=ck["rng_state"],
                    model_config=ck["model_config"], train_config=unfinished,
                    tokenizer_json=ck["tokenizer_json"], history=ck["history"],
                    extra=ck["extra"])
    code, _, err = _cli(capsys, "train", "--run-dir", run, "--resume", "--no-progress")
    assert code == 2 and "tensor 'param/mlm.b' holding nan at index (5,)" in err, err
    assert "--lr" not in err
