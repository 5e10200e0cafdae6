"""A worker process of ``minibert check``: loads the implementation once, then runs the checks
the parent sends, one at a time (started as ``python -m minibert_spec.suite.worker``, or forked by
minibert_spec.suite.forkserver with the libraries already imported: both run :func:`serve`), and
writes each result as a JSON line on a file descriptor of its own (the implementation may
print anything on stdout/stderr: it cannot corrupt the results).  The parent
(minibert_spec.suite.pool) kills and replaces a worker whose check outlives its time limit by more
than a grace period, or that dies: that check is a failure, the others go on.

Protocol.  stdin, first line: the job ``{"impl", "paths", "timeout", "oracle", "max_examples",
"seed", "database", "replay", "fd"}`` (``database``/``replay``: the example database directories
shared with other runs, minibert_spec.suite.run.shared_database); then one line per check ``{"id",
"hung": {name: check id}, "shrink": {"seconds", "shrunk"}}`` (the run's shrink budget left, the
causes shrunk); EOF ends the worker.
Results fd: ``{"event": "loaded", "label"}`` or ``{"event": "load_error", "message"}``; then per
check ``{"event": "start", "id"}``, ``{"event": "alive"}`` before its examples (at most once a
second: the parent's hard deadline runs from the last sign of life) and ``{"event": "result",
...Result, "hung": [names], "shrink_spent": seconds}``.
"""

from __future__ import annotations

import json
import os
import sys


def _emit(out, **record) -> None:
    out.write(json.dumps(record) + "\n")
    out.flush()


def _throttled(fn, seconds: float = 1.0):
    """``fn`` at most once per ``seconds``."""
    import time

    last = [0.0]

    def call():
        now = time.monotonic()
        if now - last[0] >= seconds:
            last[0] = now
            fn()
    return call


def limit_threads() -> None:
    """One thread for every pool this process has or will have: BLAS (threadpoolctl) and
    torch's intra-op pool -- set explicitly, not left to the environment the worker was
    started with (a forked worker inherits the server's libraries already loaded)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def register_hypothesis_random() -> None:
    """What Hypothesis does on the first seeded example of a process, done now: it registers
    its global Random, checking it with ``gc.collect()`` over the whole heap -- 0.04 s on the
    suite alone, 0.27 s once torch and transformers are imported, paid again by every worker
    forked after them.  Called before those imports (the fork server before its extras, a
    worker before the implementation loads), the forks inherit it done.  The state of the
    Random is Hypothesis's to seed and restore around every example: no draw changes."""
    from hypothesis.internal.entropy import deterministic_PRNG

    with deterministic_PRNG():
        pass


def main() -> int:
    job = json.loads(sys.stdin.readline())
    return serve(job, os.fdopen(int(job["fd"]), "w", encoding="utf-8"), sys.stdin)


def serve(job: dict, out, commands) -> int:
    """Load the implementation of ``job``, then run each check named on ``commands`` (one JSON
    line each) and write the records on ``out``."""
    limit_threads()
    register_hypothesis_random()
    for path in job.get("paths", ()):  # the caller's modules, after the standard library
        if path not in sys.path:
            sys.path.append(path)
    from minibert_spec.protocol import (
        ImplLoadError,
        ImplProxy,
        capabilities,
        install_interrupt_flag,
        load_impl,
    )
    from minibert_spec.protocol.wholemodel import declaration
    from minibert_spec.suite.declared import checks_of
    from minibert_spec.suite.registry import ALIASES, all_checks, get
    from minibert_spec.suite.run import check_settings, run_check, shared_database
    from minibert_spec.suite.shrink import ShrinkBudget

    install_interrupt_flag()
    try:
        obj = load_impl(job["impl"])
        if job.get("model") and declaration(obj) is None:  # --model on protocol rows
            all_checks()  # (the check modules registered in their order first)
            from minibert_spec.suite.checks.decoder import model_of_rows

            obj = model_of_rows(obj, job["impl"])
        capabilities(obj)
        declared = checks_of(obj)  # the checks of the ops it declares (OPS)
    except (ImplLoadError, ValueError) as e:
        _emit(out, event="load_error", message=str(e))
        return 2
    proxy = ImplProxy(obj, job["impl"])
    _emit(out, event="loaded", label=job["impl"])
    seed = job.get("seed")
    database = shared_database(job["impl"], job.get("database"), job.get("replay", ()))
    settings = check_settings(database=database, max_examples=job.get("max_examples"),
                              derandomize=False if seed is not None else None)
    hung = object.__getattribute__(proxy, "_impl_hung")
    budget = ShrinkBudget()  # the run's, as the parent says before each check
    # the checks by id, built once (registry.get builds this dict on every call); an old id
    # (ALIASES) or an unknown one goes through get, which warns or raises
    by_id = {c.id: c for c in (*all_checks(), *declared)}
    for line in commands:
        if not line.strip():
            break
        command = json.loads(line)
        hung.update(command.get("hung", {}))
        if "shrink" in command:
            budget.seconds = command["shrink"]["seconds"]
            budget.shrunk.update(command["shrink"]["shrunk"])
        check = (by_id[command["id"]] if command["id"] in by_id and command["id"] not in ALIASES
                 else get(command["id"], declared))
        _emit(out, event="start", id=check.id)
        before, left = set(hung), budget.seconds
        result = run_check(check, proxy, settings=settings, timeout=job.get("timeout"),
                           oracle=job.get("oracle", "require"), seed=seed,
                           heartbeat=_throttled(lambda: _emit(out, event="alive")),
                           shrink=budget)
        _emit(out, event="result", hung=sorted(set(hung) - before),
              shrink_spent=left - budget.seconds, **result.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
