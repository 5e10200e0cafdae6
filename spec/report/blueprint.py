"""The audit as a browsable blueprint: ``minibert audit --format html -o DIR``.

Rendered from the audit's JSON data alone (``{"provenance": ..., **AuditReport.to_json()}``, the
very dict ``--format json`` writes, copied into the site as ``audit.json``), so the HTML and
the JSON cannot disagree; what the renderer adds is presentation: the documents' sections
(``minibert_spec.documents``), the statements as MathML (latex2mathml), the implementing functions'
source lines (read at the file:line the JSON names, highlighted with Pygments) and the
dependency graph drawn from the ``uses`` the JSON carries.

Pages: ``index.html`` (the documents, section by section), ``eq/<ID>.html`` (one per
equation), ``graph.html``, ``claims.html``, ``plots.html`` (with a run directory).
"""

from __future__ import annotations

import ast
import json
import textwrap
import time
from collections import Counter
from pathlib import Path

from minibert_spec.documents import BY_KEY, DOCUMENTS, UnknownSource, locate
from minibert_spec.paths import HOME
from minibert_spec.report import AUDIT_STATUSES, RED, Site, Stats
from minibert_spec.report.graph import layout, svg

ROOT = HOME
PLOTS = (("loss_curve.png", "Training and held-out loss"),
         ("attention.png", "Attention maps, one panel per layer and head"))
STATUS_ORDER = list(AUDIT_STATUSES)


def page_of(eq_id: str) -> str:
    """The site-relative path of an equation's page."""
    return f"eq/{eq_id}.html"


def _ordered(counter: Counter) -> dict[str, int]:
    return {w: counter[w] for w in STATUS_ORDER if counter[w]}


def _anchor(doc: str, sec: str) -> str:
    return f"sec-{doc}-{sec}".replace(".", "-")


def _cited(source: str) -> list[dict]:
    """A citation -> [{anchor, text}] for links to the index's sections; a citation the
    documents table cannot place keeps its text and links to the top."""
    try:
        places = locate(source)
    except UnknownSource:
        return [{"anchor": "", "text": source}]
    out = []
    for doc, sec in places:
        d = BY_KEY[doc]
        out.append({"anchor": _anchor(doc, sec), "text": f"{d.name}, {d.section(sec).heading}"})
    return out


# --------------------------------------------------------------------------- code
def split_site(impl: str) -> tuple[str, str, int]:
    """'module.fn (file:line)' (the audit's implementation entries) -> (name, file, line)."""
    name, _, where = impl.rpartition(" (")
    file, _, line = where.rstrip(")").rpartition(":")
    return name, file, int(line) if line.isdigit() else 0


def function_source(path: Path, line: int) -> tuple[int, str] | None:
    """The source of the function or class defined at ``line`` (its ``def``/``class`` line or
    one of its decorators' lines) in ``path``, else of the outermost statement that starts at
    ``line`` (an equation's ``register(...)`` call): (first line, dedented text), or None."""
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    lines = text.splitlines()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if line in (first, node.lineno):
                return first, textwrap.dedent("\n".join(lines[first - 1:node.end_lineno]))
    for node in ast.walk(tree):  # breadth first: the outermost statement
        if isinstance(node, ast.stmt) and node.lineno == line:
            return line, textwrap.dedent("\n".join(lines[line - 1:node.end_lineno]))
    return None


def highlighted(impl: str, cache: dict) -> dict:
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer

    name, file, line = split_site(impl)
    path = Path(file) if Path(file).is_absolute() else ROOT / file
    if (path, line) not in cache:
        found = function_source(path, line)
        if found is None:
            cache[path, line] = f"source not found at {file}:{line}"
        else:
            start, code = found
            cache[path, line] = _markup(highlight(code, PythonLexer(), HtmlFormatter(
                linenos="inline", linenostart=start, cssclass="highlight")))
    return {"name": name, "file": file, "line": line, "html": cache[path, line]}


# --------------------------------------------------------------------------- pages
def _graph(rows: dict[str, dict]) -> dict:
    """The dependency graph: nodes = equations, edges = uses, plus document variant ->
    target (dashed); nodes resting on a red equation are flagged."""
    edges = [(u, i, "uses") for i, r in rows.items() for u in r.get("uses", []) if u in rows]
    edges += [(r["target"], i, "target") for i, r in rows.items()
              if r["kind"] == "document" and r.get("target") in rows]
    lay = layout(rows, edges)
    preds: dict[str, set[str]] = {i: set() for i in rows}
    for s, t, kind in edges:
        if kind == "uses":
            preds[t].add(s)
    red = {i for i, r in rows.items() if r["status"] in RED}

    def rests_on_red(i, seen=None):
        seen = set() if seen is None else seen
        for p in preds[i] - seen:
            seen.add(p)
            if p in red or rests_on_red(p, seen):
                return True
        return False

    flagged = [i for i in rows if rests_on_red(i)]
    picture = svg(lay, href={i: page_of(i) for i in rows},
                  status={i: r["status"] for i, r in rows.items()},
                  title={i: f"{i} — {r['title']} — {r['status']}" for i, r in rows.items()},
                  flagged=flagged)
    return {"svg": _markup(picture), "n_nodes": len(rows), "crossings": lay.crossings,
            "n_uses": sum(1 for e in edges if e[2] == "uses"),
            "n_targets": sum(1 for e in edges if e[2] == "target")}


def _equation_context(r: dict, rows: dict, used_by: dict, variants: dict, cache: dict) -> dict:
    def ref(i):
        return {"id": i, "href": page_of(i).removeprefix("eq/"),
                "status": rows[i]["status"] if i in rows else "gap"}

    from latex2mathml.converter import convert

    fd, oracle = set(r["fd_tests"]), set(r["oracle_tests"])
    other = [t for t in r["tests"] if t not in fd and t not in oracle]
    return {
        **r,
        "mathml": _markup(convert(r["latex"], display="block")) if r.get("latex") else "",
        "cited": [c for s in r["sources"] for c in _cited(s)],
        "uses": [ref(i) for i in r.get("uses", [])],
        "used_by": [ref(i) for i in used_by.get(r["id"], [])],
        "variants": [ref(i) for i in variants.get(r["id"], [])],
        "target_href": page_of(r["target"]).removeprefix("eq/") if r.get("target") else "",
        "sympy_status": {"proven": "proven", "refuted": "refuted",
                         "convention": "convention"}.get(r["sympy"], "gap")
        if not r["regressions"] else "regression",
        "impls": [highlighted(i, cache) for i in r["implementations"]],
        "proof_code": [("Derivation", highlighted(p, cache)) for p in r.get("proof", [])]
        + ([("Definition", highlighted(f"register(...) ({r['where']})", cache))]
           if r.get("where") else []),
        "test_groups": [("fd", "Finite-difference tests", r["fd_tests"], r["fd_needed"]),
                        ("oracle", "PyTorch oracle tests", r["oracle_tests"],
                         r["oracle_needed"]),
                        ("other", "Other tests", other, False)],
    }


def _markup(s: str):
    from markupsafe import Markup
    return Markup(s)


def _index_documents(rows: dict, claims: list[dict]) -> list[dict]:
    by_place: dict[tuple[str, str], dict[str, list]] = {}
    for r in rows.values():
        for s in r["sources"]:
            try:
                places = locate(s)
            except UnknownSource:
                continue
            for p in places:
                eqs = by_place.setdefault(p, {"equations": [], "claims": []})["equations"]
                if r not in eqs:
                    eqs.append(r)
    for c in claims:
        try:
            places = locate(c["source"])
        except UnknownSource:
            continue
        for p in places:
            by_place.setdefault(p, {"equations": [], "claims": []})["claims"].append(c)
    docs = []
    for d in DOCUMENTS:
        sections = []
        for s in d.sections:
            items = by_place.get((d.key, s.key), {"equations": [], "claims": []})
            eqs = [{**e, "href": page_of(e["id"])} for e in items["equations"]]
            counts = Counter(e["status"] for e in eqs) + Counter(c["status"]
                                                                 for c in items["claims"])
            sections.append({"key": s.key, "heading": s.heading, "anchor": _anchor(d.key, s.key),
                             "equations": eqs, "claims": items["claims"],
                             "counts": _ordered(counts)})
        docs.append({"key": d.key, "name": d.name, "what": d.what, "source": d.source,
                     "sections": sections})
    return docs


def _claims_context(claims: list[dict], prov: dict) -> list[dict]:
    out = []
    for c in claims:
        how = (f"measured on {prov.get('machine', 'this machine')}" if c["machine_dependent"]
               else "computed (closed form, allocation or a run of the reference)")
        out.append({**c, "how": how, "cited": _cited(c["source"])})
    return out


def _plots(run_dir: Path) -> tuple[list[tuple[Path, str, str]], str]:
    """The plots the training run drew (and a one-line history summary)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"--run-dir {run_dir}: expected a training run directory, got no "
                         "such folder")
    found = [(run_dir / f, f"plots/{f}", title) for f, title in PLOTS if (run_dir / f).is_file()]
    if not found:
        raise ValueError(f"--run-dir {run_dir}: expected {' or '.join(f for f, _ in PLOTS)} "
                         "in it (written by `minibert train`), found neither")
    summary = ""
    hist = run_dir / "history.json"
    try:
        h = json.loads(hist.read_text(encoding="utf-8"))
        steps = h.get("step") or h.get("steps") or []
        train = h.get("train_loss") or h.get("loss") or []
        if train:
            summary = f"{len(train)} logged points, last train loss {train[-1]:.4g}"
            if steps:
                summary += f" at step {steps[-1]}"
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    return found, summary


def write_blueprint(data: dict, out: Path, *, run_dir: Path | None = None) -> Stats:
    """Write the blueprint site for the audit JSON ``data`` into ``out`` (atomically)."""
    start = time.perf_counter()
    prov = data.get("provenance") or {}
    rows = {r["id"]: r for r in data["equations"]}
    claims = data["claims"]
    plots, history = _plots(run_dir) if run_dir is not None else ([], "")
    used_by: dict[str, list[str]] = {}
    variants: dict[str, list[str]] = {}
    for i, r in rows.items():
        for u in r.get("uses", []):
            used_by.setdefault(u, []).append(i)
        if r["kind"] == "document" and r.get("target"):
            variants.setdefault(r["target"], []).append(i)
    equation_status = _ordered(Counter(r["status"] for r in rows.values()))
    claim_status = _ordered(Counter(c["status"] for c in claims))
    nav = [("Documents", "index.html"), ("Dependency graph", "graph.html"),
           ("Claims ledger", "claims.html")] + ([("Training plots", "plots.html")]
                                                if plots else [])
    cache: dict = {}
    with Site(out, title="minibert blueprint", provenance=prov, nav=nav) as site:
        from pygments.formatters import HtmlFormatter
        site.write("assets/code.css", HtmlFormatter(cssclass="highlight").get_style_defs())
        site.write("audit.json", json.dumps(data, indent=2, default=str))
        site.render("index.html", "index.html", documents=_index_documents(rows, claims),
                    ok=data["ok"], counts=data["counts"], n_claims=len(claims),
                    seconds=data.get("seconds", 0.0), equation_status=equation_status,
                    claim_status=claim_status, plots=bool(plots),
                    problems=data["regressions"] + data["gaps"])
        site.render("graph.html", "graph.html", equation_status=equation_status,
                    **_graph(rows))
        site.render("claims.html", "claims.html", claims=_claims_context(claims, prov),
                    claim_status=claim_status)
        for r in rows.values():
            site.render("equation.html", page_of(r["id"]),
                        e=_equation_context(r, rows, used_by, variants, cache))
        if plots:
            for src, dest, _ in plots:
                site.write(dest, Path(src).read_bytes())
            site.render("plots.html", "plots.html", run_dir=str(run_dir), history=history,
                        plots=[{"src": dest, "title": title} for _, dest, title in plots])
        files = list(site.files)
    size = sum((Path(out) / f).stat().st_size for f in files)
    return Stats(len(files), size, time.perf_counter() - start)
