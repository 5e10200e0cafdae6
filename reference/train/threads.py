"""BLAS thread policy for every entry point (train, bench, audit timings, check).

OpenBLAS threads spin-wait for each other: on a 2-core machine that is busy elsewhere, 2 BLAS
threads run a Mini-BERT step 5-7x *slower* than 1 (a descheduled partner stalls every matmul),
while on an idle machine 2 threads are ~1.3-1.5x faster.  No fixed count is right for both, so
``auto`` probes: it times a matmul of the step's size at each candidate count, alternating, and
keeps the fastest.  The count is then set with threadpoolctl (at run time, never by environment
variables after NumPy is loaded) and recorded in checkpoints, so a resumed run can use the same
count and stay bit-exact.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

import numpy as np

AUTO = "auto"


def parse_threads(value) -> int | str:
    """'auto' or a positive integer (the --threads flag)."""
    if value is None or value == AUTO:
        return AUTO
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if n < 1 or str(value).strip() != str(n):
        raise ValueError(f"--threads: expected 'auto' or a positive integer, got {value!r}")
    return n


def available_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


MATMULS_PER_ROUND = 4  # products timed together per candidate and round


def probe(candidates=None, *, n: int = 512, k: int = 192, m: int = 768, rounds: int = 7,
          reduce=np.median) -> dict[int, float]:
    """Seconds (``reduce`` over the rounds: the median by default) of MATMULS_PER_ROUND
    [n, k] @ [k, m] float32 matmuls (an FFN projection of a Mini-BERT step) at each candidate
    thread count, the candidates alternating round by round so both see the same load.  About
    10-50 ms in all at the default sizes."""
    from threadpoolctl import threadpool_limits

    candidates = sorted(set(candidates or range(1, available_cores() + 1)))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, k), dtype=np.float32)
    b = rng.standard_normal((k, m), dtype=np.float32)
    out = np.empty((n, m), dtype=np.float32)
    times: dict[int, list[float]] = {c: [] for c in candidates}
    for r in range(rounds + 1):
        for c in candidates:
            with threadpool_limits(limits=c, user_api="blas"):
                t0 = time.perf_counter()
                for _ in range(MATMULS_PER_ROUND):
                    np.matmul(a, b, out=out)
                if r:  # round 0 warms the thread pool up
                    times[c].append(time.perf_counter() - t0)
    return {c: float(reduce(t)) for c, t in times.items()}


def choose(requested=AUTO) -> int:
    """The thread count to use: ``requested`` if it is a number, else the probe's fastest (ties
    and near-ties -- within 10% -- go to fewer threads: less to lose when the load changes)."""
    requested = parse_threads(requested)
    if requested != AUTO:
        return requested
    timings = probe()
    best = min(timings.values())
    return min(c for c, t in timings.items() if t <= 1.1 * best)


@contextmanager
def blas_threads(n: int):
    """Run the body with ``n`` BLAS threads (threadpoolctl), restoring the previous count."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=int(n), user_api="blas"):
        yield int(n)
