"""`minibert check`'s workers forked from a server that imported the libraries once
(spec/suite/forkserver.py): what the server imports follows the selected checks (nothing of
torch with --oracle off, in any process of the run), the forked workers keep one thread per
pool, and they stay hard-killable (the hang and crash tests of tests/suite/test_verdicts.py run
through the same server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minibert_spec.suite import all_checks, select
from minibert_spec.suite.pool import preload_for
from tests import ROOT


def test_the_server_preloads_torch_only_when_the_oracle_runs():
    oracle = select(kinds=["oracle"], ops=["layernorm"])
    fd = select(kinds=["fd"], ops=["layernorm"])
    assert "torch" in preload_for(oracle + fd, "require")
    assert "torch" not in preload_for(oracle + fd, "off")
    assert "torch" not in preload_for(fd, "require")
    bert = [c for c in all_checks() if "transformers" in c.requires]
    assert bert and "transformers" in preload_for(bert, "require")
    assert not any(m.startswith(("torch", "transformers")) for m in preload_for(bert, "off"))


def _fake_torch(tmp_path) -> tuple[dict, Path]:
    """A `torch` package first on the path that records every process importing it."""
    marker = tmp_path / "imported"
    pkg = tmp_path / "fake" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import os\n"
        f"with open({str(marker)!r}, 'a') as fh:\n"
        "    fh.write(f'{os.getpid()}\\n')\n"
        "raise ImportError('the fake torch of tests/suite/test_forkserver.py')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "fake"), str(ROOT)]))
    return env, marker


def _check(env, *args):
    return subprocess.run([sys.executable, "-m", "minibert_spec.cli", "check", "minibert_reference",
                           *args],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_oracle_off_imports_nothing_of_torch_in_any_process(tmp_path):
    env, marker = _fake_torch(tmp_path)
    out = tmp_path / "r.json"
    proc = _check(env, "--oracle", "off", "--ops", "layernorm", "relu", "--format", "json",
                  "-o", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["counts"].get("passed", 0) > 20
    assert not marker.exists(), f"torch imported by pids {marker.read_text().split()}"
    # the control: with the oracle on, the same fake torch is imported (by the server) -- the
    # marker above would have seen an import
    proc = _check(env, "--ops", "relu", "--kinds", "oracle", "--format", "json",
                  "-o", str(out))
    assert marker.exists()
    assert proc.returncode != 0


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_a_forked_worker_runs_one_thread_per_pool(tmp_path):
    """The server imported torch with the environment's one thread; the worker also sets it
    explicitly: an oracle check runs, and torch says 1 thread in the worker."""
    probe = tmp_path / "threads_probe.py"
    probe.write_text(
        "import sys\n"
        "from tests.examples.classy_adapter import *  # noqa\n"
        "from tests.examples.classy_adapter import relu_forward as _relu\n"
        "def relu_forward(x):\n"
        "    import torch, threadpoolctl\n"
        "    blas = [i['num_threads'] for i in threadpoolctl.threadpool_info()\n"
        "            if i['user_api'] == 'blas']\n"
        "    assert torch.get_num_threads() == 1, torch.get_num_threads()\n"
        "    assert set(blas) <= {1}, blas\n"
        "    return _relu(x)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    proc = subprocess.run([sys.executable, "-m", "minibert_spec.cli", "check", "threads_probe",
                           "--ops", "relu", "--kinds", "oracle", "fd"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


@pytest.mark.slow  # the slow tier: >= 4.5 s of the default run (issue 40)
def test_a_dead_fork_server_leaves_the_plain_workers():
    """The server killed before it answered: the run starts its workers as fresh
    interpreters and comes to the same verdict."""
    import signal

    from minibert_spec.suite.pool import launch_server, run_isolated

    checks = select(match=r"^fd\[(relu|linear)\.example\]$")
    server = launch_server()
    assert server is not None
    os.killpg(server.proc.pid, signal.SIGKILL)
    report = run_isolated("minibert_reference", checks, oracle="off", server=server)
    assert report.counts() == {"passed": len(checks)} and report.exit_code() == 0
    assert server.closed


@pytest.mark.slow  # the slow tier: the server imports torch (issue 40)
def test_no_worker_waits_behind_an_import_of_the_server(monkeypatch):
    """The server answers nothing while it imports: asked for torch and transformers in one
    request, a worker replaced after the first group waited for both (~5 s with both workers
    idle; a first red 9.5 s -> 3.9 s without it).  Each request holds one group, and no worker
    is forked while the server has an import outstanding."""
    from minibert_spec.suite.forkserver import ForkServer
    from minibert_spec.suite.pool import extra_groups, run_isolated

    asked, spawned_behind = [], []
    warm, spawn = ForkServer.warm, ForkServer.spawn

    def recording_warm(self, groups, start=0):
        asked.append([tuple(g) for g in groups])
        return warm(self, groups, start)

    def recording_spawn(self, n, fds, cwd, timeout=30.0):
        self.pending()
        if self.warmed < sum(map(len, asked)):
            spawned_behind.append((n, self.warmed, len(asked)))
        return spawn(self, n, fds, cwd, timeout)

    monkeypatch.setattr(ForkServer, "warm", recording_warm)
    monkeypatch.setattr(ForkServer, "spawn", recording_spawn)
    checks = select(match=r"^(fd|oracle\.forward|sympy)\[(relu|layernorm)[-\].]")
    groups = extra_groups(checks)
    assert len(groups) >= 2, groups  # SymPy's, then torch's: a replacement between them
    report = run_isolated("minibert_reference", checks)
    assert report.exit_code() == 0, report.summary()
    assert asked == [[tuple(g)] for g in groups], asked
    assert not spawned_behind, spawned_behind


@pytest.mark.slow  # the slow tier: a whole run in workers (issue 40)
def test_every_worker_starts_with_hypothesis_random_registered(tmp_path, monkeypatch):
    """Hypothesis's first seeded example registers its Random with gc.collect() over the
    heap (0.27 s once torch and transformers are imported, in every fork): the server does it
    before its extras, a fresh worker before the implementation loads -- the implementation,
    imported in each worker, finds it done."""
    from minibert_spec.suite.pool import run_isolated

    marker = tmp_path / "registered"
    (tmp_path / "random_probe.py").write_text(
        "import hypothesis.core\n"
        f"with open({str(marker)!r}, 'a') as fh:\n"
        "    fh.write(str(hypothesis.core.threadlocal._hypothesis_global_random is not None)"
        " + '\\n')\n"
        "from minibert_reference import *  # noqa\n")
    checks = select(match=r"^fd\[(relu|linear)\]$")
    for forked in ("1", "0"):  # from the fork server, then fresh interpreters
        monkeypatch.setenv("MINIBERT_FORKSERVER", forked)
        report = run_isolated("random_probe", checks, oracle="off", paths=[str(tmp_path)])
        assert report.exit_code() == 0, report.summary()
    seen = marker.read_text().split()
    assert len(seen) >= 2 and set(seen) == {"True"}, seen
