"""``minibert check``'s runner: the selected checks spread over worker processes
(minibert_spec.suite.worker), each example of a check time-limited twice -- inside the worker
(SIGALRM: the check fails, the worker goes on) and from here (a worker that gives no sign of life
within the limit plus GRACE_SECONDS, a hang inside C code, is killed and replaced) -- and a
whole-run bound.

Anything the implementation can do to a process ends as a red cell, never as a hang or a pass:
``os._exit``, a segfault, an infinite loop in C, memory exhaustion killed by the kernel.  The
process that died is replaced and the remaining checks run; the check it was running fails
with how it ended.  Workers run in a temporary directory (nothing the implementation writes
lands in the caller's), with the caller's directory and the implementation's home appended to
``sys.path`` after the standard library (a scratch ``concurrent.py`` there shadows nothing),
single-threaded BLAS, no Hypothesis database, no bytecode.
"""

from __future__ import annotations

import contextlib
import itertools
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

from minibert_spec.paths import HOME
from minibert_spec.suite.forkserver import ForkedProcess, ForkServer
from minibert_spec.suite.registry import Check
from minibert_spec.suite.report import CheckReport
from minibert_spec.suite.run import (
    DEFAULT_TIMEOUT,
    Result,
    first_red_order,
    run_seed,
    stopped_results,
)
from minibert_spec.suite.shrink import ShrinkBudget

GRACE_SECONDS = 15.0  # beyond a check's own limit before its worker is killed
DEFAULT_TOTAL_TIMEOUT = 900.0  # the whole run, seconds
MAX_RESTARTS = 25  # workers replaced after a crash or a hang before the run gives up
LOAD_SECONDS = 120.0  # a worker must load the implementation within this


class _Worker:
    def __init__(self, job: dict, env: dict, cwd: str, log_dir: str, n: int,
                 server: ForkServer | None = None):
        r, w = os.pipe()  # results: the worker's records
        cr, cw = os.pipe()  # commands: the job, then one check per line
        self.log_path = Path(log_dir) / f"worker-{n}.log"
        self.log = open(self.log_path, "wb")
        try:
            if server is not None:  # forked with the libraries already imported
                self.proc = ForkedProcess(server, server.spawn(n, (cr, w, self.log.fileno()),
                                                               cwd))
            else:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "minibert_spec.suite.worker"], stdin=cr, stdout=self.log,
                    stderr=subprocess.STDOUT, pass_fds=(w,), cwd=cwd, env=env,
                    start_new_session=True)
        except BaseException:
            for fd in (r, w, cr, cw):
                os.close(fd)
            self.log.close()
            raise
        os.close(w)
        os.close(cr)
        self.stdin = os.fdopen(cw, "wb")
        self.results = os.fdopen(r, "r", encoding="utf-8")
        self.buffer = ""
        self.stdin.write((json.dumps({**job, "fd": w}) + "\n").encode())
        self.stdin.flush()
        self.loaded = False
        self.stale = False  # replace at the next check boundary (the server has more loaded)
        self.check: Check | None = None  # the check in flight
        self.since = time.monotonic()

    def send(self, check: Check, hung: dict, shrink: ShrinkBudget) -> None:
        self.check, self.since = check, time.monotonic()
        command = {"id": check.id, "hung": hung,
                   "shrink": {"seconds": shrink.seconds, "shrunk": sorted(shrink.shrunk)}}
        self.stdin.write((json.dumps(command) + "\n").encode())
        self.stdin.flush()

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
            try:
                code = self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:  # a forked worker whose server went away
                code = None
        tail = _tail(self.log_path)
        what = ("ended (its exit status is unknown)" if code is None else
                f"killed by signal {-code}" if code < 0 else f"exited with status {code}")
        return what + (f": {tail}" if tail else "")

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:  # a forked worker not yet the leader of its session
            try:
                os.kill(self.proc.pid, 9)
            except (ProcessLookupError, PermissionError):
                pass
        except PermissionError:
            pass

    def close(self) -> None:
        for f in (self.stdin, self.results, self.log):
            try:
                f.close()
            except OSError:
                pass
        if isinstance(self.proc, ForkedProcess):  # the server reaps it: nothing to wait for
            if self.proc.poll() is None:  # (an exit the server reported: its pid may be reused)
                self.kill()
            return
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


# what the fork server imports for a requirement of the selected checks, beyond the suite
PRELOAD = ("numpy", "hypothesis", "threadpoolctl", "minibert_spec.suite.worker")
# (torch._dynamo: what torch.optim imports on its first use, 1.3 s of the first Adam check;
# imported, never run: no torch operation happens in the server)
REQUIREMENT_PRELOAD = {"torch": ("torch", "torch._dynamo"),
                       "transformers": ("transformers", "transformers.models.bert.modeling_bert",
                                        "transformers.models.llama.modeling_llama")}

# what a kind's checks load on their first run, beyond the suite: the SymPy <-> code checks,
# SymPy and the equations (~0.9 s; listing them loads neither,
# minibert_spec.suite.checks.sympy_code)
KIND_PRELOAD = {"sympy": ("sympy", "minibert_spec.suite.checks.sympy_equations")}


def preload_for(checks: Sequence[Check], oracle: str = "require") -> list[str]:
    """The modules the fork server imports for ``checks``: the suite's, and the extras the
    selected checks will import -- none of the oracle's with ``oracle="off"`` (its checks
    then import nothing), torch only when a selected check requires it."""
    return list(PRELOAD) + extras_for(checks, oracle)


def extras_for(checks: Sequence[Check], oracle: str = "require") -> list[str]:
    """The extras' modules of :func:`preload_for` (imported by the server once the first
    workers run: the cheap checks come first and need none of them)."""
    return [m for group in extra_groups(checks, oracle) for m in group]


def extra_groups(checks: Sequence[Check], oracle: str = "require") -> list[tuple[str, ...]]:
    """:func:`extras_for` by kind (:data:`KIND_PRELOAD`, first: under a second), then by
    requirement (torch first: most oracle checks need it alone)."""
    kinds = [KIND_PRELOAD[k] for k in KIND_PRELOAD if any(c.kind == k for c in checks)]
    needed = {m for c in checks if not (c.oracle and oracle == "off") for m in c.requires}
    order = list(REQUIREMENT_PRELOAD)
    return kinds + [REQUIREMENT_PRELOAD.get(r, (r,)) for r in
                    sorted(needed, key=lambda r: (order.index(r) if r in order else len(order),
                                                  r))]


def launch_server(env: dict | None = None) -> ForkServer | None:
    """Start a fork server importing the suite (it works while the caller selects checks;
    :func:`run_isolated` takes it and waits for it).  None where fork or the server is
    unavailable: the workers are then started as fresh interpreters, as before."""
    if os.environ.get("MINIBERT_FORKSERVER", "1") == "0" or not hasattr(os, "fork"):
        return None
    try:
        return ForkServer.launch(PRELOAD, env=env or worker_env())
    except (OSError, ValueError):
        return None


def _ready(server: ForkServer | None) -> ForkServer | None:
    if server is None:
        return None
    try:
        server.wait_ready(LOAD_SECONDS)
    except (OSError, ValueError):
        server.close()
        return None
    return server


def run_isolated(impl: str, checks: Sequence[Check], *, workers: int = 2,
                 timeout: float | None = DEFAULT_TIMEOUT,
                 total_timeout: float | None = DEFAULT_TOTAL_TIMEOUT, oracle: str = "require",
                 paths: Sequence[str] = (), max_examples: int | None = None,
                 seed: int | None = None, first_red: bool = False,
                 database: str | None = None, replay: Sequence[str] = (),
                 on_result: Callable[[Result], object] | None = None,
                 server: ForkServer | None = None, model: bool = False) -> CheckReport:
    """Run ``checks`` on the implementation ``impl`` (``pkg.mod[:obj]``) in ``workers``
    processes and return the :class:`CheckReport` (results in the checks' order).  The checks are
    sent cheapest and most decisive first (:func:`~minibert_spec.suite.run.first_red_order`);
    ``first_red``: at the first failure the workers are stopped, and every check not
    finished is ``not run`` (never a pass).  ``server``: a fork server from
    :func:`launch_server` (default: one started here), closed at the end.  ``database``,
    ``replay``: example database directories shared with other runs (read and written; read
    only: :func:`~minibert_spec.suite.run.shared_database`, absolute paths: the workers run in a
    temporary directory); the draws then come from :func:`~minibert_spec.suite.run.run_seed`.
    ``model``: an implementation without a whole model of its own is judged as the model
    composed of its op rows (minibert_spec.protocol.composed; ``minibert check --model``)."""
    start = time.monotonic()
    job = {"impl": impl, "paths": list(paths), "timeout": timeout, "oracle": oracle,
           "max_examples": max_examples, "seed": run_seed(seed, bool(database or replay)),
           "database": database, "replay": list(replay), "model": model}
    queue = deque(first_red_order(checks))
    stopped = False
    shrink = ShrinkBudget()  # one for the run: each worker is told what is left
    results: dict[str, Result] = {}
    hung: dict[str, str] = {}
    notes: list[str] = []
    load_error = None
    restarts = 0
    env = worker_env()
    sel = selectors.DefaultSelector()
    pool: list[_Worker] = []
    limit = None if timeout is None else timeout + GRACE_SECONDS
    with tempfile.TemporaryDirectory(prefix="minibert-check-") as tmp, \
            contextlib.ExitStack() as stack:
        if server is None:
            server = launch_server(env)
        if server is not None:
            stack.callback(server.close)
        server = _ready(server)

        serial = itertools.count()
        recycled = 0  # the groups of extras the workers forked since have imported

        def spawn():
            nonlocal server
            n = next(serial)
            try:
                w = _Worker(job, env, tmp, tmp, n, server)
            except OSError:
                if server is None:
                    raise
                server = None  # the fork server went away: fresh interpreters from now on
                w = _Worker(job, env, tmp, tmp, n)
            sel.register(w.results, selectors.EVENT_READ, w)
            pool.append(w)
            return w

        def retire(w: _Worker):
            sel.unregister(w.results)
            pool.remove(w)
            w.close()

        def record(r: Result):
            nonlocal stopped
            results[r.id] = r
            if on_result is not None:
                on_result(r)
            if first_red and r.outcome == "failed" and not stopped:
                stopped = True
                queue.clear()

        def dispatch(w: _Worker):
            if queue and load_error is None and w.stale:  # a fresh fork has the extras
                w.check = None
                retire(w)
                spawn()
            elif queue and load_error is None:
                w.send(queue.popleft(), hung, shrink)
            else:
                w.check = None

        for _ in range(max(1, min(workers, len(queue)))):
            spawn()
        groups = extra_groups(checks, oracle)
        asked = 0  # the groups the server was asked to import

        def warm_next():
            # one group per request, and only when no worker waits to be replaced: the server
            # answers no spawn while it imports (torch, transformers: seconds), and a
            # replacement asked for behind an import held the pool -- both workers idle
            nonlocal asked
            if server is not None and asked < len(groups) and server.warmed == asked \
                    and not any(w.stale for w in pool):
                server.warm([groups[asked]], start=asked)
                asked += 1

        warm_next()
        while pool:
            if server is not None and recycled < len(groups):
                server.pending()
                if server.warmed > recycled:  # a fresh fork has more imported
                    recycled = server.warmed
                    for w in pool:
                        w.stale = True
                warm_next()
            if stopped:  # the first red: the checks in flight are not waited for
                for w in list(pool):
                    w.kill()
                    retire(w)
                break
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
                        shrink.seconds = max(0.0, shrink.seconds - rec.pop("shrink_spent", 0.0))
                        if rec["outcome"] == "failed" and rec.get("cause"):
                            shrink.shrunk.add(rec["cause"])
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
                    if not isinstance(w.proc, ForkedProcess):  # (the server reaps a fork)
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
    if missing and stopped:
        ordered = [results.get(c.id) or stopped_results([c])[0] for c in checks]
    elif missing and load_error is None:
        ordered += [Result(c.id, c.kind, c.ops, "error", "not run (see the run's notes)")
                    for c in missing]
        if not notes:
            notes.append(f"{len(missing)} checks were not run")
    report = CheckReport(impl, ordered if load_error is None else [], oracle, notes=notes,
                    seconds=time.monotonic() - start, load_error=load_error)
    return report
