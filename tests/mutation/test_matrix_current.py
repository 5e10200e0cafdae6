"""The committed mutation matrix (spec/results/mutation_matrix.json) is current: every catalog
mutant has a record whose fingerprint matches today's mutant and the tests tagged with its
equation (and their files).  A stale record is a gap in the audit, which turns the blueprint's
equations red; this test says so in one place, with the command that refreshes it, instead of
leaving a reader to work it out from a red page."""

from __future__ import annotations

import pytest

from minibert_spec.evidence import fingerprint, read_matrix
from minibert_spec.mutants import CATALOG
from minibert_spec.mutation import tagged_by_equation


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_every_catalog_mutant_has_a_current_record():
    matrix = read_matrix()
    assert matrix is not None, \
        "no spec/results/mutation_matrix.json: run `minibert mutate --matrix`"
    tagged = tagged_by_equation()
    rows = matrix["rows"]
    missing = sorted(n for n in CATALOG if n not in rows)
    stale = sorted(n for n in CATALOG if n in rows and rows[n].get("fingerprint")
                   != fingerprint(n, tagged.get(CATALOG[n].equation, ())))
    assert not missing and not stale, (
        f"mutation matrix out of date (missing {missing}, stale {stale}): the mutants or the "
        "tests tagged with their equations changed since it was recorded; run "
        "`minibert mutate --matrix -j 2` (only those rows rerun) and commit "
        "spec/results/mutation_matrix.json")


def test_every_recorded_mutant_is_killed():
    rows = read_matrix()["rows"]
    alive = sorted(n for n, r in rows.items() if n in CATALOG and r["status"] != "killed")
    assert not alive, f"mutants not killed by the tests tagged with their equation: {alive}"
