"""The CI files of docs/ci/, run as their jobs run (tests/cli/ci_emulator.py: each job in a working
copy of its own, its shell lines taken from the YAML, the shards of one night at the same
time, the cache and the artifacts carried between jobs), with the profile reduced, on a user
repository whose implementation has a bug only a random draw finds:

- the nightly's shards find it, the merge job's report fails (exit 1) and the cache keeps the
  shards' example databases and the durations;
- a pull-request run sharing that database fails on the very checks the nightly found, and
  replays the saved counterexample before drawing anything (Hypothesis's reuse phase); the same
  pull-request run without it passes;
- the next night's shards restore the database and the durations, and fail again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import ROOT
from tests.cli.ci_emulator import Services, run_github, run_gitlab

# the slow tier (conftest.py): every job of two pipelines, each a run of minibert check
pytestmark = pytest.mark.slow

DOCS = ROOT / "docs" / "ci"
# the profile reduced: the layernorm checks that draw, 300 examples each at night (the
# shipped files say 500), one worker per shard
CHECK_ARGS = "--ops layernorm --kinds fd invariant --oracle off -j 1"
REDUCED = {"DEEP_EXAMPLES": "300", "CHECK_ARGS": CHECK_ARGS}
RARE_BUG = '''"""A LayerNorm whose backward is wrong on one upstream gradient in MODULUS
(chosen by a hash of its bytes): no fixed example shows it, a random draw does."""
import hashlib
import os

import numpy as np

from minibert_reference.ops import layernorm_backward as _right
from minibert_reference.ops import layernorm_forward  # noqa: F401

SALT = b"{salt}"
MODULUS = 200


def layernorm_backward(dy, cache):
    dx, dgamma, dbeta = _right(dy, cache)
    digest = hashlib.sha256(SALT + np.ascontiguousarray(dy).tobytes()).digest()
    hit = int.from_bytes(digest[:4], "big") % MODULUS == 0
    if os.environ.get("MYBERT_LOG"):
        with open(os.environ["MYBERT_LOG"], "a") as f:
            f.write(f"{{int(hit)}}\\n")
    return (dx * 1.5 if hit else dx), dgamma, dbeta
'''


def _minibert(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "minibert_spec.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def user_repo(tmp_path_factory) -> Path:
    """A user's repository: ``mybert.py`` with the rare bug, salted so that the ordinary
    runs pass -- the derandomized one and the pull request's without a database (``--replay``
    of a directory the cache did not restore: that run draws from the shared-database seed,
    not derandomized): the bug is found only by drawing more.  Both are tried: a salt chosen
    by the derandomized run alone let CI's pull-request run draw the bug by itself (in
    fd[layernorm]), so that its failures were no longer the night's."""
    root = tmp_path_factory.mktemp("user-repo")
    ordinary = ([], ["--replay", ".minibert-db"])  # no .minibert-db in root: an empty replay
    for salt in range(40):
        (root / "mybert.py").write_text(RARE_BUG.format(salt=salt))
        if all(_minibert("check", "mybert", *CHECK_ARGS.split(), *extra, cwd=root).returncode
               == 0 for extra in ordinary):
            assert not (root / ".minibert-db").exists()
            return root
    pytest.fail("no salt among 40 keeps the rare bug out of the ordinary runs")


def _report(path: Path) -> dict:
    return json.loads(path.read_text())


def _failed(report: dict) -> set[str]:
    return {r["id"] for r in report["results"] if r["outcome"] == "failed"}


def _check_nightly(shards, merge, services, key_prefix) -> set[str]:
    """The night's shards each wrote their part; the merge failed on the bug and the cache
    holds the database and the durations.  The ids that failed."""
    assert [r.returncode for r in shards] == [0, 0, 0], [r.log[-2000:] for r in shards]
    assert len({r.workdir for r in shards}) == 3  # a working copy each
    for k, r in enumerate(shards, 1):
        part = _report(next(r.workdir.glob("shard-*.json")))
        assert (part["shard"]["index"], part["shard"]["count"]) == (k, 3)
    assert merge.returncode == 1, merge.log[-3000:]
    merged = _report(merge.workdir / "minibert-report" / "report.json")
    assert merged["exit_code"] == 1 and (merge.workdir / "minibert-report" / "index.html").exists()
    failed = _failed(merged)
    assert failed and all("layernorm" in i for i in failed)
    assert len(merged["merged_from"]) == 3
    cache = services.caches[max(k for k in services.caches if k.startswith(key_prefix))]
    assert any(p.is_file() for p in (cache / ".minibert-db").rglob("*"))
    assert json.loads((cache / ".minibert-durations.json").read_text())
    return failed


def _replayed_first(db: Path, repo: Path, check_id: str) -> None:
    """The check, run as a pull request runs it (the worker's code path: run_check with the
    shared database and the run's seed), tries the saved counterexample first: its first
    drawn-phase test case comes from Hypothesis's reuse phase and fails."""
    from hypothesis.internal.observability import with_observability_callback

    from minibert_spec.suite.registry import get
    from minibert_spec.suite.run import check_settings, run_check, run_seed, shared_database

    seen = []
    sys.path.insert(0, str(repo))
    try:
        with with_observability_callback(seen.append):
            result = run_check(get(check_id), "mybert", oracle="off",
                               settings=check_settings(database=shared_database(
                                   "mybert", replay=[str(db)]), derandomize=False),
                               seed=run_seed(None, True))
    finally:
        sys.path.remove(str(repo))
        sys.modules.pop("mybert", None)
    assert result.outcome == "failed", result.message
    cases = [o for o in seen if o.type == "test_case" and o.how_generated != "explicit example"]
    assert cases and cases[0].how_generated.startswith("during reuse phase"), cases[:2]
    assert cases[0].status == "failed"


def test_github_actions_nightly_shards_and_pull_requests(user_repo, tmp_path):
    wf = DOCS / "github-actions.yml"
    services = Services(tmp_path / "github")
    night = run_github(wf, user_repo, services, event="schedule", run_id=1, overrides=REDUCED)
    assert night["pr"][0].returncode is None  # not a pull request's job
    failed = _check_nightly(night["deep"], night["merge"][0], services, "minibert-")

    pr = run_github(wf, user_repo, services, event="pull_request", run_id=2,
                    overrides=REDUCED)["pr"][0]
    assert pr.returncode == 1, pr.log[-3000:]
    assert _failed(_report(pr.workdir / "minibert-pr.json")) == failed
    db = pr.workdir / ".minibert-db"
    _replayed_first(db, user_repo, sorted(failed)[0])

    alone = run_github(wf, user_repo, Services(tmp_path / "no-cache"), event="pull_request",
                       run_id=3, overrides=REDUCED)["pr"][0]
    assert alone.returncode == 0, alone.log[-3000:]  # without the database: nothing found

    again = run_github(wf, user_repo, services, event="schedule", run_id=4, overrides=REDUCED)
    for shard in again["deep"]:  # the durations of night 1 dealt night 2's shards
        assert (shard.workdir / ".minibert-durations.json").exists()
    assert failed <= _check_nightly(again["deep"], again["merge"][0], services, "minibert-")


def test_gitlab_ci_nightly_shards_and_merge_requests(user_repo, tmp_path):
    ci = DOCS / "gitlab-ci.yml"
    services = Services(tmp_path / "gitlab")
    night = run_gitlab(ci, user_repo, services, source="schedule", pipeline=1,
                       overrides=REDUCED)
    assert "minibert-mr" not in night
    failed = _check_nightly(night["minibert-deep"], night["minibert-merge"][0], services,
                            "minibert")

    mr = run_gitlab(ci, user_repo, services, source="merge_request_event", pipeline=2,
                    overrides=REDUCED)
    assert set(mr) == {"minibert-mr"}
    assert mr["minibert-mr"][0].returncode == 1, mr["minibert-mr"][0].log[-3000:]
    assert _failed(_report(mr["minibert-mr"][0].workdir / "minibert-mr.json")) == failed

    alone = run_gitlab(ci, user_repo, Services(tmp_path / "no-cache"),
                       source="merge_request_event", pipeline=3, overrides=REDUCED)
    assert alone["minibert-mr"][0].returncode == 0, alone["minibert-mr"][0].log[-3000:]
