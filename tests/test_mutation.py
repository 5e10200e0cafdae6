"""The mutation machinery (spec/mutants.py, spec/mutation.py): the catalog is well-formed, a
mutant applied in memory is seen by op-level and model-level code and is caught by the checks,
and removing it restores the reference exactly, on disk and in memory.

These tests mutate the bundled reference on purpose, so they name it; against another
implementation (or inside a mutation run) they are not applicable."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

from reference.registry import IMPLEMENTATIONS
from spec.conformance import check_op
from spec.mutants import CATALOG, OPTIMIZER_EQUATIONS, applicability, applied
from spec.mutation import MutantResult, ordered_test_files, run_suite, score, select
from tests.examples import tiny_optim


@pytest.fixture(scope="module")
def reference(request):
    if request.config.getoption("--impl") != "reference" or os.environ.get("MINIBERT_MUTANT"):
        pytest.skip("not applicable: the mutation machinery mutates the bundled reference")
    import reference

    return reference


def test_catalog_is_documented():
    assert len(CATALOG) >= 25
    known = set(IMPLEMENTATIONS) | set(OPTIMIZER_EQUATIONS)
    for m in CATALOG.values():
        assert m.equation in known, f"{m.name}: unknown equation ID {m.equation!r}"
        assert m.description and "\n" not in m.description, m.name
        assert m.targets and all(t.split(".")[0] in ("ops", "model", "optim") for t in m.targets)
    assert sum(m.equation in OPTIMIZER_EQUATIONS for m in CATALOG.values()) >= 5
    assert 3 <= len(select(fast=True)) < len(CATALOG)


# mutant -> the op whose conformance checks must catch it, in-process (milliseconds each): the
# whole catalog's op-level score runs in every CI run, and a mutant caught only by a model-level
# test would show here as a hole in its op's checks.
CAUGHT_BY = {
    **dict.fromkeys(["linear_dx_no_transpose", "linear_dW_torch_layout", "linear_db_mean",
                     "linear_db_wrong_axis"], "linear"),
    **dict.fromkeys(["layernorm_missing_mean_term", "layernorm_missing_xhat_term",
                     "layernorm_gamma_outside_means", "layernorm_dgamma_uses_centred_x",
                     "layernorm_unbiased_variance"], "layernorm"),
    **dict.fromkeys(["softmax_jvp_no_subtraction", "softmax_jvp_sum_wrong_axis",
                     "softmax_no_max_subtraction"], "softmax"),
    "relu_backward_mask_from_output": "relu",
    "tanh_backward_missing_square": "tanh",
    **dict.fromkeys(["attention_dQ_missing_scale", "attention_dK_missing_scale",
                     "attention_dK_missing_transpose", "attention_dV_missing_transpose",
                     "attention_merge_without_transpose", "attention_dx_drops_value_branch",
                     "attention_mask_ignored_in_backward", "attention_scale_sqrt_hidden"],
                    "attention"),
    "ffn_dW2_uses_preactivation": "ffn",
    "block_drops_attention_residual": "block",
    "block_drops_ffn_residual": "block",
    "model_backward_layer_order": "model",
    "embedding_backward_fancy_index": "embedding",
    "position_grad_batch_mean": "position_embedding",
    "sinusoidal_concatenated": "sinusoidal_position",
    "pooler_grad_to_last_token": "pooler",
    **dict.fromkeys(["ce_grad_leaks_unmasked", "ce_backward_divides_by_all_positions",
                     "ce_mean_over_all_positions"], "cross_entropy"),
    "mse_missing_factor_2": "mse",
    **dict.fromkeys(["adam_no_bias_correction", "adam_eps_inside_sqrt", "adamw_coupled_l2",
                     "adamw_decays_no_decay_params"], "adam"),
    **dict.fromkeys(["clip_per_tensor", "clip_scales_up_small_gradients",
                     "global_norm_missing_sqrt"], "clip"),
    **dict.fromkeys(["warmup_zero_lr_at_step0", "warmup_never_decays"], "schedule"),
    "accum_mean_of_micro_batch_means": "accumulation",
}


def test_every_mutant_has_an_expected_killer():
    assert set(CAUGHT_BY) == set(CATALOG)


@pytest.mark.parametrize("name", sorted(CAUGHT_BY))
def test_mutant_caught_and_removed(reference, name):
    op = CAUGHT_BY[name]
    assert check_op(reference, op).verdict == "ok"
    with applied(name):
        report = check_op(reference, op)
        assert report.verdict == "FAIL", f"{name} survived the {op} checks"
    assert check_op(reference, op).verdict == "ok"


def test_mutant_reaches_model_level_code(reference):
    """Patched in reference.ops AND in the package namespace: the model composes the mutant."""
    original = reference.ops.block_backward
    with applied("block_drops_ffn_residual"):
        assert reference.block_backward is reference.ops.block_backward is not original
        assert reference.ops.block_backward.__mutant__ == "block_drops_ffn_residual"
        assert reference.ops.block_backward.__equations__ == original.__equations__
        assert check_op(reference, "model").verdict == "FAIL"
    assert reference.block_backward is reference.ops.block_backward is original


def test_applying_leaves_reference_untouched(reference):
    root = Path(reference.__file__).parent
    digest = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*.py"))}
    namespaces = [reference, reference.ops, reference.model]
    before = [dict(vars(ns)) for ns in namespaces]
    for name, m in CATALOG.items():
        if applicability(m) is None:
            with applied(name):
                pass
    with pytest.raises(RuntimeError), applied("linear_db_mean"):
        raise RuntimeError("a failing body still restores the originals")
    after = [dict(vars(ns)) for ns in namespaces]
    for b, a in zip(before, after):
        assert b.keys() == a.keys() and all(a[k] is v for k, v in b.items())
    assert digest == {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in digest}


OPTIMIZER_CAUGHT_BY = {
    "adam_no_bias_correction": "adam", "adam_eps_inside_sqrt": "adam",
    "adamw_coupled_l2": "adam", "adamw_decays_no_decay_params": "adam",
    "clip_per_tensor": "clip", "clip_scales_up_small_gradients": "clip",
    "global_norm_missing_sqrt": "clip", "warmup_zero_lr_at_step0": "schedule",
    "warmup_never_decays": "schedule",
}


@pytest.mark.parametrize("name", sorted(OPTIMIZER_CAUGHT_BY))
def test_optimizer_mutants_on_a_protocol_optimizer(name):
    """The optimizer mutants work on any optimizer written to the interface, not only on
    reference.optim: here on tests/examples/tiny_optim.py."""
    op = OPTIMIZER_CAUGHT_BY[name]
    modules = {"optim": tiny_optim}
    assert applicability(CATALOG[name], modules) is None
    assert check_op(tiny_optim, op).verdict == "ok"
    with applied(name, modules):
        assert check_op(tiny_optim, op).verdict == "FAIL"
    assert check_op(tiny_optim, op).verdict == "ok"


def test_accumulation_mutant_averages_micro_batch_means():
    def grad_fn(batch):  # mean over the batch's tokens, and its token count
        return float(batch.mean()), {"w": batch.mean(axis=0)}, len(batch)

    batches = [np.full((1, 2), 1.0), np.full((3, 2), 3.0)]
    full_loss, full = tiny_optim.accumulate_gradients(grad_fn, batches)
    assert full_loss == pytest.approx(2.5) and full["w"] == pytest.approx([2.5, 2.5])
    with applied("accum_mean_of_micro_batch_means", {"optim": tiny_optim}):
        loss, grads = tiny_optim.accumulate_gradients(grad_fn, batches)
    assert loss == pytest.approx(2.0) and grads["w"] == pytest.approx([2.0, 2.0])


def test_optimizer_mutants_not_applicable_without_optim():
    reason = applicability(CATALOG["adam_no_bias_correction"])
    if importlib.util.find_spec("reference.optim") is None:
        assert reason == "reference.optim does not exist yet"
    else:
        assert reason is None or "adam_step" in reason


# --------------------------------------------------------------- the subprocess runner
SELECTION = ["tests/test_conformance.py::test_op_conforms[layernorm]"]


def test_runner_kills_and_reports_the_killer(reference):
    killed = run_suite("layernorm_gamma_outside_means", SELECTION, timeout=120)
    assert killed.status == "killed", killed
    assert killed.killer == SELECTION[0] and "layernorm" in killed.message


def test_runner_reports_survivors(reference):
    survived = run_suite("tanh_backward_missing_square", SELECTION, timeout=120)
    assert survived.status == "survived", survived
    assert score([MutantResult("x", "killed", "t"), survived,
                  MutantResult("y", "n/a")]) == (1, 2)


def test_select_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown names"):
        select(["no_such_mutant"])


def test_test_order_keeps_files_given_before_their_directory():
    files = ordered_test_files(["tests/test_conformance.py", "tests"])
    assert files[0] == "tests/test_conformance.py"
    assert files.count("tests/test_conformance.py") == 1
    assert "tests/test_bad_input.py" in files and all(f.endswith(".py") for f in files)
    assert ordered_test_files(SELECTION) == SELECTION
    with pytest.raises(ValueError, match="tests: .*does not exist"):
        ordered_test_files(["tests/no_such_file.py"])
