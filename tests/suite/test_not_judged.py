"""A row is ``ok`` only on evidence (issue 41): its backward met finite differences, its forward
the oracle or an identity; otherwise ``not judged`` with the reason and exit 2, unless the row is
named knowingly thin.  And the report a person reads first: the provided ops first, the ops not
provided one line (a two-op module printed 32 n/a rows)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from minibert_spec.suite.report import (
    EXIT_NOT_RUN,
    EXIT_OK,
    CheckReport,
    check_thin,
    thin_from_args,
)
from minibert_spec.suite.run import Result, absent_message
from tests import ROOT

NA = "not applicable: m takes no mask (only the protocol default None)"


def _r(check_id: str, kind: str, op: str, outcome: str, message: str = "") -> Result:
    return Result(check_id, kind, (op,), outcome, message)


def _sympy_alone(op: str = "attention") -> list[Result]:
    """The false green of issue 41: every FD, oracle and invariant check n/a, one SymPy pass."""
    return [_r(f"fd[{op}_noproj]", "fd", op, "n/a", NA),
            _r(f"oracle.forward[{op}_noproj-f64]", "oracle.forward", op, "n/a", NA),
            _r(f"oracle.backward[{op}_noproj-f64]", "oracle.backward", op, "n/a", NA),
            _r(f"invariant[{op}_noproj.zero_upstream]", "invariant", op, "n/a", NA),
            _r(f"sympy[{op}.single_head]", "sympy", op, "passed")]


def _absent(op: str) -> list[Result]:
    return [_r(f"fd[{op}]", "fd", op, "n/a", absent_message("m", (op,))),
            _r(f"sympy[{op}]", "sympy", op, "n/a", absent_message("m", (op,)))]


def test_a_row_green_on_sympy_alone_is_not_judged_and_exits_2():
    report = CheckReport("m", _sympy_alone())
    assert report.verdicts() == {"attention": "not judged"}
    assert report.exit_code() == EXIT_NOT_RUN
    assert "finite-difference" in report.unjudged()["attention"] and NA in \
        report.unjudged()["attention"]
    assert "not judged: attention" in report.summary() and "--thin attention=" in \
        report.summary()
    row = report.to_json()["ops"][0]
    assert row["verdict"] == "not judged" and "finite-difference" in row["not_judged"]


def test_a_row_named_thin_says_so_and_exits_0():
    report = CheckReport("m", _sympy_alone(), thin={"attention": "no mask in my class"})
    assert report.verdicts() == {"attention": "thin"}
    assert report.exit_code() == EXIT_OK
    assert "named thin: attention" in report.summary()
    data = report.to_json()
    assert data["thin"] == {"attention": "no mask in my class"}
    assert "no mask in my class" in data["ops"][0]["not_judged"]
    assert CheckReport.from_json(json.loads(json.dumps(data))).verdicts() == {"attention": "thin"}


def test_a_forward_judged_by_nothing_is_not_judged():
    results = [_r("fd[linear]", "fd", "linear", "passed"),
               _r("oracle.forward[linear-f64]", "oracle.forward", "linear", "n/a", NA),
               _r("invariant[linear.zero_upstream]", "invariant", "linear", "n/a", NA)]
    report = CheckReport("m", results)
    assert report.verdicts() == {"linear": "not judged"}
    assert "forward met neither the oracle nor an identity" in report.unjudged()["linear"]
    results[2].outcome = "passed"  # an identity judged it
    assert CheckReport("m", results).verdicts() == {"linear": "ok"}


def test_evidence_in_every_column_asked_is_ok():
    results = [_r("fd[linear]", "fd", "linear", "passed"),
               _r("fd[linear_nobias]", "fd", "linear", "n/a", NA),
               _r("oracle.forward[linear-f64]", "oracle.forward", "linear", "passed")]
    report = CheckReport("m", results)
    assert report.verdicts() == {"linear": "ok"} and report.exit_code() == EXIT_OK
    assert report.unjudged() == {}


def test_a_column_the_selection_left_out_asks_nothing():
    """``--kinds oracle``: no FD check selected, so none is asked of the row."""
    results = [_r("oracle.forward[linear-f64]", "oracle.forward", "linear", "passed"),
               _r("oracle.backward[linear-f64]", "oracle.backward", "linear", "passed")]
    assert CheckReport("m", results).verdicts() == {"linear": "ok"}


def test_a_failure_stays_a_failure():
    results = _sympy_alone()
    results[-1].outcome = "failed"
    report = CheckReport("m", results)
    assert report.verdicts() == {"attention": "FAIL"} and report.exit_code() == 1


@pytest.mark.parametrize("bad", [{"atention": "typo"}, {"attention": 3}])
def test_a_thin_declaration_the_protocol_cannot_take_is_refused(bad):
    with pytest.raises(ValueError, match=r"^thin_rows: "):
        check_thin(bad, "thin_rows")


def test_thin_from_the_command_line():
    assert thin_from_args(["attention=no mask", "block"]) == {
        "attention": "no mask", "block": "named thin on the command line"}
    with pytest.raises(ValueError, match=r"--thin: unknown op 'nope'"):
        thin_from_args(["nope=x"])


# --------------------------------------------------------------------------- the first read
def _two_ops_and_the_rest() -> CheckReport:
    from minibert_spec.protocol import OPS

    results = [_r("fd[linear]", "fd", "linear", "passed"),
               _r("oracle.forward[linear-f64]", "oracle.forward", "linear", "passed"),
               _r("fd[relu]", "fd", "relu", "failed", "relu d/dx wrong"),
               _r("fd[gelu]", "fd", "gelu", "n/a", "not applicable: m does not claim gelu")]
    for op in OPS:
        if op not in ("linear", "relu", "gelu"):
            results += _absent(op)
    return CheckReport("m", results, oracle="off")


def test_the_ops_not_provided_are_named_once():
    from minibert_spec.protocol import OPS

    report = _two_ops_and_the_rest()
    absent = report.not_provided()
    assert absent == [op for op in OPS if op not in ("linear", "relu", "gelu")]
    assert "gelu" not in absent  # provided, n/a for its declaration: a row of its own
    assert report.to_json()["not_provided"] == absent


def test_the_table_shows_the_provided_ops_first_and_the_rest_in_one_line(tmp_path):
    data = _two_ops_and_the_rest().to_json()
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    code = ("import json, sys, types\n"
            "from minibert_spec.cli.check import _print_table\n"
            "from minibert_spec.suite.report import CheckReport\n"
            f"d = json.load(open({str(path)!r}))\n"
            "_print_table(CheckReport.from_json(d), d)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120).stdout
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert [r.split("│")[1].strip() for r in rows] == [
        "linear", "relu", "gelu", f"{len(data['not_provided'])} more ops"], out
    assert out.count("not provided") == 2  # the row and the line naming them
    assert not any(line.startswith(f"n/a {op}:") for op in data["not_provided"]
                   for line in out.splitlines()), out
    assert "n/a gelu:" in out  # a provided op's n/a keeps its reason


def test_the_page_shows_the_provided_ops_first_and_the_rest_in_one_row(tmp_path):
    pytest.importorskip("jinja2")
    from minibert_spec.report.check import write_check_site
    from tests.report.blueprint_site import parse

    data = _two_ops_and_the_rest().to_json()
    write_check_site(data, tmp_path / "site")
    doc = parse(tmp_path / "site" / "index.html")
    grid = doc.find("table", class_="grid")
    ops = [tr.attrs["data-op"] for tr in grid.find_all("tr") if "data-op" in tr.attrs]
    assert ops == ["linear", "relu", "gelu"], ops
    collapsed = grid.find_all("tr", class_="not-provided")
    assert len(collapsed) == 1 and len(collapsed[0].find_all("code")) == len(
        data["not_provided"])
    assert "lacks" not in grid.text()  # the absent reason is not repeated in every cell


def test_minibert_check_refuses_an_unknown_thin_row_in_one_line(capsys):
    from minibert_spec.cli import main

    assert main(["check", "tests.examples.single_head_noproj", "--quick",
                 "--thin", "atention=no mask"]) == EXIT_NOT_RUN
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--thin: unknown op 'atention'" in err, err
