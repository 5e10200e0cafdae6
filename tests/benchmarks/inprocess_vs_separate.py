"""Is the in-process distortion gone?  Times the reference and torch eager both ways in the same
period, the two harnesses alternating round by round:

- in-process: the old ``minibert bench`` harness -- one fresh process holding both sides (the
  sgemm probe at 1 and N BLAS threads first, then ``use_threads(N)`` + ``torch.set_num_threads
  (N)``), ours and torch alternating call by call;
- separate: ``minibert_spec.benchproc`` -- each side alone in its own fresh process, alternating.

Prints, per thread count and row, the median over rounds of each harness's per-process median
for each side, with the load average before each round.  On demand, never in the test suite:

    python tests/benchmarks/inprocess_vs_separate.py --rounds 5 --threads 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

IN_PROCESS = """
import json, sys
import numpy as np
import torch
from minibert_reference import init_params
from minibert_reference.config import PRESETS
from minibert_reference.train.threads import keep_freed_memory, use_threads
from minibert_spec.bench import alternate_raw, load_torch_side, problem, reference_side,
sgemm_gflops from minibert_spec.bench import torch_side
job = json.loads(sys.argv[1])
n = job["threads"]
keep_freed_memory()
for k in sorted({1, n}):  # the old harness probed first, in the same process
    sgemm_gflops(k, with_median=True)
config = PRESETS["mini_bert"]()
ids, labels, mask = problem(config, job["batch"], job["seq"], 0)
module, _ = load_torch_side()
out = {}
with use_threads(n):
    torch.set_num_threads(n)
    params = init_params(config, seed=0, dtype=np.float32)
    ours = reference_side(config, params, ids, labels, mask)
    theirs = torch_side(module, torch, config, params, ids, labels, mask)
    for key in job["keys"]:
        before = ({"ours": ours["_before_backward"], "torch": theirs["_before_backward"]}
                  if key == "backward" else {})
        t = alternate_raw({"ours": ours[key], "torch": theirs[key]}, repeats=job["repeats"],
                          warmup=job["warmup"], before=before)
        out[key] = {s: float(np.median(v)) * 1e3 for s, v in t.items()}
print(json.dumps(out))
"""


def in_process(job: dict) -> dict:
    res = subprocess.run([sys.executable, "-c", IN_PROCESS, json.dumps(job)], cwd=ROOT,
                         capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(f"in-process child failed: {res.stderr.strip().splitlines()[-1]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def separate(job: dict) -> dict:
    from minibert_spec.bench import BENCH_TASK
    from minibert_spec.benchproc import run_child

    out: dict = {}
    for side in ("ours", "torch"):
        data = run_child({**job, "task": BENCH_TASK, "preset": "mini_bert", "seed": 0,
                          "side": side, "check": False})
        for key, times in data["times"].items():
            out.setdefault(key, {})[side] = float(np.median(times)) * 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--keys", nargs="+", default=["step_full", "forward", "backward"])
    args = ap.parse_args()
    got: dict = {}
    loads = []
    for r in range(args.rounds):
        for n in args.threads:
            job = {"threads": n, "batch": 8, "seq": 64, "keys": args.keys,
                   "repeats": args.repeats, "warmup": args.warmup}
            # alternate which harness goes first from round to round
            order = (("in-process", in_process), ("separate", separate))
            for name, fn in (order if r % 2 == 0 else order[::-1]):
                loads.append(os.getloadavg()[0])
                for key, sides in fn(job).items():
                    for side, ms in sides.items():
                        got.setdefault((n, key, name, side), []).append(ms)
        print(f"round {r + 1}/{args.rounds} done, load {os.getloadavg()[0]:.2f}",
              file=sys.stderr, flush=True)
    print(f"load average before each harness run: min {min(loads):.2f}, median "
          f"{np.median(loads):.2f}, max {max(loads):.2f}; {args.rounds} rounds, "
          f"{args.repeats} calls per process")
    print(f"{'thr':>3} {'row':12} {'harness':11} {'ours ms':>8} {'torch ms':>9} {'ratio':>6}")
    for n in args.threads:
        for key in args.keys:
            for name in ("in-process", "separate"):
                o = float(np.median(got[(n, key, name, "ours")]))
                t = float(np.median(got[(n, key, name, "torch")]))
                print(f"{n:>3} {key:12} {name:11} {o:8.1f} {t:9.1f} {o / t:6.2f}")


if __name__ == "__main__":
    main()
