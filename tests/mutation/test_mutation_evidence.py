"""Mutation-verified evidence (spec/audit.py ``mutation_evidence``, the matrix spec/mutation.py
runs and spec/evidence.py keeps): a tag counts only if the tests carrying it kill a mutant of
its equation, per the recorded matrix; a missing or stale record, a gradient equation without a
mutant, and tagged tests that kill nothing are gaps; the matrix runner runs exactly the tagged
tests and records every failing one."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from minibert_spec.audit import Row, mutation_evidence
from minibert_spec.evidence import (
    MATRIX_VERSION,
    ROOT,
    _helper_files,
    fingerprint,
    read_matrix,
    write_matrix,
)
from minibert_spec.mutants import CATALOG
from minibert_spec.mutation import run_tagged

EQ = "softmax.jacobian"  # one catalog mutant: softmax_jacobian_transposed_term
MUTANT = "softmax_jacobian_transposed_term"
FILE = "tests/suite/test_suite_reference.py"  # the judging suite on the reference
TAGGED = [f"{FILE}::test_a", f"{FILE}::test_b"]


def _row(eq_id=EQ):
    return Row(eq_id, "derivation", "", [], "proven", "proven", "", [], [], [], False, True, "",
               None)


def _matrix(killers, tagged=TAGGED, name=MUTANT):
    return {"version": MATRIX_VERSION, "rows": {name: {
        "mutant": name, "equation": EQ, "status": "killed" if killers else "survived",
        "tests": list(tagged), "killers": list(killers), "seconds": 1.0,
        "fingerprint": fingerprint(name, tagged)}}}


GRADIENT = SimpleNamespace(gradient=True)


def test_a_killed_mutant_is_evidence():
    row = _row()
    mutation_evidence(row, GRADIENT, TAGGED, _matrix([TAGGED[1]]))
    assert row.gaps == []
    edits = [{"target": e.target, "old": e.old, "new": e.new} for e in CATALOG[MUTANT].edits]
    assert row.mutants == [{"mutant": MUTANT, "description": CATALOG[MUTANT].description,
                            "edits": edits, "status": "killed", "fresh": True,
                            "killers": [TAGGED[1]]}]
    assert row.mutation.startswith("1/1 mutants killed by 1 of 2 tagged tests")


def test_tagged_tests_that_kill_nothing_are_a_gap():
    row = _row()
    mutation_evidence(row, GRADIENT, TAGGED, _matrix([]))
    assert len(row.gaps) == 1 and "kill none of its mutants" in row.gaps[0]


def test_deleting_the_killing_test_is_a_gap():
    """The record named TAGGED[1] as the only killer; it is gone from the collection: the
    record is stale *and* the remaining tagged tests kill nothing."""
    row = _row()
    mutation_evidence(row, GRADIENT, TAGGED[:1], _matrix([TAGGED[1]]))
    assert any("stale" in g for g in row.gaps)
    assert any("kill none" in g for g in row.gaps)


def test_missing_matrix_or_record_is_a_gap():
    row = _row()
    mutation_evidence(row, GRADIENT, TAGGED, None)
    assert row.gaps and "run `minibert mutate --matrix`" in row.gaps[0]
    row = _row()
    mutation_evidence(row, GRADIENT, TAGGED, {"version": MATRIX_VERSION, "rows": {}})
    assert any("stale or missing" in g for g in row.gaps)


def test_a_catalog_edit_makes_the_record_stale():
    other = fingerprint("softmax_jvp_no_subtraction", TAGGED)
    assert other != fingerprint(MUTANT, TAGGED)
    matrix = _matrix([TAGGED[0]])
    matrix["rows"][MUTANT]["fingerprint"] = other
    row = _row()
    mutation_evidence(row, GRADIENT, TAGGED, matrix)
    assert any("stale" in g for g in row.gaps)


def test_gradient_equation_without_a_mutant_is_a_gap():
    row = _row("eq.without.mutant")
    mutation_evidence(row, GRADIENT, TAGGED, _matrix([TAGGED[0]]))
    assert row.gaps and "no catalog mutant" in row.gaps[0]
    row = _row("eq.without.mutant")
    mutation_evidence(row, SimpleNamespace(gradient=False), TAGGED, None)
    assert row.gaps == [] and row.mutation == "no mutant"


def test_fingerprint_follows_test_files_and_their_helpers(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "helpers.py").write_text("X = 1\n")
    (tests / "test_a.py").write_text("from tests.helpers import X\n\ndef test_x():\n    pass\n")
    ids = ["tests/test_a.py::test_x"]
    first = fingerprint(MUTANT, ids, tmp_path)
    assert fingerprint(MUTANT, ids, tmp_path) == first
    (tests / "helpers.py").write_text("X = 2\n")
    second = fingerprint(MUTANT, ids, tmp_path)
    assert second != first
    (tests / "test_a.py").write_text("from tests.helpers import X\n\ndef test_x():\n    1\n")
    assert fingerprint(MUTANT, ids, tmp_path) != second
    assert fingerprint(MUTANT, [], tmp_path) != fingerprint(MUTANT, ids, tmp_path)


def test_fingerprint_follows_every_module_of_an_imported_package(tmp_path):
    """A package imported by name (a folder with an ``__init__.py``) is every module of its
    folder: a change to a module its ``__init__`` re-exports stales the record (the suite's
    strategies are such a package; dropped, a change to a strategy kept a row "current")."""
    pkg = tmp_path / "tests" / "kit"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from tests.kit.part import X\n")
    (pkg / "part.py").write_text("X = 1\n")
    (pkg / "test_kit.py").write_text("def test_y():\n    pass\n")
    (tmp_path / "tests" / "test_a.py").write_text(
        "from tests import kit\n\ndef test_x():\n    assert kit.X\n")
    ids = ["tests/test_a.py::test_x"]
    assert [p.name for p in _helper_files(tmp_path / "tests" / "test_a.py", tmp_path / "tests")] \
        == ["__init__.py", "part.py"]  # its modules, not its tests
    first = fingerprint(MUTANT, ids, tmp_path)
    (pkg / "part.py").write_text("X = 2\n")
    assert fingerprint(MUTANT, ids, tmp_path) != first


def test_the_suite_checks_fingerprint_every_module_of_the_strategies():
    """The FD checks import the strategies package by name: each of its modules is a helper."""
    checks = ROOT / "spec" / "suite" / "checks" / "fd.py"
    helpers = set(_helper_files(checks, ROOT / "tests"))
    modules = sorted((ROOT / "spec" / "suite" / "strategies").glob("*.py"))
    assert len(modules) > 2 and ROOT / "spec" / "suite" / "strategies" / "kit.py" in modules
    assert not [m for m in modules if m not in helpers], sorted(helpers)


def test_matrix_file_round_trip_and_corruption(tmp_path):
    path = tmp_path / "results" / "m.json"
    write_matrix({"b": {"x": 1}, "a": {"x": 2}}, path, profile="ci")
    data = read_matrix(path)
    assert list(data["rows"]) == ["a", "b"] and data["profile"] == "ci"
    assert [p.name for p in path.parent.iterdir()] == ["m.json"]  # no temporary left behind
    path.write_text("{not json")
    assert read_matrix(path) is None
    path.write_text('{"version": 0, "rows": {}}')
    assert read_matrix(path) is None


@pytest.fixture
def bundled(request):
    if os.environ.get("MINIBERT_MUTANT"):
        pytest.skip("not applicable: the matrix mutates the bundled reference")


@pytest.mark.slow  # the slow tier (conftest.py): a matrix run per mutant
def test_runner_runs_only_the_tagged_tests_and_records_every_killer(bundled):
    """The runner selects by the equation marker in the files the node ids name (no -x)."""
    status, killers, _, _ = run_tagged("", EQ, TAGGED, timeout=300)
    assert (status, killers) == ("survived", [])
    status, killers, message, _ = run_tagged(MUTANT, EQ, TAGGED, timeout=300)
    assert status == "killed", message
    assert killers and all(k.startswith(FILE + "::test_conformance[") and "softmax" in k
                           and "jacobian" in k for k in killers), killers
    # another equation's tests do not kill it; an equation no test is tagged with selects none
    assert run_tagged(MUTANT, "linear.forward", TAGGED, timeout=300)[:2] == ("survived", [])
    assert run_tagged(MUTANT, "no.such.equation", TAGGED, timeout=300)[:2] == ("untested", [])
