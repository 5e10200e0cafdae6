"""``minibert bench --verdict [IMPL ...]``: what a verdict costs -- ``minibert check IMPL`` warm and
cold (``XDG_CACHE_HOME`` an empty directory: a fresh machine, as a CI runner without a restored
cache) and its first red (``--first-red``), and optionally ``pytest`` on the user's own test
file, each run in a fresh process, the cases alternating process by process, medians over rounds.

Per case: the wall time (median, p10-p90 over rounds) and, from the check's JSON report, the
pool's own seconds and each kind's check seconds (summed over the workers: the CPU a kind costs,
not wall time); the wall time less the pool's is the start-up (the process, the fork server,
loading the implementation).  Every verdict of a case is compared across its rounds
(:mod:`minibert_spec.suite.compare`): a timing of runs that disagree is no timing, and says so.

A benchmark, never a test.  It checks itself as ``minibert bench`` does
(:func:`minibert_spec.bench.plausibility`): a load average above the core count before or after the
run (its own workers counted out) says the machine was busy -- the report lists why, judges no
target, and the exit status is 1 unless ``--allow-noisy``.  ``tests/benchmarks/verdict_time.py``
runs the project's own cases (the reference, the broken and real-style examples, the wheel
test's ten-line pytest file) through the same functions.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

WORKERS = 2  # minibert check's default worker count: the threads a run adds to the load
# the exit statuses of a run that reached a verdict (minibert check and pytest alike: 0 green,
# 1 red); any other -- could not load the implementation, a usage error, no tests -- is a run
# that timed nothing worth a figure
VERDICT_EXITS = {"0", "1"}
# the targets (issue 29), seconds: a whole check of the reference, a first red, a
# user's pytest file over the whole suite
TARGET_REFERENCE_S = 10.0
# issue 40: the reference's check on a fresh machine (CI runners: a cold cache every push)
TARGET_REFERENCE_COLD_S = 12.0
TARGET_FIRST_RED_S = 5.0
TARGET_PYTEST_S = 15.0


@dataclass(frozen=True)
class Case:
    """One timed command: ``argv`` run in ``cwd`` with ``env`` added; ``report``: it is a
    ``minibert check`` that writes its JSON report where ``-o`` says (appended per round).
    ``cache``: the ``XDG_CACHE_HOME`` each round gets -- "cold", an empty directory of its own
    (a fresh machine: the cache directory removed first); "warm", one directory the case
    shares across rounds, filled by an untimed run before the first; "user", the caller's."""

    argv: tuple[str, ...]
    what: str
    target_s: float | None = None
    cwd: str | None = None
    env: dict = field(default_factory=dict)
    report: bool = True
    cache: str = "user"

    def __post_init__(self):
        if self.cache not in CACHES:
            raise ValueError(f"cache: expected one of {CACHES}, got {self.cache!r}")


CACHES = ("user", "cold", "warm")


def check_case(impl: str, *extra: str, target_s: float | None = None, what: str = "",
               cwd: str | None = None, cache: str = "user") -> Case:
    """``minibert check IMPL EXTRA... --format json`` as a case (run as ``python -m
    minibert_spec.cli``: the interpreter of this run, installed or not)."""
    argv = (sys.executable, "-m", "minibert_spec.cli", "check", impl, *extra, "--format", "json")
    return Case(argv, what or " ".join(("minibert check", impl, *extra)), target_s, cwd,
                cache=cache)


def pytest_case(test_file: str | os.PathLike, *, env: dict | None = None,
                target_s: float | None = TARGET_PYTEST_S, what: str = "") -> Case:
    """``pytest -q TEST_FILE`` from the file's own directory (the user's session: their
    conftest, their rootdir)."""
    path = Path(test_file).resolve()
    return Case((sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path.name),
                what or f"pytest {path.name}", target_s, str(path.parent), dict(env or {}),
                report=False)


def user_cases(impls, test_file=None) -> dict[str, Case]:
    """The cases of ``minibert bench --verdict``: per implementation its whole check warm and
    cold (:class:`Case`'s ``cache``) and its first red; the user's pytest file, if given.
    Targets where the issues set one: the reference's whole check warm and cold, every first
    red, the pytest file."""
    if not impls:
        raise ValueError("--verdict: expected at least one implementation (package.module"
                         "[:object]), got none")
    if test_file is not None and not Path(test_file).is_file():
        raise ValueError(f"--pytest-file: expected a test file, got {str(test_file)!r} "
                         "(no such file)")
    cases = {}
    for impl in impls:
        ref = impl == "minibert_reference"
        cases[f"{impl} (warm)"] = check_case(impl, target_s=TARGET_REFERENCE_S if ref else None,
                                             what=f"minibert check {impl}, warm cache",
                                             cache="warm")
        cases[f"{impl} (cold)"] = check_case(impl, target_s=TARGET_REFERENCE_COLD_S if ref
                                             else None, cache="cold",
                                             what=f"minibert check {impl}, cold: no cache")
        cases[f"{impl} --first-red"] = check_case(impl, "--first-red", cache="warm",
                                                  target_s=TARGET_FIRST_RED_S)
    if test_file is not None:
        cases[f"pytest {Path(test_file).name}"] = pytest_case(test_file)
    return cases


def cache_home(case: Case, out_dir: Path) -> str | None:
    """The ``XDG_CACHE_HOME`` of one run of ``case`` (None: the caller's): a cold run's is a
    directory no run has used; a warm case's is its own, kept across its rounds."""
    if case.cache == "cold":
        return tempfile.mkdtemp(prefix="cold-cache-", dir=out_dir)
    if case.cache == "warm":
        path = out_dir / f"warm-cache-{abs(hash(case.argv)):x}"
        path.mkdir(exist_ok=True)
        return str(path)
    return None


def run_case(case: Case, out_dir: Path, timeout: float = 900) -> dict:
    """One run of ``case`` in a fresh process: wall seconds, exit status and, for a check, its
    pool seconds, seconds by kind, counts and report."""
    argv = list(case.argv)
    report = None
    if case.report:
        report = out_dir / f"report-{time.monotonic_ns()}.json"
        argv += ["-o", str(report)]
    env = {**os.environ, **case.env}
    home = cache_home(case, out_dir)
    if home is not None:
        env["XDG_CACHE_HOME"] = home
    start = time.perf_counter()
    try:
        proc = subprocess.run(argv, cwd=case.cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"wall_s": time.perf_counter() - start, "exit": "timeout",
                "summary": f"no result after {timeout:.0f} s"}
    row = {"wall_s": time.perf_counter() - start, "exit": proc.returncode}
    if report is not None and report.exists():
        data = json.loads(report.read_text(encoding="utf-8"))
        kinds: dict[str, float] = {}
        for r in data["results"]:
            kinds[r["kind"]] = kinds.get(r["kind"], 0.0) + r["seconds"]
        row.update(run_s=data["seconds"], kinds=kinds, counts=data["counts"], report=data)
    else:
        lines = proc.stdout.strip().splitlines()
        row["summary"] = lines[-1] if lines else proc.stderr.strip()[-300:]
    return row


def unreachable(impls, timeout: float = 900) -> str | None:
    """Why one of ``impls`` cannot be checked -- it does not import, exits, hangs, provides
    nothing, or torch is required and missing --, found by its quick first-red run (a
    ``minibert check`` like the timed ones, on its fixed examples alone): said before anything
    is timed, one line; None when every one reaches a verdict."""
    with tempfile.TemporaryDirectory(prefix="minibert-verdict-") as tmp:
        for impl in impls:
            row = run_case(check_case(impl, "--quick", "--first-red"), Path(tmp), timeout)
            if str(row["exit"]) not in VERDICT_EXITS:
                said = (row.get("summary") or row.get("report", {}).get("summary")
                        or "no report").strip().splitlines()
                return (f"--verdict {impl}: cannot be checked, nothing timed (its quick run: "
                        f"exit {row['exit']}: {said[-1] if said else 'no report'})")
    return None


def _stats(values) -> dict:
    values = sorted(values)

    def pick(q):
        return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]

    return {"median": statistics.median(values), "p10": pick(0.1), "p90": pick(0.9),
            "n": len(values)}


def summarize(case: Case, runs: list[dict]) -> tuple[dict, list[str]]:
    """A case's entry of the report from its rounds, and its problems (verdicts that differ
    between rounds, a round that timed out)."""
    from minibert_spec.suite.compare import compare

    problems = []
    entry = {"what": case.what, "target_s": case.target_s,
             "wall_s": _stats([r["wall_s"] for r in runs]),
             "exit": sorted({str(r["exit"]) for r in runs})}
    reports = [r["report"] for r in runs if "report" in r]
    if reports:
        entry["run_s"] = _stats([r["run_s"] for r in runs if "run_s" in r])
        entry["startup_s"] = statistics.median(r["wall_s"] - r["run_s"] for r in runs
                                               if "run_s" in r)
        kinds = sorted({k for r in runs for k in r.get("kinds", {})})
        entry["kind_s"] = {k: statistics.median(r["kinds"].get(k, 0.0) for r in runs
                                                if "kinds" in r) for k in kinds}
        entry["counts"] = reports[-1]["counts"]
        differ = [d for rep in reports[1:] for d in compare(reports[0], rep)]
        if differ:
            entry["verdicts_differ"] = differ[:10]
            problems.append(f"{case.what}: the verdicts differ between rounds ({differ[0]})")
    if "--first-red" in case.argv and entry["exit"] == ["0"]:
        # no red to find: the run went through every check, so a first-red target is moot
        entry["target_s"] = None
        entry["summary"] = "no red: --first-red ran every check (its target is for a red)"
    if len(reports) != len(runs):
        entry["summary"] = next((r["summary"] for r in runs if "summary" in r), "")
    if "timeout" in entry["exit"]:
        problems.append(f"{case.what}: a round gave no result ({entry['summary']})")
    elif set(entry["exit"]) - VERDICT_EXITS:  # no verdict was reached: nothing to time
        problems.append(f"{case.what}: a round ran to no verdict (exit "
                        f"{', '.join(sorted(set(entry['exit']) - VERDICT_EXITS))}: "
                        f"{entry.get('summary') or 'no report'})")
    return entry, problems


def measure(cases: dict[str, Case], rounds: int, *, progress=None) -> dict:
    """Every case ``rounds`` times, alternating process by process; the self-check's problems
    (busy machine, verdicts that differ) in ``problems``."""
    from minibert_reference.train.threads import available_cores
    from minibert_spec.bench import load_average, plausibility

    if rounds < 1:
        raise ValueError(f"--rounds: expected an integer >= 1, got {rounds}")
    said = progress or (lambda line: None)
    cores = available_cores()
    result = {"cores": cores, "rounds": rounds, "load": {"before": load_average()},
              "cases": {}, "problems": []}
    runs: dict[str, list[dict]] = {name: [] for name in cases}
    with tempfile.TemporaryDirectory(prefix="minibert-verdict-") as tmp:
        for case in cases.values():  # a warm case's cache, filled by a run not timed
            if case.cache == "warm":
                said(f"warming the cache: {case.what}")
                run_case(case, Path(tmp))
        for k in range(rounds):
            for name, case in cases.items():  # alternating: one process per case per round
                said(f"round {k + 1}/{rounds}: {case.what}")
                runs[name].append(run_case(case, Path(tmp)))
    result["load"]["after"] = load_average()
    result["busy"] = plausibility(
        cores=cores, load_before=result["load"]["before"], load_after=result["load"]["after"],
        own_threads=WORKERS, sgemm={}, sgemm_median={}, floors={})
    result["problems"] = list(result["busy"])
    for name, case in cases.items():
        entry, problems = summarize(case, runs[name])
        result["cases"][name] = entry
        result["problems"] += problems
    return result


def render(result: dict) -> str:
    load = ", ".join(f"{k} {v:.2f}" for k, v in result["load"].items() if v is not None)
    lines = [f"verdict time: medians over {result['rounds']} round(s), each case a fresh "
             f"process, the cases alternating; cores {result['cores']}; load average {load}"]
    if result["problems"]:
        lines.append("SELF-CHECK FAILED: these timings measure a busy machine or runs that "
                     "disagree, not the code; no target is judged:")
        lines += [f"  - {p}" for p in result["problems"]]
    width = max([28] + [len(n) + 1 for n in result["cases"]])
    for name, e in result["cases"].items():
        w, target = e["wall_s"], e["target_s"]
        judged = ("not judged" if result["problems"] else
                  "met" if target is not None and w["median"] <= target else "NOT met")
        verdict = "" if target is None else f" (target <= {target:g} s: {judged})"
        lines.append(f"{name:{width}} {w['median']:6.1f} s wall ({w['p10']:.1f}-{w['p90']:.1f}), "
                     f"exit {', '.join(e['exit'])}{verdict}")
        if "kind_s" in e:
            kinds = ", ".join(f"{k} {v:.1f}" for k, v in e["kind_s"].items())
            lines.append(f"{'':{width}} start-up {e['startup_s']:.1f} s, pool "
                         f"{e['run_s']['median']:.1f} s; check seconds by kind (summed over "
                         f"workers): {kinds}; {e['counts']}")
        if e.get("summary"):
            lines.append(f"{'':{width}} {e['summary']}")
    return "\n".join(lines)


def exit_status(result: dict, allow_noisy: bool = False) -> tuple[int, str]:
    """(exit status, the reason when not 0): 1 when a case reached no verdict, its rounds
    disagree or a round gave no result -- always; 1 when the machine was busy, unless
    ``allow_noisy`` (the timings are then reported, no target judged)."""
    own = [p for p in result["problems"] if p not in result.get("busy", ())]
    if own:
        return 1, f"{own[0]}" + (f"; {len(own) - 1} more" if len(own) > 1 else "")
    if result.get("busy") and not allow_noisy:
        return 1, (f"{result['busy'][0]}: rerun on an idle machine, or pass --allow-noisy")
    return 0, ""
