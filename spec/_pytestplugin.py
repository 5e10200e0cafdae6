"""The pytest plugin of minibert-spec (entry point ``pytest11``), inert unless used.

pytest loads it in every session of every environment where the package is installed, so it
imports nothing else of the project, and nothing pytest has not already imported, until it is
used: ``--minibert-impl`` given (then :mod:`minibert_spec.suite.plugin` does the work) or a test
module calling ``minibert_spec.suite.parametrize_with_checks`` (which imports what it needs itself).
It sits directly under ``minibert_spec``, whose ``__init__`` imports nothing
(tests/suite/test_plugin_inert.py), so loading it adds exactly ``minibert_spec`` and
``minibert_spec._pytestplugin`` to ``sys.modules`` (the repository's top level is fixed: no
top-level module as Hypothesis's ``_hypothesis_pytestplugin``).
Its options, all prefixed::

    --minibert-impl=pkg.mod[:obj]   run the shipped suite on that implementation (collects
                                    spec/suite/test_implementation.py beside your tests)
    --minibert-oracle=require|off   the PyTorch oracle (default require: no torch is a failure)
    --minibert-bad-input            also run the bad-input checks
    --minibert-quick                the quick run: each check on its fixed examples alone
    --minibert-deep                 the deep tier: 10 drawn examples per check (unless a
                                    Hypothesis profile is loaded) and mini_bert-size model checks
    --minibert-timeout=SECONDS      per check, and for importing the implementation (default 30)
    --minibert-xfail=ID[=REASON]    an expected failure (repeatable; strict, as
                                    parametrize_with_checks' expected_failed_checks)

It never loads a Hypothesis profile and, without ``--minibert-impl``, collects nothing, changes
no setting and adds no fixture: it registers the ``suite_check`` marker and its options.
"""

from __future__ import annotations

from pathlib import Path

import pytest  # loaded already: pytest is what loads this plugin

# minibert_spec.suite.run's ORACLE_MODES and DEFAULT_TIMEOUT, written out so that adding the options
# imports nothing (tests/suite/test_plugin_inert.py checks that they agree)
ORACLE_MODES = ("require", "off")
DEFAULT_TIMEOUT = 30.0
# spec/suite/test_implementation.py, found without importing minibert_spec.suite
SUITE_MODULE = Path(__file__).resolve().parent / "suite" / "test_implementation.py"
SUITE_CHECK_MARKER = ("suite_check(id, kind, ops, equations): a check of the minibert-spec "
                      "judging suite (set by minibert_spec.suite.parametrize_with_checks)")


def pytest_addoption(parser):
    group = parser.getgroup("minibert", "minibert-spec: check a NumPy BERT implementation")
    group.addoption("--minibert-impl", default=None, metavar="PKG.MOD[:OBJ]",
                    help="run the minibert-spec judging suite on this implementation")
    group.addoption("--minibert-oracle", default="require", choices=ORACLE_MODES,
                    help="require (default): the PyTorch oracle checks run and fail without "
                         "torch; off: they are skipped, saying so")
    group.addoption("--minibert-bad-input", action="store_true", default=False,
                    help="also run the bad-input checks")
    group.addoption("--minibert-quick", action="store_true", default=False,
                    help="the quick run: each check on its fixed examples alone")
    group.addoption("--minibert-deep", action="store_true", default=False,
                    help="the deep tier: 10 drawn examples per check (unless a Hypothesis "
                         "profile is loaded; the standard tier: 3) and the whole-model checks "
                         "at the mini_bert preset's size")
    group.addoption("--minibert-timeout", type=float, default=DEFAULT_TIMEOUT,
                    metavar="SECONDS", help=f"per check, and for importing the implementation "
                                            f"(default {DEFAULT_TIMEOUT:g})")
    group.addoption("--minibert-xfail", action="append", default=[], metavar="ID[=REASON]",
                    help="a check expected to fail (repeatable); an unknown id is refused")


def pytest_configure(config):
    config.addinivalue_line("markers", SUITE_CHECK_MARKER)
    if config.getoption("minibert_impl", None):
        from minibert_spec.suite.plugin import configure

        configure(config)


def pytest_report_header(config):
    """With --minibert-impl, the tier the session runs (a verdict never hides its depth)."""
    plan = getattr(config, "_minibert_plan", None)  # minibert_spec.suite.plugin.configure's
    if plan is None:
        return None
    from minibert_spec.suite.run import depth_line

    return "minibert: " + depth_line(plan.depth)  # the settings the checks will run under


def pytest_sessionfinish(session, exitstatus):
    if getattr(session.config, "_minibert_session_mark", None):
        session.config._minibert_exitstatus = int(exitstatus)


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures are set up
def pytest_runtest_setup(item):
    """Under the exit guard: which test runs now, named if the session ends during it."""
    mark = getattr(item.config, "_minibert_session_mark", None)
    if mark:
        from minibert_spec.suite.plugin import running

        running(mark, item.nodeid, item.get_closest_marker("suite_check") is not None)


def pytest_unconfigure(config):
    """The session ran to its end (minibert_spec.suite.plugin's exit guard waits for this)."""
    if getattr(config, "_minibert_session_mark", None):
        from minibert_spec.suite.plugin import session_finished

        session_finished(config)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Before ``-k`` deselects: checks of the suite answer to their former ids (one release).
    Nothing is imported unless the session holds checks of the suite."""
    if any(item.get_closest_marker("suite_check") for item in items):
        from minibert_spec.suite.plugin import answer_to_former_ids

        answer_to_former_ids(config, items)


def pytest_ignore_collect(collection_path, config):
    """The shipped suite module is collected only with --minibert-impl (a `pytest --pyargs
    spec` or a run over site-packages must not pick it up without it)."""
    if (collection_path.name == "test_implementation.py"
            and not config.getoption("minibert_impl", None)
            and collection_path.resolve() == SUITE_MODULE):
        return True
    return None
