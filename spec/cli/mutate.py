"""``minibert mutate``: the test suite against every mutant of the catalog (spec/mutants.py),
applied in memory through conformance mode; reports killed / survived per mutant with the first
test that killed it, and the mutation score.  Exit 1 when a mutant survives (a hole in the
suite) or the unmutated baseline fails."""

from __future__ import annotations

import sys
import time


def register(sub) -> None:
    g = sub.add_parser("mutate", help="mutation testing: the suite against each catalog mutant")
    g.add_argument("mutants", nargs="*", help="catalog names (default: the whole catalog)")
    g.add_argument("--fast", action="store_true", help="the small subset CI runs")
    g.add_argument("--list", action="store_true", help="print the catalog and exit")
    g.add_argument("--jobs", "-j", type=int, default=2,
                   help="mutants run in parallel (default: 2)")
    g.add_argument("--profile", default="ci",
                   help="Hypothesis profile (MINIBERT_PROFILE; default: ci)")
    g.add_argument("--tests", nargs="+", default=["tests/suite/test_conformance.py", "tests"],
                   help="pytest paths, relative to the repository root, in the order to run "
                        "(default: the per-op conformance checks first, as they kill most "
                        "mutants in seconds, then the rest of tests/)")
    g.add_argument("--timeout", type=float, default=600,
                   help="seconds per mutant (default: 600)")
    g.add_argument("--no-baseline", action="store_true",
                   help="skip the unmutated run that must pass first")
    g.add_argument("--matrix", action="store_true",
                   help="per mutant, only the tests tagged with its equation, no -x: record "
                        "every killing test in spec/results/mutation_matrix.json (the audit "
                        "reads it; only stale rows rerun)")
    g.add_argument("--rerun", action="store_true", help="with --matrix: rerun every row")
    g.add_argument("-o", "--output", help="with --matrix: also write the mutant x test file "
                                          "table as markdown here")
    g.add_argument("--matrix-file", metavar="FILE",
                   help="with --matrix: the recorded matrix to read and update (default "
                        "spec/results/mutation_matrix.json)")
    g.add_argument("--shard", metavar="K/N",
                   help="with --matrix: only shard K of N of the mutants (deterministic, "
                        "balanced by the seconds each row took); requires --json")
    g.add_argument("--durations", metavar="FILE",
                   help="with --shard: the seconds per mutant (a matrix or an {name: "
                        "seconds} file; default: the recorded matrix's)")
    g.add_argument("--json", metavar="FILE",
                   help="with --matrix: write this run's rows and settings as JSON "
                        "(`minibert report merge` joins the shards' records)")
    g.set_defaults(func=run)


def run(args) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from minibert_spec.cli._provenance import provenance_line
    from minibert_spec.mutants import CATALOG, applicability
    from minibert_spec.mutation import run_mutants, run_suite, score, select, xdist_args
    from minibert_spec.paths import need_checkout

    if not args.list:
        need_checkout("minibert mutate")  # it runs the project's own tests against each mutant

    # a wide table in logs and CI (rich assumes 80 columns when stdout is not a terminal)
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(provenance_line(), markup=False, highlight=False)
    if args.list:
        table = Table(title=f"mutant catalog ({len(CATALOG)})")
        for col in ("mutant", "equation", "fast", "applies", "bug"):
            table.add_column(col)
        for m in CATALOG.values():
            reason = applicability(m)
            table.add_row(m.name, m.equation, "yes" if m.fast else "",
                          "yes" if reason is None else escape(f"no: {reason}"),
                          escape(m.description))
        console.print(table)
        return 0
    if not args.matrix and (args.shard or args.json or args.matrix_file or args.durations):
        console.print("[red]--shard, --durations, --json and --matrix-file apply to --matrix "
                      "only[/]")
        return 2
    try:
        if args.matrix:
            from minibert_spec.mutation import matrix_command

            return matrix_command(args, console, matrix_settings(args))
        names = select(args.mutants, fast=args.fast)
    except ValueError as e:
        console.print(f"[red]{escape(str(e))}[/]")
        return 2
    console.print(f"{len(names)} mutants to run, {args.jobs} at a time; each line below is one "
                  f"finished (the baseline comes first and takes the longest)")
    start = time.perf_counter()
    if not args.no_baseline:
        console.print(f"baseline: the unmutated suite ({' '.join(args.tests)}) must pass ...")
        base = run_suite("", args.tests, profile=args.profile, timeout=args.timeout,
                         extra_args=xdist_args(args.jobs))
        if base.status != "survived":
            console.print(f"[red]baseline fails ({base.status}): "
                          f"{escape(base.killer + ' ' + base.message)}; "
                          "fix the suite before measuring it[/]")
            return 1
        console.print(f"baseline ok in {base.seconds:.1f} s")

    done = []

    def progress(r):  # a count against the total and an ETA from the mean so far
        done.append(r.seconds)
        left = len(names) - len(done)
        eta = left * (time.perf_counter() - t_mut) / len(done)
        console.print(escape(f"  [{len(done)}/{len(names)}] {r.name}: {r.status} {r.killer} "
                             f"({r.seconds:.1f} s; about {eta:.0f} s left)"))

    t_mut = time.perf_counter()

    results = run_mutants(names, args.tests, jobs=args.jobs, profile=args.profile,
                          timeout=args.timeout, on_result=progress)
    elapsed = time.perf_counter() - start
    table = Table(title=f"mutation testing: {len(names)} mutants, profile {args.profile}, "
                        f"{args.jobs} in parallel ({elapsed:.0f} s)")
    for col in ("mutant", "equation", "status", "killed by (first failing test)", "s"):
        table.add_column(col, justify="right" if col == "s" else "left")
    colour = {"killed": "green", "timeout": "yellow", "survived": "red", "error": "red",
              "n/a": "dim"}
    for r in results:
        detail = r.killer or r.message
        table.add_row(r.name, CATALOG[r.name].equation,
                      f"[{colour[r.status]}]{r.status}[/]", escape(detail), f"{r.seconds:.1f}")
    console.print(table)
    detected, applicable = score(results)
    na = sum(r.status == "n/a" for r in results)
    pct = 100.0 * detected / applicable if applicable else 100.0
    console.print(f"mutation score: {detected}/{applicable} = {pct:.1f}% "
                  f"({na} not applicable yet) in {elapsed:.0f} s")
    survivors = [r.name for r in results if r.status in ("survived", "error")]
    if survivors:
        console.print(f"[red]not killed: {', '.join(survivors)}[/]")
        return 1
    return 0


def matrix_settings(args) -> dict:
    """What decides a matrix row besides its fingerprint -- the profile, the per-mutant time
    limit, the project's commit and libraries: what the shards of one matrix run share."""
    import platform

    from minibert_spec.cli._provenance import git_commit, package_versions

    return {"profile": args.profile, "timeout": args.timeout, "commit": git_commit(),
            "python": platform.python_version(), "packages": package_versions()}
