"""``minibert adapter infer``'s block row (minibert_spec.suite.infer.blocks): a block class's
parameters placed by name, its form found by its forward alone, its gradients by shape and
name -- on the GPT-2 ``Block`` of tests/examples/realstyle_block_mask.py and variants of it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minibert_spec.suite.infer import infer
from minibert_spec.suite.infer.blocks import BLOCK_RTOL, BlockMapping, infer_blocks
from minibert_spec.suite.infer.render import render_source
from tests.examples import realstyle_block_mask as gpt2

ROOT = Path(__file__).resolve().parents[2]


def _block_row(classes):
    rows, why, missing = infer_blocks(classes)
    return (rows[0] if rows else None), why, missing


def test_gpt2_block_maps_to_its_hand_adapters_form():
    m, why, missing = _block_row([gpt2.Block])
    assert isinstance(m, BlockMapping), why
    # the hand adapter's names and form (realstyle_block_mask.NAMES, its fixed= and mask=)
    assert m.params == gpt2.NAMES
    assert m.grads == {k: f"d{v}" for k, v in gpt2.NAMES.items()}
    assert m.fixed == {"norm": "pre", "activation": "gelu_tanh"}
    assert m.declares["block"] == {"norm": "pre", "causal": (False, True)}
    assert m.declares["key_mask"] is True and m.mask_name == "additive_mask"
    assert m.ctor["n_head"] == "n_heads" and m.ctor["eps"] == "eps"
    assert not missing and not m.transposed


def test_rendered_adapter_imports_and_serves_the_reference_form():
    """The written adapter runs: its block_forward on a pre-LN gelu_tanh p equals the
    reference's (the adapter, not only the mapping)."""
    from minibert_reference import block_forward, block_param_names
    from minibert_reference.ops import block_param_shapes

    source = render_source("tests.examples.realstyle_block_mask", *infer(gpt2))
    scope: dict = {}
    exec(compile(source, "<inferred>", "exec"), scope)  # noqa: S102 -- what infer wrote
    names = block_param_names(norm="pre")
    rng = np.random.default_rng(3)
    p = {n: rng.standard_normal(s) / 3 for n, s in block_param_shapes(names, 8, 32).items()}
    x = rng.standard_normal((2, 5, 8))
    got = scope["block_forward"](x, p, n_heads=2, causal=True)[0]
    want = block_forward(x, p, n_heads=2, causal=True, norm="pre", activation="gelu_tanh")[0]
    assert np.max(np.abs(got - want)) <= BLOCK_RTOL * np.max(np.abs(want))


def test_a_buggy_backward_is_mapped_the_same_way(monkeypatch):
    """Gradients are mapped by shape and name, never by value: the planted residual bug
    changes no decision (minibert check is what turns it red)."""
    correct, _, _ = _block_row([gpt2.Block])
    monkeypatch.setattr(gpt2, "BUGS", {"residual", "mask"})
    buggy, _, _ = _block_row([gpt2.Block])
    assert buggy is not None and buggy.grads == correct.grads
    assert buggy.params == correct.params


class FixedEpsBlock(gpt2.Block):
    """The GPT-2 block with its LayerNorm eps fixed at 1e-5 in the code (no eps argument)."""

    def __init__(self, n_embd, n_head, rng):
        super().__init__(n_embd, n_head, rng)


def test_a_form_off_by_a_fixed_eps_is_not_mapped_and_says_how_close():
    m, why, _ = _block_row([FixedEpsBlock])
    assert m is None
    reason = why[FixedEpsBlock]
    assert "equals no block form" in reason and "closest norm=pre" in reason, reason


class Renamed(gpt2.Block):
    """The GPT-2 block whose attention weights have names that read as nothing."""

    def __init__(self, n_embd, n_head, rng, eps=1e-5):
        super().__init__(n_embd, n_head, rng, eps)
        for n in "qkvo":
            setattr(self, f"m{n}", getattr(self, f"attn_w{n}"))
            delattr(self, f"attn_w{n}")


def test_a_class_whose_names_read_as_no_block_is_left_to_the_other_rows():
    m, why, _ = _block_row([Renamed])
    assert m is None and Renamed not in why


@pytest.mark.slow
@pytest.mark.parametrize("bug,rc", [("", 0), ("residual", 1), ("mask", 1)])
def test_minibert_check_of_the_inferred_block_is_green_on_correct_red_on_bugs(tmp_path, bug,
                                                                                   rc):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
           "MINIBERT_EXAMPLE_BUGS": bug}
    written = tmp_path / "inferred_block.py"
    subprocess.run([sys.executable, "-m", "minibert_spec.cli", "adapter", "infer",
                    "tests.examples.realstyle_block_mask", "-o", str(written)], cwd=ROOT,
                   env={**env, "MINIBERT_EXAMPLE_BUGS": ""}, check=True, capture_output=True)
    proc = subprocess.run([sys.executable, "-m", "minibert_spec.cli", "check", "inferred_block",
                           "--ops", "block", "--quick", "-j", "1"], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == rc, proc.stdout[-2000:]
