"""The judging suite as a pytest module, collected by ``pytest --minibert-impl=pkg.mod[:obj]``
(minibert_spec.suite.plugin adds this file to the session): one test per check, bound to that
implementation, selected with ``-k`` by check id."""

from __future__ import annotations

from minibert_spec.suite import parametrize_plan


def pytest_generate_tests(metafunc):
    plan = getattr(metafunc.config, "_minibert_plan", None)  # built by the plugin
    if plan is None or "check" not in metafunc.fixturenames:
        return
    mark = parametrize_plan(plan)
    metafunc.parametrize(*mark.args, **mark.kwargs)


def test_check(check):
    check()
