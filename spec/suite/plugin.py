"""The pytest plugin of minibert-spec (entry point ``pytest11``: loaded in every pytest session
where the package is installed, and inert unless used).

It only registers the ``suite_check`` marker that :func:`spec.suite.parametrize_with_checks`
puts on its parameters, and these options, all prefixed::

    --minibert-impl=pkg.mod[:obj]   run the shipped suite on that implementation (collects
                                    spec/suite/test_implementation.py beside your tests)
    --minibert-oracle=require|off   the PyTorch oracle (default require: no torch is a failure)
    --minibert-bad-input            also run the bad-input checks
    --minibert-quick                the quick run: each check on its fixed examples alone
    --minibert-timeout=SECONDS      per check (default spec.suite.run.DEFAULT_TIMEOUT)

It never loads a Hypothesis profile: checks inherit the profile the user loaded, or the suite's
own settings when none was (spec.suite.run.check_settings), applied per check.  Without
``--minibert-impl`` it collects nothing, changes no setting and adds no fixture.
"""

from __future__ import annotations

from pathlib import Path

import pytest  # loaded already: pytest is what loads this plugin

SUITE_MODULE = Path(__file__).with_name("test_implementation.py")


def pytest_addoption(parser):
    from spec.suite.run import DEFAULT_TIMEOUT, ORACLE_MODES

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
    group.addoption("--minibert-timeout", type=float, default=DEFAULT_TIMEOUT,
                    metavar="SECONDS", help=f"per check (default {DEFAULT_TIMEOUT:g})")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "suite_check(id, kind, ops, equations): a check of the minibert-spec "
                   "judging suite (set by spec.suite.parametrize_with_checks)")
    spec = config.getoption("minibert_impl", None)
    if spec:
        import pytest

        from spec.protocol import ImplLoadError, capabilities
        from spec.suite.run import as_proxy

        try:  # an implementation that does not load stops the session at once, one line
            config._minibert_proxy = as_proxy(spec)
            capabilities(config._minibert_proxy)
        except (ImplLoadError, ValueError) as e:
            raise pytest.UsageError(f"--minibert-impl {spec}: {e}") from None
        config.args.append(str(SUITE_MODULE))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Before ``-k`` deselects: a check of the suite answers to its former id too (one
    release, spec.suite.registry.ALIASES), and a ``-k`` naming a former id warns with the new
    one.  Nothing is imported unless the session holds checks of the suite."""
    marked = [(item, m.args[0]) for item in items for m in item.iter_markers("suite_check")]
    if not marked:
        return
    import re
    import warnings

    from spec.suite.registry import ALIASES

    former: dict[str, list[str]] = {}
    for old, new in ALIASES.items():
        former.setdefault(new, []).append(old)
    words = [w for w in re.split(r"[\s()]+", config.getoption("keyword", "") or "")
             if w and w not in ("and", "or", "not")]
    for item, check_id in marked:
        olds = former.get(check_id, ())
        item.extra_keyword_matches.update(olds)
        for w in words:
            if w.lower() not in item.nodeid.lower() and any(w.lower() in o.lower()
                                                           for o in olds):
                warnings.warn(DeprecationWarning(
                    f"-k {w!r} names a former check id: {check_id!r} is its name now (the "
                    "old one goes in the next release)"), stacklevel=1)


def pytest_ignore_collect(collection_path, config):
    """The shipped suite module is collected only with --minibert-impl (a `pytest --pyargs
    spec` or a run over site-packages must not pick it up without it)."""
    if Path(collection_path) == SUITE_MODULE and not config.getoption("minibert_impl", None):
        return True
    return None
