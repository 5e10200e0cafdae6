"""`minibert check --format html`: the page says what the JSON says, cell by cell.

On a real run (tests/report/check_site.py: the broken LayerNorm), the page is read back with an HTML
parser and compared with ``CheckReport.to_json()``: every cell's status, colour class and reason,
every red cell's link to the failures of exactly the check ids the JSON names (their messages
and reproductions whole), the per-op verdicts, every check's outcome, and the run's notes.
The browser's view of the same page: tests/report/test_check_html_browser.py."""

from __future__ import annotations

import copy
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from minibert_spec.report import AUDIT_STATUSES, CHECK_STATUSES, STATUS, slug
from minibert_spec.report.check import split_message, write_check_site
from minibert_spec.suite.run import Result
from tests import ROOT
from tests.report.blueprint_site import parse
from tests.report.check_site import IMPL, OPS, QUICK, as_json, check_data, check_report, check_site

pytest.importorskip("jinja2")


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    return parse(check_site(tmp_path_factory.getbasetemp()) / "index.html")


def _cells(doc) -> dict[tuple[str, str], object]:
    return {(td.attrs["data-op"], td.attrs["data-col"]): td
            for td in doc.find_all("td", class_="cell")}


def _by_id(doc) -> dict[str, object]:
    return {el.attrs["id"]: el for el in doc.iter() if "id" in el.attrs}


def assert_agrees(doc, data: dict) -> None:
    """The page ``doc`` shows exactly what the JSON ``data`` says."""
    cells, ids = _cells(doc), _by_id(doc)
    results = {r["id"]: r for r in data["results"]}
    absent = data["not_provided"]  # one row for them all, their names once
    shown = [row for row in data["ops"] if row["op"] not in absent]
    expected = {(row["op"], k): c for row in shown for k, c in row["cells"].items()}
    assert set(cells) == set(expected)  # no cell missing, none invented
    collapsed = doc.find_all("tr", class_="not-provided")
    assert len(collapsed) == (1 if absent else 0)
    if absent:
        assert [c.text() for c in collapsed[0].find_all("code")] == absent
    linked = set()
    for (op, col), c in expected.items():
        td = cells[op, col]
        assert td.attrs["data-status"] == c["status"], (op, col)
        badge = td.find(class_="badge")
        assert badge.text().strip() == c["status"]
        assert f"st-{slug(c['status'])}" in badge.attrs["class"].split()
        assert td.attrs["title"] == c["detail"]
        if c["status"] not in ("FAIL", "error"):
            assert badge.tag == "span" and td.find(class_="why").text().strip() == c["detail"]
            continue
        # a red cell links to a section of this cell listing exactly its check ids
        href = badge.attrs["href"]
        assert href.startswith("#") and href[1:] in ids, (op, col, href)
        section = ids[href[1:]]
        assert (section.attrs["data-op"], section.attrs["data-col"],
                section.attrs["data-status"]) == (op, col, c["status"])
        articles = section.find_all("article")
        assert [a.attrs["data-check"] for a in articles] == c["checks"], (op, col)
        for a in articles:
            r = results[a.attrs["data-check"]]
            assert a.attrs["data-outcome"] == r["outcome"]
            parts = split_message(r["message"])
            assert a.find(class_="headline").text() == parts["headline"]
            text = a.text()
            assert parts["body"] in text and parts["reproduce"] in text
            linked.add(r["id"])
    failed = {r["id"] for r in data["results"] if r["outcome"] in ("failed", "xpassed", "error")}
    assert linked == failed  # every failure reachable from the grid, and nothing else
    verdicts = {tr.attrs["data-op"]: tr.attrs["data-verdict"]
                for tr in doc.find_all("tr") if "data-verdict" in tr.attrs}
    assert verdicts == {row["op"]: row["verdict"] for row in shown}
    outcomes = [(tr.attrs["data-check"], tr.attrs["data-outcome"])
                for tr in doc.find_all("tr") if "data-check" in tr.attrs]
    assert outcomes == [(r["id"], r["outcome"]) for r in data["results"]]
    verdict = ids["verdict"]
    assert verdict.attrs["data-exit"] == str(data["exit_code"])
    assert data["summary"] in verdict.text()
    problems = [p.text().strip() for p in doc.find_all("p", class_="run-problem")]
    assert problems == ([f"could not run: {data['load_error']}"] if data["load_error"] else []) \
        + data["notes"]
    for row in data["ops"]:
        if row["conventions"]:
            items = [li.text() for li in ids[f"conv-{row['op']}"].find_all("li")]
            assert items == row["conventions"]


def test_the_page_and_the_json_agree_on_a_real_run(page):
    data = check_data()
    # the run is what the test needs: a red op beside green ones, n/a cells with reasons
    assert data["exit_code"] == 1 and data["summary"] == "1 op(s) fail: layernorm"
    statuses = {c["status"] for row in data["ops"] for c in row["cells"].values()}
    assert statuses == {"ok", "FAIL", "n/a"}
    assert [row["op"] for row in data["ops"]] == [op for op in check_report().ops()]
    assert set(OPS) == {row["op"] for row in data["ops"]}
    assert_agrees(page, data)


def test_a_failure_names_the_tensor_the_values_and_the_reproduction(page):
    """What a reader came for, in the page's words: the check id, the tensor and index with
    both values, and Hypothesis's example."""
    article = _by_id(page)["check-layernorm-fd-fd-layernorm-"]
    assert article.attrs["data-check"] == "fd[layernorm]"
    text = article.text()
    assert "layernorm d/dx" in text and "analytic" in text and "finite difference" in text
    repro = article.find(class_="repro").text()
    assert "OpCase(" in repro and "'gamma'" in repro


def test_each_rerun_command_selects_exactly_its_check(page):
    from minibert_spec.suite import selected_checks

    commands = [a.find(class_="rerun").find("code").text() for a in page.find_all("article")]
    assert commands
    for article, cmd in zip(page.find_all("article"), commands, strict=True):
        argv = shlex.split(cmd)
        assert argv[:3] == ["minibert", "check", IMPL]
        chosen = selected_checks(match=argv[argv.index("-k") + 1],
                                 bad_input="--bad-input" in argv)
        assert [c.id for c in chosen] == [article.attrs["data-check"]]


def test_what_was_not_run_is_said(page):
    remarks = [p.text() for p in page.find_all("p", class_="run-remark")]
    assert any("oracle off" in r for r in remarks)
    assert any("bad input not run" in r for r in remarks)
    reasons = {td.find(class_="why").text().strip() for (op, col), td in _cells(page).items()
               if col in ("forward", "oracle_backward")}
    assert reasons == {"oracle off (--oracle off)"}


def test_error_cells_notes_and_conventions_reach_the_page(tmp_path):
    """The statuses a healthy run does not show: a check that could not run (its own red,
    linked like a failure), a run-level note, a convention -- the real run plus three facts."""
    report = copy.deepcopy(check_report())
    report.results.append(Result("oracle.forward[layernorm-f64]", "oracle.forward",
                                 ("layernorm",), "error", "torch is not installed: pip install "
                                 "'minibert-spec[oracle]'"))
    passed = next(r for r in report.results if r.outcome == "passed" and "softmax" in r.ops)
    passed.conventions.append("scalar loss promoted to float64 (value 1.25)")
    report.notes.append("worker 2 died (signal 9) running fd[relu]")
    data = as_json(report)
    cell = next(row for row in data["ops"] if row["op"] == "layernorm")["cells"]["forward"]
    assert cell["status"] == "error" and data["exit_code"] == 1
    out = tmp_path / "site"
    write_check_site(data, out)
    doc = parse(out / "index.html")
    assert_agrees(doc, data)
    assert _by_id(doc)["cell-layernorm-forward"].attrs["data-status"] == "error"
    assert "scalar loss promoted" in _by_id(doc)["conv-softmax"].text()


def test_the_page_carries_the_json_it_was_drawn_from(tmp_path_factory):
    out = check_site(tmp_path_factory.getbasetemp())
    assert json.loads((out / "check.json").read_text()) == check_data()
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == \
        [".minibert-report", "assets/style.css", "check.json", "index.html"]


def test_every_status_word_is_explained_in_one_legend():
    assert set(AUDIT_STATUSES) | set(CHECK_STATUSES) == set(STATUS)
    assert not set(AUDIT_STATUSES) & set(CHECK_STATUSES)
    assert len({slug(w) for w in STATUS}) == len(STATUS)  # distinct CSS classes


# --------------------------------------------------------------------------- the command
def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minibert_spec.cli", "check", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_html_needs_a_folder(tmp_path):
    p = _cli(IMPL, "--format", "html")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [
        "minibert check: --format html: expected -o DIR, the folder to write the report into"]
    (tmp_path / "f.html").write_text("mine")
    p = _cli(IMPL, "--format", "html", "-o", str(tmp_path / "f.html"))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert "expected a folder" in p.stderr and (tmp_path / "f.html").read_text() == "mine"


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_the_format_does_not_change_the_exit_status(tmp_path):
    args = [IMPL, "--ops", "layernorm", "softmax", *QUICK, "--oracle", "off"]
    as_json_ = _cli(*args, "--format", "json", "-o", str(tmp_path / "r.json"))
    as_html = _cli(*args, "--format", "html", "-o", str(tmp_path / "site"))
    assert as_json_.returncode == as_html.returncode == 1, (as_json_.stderr[-2000:],
                                                            as_html.stderr[-2000:])
    a = json.loads((tmp_path / "r.json").read_text())
    b = json.loads((tmp_path / "site" / "check.json").read_text())

    def verdict(d):  # two runs: the same statuses and ids (a shrunk example's text may differ:
        # Hypothesis shrinks for a bounded time, so on a loaded machine it stops elsewhere)
        return [(r["op"], {k: (c["status"], c["checks"], c["ran"]) for k, c in r["cells"].items()})
                for r in d["ops"]]

    assert verdict(a) == verdict(b)
    assert_agrees(parse(tmp_path / "site" / "index.html"), b)
    # a clean implementation: exit 0 either way
    ok = _cli("minibert_reference", "--ops", "softmax", *QUICK, "--oracle", "off",
              "--format", "html", "-o", str(tmp_path / "site"))
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert parse(tmp_path / "site" / "index.html").find(id="verdict").attrs["data-exit"] == "0"


def test_a_model_run_is_rerun_as_a_model_run(tmp_path):
    """A red of ``--model`` (the model the suite builds of an implementation's rows) reruns
    with ``--model``: without it the same id selects no check of that implementation.  The
    run's settings record the option; the page's command and the message's rerun line agree."""
    site = tmp_path / "site"
    p = _cli("tests.examples.realstyle_microgpt_norm:buggy", "--model", "--oracle", "off",
             "--format", "html", "-o", str(site))
    assert p.returncode == 1, p.stderr[-2000:]
    data = json.loads((site / "check.json").read_text())
    assert data["settings"]["model"] is True
    (article,) = parse(site / "index.html").find_all("article")
    argv = shlex.split(article.find(class_="rerun").find("code").text())
    assert argv[:4] == ["minibert", "check", "tests.examples.realstyle_microgpt_norm:buggy",
                        "--model"]
    assert "rerun: minibert check tests.examples.realstyle_microgpt_norm:buggy --model -k" in \
        article.text()
