"""The project's own pytest configuration: Hypothesis profiles and the ``impl`` fixture.

Profiles: ``dev`` (default, fast), ``ci`` (derandomized, no deadline, more examples), ``deep``
(thousands of examples, opt-in).  Pick one with ``--hypothesis-profile=NAME`` or the
environment variable ``MINIBERT_PROFILE``.  The judging suite's checks (spec/suite, run on the
reference by tests/suite/test_suite_reference.py exactly as a user runs them on theirs) inherit the
loaded profile.

``impl`` is the bundled reference behind the protocol proxy (a name it lacks skips the test as
not applicable).  Checking another implementation is the shipped suite's job: ``minibert check
pkg.mod``, ``pytest --minibert-impl pkg.mod`` or ``parametrize_with_checks`` (minibert_spec.suite).

``MINIBERT_REPORT=path`` appends one JSON line per test (nodeid, outcome, equation IDs, first
line of the failure) to ``path``: ``minibert mutate`` reads it.
"""

from __future__ import annotations

import json
import os

# One BLAS/OpenMP thread per process unless the caller exported otherwise: the suite runs under
# pytest-xdist (one worker per core), and OpenBLAS threads spin-waiting for a descheduled partner
# turn a millisecond matmul into a 100 ms one -- measured 40x slower on a Mini-BERT
# loss_and_grads (1.7 s vs 0.04 s) on a busy 2-core machine.  Must run before anything imports
# NumPy or torch (neither pytest nor hypothesis does).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("dev", max_examples=12, deadline=None)
settings.register_profile(
    "ci", max_examples=25, deadline=None, derandomize=True, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "deep", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("MINIBERT_PROFILE", "dev"))

# no test of the project may run for more than this (SIGALRM; MINIBERT_TEST_TIMEOUT overrides):
# a hang in the code under test is a failure with a reason, not a stuck CI job.  The slowest
# test takes ~40 s on the 2-core machine (tests/train/test_interrupt.py's resumed runs).
TEST_TIMEOUT = 600.0


# --------------------------------------------------------------------------- the slow tier
# Tests marked ``slow`` run whole pipelines end to end in subprocesses (the CI templates' jobs,
# shards of whole-suite runs, --many over twenty submissions, the array libraries' full twin
# runs, the interruption campaign): seconds to a minute each, and most of the default run's
# time when they were in it.  They run when asked for -- ``MINIBERT_SLOW=1`` or a ``-m``
# expression naming ``slow`` -- and CI asks (.ci/run runs the tier after the default run); the
# default run deselects them and says how many in its header line.
SLOW_ENV = "MINIBERT_SLOW"


def slow_tier_wanted(config) -> bool:
    """Whether this session runs the slow tier: MINIBERT_SLOW set (not "0"), or a ``-m``
    expression that names ``slow`` (``-m slow``; ``-m "not slow"`` deselects it anyway)."""
    return os.environ.get(SLOW_ENV, "0") not in ("", "0") or "slow" in (
        config.option.markexpr or "")


def pytest_collection_modifyitems(config, items):
    if slow_tier_wanted(config):
        return
    slow = [i for i in items if i.get_closest_marker("slow") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [i for i in items if i.get_closest_marker("slow") is None]
        config._minibert_slow_deselected = len(slow)


def pytest_report_collectionfinish(config, start_path, items):
    n = getattr(config, "_minibert_slow_deselected", 0)
    if n:
        return [f"slow tier: {n} end-to-end tests deselected ({SLOW_ENV}=1 or -m slow runs "
                "them; CI does)"]
    return []


@pytest.fixture(scope="session")
def impl():
    """The bundled reference behind the protocol proxy."""
    import minibert_reference
    from minibert_spec.protocol import ImplProxy

    return ImplProxy(minibert_reference, "reference")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    from minibert_spec.suite.run import time_limit

    limit = float(os.environ.get("MINIBERT_TEST_TIMEOUT", TEST_TIMEOUT)) or None
    with time_limit(limit, item.nodeid):
        yield


def _equations(item) -> tuple[str, ...]:
    """The equation IDs a test declares: ``@pytest.mark.equation`` and the judging suite's
    ``suite_check`` marker (parametrize_with_checks)."""
    ids = [eq for m in item.iter_markers("equation") for eq in m.args]
    ids += [eq for m in item.iter_markers("suite_check") for eq in m.kwargs.get(
        "equations", ())]
    return tuple(dict.fromkeys(ids))


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    """MINIBERT_REPORT=path: one JSON line per test outcome (call phase, or a failed/skipped
    setup), with the equation IDs the test declares."""
    path = os.environ.get("MINIBERT_REPORT")
    if not path or hasattr(report, "node") or os.environ.get("PYTEST_XDIST_WORKER"):
        return  # xdist: the controller writes the record
    if not (report.when == "call" or (report.when == "setup" and not report.passed)):
        return
    outcome = "failed" if report.when == "setup" and report.failed else report.outcome
    message = ""
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else str(report.longrepr)
        message = message.strip().splitlines()[0][:300] if message.strip() else ""
    elif report.skipped and isinstance(report.longrepr, tuple):
        message = str(report.longrepr[2])[:300]
    record = {"nodeid": report.nodeid, "outcome": outcome,
              "equations": list(getattr(report, "equations", ())), "message": message}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().equations = _equations(item)
