"""``minibert report merge a.json b.json ... -o DIR [--format html]``: the one report of a run
split into shards.

The shards of ``minibert check M --shard k/N -o kN.json`` give ``DIR/report.json`` -- the
report, and the exit status, that the unsharded ``minibert check M`` gives (every check's
result in the run's order; the grid, the verdicts and the exit status recomputed from them) --,
``DIR/durations.json`` (each check's seconds: ``--durations`` of the next sharded run) and,
with ``--format html``, the page ``minibert check --format html`` draws, in ``DIR``.  The
records of ``minibert mutate --matrix --shard k/N --json kN.json`` give
``DIR/mutation_matrix.json`` (the recorded matrix's format: copy it over
``spec/results/mutation_matrix.json``), ``DIR/mutation_matrix.md`` and ``DIR/durations.json``;
the exit status is the unsharded matrix run's.

Refused, exit 2 with one line naming the shards: files that are not shard records, shards of
another implementation (name or source), suite version, libraries or settings, another
selection or durations, a shard missing or given twice (minibert_spec.suite.shard.verify_shards).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from minibert_spec.suite.report import EXIT_NOT_RUN


def register(sub) -> None:
    g = sub.add_parser("report", help="work with saved reports: merge the shards of one run")
    rs = g.add_subparsers(dest="report_command", required=True)
    m = rs.add_parser("merge", help="the one report (and exit status) of the shards of a run "
                                    "(minibert check --shard / minibert mutate --matrix "
                                    "--shard)")
    m.add_argument("shards", nargs="+", metavar="SHARD.json",
                   help="the shards' JSON reports (every shard of the run, once each)")
    m.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="the folder to write the merged report into")
    m.add_argument("--format", choices=("json", "html"), default="json",
                   help="json (default): report.json and durations.json; html: also the "
                        "check report's page (index.html)")
    m.set_defaults(func=merge)
    d = rs.add_parser("durations", help="the seconds each check (or mutant) took, from "
                                        "reports: the --durations file of a sharded run")
    d.add_argument("reports", nargs="+", metavar="REPORT.json",
                   help="check reports, merged reports or matrices (a later one wins)")
    d.add_argument("-o", "--output", required=True, metavar="FILE")
    d.set_defaults(func=durations)


def _fail(msg: str) -> int:
    print(f"minibert report: {msg}", file=sys.stderr)
    return EXIT_NOT_RUN


def merge(args) -> int:
    from minibert_spec.suite.shard import read_shards

    out = Path(args.output)
    if out.exists() and not out.is_dir():
        return _fail(f"-o {out}: expected a folder, got a file")
    try:
        records = read_shards(args.shards)
    except ValueError as e:
        return _fail(str(e))
    schemas = {rec.get("schema") if isinstance(rec, dict) else None for _, rec in records}
    from minibert_spec.mutation import MATRIX_SCHEMA

    if schemas == {MATRIX_SCHEMA}:
        return _merge_matrix(args, records, out)
    return _merge_checks(args, records, out)


def durations(args) -> int:
    """``minibert report durations REPORT.json ... -o FILE``: ``{id: seconds}``, sorted."""
    from minibert_reference.train.fileio import atomic_write
    from minibert_spec.suite.shard import read_durations

    found: dict[str, float] = {}
    try:
        for path in args.reports:
            found.update(read_durations(path, "minibert report durations"))
    except ValueError as e:
        return _fail(str(e))
    atomic_write(args.output, json.dumps(found, indent=1, sort_keys=True) + "\n")
    print(f"{len(found)} durations written to {args.output}", file=sys.stderr)
    return 0


def _merge_checks(args, records, out: Path) -> int:
    from minibert_reference.train.fileio import atomic_write
    from minibert_spec.cli._output import html_refused
    from minibert_spec.cli.check import _print_table
    from minibert_spec.suite.shard import merge_check_reports

    refused = html_refused(str(out)) if args.format == "html" else None
    if refused:
        return _fail(refused)
    try:
        report = merge_check_reports(records)
    except ValueError as e:
        return _fail(str(e))
    data = report.to_json()
    out.mkdir(parents=True, exist_ok=True)
    if report.load_error is not None:
        atomic_write(str(out / "report.json"), json.dumps(data, indent=1) + "\n")
        print(f"minibert check {report.impl}: could not run: {report.load_error}",
              file=sys.stderr)
        return report.exit_code()
    if args.format == "html":
        from minibert_spec.report.check import write_check_site

        write_check_site(json.loads(json.dumps(data)), out)
    atomic_write(str(out / "report.json"), json.dumps(data, indent=1) + "\n")
    atomic_write(str(out / "durations.json"), json.dumps(
        {r.id: r.seconds for r in report.results}, indent=1, sort_keys=True) + "\n")
    _print_table(report, data)
    print(f"merged {len(records)} shards into {out / 'report.json'}"
          + (f" and {out / 'index.html'}" if args.format == "html" else ""), file=sys.stderr)
    return report.exit_code()


def _merge_matrix(args, records, out: Path) -> int:
    from rich.console import Console

    from minibert_reference.train.fileio import atomic_write
    from minibert_spec.evidence import write_matrix
    from minibert_spec.mutation import (
        MATRIX_NOTE,
        matrix_exit_code,
        merge_matrix_records,
        print_matrix,
        write_markdown,
    )

    if args.format == "html":
        return _fail("--format html: the mutation matrix merges as JSON and markdown; "
                     "drop --format html")
    try:
        rows, settings = merge_matrix_records(records)
    except ValueError as e:
        return _fail(str(e))
    from dataclasses import asdict

    out.mkdir(parents=True, exist_ok=True)
    write_matrix({r.mutant: asdict(r) for r in rows}, out / "mutation_matrix.json",
                 profile=settings.get("profile"), note=MATRIX_NOTE)
    write_markdown(out / "mutation_matrix.md", rows)
    atomic_write(str(out / "durations.json"), json.dumps(
        {r.mutant: r.seconds for r in rows}, indent=1, sort_keys=True) + "\n")
    console = Console(width=None if sys.stdout.isatty() else 160)
    print_matrix(console, rows, f"mutation matrix: {len(rows)} mutants, profile "
                                f"{settings.get('profile')} (merged from {len(records)} shards)")
    print(f"merged {len(records)} shards into {out / 'mutation_matrix.json'}", file=sys.stderr)
    return matrix_exit_code(rows)
