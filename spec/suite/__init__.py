"""The judging suite, shipped with the package: every check that judges a NumPy implementation
of the protocol (minibert_spec.protocol), as a registry of checks with stable ids.

From a user's own test file (ten lines; scikit-learn's ``parametrize_with_checks`` is the
model)::

    import mybert
    from minibert_spec.suite import parametrize_with_checks

    @parametrize_with_checks(mybert, expected_failed_checks={
        "fd[layernorm]": "gamma pulled out of the feature means (issue #12)"})
    def test_conformance(check):
        check()

From a script or notebook: ``report = check_implementation(mybert)`` (``report.exit_code()``,
``report.summary()``, ``report.to_json()``).  From a shell: ``minibert check mybert`` (each
check in a worker process, time-limited, with a per-op table and ``--format json``).  From
pytest without writing a file: ``pytest --minibert-impl mybert`` (the ``pytest11`` plugin,
``minibert_spec._pytestplugin``, inert unless that option is given; minibert_spec.suite.plugin does
the work).

Every entry point given ``"pkg.mod[:obj]"`` imports it in a child process first
(minibert_spec.suite.probe): an import that exits, crashes or hangs is refused with its reason,
never a verdict.  Every entry point refuses an unknown expected-failure id the same way
(minibert_spec.suite.registry.resolve_expected_failures), and a ``CAPABILITIES`` the protocol cannot
take -- malformed, out of range, contradicting its code, raising when read -- before any check
runs, in the one line of minibert_spec.protocol.capabilities.capabilities.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from minibert_spec.protocol.composed import composed_model
from minibert_spec.protocol.wholemodel import WholeModel, whole_model
from minibert_spec.suite.plan import QUICK, RunPlan, execute, plan_run, selected_checks
from minibert_spec.suite.registry import COLUMNS, KINDS, Check, all_checks, select
from minibert_spec.suite.report import CheckReport
from minibert_spec.suite.run import DEFAULT_TIMEOUT, Result, check_settings, run_check

__all__ = ["Check", "Result", "CheckReport", "COLUMNS", "KINDS", "all_checks", "select",
           "selected_checks", "check_implementation", "parametrize_with_checks", "BoundCheck",
           "DEFAULT_TIMEOUT", "whole_model", "WholeModel", "composed_model", "model_of_rows",
           "RunPlan", "plan_run", "execute"]


def model_of_rows(obj, label: str | None = None):
    """The whole model ``minibert check X --model`` judges where X declares none: its decoder
    row's own model where it provides one, else the model composed of its op rows
    (minibert_spec.suite.checks.decoder.model_of_rows; a ValueError in one line where neither
    can be built)."""
    all_checks()  # the check modules registered in their order before the decoder's is imported
    from minibert_spec.suite.checks.decoder import model_of_rows as build

    return build(obj, label)


class BoundCheck:
    """One check bound to one implementation: calling it runs the check (with its settings and
    time limit) and raises on a failure, ``pytest.skip`` when not applicable.  The object
    pytest shows as the parameter of ``test_conformance(check)``."""

    def __init__(self, check: Check, plan: RunPlan):
        self.check, self.plan = check, plan

    def __repr__(self) -> str:
        return self.check.id

    def __call__(self) -> None:
        __tracebackhide__ = True  # a red under pytest reads as the check's message, first
        import faulthandler

        import pytest

        # a hang the time limit cannot interrupt (inside C code) still ends in bounded time:
        # tracebacks, then the process exits non-zero -- a red, never a hang.  Re-armed before
        # every example, so it bounds one example, not the whole check
        plan = self.plan
        hard = (plan.timeout or 0) + 60

        def heartbeat():
            faulthandler.dump_traceback_later(hard, exit=True)

        try:
            r = run_check(self.check, plan.proxy, timeout=plan.timeout, oracle=plan.oracle,
                          settings=check_settings(database=plan.database, tier=plan.tier,
                                                  max_examples=QUICK if plan.tier == "quick"
                                                  else None),
                          heartbeat=heartbeat if plan.timeout else None)
        finally:
            if plan.timeout:
                faulthandler.cancel_dump_traceback_later()
        for c in r.conventions:
            import warnings

            from minibert_spec.protocol.capabilities import ConventionWarning

            warnings.warn(ConventionWarning(f"{r.id}: {c}"), stacklevel=2)
        if r.outcome == "n/a":
            pytest.skip(r.message)
        if r.outcome == "error":
            pytest.fail(f"{r.id} could not run: {r.message}", pytrace=False)
        if r.outcome == "failed":
            raise AssertionError(f"{r.id}: {r.message}")


class ProvidesSomething:
    """The first parameter of every parametrization: the implementation provides at least one
    protocol name of the selected checks' ops.  Without it, an implementation that provides
    nothing would skip every check and pass the run."""

    def __init__(self, proxy, checks):
        self.proxy, self.checks = proxy, checks

    def __repr__(self) -> str:
        return "protocol[provides]"

    def __call__(self) -> None:
        __tracebackhide__ = True  # its message, not the suite's frames
        from minibert_spec.protocol import OPS, provides

        ops = {op for c in self.checks for op in c.ops}
        if any(op not in OPS for op in ops):  # a declared op: its functions are its own
            return
        if not any(provides(self.proxy, name) for op in ops for name in OPS[op].names):
            raise AssertionError(f"{self.proxy._impl_label} provides no protocol name of the "
                                 f"selected ops {sorted(ops)}: nothing to check (the "
                                 "names: python -m minibert_spec.protocol)")


def parametrize_with_checks(impl, expected_failed_checks: Mapping[str, str] | None = None, *,
                            ids: Iterable[str] | None = None, kinds: Iterable[str] | None = None,
                            ops: Iterable[str] | None = None, match: str | None = None,
                            bad_input: bool = False, oracle: str = "require",
                            timeout: float | None = DEFAULT_TIMEOUT, database="auto",
                            quick: bool = False, deep: bool = False):
    """``@pytest.mark.parametrize("check", ...)`` over every selected check bound to ``impl``
    (a module, an object, or ``"pkg.mod:obj"``), each with its id (``pytest -k`` selects by
    it).  ``expected_failed_checks`` maps ids to reasons: strict xfails (a check that starts
    passing fails the run, so the list cannot go stale).  ``oracle="off"`` turns the PyTorch
    comparisons into skips that say so; by default a missing torch fails them.  ``database``:
    "auto" keeps each implementation's Hypothesis examples apart under ``.hypothesis/minibert``
    in the current directory (None: no database).  ``quick``: the quick run (each check on
    its fixed examples alone); ``deep``: the deep tier (10 drawn examples per check when no
    Hypothesis profile is loaded, and the mini_bert-size model checks); by default the
    standard tier (3, the model at tiny configurations: minibert_spec.suite.run.TIERS).  An
    unknown id in ``expected_failed_checks`` is a ValueError
    naming the closest known ids (a former id answers, with a DeprecationWarning); a
    ``"pkg.mod[:obj]"`` whose import exits, crashes or hangs (within ``timeout``) is an
    ImplLoadError naming why, a ``CAPABILITIES`` the protocol cannot take a DeclarationError
    (a ValueError) naming the key, the value and what is accepted."""
    __tracebackhide__ = True  # pytest shows a refusal as its line, not the suite's frames
    plan = plan_run(impl, ids=ids, kinds=kinds, ops=ops, match=match, bad_input=bad_input,
                    oracle=oracle, timeout=timeout, expected_failed_checks=expected_failed_checks,
                    quick=quick, deep=deep, database=database)
    if plan.load_error is not None:
        raise type(plan.load_error)(str(plan.load_error)) from None
    return parametrize_plan(plan)


def parametrize_plan(plan: RunPlan):
    """The ``@pytest.mark.parametrize("check", ...)`` of a plan run in process: the
    implementation provides something, then each check bound to it, cheapest and most
    decisive first (``pytest -x`` stops soon), an expected failure a strict xfail."""
    import pytest

    from minibert_spec.suite.run import first_red_order

    params = [pytest.param(ProvidesSomething(plan.proxy, plan.checks), id="protocol[provides]")]
    for c in first_red_order(plan.checks):
        marks = [pytest.mark.suite_check(c.id, kind=c.kind, ops=c.ops, equations=c.equations)]
        if c.id in plan.expected:
            marks.append(pytest.mark.xfail(strict=True, reason=plan.expected[c.id]))
        params.append(pytest.param(BoundCheck(c, plan), id=c.id, marks=marks))
    return pytest.mark.parametrize("check", params)


def check_implementation(impl, *, ids: Iterable[str] | None = None,
                         kinds: Iterable[str] | None = None, ops: Iterable[str] | None = None,
                         match: str | None = None, bad_input: bool = False,
                         oracle: str = "require", timeout: float | None = DEFAULT_TIMEOUT,
                         expected_failed_checks: Mapping[str, str] | None = None,
                         progress: Callable[[Result], object] | None = None,
                         settings=None, first_red: bool = False,
                         quick: bool = False, deep: bool = False,
                         thin_rows: Mapping[str, str] | None = None) -> CheckReport:
    """Run the selected checks on ``impl`` in this process (for scripts and notebooks; the
    ``minibert check`` command runs the same checks in worker processes) and return the
    :class:`CheckReport`.  ``settings``: Hypothesis settings for every check (default
    :func:`minibert_spec.suite.run.check_settings`).  ``first_red``: the checks run cheapest and
    most decisive first, and the run stops at the first failure (the rest are ``not run``).
    ``quick``: the quick run (each check on its fixed examples alone); ``deep``: the deep tier
    (see :func:`parametrize_with_checks`); the report says which tier ran
    (``report.depth``).  ``thin_rows`` (op -> reason, as ``minibert check --thin``): rows known
    to be checked on too little evidence, ``thin`` rather than ``not judged`` (an op the
    protocol does not have is a ValueError).  An unknown id in ``expected_failed_checks`` is a
    ValueError naming the closest known ids; an implementation
    that does not load (a ``"pkg.mod[:obj]"`` whose import raises, exits, crashes or hangs) or
    whose ``CAPABILITIES`` the protocol cannot take (minibert_spec.protocol.capabilities) is a
    report
    that could not run (exit status 2) with the reason."""
    plan = plan_run(impl, ids=ids, kinds=kinds, ops=ops, match=match, bad_input=bad_input,
                    oracle=oracle, timeout=timeout, expected_failed_checks=expected_failed_checks,
                    settings=settings, first_red=first_red, quick=quick, deep=deep,
                    thin_rows=thin_rows)
    return execute(plan, progress=progress)
