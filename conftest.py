"""Hypothesis profiles and the fixture that yields the implementation under test.

Profiles: ``dev`` (default, fast), ``ci`` (derandomized, no deadline, more examples), ``deep``
(thousands of examples, opt-in).  Pick one with ``--hypothesis-profile=NAME`` or the
environment variable ``MINIBERT_PROFILE``.

The implementation under test is the bundled ``reference`` unless ``--impl package.module:object``
(or ``MINIBERT_IMPL``) names another; tests only ever reach it through the ``impl`` fixture.
"""

from __future__ import annotations

import importlib
import os

# The tests multiply tiny matrices: a multi-threaded BLAS under pytest-xdist (2 workers x 2 BLAS
# threads on 2 cores) spends its time spin-waiting -- one 15x192 @ 192x8192 product took 0.6 s
# instead of 10 ms.  Must be set before NumPy loads; an explicit setting in the environment wins.
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# One BLAS thread per process, set before NumPy is first imported
# (neither pytest nor hypothesis imports it): the suite runs under xdist
# (one process per core), and OpenBLAS's own threads on top of that oversubscribe the cores --
# measured 40x slower on a Mini-BERT loss_and_grads (1.7 s vs 0.04 s) on a busy 2-core machine.
# Export the variables yourself to override.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

# The tests use tiny shapes and `pytest -n 2` runs two workers on two cores: a multi-threaded BLAS
# in each worker oversubscribes the machine, and OpenBLAS threads that spin-wait for a descheduled
# partner turn a millisecond matmul into a 100 ms one.  One BLAS/OpenMP thread per process unless
# the caller chose otherwise; this must run before anything imports NumPy or torch (pytest and
# hypothesis do not).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

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


def load_impl(spec: str):
    """'pkg.mod' -> the module; 'pkg.mod:obj' -> attribute obj of it."""
    module_name, _, attr = spec.partition(":")
    obj = importlib.import_module(module_name)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj


@pytest.fixture(scope="session")
def impl(request):
    """The implementation under test."""
    return load_impl(request.config.getoption("--impl"))
