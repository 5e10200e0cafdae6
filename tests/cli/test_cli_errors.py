"""Issue 13, CLI: no traceback for a user's mistake (one line: what is wrong and what to do;
--debug shows the traceback), help texts with defaults, reports with provenance."""

from __future__ import annotations

import os

import pytest

from minibert_spec.cli import main
from tests.train import interrupt_worker as W


def _one_line_error(capsys, rc):
    cap = capsys.readouterr()
    assert rc == 2, cap
    assert "Traceback" not in cap.err and cap.err.count("\n") == 1, cap.err
    assert "error:" in cap.err and "--debug" in cap.err
    return cap.err


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A 2-step Mini-BERT CLI run with a tokenizer (for fill-mask)."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("matplotlib")
    tmp = tmp_path_factory.mktemp("cli")
    text = tmp / "t.txt"
    text.write_text("\n\n".join(f"the function number {i} returns a list of values to the "
                                f"caller ." for i in range(60)))
    run = str(tmp / "run")
    assert main(["train", "--files", str(text), "--run-dir", run, "--steps", "2", "--warmup",
                 "1", "--eval-rows", "4", "--no-progress"]) == 0
    return run


def test_fill_mask_on_a_missing_file(tmp_path, capsys):
    err = _one_line_error(capsys, main(["fill-mask", str(tmp_path / "nope"), "a [MASK]"]))
    assert "nope" in err


def test_fill_mask_on_a_non_checkpoint_file(tmp_path, capsys):
    p = tmp_path / "x.txt"
    p.write_text("hello")
    err = _one_line_error(capsys, main(["fill-mask", str(p), "a [MASK]"]))
    assert "x.txt" in err


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("text, needle", [("no mask here", "[MASK]"),
                                          ("the [mask] returns", "capitals")])
def test_fill_mask_text_without_mask(run_dir, capsys, text, needle):
    ck = os.path.join(run_dir, "checkpoint.safetensors")
    err = _one_line_error(capsys, main(["fill-mask", ck, text]))
    assert needle in err


@pytest.mark.parametrize("k", ["-1", "0", "100000"])
def test_fill_mask_top_k_out_of_range(run_dir, capsys, k):
    """Finding: --top-k larger than the vocabulary printed 2,446 lines then crashed."""
    ck = os.path.join(run_dir, "checkpoint.safetensors")
    err = _one_line_error(capsys, main(["fill-mask", ck, "the [MASK] returns", "-k", k]))
    assert "top_k" in err


def test_fill_mask_on_a_checkpoint_without_tokenizer(tmp_path, capsys):
    path = str(tmp_path / "ck.safetensors")
    W.run(path, log=lambda *a: None)
    err = _one_line_error(capsys, main(["fill-mask", path, "the [MASK]"]))
    assert "tokenizer" in err


def test_train_short_run_with_default_warmup_is_accepted():
    """Finding: `train --steps 10` with the default --warmup 200 crashed with a traceback;
    now the default warmup shrinks to fit, and an explicit one that does not fit is a
    one-line error naming the flag."""
    from minibert_spec.cli import build_parser
    from minibert_spec.cli.train import train_config_from_args

    args = build_parser().parse_args(["train", "--steps", "10"])
    assert train_config_from_args(args).warmup_steps == 1
    args = build_parser().parse_args(["train", "--steps", "10", "--warmup", "20"])
    with pytest.raises(ValueError, match="--warmup"):
        train_config_from_args(args)


def test_train_bad_warmup_is_one_line(tmp_path, capsys):
    rc = main(["train", "--run-dir", str(tmp_path / "r"), "--steps", "10", "--warmup", "20"])
    assert "--warmup" in _one_line_error(capsys, rc)
    assert not os.path.exists(tmp_path / "r")


def test_resume_without_a_checkpoint_is_one_line(tmp_path, capsys):
    rc = main(["train", "--run-dir", str(tmp_path / "r"), "--resume"])
    assert "--resume" in _one_line_error(capsys, rc)


def test_train_missing_files_is_one_line(tmp_path, capsys):
    rc = main(["train", "--run-dir", str(tmp_path / "r"), "--files", str(tmp_path / "no.txt"),
               "--steps", "2", "--warmup", "1", "--no-progress"])
    assert "no.txt" in _one_line_error(capsys, rc)


def test_audit_with_a_bad_impl_is_one_line(capsys):
    rc = main(["audit", "--impl", "no_such_module_xyz", "--no-measure"])
    err = _one_line_error(capsys, rc)
    assert "--impl" in err and "no_such_module_xyz" in err


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(ValueError, match="checkpoint"):
        main(["--debug", "fill-mask", str(tmp_path / "nope"), "a [MASK]"])


@pytest.mark.parametrize("command, default", [("train", "(default: 4000)"),
                                              ("train", "(default: 0.001)"),
                                              ("fill-mask", "(default: 5)"),
                                              ("gradcheck", "(default: 2)"),
                                              ("mutate", "(default: 600)")])
def test_help_texts_show_defaults(capsys, command, default):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert default in " ".join(capsys.readouterr().out.split())


def test_provenance_carries_date_commit_machine_and_versions():
    from minibert_spec.cli._provenance import provenance, provenance_line

    p = provenance()
    assert {"date", "commit", "machine", "python", "packages"} <= set(p)
    assert "numpy" in p["packages"] and p["date"][:2] == "20"
    line = provenance_line(p)
    assert p["commit"] in line and "numpy" in line


def test_mutate_list_prints_provenance(capsys):
    assert main(["mutate", "--list"]) == 0
    out = capsys.readouterr().out
    assert "commit" in out.splitlines()[0] and "numpy" in out.splitlines()[0]


def test_audit_markdown_has_provenance_header():
    from types import SimpleNamespace

    from minibert_spec.cli.audit import markdown

    report = SimpleNamespace(counts=lambda: {"equations": 0, "gaps": 0, "regressions": 0},
                             ok=True, claims=[], seconds=0.0, rows=[], gaps=[], regressions=[])
    md = markdown(report)
    assert "_Generated " in md and "commit" in md
