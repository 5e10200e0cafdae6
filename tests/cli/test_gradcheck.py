"""``minibert gradcheck`` reports a wrong-shaped or missing gradient as a FAIL row naming the
tensor (exit 1), never a traceback, and still checks the other tensors."""

from __future__ import annotations

import os

import pytest

from minibert_spec.cli import main


@pytest.fixture
def reference(request, monkeypatch):
    if os.environ.get("MINIBERT_MUTANT"):
        pytest.skip("not applicable: the CLI checks the bundled reference")
    import minibert_reference

    monkeypatch.setenv("COLUMNS", "220")  # rich: one line per row
    return minibert_reference


ARGS = ["gradcheck", "--preset", "seed001", "-B", "2", "-T", "6"]


def _rows(out: str) -> dict[str, str]:
    """tensor name -> its table row."""
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if len(cells) >= 6 and ("." in cells[0] or cells[0] == "input_embeddings"):
            rows[cells[0]] = line
    return rows


def test_gradcheck_passes_on_the_reference(reference, capsys):
    assert main(ARGS) == 0
    rows = _rows(capsys.readouterr().out)
    assert "input_embeddings" in rows and len(rows) > 10
    assert not any("FAIL" in r for r in rows.values())


def test_wrong_shaped_gradient_is_a_fail_row(reference, capsys):
    """LayerNorm's dbeta summed over the batch axis only: a [T, H] gradient for [H] betas."""
    from minibert_spec.mutants import applied

    with applied("layernorm_dbeta_batch_axis_only"):
        rc = main(ARGS)
    out = capsys.readouterr()
    assert rc == 1, out.out
    assert "Traceback" not in out.out + out.err
    rows = _rows(out.out)
    betas = [n for n in rows if n.endswith("beta") and "ln" in n]
    assert betas, out.out
    for name in betas:
        assert "FAIL" in rows[name] and "gradient shape" in rows[name], rows[name]
    assert "tensor(s) failed" in out.out
    # the other tensors are still checked, and pass
    assert any("ok" in r for n, r in rows.items() if not n.endswith("beta"))


def test_missing_gradient_is_a_fail_row(reference, capsys, monkeypatch):
    real = reference.loss_and_grads

    from minibert_reference.config import PRESETS
    from minibert_reference.model import param_shapes

    dropped = sorted(param_shapes(PRESETS["seed001"]()))[0]

    def drops_one(*a, **k):
        value, grads, d_emb = real(*a, **k)
        return value, {n: g for n, g in grads.items() if n != dropped}, d_emb

    monkeypatch.setattr(reference, "loss_and_grads", drops_one)
    rc = main(ARGS)
    out = capsys.readouterr()
    assert rc == 1 and "Traceback" not in out.out + out.err
    row = _rows(out.out)[dropped]
    assert "FAIL" in row and "no gradient returned" in row, row
