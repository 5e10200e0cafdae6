"""The fork server of ``minibert check``: one process that imports, once, what every worker
needs (NumPy, Hypothesis, the registry of checks; torch only when the oracle will run, the
transformers BERT modules only when a selected check needs them) and then forks each worker
from that state -- a worker starts in milliseconds instead of re-importing ~3 s of libraries,
and a worker that was killed (a hang, a crash) is replaced as cheaply.

A forked worker is the same worker as one started with ``python -m minibert_spec.suite.worker``
(minibert_spec.suite.worker.serve): a session of its own (the pool kills its whole process group on
a hang), its own command pipe, results pipe and log file (passed as file descriptors over the
server's socket), the run's temporary directory as its working directory.

torch and fork: torch is imported here before any fork, and nothing here runs a torch
operation, so its thread pools have not started when a worker is forked (a pool started
before ``fork`` deadlocks the child); each worker then sets its thread counts explicitly
(torch.set_num_threads(1), threadpoolctl: one BLAS thread), as the environment already asks.

Protocol (a SOCK_SEQPACKET socket pair, one JSON message each way, file descriptors attached):

* pool -> server: ``{"preload": [module, ...]}`` first; the server imports them and answers
  ``{"ready": true, "failed": {module: error}}``.
* pool -> server: ``{"warm": [[module, ...], ...], "start": k}`` once the first workers are
  forked: the server imports each group in turn (torch, then transformers: seconds each, while
  the first workers run the cheap checks) and says ``{"warmed": k + n, "failed": {...}}`` after
  the n-th; the pool then replaces each worker, at its next check boundary, by one forked with
  them.  The server answers nothing while it imports (a spawn waited seconds behind torch): the
  pool sends one group per request, the next once every worker has been replaced.
* pool -> server: ``{"spawn": n, "cwd": dir}`` with fds [commands (read end), results (write
  end), log]; the server answers ``{"spawned": n, "pid": pid}``.
* server -> pool, unprompted: ``{"exit": pid, "code": code}`` when a worker ends (``code``
  as ``subprocess.Popen.returncode``: negative for a signal).

The server ends when the pool closes its end of the socket (or dies).
"""

from __future__ import annotations

import importlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

MAX_MESSAGE = 1 << 16
REAP_SECONDS = 0.05  # how often the server looks for workers that ended


# --------------------------------------------------------------------------- the pool's side
class ForkServer:
    """The pool's handle on a running fork server (:meth:`start`)."""

    def __init__(self, proc: subprocess.Popen, sock: socket.socket, failed: dict):
        self.proc, self.sock, self.failed = proc, sock, failed
        self.exits: dict[int, int] = {}
        self.warmed = 0  # how many groups of the :meth:`warm` modules are imported
        self.ready = self.closed = False
        self.home: str | None = None

    @classmethod
    def launch(cls, preload, *, env: dict) -> ForkServer:
        """Start a server that imports ``preload`` (:meth:`wait_ready` waits for it), in a
        directory of its own (``python -m`` puts the working directory first on sys.path: a
        stray ``numpy.py`` there must shadow nothing)."""
        home = tempfile.mkdtemp(prefix="minibert-forkserver-")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with open(os.path.join(home, "forkserver.log"), "wb") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "minibert_spec.suite.forkserver", str(theirs.fileno())],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    pass_fds=(theirs.fileno(),), cwd=home, env=env, start_new_session=True)
        except BaseException:
            ours.close()
            shutil.rmtree(home, ignore_errors=True)
            raise
        finally:
            theirs.close()
        server = cls(proc, ours, {})
        server.home = home
        try:
            ours.sendall(json.dumps({"preload": list(preload)}).encode())
        except OSError:
            server.close()
            raise
        return server

    def wait_ready(self, timeout: float) -> None:
        """Wait for the preload; OSError if the server does not answer within ``timeout``."""
        if self.ready:
            return
        reply = self._receive(lambda m: "ready" in m, timeout)
        self.failed.update(reply.get("failed", {}))
        self.ready = True

    def _receive(self, wanted, timeout: float) -> dict:
        """The next message that ``wanted(message)`` accepts; exit notices on the way are
        kept.  OSError on a timeout or a server that went away."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.sock], [], [], max(left, 0.0))
            if not ready:
                if left <= 0:
                    raise OSError("the fork server did not answer in time")
                continue
            data = self.sock.recv(MAX_MESSAGE)
            if not data:
                raise OSError("the fork server ended")
            message = json.loads(data)
            if "exit" in message:
                self.exits[message["exit"]] = message["code"]
            if message.get("warmed"):
                self.warmed = max(self.warmed, message["warmed"])
                self.failed.update(message.get("failed", {}))
            if wanted(message):
                return message

    def warm(self, groups, start: int = 0) -> None:
        """Ask the server to import each group of modules now, in turn (it says after each:
        :attr:`warmed` counts them, from ``start``: the groups an earlier request imported).
        While it imports it answers nothing, a spawn included: the pool asks for one group at
        a time, when no worker waits to be replaced."""
        self.sock.send(json.dumps({"warm": [list(g) for g in groups], "start": start}).encode())

    def pending(self) -> None:
        """Read whatever the server has said (exit notices, warmed), without waiting."""
        try:
            self._receive(lambda m: False, 0.0)
        except OSError:
            pass

    def spawn(self, n: int, fds, cwd: str, timeout: float = 30.0) -> int:
        """Fork a worker with ``fds`` = (commands read end, results write end, log); its pid."""
        socket.send_fds(self.sock, [json.dumps({"spawn": n, "cwd": cwd}).encode()], list(fds))
        return self._receive(lambda m: m.get("spawned") == n, timeout)["pid"]

    def poll(self, pid: int) -> int | None:
        """The worker's exit code if it has ended (as far as the server has said)."""
        if pid not in self.exits:
            try:
                self._receive(lambda m: m.get("exit") == pid, 0.001)
            except OSError:
                pass
        return self.exits.get(pid)

    def wait(self, pid: int, timeout: float) -> int | None:
        if pid not in self.exits:
            try:
                self._receive(lambda m: m.get("exit") == pid, timeout)
            except OSError:
                return None
        return self.exits.get(pid)

    def close(self) -> None:
        """End the server now (it holds nothing: an import in progress is abandoned); the
        workers it forked live in sessions of their own and are the pool's to end.  Once."""
        if self.closed:
            return
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        if self.home is not None:
            shutil.rmtree(self.home, ignore_errors=True)


class ForkedProcess:
    """A worker forked by the server, with the part of ``subprocess.Popen``'s interface the
    pool uses (the server, not the pool, is its parent: the exit code comes from it)."""

    def __init__(self, server: ForkServer, pid: int):
        self.server, self.pid = server, pid

    def poll(self) -> int | None:
        return self.server.poll(self.pid)

    def wait(self, timeout: float | None = None) -> int:
        code = self.server.wait(self.pid, 3600.0 if timeout is None else timeout)
        if code is None:
            raise subprocess.TimeoutExpired("forked worker", timeout)
        return code


# --------------------------------------------------------------------------- the server
def _preload(modules) -> dict:
    failed = {}
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 -- the worker imports it again and says why
            failed[name] = f"{type(e).__name__}: {e}"
    from minibert_spec.suite.registry import all_checks
    from minibert_spec.suite.worker import register_hypothesis_random

    all_checks()
    _scan_constants()
    register_hypothesis_random()  # first with the suite alone: before torch, where it is cheap
    return failed


def _scan_constants() -> None:
    """Hypothesis's first draw after new modules are imported reads the source of every one
    that is not a library's, for constants to draw (0.26 s of a worker's first check, more after
    torch): done here, once, so that every worker forked from this state starts with it done.
    A private function of Hypothesis's: where it is missing, the workers scan as before."""
    try:
        from hypothesis.internal.conjecture import providers

        providers._get_local_constants()
    except Exception:  # noqa: BLE001, S110 -- an optimisation only
        pass


def _child(sock: socket.socket, request: dict, fds) -> None:
    """In the forked worker: its own session, its pipes on stdin and the results fd, then
    the worker loop; never returns."""
    commands, results, log = fds
    code = 70
    try:
        os.setsid()
        sock.close()
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        os.dup2(commands, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        for fd in (commands, log):
            os.close(fd)
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
        os.chdir(request["cwd"])
        from minibert_spec.suite import worker

        job = json.loads(sys.stdin.readline())
        code = worker.serve(job, os.fdopen(results, "w", encoding="utf-8"), sys.stdin)
    except BaseException:  # noqa: BLE001 -- whatever happened, this process only exits
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _reap(sock: socket.socket, children: set) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        sock.send(json.dumps({"exit": pid, "code": code}).encode())


def main(fd: int) -> int:
    sock = socket.socket(fileno=fd)
    request = json.loads(sock.recv(MAX_MESSAGE))
    failed = _preload(request.get("preload", ()))
    sys.stdout.flush()
    sys.stderr.flush()
    sock.send(json.dumps({"ready": True, "failed": failed}).encode())
    children: set[int] = set()
    while True:
        ready, _, _ = select.select([sock], [], [], REAP_SECONDS)
        _reap(sock, children)
        if not ready:
            continue
        data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 3)
        if not data:  # the pool closed its end: done (workers end on their closed pipes)
            return 0
        request = json.loads(data)
        if "warm" in request:
            for n, group in enumerate(request["warm"], request.get("start", 0) + 1):
                failed = _preload(group)
                sock.send(json.dumps({"warmed": n, "failed": failed}).encode())
                _reap(sock, children)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(sock, request, fds)
        for f in fds:
            os.close(f)
        children.add(pid)
        sock.send(json.dumps({"spawned": request["spawn"], "pid": pid}).encode())


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
