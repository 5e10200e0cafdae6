"""Hypothesis profiles and the fixture that yields the implementation under test.

Profiles: ``dev`` (default, fast), ``ci`` (derandomized, no deadline, more examples), ``deep``
(thousands of examples, opt-in).  Pick one with ``--hypothesis-profile=NAME`` or the
environment variable ``MINIBERT_PROFILE``.

The implementation under test is the bundled ``reference`` unless ``--impl package.module:object``
(or ``MINIBERT_IMPL``) names another; tests only ever reach it through the ``impl`` fixture.  The
fixture wraps it in a proxy: a test that reads a name the implementation lacks is SKIPPED with
"not applicable: <impl> lacks <name>" (the adapter protocol is in spec/protocol.py).

``MINIBERT_REPORT=path`` appends one JSON line per test (nodeid, outcome, equation IDs, first line
of the failure) to ``path``: ``minibert check`` and ``minibert mutate`` read it.
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


def pytest_addoption(parser):
    parser.addoption(
        "--impl", default=os.environ.get("MINIBERT_IMPL", "reference"),
        help="implementation under test, as package.module[:object] (default: reference)")


@pytest.fixture(scope="session")
def impl(request):
    """The implementation under test; names it lacks skip the test as not applicable."""
    from spec.protocol import ImplProxy, load_impl

    spec = request.config.getoption("--impl")
    return ImplProxy(load_impl(spec), spec, on_missing=pytest.skip)


_IS_XDIST_WORKER = False


def pytest_configure(config):
    global _IS_XDIST_WORKER
    _IS_XDIST_WORKER = hasattr(config, "workerinput")


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    """MINIBERT_REPORT=path: one JSON line per test outcome (call phase, or a failed/skipped
    setup), with the equation IDs the test declares and the op rows its oracle marker names."""
    path = os.environ.get("MINIBERT_REPORT")
    if _IS_XDIST_WORKER:  # xdist: the controller writes the record
        return
    if not path or not (report.when == "call" or (report.when == "setup" and not report.passed)):
        return
    outcome = report.outcome
    if report.when == "setup" and report.failed:
        outcome = "failed"  # an error in a fixture is a failure of the test
    message = ""
    if report.failed:
        message = getattr(report.longrepr, "reprcrash", None)
        message = message.message if message is not None else str(report.longrepr)
        message = message.strip().splitlines()[0][:300] if message.strip() else ""
    elif report.skipped and isinstance(report.longrepr, tuple):
        message = str(report.longrepr[2])[:300]
    record = {"nodeid": report.nodeid, "outcome": outcome,
              "equations": list(getattr(report, "equations", ())),
              "ops": list(getattr(report, "ops", ())), "message": message}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.equations = tuple(eq for m in item.iter_markers("equation") for eq in m.args)
    # @pytest.mark.oracle("model"): conformance rows an oracle test checks beyond its equations
    report.ops = tuple(op for m in item.iter_markers("oracle") for op in m.args)
