"""The blueprint (``minibert audit --format html``): the documents table, the ``uses`` graph,
the layout, and that the site says what the audit's JSON says.  The rendered pages are checked
in a real browser by tests/report/test_blueprint_browser.py."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from minibert_spec.documents import BY_KEY, DOCUMENTS, UnknownSource, locate
from minibert_spec.equations import EQUATIONS, load
from minibert_spec.report import MARKER, STATUS, Site, check_output, slug
from minibert_spec.report.graph import CycleError, layers_of, layout
from tests import ROOT
from tests.report.blueprint_site import BROKEN_ID, audit_data, broken_site, parse, site

load()


@pytest.fixture(scope="module")
def data():
    return audit_data()


@pytest.fixture(scope="module")
def built(data, tmp_path_factory):
    return site(tmp_path_factory.getbasetemp())


# --------------------------------------------------------------------------- documents
def test_every_citation_locates():
    """Every source an equation or claim cites names a document and a section of
    spec/documents.py, so each is listed in the index under the section that states it."""
    from minibert_spec.claims import CLAIMS

    cited = [s for e in EQUATIONS.values() for s in e.sources]
    cited += [c.source for c in CLAIMS.values()]
    bad = {}
    for s in cited:
        try:
            assert locate(s), s
        except UnknownSource as e:
            bad[s] = str(e)
    assert not bad, bad


@pytest.mark.parametrize("source, expected", [
    ("Mini-BERT derivation §3.3", [("minibert", "3.3")]),
    ("visual guide §2, §9", [("guide", "2"), ("guide", "9")]),
    ("Mini-BERT derivation §1-2.2; visual guide §3", [("minibert", "1"), ("guide", "3")]),
    ("BERT masked-LM slides (steps 4-5)", [("slides", "step-4")]),
    ("project convention (BERT's optimizer; not in the five documents)",
     [("project", "convention")]),
])
def test_locate(source, expected):
    assert locate(source) == expected


@pytest.mark.parametrize("source", ["Mini-BERT derivation §11.2", "BERT-base blog (epilogue)",
                                    "the appendix §1", "BERT-base blog §2",
                                    "Mini-BERT derivation"])
def test_locate_refuses_what_the_table_lacks(source):
    with pytest.raises(UnknownSource):
        locate(source)


def test_documents_in_the_seed_order():
    assert [d.key for d in DOCUMENTS if d.source] == ["minibert", "seed001", "slides", "blog",
                                                      "guide"]
    for d in DOCUMENTS:
        numbers = [tuple(int(p) for p in s.key.split(".")) for s in d.sections
                   if s.key[0].isdigit()]
        assert numbers == sorted(numbers), d.key


# --------------------------------------------------------------------------- uses
def test_every_uses_target_exists():
    missing = {e.id: [u for u in e.uses if u not in EQUATIONS] for e in EQUATIONS.values()}
    assert not {k: v for k, v in missing.items() if v}, missing


def test_uses_form_a_dag_of_derivations():
    """No cycle; a derivation is built from derivations (a document's variant is linked to
    the form the code implements by ``target``, never used)."""
    layers_of(EQUATIONS, [(u, e.id) for e in EQUATIONS.values() for u in e.uses])
    for e in EQUATIONS.values():
        for u in e.uses:
            assert EQUATIONS[u].kind == "derivation", (e.id, u)
        assert len(set(e.uses)) == len(e.uses), e.id


def test_backward_passes_use_their_forward_pieces():
    """The edges the blueprint is read for (spot checks, from the derivations)."""
    uses = {e.id: set(e.uses) for e in EQUATIONS.values()}
    assert {"layernorm.forward"} <= uses["layernorm.backward.dx"]
    assert {"attention.backward.dQ", "attention.backward.dK",
            "attention.backward.dV"} <= uses["attention.backward.dx"]
    assert {"softmax.backward", "attention.backward.dP"} <= uses["attention.backward.dS"]
    assert {"linear.backward.dW", "relu.backward"} <= uses["ffn.backward"]


def test_uses_rejects_itself_and_a_bare_string():
    from minibert_spec.equations import Equation
    with pytest.raises(ValueError, match="itself"):
        Equation("x.y", "t", (), "x", None, uses=("x.y",))
    with pytest.raises(ValueError, match="tuple"):
        Equation("x.y", "t", (), "x", None, uses="a.b")


# --------------------------------------------------------------------------- layout
def _edges(pairs):
    return [(a, b, "uses") for a, b in pairs]


def test_layout_edges_point_right_and_nodes_do_not_overlap():
    ids = {e.id: e for e in EQUATIONS.values()}
    edges = [(u, i, "uses") for i, e in ids.items() for u in e.uses]
    lay = layout(ids, edges)
    for e in lay.edges:
        path = [lay.nodes[n] for n in e.path]
        assert [n.layer for n in path] == list(range(path[0].layer, path[-1].layer + 1)), e
        assert all(a.x < b.x for a, b in zip(path, path[1:])), e
    boxes = [(n.x, n.y, n.x + n.width, n.y + 22) for n in lay.real()]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (a, b)
    assert all(n.x + n.width <= lay.width and n.y + 22 <= lay.height for n in lay.real())


def test_layout_uncrosses_what_can_be_uncrossed():
    # a -> d, b -> c starts crossed (c, d in name order); one sweep fixes it
    lay = layout(["a", "b", "c", "d"], _edges([("a", "d"), ("b", "c")]))
    assert lay.crossings == 0
    assert (lay.nodes["c"].y < lay.nodes["d"].y) == (lay.nodes["b"].y < lay.nodes["a"].y)


def test_layout_routes_long_edges_through_dummies():
    lay = layout(["a", "b", "c"], _edges([("a", "b"), ("b", "c"), ("a", "c")]))
    long = next(e for e in lay.edges if (e.source, e.target) == ("a", "c"))
    assert len(long.path) == 3 and lay.nodes[long.path[1]].dummy


def test_layout_refuses_a_cycle_and_unknown_nodes():
    with pytest.raises(CycleError, match="cycle"):
        layout(["a", "b"], _edges([("a", "b"), ("b", "a")]))
    with pytest.raises(ValueError, match="not nodes"):
        layout(["a"], _edges([("a", "z")]))


# --------------------------------------------------------------------------- the site vs JSON
@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_site_json_is_the_audit_json(data, built):
    assert json.loads((built / "audit.json").read_text()) == data


def test_every_equation_has_its_page_with_the_json_status(data, built):
    for r in data["equations"]:
        page = parse(built / "eq" / f"{r['id']}.html")
        badge = page.find(id="status")
        assert badge is not None and badge.attrs["data-status"] == r["status"], r["id"]
        assert f"st-{r['status'].replace(' ', '-')}" in badge.attrs["class"], r["id"]
        if r["kind"] != "component":  # a component is a behaviour, stated in words
            assert page.find("math") is not None, r["id"]
        shown = [d.find("summary").text() for d in page.find_all("details", class_="proof")]
        assert len(shown) == len(r["proof"]) + 1, r["id"]  # the derivation, the definition
        for where, site_line in zip([*r["proof"], f"register ({r['where']})"], shown):
            assert where.rsplit(" (", 1)[1].rstrip(")") in site_line, (r["id"], site_line)
        assert "not found" not in page.text(), r["id"]


def test_equation_pages_list_the_json_tests_and_mutants(data, built):
    for r in data["equations"]:
        page = parse(built / "eq" / f"{r['id']}.html")

        def items(ul):
            return [li.text() for li in ul.find_all("li")] if ul else []

        fd = items(page.find("ul", data_group="fd"))
        oracle = items(page.find("ul", data_group="oracle"))
        other = items(page.find("ul", data_group="other"))
        assert fd == r["fd_tests"] and oracle == r["oracle_tests"], r["id"]
        assert sorted(fd + oracle + other) == sorted(r["tests"]), r["id"]
        shown = {d.attrs["data-mutant"] for d in page.find_all("div", data_mutant=True)}
        assert shown == {m["mutant"] for m in r["mutants"]}, r["id"]
        for m in r["mutants"]:
            assert items(page.find("ul", data_killers_of=m["mutant"])) == m["killers"]
            diff = page.find("div", data_mutant=m["mutant"]).find_all("pre", class_="diff")
            assert [d.text() for d in diff] == [f"- {e['old']}\n+ {e['new']}"
                                                for e in m["edits"]], m["mutant"]
        impl_files = [c.find("div", class_="where").text()
                      for c in page.find_all("div", class_="impl")]
        assert len(impl_files) == len(r["implementations"]), r["id"]
        for site_line, impl in zip(impl_files, r["implementations"]):
            assert impl.rsplit(" (", 1)[1].rstrip(")") in site_line


def test_index_lists_every_equation_and_claim_under_each_cited_section(data, built):
    index = parse(built / "index.html")
    seen: dict[tuple[str, str], set[str]] = {}
    for sec in index.find_all("div", class_="section"):
        for li in sec.find_all("li"):
            seen.setdefault((sec.attrs["id"], li.attrs["data-id"]), set()).add(
                li.attrs["data-status"])
    expected = {}
    for r in data["equations"]:
        for s in r["sources"]:
            for doc, key in locate(s):
                expected[(f"sec-{doc}-{key}".replace(".", "-"), r["id"])] = {r["status"]}
    for c in data["claims"]:
        for doc, key in locate(c["source"]):
            expected[(f"sec-{doc}-{key}".replace(".", "-"), c["id"])] = {c["status"]}
    assert seen == expected
    # sections in the documents' order
    order = [sec.attrs["id"] for sec in index.find_all("div", class_="section")]
    assert order == [f"sec-{d.key}-{s.key}".replace(".", "-") for d in DOCUMENTS
                     for s in d.sections]
    assert BY_KEY["minibert"].section("3.3").heading in index.text()


def test_index_counts_and_verdict_match_the_json(data, built):
    index = parse(built / "index.html")
    for box, items in (("equation-counts", data["equations"]), ("claim-counts", data["claims"])):
        shown = {b.attrs["data-status"]: int(b.attrs["data-count"])
                 for b in index.find(id=box).find_all(data_count=True)}
        assert shown == dict(Counter(i["status"] for i in items))
    assert index.find(id="verdict").attrs["data-ok"] == str(data["ok"]).lower()
    prov = index.find(id="provenance").text()
    assert data["provenance"]["commit"] in prov and data["provenance"]["date"] in prov


def test_graph_nodes_are_the_equations_with_their_status(data, built):
    graph = parse(built / "graph.html")
    nodes = {a.attrs["data-id"]: a for a in graph.find_all("a", class_="node")}
    assert set(nodes) == {r["id"] for r in data["equations"]}
    for r in data["equations"]:
        a = nodes[r["id"]]
        assert a.attrs["data-status"] == r["status"]
        assert a.attrs["href"] == f"eq/{r['id']}.html"
        assert (built / a.attrs["href"]).is_file()
    edges = {(p.attrs["data-source"], p.attrs["data-target"])
             for p in graph.find_all("path", class_="uses")}
    assert edges == {(u, r["id"]) for r in data["equations"] for u in r["uses"]}


def test_claims_table_matches_the_json(data, built):
    table = parse(built / "claims.html").find(id="claims")
    rows = {tr.attrs["data-id"]: tr for tr in table.find_all("tr", data_id=True)}
    assert list(rows) == [c["id"] for c in data["claims"]]
    for c in data["claims"]:
        tr = rows[c["id"]]
        assert tr.attrs["data-status"] == c["status"]
        cells = [td.text() for td in tr.find_all("td")]
        assert c["stated"] in cells[2] and c["obtained"] in cells[3], c["id"]


def test_status_colours_come_from_one_table(built):
    css = (built / "assets" / "style.css").read_text()
    for word, st in STATUS.items():
        assert f".st-{slug(word)} {{ background-color: {st.colour}; }}" in css


# --------------------------------------------------------------------------- writing
def test_site_replaces_only_a_report(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not empty"):
        check_output(tmp_path / "notes")
    (tmp_path / "file.html").write_text("x")
    with pytest.raises(ValueError, match="a file"):
        check_output(tmp_path / "file.html")


def test_a_failed_render_leaves_the_previous_site_whole(tmp_path):
    out = tmp_path / "site"
    with Site(out, title="t", provenance=None, nav=[]) as s:
        s.write("index.html", "old")
    with pytest.raises(RuntimeError), Site(out, title="t", provenance=None, nav=[]) as s:
        s.write("index.html", "new")
        raise RuntimeError("interrupted")
    assert (out / "index.html").read_text() == "old" and (out / MARKER).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]  # no staging left
    with Site(out, title="t", provenance=None, nav=[]) as s:
        s.write("index.html", "new")
    assert (out / "index.html").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_plots_of_a_run_directory(data, tmp_path):
    """The plots `minibert train` draws (minibert_reference.train.plots), copied into the site."""
    pytest.importorskip("matplotlib")
    import numpy as np

    from minibert_reference.train.plots import plot_attention, plot_loss_curve
    from minibert_spec.report.blueprint import write_blueprint

    run = tmp_path / "run"
    run.mkdir()
    plot_loss_curve(str(run / "loss_curve.png"),
                    {"step": [1, 2, 3], "loss": [9.0, 8.0, 7.5],
                     "eval_step": [3], "eval_loss": [7.9]}, baseline=8.5)
    plot_attention(str(run / "attention.png"), np.full((1, 1, 1, 3, 3), 1 / 3), ["a", "b", "c"])
    out = tmp_path / "site"
    write_blueprint(data, out, run_dir=run)
    page = parse(out / "plots.html")
    srcs = [img.attrs["src"] for img in page.find_all("img")]
    assert srcs == ["plots/loss_curve.png", "plots/attention.png"]
    assert all((out / s).read_bytes() == (run / Path(s).name).read_bytes() for s in srcs)
    assert parse(out / "index.html").find("a", href="plots.html") is not None
    with pytest.raises(ValueError, match="found neither"):
        write_blueprint(data, tmp_path / "other", run_dir=tmp_path / "site" / "eq")


def test_cli_refuses_a_bad_destination_in_one_line(tmp_path, capsys):
    from minibert_spec.cli import main

    (tmp_path / "mine.txt").write_text("keep")
    assert main(["audit", "--format", "html", "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not empty" in err[0]
    assert (tmp_path / "mine.txt").read_text() == "keep"
    assert main(["audit", "--format", "json", "--run-dir", str(tmp_path)]) == 2
    assert "--run-dir" in capsys.readouterr().err


@pytest.mark.slow  # the slow tier (conftest.py): the audit rebuilt on a broken checkout
def test_a_broken_derivation_turns_its_page_red(tmp_path_factory):
    """A scratch copy of the project with a wrong LayerNorm dx closed form: the audit fails
    (exit 1) and still writes the site, where that equation is a regression on its page, in the
    index and in the graph, and what uses it is flagged as resting on it."""
    proc, out = broken_site(tmp_path_factory.getbasetemp())
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads((out / "audit.json").read_text())
    rows = {r["id"]: r for r in data["equations"]}
    assert rows[BROKEN_ID]["status"] == "regression"
    assert "SymPy gives refuted, recorded proven" in rows[BROKEN_ID]["regressions"][0]
    assert [i for i, r in rows.items() if r["status"] == "regression"] == [BROKEN_ID]
    page = parse(out / "eq" / f"{BROKEN_ID}.html")
    assert page.find(id="status").attrs["data-status"] == "regression"
    assert "SymPy gives refuted" in page.find(id="problems").text()
    assert "N=" in page.find(id="sympy-detail").text()  # the counterexample's numbers
    items = [li for li in parse(out / "index.html").find_all("li", data_id=BROKEN_ID)]
    assert items and all(li.attrs["data-status"] == "regression" for li in items)
    graph = parse(out / "graph.html")
    node = graph.find("a", data_id=BROKEN_ID)
    assert node.attrs["data-status"] == "regression" and "st-regression" in node.attrs["class"]
    flagged = {a.attrs["data-id"] for a in graph.find_all("a", class_="flagged")}
    assert {"embedding_ln.backward", "mlm_head.backward"} <= flagged
    assert BROKEN_ID not in flagged and "layernorm.forward" not in flagged
    assert STATUS["regression"].colour == "#991b1b"  # red, as the browser test sees it


def test_spaced_is_the_closest_ordered_spacing():
    from minibert_spec.report.graph import spaced
    assert spaced([0, 100, 200], 30) == [0, 100, 200]  # already apart: unchanged
    assert spaced([50, 50], 30) == [35, 65]  # pulled apart symmetrically
    ys = spaced([10, 0, 5, 90], 30)
    assert all(b - a >= 30 - 1e-9 for a, b in zip(ys, ys[1:]))
    assert abs(sum(ys[:3]) - 15) < 1e-9  # the pooled block keeps its mean


def test_templates_ship_in_the_wheel():
    """Every template is package data (pyproject's [tool.setuptools.package-data]): the site
    renders from an installed wheel, not only from a checkout."""
    import fnmatch
    import re

    from minibert_spec.report import HERE

    text = (ROOT / "pyproject.toml").read_text()
    block = text.split("[tool.setuptools.package-data]", 1)[1].split("\n[", 1)[0]
    patterns = re.findall(r'"minibert_spec\.report"\s*=\s*\[([^\]]*)\]', block)[0]
    globs = re.findall(r'"([^"]+)"', patterns)
    files = [p.relative_to(HERE).as_posix() for p in (HERE / "templates").iterdir()]
    assert files and all(any(fnmatch.fnmatch(f, g) for g in globs) for f in files), (files, globs)
