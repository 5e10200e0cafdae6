"""Measure ``minibert_spec.claims.timing.TORCH_REFERENCE_MS`` on this machine: torch eager's medians
for the timing claims' forward + loss, backward and step (the visual guide's model and batch), at 1
and 2 threads, with the claims' own harness (each side alone in its own process, alternating with
the reference's, every process self-checked).  A run that fails its self-check prints the
reasons and exits 1 instead of figures.  On demand, on the reference machine, idle:

    python tests/benchmarks/torch_yardstick.py --rounds 7
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def main() -> int:
    from minibert_reference.train.threads import available_cores
    from minibert_spec.bench import load_average, step_gflop
    from minibert_spec.benchproc import check_processes, python_path, run_rounds, stats_of
    from minibert_spec.claims import Context
    from minibert_spec.claims.timing import CLAIM_CALLS, CLAIM_KEYS, CLAIMS_TASK

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    import minibert_reference

    ctx = Context(minibert_reference)
    job = {"task": CLAIMS_TASK, "impl": "minibert_reference", "smoke": False,
           "keys": list(CLAIM_KEYS), "repeats": CLAIM_CALLS, "warmup": 1, "check": True,
           "sys_path": python_path()}
    load = load_average()
    procs = run_rounds(job, sides=("ours", "torch"), threads=args.threads, rounds=args.rounds,
                       progress=lambda w: print(w, file=sys.stderr, flush=True))
    problems = check_processes(procs, cores=available_cores(),
                               gflop=step_gflop(ctx.config, ctx.B, ctx.T))
    print(f"load average {load:.2f} before, {load_average():.2f} after; {args.rounds} rounds")
    for n in args.threads:
        row = {k: round(stats_of(procs, "torch", n, k).median_ms, 1) for k in CLAIM_KEYS}
        ours = {k: round(stats_of(procs, "ours", n, k).median_ms, 1) for k in CLAIM_KEYS}
        print(f"{n}: torch {row}  (reference {ours})")
    if problems:
        print("SELF-CHECK FAILED:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
