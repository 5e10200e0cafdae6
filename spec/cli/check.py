"""``minibert check package.module:object``: conformance of any implementation to the adapter
protocol (spec/protocol.py), as a per-op table: forward and backward vs the PyTorch oracle,
backward vs finite differences, invariants, verdict.

Exit status: 0 every op it provides conforms; 1 the implementation fails (an op fails a check,
raises -- ``SystemExit`` and ``KeyboardInterrupt`` included --, or runs past ``--timeout``);
2 it could not be checked (it does not load, provides no op, or the oracle run did not finish
cleanly).  Every reason is one line.

The backward and invariant columns are computed here with NumPy and spec.gradcheck.  The oracle
columns come from the suite's PyTorch oracle tests (the tests of tests/ marked ``oracle``: the
ops, the model, and the optimizer against torch.optim), run in a pytest subprocess against the
same implementation when torch is installed: neither reference/ nor spec/ ever imports torch,
and the oracle maths is written once, in tests/.  The subprocess runs in a temporary directory
(nothing in the caller's working directory can shadow a module, nothing is written into the
checkout: no Hypothesis database, no bytecode), and its exit status and output are checked.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]  # the project: importable in the subprocess
ROOT = PROJECT  # where the oracle tests live (tests/)
EXIT_OK, EXIT_FAIL, EXIT_NOT_RUN = 0, 1, 2
DEFAULT_TIMEOUT = 300.0  # seconds per op: generous (the reference needs < 1 s for any op)


def register(sub) -> None:
    g = sub.add_parser("check", help="conformance of an implementation (package.module:object) "
                                     "to the adapter protocol, per op")
    g.add_argument("impl", help="the implementation, as package.module[:object]")
    g.add_argument("--ops", nargs="+", help="only these ops (default: all)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--no-oracle", action="store_true", help="skip the PyTorch oracle tests")
    g.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help=f"seconds per op (and per oracle test) before it counts as a failure "
                        f"(default {DEFAULT_TIMEOUT:g})")
    g.add_argument("--bad-input", action="store_true",
                   help="also run the bad-input tests (ValueError naming the argument) in the "
                        "oracle subprocess, as their own column")
    g.set_defaults(func=run)


class OracleError(Exception):
    """The oracle run did not finish cleanly (one-line reason)."""


def import_root(module_name: str) -> str | None:
    """The sys.path entry the implementation's top-level module was imported from (None for
    the project itself or a module without a file)."""
    top = sys.modules.get(module_name.split(".")[0])
    path = getattr(top, "__file__", None)
    if not path:
        return None
    p = Path(path).resolve().parent
    if getattr(top, "__path__", None):  # a package: its parent holds it
        p = p.parent
    return None if p == PROJECT else str(p)


def _tail(text: str) -> str:
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    return lines[-1][:300] if lines else "(no output)"


def oracle_records(impl_spec: str, root: Path | None = None, *, timeout: float = DEFAULT_TIMEOUT,
                   impl_path: str | None = None, marker: str = "oracle",
                   total_timeout: float = 3600.0) -> tuple[list[dict] | None, str]:
    """Run the tests marked ``marker`` (``root``/tests) against ``impl_spec`` in a subprocess:
    (records, note); records None when there is nothing to run (no torch, no oracle tests).
    Raises :class:`OracleError` when the run does not finish cleanly: a pytest exit status
    other than 0 (passed) or 1 (tests failed), a status 1 without a failed test, no records, or
    a run past ``total_timeout``."""
    root = ROOT if root is None else Path(root)
    if importlib.util.find_spec("torch") is None:
        return None, "torch not installed"
    if not (root / "tests").is_dir():
        return None, f"no oracle tests ({root / 'tests'} does not exist)"
    with tempfile.TemporaryDirectory(prefix="minibert-check-") as tmp:
        report = Path(tmp) / "report.jsonl"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYTEST_XDIST_", "PYTEST_CURRENT_TEST", "PYTEST_ADDOPTS"))}
        env.update(MINIBERT_REPORT=str(report), MINIBERT_HYPOTHESIS_DB="none",
                   MINIBERT_ORACLE="1", MINIBERT_TEST_TIMEOUT=str(timeout),
                   PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1")
        # the project first; never the caller's working directory (a scratch `concurrent.py`
        # there would shadow the standard library); the implementation's own directory is
        # appended after the standard library by the conftest
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([str(root), str(PROJECT)]))
        if impl_path:
            env["MINIBERT_IMPL_PATH"] = impl_path
        else:
            env.pop("MINIBERT_IMPL_PATH", None)
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
               "no:randomly", "-m", marker, "--impl", impl_spec, "--rootdir", str(root),
               str(root / "tests")]
        if marker == "bad_input":
            cmd.insert(-1, "--bad-input")
        try:
            proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True,
                                  timeout=total_timeout)
        except subprocess.TimeoutExpired:
            raise OracleError(f"the {marker} run did not finish within {total_timeout:g} s"
                              ) from None
        lines = report.read_text().splitlines() if report.exists() else []
        records = [json.loads(x) for x in lines if x]
    output = proc.stdout + "\n" + proc.stderr
    if proc.returncode == 5 or (proc.returncode == 0 and not records):
        return None, f"no {marker} tests (tests marked {marker})"
    if proc.returncode not in (0, 1):
        raise OracleError(f"the {marker} run exited with status {proc.returncode}: "
                          f"{_tail(output)}")
    failed = [r for r in records if r["outcome"] == "failed"]
    if proc.returncode == 1 and not failed:
        raise OracleError(f"the {marker} run exited with status 1 but recorded no failed test: "
                          f"{_tail(output)}")
    if proc.returncode == 0 and failed:
        raise OracleError(f"the {marker} run exited 0 with failed tests: {_tail(output)}")
    if "INTERNALERROR" in output:
        raise OracleError(f"the {marker} run reported an internal error: {_tail(output)}")
    files = {r["nodeid"].split("::")[0] for r in records}
    return records, f"{len(records)} {marker} tests in {len(files)} files"


def run(args) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from spec.conformance import COLUMNS, Cell, check_all, merge_oracle
    from spec.protocol import OPS, ImplLoadError, capabilities, install_interrupt_flag, load_impl

    # a wide table in logs and CI (rich assumes 80 columns when stdout is not a terminal)
    console = Console(width=None if sys.stdout.isatty() else 160)

    def fail(code: int, msg: str) -> int:
        word = "FAIL" if code == EXIT_FAIL else "could not run"
        console.print(f"[red]{word}: " + escape(msg) + "[/]")
        return code

    install_interrupt_flag()
    if os.getcwd() not in sys.path:  # the caller's modules, after the standard library
        sys.path.append(os.getcwd())
    try:
        impl = load_impl(args.impl)
        capabilities(impl)
    except (ImplLoadError, ValueError) as e:
        return fail(EXIT_NOT_RUN, str(e) if isinstance(e, ImplLoadError)
                    else f"impl: {args.impl!r}: {e}")
    ops = args.ops or list(OPS)
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        return fail(EXIT_NOT_RUN, f"ops: unknown {unknown}; expected some of {list(OPS)}")
    if args.timeout is not None and args.timeout <= 0:
        return fail(EXIT_NOT_RUN, f"--timeout: expected a positive number, got {args.timeout}")
    start = time.perf_counter()
    reports = check_all(impl, ops, seed=args.seed, timeout=args.timeout)
    if not any(r.checked for r in reports):
        return fail(EXIT_NOT_RUN, f"{args.impl}: provides no protocol name of "
                                  f"{'the selected ops' if args.ops else 'any op'}: nothing "
                                  "to check (see spec/protocol.py)")
    note, oracle_error = "oracle skipped (--no-oracle)", None
    records = None
    impl_path = import_root(args.impl.partition(":")[0])
    if not args.no_oracle:
        try:
            records, note = oracle_records(args.impl, timeout=args.timeout,
                                           impl_path=impl_path)
        except OracleError as e:
            oracle_error, note = str(e), f"oracle run failed: {e}"
        if records is not None:
            merge_oracle(reports, records)
    if records is None:  # an oracle that could not run is reported below (exit 2), not n/a
        for r in reports:
            r.forward = r.oracle_backward = Cell("n/a", note)
    bad_input = None
    if args.bad_input:
        try:
            bad_records, bad_note = oracle_records(args.impl, timeout=args.timeout,
                                                   impl_path=impl_path, marker="bad_input")
        except OracleError as e:
            bad_records, bad_note = None, f"bad-input run failed: {e}"
        bad_input = _bad_input_cells(reports, bad_records, bad_note)
    elapsed = time.perf_counter() - start

    table = Table(title=escape(f"conformance of {args.impl} ({elapsed:.1f} s)"),
                  caption=escape(f"oracle: {note}"))
    headings = ["op", *(h for _, h in COLUMNS)] + (["bad input"] if bad_input else []) + [
        "verdict"]
    for col in headings:
        table.add_column(col, no_wrap=col == "op")
    style = {"ok": "green", "FAIL": "red", "n/a": "dim"}

    def cell(c):  # details of failures are printed under the table, naming the op
        short = {"ok": c.detail.split(",")[0], "FAIL": "see below", "n/a": ""}[c.status]
        return f"[{style[c.status]}]{c.status}[/] {escape(short)}".rstrip()

    for r in reports:
        extra = [cell(bad_input[r.op])] if bad_input else []
        table.add_row(r.op, *(cell(c) for c in r.cells), *extra,
                      f"[{style[r.verdict]}]{r.verdict}[/]")
    from spec.cli._provenance import provenance_line

    # after the checks, so a could-not-run verdict stays one line
    console.print(escape(f"minibert check {args.impl}: {provenance_line()}"), style="dim")
    console.print(table)
    for r in reports:
        if r.verdict == "n/a":
            console.print(f"[dim]n/a {r.op}: "
                          f"{escape(r.backward.detail or r.invariants.detail)}[/]")
    for r in reports:
        for line in r.conventions:
            console.print(f"[yellow]convention {escape(r.op)}: {escape(line)}[/]")
    failed = [r for r in reports if r.verdict == "FAIL"]
    bad_failed = [op for op, c in (bad_input or {}).items() if c.status == "FAIL"]
    for r in failed:
        for line in r.failures:
            console.print(f"[red]FAIL {escape(line)}[/]")
    for op in bad_failed:
        console.print(f"[red]FAIL {escape(op)} bad input: {escape(bad_input[op].detail)}[/]")
    if failed or bad_failed:
        names = [r.op for r in failed] + [op for op in bad_failed if op not in
                                          {r.op for r in failed}]
        console.print(f"[red]{len(names)} op(s) fail: {', '.join(names)}[/]")
        if oracle_error:
            console.print("[red]could not run the oracle: " + escape(oracle_error) + "[/]")
        return EXIT_FAIL
    if oracle_error:
        return fail(EXIT_NOT_RUN, f"{oracle_error} (the FD and invariant columns passed; "
                                  "rerun with --no-oracle to skip the oracle)")
    console.print(f"[green]{sum(r.verdict == 'ok' for r in reports)} op(s) conform[/]")
    return EXIT_OK


def _bad_input_cells(reports, records, note):
    from spec.conformance import Cell, credited_ops

    cells = {r.op: Cell("n/a", note) for r in reports}
    if records is None:
        if note.startswith("bad-input run failed"):
            return {op: Cell("FAIL", note) for op in cells}
        return cells
    by_op: dict[str, list[dict]] = {}
    for rec in records:
        for op in credited_ops(rec):
            by_op.setdefault(op, []).append(rec)
    for op in cells:
        ran = [r for r in by_op.get(op, []) if r["outcome"] in ("passed", "failed")]
        bad = [r for r in ran if r["outcome"] == "failed"]
        if bad:
            cells[op] = Cell("FAIL", f"{len(bad)}/{len(ran)} bad-input tests failed, first "
                                     f"{bad[0]['nodeid']}: {bad[0].get('message', '')}")
        elif ran:
            cells[op] = Cell("ok", f"{len(ran)} bad-input tests")
    return cells
