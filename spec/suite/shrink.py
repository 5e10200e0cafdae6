"""What shrinking costs a run: one budget of CPU seconds for the whole run (not a cap per failing
check), and each cause of failure shrunk once.

Why: on real buggy code one cause -- a float32 -> float64 promotion, an exception raised on one
line of the implementation -- fails many checks, and each of them shrank its counterexample
for seconds: most of a run went to shrinking the same cause again.  The verdict never depends
on shrinking (the example Hypothesis found first already fails); only the example a red shows
is smaller when shrunk.

How shrinking stops: through Hypothesis's own shrinker stop (``StopShrinking``, what it does
when shrinking stalls: the best example so far is reported).  Hypothesis's explain phase,
which re-ran a shrunk example hundreds of times under a coverage tracer (~5 s per red), is
off (minibert_spec.suite.run.check_settings).  The
suite used to lower the engine's ``MAX_SHRINKING_SECONDS`` (300 s) to 5 s instead, which ended
shrinking through the engine's "very slow shrinking" abort -- and that abort prints "Hypothesis
has spent more than five minutes working to shrink a failing test case ... PLEASE REPORT THIS"
whatever the limit: once per failing check, and false (no five minutes were spent).  The
engine's limit is now left as Hypothesis ships it.

A cause (:func:`cause_of`): an exception raised by the implementation is its type and the
file:line it was raised at; a dtype promotion is the dtypes named.  A disagreement found by a
check's own assertion (a wrong value at an index) has no cause in common with another check's:
each is shrunk within the budget.  The report groups the reds of one cause
(minibert_spec.suite.report.Report.groups); the verdicts are unchanged.
"""

from __future__ import annotations

import functools
import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

# Seconds of shrinking for a whole run (``minibert check``, one check_implementation call, one
# pytest process): enough to minimise the first few reds; later reds show the example found.
# CPU seconds of the process that shrinks, not wall-clock ones: on a busy machine a wall-clock
# budget ran out sooner, so one implementation's red showed another example (broken_impl's
# sympy[layernorm.backward.dx] at size 4, not 2, at load 12-16 on 2 cores): two runs must agree.
RUN_SHRINK_SECONDS = 5.0
# ... and a wall-clock bound on one check's shrinking, for code that is slow without using the
# CPU (sleeps, waits): the budget alone would then never run out
SHRINK_WALL_SECONDS = 20.0

_SPEC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the spec package
# "float32 in -> float32 out (got float64)", "float32 inputs gave float64 (a silent cast)"
_PROMOTION = re.compile(r"\b(float16|float32)\b[^;\n]*?\b(?:gave|got|promoted to)\b[^;\n]*?"
                        r"\b(float64|float32)\b")
# "linear forward: dtype float64, expected float32" (the oracle's comparison)
_PROMOTION_EXPECTED = re.compile(r"\bdtype (float64|float32), expected (float16|float32)\b")


PROMOTION_CAUSE = "dtype promotion"


@dataclass
class ShrinkBudget:
    """The run's shrinking: ``seconds`` left, and the causes already shrunk."""

    seconds: float = RUN_SHRINK_SECONDS
    shrunk: set = field(default_factory=set)


def is_failure(e: BaseException) -> bool:
    """An exception Hypothesis counts as the test failing (and shrinks): not its own control
    flow (``assume``, an exhausted draw) nor a check found not applicable."""
    from hypothesis.errors import HypothesisException

    from minibert_spec.protocol import NotApplicable

    return isinstance(e, Exception) and not isinstance(e, (HypothesisException, NotApplicable))


def cause_of(e: BaseException) -> str:
    """The cause a red shares with others ("" when it is the check's own finding): a dtype
    promotion named in the message, or an exception raised in the implementation (its type
    and the file:line of the innermost frame outside the suite)."""
    text = str(e)
    m = _PROMOTION.search(text)
    found = (m.group(1), m.group(2)) if m else None
    m = _PROMOTION_EXPECTED.search(text)
    found = found or ((m.group(2), m.group(1)) if m else None)
    if found and found[0] != found[1]:
        return f"{PROMOTION_CAUSE}: {found[0]} in, {found[1]} out"
    if isinstance(e, AssertionError) and _innermost(e, outside_spec=False)[0].startswith(_SPEC):
        return ""  # the check's own assertion: a value at an index, this check's finding
    where = _innermost(e, outside_spec=True)
    if where[0] == "":
        return ""
    return f"{type(e).__name__} raised at {os.path.basename(where[0])}:{where[1]} ({where[2]})"


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    """Where the libraries the suite calls through live: the suite itself, NumPy (wherever it is
    installed), the standard library and any site-/dist-packages."""
    import sysconfig

    import numpy

    dirs = {_SPEC, os.path.dirname(os.path.abspath(numpy.__file__))}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.add(os.path.abspath(path))
    return tuple(sorted(dirs))


def is_user_path(path: str) -> bool:
    """A file of the implementation under test (not the suite, NumPy, the standard library,
    an installed package or generated code)."""
    path = os.path.abspath(path)
    return not (path.startswith(_library_dirs()) or "site-packages" in path
                or "dist-packages" in path or os.path.basename(path).startswith("<"))


def _innermost(e: BaseException, *, outside_spec: bool) -> tuple[str, int, str]:
    """(file, line, function) of the innermost frame of ``e``'s traceback (``outside_spec``:
    the innermost one of the implementation's own files, :func:`is_user_path`: a TypeError
    raised inside NumPy's einsumfunc.py is located at the user's line that called einsum)."""
    tb, found = e.__traceback__, ("", 0, "")
    while tb is not None:
        code = tb.tb_frame.f_code
        path = os.path.abspath(code.co_filename)
        if not outside_spec or is_user_path(path):
            found = (path, tb.tb_lineno, code.co_name)
        tb = tb.tb_next
    return found


def user_frame(e: BaseException) -> tuple[str, int, str]:
    """(file, line, function) where an exception from the implementation is the user's: the
    innermost frame of the user's own code, else the innermost frame at all."""
    where = _innermost(e, outside_spec=True)
    return where if where[0] else _innermost(e, outside_spec=False)


class _Tracker:
    """One check's shrinking under the run's budget (see :func:`bounded`)."""

    def __init__(self, budget: ShrinkBudget):
        self.budget = budget
        self.cause: str | None = None  # of the first failing example
        self.failed_at: float | None = None  # CPU seconds (time.process_time)
        self.failed_wall: float | None = None

    def saw(self, e: BaseException) -> None:
        if self.failed_at is None:
            self.failed_at, self.failed_wall = time.process_time(), time.perf_counter()
            self.cause = cause_of(e)

    def stop_now(self) -> bool:
        if self.failed_at is None:
            return False
        if self.cause and self.cause in self.budget.shrunk:
            return True  # shrunk once already: this red shows the example found
        return (self.spent() > self.budget.seconds
                or time.perf_counter() - self.failed_wall > SHRINK_WALL_SECONDS)

    def spent(self) -> float:
        return 0.0 if self.failed_at is None else time.process_time() - self.failed_at


_ACTIVE: list[_Tracker] = []  # the check running now (innermost last)


def _install() -> None:
    """Wrap Hypothesis's ``Shrinker.check_calls`` (once per process): inside a check run by
    :func:`bounded`, shrinking stops as a stalled shrink does; elsewhere (a user's own
    Hypothesis tests) it is Hypothesis's own."""
    from hypothesis.internal.conjecture.shrinker import Shrinker, StopShrinking

    original = Shrinker.check_calls
    if getattr(original, "minibert_budget", False):
        return

    def check_calls(self):
        if _ACTIVE and _ACTIVE[-1].stop_now():
            raise StopShrinking
        return original(self)

    check_calls.minibert_budget = True
    Shrinker.check_calls = check_calls


@contextmanager
def bounded(budget: ShrinkBudget):
    """Run one check with its shrinking under ``budget``; yields the tracker, whose
    :meth:`_Tracker.saw` the check calls with each exception an example raised.  Afterwards
    the time spent shrinking is taken from the budget, and the cause marked shrunk."""
    _install()
    tracker = _Tracker(budget)
    _ACTIVE.append(tracker)
    try:
        yield tracker
    finally:
        _ACTIVE.pop()
        if tracker.failed_at is not None:
            budget.seconds = max(0.0, budget.seconds - tracker.spent())
            if tracker.cause:
                budget.shrunk.add(tracker.cause)


# the budget of this process when the caller gives none (one pytest process, one script)
PROCESS_BUDGET = ShrinkBudget()
