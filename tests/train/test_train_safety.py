"""Issue 13, training safety: no run lost or poisoned, no cached file trusted blindly.

Each test names the finding it guards.  Tiny float64 models on synthetic ids, except the CLI
tests, which train the Mini-BERT preset for a step or two on a small text file.
"""

from __future__ import annotations

import builtins
import json
import math
import os
import struct
import time

import numpy as np
import pytest

import minibert_reference
from minibert_reference.train import data as D
from minibert_reference.train.checkpoint import load_checkpoint, save_checkpoint
from minibert_reference.train.fileio import RunLock, atomic_write
from minibert_reference.train.loop import (
    NonFiniteStep,
    TrainConfig,
    load_or_build_corpus,
    load_state,
    save_history,
    train,
)
from tests import ROOT
from tests.train import interrupt_worker as W


def _quiet(*_a, **_k):
    pass


class _PoisonAt:
    """reference, except that the gradients of step ``at`` hold one ``value``."""

    def __init__(self, at: int, value: float):
        self.at, self.value, self.calls = at, value, 0

    def __getattr__(self, name):
        return getattr(minibert_reference, name)

    def accumulate_gradients(self, *args, **kwargs):
        loss, grads = minibert_reference.accumulate_gradients(*args, **kwargs)
        if self.calls == self.at:
            grads = dict(grads)
            g = grads["mlm.b"].copy()
            g[3] = self.value
            grads["mlm.b"] = g
        self.calls += 1
        return loss, grads


# --------------------------------------------------------------------------- non-finite steps
@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_nonfinite_gradient_stops_and_keeps_the_last_good_checkpoint(tmp_path, value):
    """Finding: one inf gradient became NaN through clipping and the NaN step overwrote the
    last good checkpoint."""
    config, tcfg, data = W.tiny_setup()
    path = str(tmp_path / "ck.safetensors")
    train(minibert_reference, config, tcfg, data, checkpoint_path=path, stop_after=7, log=_quiet)
    good = open(path, "rb").read()
    state = load_state(path)[0]
    with pytest.raises(NonFiniteStep, match="step 9"):
        train(_PoisonAt(2, value), config, tcfg, data, state=state, checkpoint_path=path,
              log=_quiet)
    assert open(path, "rb").read() == good
    assert state.step == 9  # the state in memory stopped at the boundary before the bad step
    assert all(np.isfinite(p).all() for p in state.params.values())


def test_diverged_learning_rate_never_replaces_the_good_checkpoint(tmp_path):
    """Finding: a diverged --lr overwrote the last good checkpoint with inf/NaN parameters."""
    config, tcfg, data = W.tiny_setup()
    path = str(tmp_path / "ck.safetensors")
    train(minibert_reference, config, tcfg, data, checkpoint_path=path, stop_after=7, log=_quiet)
    good = open(path, "rb").read()
    state = load_state(path)[0]
    wild = TrainConfig(**{**tcfg.__dict__, "peak_lr": 1e300, "max_grad_norm": 0.0})
    with pytest.raises(NonFiniteStep):
        train(minibert_reference, config, wild, data, state=state, checkpoint_path=path, log=_quiet)
    assert open(path, "rb").read() == good


# --------------------------------------------------------------------------- hyper-parameters
@pytest.mark.parametrize("field, value", [
    ("peak_lr", math.nan), ("peak_lr", math.inf), ("peak_lr", 0.0), ("peak_lr", -1e-3),
    ("max_grad_norm", math.nan), ("max_grad_norm", -1.0), ("weight_decay", math.nan),
    ("beta1", 1.0), ("beta2", math.nan), ("adam_eps", 0.0), ("mask_prob", 0.0),
    ("mask_prob", math.nan), ("seed", -1), ("seed", 1.5)])
def test_train_config_rejects_nonfinite_and_out_of_range(field, value):
    """Findings: --lr nan was rejected only after a step-0 checkpoint was written; --clip nan
    silently disabled clipping."""
    with pytest.raises(ValueError, match=field):
        TrainConfig(**{field: value})


def _text_file(tmp_path, n=60, word="function"):
    p = tmp_path / f"{word}.txt"
    p.write_text("\n\n".join(f"the {word} number {i} returns a list of values to the caller ."
                             for i in range(n)))
    return str(p)


def _cli(args):
    from minibert_spec.cli import main

    return main(args)


FAST = ["--steps", "2", "--warmup", "1", "--eval-every", "2", "--eval-rows", "4",
        "--no-progress"]


def _snapshot(d):
    return {f: open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d))
            if not f.startswith(".")}


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A finished 2-step CLI run (Mini-BERT preset) on a small text file."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("matplotlib")
    tmp = tmp_path_factory.mktemp("run")
    text = _text_file(tmp)
    run = str(tmp / "run")
    assert _cli(["train", "--files", text, "--run-dir", run, *FAST]) == 0
    return run, text


def _copy_run(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return str(dst)


@pytest.mark.parametrize("flag", [["--lr", "nan"], ["--clip", "nan"], ["--steps", "0"],
                                  ["--warmup", "5"], ["--batch-size", "0"]])
def test_bad_flag_on_an_existing_run_writes_nothing(tmp_path, trained_run, flag, capsys):
    """Finding: `--lr nan` was rejected only after a step-0 checkpoint had replaced a
    20-step one.  Now every hyper-parameter is checked before any file is touched (even with
    --force)."""
    run = _copy_run(trained_run[0], tmp_path / "run")
    before = _snapshot(run)
    assert _cli(["train", "--run-dir", run, "--force", *FAST, *flag]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err
    assert _snapshot(run) == before


@pytest.mark.slow  # the slow tier: >= 4.5 s of the default run (issue 40)
def test_existing_run_dir_needs_resume_or_force(tmp_path, trained_run, capsys):
    """Finding: `minibert train` into an existing run dir without --resume silently
    overwrote it."""
    run = _copy_run(trained_run[0], tmp_path / "run")
    before = _snapshot(run)
    assert _cli(["train", "--files", trained_run[1], "--run-dir", run, *FAST]) == 2
    assert "--resume" in capsys.readouterr().err and _snapshot(run) == before
    # --force replaces it, with the new --files honoured
    other = _text_file(tmp_path, word="method")
    assert _cli(["train", "--files", other, "--run-dir", run, "--force", *FAST]) == 0
    assert "method number" in open(os.path.join(run, "corpus.txt")).read()


def test_files_are_never_silently_ignored(tmp_path, trained_run):
    """Finding: --files was ignored when corpus.txt existed."""
    run = _copy_run(trained_run[0], tmp_path / "run")
    with pytest.raises(ValueError, match="files"):
        load_or_build_corpus(run, [_text_file(tmp_path, word="method")], log=_quiet)


def test_two_runs_in_one_dir_are_locked(tmp_path, trained_run, capsys):
    """Finding: two runs into one dir were not locked."""
    run = _copy_run(trained_run[0], tmp_path / "run")
    before = _snapshot(run)
    with RunLock(run):
        assert _cli(["train", "--run-dir", run, "--resume", *FAST]) == 2
    assert "another training" in capsys.readouterr().err
    assert _snapshot(run) == before


@pytest.mark.slow  # the slow tier: >= 4.5 s of the default run (issue 40)
def test_resume_reports_ignored_flags_and_uses_the_checkpoint_tokenizer(tmp_path, trained_run,
                                                                        capsys):
    """Findings: --resume silently ignored every other flag; --resume ignored the tokenizer
    stored in the checkpoint (a deleted or replaced tokenizer.json silently remapped ids)."""
    run = _copy_run(trained_run[0], tmp_path / "run")
    ck = load_checkpoint(os.path.join(run, "checkpoint.safetensors"))
    other = D.train_tokenizer([f"completely different words number {i} here" for i in
                               range(50)], vocab_size=60)
    atomic_write(os.path.join(run, "tokenizer.json"), D.tokenizer_to_json(other))
    capsys.readouterr()
    assert _cli(["train", "--run-dir", run, "--resume", "--lr", "0.5", "--steps", "4",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "ignored on --resume: --lr 0.5" in out and "--steps 4" in out
    assert "tokenizer" in out and "checkpoint's copy" in out
    assert open(os.path.join(run, "tokenizer.json")).read() == ck["tokenizer_json"]


def test_resume_checks_the_corpus_hash(tmp_path, trained_run):
    """Finding: cached files were trusted (a truncated corpus.txt was used silently)."""
    run = _copy_run(trained_run[0], tmp_path / "run")
    cpath = os.path.join(run, "corpus.txt")
    text = open(cpath).read()
    open(cpath, "w").write(text[: len(text) // 2])
    from minibert_spec.cli import main

    with pytest.raises(ValueError, match="corpus.txt"):
        main(["--debug", "train", "--run-dir", run, "--resume", "--no-progress"])


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_two_fresh_runs_with_one_seed_give_identical_checkpoints(tmp_path, trained_run):
    """Finding: two fresh runs with one seed differed (the HF WordPiece trainer is not
    deterministic).  Now every tensor, the generator and the stored tokenizer (trained by each
    run) are identical."""
    tok = os.path.join(trained_run[0], "tokenizer.json")
    cks = []
    for name in ("a", "b"):
        run = str(tmp_path / name)
        assert _cli(["train", "--files", trained_run[1], "--run-dir", run, *FAST]) == 0
        cks.append(load_checkpoint(os.path.join(run, "checkpoint.safetensors")))
    a, b = cks
    # ... and the same as the first run's, trained in another test process earlier
    assert a["tokenizer_json"] == b["tokenizer_json"] == open(tok).read()
    for g in ("m", "v"):
        for k in a["opt_state"][g]:
            assert np.array_equal(a["opt_state"][g][k], b["opt_state"][g][k])
    for k in a["params"]:
        assert np.array_equal(a["params"][k], b["params"][k])
    assert a["rng_state"] == b["rng_state"]


_TIES = """
import hashlib, numpy as np
from minibert_reference.train.data import train_tokenizer
rng = np.random.default_rng(7)
words = ["".join(rng.choice(list("abcdefghij"), size=rng.integers(2, 7))) for _ in range(400)]
paras = [" ".join(rng.choice(words, size=12)) for _ in range(300)]
print(hashlib.sha256(train_tokenizer(paras, 300).to_str().encode()).hexdigest())
"""


def test_tokenizer_training_is_deterministic_across_processes():
    """Finding: the WordPiece tokenizer differed on every training with the same input (the HF
    trainer breaks ties between equal pair counts in a per-process order: on this tie-heavy
    text it gave three different vocabularies in three processes)."""
    import subprocess
    import sys

    pytest.importorskip("tokenizers")
    root = str(ROOT)
    digests = {subprocess.run([sys.executable, "-c", _TIES], cwd=root, capture_output=True,
                              text=True, check=True, timeout=120).stdout for _ in range(3)}
    assert len(digests) == 1, digests


def test_loop_is_deterministic_under_a_seed(tmp_path):
    config, tcfg, data = W.tiny_setup()
    paths = [str(tmp_path / f"{i}.safetensors") for i in range(2)]
    for p in paths:
        train(minibert_reference, config, tcfg, data, checkpoint_path=p, stop_after=9, log=_quiet)
    a, b = (load_checkpoint(p) for p in paths)
    assert all(np.array_equal(a["params"][k], b["params"][k]) for k in a["params"])


# --------------------------------------------------------------------------- atomic files
def test_trainer_never_opens_a_final_path_for_writing(tmp_path, monkeypatch, trained_run):
    """Finding: corpus.txt, tokenizer.json and history.json were not written atomically (kill -9
    left an empty or truncated corpus 7 times in 40).  Every write goes to a temporary file
    that is renamed into place."""
    opened = []
    real_open = builtins.open

    def spy(file, mode="r", *a, **k):
        if any(c in mode for c in "wax+"):
            opened.append(os.path.basename(str(file)))
        return real_open(file, mode, *a, **k)

    monkeypatch.setattr(builtins, "open", spy)
    run = str(tmp_path / "run")
    assert _cli(["train", "--files", trained_run[1], "--run-dir", run, *FAST]) == 0
    finals = {"corpus.txt", "tokenizer.json", "history.json", "checkpoint.safetensors",
              "loss_curve.png", "attention.png"}
    assert opened and not finals & set(opened), opened
    assert finals <= set(os.listdir(run))
    assert not [f for f in os.listdir(run) if f.endswith(".tmp")]


def test_failed_history_write_keeps_the_old_file(tmp_path):
    """A write that fails half-way (here: an unserialisable value) leaves the old file whole;
    before, json.dump had already truncated it and written half the new one."""
    path = str(tmp_path / "history.json")
    save_history(path, {"loss": [1.0, 2.0]})
    with pytest.raises((TypeError, ValueError)):
        save_history(path, {"loss": [1.0], "bad": object()})
    assert json.load(open(path)) == {"loss": [1.0, 2.0]}
    assert os.listdir(tmp_path) == ["history.json"]


# --------------------------------------------------------------------------- checkpoint files
def _small_checkpoint(tmp_path, **overrides):
    config, tcfg, data = W.tiny_setup()
    path = str(tmp_path / "ck.safetensors")
    train(minibert_reference, config, tcfg, data, checkpoint_path=path, stop_after=2, log=_quiet)
    return path


def _rewrite_metadata(path, out, change):
    """A copy of a safetensors file with its JSON header edited by ``change(header)``."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    change(header)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    open(out, "wb").write(struct.pack("<Q", len(h)) + h + raw[8 + n:])
    return out


def test_huge_declared_model_fails_before_allocating(tmp_path):
    """Finding: a checkpoint declaring n_layers: 300000 cost 33 s and 660 MB before failing."""
    path = _small_checkpoint(tmp_path)

    def change(h):
        mc = json.loads(h["__metadata__"]["model_config"])
        mc["n_layers"] = 300000
        h["__metadata__"]["model_config"] = json.dumps(mc)

    bad = _rewrite_metadata(path, str(tmp_path / "bad.safetensors"), change)
    with pytest.raises(ValueError, match="metadata 'model_config' whose content hash"):
        load_checkpoint(bad)  # the edit is caught by the metadata record first
    t0 = time.perf_counter()  # a crafted file may carry a matching record: the bound holds
    with pytest.raises(ValueError, match="n_layers=300000"):
        load_checkpoint(bad, verify=False)
    assert time.perf_counter() - t0 < 2.0


@pytest.mark.parametrize("name", ["RandomState", "__class__", "default_rng", None])
def test_rng_is_rebuilt_only_from_allowed_bit_generators(name):
    """Finding: rng_from_json called whatever numpy.random attribute the file named."""
    with pytest.raises(ValueError, match="rng: expected bit_generator in"):
        D.rng_from_json(json.dumps({"bit_generator": name, "state": {}}))


@pytest.mark.parametrize("text", ["{}", "not json", "[1, 2]",
                                  '{"bit_generator": "PCG64", "state": {"state": "x"}}'])
def test_rng_json_errors_are_named(text):
    with pytest.raises(ValueError, match="^rng: "):
        D.rng_from_json(text)


def test_bit_flip_in_a_tensor_is_detected(tmp_path):
    """Finding: a bit flip in a tensor went unnoticed (no hash)."""
    path = _small_checkpoint(tmp_path)
    raw = bytearray(open(path, "rb").read())
    raw[-5] ^= 0x10  # inside the last tensor's data
    open(path, "wb").write(bytes(raw))
    with pytest.raises(ValueError, match="content hash"):
        load_checkpoint(path)


def test_checkpoint_records_thread_counts_and_warns_on_a_change(tmp_path, monkeypatch):
    from minibert_reference import parallel
    from minibert_reference.train import checkpoint as C

    path = _small_checkpoint(tmp_path)
    ck = load_checkpoint(path)
    assert ck["threads"] == C.thread_counts() and ck["warnings"] == []
    assert ck["threads"]["workers"] == parallel.get_workers()
    with parallel.workers(ck["threads"]["workers"] + 1):  # another worker count: not bit-exact
        warning = load_checkpoint(path)["warnings"][0]
    assert "worker(s)" in warning and f"--threads {ck['threads']['workers']}" in warning
    if ck["threads"]["blas"] is not None:  # another BLAS count: also a warning
        monkeypatch.setattr(C, "blas_threads", lambda: ck["threads"]["blas"] + 1)
        assert "BLAS thread(s)" in load_checkpoint(path)["warnings"][0]


def _corrupt_corpus(tmp_path):
    """(label, path) of files that are not valid checkpoints."""
    good = _small_checkpoint(tmp_path)
    raw = open(good, "rb").read()
    out = []

    def put(label, data):
        p = tmp_path / f"{label}.safetensors"
        p.write_bytes(data)
        out.append((label, str(p)))

    put("empty", b"")
    put("truncated-header", raw[:20])
    put("truncated-data", raw[: len(raw) - 100])
    put("random", np.random.default_rng(0).bytes(4096))
    put("text", b"hello, I am not a checkpoint\n")
    from safetensors.numpy import save_file

    p = str(tmp_path / "foreign.safetensors")
    save_file({"x": np.zeros(3)}, p)
    out.append(("foreign", p))
    for label, change in [
        ("no-hashes", lambda h: h["__metadata__"].pop("sha256")),
        ("bad-json", lambda h: h["__metadata__"].update(history="{oops")),
        ("bad-step", lambda h: h["__metadata__"].update(step="-3")),
        ("bad-config", lambda h: h["__metadata__"].update(model_config='{"n_layers": 2, '
                                                          '"hidden": -1}')),
        ("unknown-tensor", lambda h: h.update({"weird/x": h.pop(next(
            k for k in h if k.startswith("param/")))})),
    ]:
        out.append((label, _rewrite_metadata(good, str(tmp_path / f"{label}.safetensors"),
                                             change)))
    out.append(("directory", str(tmp_path)))
    out.append(("missing", str(tmp_path / "nope.safetensors")))
    return out


def test_corrupt_checkpoints_are_named_value_errors(tmp_path):
    """Finding: truncated / corrupt checkpoints raised a raw SafetensorError without the
    path."""
    for label, path in _corrupt_corpus(tmp_path):
        with pytest.raises(ValueError, match="checkpoint") as info:
            load_state(path)
        assert os.path.basename(path) in str(info.value) or label in ("directory",), label


def test_fill_mask_on_corrupt_checkpoints_prints_one_line(tmp_path, capsys):
    pytest.importorskip("tokenizers")
    for label, path in _corrupt_corpus(tmp_path):
        assert _cli(["fill-mask", path, "the [MASK] returns"]) == 2, label
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.count("\n") == 1 and "error:" in err, (label, err)


# --------------------------------------------------------------------------- summaries
def test_interrupted_summary_reports_the_training_loss():
    """Finding: an interrupted run ended with "9.0346 (step 0) -> 9.0346 (step 0) ... above the
    baseline" while the training loss was 6.74."""
    from minibert_spec.cli.train import summary

    h = {"step": [0, 1, 2], "loss": [9.1, 7.5, 6.74], "eval_step": [0], "eval_loss": [9.0346]}
    line = summary(h, 7.0, 3, 100)
    assert "6.7400 (step 3)" in line and "-> 9.0346" not in line and "only" in line


def test_atomic_write_replaces_whole_files(tmp_path):
    p = str(tmp_path / "x.txt")
    atomic_write(p, "one")
    atomic_write(p, "two")
    assert open(p).read() == "two" and os.listdir(tmp_path) == ["x.txt"]


def test_save_checkpoint_is_atomic_on_failure(tmp_path):
    """A checkpoint that fails to serialise leaves the previous one whole."""
    path = _small_checkpoint(tmp_path)
    good = open(path, "rb").read()
    ck = load_checkpoint(path)
    with pytest.raises(Exception):  # noqa: B017 -- any failure of the writer
        save_checkpoint(path, {"x": object()}, {"step": 1, "m": {}, "v": {}}, rng_state="{}",
                        model_config=ck["model_config"])
    assert open(path, "rb").read() == good
    assert sorted(os.listdir(tmp_path)) == ["ck.safetensors"]


def test_checkpoint_configs_with_a_retired_field_load_at_its_fixed_value():
    """A checkpoint written before ``blog_literal`` left BertConfig records it as False: such a
    model_config still loads (the field is dropped); any other value of it is refused."""
    from minibert_reference.config import RETIRED_FIELDS, BertConfig, mini_bert

    config = mini_bert(vocab_size=50)
    old = {**config.to_dict(), **RETIRED_FIELDS}
    assert BertConfig.from_dict(old) == config
    with pytest.raises(ValueError, match="blog_literal"):
        BertConfig.from_dict({**old, "blog_literal": True})
    with pytest.raises(TypeError):  # an unknown field is still an error
        BertConfig.from_dict({**old, "no_such_field": 1})
