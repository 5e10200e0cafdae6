"""``minibert check --many DIR_OR_GLOB [--cluster ADDRESS]``: the class table of many
implementations (minibert_spec.suite.many does the work; this is the command line around it)."""

from __future__ import annotations

import sys
from pathlib import Path

# the options of minibert check passed on to each submission's own run, as given
PASSED = (("ops", "--ops"), ("kinds", "--kinds"), ("match", "-k"), ("oracle", "--oracle"),
          ("timeout", "--timeout"), ("total_timeout", "--total-timeout"),
          ("workers", "--workers"), ("max_examples", "--max-examples"), ("seed", "--seed"),
          ("xfail", "--xfail"), ("database", "--database"), ("replay", "--replay"))


def argv_for(args) -> list[str]:
    """The ``minibert check`` options each submission's run gets (paths made absolute: the
    run happens in the submission's own folder)."""
    import os

    out: list[str] = []
    out += [flag for flag, on in (("--bad-input", args.bad_input), ("--quick", args.quick),
                                  ("--deep", args.deep))
            if on]
    for attr, flag in PASSED:
        value = getattr(args, attr)
        if value is None or value == []:
            continue
        if attr in ("database", "replay"):
            value = ([os.path.abspath(v) for v in value] if isinstance(value, list)
                     else os.path.abspath(value))
        if attr in ("ops", "kinds"):
            out += [flag, *value]
        elif isinstance(value, list):
            for v in value:
                out += [flag, str(v)]
        else:
            out += [flag, str(value)]
    return out


def many_command(args) -> int:
    from minibert_spec.cli._output import _fail, databases_refused, emit, html_refused
    from minibert_spec.suite.many import SLACK_SECONDS, class_table, run_many, survey
    from minibert_spec.suite.pool import LOAD_SECONDS

    if not args.many:
        return _fail("--cluster: applies to --many only")
    if args.cluster is not None:
        from minibert_spec.suite.many import parse_cluster

        try:
            parse_cluster(args.cluster)
        except ValueError as e:
            return _fail(str(e))
    bad = [flag for flag, on in (("IMPL", args.impl), ("--shard", args.shard),
                                 ("--first-red", args.first_red), ("--list", args.list))
           if on]
    if bad:
        return _fail(f"--many: not with {', '.join(bad)} (each submission is checked whole)")
    refused = (html_refused(args.output) if args.format == "html" else None) \
        or databases_refused(args)
    if refused:
        return _fail(refused)
    try:
        submissions, skipped = survey(args.many)
    except ValueError as e:
        return _fail(str(e))
    timeout = args.total_timeout + LOAD_SECONDS + SLACK_SECONDS
    where = f"on the Dask cluster {args.cluster}" if args.cluster else "one after the other"
    print(f"minibert check --many: {len(submissions)} implementations, {where}"
          + (f"; {len(skipped)} entries not checked" if skipped else ""), file=sys.stderr)
    for e in skipped:
        print(f"  not checked: {e['name']}: {e['reason']}", file=sys.stderr)

    def said(row):
        print(f"  {row['name']}: exit {row['exit_code']} ({row['seconds']:.1f} s)"
              + (f": {row['reason']}" if row["reason"] else ""), file=sys.stderr)

    try:
        rows = run_many(submissions, argv_for(args), timeout=timeout, cluster=args.cluster,
                        on_row=said)
    except ValueError as e:
        return _fail(str(e))
    table = class_table(rows, skipped)
    from minibert_spec.cli._provenance import provenance

    table["provenance"] = provenance()
    table["argv"] = argv_for(args)

    def html():
        from minibert_spec.report.many import write_many_site

        write_many_site(table, Path(args.output), table["provenance"])
        print(f"table written to {Path(args.output) / 'index.html'}", file=sys.stderr)

    emit(args, table, lambda: _print_many(table), html)
    return table["exit_code"]


def _print_many(table: dict) -> None:
    """The class table of ``--many``: implementation x op, each cell the op's verdict."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from minibert_spec.cli._output import STYLE as style

    console = Console(width=None if sys.stdout.isatty() else 200)
    t = Table(title=f"{len(table['implementations'])} implementations x {len(table['ops'])} ops")
    t.add_column("implementation", no_wrap=True)
    for op in table["ops"]:
        t.add_column(op)
    t.add_column("exit")
    for i in table["implementations"]:
        t.add_row(escape(i["name"]), *(f"[{style[v]}]{v}[/]" if (v := i["verdicts"].get(op))
                                       else "" for op in table["ops"]), str(i["exit_code"]))
    console.print(t)
    for i in table["implementations"]:
        if i["exit_code"] != 0:
            console.print(f"[red]{escape(i['name'])}: {escape(i['summary'])}[/]")
    for e in table["skipped"]:
        console.print(f"[yellow]not checked: {escape(e['name'])}: {escape(e['reason'])}[/]")
