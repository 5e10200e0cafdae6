"""A declaration the run could not verify is said so (issue 41): under ``--quick --oracle off``
a wrong LayerNorm eps declaration (tests/examples/pinned_eps.py: declared 1e-5, fixed at 1e-6 in
the code) is green on FD and the invariants alone -- they agree with any eps the code fixes --
and the report said nothing.  Now the table, the JSON, the summary and the page name it."""

from __future__ import annotations

import json

import pytest

from minibert_spec.suite import check_implementation
from tests.examples import pinned_eps


@pytest.fixture(scope="module")
def quick_off():
    return check_implementation(pinned_eps.misdeclared, ops=["layernorm"], quick=True,
                                oracle="off")


def test_a_wrong_eps_declaration_under_quick_oracle_off_is_said_unverified(quick_off):
    assert quick_off.exit_code() == 0  # nothing it ran can see the wrong value...
    unverified = quick_off.unverified()
    assert [d["declaration"] for d in unverified] == ["layernorm.eps=1e-05"]  # ...and it says so
    assert unverified[0]["ops"] == ["layernorm"] and unverified[0]["checks"] >= 1
    assert "layernorm.eps=1e-05" in quick_off.summary()
    assert quick_off.to_json()["unverified_declarations"] == unverified


def test_the_table_and_the_page_name_it(quick_off, capsys, tmp_path):
    from minibert_spec.cli.check import _print_table

    data = json.loads(json.dumps(quick_off.to_json()))
    _print_table(quick_off, data)
    out = capsys.readouterr().out
    assert "unverified declaration layernorm.eps=1e-05 (layernorm)" in " ".join(out.split())
    pytest.importorskip("jinja2")
    from minibert_spec.report.check import write_check_site
    from tests.report.blueprint_site import parse

    write_check_site(data, tmp_path / "site")
    remarks = [p.text() for p in parse(tmp_path / "site" / "index.html")
               .find_all("p", class_="run-remark")]
    assert any("unverified declaration layernorm.eps=1e-05" in r for r in remarks), remarks


def test_a_declaration_the_oracle_ran_under_is_verified():
    report = check_implementation(pinned_eps.misdeclared, ops=["layernorm"], quick=True,
                                  kinds=["fd", "oracle.forward"])
    assert report.unverified() == [] and report.exit_code() == 1  # and the oracle sees it
