"""The judging suite as a pytest module, collected by ``pytest --minibert-impl=pkg.mod[:obj]``
(minibert_spec.suite.plugin adds this file to the session): one test per check, bound to that
implementation, selected with ``-k`` by check id."""

from __future__ import annotations

from minibert_spec.suite import parametrize_with_checks


def pytest_generate_tests(metafunc):
    config = metafunc.config
    spec = config.getoption("minibert_impl", None)
    if spec is None or "check" not in metafunc.fixturenames:
        return
    mark = parametrize_with_checks(config._minibert_proxy,  # loaded by the plugin
                                   config._minibert_expected,  # --minibert-xfail, resolved
                                   bad_input=config.getoption("minibert_bad_input"),
                                   oracle=config.getoption("minibert_oracle"),
                                   quick=config.getoption("minibert_quick"),
                                   deep=config.getoption("minibert_deep"),
                                   timeout=config.getoption("minibert_timeout"))
    metafunc.parametrize(*mark.args, **mark.kwargs)


def test_check(check):
    check()
