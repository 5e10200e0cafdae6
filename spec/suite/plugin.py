"""What the pytest plugin does once ``--minibert-impl`` is given.

The hooks pytest calls live in ``minibert_spec._pytestplugin`` (the ``pytest11`` entry point), which
imports nothing else of the project and calls :func:`configure` only when the
option is given.  It imports the implementation in a child process first
(:func:`minibert_spec.suite.probe.probe_import`): an import that exits, crashes or hangs stops the
session at once with its reason in one line and a non-zero status, as does one that raises, an
unknown ``--minibert-xfail`` id or a declaration the protocol refuses.  Then it adds the shipped
suite module (``test_implementation.py``) to the session.

It never loads a Hypothesis profile: checks inherit the profile the user loaded, or the suite's
own settings when none was (minibert_spec.suite.run.check_settings), applied per check.
"""

from __future__ import annotations

from pathlib import Path

import pytest  # loaded already: pytest is what loads this plugin

SUITE_MODULE = Path(__file__).with_name("test_implementation.py")


def configure(config) -> None:
    """The run's plan (minibert_spec.suite.plan: ``--minibert-impl`` loaded, a child process
    first, ``--minibert-xfail`` resolved...), then the suite module collected; any failure is a
    ``pytest.UsageError`` of one line."""
    from minibert_spec.suite.plan import plan_run
    from minibert_spec.suite.report import expectations_from_args

    spec = config.getoption("minibert_impl")
    _current_directory_first()
    try:
        config._minibert_plan = plan_run(
            spec, timeout=config.getoption("minibert_timeout"),
            oracle=config.getoption("minibert_oracle"),
            bad_input=config.getoption("minibert_bad_input"),
            quick=config.getoption("minibert_quick"), deep=config.getoption("minibert_deep"),
            expected_failed_checks=expectations_from_args(config.getoption("minibert_xfail")),
            database="auto", flag=_flag)
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    if config._minibert_plan.load_error is not None:  # stops the session at once, one line
        raise pytest.UsageError(f"--minibert-impl {spec}: {config._minibert_plan.load_error}")
    config.args.append(str(SUITE_MODULE))
    _exit_guard(config, spec)


def _flag(argument: str) -> str:
    """An argument of minibert_spec.suite.plan.plan_run as the plugin's option spells it."""
    return "--minibert-xfail" if argument == "expected_failed_checks" else \
        "--minibert-" + argument.replace("_", "-")


def _exit_guard(config, spec: str) -> None:
    """The session goes on in a forked child while this process waits for it: a check whose
    implementation ends the process (``os._exit(0)`` in a forward, an exit from a thread) used
    to end pytest with status 0 and half a report.  The child marks a session that ran to its
    end (``pytest_unconfigure``); without the mark, this process says so in one line and
    exits non-zero -- as ``minibert check``'s workers do.  Not under an xdist worker (its
    controller sees a lost worker) nor where there is no fork."""
    import os
    import sys
    import tempfile

    if not hasattr(os, "fork") or hasattr(config, "workerinput"):
        return
    fd, mark = tempfile.mkstemp(prefix="minibert-session-")
    os.close(fd)
    os.unlink(mark)  # created by the child at the session's end
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: the session itself
        config._minibert_session_mark = mark
        return
    code = _wait(pid, mark)
    if os.path.exists(mark):
        with open(mark) as f:
            said = f.read()
        os.unlink(mark)
        if os.path.exists(mark + RUNNING):
            os.unlink(mark + RUNNING)
        # the session's own status: also when a thread the implementation left behind kept
        # the child from exiting (it was killed after the grace period)
        os._exit(int(said) if said.strip().lstrip("-").isdigit() else code)
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        capman.suspend_global_capture(in_=True)
    how = f"killed by signal {-code}" if code < 0 else f"ended with exit status {code}"
    print(f"\nminibert: --minibert-impl {spec}: the session {how} before it finished "
          f"({_who_ended_it(mark)}): not a verdict", file=sys.stderr, flush=True)
    os._exit(1 if code == 0 else code if code > 0 else 128 - code)


def _who_ended_it(mark: str) -> str:
    """Which test ran when the session ended (:func:`running` wrote it): a check of the suite
    (then the implementation ended the process), a test of the user's own collected beside the
    suite (not the implementation under check, as far as the suite knows), or none yet."""
    import os

    try:
        with open(mark + RUNNING) as f:
            kind, _, nodeid = f.read().partition(" ")
        os.unlink(mark + RUNNING)
    except OSError:
        return ("before any test ran: during collection, a test module's import or the "
                "implementation's ended the process")
    if kind == "suite":
        return (f"while running {nodeid}, a check of the suite: the implementation ended the "
                "process: os._exit, an exit from a thread, a crash")
    return (f"while running {nodeid}, a test of your own collected with the suite, not one of "
            "its checks: it, or what it called, ended the process")


# beside the session mark: the test running now ("suite <nodeid>" or "user <nodeid>")
RUNNING = ".running"


def running(mark: str, nodeid: str, of_suite: bool) -> None:
    """Called by the plugin's ``pytest_runtest_setup`` under the exit guard (``mark``: its
    session mark): the test that runs now, for the guard's message if the session ends during
    it (one small write per test)."""
    with open(mark + RUNNING, "w") as f:
        f.write(f"{'suite' if of_suite else 'user'} {nodeid}")


# seconds a child that marked its session finished may take to exit (a non-daemon thread of
# the implementation's holds it at the interpreter's exit: then it is killed)
EXIT_GRACE = 10.0


def _wait(pid: int, mark: str) -> int:
    """The child's exit code (negative: the signal), or its session's status once it marked
    the session finished and did not exit within :data:`EXIT_GRACE` seconds (then killed)."""
    import os
    import signal
    import time

    marked_at = None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if marked_at is None and os.path.exists(mark):
            marked_at = time.monotonic()
        if marked_at is not None and time.monotonic() - marked_at > EXIT_GRACE:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return 0  # the mark's status decides
        time.sleep(0.05)


def session_finished(config) -> None:
    """Called by the plugin's ``pytest_unconfigure``: the mark :func:`_exit_guard` waits for,
    holding the session's exit status (written whole: a rename)."""
    import os

    mark = getattr(config, "_minibert_session_mark", None)
    if mark:
        with open(mark + ".part", "w") as f:
            f.write(str(int(getattr(config, "_minibert_exitstatus", 0))))
        os.replace(mark + ".part", mark)


def _current_directory_first() -> None:
    """The current directory at the front of ``sys.path``, where ``minibert check`` and
    ``python -m pytest`` look first: ``pytest --minibert-impl=mybert`` (whose script's path
    does not hold it) finds a mybert.py beside the user as they do."""
    import os
    import sys

    cwd = os.getcwd()
    if not any(os.path.abspath(p or os.curdir) == cwd for p in sys.path):
        sys.path.insert(0, cwd)


def answer_to_former_ids(config, items) -> None:
    """A check of the suite answers to its former id too (one release,
    minibert_spec.suite.registry.ALIASES), and a ``-k`` naming a former id warns with the new one.
    Called by minibert_spec._pytestplugin's collection hook only when the session holds checks of
    the
    suite (items marked ``suite_check``), before ``-k`` deselects."""
    import re
    import warnings

    from minibert_spec.suite.registry import ALIASES

    marked = [(item, m.args[0]) for item in items for m in item.iter_markers("suite_check")]
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
