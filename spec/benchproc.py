"""Each side of a timing alone in its own process: the harness of ``minibert bench`` and of the
claims ledger's timing claims.

Timing two libraries in one process distorts both: with NumPy's OpenBLAS threads and torch's
OpenMP pool side by side, torch's 2-thread Mini-BERT step measured 131 ms in-process and 66 ms
alone (the reference 78 vs 65).  So the parent never times anything: it starts one fresh
interpreter per side, thread count and round (``python -m minibert_spec.benchproc JOB``),
alternating the sides process by process, and takes medians over the rounds.  Each child sets
the same policy for its side (N cores: the reference's N workers with single-threaded BLAS,
torch's ``set_num_threads(N)``; freed memory kept by malloc in both), never loads the other
side's library, and checks itself (``minibert_spec.bench.plausibility``).  A job names the
function that builds each side's timed calls (``"task"``), so the harness imports neither the
CLI nor the claims ledger (the layers of pyproject.toml's ``[tool.importlinter]``).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from minibert_spec.bench import (
    Stats,
    alternate_raw,
    blas_info,
    child_lines,
    load_average,
    load_torch_side,
    plausibility,
    sgemm_gflops,
)
from minibert_spec.protocol import unwrap

SIDES = ("ours", "torch")
PROBE_ROUNDS = 7  # sgemm probe rounds per process (best and median, at 1 and N threads)


# ------------------------------------------------------------------------------ the parent
@dataclass
class Process:
    """What one child measured: ``times`` row key -> seconds of each timed call; ``sgemm``
    BLAS threads -> (best, median round) GFLOP/s of its own library's probe."""

    side: str
    threads: int
    round: int
    pid: int
    times: dict[str, list[float]]
    load_before: float | None = None
    load_after: float | None = None
    sgemm: dict[int, tuple[float, float]] = field(default_factory=dict)
    torch_loaded: bool = False  # whether torch was imported in this process
    info: dict = field(default_factory=dict)  # the BLAS in use, torch's thread count
    problems: list[str] = field(default_factory=list)  # its self-check (set by the parent)

    @classmethod
    def from_json(cls, data: dict, *, round: int) -> Process:
        return cls(side=data["side"], threads=int(data["threads"]), round=round,
                   pid=int(data["pid"]), times=data["times"],
                   load_before=data.get("load_before"), load_after=data.get("load_after"),
                   sgemm={int(k): tuple(v) for k, v in data.get("sgemm", {}).items()},
                   torch_loaded=bool(data.get("torch_loaded")), info=data.get("info", {}))

    @property
    def label(self) -> str:
        return (f"{self.side} process {self.round + 1} at {self.threads} thread(s) "
                f"(pid {self.pid})")

    def summary(self) -> dict:
        """The report's line for this process (its medians, not every call)."""
        return {"side": self.side, "threads": self.threads, "round": self.round,
                "pid": self.pid, "load_before": self.load_before, "load_after": self.load_after,
                "sgemm": {n: list(v) for n, v in self.sgemm.items()},
                "torch_loaded": self.torch_loaded, "info": self.info,
                "median_ms": {k: float(np.median(v)) * 1e3 for k, v in self.times.items()},
                "problems": self.problems}


def run_child(job: dict) -> dict:
    """Run one job in a fresh interpreter; its last stdout line is the result (JSON).  A child
    that fails raises a ValueError with its last error line."""
    lines = child_lines(["-m", "minibert_spec.benchproc", json.dumps(job)],
                        f" ({job.get('side')}, {job.get('threads')} thread(s))")
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise ValueError(f"benchmark child process ({job.get('side')}) printed no result: "
                         f"{(lines or ['nothing'])[-1][:200]!r}") from None


def run_rounds(job: dict, *, sides: tuple[str, ...], threads: list[int], rounds: int,
               runner: Callable[[dict], dict] | None = None, budget_s: float | None = None,
               progress: Callable[[str], object] | None = None) -> list[Process]:
    """``rounds`` rounds; in each, for each thread count, one process per side in turn (A B A
    B ...).  With ``budget_s``, rounds after the first are not started once that many seconds
    have passed (a loaded machine gets fewer rounds, never none).  ``runner`` (tests: fake
    processes) defaults to ``run_child``."""
    runner = runner or run_child
    start = time.perf_counter()
    out: list[Process] = []
    for r in range(rounds):
        if r and budget_s is not None and time.perf_counter() - start > budget_s:
            break
        for n in threads:
            for side in sides:
                if progress:
                    progress(f"round {r + 1}/{rounds}: {side}, {n} thread(s)")
                data = runner({**job, "side": side, "threads": int(n)})
                if data.get("side") != side or int(data.get("threads", -1)) != int(n):
                    raise ValueError(f"benchmark child answered for {data.get('side')!r} at "
                                     f"{data.get('threads')} thread(s), asked {side!r} at {n}")
                out.append(Process.from_json(data, round=r))
    return out


def stats_of(processes: list[Process], side: str, threads: int, key: str):
    """Stats over rounds: the median of the processes' medians, p10/p90 of those medians, n
    the timed calls in all; None when no process of that side timed ``key``."""
    runs = [p.times[key] for p in processes
            if p.side == side and p.threads == threads and p.times.get(key)]
    return Stats.of_rounds(runs) if runs else None


def check_processes(processes: list[Process], *, cores: int,
                    gflop: dict[str, float]) -> list[str]:
    """Each process's self-check (``minibert_spec.bench.plausibility`` over its own load averages,
    sgemm probe and rows against its FLOP floor), one line each, naming the process; sets
    ``Process.problems``.  The load before a process counts the run's own threads out when
    an earlier process of the run was running (the 1-minute average still holds them)."""
    out = []
    for i, p in enumerate(processes):
        rate = p.sgemm.get(p.threads, (None,))[0]
        floors = {}
        if rate:
            for key, g in gflop.items():
                if g and p.times.get(key):
                    floors[key] = float(np.median(p.times[key])) / (g / rate)
        p.problems = plausibility(
            cores=cores, load_before=p.load_before, load_after=p.load_after,
            own_threads=p.threads, own_before=p.threads if i else 0,
            sgemm={n: v[0] for n, v in p.sgemm.items()},
            sgemm_median={n: v[1] for n, v in p.sgemm.items()}, floors=floors)
        out += [f"{p.label}: {problem}" for problem in p.problems]
    return out


def median_sgemm(processes: list[Process], side: str) -> tuple[dict[int, float], dict]:
    """(best, median-round) sgemm GFLOP/s by BLAS threads: medians over ``side``'s processes."""
    by: dict[int, list[tuple[float, float]]] = {}
    for p in processes:
        if p.side == side:
            for n, v in p.sgemm.items():
                by.setdefault(n, []).append(v)
    return ({n: float(np.median([b for b, _ in v])) for n, v in sorted(by.items())},
            {n: float(np.median([m for _, m in v])) for n, v in sorted(by.items())})


def impl_spec(impl) -> str | None:
    """``package.module[:object]`` a child process imports the implementation by: a module's
    name, or the module-level name an object is bound to; None when it has neither."""
    obj = unwrap(impl)
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    module = sys.modules.get(getattr(type(obj), "__module__", "") or "")
    for name, value in (vars(module).items() if module else ()):
        if value is obj and not name.startswith("_"):
            return f"{module.__name__}:{name}"
    return None


def python_path() -> list[str]:
    """The parent's import path, for a child that imports the implementation under test."""
    return [p or os.getcwd() for p in sys.path]


# ------------------------------------------------------------------------------ the child
def _side_fns(job: dict, side: str):
    """(fns, before) of ``side``: key -> timed callable, key -> untimed callable run right
    before each timed call; built by the function the job's ``task`` names
    (``package.module:function``, called with the job and the side: ``minibert_spec.bench.
    BENCH_TASK``, ``minibert_spec.claims.timing.CLAIMS_TASK``)."""
    task = job.get("task")
    module, _, name = task.partition(":") if isinstance(task, str) else ("", "", "")
    if not module or not name:
        raise ValueError(f"task: expected 'package.module:function' building a side's timed "
                         f"calls, got {task!r}")
    build = getattr(importlib.import_module(module), name, None)
    if not callable(build):
        raise ValueError(f"task: {module!r} has no function {name!r}")
    return build(job, side)


def run_job(job: dict) -> dict:
    """Time one side in this process under its thread policy; the result as a dict."""
    from threadpoolctl import threadpool_limits

    from minibert_reference.train.threads import keep_freed_memory, use_threads

    side, n = job["side"], int(job["threads"])
    if side not in SIDES:
        raise ValueError(f"side: expected one of {SIDES}, got {side!r}")
    keep_freed_memory()  # both sides: the allocator policy is the process's, not a library's
    check = bool(job.get("check", True))
    load_before = load_average()
    info: dict = {}
    if side == "ours":
        sgemm = ({k: sgemm_gflops(k, repeats=PROBE_ROUNDS, with_median=True)
                  for k in sorted({1, n})} if check else {})
        with use_threads(n):  # N workers, single-threaded BLAS
            fns, before = _side_fns(job, side)
            times = alternate_raw(fns, repeats=job["repeats"], warmup=job["warmup"],
                                  before=before)
            info["blas"] = blas_info()
    else:
        # NumPy's BLAS at one thread and idle: only torch's pool runs in this process
        with threadpool_limits(limits=1, user_api="blas"):
            import torch

            module, note = load_torch_side()
            if module is None:
                raise RuntimeError(note)
            sgemm = ({k: module.sgemm_gflops(k, repeats=PROBE_ROUNDS)
                      for k in sorted({1, n})} if check else {})
            torch.set_num_threads(n)
            fns, before = _side_fns(job, side)
            times = alternate_raw(fns, repeats=job["repeats"], warmup=job["warmup"],
                                  before=before)
            info["torch_threads"] = torch.get_num_threads()
            info["blas"] = blas_info()
    return {"side": side, "threads": n, "pid": os.getpid(), "times": times,
            "load_before": load_before, "load_after": load_average(),
            "sgemm": {k: list(v) for k, v in sgemm.items()},
            "torch_loaded": "torch" in sys.modules, "info": info}


def main(argv: list[str]) -> int:
    job = json.loads(argv[0])
    for p in reversed(job.get("sys_path", [])):
        if p not in sys.path:
            sys.path.insert(0, p)
    result = run_job(job)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
