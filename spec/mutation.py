"""Mutation runner: the test suite against each mutant of the catalog, through conformance mode.

``MINIBERT_MUTANT=name pytest --impl spec.mutation:mutant_impl`` runs the suite against the
reference with mutant ``name`` applied in memory (see :mod:`spec.mutants`): reading
``mutant_impl`` applies it, process-wide, and returns the ``reference`` package.  An empty
``MINIBERT_MUTANT`` gives the unmutated reference through the same path (the baseline).

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
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from spec.mutants import CATALOG, activate, applicability

ROOT = Path(__file__).resolve().parents[1]
IMPL_SPEC = "spec.mutation:mutant_impl"
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
    return importlib.import_module("reference")


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


def _read_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _env(mutant: str, profile: str | None, report: Path) -> dict:
    # not the variables of an enclosing pytest(-xdist) run: this is a fresh session
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_XDIST_", "PYTEST_CURRENT_TEST"))}
    env.update(MINIBERT_MUTANT=mutant, MINIBERT_IMPL=IMPL_SPEC, MINIBERT_REPORT=str(report),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if profile:
        env["MINIBERT_PROFILE"] = profile
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


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
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="minibert-mutant-") as tmp:
        report = Path(tmp) / "report.jsonl"
        cmd = [sys.executable, "-m", "pytest", *PYTEST_ARGS, "--impl", IMPL_SPEC, *extra_args,
               *ordered_test_files(tests)]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=_env(mutant, profile, report),
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return MutantResult(mutant, "timeout", f"(no result after {timeout:.0f} s)", "",
                                time.perf_counter() - start)
        records = _read_records(report)
    seconds = time.perf_counter() - start
    failed = [r for r in records if r["outcome"] == "failed"]
    if failed:
        return MutantResult(mutant, "killed", failed[0]["nodeid"], failed[0]["message"], seconds)
    if proc.returncode == 0:
        return MutantResult(mutant, "survived", "", f"{len(records)} tests passed or skipped",
                            seconds)
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
    return MutantResult(mutant, "error", "", f"pytest exit {proc.returncode}: " + " | ".join(tail),
                        seconds)


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
    results: dict[str, MutantResult] = {}
    runnable = []
    for name in names:
        reason = applicability(CATALOG[name])
        if reason:
            results[name] = MutantResult(name, "n/a", "", f"not applicable: {reason}")
            if on_result:
                on_result(results[name])
        else:
            runnable.append(name)

    def one(name):
        r = run_suite(name, tests, profile=profile, timeout=timeout)
        if on_result:
            on_result(r)
        return r

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for r in pool.map(one, runnable):
            results[r.name] = r
    return [results[n] for n in names]


def score(results: Sequence[MutantResult]) -> tuple[int, int]:
    """(detected, applicable): n/a mutants are not in the denominator; an error run is (as
    undetected: the suite could not show the bug)."""
    applicable = [r for r in results if r.status != "n/a"]
    return sum(r.detected for r in applicable), len(applicable)
