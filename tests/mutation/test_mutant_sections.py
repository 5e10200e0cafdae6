"""The mutation machinery on minibert_reference.ops, a package of section modules (issue 38): every
catalog target still resolves, a mutant is compiled in the globals of the section that defines its
target, and a kernel that other sections import by name runs mutated in each of them.

These tests mutate the bundled reference on purpose, so they name it; inside a mutation run they
are not applicable."""

from __future__ import annotations

import importlib
import os
import sys

import numpy as np
import pytest

from minibert_spec.mutants import CATALOG, applicability, applied, module_aliases


@pytest.fixture(scope="module")
def ops():
    if os.environ.get("MINIBERT_MUTANT"):
        pytest.skip("not applicable: the mutation machinery mutates the bundled reference")
    import minibert_reference.ops

    return minibert_reference.ops


def target_object(target: str):
    """``"ops._layernorm_backward"`` -> the object its module alias holds under that name now."""
    alias, name = target.split(".", 1)
    return getattr(importlib.import_module(module_aliases()[alias]), name)


def test_every_catalog_target_resolves_and_applies(ops):
    """Through the package (``ops._layernorm_backward``) as through model, optim, ...: all 117
    mutants applied before the split, each still does."""
    not_applicable = {name: why for name, m in CATALOG.items()
                      if (why := applicability(m)) is not None}
    assert not not_applicable
    for m in CATALOG.values():
        for t in m.targets:
            assert callable(target_object(t)), t


def test_a_mutant_runs_in_the_globals_of_its_targets_module(ops):
    """Compiled in the namespace of the module that defines the target (the section, such as
    minibert_reference.ops.norms), not the package it is reached through: the names and module
    state its source reads are its own section's."""
    for name, m in CATALOG.items():
        originals = {t: target_object(t) for t in m.targets}
        with applied(name):
            for t, orig in originals.items():
                new = target_object(t)
                assert getattr(new, "__mutant__", None) == name, (name, t)
                assert new.__globals__ is vars(sys.modules[orig.__module__]), (
                    f"{name}: {t} compiled in {new.__globals__['__name__']}, defined in "
                    f"{orig.__module__}")


def test_a_mutated_kernel_is_swapped_in_every_section_that_imports_it(ops):
    """``_layernorm_backward`` (norms) is imported by name into blocks, embeddings and heads:
    the mutant replaces it in each, and no loaded module of the reference keeps the original."""
    orig = ops._layernorm_backward
    holders = [mod for mod in list(sys.modules.values())
               if (mod.__name__ or "").startswith("minibert_reference")
               and any(v is orig for v in vars(mod).values())]
    assert {ops.norms, ops.blocks, ops.embeddings, ops.heads, ops} <= set(holders)
    with applied("layernorm_missing_mean_term"):
        mutated = ops._layernorm_backward
        assert mutated is not orig
        for mod in holders:
            assert mod._layernorm_backward is mutated, mod.__name__
            assert not any(v is orig for v in vars(mod).values()), mod.__name__
    assert all(mod._layernorm_backward is orig for mod in holders)


def _block_dx(ops, rng):
    H, I, n_heads = 8, 12, 2
    names = ops.block_param_names()
    p = {n: rng.standard_normal(s) for n, s in ops.block_param_shapes(names, H, I).items()}
    x = rng.standard_normal((2, 3, H))
    y, cache = ops.block_forward(x, p, n_heads=n_heads)
    dx, _ = ops.block_backward(rng.standard_normal(y.shape), cache)
    return dx


def _embedding_ln_dW_word(ops, rng):
    V, T, H = 7, 4, 6
    ids, type_ids = rng.integers(0, V, (2, T)), rng.integers(0, 2, (2, T))
    W_word, W_pos, W_type = (rng.standard_normal(s) for s in ((V, H), (T, H), (2, H)))
    gamma, beta = 1 + 0.5 * rng.standard_normal(H), rng.standard_normal(H)
    y, cache = ops.embedding_ln_forward(ids, type_ids, W_word, W_pos, W_type, gamma, beta)
    return ops.embedding_ln_backward(rng.standard_normal(y.shape), cache)[0]


def _mlm_head_dh(ops, rng):
    V, H = 9, 6
    h = rng.standard_normal((2, 3, H))
    W_t, b_t = rng.standard_normal((H, H)), rng.standard_normal(H)
    gamma, beta = 1 + 0.5 * rng.standard_normal(H), rng.standard_normal(H)
    W_word, b_dec = rng.standard_normal((V, H)), rng.standard_normal(V)
    y, cache = ops.mlm_head_forward(h, W_t, b_t, gamma, beta, W_word, b_dec)
    return ops.mlm_head_backward(rng.standard_normal(y.shape), cache)[0]


@pytest.mark.parametrize("composite", [_block_dx, _embedding_ln_dW_word, _mlm_head_dh])
def test_the_composites_of_other_sections_run_the_mutated_kernel(ops, composite):
    """The public composites of blocks, embeddings and heads compute another gradient under a
    LayerNorm mutant (the kernel they import from norms), and the same one after it."""
    def grad():
        return composite(ops, np.random.default_rng(0))

    clean = grad()
    with applied("layernorm_missing_mean_term"):
        mutated = grad()
    assert np.abs(mutated - clean).max() > 1e-3 * np.abs(clean).max()
    np.testing.assert_array_equal(grad(), clean)
