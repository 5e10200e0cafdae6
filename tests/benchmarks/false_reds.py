"""How often does the suite call a correct implementation wrong?  ``minibert check`` on
tests/examples/reexport.py (the reference's own ops re-exported) with N different seeds: every
failed check is a false red.

    python tests/benchmarks/false_reds.py --runs 50 [-k 'oracle'] [--max-examples 10]

Prints the failed checks of each run and the total; exits 1 if any run had a red."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("-k", "--match", default=r"^oracle\.")
    ap.add_argument("--max-examples", type=int, default=10)
    ap.add_argument("--impl", default="tests.examples.reexport")
    args = ap.parse_args()
    reds, checks = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.runs):
            out = Path(tmp) / f"run{seed}.json"
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "minibert_spec.cli", "check", args.impl,
                                   "-k",
                                   args.match, "--seed", str(seed), "--max-examples",
                                   str(args.max_examples), "--format", "json", "-o", str(out)],
                                  cwd=ROOT, capture_output=True, text=True)
            data = json.loads(out.read_text())
            failed = [r for r in data["results"] if r["outcome"] in ("failed", "error")]
            checks += len(data["results"])
            reds += failed
            print(f"seed {seed}: exit {proc.returncode}, {len(data['results'])} checks, "
                  f"{len(failed)} red, {time.perf_counter() - start:.0f} s", flush=True)
            for r in failed:
                print(f"  RED {r['id']}: {r['message'].splitlines()[0][:200]}", flush=True)
    print(f"{args.runs} runs, {checks} check runs, {len(reds)} false reds")
    return 1 if reds else 0


if __name__ == "__main__":
    sys.exit(main())
