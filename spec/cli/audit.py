"""``minibert audit``: the equation x evidence matrix and the claims ledger.

For every equation of the source documents: where it is defined (spec/equations/<prefix>.py:line),
its SymPy verdict (proven / refuted / convention), the implementing functions (file:line), the
test cases that declare it (pytest nodeids, parametrized case included: finite-difference, oracle,
other), and the verdict of the join; then every numeric claim with stated vs obtained values.
Exit 1 on any gap (missing proof, implementation, FD or oracle test, SymPy <-> code check,
pending claim), regression (an outcome that contradicts the recorded verdict) or test collection
error."""

from __future__ import annotations

import json
from pathlib import Path


def register(sub) -> None:
    a = sub.add_parser("audit", help="equations x implementations x tests, and the claims "
                                     "ledger; exit 1 on any gap or regression")
    a.add_argument("--format", choices=["markdown", "json", "html"], default=None,
                   help="also write the report in this format (to --output); html: a static "
                        "site (the blueprint) in a folder, opened from the file system")
    a.add_argument("--output", "-o", type=Path, default=None,
                   help="report path (default: audit.md / audit.json; --format html: the "
                        "folder for the site, required)")
    a.add_argument("--run-dir", type=Path, default=None,
                   help="with --format html: a `minibert train` run directory whose loss curve "
                        "and attention maps the site shows")
    a.add_argument("--impl", default=None, help="implementation as package.module[:object] "
                                                "(default: reference)")
    a.add_argument("--tests", type=Path, default=None,
                   help="tests directory to collect (pytest --collect-only)")
    a.add_argument("--details", action="store_true",
                   help="after the matrix, every equation's definition, implementations and "
                        "all its test cases")
    a.add_argument("--no-measure", action="store_true", help="skip the timing measurements")
    a.set_defaults(func=run)


def _load_impl(spec: str | None):
    """The implementation named by --impl; a bad name is a ValueError saying what to pass."""
    import importlib
    if spec is None:
        return importlib.import_module("minibert_reference")
    module_name, _, attr = spec.partition(":")
    try:
        obj = importlib.import_module(module_name)
        for part in filter(None, attr.split(".")):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, TypeError, ValueError) as e:
        raise ValueError(f"--impl: expected an importable package.module[:object] (e.g. "
                         f"reference or tests.examples.classy_adapter:impl), got {spec!r} "
                         f"({type(e).__name__}: {e})") from None
    return obj


def _short(items: list[str], empty: str = "—") -> str:
    """The first item (a nodeid without its file) and how many more."""
    if not items:
        return empty
    first = items[0].split("::", 1)[-1] if "::" in items[0] else items[0]
    return first + (f" (+{len(items) - 1})" if len(items) > 1 else "")


def _site(impl: str) -> str:
    """'module.fn (file:line)' -> 'file:line'."""
    return impl.rsplit(" (", 1)[-1].rstrip(")")


def _other_tests(r) -> list[str]:
    """Tagged test cases that are neither FD nor oracle evidence."""
    evidence = set(r.fd_tests) | set(r.oracle_tests)
    return [t for t in r.tests if t not in evidence]


def _mutants(r, sep: str) -> str:
    """Each catalog mutant of the equation and how many of its tagged tests kill it."""
    if not r.mutants:
        return r.mutation or "—"
    return sep.join(f"{m['mutant']}: {len(m['killers'])} killing tests"
                    + ("" if m["fresh"] else " (stale)") for m in r.mutants)


def markdown(report, prov: dict | None = None) -> str:
    from minibert_spec.cli._provenance import provenance_line

    c = report.counts()
    lines = ["# minibert audit", "", f"_Generated {provenance_line(prov)}_\n",
             f"{'OK' if report.ok else 'FAIL'}: {c['equations']} equations, "
             f"{len(report.claims)} claims, {c['gaps']} gaps, {c['regressions']} regressions, "
             f"{report.seconds:.1f} s", "", "## Equations", "",
             "| ID | defined | source | SymPy | implementation | FD tests | oracle tests | "
             "other tests | mutants (killed by the tagged tests) | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report.rows:
        lines.append(
            f"| `{r.id}` | {r.where or '—'} | {'; '.join(r.sources)} | {r.sympy} | "
            f"{'<br>'.join(r.implementations) or '—'} | "
            f"{'<br>'.join(r.fd_tests) or ('—' if r.fd_needed else 'n/a')} | "
            f"{'<br>'.join(r.oracle_tests) or ('—' if r.oracle_needed else 'n/a')} | "
            f"{'<br>'.join(_other_tests(r)) or '—'} | {_mutants(r, '<br>')} | {r.verdict} |")
    details = [r for r in report.rows if r.detail and r.sympy in ("refuted", "convention")]
    if details:
        lines += ["", "### Refutations and conventions", ""]
        lines += [f"- `{r.id}` ({r.sympy}): {r.detail}" for r in details]
    lines += ["", "## Claims ledger", "",
              "| ID | claim | source | stated | obtained | verdict | detail |",
              "|---|---|---|---|---|---|---|"]
    for o in report.claims:
        lines.append(f"| `{o.id}` | {o.claim} | {o.source} | {o.stated} | {o.obtained} | "
                     f"{o.verdict} | {o.detail} {('PENDING: ' + o.pending) if o.pending else ''} |")
    for title, items in (("Gaps", report.gaps), ("Regressions", report.regressions)):
        if items:
            lines += ["", f"## {title}", ""] + [f"- {g}" for g in items]
    return "\n".join(lines) + "\n"


def print_tables(report, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    style = {"proven": "green", "refuted": "yellow", "convention": "cyan", "verified": "green",
             "confirmed": "green", "not reproducible": "magenta", "gap": "red",
             "REGRESSION": "bold red"}
    t = Table(title="Equations x evidence (where: spec definition, then implementation; tests: "
                    "first case and how many more -- all of them with --details or --format)",
              show_lines=False)
    for col in ("ID", "source", "SymPy", "where", "FD test", "oracle test", "mutants killed",
                "verdict"):
        t.add_column(col, overflow="fold", no_wrap=col == "where")
    for r in report.rows:
        verdict = r.verdict
        colour = style.get(verdict.split(" ")[0], "white")
        where = "\n".join([r.where or "—", _short([_site(i) for i in r.implementations])])
        t.add_row(escape(r.id), escape(_short(r.sources)),
                  f"[{style.get(r.sympy, 'red')}]{r.sympy}[/]", escape(where),
                  escape(_short(r.fd_tests, "—" if r.fd_needed else "n/a")),
                  escape(_short(r.oracle_tests, "—" if r.oracle_needed else "n/a")),
                  escape(r.mutation.split(" tagged")[0] if r.mutation else "—"),
                  f"[{colour}]{escape(verdict)}[/]", end_section=True)
    console.print(t)
    lt = Table(title="Claims ledger")
    for col in ("ID", "source", "stated", "obtained", "verdict"):
        lt.add_column(col, overflow="fold")
    for o in report.claims:
        v = o.verdict + (" (pending)" if o.pending else "") + (" !" if o.regression else "")
        lt.add_row(escape(o.id), escape(o.source), escape(str(o.stated)),
                   escape(str(o.obtained)), f"[{style.get(o.verdict, 'white')}]{escape(v)}[/]")
    console.print(lt)


def print_details(report, console) -> None:
    """Per equation: definition, implementations, every test case (FD / oracle / other)."""
    for r in report.rows:
        console.print(f"[bold]{r.id}[/]  {r.verdict}", highlight=False)
        lines = [f"defined      {r.where or '—'}"]
        lines += [f"implemented  {i}" for i in r.implementations] or ["implemented  —"]
        for label, items in (("fd", r.fd_tests), ("oracle", r.oracle_tests),
                             ("other", _other_tests(r))):
            lines += [f"{label + ' test':<12} {t}" for t in items]
        for m in r.mutants:
            lines.append(f"{'mutant':<12} {m['mutant']} ({m['status']}"
                         f"{'' if m['fresh'] else ', stale'}): killed by "
                         + (", ".join(m["killers"]) or "no tagged test"))
        for line in lines:
            console.print(f"  {line}", markup=False, highlight=False)


def report_data(report, prov: dict) -> dict:
    """The report as the JSON output holds it (one source for --format json and html)."""
    return json.loads(json.dumps({"provenance": prov, **report.to_json()}, default=str))


def run(args) -> int:
    from rich.console import Console

    from minibert_spec.audit import ROOT, run_audit
    from minibert_spec.cli._provenance import provenance, provenance_line
    from minibert_spec.evidence import CollectionError

    console = Console()
    if not console.is_terminal:  # CI logs: wide enough for the matrix
        console = Console(width=180)
    if args.format == "html" and args.output is None:  # refuse before the audit's work
        raise ValueError("--format html: expected -o DIR, the folder to write the site into")
    out = args.output or Path(f"audit.{'md' if args.format == 'markdown' else 'json'}")
    if args.run_dir is not None and args.format != "html":
        raise ValueError("--run-dir: only --format html shows a run's plots")
    if args.format == "html":  # refuse a bad destination before the audit's work
        from minibert_spec.report import check_output, require
        require()
        check_output(out)
    if args.tests is None:
        from minibert_spec.paths import need_checkout

        need_checkout("minibert audit (without --tests DIR)")  # the tests are the evidence
    impl = _load_impl(args.impl)
    prov = provenance()
    console.print(provenance_line(prov), markup=False, highlight=False)
    try:
        report = run_audit(impl, impl_spec=args.impl, tests_dir=args.tests or ROOT / "tests",
                           measure=not args.no_measure)
    except CollectionError as e:
        console.print("[bold red]audit failed: the tests could not be collected, so no test "
                      "evidence can be joined[/]")
        console.print(str(e), markup=False, highlight=False)
        return 1
    print_tables(report, console)
    if args.details:
        print_details(report, console)
    c = report.counts()
    console.print(f"SymPy: {c['sympy']}")
    console.print(f"claims: {c['claims']}")
    console.print(f"tests: {report.tests_collected} collected, {report.tests_tagged} tagged with "
                  "equation IDs")
    for title, items, colour in (("gaps", report.gaps, "red"),
                                 ("regressions", report.regressions, "bold red")):
        if items:
            console.print(f"[{colour}]{len(items)} {title}:[/]")
            for g in items:
                console.print(f"  - {g}", markup=False, highlight=False)
    if args.format == "html":
        from minibert_spec.report.blueprint import write_blueprint
        # the JSON report's own data: the site shows what audit.json says
        stats = write_blueprint(report_data(report, prov), out, run_dir=args.run_dir)
        console.print(f"blueprint written to {out}/index.html ({stats.files} files, "
                      f"{stats.bytes / 1e6:.2f} MB, {stats.seconds:.1f} s)")
    elif args.format:
        out.parent.mkdir(parents=True, exist_ok=True)
        text = markdown(report, prov) if args.format == "markdown" else json.dumps(
            report_data(report, prov), indent=2)
        out.write_text(text, encoding="utf-8")
        console.print(f"report written to {out}")
    console.print(("[green]audit passed[/]" if report.ok else "[red]audit failed[/]")
                  + f" in {report.seconds:.1f} s")
    return 0 if report.ok else 1
