"""``minibert check package.module[:object]``: the shipped judging suite (minibert_spec.suite) on
any implementation, as a per-op table: forward and backward vs the PyTorch oracle, backward vs
finite differences, vs SymPy, invariants, and with ``--bad-input`` the named-error checks.

Every check runs in a worker process (minibert_spec.suite.pool) under a time limit; ``--format
json`` writes the report (per op, per column: status, reason, check ids) for CI; ``--format html -o
DIR`` renders that same JSON as a page (minibert_spec.report.check): the grid, each red cell linking
to its failures.  The format never changes the exit status.

Exit status: 0 every op the implementation provides conforms; 1 a check failed (an op raised,
ran past its time limit, or disagreed; an ``--xfail`` check passed); 2 it could not be checked:
it does not load (its import, run first in a child process, raises, exits, crashes or hangs),
provides nothing, an ``--xfail`` id names no check, the oracle is required but torch is not
installed (``--oracle off`` to run without it, said in the report), a check could not run, or
the run passed its time limit, or a row is not judged (its backward met no finite differences,
or its forward neither the oracle nor an identity; ``--thin OP=REASON`` names a row knowingly
so).  Every reason is one line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from minibert_spec.cli._output import _fail, _write, databases_refused, emit, html_refused

DEFAULT_WORKERS = 2


def register(sub) -> None:
    from minibert_spec.suite.pool import DEFAULT_TOTAL_TIMEOUT
    from minibert_spec.suite.run import DEFAULT_TIMEOUT, ORACLE_MODES, TIERS

    g = sub.add_parser("check", help="run the judging suite on an implementation "
                                     "(package.module[:object]): a per-op verdict",
                       description="Three tiers, said in the report's header and JSON "
                                   "(\"depth\"): standard (the default: each check's "
                                   "fixed-seed examples + "
                                   f"{TIERS['standard']} drawn, the whole model at tiny "
                                   "configurations), --deep (fixed-seed + "
                                   f"{TIERS['deep']} drawn, and the whole model at the "
                                   "mini_bert preset's size), --quick (the fixed-seed examples "
                                   "alone).")
    g.add_argument("impl", nargs="?", help="the implementation, as package.module[:object]")
    g.add_argument("--ops", nargs="+", help="only the checks of these ops (default: all)")
    g.add_argument("--model", action="store_true",
                   help="the whole-model verdict alone, for any architecture: impl is your "
                        "loss_and_grads(params, ids, ...) -> (loss, grads) (package.module:"
                        "function; the params: that module's params or init_params()) or a "
                        "minibert_spec.suite.whole_model(...) declaration; or op rows without "
                        "a model (package.module[:object]): judged as a tiny model composed of "
                        "them (embedding -> blocks -> final norm -> linear head -> "
                        "cross-entropy), the reference's rows standing in for the ones it "
                        "lacks, in the form its CAPABILITIES declare; the verdict names the "
                        "rows used; a decoder row: its own decoder_loss_and_grads, in the first "
                        "decoder form it declares.  No usable row: exit 2")
    g.add_argument("--kinds", nargs="+", help="only these kinds of check: fd, oracle, "
                                              "oracle.forward, oracle.backward, sympy, "
                                              "invariant, bad_input")
    g.add_argument("-k", "--match", help="only checks whose id matches this regular expression")
    g.add_argument("--oracle", choices=ORACLE_MODES, default="require",
                   help="require (default): the PyTorch oracle runs, and a missing torch is "
                        "exit 2; off: no oracle, said in the report")
    g.add_argument("--bad-input", action="store_true",
                   help="also run the bad-input checks (ValueError naming the argument)")
    g.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help=f"seconds per check before it fails (default {DEFAULT_TIMEOUT:g})")
    g.add_argument("--total-timeout", type=float, default=DEFAULT_TOTAL_TIMEOUT,
                   help=f"seconds for the whole run (default {DEFAULT_TOTAL_TIMEOUT:g})")
    g.add_argument("-j", "--workers", type=int, default=DEFAULT_WORKERS,
                   help=f"worker processes (default {DEFAULT_WORKERS})")
    g.add_argument("--max-examples", type=int,
                   help="examples each check draws after its fixed-seed ones (default: the "
                        f"tier's, {TIERS['standard']}; --deep: {TIERS['deep']})")
    g.add_argument("--quick", action="store_true",
                   help="the quick run: each check on its fixed examples alone, nothing drawn "
                        "(seconds: the first evidence on a new implementation)")
    g.add_argument("--deep", action="store_true",
                   help=f"the deep tier: {TIERS['deep']} drawn examples per check (not "
                        f"{TIERS['standard']}) and the whole-model checks at the mini_bert "
                        "preset's size (the nightly job's run)")
    g.add_argument("--seed", type=int, help="draw every check's examples from this seed (default: "
                                            "derandomized, the same examples every run)")
    g.add_argument("-x", "--first-red", action="store_true",
                   help="stop at the first failing check (the checks run cheapest and most "
                        "decisive first); the report lists the checks not run")
    g.add_argument("--format", choices=("table", "json", "html"), default="table")
    g.add_argument("-o", "--output", help="write the report there (json: the file; table: "
                                          "also print it, as JSON; html: a folder, required)")
    g.add_argument("--xfail", action="append", default=[], metavar="ID[=REASON]",
                   help="a check expected to fail (repeatable; strict: a pass fails the run); "
                        "an unknown id is refused")
    g.add_argument("--thin", action="append", default=[], metavar="OP[=REASON]",
                   help="a row known to be checked on too little evidence (its backward met no "
                        "finite differences, or its forward neither the oracle nor an "
                        "identity): said in the report, without exit 2 (repeatable)")
    g.add_argument("--list", action="store_true",
                   help="list the selected checks (id, kind, ops, file:line of the function "
                        "that defines it) and exit")
    p1 = g.add_argument_group("past one machine (docs/past-one-machine.md)")
    p1.add_argument("--shard", metavar="K/N",
                    help="run shard K of N: a deterministic, duration-balanced part of the "
                         "selected checks (requires -o FILE, the shard's JSON report; "
                         "`minibert report merge` makes the one report of the N shards)")
    p1.add_argument("--durations", metavar="FILE",
                    help="with --shard: the seconds each check took, from an earlier report "
                         "(any minibert check or merged JSON report) or an {id: seconds} file "
                         "(default: the durations recorded on the bundled reference; a check "
                         "they do not name weighs their mean)")
    p1.add_argument("--database", metavar="DIR",
                    help="share Hypothesis's example database in DIR with other runs: the "
                         "failures found are saved there, and replayed first by later runs")
    p1.add_argument("--replay", action="append", default=[], metavar="DIR",
                    help="replay first the counterexamples saved in DIR's example database, "
                         "read only (repeatable; e.g. the nightly run's, from the CI cache)")
    p1.add_argument("--many", metavar="DIR_OR_GLOB",
                    help="check every implementation there (one module or package per "
                         "submission), each in its own process: one table of implementation "
                         "x op (--format json/html with -o)")
    p1.add_argument("--cluster", metavar="ADDRESS",
                    help="with --many: run the implementations on a Dask cluster (the "
                         "scheduler's address; local or local:N: a LocalCluster of N workers "
                         "on this machine); needs the cluster extra")
    g.set_defaults(func=run)


def _where(check) -> str:
    """``file:line`` of the function that defines the check (relative to the directory holding
    the spec package: spec/suite/checks/fd.py:61)."""
    import minibert_spec

    file, line = check.source
    root = Path(minibert_spec.__file__).resolve().parent.parent
    try:
        file = Path(file).resolve().relative_to(root).as_posix()
    except ValueError:
        pass
    return f"{file}:{line}"


def run(args) -> int:
    from minibert_spec.suite.pool import launch_server

    if args.many or args.cluster:
        from minibert_spec.cli._many import many_command

        return many_command(args)
    refused = _refused(args)
    if refused:
        return _fail(refused)
    # the workers' fork server imports the suite while this process plans the run
    server = launch_server() if args.impl and not args.list else None
    try:
        return _run(args, server)
    finally:
        if server is not None:
            server.close()  # run_isolated closed it already, or the run ended before it


def _run(args, server) -> int:
    import warnings

    from minibert_spec.suite.plan import execute, plan_run

    try:
        with warnings.catch_warnings(record=True) as renames:
            warnings.simplefilter("always", DeprecationWarning)
            plan = plan_run(args.impl, **plan_arguments(args))
    except ValueError as e:
        return _fail(str(e))
    finally:  # -k naming a former id, a stale index of the checks: one line each
        for w in renames:
            label = "deprecated: " if issubclass(w.category, DeprecationWarning) else ""
            print(f"minibert check: {label}{w.message}", file=sys.stderr)
    if args.list:
        for c in plan.checks:
            print(f"{c.id}\t{c.kind}\t{','.join(c.ops)}\t{_where(c)}")
        return 0
    if not args.impl:
        return _fail("impl: expected package.module[:object] (or --list)")
    if not plan.checks:
        return _fail("the selection matches no check (see --list)")
    progress, done = _progress(len(plan.checks)) if plan.load_error is None else \
        (None, lambda: None)
    try:
        report = execute(plan, progress=progress, server=server)
    finally:
        done()
    settings = run_settings(plan)
    if report.load_error is not None:  # one line, nothing else
        return _could_not_run(args, report, settings)
    from minibert_spec.cli._provenance import provenance

    report.provenance, report.settings = provenance(), settings
    code = output(args, report)
    if plan.shard is not None:
        print(f"minibert check: shard {args.shard}: this exit status ({code}) is this part's "
              "alone; `minibert report merge` of every shard gives the run's", file=sys.stderr)
    return code


def plan_arguments(args) -> dict:
    """minibert_spec.suite.plan.plan_run's arguments, read from the command line (once)."""
    from minibert_spec.suite.report import expectations_from_args, thin_from_args

    return dict(kinds=args.kinds, ops=args.ops, match=args.match, bad_input=args.bad_input,
                oracle=args.oracle, timeout=args.timeout, total_timeout=args.total_timeout,
                workers=args.workers, expected_failed_checks=expectations_from_args(args.xfail),
                thin_rows=thin_from_args(args.thin), quick=args.quick, deep=args.deep,
                max_examples=args.max_examples, first_red=args.first_red, seed=args.seed,
                database=args.database, replay=args.replay, model=args.model,
                shard=args.shard, durations=args.durations, isolated=True, flag=_flag)


def _flag(argument: str) -> str:
    """An argument of plan_run as the command line spells it (``max_examples``:
    ``--max-examples``)."""
    return {"impl": "impl", "expected_failed_checks": "--xfail", "thin_rows": "--thin"}.get(
        argument, "--" + argument.replace("_", "-"))


def _refused(args) -> str | None:
    """What the command line refuses before a plan is made: an output the report cannot be
    written to, an example database that cannot be used (minibert check and --many alike)."""
    if args.shard is not None and not args.list and (not args.output or args.format == "html"):
        return ("--shard: expected -o FILE and --format json or table (the shard's JSON "
                "report, for minibert report merge)")
    if args.list:
        return None
    return (html_refused(args.output) if args.format == "html" else None) \
        or databases_refused(args)


def output(args, report) -> int:
    """The report as ``--format`` and ``-o`` ask (minibert check and minibert report merge
    alike); its exit status."""
    data = report.to_json()

    def html():
        from minibert_spec.report.check import write_check_site

        stats = write_check_site(json.loads(json.dumps(data)), Path(args.output))
        print(f"report written to {Path(args.output) / 'index.html'} ({stats.files} files, "
              f"{stats.bytes / 1e3:.0f} kB, {stats.seconds:.2f} s)", file=sys.stderr)

    emit(args, data, lambda: _print_table(report, data), html)
    return report.exit_code()


def run_settings(plan) -> dict:
    """What decides this run's verdicts besides the implementation's name -- the options, the
    implementation's source, the suite's version and its libraries: recorded in the report,
    and what the shards of one run must share (minibert_spec.suite.shard.merge_check_reports)."""
    import platform

    from minibert_spec.cli._provenance import git_commit, package_versions
    from minibert_spec.suite.run import run_seed
    from minibert_spec.suite.shard import implementation_digest

    version = package_versions(["minibert-spec"]).get("minibert-spec", "unknown")
    kinds, ops = (None if v is None else list(v) for v in (plan.kinds, plan.ops))
    return {"oracle": plan.oracle, "bad_input": plan.bad_input, "model": plan.model,
            "kinds": kinds, "ops": ops, "match": plan.match, "quick": plan.tier == "quick",
            "max_examples": plan.max_examples, "tier": plan.tier,
            "seed": run_seed(plan.seed, bool(plan.database or plan.replay)),
            "timeout": plan.timeout, "total_timeout": plan.total_timeout,
            "expected_failures": plan.expected,
            "implementation": implementation_digest(plan.label.partition(":")[0], plan.paths),
            "minibert-spec": version, "suite_commit": git_commit(),
            "python": platform.python_version(), "packages": package_versions(),
            "thin_rows": plan.thin}


def _could_not_run(args, report, settings) -> int:
    """One line and the exit status of a run that could not load the implementation; a
    shard writes its report too (the merge then says which shard could not run, and why)."""
    if report.shard is not None:
        from minibert_spec.cli._provenance import provenance

        report.provenance, report.settings = provenance(), settings
        _write(args.output, json.dumps(report.to_json(), indent=1))
    return _fail(f"could not run: {report.load_error}", report.exit_code())


def _progress(total: int):
    """A progress bar on a terminal (checks done, the op of the last one); nothing in CI
    logs (stderr not a terminal)."""
    if not sys.stderr.isatty():
        return None, lambda: None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("checks"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.description}"), transient=True)
    task = bar.add_task("", total=total)
    bar.start()
    failed = [0]

    def on_result(r):
        failed[0] += r.outcome == "failed"
        bar.update(task, advance=1, description=f"{r.id}"
                   + (f"  [red]{failed[0]} failed[/]" if failed[0] else ""))

    return on_result, bar.stop


def _print_table(report, data) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from minibert_spec.cli._output import STYLE as style
    from minibert_spec.cli._provenance import provenance_line
    from minibert_spec.suite.report import UNVERIFIED_HINT, first_rows

    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(escape(f"minibert check {report.impl}: {provenance_line()}"), style="dim")
    if report.depth:
        from minibert_spec.suite.run import depth_line

        console.print(escape(depth_line(report.depth)))
    caption = [f"oracle: {report.oracle}"
               + (" (the PyTorch columns were not run)" if report.oracle == "off" else "")]
    if not report.bad_input:
        caption.append("bad input: not run (--bad-input)")
    counts = ", ".join(f"{v} {k}" for k, v in sorted(data["counts"].items()))
    table = Table(title=escape(f"conformance of {report.impl} ({report.seconds:.1f} s; "
                               f"{counts})"), caption=escape("; ".join(caption)))
    table.add_column("op", no_wrap=True)
    for col in data["columns"]:
        table.add_column(col["heading"])
    table.add_column("verdict")

    def cell(c):
        short = {"ok": c["detail"].split(",")[0], "FAIL": "see below", "n/a": "",
                 "error": "see below", "not run": ""}[c["status"]]
        return f"[{style[c['status']]}]{c['status']}[/] {escape(short)}".rstrip()

    absent = set(data["not_provided"])
    rows = first_rows(data)
    for row in rows:
        table.add_row(row["op"], *(cell(row["cells"][c["key"]]) for c in data["columns"]),
                      f"[{style[row['verdict']]}]{row['verdict']}[/]")
    if absent:  # one line for the ops the implementation has no name of
        table.add_row(f"{len(absent)} more ops", "[dim]n/a: not provided[/]",
                      *[""] * (len(data["columns"]) - 1), "[dim]n/a[/]")
    console.print(table)
    if absent:
        console.print(f"[dim]not provided (n/a, no name of theirs): "
                      f"{escape(', '.join(data['not_provided']))}[/]")
    for row in rows:
        if row["verdict"] == "n/a":
            reasons = {c["detail"] for c in row["cells"].values() if c["detail"]}
            console.print(f"[dim]n/a {row['op']}: {escape('; '.join(sorted(reasons))[:200])}[/]")
        if "not_judged" in row:
            console.print(f"[{style[row['verdict']]}]{row['verdict']} {row['op']}: "
                          f"{escape(row['not_judged'][:300])}[/]")
        for line in row["conventions"]:
            console.print(f"[yellow]convention {row['op']}: {escape(line)}[/]")
    for d in data["unverified_declarations"]:
        console.print(f"[yellow]unverified declaration {escape(d['declaration'])} "
                      f"({', '.join(d['ops'])}): {d['checks']} check(s) ran under it, none "
                      f"against the oracle or SymPy ({escape(UNVERIFIED_HINT)})[/]")
    grouped = {}  # check id -> its group, for the reds after a group's first
    for g in data["groups"]:
        console.print(f"[red]same cause, {g['count']} checks ({', '.join(g['ops'])}): "
                      f"{escape(g['cause'])}: {escape(', '.join(g['checks']))}[/]")
        grouped.update({i: g for i in g["checks"][1:]})
    for r in report.results:
        if r.id in grouped:
            console.print(f"[red]FAIL {escape(r.id)} ({', '.join(r.ops)}): same cause as "
                          f"{escape(grouped[r.id]['checks'][0])}: "
                          f"{escape(r.message.splitlines()[0][:160])}[/]")
        elif r.outcome in ("failed", "xpassed", "error"):
            word = "FAIL" if r.outcome != "error" else "could not run"
            console.print(f"[red]{word} {escape(r.id)} ({', '.join(r.ops)}): "
                          f"{escape(r.message)}[/]")
    skipped = report.not_run()
    if skipped:
        console.print(f"[yellow]{len(skipped)} check(s) not run: stopped at the first red "
                      f"(--first-red): {escape(', '.join(r.id for r in skipped[:8]))}"
                      + (f" and {len(skipped) - 8} more" if len(skipped) > 8 else "")
                      + " (all listed in the JSON report)[/]")
    for note in report.notes:
        console.print(f"[red]{escape(note)}[/]")
    colour = "green" if report.exit_code() == 0 else "red"
    console.print(f"[{colour}]{escape(report.summary())}[/]")
