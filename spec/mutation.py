"""Mutation runner: the test suite against each mutant of the catalog, through conformance mode.

``MINIBERT_MUTANT=name pytest -p minibert_spec.mutation`` runs the suite against the reference with
mutant ``name`` applied in memory (see :mod:`minibert_spec.mutants`), process-wide, by this module's
``pytest_configure``: the judging suite on the reference (tests/suite/test_suite_reference.py)
and the project-internal tests that reach the reference (training, the spec's own checks) all run
against the mutant.  ``minibert check minibert_spec.mutation:mutant_impl`` (with MINIBERT_MUTANT
set) judges a mutant like any other implementation.  An empty ``MINIBERT_MUTANT`` is the unmutated
baseline.

:func:`run_mutants` starts one ``pytest -x -q -p no:cacheprovider`` subprocess per mutant, ``jobs``
at a time (one BLAS thread each), and reads the first failing test from the ``MINIBERT_REPORT``
records the conftest writes.  A mutant is *killed* when a test fails, *survived* when the whole
suite passes (a hole in the suite), *timeout* when the run exceeds its limit (counted as
detected: a hang is visible), *n/a* when its target does not exist, *error* when pytest could not
run (a collection error: not a kill).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from minibert_spec.evidence import (
    MATRIX_PATH,
    collect_items,
    evidence_file,
    fingerprint,
    read_matrix,
    write_matrix,
)
from minibert_spec.mutants import CATALOG, activate, applicability
from minibert_spec.paths import HOME

ROOT = HOME
PYTEST_ARGS = ("-x", "-q", "-p", "no:cacheprovider")
_active: str | None = None


def __getattr__(name: str):
    if name == "mutant_impl":
        return _mutant_impl()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _mutant_impl():
    """The reference with the mutant named by MINIBERT_MUTANT applied (applied once)."""
    global _active
    name = os.environ.get("MINIBERT_MUTANT", "")
    if name and _active is None:
        if name not in CATALOG:
            raise ValueError(f"MINIBERT_MUTANT: expected a mutant of the catalog, got {name!r}")
        activate(CATALOG[name])  # for the life of the process: it is a throw-away test run
        _active = name
    elif name != (_active or ""):
        raise ValueError(f"MINIBERT_MUTANT: {_active!r} is already applied, got {name!r}")
    return importlib.import_module("minibert_reference")


@dataclass
class MutantResult:
    name: str
    status: str  # killed | survived | timeout | n/a | error
    killer: str = ""  # first failing test (nodeid)
    message: str = ""  # its failure, first line; or why not applicable / the error
    seconds: float = 0.0

    @property
    def detected(self) -> bool:
        return self.status in ("killed", "timeout")


def _pytest(mutant: str, args: Sequence[str], *, profile: str | None, timeout: float,
            env: Mapping[str, str] | None = None) -> tuple:
    """One pytest subprocess with this module as its plugin, against ``mutant`` ("" = the
    unmutated baseline): (its process or None on a timeout, the MINIBERT_REPORT records the
    conftest wrote, seconds)."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="minibert-mutant-") as tmp:
        report = Path(tmp) / "report.jsonl"
        # not the variables of an enclosing pytest(-xdist) run: this is a fresh session
        full = {k: v for k, v in os.environ.items()
                if not k.startswith(("PYTEST_XDIST_", "PYTEST_CURRENT_TEST"))}
        full.update(MINIBERT_MUTANT=mutant, MINIBERT_REPORT=str(report),
                    OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        if profile:
            full["MINIBERT_PROFILE"] = profile
        full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full.get("PYTHONPATH")]))
        full.update(env or {})
        try:
            proc = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=ROOT, env=full,
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, [], time.perf_counter() - start
        records = [json.loads(line) for line in
                   (report.read_text(encoding="utf-8").splitlines() if report.exists() else ())
                   if line]
    return proc, records, time.perf_counter() - start


def _error(proc) -> str:
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
    return f"pytest exit {proc.returncode}: " + " | ".join(tail)


def _pooled(one: Callable, jobs: Sequence, workers: int) -> list:
    """``one`` of each of ``jobs``, ``workers`` threads at a time (each starts a subprocess)."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(one, jobs))


def ordered_test_files(tests: Sequence[str]) -> list[str]:
    """``tests`` as test files in the order given, each once: a directory becomes its
    ``test_*.py`` files (sorted, recursive).  pytest itself folds a file into a directory given
    beside it and collects the directory in name order, which would lose "conformance first"."""
    out: list[str] = []
    for t in tests:
        p = ROOT / t.split("::")[0]  # a node id (file::test) is kept as given
        if not p.exists():
            raise ValueError(f"tests: expected paths under {ROOT}, got {t!r} (does not exist)")
        items = ([f.relative_to(ROOT).as_posix() for f in sorted(p.rglob("test_*.py"))]
                 if p.is_dir() else [t])
        out.extend(i for i in items if i not in out)
    return out


def run_suite(mutant: str, tests: Sequence[str] = ("tests",), *, profile: str | None = "ci",
              timeout: float = 600, extra_args: Sequence[str] = ()) -> MutantResult:
    """One pytest subprocess against ``mutant`` ("" for the unmutated baseline)."""
    proc, records, seconds = _pytest(
        mutant, [*PYTEST_ARGS, "-p", __name__, *extra_args, *ordered_test_files(tests)],
        profile=profile, timeout=timeout)
    if proc is None:
        return MutantResult(mutant, "timeout", f"(no result after {timeout:.0f} s)", "", seconds)
    failed = [r for r in records if r["outcome"] == "failed"]
    if failed:
        return MutantResult(mutant, "killed", failed[0]["nodeid"], failed[0]["message"], seconds)
    if proc.returncode == 0:
        return MutantResult(mutant, "survived", "", f"{len(records)} tests passed or skipped",
                            seconds)
    return MutantResult(mutant, "error", "", _error(proc), seconds)


def select(names: Sequence[str] = (), *, fast: bool = False) -> list[str]:
    """Catalog names to run: ``names`` (validated), else the fast subset or everything."""
    unknown = sorted(set(names) - set(CATALOG))
    if unknown:
        raise ValueError(f"mutants: unknown names {unknown}; see `minibert mutate --list`")
    if names:
        return list(names)
    return [n for n, m in CATALOG.items() if m.fast or not fast]


def run_mutants(names: Sequence[str], tests: Sequence[str] = ("tests",), *, jobs: int = 2,
                profile: str | None = "ci", timeout: float = 600,
                on_result: Callable[[MutantResult], None] | None = None) -> list[MutantResult]:
    """Every mutant of ``names`` against ``tests``, ``jobs`` subprocesses at a time; mutants
    that do not apply are reported as n/a without running anything."""
    said = on_result or (lambda r: None)
    results: dict[str, MutantResult] = {}
    runnable = []
    for name in names:
        reason = applicability(CATALOG[name])
        if reason:
            results[name] = MutantResult(name, "n/a", "", f"not applicable: {reason}")
            said(results[name])
        else:
            runnable.append(name)

    def one(name):
        r = run_suite(name, tests, profile=profile, timeout=timeout)
        said(r)
        return r

    results.update((r.name, r) for r in _pooled(one, runnable, jobs))
    return [results[n] for n in names]


def xdist_args(jobs: int) -> list[str]:
    """pytest's ``-n JOBS`` for a baseline run (every test, or every equation's tagged ones):
    spread over the cores when pytest-xdist is there."""
    import importlib.util

    return ["-n", str(jobs)] if importlib.util.find_spec("xdist") and jobs > 1 else []


def score(results: Sequence[MutantResult]) -> tuple[int, int]:
    """(detected, applicable): n/a mutants are not in the denominator; an error run is (as
    undetected: the suite could not show the bug)."""
    applicable = [r for r in results if r.status != "n/a"]
    return sum(r.detected for r in applicable), len(applicable)


# =========================================================================== the mutation matrix
# Per mutant, only the tests *tagged* with the equation it breaks run (no -x: every failing test
# is recorded).  The audit reads the result: a tag is evidence only if its tests kill at least
# one mutant of its equation.  The record (spec/results/mutation_matrix.json) is keyed by a
# fingerprint of what decides the outcome (minibert_spec.evidence, shared with the audit): an edited
# catalog or test makes the record stale (an audit gap) until `minibert mutate --matrix` runs
# again (it reruns only stale rows).
MATRIX_EQUATION_ENV = "MINIBERT_MATRIX_EQUATION"


def pytest_configure(config) -> None:
    """Plugin (``-p minibert_spec.mutation``): applies the mutant named by $MINIBERT_MUTANT to the
    bundled reference in memory, so every test that reaches the reference runs it.  In a
    matrix run, Hypothesis keeps its profile's examples (a failure is found exactly where the
    ordinary run finds it) but does not shrink it: only *whether* a test fails is recorded,
    and shrinking dominated the cost."""
    if os.environ.get("MINIBERT_MUTANT"):
        _mutant_impl()
    if not os.environ.get(MATRIX_EQUATION_ENV):
        return
    from hypothesis import Phase, settings

    settings.register_profile("minibert-matrix", settings(
        phases=(Phase.explicit, Phase.reuse, Phase.generate)))
    settings.load_profile("minibert-matrix")


def pytest_collection_modifyitems(config, items) -> None:
    """Plugin (``-p minibert_spec.mutation``): with $MINIBERT_MATRIX_EQUATION set (IDs,
    comma-separated), keep only the items whose ``equation`` (or judging-suite ``suite_check``)
    markers name one (the markers the audit collects)."""
    wanted = set(filter(None, os.environ.get(MATRIX_EQUATION_ENV, "").split(",")))
    if not wanted:
        return
    keep, drop = [], []
    for item in items:
        ids = {str(a) for m in item.iter_markers("equation") for a in m.args}
        ids |= {str(a) for m in item.iter_markers("suite_check")
                for a in m.kwargs.get("equations", ())}
        (keep if ids & wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def tagged_by_equation(root: Path = ROOT) -> dict[str, list[str]]:
    """Equation ID -> node ids of the collected tests tagged with it (the audit's collection)."""
    out: dict[str, list[str]] = {}
    for r in collect_items(root / "tests"):
        for eq in r["ids"]:
            out.setdefault(eq, []).append(r["nodeid"])
    return {k: sorted(v) for k, v in out.items()}


@dataclass
class MatrixRow:
    mutant: str
    equation: str
    status: str  # killed | survived | untested (no tagged test) | timeout | n/a | error
    tests: list  # node ids run (those tagged with the equation)
    killers: list  # node ids that failed
    seconds: float
    fingerprint: str
    message: str = ""

    def by_file(self) -> dict[str, tuple[int, int]]:
        """test file -> (killing tests, tagged tests run)."""
        out: dict[str, list[int]] = {}
        for n in self.tests:
            out.setdefault(evidence_file(n), [0, 0])[1] += 1
        for n in self.killers:
            out.setdefault(evidence_file(n), [0, 0])[0] += 1
        return {f: (k, t) for f, (k, t) in sorted(out.items())}


def run_tagged(mutant: str, equation: str, nodeids: Sequence[str], *, profile: str | None = "ci",
               timeout: float = 600, extra_args: Sequence[str] = ()) -> tuple[str, list, str,
                                                                                 float]:
    """The tests tagged with ``equation`` against ``mutant`` ("" = unmutated), without -x:
    (status, failing node ids, message, seconds)."""
    files = sorted({n.split("::")[0] for n in nodeids})
    # every tagged test, the slow tier's too (conftest.py)
    proc, records, seconds = _pytest(
        mutant, ["-q", "-p", "no:cacheprovider", "-p", __name__, *extra_args, *files],
        profile=profile, timeout=timeout,
        env={MATRIX_EQUATION_ENV: equation, "MINIBERT_SLOW": "1"})
    if proc is None:
        return "timeout", [], f"no result after {timeout:.0f} s", seconds
    failed = sorted({r["nodeid"] for r in records if r["outcome"] == "failed"})
    if failed:
        first = next(r for r in records if r["outcome"] == "failed")
        return "killed", failed, first["message"], seconds
    if proc.returncode == 0:
        return "survived", [], f"{len(records)} tests passed or skipped", seconds
    if proc.returncode == 5:  # pytest: nothing selected
        return "untested", [], f"no test in {files} is tagged {equation}", seconds
    return "error", [], _error(proc), seconds


def run_matrix(names: Sequence[str], *, tagged: Mapping[str, Sequence[str]] | None = None,
               previous: Mapping[str, dict] | None = None, jobs: int = 2,
               profile: str | None = "ci", timeout: float = 600,
               on_result: Callable[[MatrixRow, bool], None] | None = None) -> list[MatrixRow]:
    """Each mutant of ``names`` against the tests tagged with its equation.  A mutant whose
    ``previous`` record has the current fingerprint is reused, not rerun (``on_result`` gets
    ``reused=True``)."""
    said = on_result or (lambda row, reused: None)
    tagged = tagged_by_equation() if tagged is None else tagged
    previous = previous or {}
    rows: dict[str, MatrixRow] = {}
    todo = []
    for name in names:
        m = CATALOG[name]
        nodeids = list(tagged.get(m.equation, ()))
        fp = fingerprint(name, nodeids)
        old = previous.get(name)
        if old and old.get("fingerprint") == fp and old.get("status") != "error":
            rows[name] = MatrixRow(**{k: old[k] for k in MatrixRow.__dataclass_fields__
                                      if k in old})
            said(rows[name], True)
            continue
        reason = applicability(m)
        if reason or not nodeids:
            rows[name] = MatrixRow(name, m.equation, "n/a" if reason else "untested", nodeids,
                                   [], 0.0, fp, reason or "no test is tagged with "
                                   + m.equation)
            said(rows[name], False)
            continue
        todo.append((name, m.equation, nodeids, fp))

    def one(job):
        name, equation, nodeids, fp = job
        status, killers, message, seconds = run_tagged(name, equation, nodeids,
                                                       profile=profile, timeout=timeout)
        row = MatrixRow(name, equation, status, nodeids, killers, round(seconds, 2), fp,
                        message)
        said(row, False)
        return row

    rows.update((row.mutant, row) for row in _pooled(one, todo, jobs))
    return [rows[n] for n in names]


def write_markdown(path: Path, rows: Sequence[MatrixRow]) -> None:
    """Mutant x test file into ``path``: ``k/n`` = k of the n tagged tests of that file killed
    the mutant."""
    from minibert_reference.train.fileio import atomic_write

    files = sorted({f for r in rows for f in r.by_file()})
    short = [f.removeprefix("tests/").removesuffix(".py") for f in files]
    lines = ["| mutant | equation | killed by | " + " | ".join(short) + " |",
             "|---|---|---|" + "---|" * len(files)]
    for r in sorted(rows, key=lambda r: (r.equation, r.mutant)):
        cells = r.by_file()
        lines.append(f"| {r.mutant} | {r.equation} | {len(r.killers)}/{len(r.tests)} "
                     f"({r.status}) | " + " | ".join(
                         (f"{cells[f][0]}/{cells[f][1]}" if f in cells else "")
                         for f in files) + " |")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(str(path), "\n".join(lines) + "\n")


MATRIX_SCHEMA = "minibert-matrix/1"  # a matrix run's own record (--json): a shard, or all


def matrix_record(rows: Sequence[MatrixRow], settings: dict, plan: dict | None) -> dict:
    """The JSON record of one matrix run (``minibert mutate --matrix --json FILE``): its rows,
    settings and shard plan; ``minibert report merge`` joins the records of N shards."""
    return {"schema": MATRIX_SCHEMA, "settings": settings,
            **({"shard": plan} if plan is not None else {}),
            "exit_code": matrix_exit_code(rows),
            "rows": {r.mutant: asdict(r) for r in rows}}


def matrix_exit_code(rows: Sequence[MatrixRow]) -> int:
    """1 when a mutant is killed by none of the tests tagged with its equation, else 0."""
    return 1 if any(not r.killers and r.status != "n/a" for r in rows) else 0


def merge_matrix_records(records: Sequence[tuple[str, dict]]) -> tuple[list[MatrixRow], dict]:
    """The rows (in the run's order) and settings of the matrix that the shard records
    ``(name, record)`` of one ``minibert mutate --matrix --shard k/N`` run make; a ValueError
    naming the shards when they are not the shards of one run."""
    from minibert_spec.suite.shard import verify_shards

    ordered = verify_shards(records, MATRIX_SCHEMA, "a mutation matrix record")
    rows: dict[str, MatrixRow] = {}
    for name, rec in ordered:
        plan = rec["shard"]
        if not isinstance(rec.get("rows"), dict) or sorted(rec["rows"]) != sorted(plan["items"]):
            raise ValueError(f"{name}: its rows are not the mutants of its shard "
                             f"{plan['index']}/{plan['count']}")
        for mutant, row in rec["rows"].items():
            try:
                rows[mutant] = MatrixRow(**{k: row[k] for k in MatrixRow.__dataclass_fields__
                                            if k in row})
            except TypeError as e:
                raise ValueError(f"{name}: row {mutant}: expected a matrix row ({e})") from None
    return [rows[m] for m in ordered[0][1]["shard"]["selection"]], ordered[0][1]["settings"]


def print_matrix(console, rows: Sequence[MatrixRow], title: str) -> None:
    """The matrix as a table: per mutant, how many of its tagged tests kill it, by file."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title)
    for col in ("mutant", "equation", "killed / tagged", "killing tests by file", "s"):
        table.add_column(col, justify="right" if col in ("s", "killed / tagged") else "left")
    for r in sorted(rows, key=lambda r: (len(r.killers), r.mutant)):
        files = ", ".join(f"{f.removeprefix('tests/')} {k}/{t}"
                          for f, (k, t) in r.by_file().items() if k)
        colour = "green" if r.killers else "red"
        table.add_row(r.mutant, r.equation, f"[{colour}]{len(r.killers)}/{len(r.tests)}[/]",
                      escape(files or r.message), f"{r.seconds:.1f}")
    console.print(table)
    unseen = [r.mutant for r in rows if not r.killers and r.status != "n/a"]
    if unseen:
        console.print(f"[red]not killed by the tests tagged with their equation: "
                      f"{', '.join(unseen)}[/]")


def matrix_command(args, console, settings: dict | None = None) -> int:
    """``minibert mutate --matrix [NAMES] [--rerun] [-o report.md] [--shard K/N --json FILE]``:
    record the matrix into spec/results/mutation_matrix.json (``--matrix-file``; only stale
    or missing rows rerun) and print it.  ``--shard K/N``: only shard K of the mutants,
    dealt by the seconds each row took (the recorded matrix's, or ``--durations``);
    ``--json FILE``: this run's record (with ``settings``: what the shards of one run share),
    which ``minibert report merge`` joins."""
    from rich.markup import escape

    from minibert_spec.suite.shard import durations_from, parse_shard, read_durations, shard_plan

    names = select(args.mutants)
    matrix_file = Path(args.matrix_file) if args.matrix_file else MATRIX_PATH
    start = time.perf_counter()
    recorded = read_matrix(matrix_file) or {"rows": {}}
    plan = None
    if args.shard:
        k, n = parse_shard(args.shard)
        if not args.json:
            raise ValueError("--shard: expected --json FILE (the shard's record, for "
                             "minibert report merge)")
        if n > len(names):
            raise ValueError(f"--shard {args.shard}: {n} shards for {len(names)} mutants")
        durations = (read_durations(args.durations) if args.durations
                     else durations_from(recorded, str(matrix_file)))
        plan = shard_plan(names, durations, k, n)
        names = plan["items"]
    elif args.durations:
        raise ValueError("--durations: applies to --shard only")
    console.print("collecting the tagged tests ...")
    tagged = tagged_by_equation()
    previous = {} if args.rerun else recorded["rows"]
    stale = [n for n in names if (previous.get(n) or {}).get("fingerprint")
             != fingerprint(n, tagged.get(CATALOG[n].equation, ()))]
    console.print(f"{len(names)} mutants, {len(stale)} to run (the others' records are "
                  f"current), {args.jobs} at a time; each against the tests tagged with its "
                  "equation, without -x")
    if stale and not args.no_baseline:
        # the unmutated tagged tests must pass, or a "kill" means nothing: one run, every
        # equation's tagged tests
        eqs = sorted({CATALOG[n].equation for n in stale} & set(tagged))
        status, failed, message, s = run_tagged(
            "", ",".join(eqs), sorted({n for eq in eqs for n in tagged[eq]}),
            profile=args.profile, timeout=args.timeout, extra_args=xdist_args(args.jobs))
        if status != "survived":
            console.print(f"[red]baseline: tagged tests fail unmutated ({status}): "
                          f"{escape(', '.join(failed) or message)}[/]")
            return 1
        console.print(f"baseline ok: the tests tagged with {len(eqs)} equations pass "
                      f"unmutated ({s:.0f} s)")

    def progress(r, reused):
        if not reused:
            console.print(escape(f"  {r.mutant}: {r.status}, {len(r.killers)}/{len(r.tests)} "
                                 f"tagged tests fail ({r.seconds:.1f} s)"))

    rows = run_matrix(names, tagged=tagged, previous=previous, jobs=args.jobs,
                      profile=args.profile, timeout=args.timeout, on_result=progress)
    merged = {k: v for k, v in recorded["rows"].items() if k in CATALOG}
    merged.update({r.mutant: asdict(r) for r in rows})
    elapsed = time.perf_counter() - start
    write_matrix(merged, matrix_file, profile=args.profile, note=MATRIX_NOTE)
    print_matrix(console, rows, f"mutation matrix: {len(rows)} mutants, profile {args.profile} "
                                f"({elapsed:.0f} s, {len(stale)} run)"
                 + (f", shard {plan['index']}/{plan['count']}" if plan else ""))
    if args.output:
        write_markdown(Path(args.output), rows)
        console.print(f"mutant x test file report written to {args.output}")
    if args.json:
        from minibert_reference.train.fileio import atomic_write

        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(args.json, json.dumps(matrix_record(rows, settings or {}, plan),
                                           indent=1) + "\n")
        console.print(f"this run's record written to {args.json}")
    console.print(f"matrix written to {matrix_file} in {elapsed:.0f} s")
    return matrix_exit_code(rows)


MATRIX_NOTE = ("minibert mutate --matrix: per mutant, the tests tagged with its equation (no -x); "
               "killers = failing node ids")
