"""``minibert check``'s runner: the selected checks spread over worker processes
(spec.suite.worker), each example of a check time-limited twice -- inside the worker (SIGALRM:
the check fails, the worker goes on) and from here (a worker that gives no sign of life within
the limit plus GRACE_SECONDS, a hang inside C code, is killed and replaced) -- and a whole-run
bound.

Anything the implementation can do to a process ends as a red cell, never as a hang or a pass:
``os._exit``, a segfault, an infinite loop in C, memory exhaustion killed by the kernel.  The
process that died is replaced and the remaining checks run; the check it was running fails
with how it ended.  Workers run in a temporary directory (nothing the implementation writes
lands in the caller's), with the caller's directory and the implementation's home appended to
``sys.path`` after the standard library (a scratch ``concurrent.py`` there shadows nothing),
single-threaded BLAS, no Hypothesis database, no bytecode.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

from spec.paths import HOME
from spec.suite.registry import Check
from spec.suite.report import CheckReport
from spec.suite.run import DEFAULT_TIMEOUT, Result

GRACE_SECONDS = 15.0  # beyond a check's own limit before its worker is killed
DEFAULT_TOTAL_TIMEOUT = 900.0  # the whole run, seconds
MAX_RESTARTS = 25  # workers replaced after a crash or a hang before the run gives up
LOAD_SECONDS = 120.0  # a worker must load the implementation within this


class _Worker:
    def __init__(self, job: dict, env: dict, cwd: str, log_dir: str, n: int):
        r, w = os.pipe()
        self.log_path = Path(log_dir) / f"worker-{n}.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "spec.suite.worker"], stdin=subprocess.PIPE,
            stdout=self.log, stderr=subprocess.STDOUT, pass_fds=(w,), cwd=cwd, env=env,
            start_new_session=True)
        os.close(w)
        self.results = os.fdopen(r, "r", encoding="utf-8")
        self.buffer = ""
        self.proc.stdin.write((json.dumps({**job, "fd": w}) + "\n").encode())
        self.proc.stdin.flush()
        self.loaded = False
        self.check: Check | None = None  # the check in flight
        self.since = time.monotonic()

    def send(self, check: Check, hung: dict) -> None:
        self.check, self.since = check, time.monotonic()
        self.proc.stdin.write((json.dumps({"id": check.id, "hung": hung}) + "\n").encode())
        self.proc.stdin.flush()

    def lines(self) -> list[dict] | None:
        """Complete JSON records available now; None at end of file."""
        chunk = os.read(self.results.fileno(), 1 << 16).decode("utf-8", "replace")
        if not chunk:
            return None
        self.buffer += chunk
        *complete, self.buffer = self.buffer.split("\n")
        return [json.loads(x) for x in complete if x.strip()]

    def how_it_ended(self) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.wait()
        tail = _tail(self.log_path)
        what = (f"killed by signal {-code}" if code < 0 else f"exited with status {code}")
        return what + (f": {tail}" if tail else "")

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        for f in (self.proc.stdin, self.results, self.log):
            try:
                f.close()
            except OSError:
                pass
        if self.proc.poll() is None:
            self.kill()
        self.proc.wait()


def _tail(path: Path) -> str:
    try:
        lines = [x.strip() for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def worker_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "HYPOTHESIS_", "COV_CORE"))}
    spec_home = str(HOME)  # the directory holding `spec`
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [spec_home, env.get("PYTHONPATH")]))
    env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1", OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    return env


def run_isolated(impl: str, checks: Sequence[Check], *, workers: int = 2,
                 timeout: float | None = DEFAULT_TIMEOUT,
                 total_timeout: float | None = DEFAULT_TOTAL_TIMEOUT, oracle: str = "require",
                 paths: Sequence[str] = (), max_examples: int | None = None,
                 seed: int | None = None,
                 on_result: Callable[[Result], object] | None = None) -> CheckReport:
    """Run ``checks`` on the implementation ``impl`` (``pkg.mod[:obj]``) in ``workers``
    processes and return the :class:`CheckReport` (results in the checks' order)."""
    start = time.monotonic()
    job = {"impl": impl, "paths": list(paths), "timeout": timeout, "oracle": oracle,
           "max_examples": max_examples, "seed": seed}
    queue = deque(checks)
    results: dict[str, Result] = {}
    hung: dict[str, str] = {}
    notes: list[str] = []
    load_error = None
    restarts = 0
    env = worker_env()
    sel = selectors.DefaultSelector()
    pool: list[_Worker] = []
    limit = None if timeout is None else timeout + GRACE_SECONDS
    with tempfile.TemporaryDirectory(prefix="minibert-check-") as tmp:
        def spawn():
            w = _Worker(job, env, tmp, tmp, len(pool) + restarts)
            sel.register(w.results, selectors.EVENT_READ, w)
            pool.append(w)
            return w

        def retire(w: _Worker):
            sel.unregister(w.results)
            pool.remove(w)
            w.close()

        def record(r: Result):
            results[r.id] = r
            if on_result is not None:
                on_result(r)

        def dispatch(w: _Worker):
            if queue and load_error is None:
                w.send(queue.popleft(), hung)
            else:
                w.check = None

        for _ in range(max(1, min(workers, len(queue)))):
            spawn()
        while pool:
            now = time.monotonic()
            if total_timeout is not None and now - start > total_timeout:
                notes.append(f"the run did not finish within {total_timeout:g} s "
                             "(--total-timeout): the checks left are not run")
                for w in list(pool):
                    if w.check is not None:
                        record(Result(w.check.id, w.check.kind, w.check.ops, "error",
                                      "not finished: the run's time limit"))
                    w.kill()
                    retire(w)
                break
            for key, _ in sel.select(timeout=0.5):
                w = key.data
                records = w.lines()
                if records is None:  # the worker died
                    ended = w.how_it_ended()
                    if not w.loaded:
                        load_error = load_error or f"the worker loading {impl} {ended}"
                    elif w.check is not None:
                        c = w.check
                        record(Result(c.id, c.kind, c.ops, "failed",
                                      f"the implementation ended the process running this "
                                      f"check ({ended})"))
                    retire(w)
                    if load_error is None and (queue or w.check is not None):
                        restarts += 1
                        if restarts > MAX_RESTARTS:
                            notes.append(f"{restarts} worker processes died: the checks left "
                                         "are not run")
                            queue.clear()
                        elif queue:
                            spawn()
                    continue
                for rec in records:
                    if rec["event"] == "load_error":
                        load_error = rec["message"]
                    elif rec["event"] == "alive":
                        w.since = time.monotonic()  # the deadline runs from the last sign
                    elif rec["event"] == "loaded":
                        w.loaded = True
                        dispatch(w)
                    elif rec["event"] == "result":
                        for name in rec.pop("hung", []):
                            hung.setdefault(name, rec["id"])
                        rec.pop("event")
                        rec["ops"] = tuple(rec["ops"])
                        record(Result(**rec))
                        dispatch(w)
                if w.check is None and w in pool and (w.loaded or load_error):
                    retire(w)  # nothing left for it (or the implementation does not load)
            now = time.monotonic()
            for w in list(pool):
                if not w.loaded and now - w.since > LOAD_SECONDS:
                    load_error = load_error or (f"loading {impl} did not finish within "
                                                f"{LOAD_SECONDS:g} s")
                    w.kill()
                    retire(w)
                elif w.check is not None and limit is not None and now - w.since > limit:
                    c = w.check
                    w.kill()
                    w.proc.wait()
                    record(Result(c.id, c.kind, c.ops, "failed",
                                  f"{c.id}: an example did not finish within {timeout:g} s and "
                                  f"did not respond to its time limit (a hang inside compiled "
                                  f"code?): its process was killed"))
                    w.check = None
                    retire(w)
                    restarts += 1
                    if queue and restarts <= MAX_RESTARTS:
                        spawn()
    ordered = [results[c.id] for c in checks if c.id in results]
    missing = [c for c in checks if c.id not in results]
    if missing and load_error is None:
        ordered += [Result(c.id, c.kind, c.ops, "error", "not run (see the run's notes)")
                    for c in missing]
        if not notes:
            notes.append(f"{len(missing)} checks were not run")
    report = CheckReport(impl, ordered if load_error is None else [], oracle, notes=notes,
                    seconds=time.monotonic() - start, load_error=load_error)
    return report
