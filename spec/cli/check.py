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
import os
import sys
from pathlib import Path

from minibert_spec.cli._output import _fail, _write, databases_refused, html_refused

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


def import_root(module_name: str, cwd: str) -> str | None:
    """The sys.path entry the implementation's top-level module comes from (found without
    importing it: its code runs only in the workers)."""
    import importlib.util

    top = module_name.split(".")[0]
    saved = list(sys.path)
    try:
        if cwd not in sys.path:
            sys.path.append(cwd)
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    finally:
        sys.path[:] = saved
    origin = getattr(spec, "origin", None) if spec else None
    if not origin or origin in ("built-in", "frozen"):
        return None
    p = Path(origin).resolve().parent
    if spec.submodule_search_locations:  # a package: its parent holds it
        p = p.parent
    return str(p)


def run(args) -> int:
    from minibert_spec.suite.pool import launch_server

    if args.many or args.cluster:
        from minibert_spec.cli._many import many_command

        return many_command(args)
    # the workers' fork server imports the suite while this process selects the checks
    server = launch_server() if args.impl and not args.list else None
    try:
        return _run(args, server)
    finally:
        if server is not None:
            server.close()  # run_isolated closed it already, or the run ended before it


def _run(args, server) -> int:
    from minibert_spec.suite import selected_checks
    from minibert_spec.suite.pool import run_isolated
    from minibert_spec.suite.registry import resolve_expected_failures
    from minibert_spec.suite.report import (
        apply_expectations,
        expectations_from_args,
        thin_from_args,
    )

    for flag, value in (("--timeout", args.timeout), ("--total-timeout", args.total_timeout)):
        if value is not None and value <= 0:
            return _fail(f"{flag}: expected a positive number of seconds, got {value}")
    if args.workers < 1:
        return _fail(f"--workers: expected a positive integer, got {args.workers}")
    if args.max_examples is not None and args.max_examples < 1:
        return _fail(f"--max-examples: expected a positive integer, got {args.max_examples}")
    if args.quick and args.max_examples is not None:
        return _fail("--quick runs the fixed examples alone: --max-examples does not apply")
    if getattr(args, "model", False):  # the whole_model row alone
        if args.ops:
            return _fail("--model: runs the whole_model row alone; not with --ops")
        args.ops = ["whole_model"]
    if args.quick and args.deep:
        return _fail("--quick and --deep: expected one tier, got both")
    import warnings

    cwd = os.getcwd()
    module = (args.impl or "").partition(":")[0]
    paths = [p for p in dict.fromkeys([cwd, import_root(module, cwd)]) if p]
    try:
        with warnings.catch_warnings(record=True) as renames:
            warnings.simplefilter("always", DeprecationWarning)
            checks = selected_checks(kinds=args.kinds, ops=args.ops, match=args.match,
                                     bad_input=args.bad_input, quick=args.quick,
                                     deep=args.deep)
            # the implementation's own ops (OPS): imported here once a child process imported
            # it safely (an exit, crash or hang is refused below, at the probe's place).  After
            # the suite's own selection: the fork server imports the suite meanwhile, and a
            # probe beside both missed a --timeout of 1 s on a loaded machine
            reason, declared = _declared(args, module, paths)
            if declared:
                checks = selected_checks(kinds=args.kinds, ops=args.ops, match=args.match,
                                         bad_input=args.bad_input, quick=args.quick,
                                         extra=declared, deep=args.deep)
    except Exception as e:  # noqa: BLE001 -- a bad regular expression, unknown kind
        return _fail(f"selection: {e}")
    for w in renames:  # -k naming a former id, a stale index of the checks: one line each
        label = "deprecated: " if issubclass(w.category, DeprecationWarning) else ""
        print(f"minibert check: {label}{w.message}", file=sys.stderr)
    _check_selection(args, {op for c in declared for op in c.ops})
    try:
        expected = resolve_expected_failures(expectations_from_args(args.xfail), "--xfail",
                                             extra=declared)
        thin = thin_from_args(args.thin)
        plan = _shard(args, checks)
    except ValueError as e:
        return _fail(str(e))
    if plan is not None:
        mine = set(plan["items"])
        checks = [c for c in checks if c.id in mine]
    if args.format == "html" and not args.list:  # refuse before any check runs
        refused = html_refused(args.output)
        if refused:
            return _fail(refused)
    if args.list:
        for c in checks:
            print(f"{c.id}\t{c.kind}\t{','.join(c.ops)}\t{_where(c)}")
        return 0
    if not args.impl:
        return _fail("impl: expected package.module[:object] (or --list)")
    if not checks:
        return _fail("the selection matches no check (see --list)")
    if not module or not all(p.isidentifier() for p in module.split(".")):
        return _fail(f"impl: expected package.module[:object], got {args.impl!r}")
    if args.oracle == "require":
        needed = sorted({m for c in checks if c.oracle for m in c.missing_requirements()})
        if needed:
            return _fail(f"the PyTorch oracle is required but {' and '.join(needed)} "
                         f"{'is' if len(needed) == 1 else 'are'} not installed: "
                         "pip install 'minibert-spec[oracle]' (the CPU wheel "
                         "torch==2.13.0), or pass --oracle off to check without it")
    refused = databases_refused(args)
    if refused:
        return _fail(refused)
    database = os.path.abspath(args.database) if args.database else None
    replay = [os.path.abspath(d) for d in args.replay]
    settings = run_settings(args, expected, paths, bool(database or replay))
    settings["thin_rows"] = thin
    if reason is not None:  # the probe's: an exit, crash or hang; or a malformed OPS
        from minibert_spec.suite.report import CheckReport

        report = CheckReport(args.impl, [], args.oracle, args.bad_input, load_error=reason)
        return _could_not_run(args, report, settings, plan)
    progress, done = _progress(len(checks))
    try:
        report = run_isolated(args.impl, checks, workers=args.workers, timeout=args.timeout,
                              total_timeout=args.total_timeout, oracle=args.oracle,
                              paths=paths, seed=args.seed,
                              max_examples=examples_of(args),
                              first_red=args.first_red, on_result=progress, server=server,
                              database=database, replay=replay,
                              model=bool(getattr(args, "model", False)))
    finally:
        done()
    report.bad_input, report.thin = args.bad_input, thin
    report.results = apply_expectations(report.results, expected)
    if report.load_error is not None:  # one line, nothing else
        return _could_not_run(args, report, settings, plan)
    from minibert_spec.cli._provenance import provenance

    report.provenance = provenance()
    report.settings, report.shard = settings, plan
    report.depth = depth_of(args)
    code = output(args, report)
    if plan is not None:
        print(f"minibert check: shard {args.shard}: this exit status ({code}) is this part's "
              "alone; `minibert report merge` of every shard gives the run's", file=sys.stderr)
    return code


def output(args, report) -> int:
    """The report as ``--format`` and ``-o`` ask (minibert check and minibert report merge
    alike); its exit status."""
    data = report.to_json()
    if args.format == "json":
        text = json.dumps(data, indent=1)
        if args.output:
            _write(args.output, text)
        else:
            print(text)
    elif args.format == "html":
        from minibert_spec.report.check import write_check_site

        _print_table(report, data)
        stats = write_check_site(json.loads(json.dumps(data)), Path(args.output))
        print(f"report written to {Path(args.output) / 'index.html'} ({stats.files} files, "
              f"{stats.bytes / 1e3:.0f} kB, {stats.seconds:.2f} s)", file=sys.stderr)
    else:
        _print_table(report, data)
        if args.output:
            _write(args.output, json.dumps(data, indent=1))
    return report.exit_code()


def _shard(args, checks) -> dict | None:
    """``--shard k/N``: the shard's plan (minibert_spec.suite.shard.shard_plan), or None without it;
    a
    ValueError for what a shard cannot be run with."""
    from minibert_spec.suite.shard import (
        default_check_durations,
        parse_shard,
        read_durations,
        shard_plan,
    )

    if args.shard is None:
        if args.durations:
            raise ValueError("--durations: applies to --shard only")
        return None
    k, n = parse_shard(args.shard)
    if args.first_red:
        raise ValueError("--shard: not with --first-red (where a run stops depends on the "
                         "checks run before: the shards would not make the one run's report)")
    if not args.list and (not args.output or args.format == "html"):
        raise ValueError("--shard: expected -o FILE and --format json or table (the shard's "
                         "JSON report, for minibert report merge)")
    if n > len(checks):
        raise ValueError(f"--shard {args.shard}: {n} shards for {len(checks)} selected "
                         "checks; expected at most one shard per check")
    durations = read_durations(args.durations) if args.durations else default_check_durations()
    return shard_plan([c.id for c in checks], durations, k, n)


def run_settings(args, expected, paths, shares_database: bool) -> dict:
    """What decides this run's verdicts besides the implementation's name -- the options, the
    implementation's source, the suite's version and its libraries: recorded in the report,
    and what the shards of one run must share (minibert_spec.suite.shard.merge_check_reports)."""
    import platform
    from importlib import metadata

    from minibert_spec.cli._provenance import git_commit, package_versions
    from minibert_spec.suite.run import run_seed
    from minibert_spec.suite.shard import implementation_digest

    try:
        version = metadata.version("minibert-spec")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {"oracle": args.oracle, "bad_input": args.bad_input, "model": args.model,
            "kinds": args.kinds, "ops": args.ops, "match": args.match, "quick": args.quick,
            "max_examples": args.max_examples, "tier": depth_of(args)["tier"],
            "seed": run_seed(args.seed, shares_database), "timeout": args.timeout,
            "total_timeout": args.total_timeout, "expected_failures": expected,
            "implementation": implementation_digest(args.impl.partition(":")[0], paths),
            "minibert-spec": version, "suite_commit": git_commit(),
            "python": platform.python_version(), "packages": package_versions()}


def _could_not_run(args, report, settings, plan) -> int:
    """One line and the exit status of a run that could not load the implementation; a
    shard writes its report too (the merge then says which shard could not run, and why)."""
    if plan is not None:
        from minibert_spec.cli._provenance import provenance

        report.provenance, report.settings, report.shard = provenance(), settings, plan
        report.depth = depth_of(args)
        _write(args.output, json.dumps(report.to_json(), indent=1))
    return _fail(f"could not run: {report.load_error}", report.exit_code())


def _declared(args, module: str, paths) -> tuple[str | None, tuple]:
    """(why the implementation cannot be checked, or None; the checks of the ops it declares):
    it is imported in a child process first (minibert_spec.suite.probe), then, when it has an
    ``OPS``, here to read it (the workers import it anyway; an implementation without one is
    not imported here).  An import that raises is left to the workers, which name it."""
    if not args.impl or not module or not all(
            p.isidentifier() for p in module.split(".")):
        return None, ()
    from minibert_spec.protocol import DeclarationError, ImplLoadError, load_impl
    from minibert_spec.suite.declared import checks_of
    from minibert_spec.suite.probe import probe

    reason, has_ops = probe(args.impl, args.timeout, paths=paths)
    if reason is not None or not has_ops:  # nothing of its own to read: not imported here
        return reason, ()
    added = [p for p in paths if p not in sys.path]
    sys.path[:0] = added
    try:
        return None, checks_of(load_impl(args.impl))
    except ImplLoadError:
        return None, ()
    except DeclarationError as e:
        return str(e), ()
    finally:
        for p in added:
            if p in sys.path:
                sys.path.remove(p)


def depth_of(args) -> dict:
    """The run's tier and examples per check (minibert_spec.suite.run.depth)."""
    from minibert_spec.suite.run import depth, tier_of

    return depth(tier_of(args.quick, getattr(args, "deep", False)), args.max_examples)


def examples_of(args) -> int:
    """What each check draws, as the workers' ``max_examples``: the tier's unless
    ``--max-examples`` says (0: the quick run's explicit phase alone)."""
    return depth_of(args)["drawn_per_check"]


def _check_selection(args, declared_ops=frozenset()) -> None:
    from minibert_spec.protocol import OPS
    from minibert_spec.suite.registry import KINDS

    unknown = sorted(set(args.ops or ()) - set(OPS) - set(declared_ops))
    if unknown:
        raise ValueError(f"--ops: unknown {unknown}; expected some of "
                         f"{[*OPS, *sorted(declared_ops)]}")
    kinds = set(KINDS) | {k.split(".")[0] for k in KINDS}
    unknown = sorted(set(args.kinds or ()) - kinds)
    if unknown:
        raise ValueError(f"--kinds: unknown {unknown}; expected some of {sorted(kinds)}")


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
    style = {"ok": "green", "FAIL": "red", "n/a": "dim", "error": "red", "not run": "yellow",
             "not judged": "red", "thin": "yellow"}

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
