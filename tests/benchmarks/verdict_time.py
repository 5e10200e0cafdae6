"""How long a verdict takes (issue 29): ``minibert check`` on the reference and on buggy
implementations, its first red with ``--first-red``, and a user's ten-line pytest file with
``parametrize_with_checks`` (tests/wheel_user_repo.py's file and modules), each run in a fresh
process, the cases alternating process by process, medians over rounds.

    python tests/benchmarks/verdict_time.py [--rounds 5] [--cases reference first_red ...]
                                            [-o report.json] [--allow-noisy]

Per case: the wall time (median, p10-p90 over rounds) and, from ``--format json``, the
breakdown by phase: start-up (the process, the fork server, loading the implementation: the
wall time of a run of one fixed-seed check, case ``startup``) and each kind's check seconds
(summed over the workers: the CPU a kind costs, not wall time).  Every verdict of a case is
compared across its rounds (tests/benchmarks/compare_verdicts.py): a timing of runs that
disagree is no timing.

A benchmark, never a test.  It checks itself as ``minibert bench`` does
(``spec.bench.plausibility``): a load average above the core count before or after the run
(its own two workers counted out) says the machine was busy -- the report lists why, judges
no target, and the exit status is 1 unless --allow-noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from spec.suite.compare import compare  # noqa: E402

WORKERS = 2  # minibert check's default: the threads this benchmark adds to the load


def _check(impl, *extra):
    return ["minibert", "check", impl, "--format", "json", *extra]


# name -> (argv (or "pytest:<module>"), target seconds or None, what it is)
CASES = {
    "startup": (_check("reference", "-k", r"^fd\[relu\.example\]$"), None,
                "one fixed-seed check: the process, the fork server, loading the reference"),
    "reference": (_check("reference"), 10.0, "minibert check reference, oracle on"),
    "broken": (_check("tests.examples.broken_impl"), None,
               "minibert check tests.examples.broken_impl (every check)"),
    "first_red": (_check("tests.examples.broken_impl", "--first-red"), 5.0,
                  "minibert check tests.examples.broken_impl --first-red"),
    "realstyle_tutorial": (_check("tests.examples.realstyle_tutorial"), 20.0,
                           "minibert check tests.examples.realstyle_tutorial"),
    "realstyle_minigpt": (_check("tests.examples.realstyle_minigpt"), 20.0,
                          "minibert check tests.examples.realstyle_minigpt"),
    "realstyle_numpy_transformer": (_check("tests.examples.realstyle_numpy_transformer"), 20.0,
                                    "minibert check tests.examples.realstyle_numpy_transformer"),
    "pytest_fixed": ("pytest:mybert_fixed", 15.0,
                     "pytest on the user's ten-line file, a correct module"),
    "pytest_buggy": ("pytest:mybert_buggy", 15.0,
                     "pytest on the user's ten-line file, LayerNorm's gamma outside"),
}
DEFAULT_CASES = ("startup", "reference", "first_red", "broken", "pytest_fixed", "pytest_buggy")


def user_repo(where: Path) -> Path:
    """The user's repository of tests/wheel_user_repo.py: two modules and the ten-line file."""
    from tests.wheel_user_repo import BUG, IMPL, TEST_FILE

    (where / "mybert_fixed.py").write_text(IMPL)
    (where / "mybert_buggy.py").write_text(IMPL.replace(*BUG))
    (where / "test_mybert.py").write_text(TEST_FILE)
    return where


def run_case(name: str, repo: Path, out_dir: Path) -> dict:
    argv, _, _ = CASES[name]
    env = dict(os.environ)
    bin_dir = Path(sys.executable).parent
    if isinstance(argv, str):  # pytest on the user's file, from the user's directory
        env["MYBERT"] = argv.split(":", 1)[1]
        cmd, cwd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "test_mybert.py"], repo
        report = None
    else:
        report = out_dir / f"{name}-{time.monotonic_ns()}.json"
        cmd, cwd = [str(bin_dir / argv[0]), *argv[1:], "-o", str(report)], ROOT
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - start
    row = {"case": name, "wall_s": wall, "exit": proc.returncode}
    if report is not None and report.exists():
        data = json.loads(report.read_text())
        kinds: dict[str, float] = {}
        for r in data["results"]:
            kinds[r["kind"]] = kinds.get(r["kind"], 0.0) + r["seconds"]
        row.update(run_s=data["seconds"], kinds=kinds, counts=data["counts"], report=data)
    else:
        tail = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
        row["summary"] = tail[0] if tail else proc.stderr.strip()[-300:]
    return row


def _stats(values):
    values = sorted(values)

    def pick(q):
        return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]

    return {"median": statistics.median(values), "p10": pick(0.1), "p90": pick(0.9),
            "n": len(values)}


def measure(cases, rounds: int) -> dict:
    from reference.train.threads import available_cores
    from spec.bench import load_average, plausibility

    cores = available_cores()
    result = {"cores": cores, "rounds": rounds, "load": {"before": load_average()},
              "cases": {}, "problems": []}
    rows: dict[str, list[dict]] = {c: [] for c in cases}
    with tempfile.TemporaryDirectory(prefix="verdict-time-") as tmp:
        repo = user_repo(Path(tmp))
        for _ in range(rounds):
            for name in cases:  # alternating: one process per case per round
                rows[name].append(run_case(name, repo, Path(tmp)))
    result["load"]["after"] = load_average()
    result["problems"] = plausibility(
        cores=cores, load_before=result["load"]["before"], load_after=result["load"]["after"],
        own_threads=WORKERS, sgemm={}, sgemm_median={}, floors={})
    for name, runs in rows.items():
        entry = {"what": CASES[name][2], "target_s": CASES[name][1],
                 "wall_s": _stats([r["wall_s"] for r in runs]),
                 "exit": sorted({r["exit"] for r in runs})}
        reports = [r["report"] for r in runs if "report" in r]
        if reports:
            entry["run_s"] = _stats([r["run_s"] for r in runs])
            kinds = sorted({k for r in runs for k in r["kinds"]})
            entry["kind_s"] = {k: statistics.median(r["kinds"].get(k, 0.0) for r in runs)
                               for k in kinds}
            entry["counts"] = runs[-1]["counts"]
            differ = [d for r in reports[1:] for d in compare(reports[0], r)]
            if differ:
                entry["verdicts_differ"] = differ[:10]
                result["problems"].append(f"{name}: the verdicts differ between rounds "
                                          f"({differ[0]})")
        else:
            entry["summary"] = runs[-1].get("summary", "")
        result["cases"][name] = entry
    return result


def render(result: dict) -> str:
    load = ", ".join(f"{k} {v:.2f}" for k, v in result["load"].items() if v is not None)
    lines = [f"verdict time: medians over {result['rounds']} round(s), each case a fresh process, "
             f"the cases alternating; cores {result['cores']}; load average {load}"]
    if result["problems"]:
        lines.append("SELF-CHECK FAILED: these timings measure a busy machine, not the code; "
                     "no target is judged:")
        lines += [f"  - {p}" for p in result["problems"]]
    for name, e in result["cases"].items():
        w = e["wall_s"]
        target = e["target_s"]
        judged = ("not judged" if result["problems"] else
                  "met" if target is not None and w["median"] <= target else "NOT met")
        verdict = "" if target is None else f" (target <= {target:g} s: {judged})"
        lines.append(f"{name:28} {w['median']:6.1f} s wall ({w['p10']:.1f}-{w['p90']:.1f}), "
                     f"exit {e['exit']}{verdict}")
        lines.append(f"{'':28} {e['what']}")
        if "kind_s" in e:
            kinds = ", ".join(f"{k} {v:.1f}" for k, v in e["kind_s"].items())
            lines.append(f"{'':28} pool {e['run_s']['median']:.1f} s; check seconds by kind "
                         f"(summed over workers): {kinds}; {e['counts']}")
        elif e.get("summary"):
            lines.append(f"{'':28} {e['summary']}")
    start = result["cases"].get("startup")
    if start:
        lines.append(f"start-up (the 'startup' case): {start['wall_s']['median']:.1f} s of every "
                     "minibert check")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES), choices=list(CASES))
    p.add_argument("-o", "--output", help="also write the JSON here (atomically)")
    p.add_argument("--allow-noisy", action="store_true",
                   help="exit 0 even when the self-check finds the machine busy")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds: expected a positive integer, got {args.rounds}")
    result = measure(args.cases, args.rounds)
    for e in result["cases"].values():
        e.pop("report", None)
    print(render(result))
    if args.output:
        from reference.train.fileio import atomic_write

        atomic_write(args.output, json.dumps(result, indent=1) + "\n")
    return 1 if result["problems"] and not args.allow_noisy else 0


if __name__ == "__main__":
    sys.exit(main())
