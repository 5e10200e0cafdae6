"""How long a class takes (issue 31): ``minibert check --many`` over the 20 submissions of
tests/suite/many_submissions.py, serially and on a Dask ``LocalCluster`` of N workers, alternating
round by round, medians; and the time 300 submissions would take on W workers, projected from
the per-submission seconds measured.

    python tests/benchmarks/many_time.py [--rounds 3] [--workers 2] [--full] [-o report.json]

``--full``: every op and the PyTorch oracle (a submission = the reference re-exported, as a
correct student's would be; ~30 s each) instead of the two ops and no oracle of the tests.
The load average is printed before and after each run: a timing taken while the machine was
busy is said to be one.  Every run's table is compared with the first (minibert_spec.suite.many.
table_signature): a timing of runs that disagree is no timing.  A benchmark, never a test.
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

from minibert_spec.suite.many import table_signature  # noqa: E402
from tests.suite.many_submissions import ARGS, write_class  # noqa: E402

FULL_ARGS = ["-j", "1"]  # every op, the oracle on, one worker process per submission
FULL_CLASS = ["correct"] * 20


def load() -> float:
    return os.getloadavg()[0]


def run(where: Path, args: list[str], out: Path, cluster: str | None) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "minibert_spec.cli", "check", "--many", str(where), *args,
           "--format", "json", "-o", str(out)] + (["--cluster", cluster] if cluster else [])
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=7200,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    return time.perf_counter() - start, json.loads(out.read_text())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--full", action="store_true")
    p.add_argument("-o", "--output")
    a = p.parse_args(argv)
    args = FULL_ARGS if a.full else ARGS
    times: dict[str, list[float]] = {"serial": [], "cluster": []}
    loads = []
    first = None
    with tempfile.TemporaryDirectory() as tmp:
        subs = Path(tmp) / "subs"
        write_class(subs, FULL_CLASS) if a.full else write_class(subs)
        for r in range(a.rounds):
            order = ("serial", "cluster") if r % 2 == 0 else ("cluster", "serial")
            for how in order:
                before = load()
                seconds, table = run(subs, args, Path(tmp) / f"{how}{r}.json",
                                     f"local:{a.workers}" if how == "cluster" else None)
                loads.append((how, r, round(before, 2), round(load(), 2)))
                first = first or table_signature(table)
                agree = table_signature(table) == first
                times[how].append(seconds)
                print(f"round {r} {how}: {seconds:.1f} s (load {before:.2f} -> {load():.2f})"
                      + ("" if agree else "  TABLE DIFFERS: no timing"), flush=True)
                if not agree:
                    return 1
        per_submission = [i["seconds"] for i in table["implementations"]]
    n = len(per_submission)
    serial, cluster = statistics.median(times["serial"]), statistics.median(times["cluster"])
    each = serial / n  # wall seconds per submission, one at a time
    report = {"submissions": n, "args": args, "workers": a.workers,
              "serial_s": round(serial, 1), "cluster_s": round(cluster, 1),
              "speedup": round(serial / cluster, 2), "per_submission_s": round(each, 2),
              "loads": loads,
              # W workers each with a core of its own, the submissions dealt as they finish
              "projected_300_s": {w: round(300 * each / w, 0) for w in (1, 2, 8, 32)}}
    print(json.dumps(report, indent=1))
    if a.output:
        Path(a.output).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
