"""The thread and memory policy of every entry point (train, bench, audit timings, check).

Threads.  ``--threads N`` means N workers of ``minibert_reference.parallel`` (batch shards, tensor
groups), each running single-threaded BLAS.  OpenBLAS's own threads are never used: they
spin-wait between calls, so on a 2-core machine that is busy elsewhere 2 BLAS threads ran a
Mini-BERT step 5-7x *slower* than 1 (a descheduled partner stalls every matmul), and even on an
idle machine a spinning OpenBLAS thread holds the core another thread of the process needs.
Workers block while idle: under load they degrade to time-sharing, never to stalls.  The count
is set at run time (threadpoolctl for the BLAS, never environment variables after NumPy is
loaded) and recorded in checkpoints: shards are cut from the count, so a resumed run with the
same count is bit-exact.  ``auto`` = the cores this process may run on.

Memory.  A training step allocates and frees the same large arrays every time (16 MiB of
logits, 6 MiB gradients); glibc gives freed memory above its trim threshold back to the kernel,
and the next step pays a page fault per 4 KiB page again: 6,000 faults and ~17 ms per Mini-BERT
step on this 2-core VM, 0 once freed memory is kept (peak RSS unchanged, 175 MiB).
``keep_freed_memory()`` keeps it (mallopt; a no-op where glibc is absent).
"""

from __future__ import annotations

import ctypes
import ctypes.util
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


def choose(requested=AUTO) -> int:
    """The worker count to use: ``requested`` if it is a number, else the available cores
    (workers block when idle, so there is no count that a loaded machine punishes)."""
    requested = parse_threads(requested)
    return available_cores() if requested == AUTO else requested


@contextmanager
def use_threads(n: int):
    """Run the body with ``n`` workers (``minibert_reference.parallel``) and single-threaded BLAS,
    restoring both afterwards."""
    from threadpoolctl import threadpool_limits

    from minibert_reference import parallel

    with threadpool_limits(limits=1, user_api="blas"), parallel.workers(int(n)):
        yield int(n)


# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3


def keep_freed_memory() -> bool:
    """Tell glibc to keep freed memory for reuse instead of returning it to the kernel (and to
    serve allocations up to 32 MiB, its maximum, from that pool rather than fresh mappings).
    Process-wide, for every library in the process (torch's allocations too).  Returns False
    where it does not apply (no glibc)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, 32 << 20) == 1
    ok &= mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1
    ok &= mallopt(_M_TOP_PAD, 64 << 20) == 1
    return bool(ok)


MATMULS_PER_ROUND = 4  # products timed together per candidate and round


def probe(candidates=None, *, n: int = 512, k: int = 192, m: int = 768, rounds: int = 7,
          reduce=np.median) -> dict[int, float]:
    """Seconds (``reduce`` over the rounds: the median by default) of MATMULS_PER_ROUND
    [n, k] @ [k, m] float32 matmuls at each candidate *BLAS* thread count, the candidates
    alternating round by round so both see the same load: the machine's sgemm rate (the bench's
    FLOP floor), not the policy's workers.  About 10-50 ms in all at the default sizes."""
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
