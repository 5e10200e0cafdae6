"""``minibert check package.module:object``: conformance of any implementation to the adapter
protocol (spec/protocol.py), as a per-op table: forward vs the PyTorch oracle, backward vs
finite differences, invariants, verdict.  Exit 1 on any failure.

The backward and invariant columns are computed here with NumPy and spec.gradcheck.  The oracle
column comes from the suite's PyTorch oracle tests (the tests of tests/ marked ``oracle``: the ops,
the model, and the optimizer against torch.optim), run in a pytest subprocess against the same
implementation when torch is installed: neither reference/ nor spec/ ever imports torch, and the
oracle maths is written once, in tests/.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def register(sub) -> None:
    g = sub.add_parser("check", help="conformance of an implementation (package.module:object) "
                                     "to the adapter protocol, per op")
    g.add_argument("impl", help="the implementation, as package.module[:object]")
    g.add_argument("--ops", nargs="+", help="only these ops (default: all)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--no-oracle", action="store_true", help="skip the PyTorch oracle tests")
    g.set_defaults(func=run)


def oracle_records(impl_spec: str, root: Path = ROOT) -> tuple[list[dict] | None, str]:
    """Run the oracle tests (``root``/tests, marker ``oracle``) against ``impl_spec``: (records,
    note); records None when the oracle cannot run (no torch, no oracle tests)."""
    if importlib.util.find_spec("torch") is None:
        return None, "torch not installed"
    if not (root / "tests").is_dir():
        return None, f"no oracle tests ({root / 'tests'} does not exist)"
    with tempfile.TemporaryDirectory(prefix="minibert-check-") as tmp:
        report = Path(tmp) / "report.jsonl"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYTEST_XDIST_", "PYTEST_CURRENT_TEST"))}
        env["MINIBERT_REPORT"] = str(report)
        # the user's module is importable from their working directory
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), str(root), str(ROOT),
                                                          env.get("PYTHONPATH")]))
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-m", "oracle", "--impl", impl_spec, "tests"], cwd=root, env=env,
                       capture_output=True, text=True)
        import json

        lines = report.read_text().splitlines() if report.exists() else []
        records = [json.loads(x) for x in lines if x]
        if not records:
            return None, "no oracle tests (tests marked oracle)"
        files = {r["nodeid"].split("::")[0] for r in records}
        return records, f"{len(records)} oracle tests in {len(files)} files"


def run(args) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from spec.conformance import Cell, check_all, merge_oracle
    from spec.protocol import OPS, load_impl

    # a wide table in logs and CI (rich assumes 80 columns when stdout is not a terminal)
    console = Console(width=None if sys.stdout.isatty() else 160)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        impl = load_impl(args.impl)
    except (ImportError, AttributeError, ValueError) as e:
        console.print("[red]" + escape(f"impl: cannot load {args.impl!r}: {type(e).__name__}: {e}")
                      + "[/]")
        return 2
    ops = args.ops or list(OPS)
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        console.print("[red]" + escape(f"ops: unknown {unknown}; expected some of {list(OPS)}")
                      + "[/]")
        return 2
    start = time.perf_counter()
    reports = check_all(impl, ops, seed=args.seed)
    note = "oracle skipped (--no-oracle)"
    if not args.no_oracle:
        records, note = oracle_records(args.impl)
        if records is not None:
            merge_oracle(reports, records)
    if args.no_oracle or records is None:
        for r in reports:
            r.forward = Cell("n/a", note)
    elapsed = time.perf_counter() - start

    table = Table(title=escape(f"conformance of {args.impl} ({elapsed:.1f} s)"),
                  caption=escape(f"forward vs oracle: {note}"))
    for col in ("op", "forward vs oracle", "backward vs FD", "invariants", "verdict"):
        table.add_column(col, no_wrap=col == "op")
    style = {"ok": "green", "FAIL": "red", "n/a": "dim"}

    def cell(c):  # details of failures are printed under the table, naming the op
        short = {"ok": c.detail.split(",")[0], "FAIL": "see below", "n/a": ""}[c.status]
        return f"[{style[c.status]}]{c.status}[/] {escape(short)}".rstrip()

    for r in reports:
        table.add_row(r.op, cell(r.forward), cell(r.backward), cell(r.invariants),
                      f"[{style[r.verdict]}]{r.verdict}[/]")
    console.print(table)
    failed = [r for r in reports if r.verdict == "FAIL"]
    for r in reports:
        if r.verdict == "n/a":
            console.print(f"[dim]n/a {r.op}: "
                          f"{escape(r.backward.detail or r.invariants.detail)}[/]")
    if failed:
        for r in failed:
            for line in r.failures:
                console.print(f"[red]FAIL {escape(line)}[/]")
        console.print(f"[red]{len(failed)} op(s) fail: {', '.join(r.op for r in failed)}[/]")
        return 1
    console.print(f"[green]{sum(r.verdict == 'ok' for r in reports)} op(s) conform[/]")
    return 0
