"""Hypothesis profiles and the fixture that yields the implementation under test.

Profiles: ``dev`` (default, fast), ``ci`` (derandomized, no deadline, more examples), ``deep``
(thousands of examples, opt-in).  Pick one with ``--hypothesis-profile=NAME`` or the
environment variable ``MINIBERT_PROFILE``.

The implementation under test is the bundled ``reference`` unless ``--impl package.module:object``
(or ``MINIBERT_IMPL``) names another; tests only ever reach it through the ``impl`` fixture.  The
fixture wraps it in a proxy: a test that reads a name the implementation lacks is SKIPPED with
"not applicable: <impl> lacks <name>" (the adapter protocol is in spec/protocol.py).

``MINIBERT_REPORT=path`` appends one JSON line per test (nodeid, outcome, equation IDs, the
protocol names the test called through the proxy, first line of the failure) to ``path``:
``minibert check`` and ``minibert mutate`` read it.

Under ``--impl`` (any implementation but the bundled reference):

* an implementation that cannot be loaded stops the run at once with a one-line usage error;
* tests that never touch the implementation (no ``impl`` fixture) and the project's own tests
  (claims, correspondence, architecture, mutation, training tooling) are skipped: they say
  nothing about it;
* bad-input tests (marker ``bad_input``) are skipped unless ``--bad-input`` is given;
* Hypothesis shrinking is bounded (SHRINK_SECONDS per failing test) so a buggy implementation
  is reported in minutes, and its examples go to a database of their own (never replayed
  against another implementation); ``MINIBERT_HYPOTHESIS_DB=none`` turns the database off;
* every test runs within ``--impl-timeout`` seconds (default IMPL_TIMEOUT; the environment
  variable ``MINIBERT_TEST_TIMEOUT`` sets it for any run).
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


REFERENCE = "reference"
IMPL_TIMEOUT = 600.0  # seconds per test under --impl: generous (the slowest reference test ~20 s)
SHRINK_SECONDS = 5  # Hypothesis shrinking per failing test under --impl (its default is 300)
# the project's own tests: they check the documents, the reference's internals and tooling
INTERNAL_FILES = frozenset({
    "test_claims.py", "test_correspondence.py", "test_architecture.py", "test_mutation.py",
    "test_spec_equations.py", "test_spec_softmax_jacobian.py", "test_train.py", "test_data.py",
    "test_interrupt.py", "test_train_sparse_head.py", "test_train_safety.py",
    "test_fast_paths.py", "test_parallel.py", "test_threads.py", "test_bench_cli.py",
    "test_linear_cross_entropy.py", "test_data_parallel.py"})


def pytest_addoption(parser):
    parser.addoption(
        "--impl", default=os.environ.get("MINIBERT_IMPL", REFERENCE),
        help="implementation under test, as package.module[:object] (default: reference)")
    parser.addoption(
        "--impl-timeout", type=float, default=None,
        help=f"seconds per test before it fails (default {IMPL_TIMEOUT:g} under --impl, none "
             "for the reference; MINIBERT_TEST_TIMEOUT)")
    parser.addoption("--bad-input", action="store_true",
                     help="under --impl, also run the bad-input tests (marker bad_input)")


_IS_XDIST_WORKER = False
_IMPL = None  # the loaded implementation (pytest_configure)
_PROXY = None  # the session's ImplProxy (the impl fixture)


def _under_impl(config) -> bool:
    return config.getoption("--impl") != REFERENCE


@pytest.fixture(scope="session")
def impl(request):
    """The implementation under test; names it lacks skip the test as not applicable."""
    global _PROXY
    from spec.protocol import ImplProxy

    _PROXY = ImplProxy(_IMPL, request.config.getoption("--impl"), on_missing=pytest.skip)
    return _PROXY


def _hypothesis_for_impl(config) -> None:
    """A database per implementation (or none), and bounded shrinking under --impl."""
    import re

    from hypothesis import Phase
    from hypothesis.database import DirectoryBasedExampleDatabase

    spec = config.getoption("--impl")
    changes = {}
    if os.environ.get("MINIBERT_HYPOTHESIS_DB", "").lower() in ("none", "off", "0"):
        changes["database"] = None
    elif _under_impl(config):
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(filter(None, [
            spec, os.environ.get("MINIBERT_MUTANT")])))
        changes["database"] = DirectoryBasedExampleDatabase(
            os.path.join(str(config.rootpath), ".hypothesis", "impl", slug))
    if _under_impl(config):
        from hypothesis.internal.conjecture import engine

        engine.MAX_SHRINKING_SECONDS = SHRINK_SECONDS
        changes["phases"] = (Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink)
    if changes:
        name = settings.get_current_profile_name()
        settings.register_profile(f"{name}-impl", parent=settings.get_profile(name), **changes)
        settings.load_profile(f"{name}-impl")


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    global _IS_XDIST_WORKER, _IMPL
    import sys

    _IS_XDIST_WORKER = hasattr(config, "workerinput")
    config.addinivalue_line(
        "markers", "bad_input: a malformed input must raise ValueError naming the argument "
                   "(skipped under --impl unless --bad-input)")
    from spec.protocol import (
        OPS,
        ImplLoadError,
        capabilities,
        install_interrupt_flag,
        load_impl,
        provides,
    )

    install_interrupt_flag()
    extra = os.environ.get("MINIBERT_IMPL_PATH")  # minibert check: the implementation's home,
    if extra and extra not in sys.path:  # after the standard library (nothing shadows it)
        sys.path.append(extra)
    spec = config.getoption("--impl")
    try:
        _IMPL = load_impl(spec)
        capabilities(_IMPL)
    except (ImplLoadError, ValueError) as e:
        raise pytest.UsageError(f"--impl {spec}: {e}") from None
    if not any(provides(_IMPL, name) for op in OPS.values() for name in op.names):
        raise pytest.UsageError(f"--impl {spec}: provides no protocol name of any op: nothing "
                                "to check (see spec/protocol.py)")
    _hypothesis_for_impl(config)


def pytest_collection_modifyitems(config, items):
    if not _under_impl(config):
        return
    label = config.getoption("--impl")
    internal = pytest.mark.skip(reason=f"not applicable under --impl {label}: a project-"
                                       "internal test (it never reaches the implementation)")
    bad = pytest.mark.skip(reason="bad-input test: off under --impl (pass --bad-input)")
    for item in items:
        if item.path.name in INTERNAL_FILES or "impl" not in getattr(item, "fixturenames", ()):
            item.add_marker(internal)
        elif item.get_closest_marker("bad_input") and not config.getoption("--bad-input"):
            item.add_marker(bad)


def _test_timeout(config) -> float | None:
    value = config.getoption("--impl-timeout")
    if value is None and os.environ.get("MINIBERT_TEST_TIMEOUT"):
        value = float(os.environ["MINIBERT_TEST_TIMEOUT"])
    if value is None and _under_impl(config):
        value = IMPL_TIMEOUT
    return value or None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    from spec.conformance import time_limit

    with time_limit(_test_timeout(item.config), item.nodeid):
        yield


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if _PROXY is not None:
        _PROXY.reset_calls()


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
              "ops": list(getattr(report, "ops", ())),
              "called": list(getattr(report, "called", ())), "message": message}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.equations = tuple(eq for m in item.iter_markers("equation") for eq in m.args)
    # @pytest.mark.oracle("model"): conformance rows an oracle test checks beyond its equations
    report.ops = tuple(op for m in item.iter_markers("oracle") for op in m.args)
    # the protocol names this test called through the proxy so far (setup and call)
    report.called = tuple(_PROXY.calls()) if _PROXY is not None else ()
