"""The mutation machinery (spec/mutants.py, spec/mutation.py): the catalog is well-formed, a
mutant applied in memory is seen by op-level and model-level code and is caught by the checks,
and removing it restores the reference exactly, on disk and in memory.

These tests mutate the bundled reference on purpose, so they name it; against another
implementation (or inside a mutation run) they are not applicable."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from minibert_reference.registry import IMPLEMENTATIONS
from minibert_spec.builtin import declarations
from minibert_spec.components import COMPONENTS
from minibert_spec.mutants import (
    CATALOG,
    OPTIMIZER_EQUATIONS,
    TOOLING_EQUATIONS,
    MutantEditError,
    activate,
    applicability,
    applied,
    module_aliases,
    mutant,
)
from minibert_spec.mutation import MutantResult, ordered_test_files, run_suite, score, select
from minibert_spec.suite import check_implementation
from minibert_spec.suite.registry import get
from minibert_spec.suite.registry import select as select_checks
from tests.unshrunk import check_implementation as unshrunk_check_implementation


@pytest.fixture(scope="module")
def reference():
    if os.environ.get("MINIBERT_MUTANT"):
        pytest.skip("not applicable: the mutation machinery mutates the bundled reference")
    import minibert_reference

    return minibert_reference


def op_verdict(impl, op: str) -> str:
    """The verdict of the op's quick run (every check on its fixed-seed cases), stopped at the
    first red (the verdict is FAIL as soon as one fails; a pass runs all)."""
    report = check_implementation(impl, ops=[op], quick=True, first_red=True)
    return report.verdict(report.grid()[op])


def test_catalog_is_documented():
    from minibert_spec.equations import load

    assert set(TOOLING_EQUATIONS) <= set(load())
    assert len(CATALOG) >= 25
    known = (set(IMPLEMENTATIONS) | set(OPTIMIZER_EQUATIONS) | set(COMPONENTS)
             | set(TOOLING_EQUATIONS))
    for m in CATALOG.values():
        assert m.equation in known, f"{m.name}: unknown equation ID {m.equation!r}"
        assert m.description and "\n" not in m.description, m.name
        assert m.targets and all(t.split(".")[0] in module_aliases() for t in m.targets)
        assert all(e.old and e.old != e.new for e in m.edits), m.name
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
    # squared ReLU is an FFN activation, no op of its own: its FFN family kills it
    "relu2_backward_missing_factor_2": "ffn",
    # a scale bug of every head count (the reference declares no single-head form)
    "attention_scale_one_over_d_k": "attention",
    "tanh_backward_missing_square": "tanh",
    **dict.fromkeys(["attention_dQ_missing_scale", "attention_dK_missing_scale",
                     "attention_dK_missing_transpose", "attention_dV_missing_transpose",
                     "attention_merge_without_transpose", "attention_dx_drops_value_branch",
                     "attention_mask_ignored_in_backward", "attention_scale_sqrt_hidden"],
                    "attention"),
    "ffn_dW2_uses_preactivation": "ffn",
    "block_drops_attention_residual": "block",
    "block_drops_ffn_residual": "block",
    "block_backward_ln1_with_ln2_cache": "block",
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
    # the chunk tail: invariant[clip.model_sized_tensors] (tensors past the 64K-entry chunk)
    **dict.fromkeys(["clip_per_tensor", "clip_scales_up_small_gradients",
                     "global_norm_missing_sqrt", "global_norm_stale_chunk_tail"], "clip"),
    **dict.fromkeys(["warmup_zero_lr_at_step0", "warmup_never_decays"], "schedule"),
    "accum_mean_of_micro_batch_means": "accumulation",
    **dict.fromkeys(["attention_split_heads_bare_reshape", "attention_dW_o_transposed",
                     "attention_dP_skips_output_projection"], "attention"),
    "layernorm_dbeta_batch_axis_only": "layernorm",
    "ce_sum_backward_divides_by_count": "cross_entropy",
    **dict.fromkeys(["gelu_derivative_missing_x_pdf", "gelu_tanh_derivative_missing_cubic"],
                    "gelu"),
    "token_type_grad_fancy_index": "token_type",
    "embedding_ln_backward_skips_layernorm": "embedding_ln",
    "mlm_decoder_grad_uses_x_hat": "mlm_head",
    "mlm_head_dn_skips_layernorm": "mlm_head",
    "tied_decoder_gradient_counted_once": "model",
    "classifier_grad_skips_tanh": "classifier",
    "linear_ce_dW_ignores_dloss": "linear_cross_entropy",
    **dict.fromkeys(["decoder_backward_loop_drops_dx", "decoder_final_norm_backward_skipped",
                     "decoder_tied_gradient_counted_once", "decoder_blocks_not_causal",
                     "attention_rope_keys_unturned",
                     "attention_rope_backward_skips_keys"], "decoder"),
    # the built-in ops' declared mutants (spec/builtin/) name their own op
    **{name: op for d in declarations() for name, op in d.caught_by().items()},
}


def _jacobian_is_p_i_delta_minus_p_j(reference):
    p = np.array([0.1, 0.2, 0.7])
    np.testing.assert_allclose(reference.softmax_jacobian(p),
                               np.diag(p) - p[:, None] * p[None, :], rtol=1e-15)


def _checkpoint_flips(_reference):
    """tests/train/test_checkpoint_integrity.py's flip tests on a fresh checkpoint."""
    import tempfile

    from tests.train import test_checkpoint_integrity as CK

    with tempfile.TemporaryDirectory() as d:
        raw = CK.make_checkpoint_bytes(d)
        CK.test_a_changed_byte_in_any_tensor_is_refused(raw, Path(d))
        CK.test_a_changed_byte_in_any_metadata_field_is_refused(raw, Path(d))


def _in_tmp(test_name, module, *args):
    """A killer that runs ``module.test_name(reference, *args, tmp_path)`` in a fresh
    temporary directory; the module is imported when it runs (torch, transformers)."""
    def kill(reference):
        import importlib
        import tempfile

        test = getattr(importlib.import_module(f"tests.{module}"), test_name)
        with tempfile.TemporaryDirectory() as tmp:
            test(reference, *args, Path(tmp))
    return kill


def _killers():
    """Mutants the op-level example checks do not see (issue 15's holes, issue 21's escaped
    bugs): the check (or test) that kills each, called in-process with the bundled reference."""
    from tests.reference import test_linear_cross_entropy as LCE
    from tests.train import test_evaluate
    from tests.train import test_wordpiece as WP

    def by_id(check_id):
        return lambda r: get(check_id).call(r)

    return {
        "embedding_ln_ignores_ln_eps": _in_tmp("test_field_away_from_its_default",
                                               "reference.test_config_fields", "transformers",
                                               "ln_eps", 1e-3, "none"),
        "mlm_head_ignores_activation": _in_tmp("test_field_away_from_its_default",
                                               "reference.test_config_fields", "transformers",
                                               "activation", "relu", "mlm"),
        "hf_gelu_new_loaded_as_erf": _in_tmp("test_every_transformers_activation_name",
                                             "reference.test_config_fields", "gelu_new",
                                             "gelu_tanh"),
        "hf_pooler_weight_not_transposed": _in_tmp(
            "test_loader_mapping_against_transformers_module_tree", "hf.test_names",
            "BertModel", True),
        "wordpiece_min_frequency_exclusive": lambda r: WP.test_hand_corpus(3),
        "wordpiece_alphabet_ties_by_insertion": lambda r: WP.test_the_worked_example(),
        "softmax_jacobian_transposed_term": _jacobian_is_p_i_delta_minus_p_j,
        "ce_log_softmax_no_max_shift": by_id("invariant[cross_entropy.large_logits-f64-sum]"),
        "ce_ignores_ignore_index_argument":
            by_id("invariant[cross_entropy.ignore_index-neg1-mean]"),
        "evaluate_mean_of_batch_means":
            lambda r: test_evaluate.test_evaluate_is_the_loss_over_every_held_out_token(r, 4),
        "layernorm_eps_outside_sqrt": by_id("invariant[layernorm.eps_inside_sqrt-0.001]"),
        "layernorm_one_pass_variance": by_id("invariant[layernorm.large_mean_float32-1000.0]"),
        "checkpoint_hash_params_only": _checkpoint_flips,
        # the fused head's block loop, at a block size the default never reaches in small tests
        "linear_ce_block_total_overwritten":
            lambda r: LCE.test_blocks_equal_the_op_pairs_across_block_boundaries(
                2 * LCE.K + 1, "mean", True),
        "linear_ce_last_row_block_skipped":
            lambda r: LCE.test_blocks_equal_the_op_pairs_across_block_boundaries(
                LCE.K + 1, "sum", True),
    }


KILLED_BY_TEST = sorted(_killers())


# mutant -> the checks (a regular expression on their ids) that judge the reference in the
# variant the mutant breaks (issue 23: the fixed-seed examples run each op in its standard form)
CAUGHT_BY_VARIANT_CHECKS = {
    "layernorm_plain_zero_affine_grads": r"^fd\[layernorm_plain\]$",
    "attention_noproj_backward_scaled": r"^fd\[attention_noproj\]$",
    "attention_causal_mask_transposed": r"^invariant\[attention\.causal\]$",
    "attention_causal_sees_next_token": r"^invariant\[attention\.causal\]$",
    "block_preln_drops_ffn_residual": r"^fd\[block_preln(_final)?\]$",
    "block_preln_ln2_backward_on_ln1_cache": r"^fd\[block_preln(_final)?\]$",
    "block_preln_ffn_reads_x": r"^oracle\.forward\[block_preln-f64\]$",
    "block_innerln_drops_ffn_residual": r"^fd\[block_innerln\]$",
    # the block's SwiGLU composition: no block family but LLaMA's draws SwiGLU
    "block_swiglu_gate_up_grads_swapped": r"^fd\[block_llama_swiglu\]$",
    # right for [N, V], wrong for [1, N, V]: the gathered layouts both run (test_variants.py)
    "ce_mean_divides_by_shape0": r"^oracle\.forward\[cross_entropy_batch_mean-f64\]$",
    "ce_probs_dp_missing_division": r"^fd\[cross_entropy_probs_mean\]$",
    "ce_probs_dlogits_missing_onehot":
        r"^oracle\.backward\[cross_entropy_probs_dlogits_mean-f64\]$",
    "ce_probs_mean_over_all_positions": r"^oracle\.forward\[cross_entropy_probs_mean-f64\]$",
    "layernorm_plain_backward_identity": r"^fd\[layernorm_plain\]$",
    "attention_noproj_output_scaled": r"^fd\[attention_noproj\]$",
    "ffn_no_b2_zero_bias_grad": r"^fd\[ffn_nob2\]$",
    # a LLaMA without RoPE is a consistent model of its own: only transformers' LLaMA sees it
    "decoder_llama_without_rope": r"^oracle\.forward\[decoder\.hf-llama-f64\]$",
    # likewise the learned + RoPE form without its RoPE: only the decoder composed in torch
    "decoder_learned_rope_without_rope": r"^oracle\.forward\[decoder\.composed-learned_rope-f64\]$",
    "decoder_head_bias_gradient_first_position": r"^fd\[decoder-sinusoidal-B2-T6\]$",
}


def test_every_mutant_has_an_expected_killer():
    killers = (set(CAUGHT_BY), set(KILLED_BY_TEST), set(CAUGHT_BY_VARIANT_CHECKS))
    assert sum(len(k) for k in killers) == len(set.union(*killers))  # one killer each
    assert set.union(*killers) == set(CATALOG)


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("name", sorted(CAUGHT_BY_VARIANT_CHECKS))
def test_variant_mutant_caught_by_its_variant_checks(reference, name):
    """Each mutant of a variant's reference code is caught by the checks of that variant (the
    checks tagged with its equation), and they pass on the reference."""
    match = CAUGHT_BY_VARIANT_CHECKS[name]
    report = check_implementation(reference, match=match)
    assert report.results and report.counts() == {"passed": len(report.results)}, \
        report.summary()
    with applied(name):  # one red is the verdict: stop there, unshrunk
        report = unshrunk_check_implementation(reference, match=match, first_red=True)
    assert report.counts().get("failed"), f"{name} survived {match}"
    assert all(CATALOG[name].equation in c.equations
               for c in select_checks(match=match)), f"{match}: not tagged {CATALOG[name].equation}"


@pytest.mark.parametrize("name", KILLED_BY_TEST)
def test_mutant_killed_by_its_new_test(reference, name):
    """Each hole's mutant: its test passes on the reference, fails under the mutant."""
    kill = _killers()[name]
    kill(reference)
    with applied(name), pytest.raises(AssertionError):
        kill(reference)
    kill(reference)


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("name", sorted(CAUGHT_BY))
def test_mutant_caught_and_removed(reference, name):
    op = CAUGHT_BY[name]
    assert op_verdict(reference, op) == "ok"
    with applied(name):
        assert op_verdict(reference, op) == "FAIL", f"{name} survived the {op} checks"
    assert op_verdict(reference, op) == "ok"


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_mutant_reaches_model_level_code(reference):
    """The kernel is patched in minibert_reference.ops: the public op and the model both run the
    mutant."""
    original = reference.ops._block_backward
    public = reference.ops.block_backward
    with applied("block_drops_ffn_residual"):
        mutated = reference.ops._block_backward
        assert mutated is not original and mutated.__mutant__ == "block_drops_ffn_residual"
        assert mutated.__equations__ == original.__equations__
        assert reference.block_backward is reference.ops.block_backward is public
        assert op_verdict(reference, "model") == "FAIL"
    assert reference.ops._block_backward is original


def test_applying_leaves_reference_untouched(reference):
    root = Path(reference.__file__).parent
    digest = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*.py"))}
    namespaces = [reference, reference.ops, reference.model, reference.optim,
                  reference.accumulation]
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


def test_optimizer_mutants_edit_the_reference(reference):
    """Optimizer mutants are source edits of minibert_reference.optim /
    minibert_reference.accumulation."""
    for m in CATALOG.values():
        if m.equation in OPTIMIZER_EQUATIONS:
            assert all(t.split(".")[0] in ("optim", "accumulation") for t in m.targets), m.name
            assert applicability(m) is None, m.name


def test_accumulation_mutant_averages_micro_batch_means(reference):
    """Two micro-batches with 1 and 3 predicted tokens: the mutant weights them equally."""
    config = reference.mini_bert(n_layers=1, hidden=8, n_heads=2, intermediate=16, max_len=4,
                                 vocab_size=11)
    params = reference.init_params(config, seed=0, dtype=np.float64)
    ids = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    batches = [{"input_ids": ids[:1], "labels": np.array([[1, -100, -100, -100]])},
               {"input_ids": ids[1:], "labels": np.array([[5, 6, 7, -100]])}]
    means = [reference.loss_and_grads(params, config, b["input_ids"], labels=b["labels"])[0]
             for b in batches]
    full, _ = reference.accumulate_gradients(reference, params, config, batches)
    assert full == pytest.approx((means[0] + 3 * means[1]) / 4)
    with applied("accum_mean_of_micro_batch_means"):
        wrong, _ = reference.accumulate_gradients(reference, params, config, batches)
    assert wrong == pytest.approx((means[0] + means[1]) / 2)


def _scratch_mutant(name, *edits, target="ops._tanh_backward"):
    """A mutant outside the catalog (registering adds it to CATALOG: removed again here)."""
    try:
        return mutant(name, "tanh.backward", "scratch", target, *edits)
    finally:
        CATALOG.pop(name, None)


def test_mutant_whose_old_text_is_absent_is_an_error(reference):
    m = _scratch_mutant("scratch_absent", ("1 - y ** 3", "1 - y"))
    with pytest.raises(MutantEditError, match=r"scratch_absent.*found it 0 times"):
        applicability(m)
    with pytest.raises(MutantEditError, match="exactly once"), applied(m):
        pass
    twice = _scratch_mutant("scratch_twice", ("y", "z"))
    with pytest.raises(MutantEditError, match="found it [2-9]"):
        activate(twice)
    assert not hasattr(reference.ops._tanh_backward, "__mutant__")


def test_mutant_whose_edit_is_a_no_op_is_rejected(reference):
    m = _scratch_mutant("scratch_no_op", ("(1 - y * y)", "(1 - y*y)"))
    with pytest.raises(MutantEditError, match="no-op"):
        applicability(m)


def test_mutant_of_a_missing_function_is_not_applicable(reference):
    m = _scratch_mutant("scratch_missing", ("a", "b"), target="ops._no_such_kernel")
    assert "has no _no_such_kernel" in applicability(m)


# --------------------------------------------------------------- the subprocess runner
SELECTION = ["tests/suite/test_conformance.py::test_op_conforms[layernorm]"]


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_runner_kills_and_reports_the_killer(reference):
    killed = run_suite("layernorm_gamma_outside_means", SELECTION, timeout=120)
    assert killed.status == "killed", killed
    assert killed.killer == SELECTION[0] and "layernorm" in killed.message


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_runner_reports_survivors(reference):
    survived = run_suite("tanh_backward_missing_square", SELECTION, timeout=120)
    assert survived.status == "survived", survived
    assert score([MutantResult("x", "killed", "t"), survived,
                  MutantResult("y", "n/a")]) == (1, 2)


def test_select_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown names"):
        select(["no_such_mutant"])


def test_test_order_keeps_files_given_before_their_directory():
    files = ordered_test_files(["tests/suite/test_conformance.py", "tests"])
    assert files[0] == "tests/suite/test_conformance.py"
    assert files.count("tests/suite/test_conformance.py") == 1
    assert "tests/suite/test_suite_reference.py" in files and all(f.endswith(".py") for f in files)
    assert ordered_test_files(SELECTION) == SELECTION
    with pytest.raises(ValueError, match="tests: .*does not exist"):
        ordered_test_files(["tests/no_such_file.py"])
