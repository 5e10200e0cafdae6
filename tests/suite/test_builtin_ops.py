"""The built-in ops' declarations (spec/builtin/, issue 38): each declaration's parts reach every
registry that reads them -- the op table, the variant options, the case families, the invariant
checks, the mutation catalog, the infer probes, the mutants' killers."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest
from hypothesis import find

from minibert_spec.builtin import declarations, modules
from minibert_spec.mutants import CATALOG
from minibert_spec.protocol import OPS
from minibert_spec.protocol.table import Op, _with_declared
from minibert_spec.protocol.variants import VARIANTS
from minibert_spec.suite import strategies as S
from minibert_spec.suite.checks import invariants  # noqa: F401 -- registers the identities
from minibert_spec.suite.checks.bad_input import _slug
from minibert_spec.suite.infer.probes import OP_NAMES, PROBES, VARIANT_PROBES
from minibert_spec.suite.registry import get

DECLARED = declarations()


def test_every_module_of_spec_builtin_declares_its_op():
    assert [d.name for d in DECLARED] == modules() and {"rmsnorm", "silu"} <= set(modules())


@pytest.mark.parametrize("decl", DECLARED, ids=lambda d: d.name)
def test_a_declaration_is_its_table_row_placed_after_its_after(decl):
    assert OPS[decl.name] == Op(**decl.row)
    names = list(OPS)
    assert names[names.index(decl.name) - 1] == decl.after


@pytest.mark.parametrize("decl", DECLARED, ids=lambda d: d.name)
def test_a_declaration_is_its_families_identities_mutants_and_probe(decl):
    families = [f for f in S.FAMILIES if f.op == decl.name]
    assert [f.name for f in families] == [
        decl.name if f.variant is None else f"{decl.name}_{f.variant}" for f in decl.families]
    for family, declared in zip(families, decl.families):
        assert family.torch is declared.torch
        # its fixed examples, built with the kit and the family's strategy keywords
        takes = inspect.signature(declared.examples).parameters
        assert S.fixed_cases(family.function,
                             **{k: v for k, v in declared.options.items() if k in takes})
    for identity in decl.identities:
        check = get(f"invariant[{decl.name}.{identity.name}]")
        assert check.source[0].endswith(f"spec/builtin/{decl.name}.py")
    for m in decl.mutants:
        assert CATALOG[m.name].equation == m.equation
        assert [(e.target, e.old, e.new) for e in CATALOG[m.name].edits] == [
            (m.target, *e) if len(e) == 2 else e for e in m.edits]
    if decl.probe is not None:
        assert PROBES[decl.name].shapes == decl.probe["shapes"]
        assert OP_NAMES[decl.name] == decl.aliases
    assert list(VARIANTS.get(decl.name, {})) == list(decl.options)
    if decl.options:  # placed after the entry it names, hand or declared
        names = list(VARIANTS)
        assert names[names.index(decl.name) - 1] == (decl.options_after or decl.after)
    for label, arg, call in decl.bad_inputs:
        check = get(f"bad_input[{decl.name}.{_slug(label.split(maxsplit=1)[1])}]")
        assert check.kwargs["arg"] == arg and check.kwargs["call"].func is call
    if decl.variant_probe is not None:
        assert VARIANT_PROBES[decl.name].declares == decl.variant_probe["declares"]


def test_a_declared_family_draws_with_its_variant_keywords():
    """The drawing is handed the kit; the variant keywords (RMSNorm's gain) still reach it, in
    the fixed examples and in the drawn cases alike."""
    nogain = S.family("rmsnorm_nogain").function
    assert nogain.fixed_examples(np.random.default_rng(0), gain=False).inputs["gamma"] is None
    assert find(nogain(gain=False), lambda case: True).inputs["gamma"] is None
    assert find(nogain(gain=True), lambda case: True).inputs["gamma"] is not None


def test_a_declaration_after_no_row_is_refused_naming_its_file():
    stray = dataclasses.replace(DECLARED[0], name="stray", after="no_such_row")
    with pytest.raises(ValueError, match=r"spec/builtin/stray.py: after: 'no_such_row'"):
        _with_declared((), (stray,))


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_a_declaration_may_follow_another_declaration_in_either_module_order(order):
    """GeGLU follows SiLU, both declared, and "geglu" sorts before "silu": the row it names is
    placed first whatever the modules' order."""
    rows = (Op(**DECLARED[0].row),)
    first = dataclasses.replace(DECLARED[0], name="first", after=DECLARED[0].name)
    second = dataclasses.replace(DECLARED[0], name="second", after="first")
    decls = (first, second)
    placed = _with_declared(rows, tuple(decls[i] for i in order))
    assert [r.name for r in placed] == [DECLARED[0].name, "first", "second"]
