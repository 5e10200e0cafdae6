"""Running one check on one implementation: the settings it runs under, its time limit, and the
:class:`Result` it comes to.  The pytest plugin, :func:`minibert_spec.suite.check_implementation`
and the worker processes of ``minibert check`` all run checks through :func:`run_check`, so a check
has one verdict whichever way it is run.

Outcomes:

* ``passed``; ``failed`` (the message names the tensor, the index and both values, then the
  Hypothesis example that reproduces it);
* ``n/a``: the implementation lacks a name the check needs, or does not claim a capability it
  uses (the reason says which);
* ``error``: the check could not run here (an optional extra such as torch is not installed
  while the oracle is required) -- never a pass;
* ``not run``: the run stopped at its first red before this check (``--first-red``,
  ``first_red=True``) -- never a pass either.

A check runs with the time limit given (SIGALRM in the main thread): past it, the check fails
with "did not finish within N s", and the protocol names that were executing are marked hung so
that no later check waits on them again.
"""

from __future__ import annotations

import re
import signal
import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from minibert_spec.protocol import (
    ImplementationExit,
    ImplementationHung,
    ImplProxy,
    NotApplicable,
    label_of,
    load_impl,
    not_claimed_message,
    unwrap,
)
from minibert_spec.protocol.capabilities import declared_variants, unmet
from minibert_spec.protocol.composed import ModelOfRows
from minibert_spec.suite.registry import Blame, Check

# Time limit of one example of a check by default, seconds (a fixed-seed check is one example).
# The slowest example of the reference on the 2-core machine takes ~3 s (a whole Mini-BERT
# oracle case in float32 at B=3, T=8; `minibert check reference --format json`: "seconds" per
# check); 30 s is 10x that (a loaded machine must not turn a slow example into a red), and
# keeps a hanging op's red within a minute.  Per example, not per check: the deep profile's
# 2000 examples of a check take minutes, each of them seconds.
DEFAULT_TIMEOUT = 30.0
# The suite's own Hypothesis settings when the caller has not chosen a profile: every run of
# one implementation draws the same examples (derandomized: two runs give one verdict).  The
# tiers: how many examples each check draws after its fixed-seed ones.  The standard tier
# (the default) draws 3: on 11 buggy implementations (7 public repositories) its red rows
# were those of 1 and of 10 drawn examples, while the quick run (nothing drawn) missed two
# real LayerNorm bugs; the deep tier draws 10 (the default before issue 40) and adds the
# whole-model checks at the mini_bert preset's size (Check.deep), seconds each.
TIERS = {"quick": 0, "standard": 3, "deep": 10}
DEFAULT_TIER = "standard"
DEFAULT_MAX_EXAMPLES = TIERS[DEFAULT_TIER]
ORACLE_MODES = ("require", "off")
NOT_RUN = "not run"
STOPPED = "not run: stopped at the first red (--first-red)"
INSTALL_HINT = {"torch": "pip install 'minibert-spec[oracle]'",
                "transformers": "pip install 'minibert-spec[oracle]'"}


@dataclass
class Result:
    """What one check came to on one implementation."""

    id: str
    kind: str
    ops: tuple[str, ...]
    outcome: str  # passed | failed | n/a | error | not run (| xfailed | xpassed: expectations)
    message: str = ""
    seconds: float = 0.0
    conventions: list[str] = field(default_factory=list)
    # what the red shares with other reds (minibert_spec.suite.shrink.cause_of; "" for its own
    # finding)
    cause: str = ""
    # the examples the check's body ran to the end on (fixed-seed and drawn; assume()-rejected
    # ones not counted; 1 for a fixed check)
    examples: int = 0

    def to_json(self) -> dict:
        d = asdict(self)
        d["ops"] = list(self.ops)
        return d


class CheckTimeout(BaseException):
    """A check ran past its time limit (a BaseException: ``except Exception`` in the
    implementation cannot swallow it)."""


@contextmanager
def one_torch_thread():
    """torch's intra-op pool at one thread while a check runs, when torch is already loaded (a
    torch implementation, the oracle): as for BLAS below, its threads spinning beside other
    work made the checks of a torch implementation 8x slower (12 s -> 1.5 s quick, 7 ops, on
    2 loaded cores).  Imports nothing; the caller's setting is restored."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


@contextmanager
def draws_from_seed_alone():
    """Hypothesis's draws without the constants it reads from the source of the "local"
    modules loaded so far (since Hypothesis 6.131 about 5% of its draws come from them):
    which modules a process has loaded depends on the checks it ran before (a worker of the
    pool, lazily imported equations), on an editable install or a wheel (site-packages are not
    local), so one check drew other examples alone than in a full run and a red's rerun line
    could miss it.  Inside, the examples follow from the seed and the check alone; the caller's
    Hypothesis (a user's own tests in the same pytest session) is restored after.  A Hypothesis
    without the pool: nothing to do (tests/suite/test_draws_reproducible.py)."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - another Hypothesis layout: no constants pool
        yield
        return
    read = getattr(providers, "_get_local_constants", None)
    cache = getattr(providers, "CONSTANTS_CACHE", None)
    if read is None or cache is None:  # pragma: no cover
        yield
        return
    none = type(providers._local_constants)()  # an empty Constants
    cache.cache.clear()  # (type, constraints) -> (global, local) constants, local included
    providers._get_local_constants = lambda: none
    try:
        yield
    finally:
        providers._get_local_constants = read
        cache.cache.clear()


_BLAS_CONTROLLER: list = [-1, None]  # [len(sys.modules) when found, the controller]


def one_blas_thread():
    """BLAS at one thread while a check runs, the caller's setting restored after (threadpoolctl's
    ``threadpool_limits(limits=1, user_api="blas")``), with the libraries found once per set of
    imported modules: ``threadpool_limits`` looks for them afresh on every call (every loaded
    shared object, 0.13-0.9 ms a check).  A BLAS library is loaded by an import (NumPy's, torch's),
    so a new module is when to look again; one loaded some other way keeps its own threads (slower,
    never another verdict)."""
    import sys

    from threadpoolctl import ThreadpoolController

    if _BLAS_CONTROLLER[0] != len(sys.modules):
        _BLAS_CONTROLLER[:] = [len(sys.modules), ThreadpoolController()]
    return _BLAS_CONTROLLER[1].limit(limits=1, user_api="blas")


@contextmanager
def time_limit(seconds: float | None, what: str):
    """Raise :class:`CheckTimeout` in the main thread after ``seconds`` (SIGALRM; no limit
    where that is unavailable: off the main thread, or on Windows).  ~10 us a call."""
    usable = (seconds and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def expire(signum, frame):
        raise CheckTimeout(f"{what} did not finish within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# --------------------------------------------------------------------------- settings
def tier_of(quick: bool = False, deep: bool = False) -> str:
    """The tier a run's flags ask for (:data:`TIERS`); a ValueError for both."""
    if quick and deep:
        raise ValueError("quick and deep: expected one tier, got both (--quick draws nothing, "
                         "--deep draws the most)")
    return "quick" if quick else "deep" if deep else DEFAULT_TIER


def depth(tier: str, max_examples: int | None = None, settings=None) -> dict:
    """What a report says of its depth: the tier, and the examples each check draws after its
    fixed-seed ones -- read from the settings the checks run under: ``settings``, else
    :func:`check_settings`'s (the one rule: ``max_examples`` when given, else the profile the
    caller chose, else the tier's)."""
    if tier not in TIERS:
        raise ValueError(f"tier: expected one of {list(TIERS)}, got {tier!r}")
    from minibert_spec.suite.registry import is_quick

    applied = settings if settings is not None else check_settings(
        max_examples=0 if tier == "quick" else max_examples, tier=tier)
    drawn = 0 if is_quick(applied) else applied.max_examples
    return {"tier": tier, "drawn_per_check": drawn,
            "mini_bert_size_model_checks": tier == "deep"}


def depth_line(d: dict) -> str:
    """The report header's words for :func:`depth`."""
    if not d:
        return ""
    if d["tier"] == "quick":  # drawn only where the caller's own settings draw
        return ("tier quick: the fixed-seed examples alone, nothing drawn"
                if not d["drawn_per_check"] else
                f"tier quick: the quick checks, the fixed-seed examples + "
                f"{d['drawn_per_check']} drawn per check (the settings given)")
    return (f"tier {d['tier']}: the fixed-seed examples + {d['drawn_per_check']} drawn per "
            "check, the whole model at "
            + ("every size, mini_bert's included" if d["mini_bert_size_model_checks"]
               else "tiny configurations (mini_bert's size: --deep)"))


def profile_chosen() -> bool:
    """Whether the caller loaded a Hypothesis profile of their own, whose ``max_examples`` and
    ``derandomize`` the checks then inherit.  Neither Hypothesis's ``default`` nor the ``ci``
    profile Hypothesis loads by itself where it sees a CI variable (``CI=true``...) is a
    choice: under that one every check drew 100 examples, 33 times the standard tier, in every
    user's CI.  A ``ci`` profile the user registered (which replaces Hypothesis's) is one."""
    from hypothesis import _settings, settings

    name = settings.get_current_profile_name()
    if name in (None, "default"):
        return False
    return not (name == "ci" and settings.get_profile("ci") is getattr(_settings, "CI", None))


def check_settings(*, database=None, max_examples: int | None = None,
                   derandomize: bool | None = None, shrink: bool = True,
                   tier: str = DEFAULT_TIER):
    """The Hypothesis settings a check runs under, built per check (never loaded as a global
    profile).  Inherited from the profile the caller loaded (their ``max_examples``,
    ``derandomize``...); when none was chosen (Hypothesis's own ``default``), the suite's:
    the ``tier``'s examples (:data:`TIERS`), derandomized.  Always: no deadline (a
    whole-model check takes seconds), one failure reported (the first, shrunk within the
    run's budget: minibert_spec.suite.shrink), the given
    ``database`` (None: no database; none either when derandomized, which draws the same
    examples every run), no explain phase.  ``shrink=False``: a failure is reported as found (the
    verdict is the same; only its example is not minimised).  ``max_examples=0``: the quick run
    -- each check's explicit examples alone (the case families' fixed-seed cases), nothing
    drawn."""
    from hypothesis import HealthCheck, Phase, settings

    parent = settings.default
    chosen = profile_chosen()
    kw = {}
    if tier not in TIERS:
        raise ValueError(f"tier: expected one of {list(TIERS)}, got {tier!r}")
    if not chosen:
        kw.update(max_examples=TIERS[tier] or 1, derandomize=True)
    if max_examples == 0 or (max_examples is None and not chosen and TIERS[tier] == 0):
        kw["phases"] = [Phase.explicit]
    elif max_examples is not None:
        kw["max_examples"] = max_examples
    if derandomize is not None:
        kw["derandomize"] = derandomize
    if kw.get("derandomize", parent.derandomize):
        database = None  # derandomized: the same examples every run, nothing to replay
    if "phases" not in kw:
        # no explain phase: after shrinking, Hypothesis re-ran the example up to 500 times per
        # argument under a coverage tracer to annotate it ("or any other generated value"):
        # ~5 s per red, outside any shrink budget, for a comment on the example
        dropped = (Phase.explain,) if shrink else (Phase.shrink, Phase.explain)
        kw["phases"] = [p for p in parent.phases if p not in dropped]
    # filter_too_much: the checks assume() kinks and near-constant rows away, and under a
    # random profile a run of rejected draws raised FailedHealthCheck -- a red on a correct
    # implementation.  Not a verdict: a check that can satisfy none still ends Unsatisfiable
    return settings(parent, deadline=None, report_multiple_bugs=False, database=database,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.differing_executors,
                                           HealthCheck.filter_too_much], **kw)


def database_for(impl_label: str, root=None):
    """The example database of one implementation, under ``root`` (default: Hypothesis's own
    storage directory, the caller's ``.hypothesis/``), in ``minibert/<implementation>``:
    examples found against one implementation are never replayed against another; within
    it, each check has its own key (its id)."""
    import os

    from hypothesis.configuration import storage_directory
    from hypothesis.database import DirectoryBasedExampleDatabase

    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", impl_label).strip("_") or "impl"
    if root is None:
        return DirectoryBasedExampleDatabase(str(storage_directory("minibert", slug).path))
    return DirectoryBasedExampleDatabase(os.path.join(str(root), "minibert", slug))


# the seed of a run that shares an example database without choosing one: Hypothesis reads no
# database when derandomized, so such a run draws from this seed instead (combined with each
# check's id, as --seed is: still the same examples every run, and sharding changes nothing)
SHARED_DATABASE_SEED = 0


def shared_database(impl_label: str, write=None, replay=()):
    """The example database of a run that shares one with other runs (CI jobs, nightly and
    pull-request runs): ``write``, a directory whose database (:func:`database_for`) the run
    reads and adds its failures to, and ``replay``, directories whose databases it only reads
    (Hypothesis's ``ReadOnlyDatabase``), multiplexed (``MultiplexedDatabase``): a
    counterexample saved by any of them is tried first (Hypothesis's reuse phase), before
    anything is drawn.  None when neither is given."""
    from hypothesis.database import MultiplexedDatabase, ReadOnlyDatabase

    dbs = [database_for(impl_label, write)] if write else []
    dbs += [ReadOnlyDatabase(database_for(impl_label, r)) for r in replay or ()]
    if not dbs:
        return None
    return dbs[0] if len(dbs) == 1 else MultiplexedDatabase(*dbs)


def run_seed(seed: int | None, shares_database: bool) -> int | None:
    """The seed a run draws from: ``seed``; with none given, :data:`SHARED_DATABASE_SEED` when
    the run shares an example database, else None (derandomized)."""
    return SHARED_DATABASE_SEED if seed is None and shares_database else seed


# --------------------------------------------------------------------------- messages
def failure_message(e: BaseException, limit: int = 2000) -> str:
    """The failure's own message, then Hypothesis's reproduction (its notes: the falsifying
    example as a call), never empty."""
    text = str(e).strip()
    head = f"{type(e).__name__}: {text}" if text else type(e).__name__
    if isinstance(e, AssertionError) and text:
        head = text
    elif not isinstance(e, AssertionError):
        head += raised_at(e)
    notes = [n for n in getattr(e, "__notes__", ()) if n.strip()]
    repro = "; ".join(n.strip().replace("\n", " ") for n in notes if "Falsifying" in n
                      or "example" in n.lower() or "seed" in n.lower())
    out = head + (f"\nreproduce: {repro}" if repro else "")
    return out[:limit]


def raised_at(e: BaseException) -> str:
    """`` (raised in function, file:line)``: where an exception from the implementation (a
    TypeError, a ZeroDivisionError) came from -- the innermost frame of the user's own code
    (minibert_spec.suite.shrink.user_frame: NumPy's einsumfunc.py is not where the user's bug is),
    else the innermost frame."""
    import os

    from minibert_spec.suite.shrink import user_frame

    path, line, function = user_frame(e)
    if not path:
        return ""
    return f" (raised in {function}, {os.path.basename(path)}:{line})"


def reproduction(check: Check, label: str, built: bool = False) -> str:
    """The one line that reruns this check alone (its examples come from a seed derived from
    its id, so the same failure comes back).  ``built``: the implementation is the model the
    suite built of ``label``'s rows (``--model``: minibert_spec.suite.model_of_rows)."""
    model, impl = (" --model", "model_of_rows(impl)") if built else ("", "impl")
    return (f"rerun: minibert check {label}{model} -k '^{re.escape(check.id)}$' (or "
            f"minibert_spec.suite.check_implementation({impl}, ids=[{check.id!r}]))")


def one_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else ""


def _convention_text(w: warnings.WarningMessage) -> str | None:
    from minibert_spec.protocol.capabilities import ConventionWarning

    text = str(w.message)
    if issubclass(w.category, ConventionWarning):
        return text
    if text.startswith("convention:"):
        return text[len("convention:"):].strip()
    return None


_PROMOTIONS: dict = {}  # (implementation, ops) -> the promotion found, once per process


def promotion_of(proxy, ops, timeout):
    """The line that first makes float64 out of float32 in the implementation's ``ops``
    (minibert_spec.suite.promotion.locate), located once per implementation and ops, under the
    check's
    time limit; None where it cannot be found."""
    key = (id(object.__getattribute__(proxy, "_impl_obj")), tuple(ops))
    if key not in _PROMOTIONS:
        from minibert_spec.suite.promotion import locate

        try:
            with time_limit(timeout, "locating a dtype promotion"):
                _PROMOTIONS[key] = locate(proxy, ops)
        except (Exception, CheckTimeout):  # noqa: BLE001 -- locating only
            _PROMOTIONS[key] = None
    return _PROMOTIONS[key]


# --------------------------------------------------------------------------- order
# the ops whose checks cost most (idle, reference: model 13.6 s over 126 checks, block 10.4 s
# over 68, against ~0.05 s for an op's check): run last, after the cheap decisive ones
COMPOSITE_OPS = frozenset({"model", "block"})
KIND_ORDER = ("bad_input", "fd", "invariant", "sympy", "oracle.backward", "oracle.forward")


def first_red_order(checks):
    """``checks`` in the order that finds a red soonest: the suite's own checks before the
    oracle's (finite differences, invariants and SymPy need no torch: they run while the fork
    server imports it), the fixed-seed checks (one example, decisive: each names the tensor at
    once) before the drawn ones, finite differences on small shapes, then invariants, then
    SymPy; the checks of the composite ops (the whole model, the block: seconds each) last.
    Stable: the registry's order within a rank.  Only the order they run in: every check's
    verdict is its own (each draws from a seed derived from its id)."""
    def rank(c):
        return (bool(COMPOSITE_OPS & set(c.ops)), c.oracle, c.given is not None,
                KIND_ORDER.index(c.kind) if c.kind in KIND_ORDER else len(KIND_ORDER))
    return sorted(checks, key=rank)


def stopped_results(checks) -> list[Result]:
    """The results of checks a run stopped before (first red)."""
    return [Result(c.id, c.kind, c.ops, NOT_RUN, STOPPED) for c in checks]


# --------------------------------------------------------------------------- running
def as_proxy(impl, label: str | None = None) -> ImplProxy:
    """The implementation behind a proxy that raises NotApplicable for a missing name:
    ``impl`` may be a module, an object, a ``"pkg.mod:obj"`` string or a proxy already."""
    if isinstance(impl, ImplProxy):
        return impl
    if isinstance(impl, str):
        label = label or impl
        impl = load_impl(impl)
    else:  # a bare function is a whole model (minibert_spec.protocol.wholemodel)
        from minibert_spec.protocol.loading import as_implementation

        impl = as_implementation(impl)
    return ImplProxy(impl, label or label_of(impl))


def absent_ops(check: Check, proxy) -> str | None:
    """Why the check is not applicable when the implementation provides no name of any op the
    check counts for (else None: the check itself finds a name it lacks)."""
    from minibert_spec.protocol import OPS, provides

    if not check.ops or any(op not in OPS for op in check.ops) or any(
            provides(proxy, name) for op in check.ops for name in OPS[op].names):
        # (an op the implementation declares, minibert_spec.ops, brings its own functions)
        return None
    return absent_message(proxy._impl_label, check.ops)


# the end of a check's n/a reason when the implementation provides no name of its ops (the
# report collapses such rows into one line: minibert_spec.suite.report.CheckReport.not_provided)
NOT_PROVIDED = "not provided"


def absent_message(label: str, ops) -> str:
    from minibert_spec.protocol import OPS

    names = ", ".join(n for op in ops for n in OPS[op].names)
    return f"not applicable: {label} lacks {names}: {', '.join(ops)} {NOT_PROVIDED}"


def is_absent(message: str) -> bool:
    """The n/a reason :func:`absent_ops` gives (the implementation provides none of the
    check's ops)."""
    return message.startswith("not applicable: ") and message.endswith(NOT_PROVIDED)


def unavailable(check: Check, oracle: str = "require") -> Result | None:
    """The result of a check that cannot run here (no torch...), else None."""
    if check.oracle and oracle == "off":
        return Result(check.id, check.kind, check.ops, "n/a",
                      "oracle off (--oracle off / oracle='off'): not compared with torch")
    missing = check.missing_requirements()
    if missing:
        hint = INSTALL_HINT.get(missing[0], f"pip install {missing[0]}")
        return Result(check.id, check.kind, check.ops, "error",
                      f"{', '.join(missing)} not installed: {hint}, or turn the oracle off")
    return None


def run_check(check: Check, impl, *, settings=None, timeout: float | None = DEFAULT_TIMEOUT,
              oracle: str = "require", heartbeat=None, seed: int | None = None,
              shrink=None) -> Result:
    """Run ``check`` on ``impl`` (a proxy, module, object or spec string) and return its
    :class:`Result`; never raises for anything the implementation does (a real Ctrl-C
    excepted).  ``timeout`` bounds each example (one call of the check's body: a hang is
    caught within it whatever the number of examples); ``heartbeat()`` is called before each
    example (the worker's sign of life, the plugin's hard deadline re-armed).  ``seed``:
    examples drawn from that seed instead of the settings' (derandomized by default).
    ``shrink``: the run's :class:`~minibert_spec.suite.shrink.ShrinkBudget` (default: this
    process's)."""
    from minibert_spec import protocol

    if oracle not in ORACLE_MODES:
        raise ValueError(f"oracle: expected one of {ORACLE_MODES}, got {oracle!r}")
    skipped = unavailable(check, oracle)
    if skipped is not None:
        return skipped
    if check.prepare is not None:
        check.prepare()
    proxy = as_proxy(impl)
    lacking = absent_ops(check, proxy)
    if lacking is not None:  # before anything is imported or drawn: an n/a costs nothing
        return Result(check.id, check.kind, check.ops, "n/a", lacking)
    if check.needs:  # decided before anything is drawn: never a skip by the chance of a draw
        reason = unmet(object.__getattribute__(proxy, "_impl_caps"), check.needs)
        if reason is not None:
            return Result(check.id, check.kind, check.ops, "n/a",
                          not_claimed_message(proxy._impl_label, reason))

    from minibert_spec.suite import shrink as shrinking

    tracker = None

    @contextmanager
    def each_call():  # the time limit of one example, and the caller's sign of life
        if heartbeat is not None:
            heartbeat()
        try:
            with time_limit(timeout, f"{check.id}: an example"):
                yield
        except Exception as e:
            if tracker is not None and shrinking.is_failure(e):
                tracker.saw(e)  # the first failure's cause decides its shrinking
            raise

    if settings is None:
        settings = check_settings(derandomize=False if seed is not None else None)
    start = time.perf_counter()
    conventions: list[str] = []
    outcome, message, cause = "passed", "", ""
    ops = check.ops
    test = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            test = check.hypothesis_test(proxy, settings, each_call=each_call, seed=seed)
            # single-threaded BLAS: the checks' matrices are small, and OpenBLAS threads that
            # spin beside other work made a whole-model FD check 25x slower (1.2 s -> 30 s)
            with shrinking.bounded(shrink or shrinking.PROCESS_BUDGET) as tracker, \
                    one_blas_thread(), one_torch_thread(), draws_from_seed_alone():
                test()
        except NotApplicable as e:
            outcome, message = "n/a", str(e)
        except CheckTimeout as e:
            hung = proxy.mark_hung(check.id)
            outcome = "failed"
            message = str(e) + (f" (inside {' -> '.join(hung)})" if hung else "")
        except KeyboardInterrupt:
            if protocol.sigint_seen():
                raise
            outcome, message = "failed", "KeyboardInterrupt raised inside the implementation"
        except (ImplementationExit, ImplementationHung) as e:
            outcome, message = "failed", str(e)
        except BaseException as e:  # noqa: BLE001 -- anything else is the check's failure
            outcome, message = "failed", failure_message(e)
            cause = shrinking.cause_of(e)
            blamed = getattr(e, "ops", None) if isinstance(e, Blame) else None
            if blamed and set(blamed) <= set(check.ops):  # the check found which ops
                ops = tuple(blamed)
            if cause.startswith(shrinking.PROMOTION_CAUSE):  # which line, and the fix
                found = promotion_of(proxy, check.ops, timeout)
                if found is not None:
                    cause = f"{cause} at {found.where()}"
                    message = f"{message.rstrip()}\ncause: {found.describe()}"
    if outcome == "passed" and test is not None and not test.completed:
        # every explicit example of a quick run was filtered out: nothing was checked
        outcome, message = "n/a", (f"not applicable: no example of {check.id} applies to "
                                   f"{proxy._impl_label} (every one was filtered out)")
    for w in caught:
        text = _convention_text(w)
        if text is not None and text not in conventions:
            conventions.append(text)
    if outcome in ("passed", "failed"):  # the verdict says which variant it judged
        declared = declared_variants(object.__getattribute__(proxy, "_impl_caps"))
        for op in ops:
            conventions += [v for v in declared.get(op, ()) if v not in conventions]
    if outcome == "failed":
        if not message.strip():
            message = "failed without a message"  # never an empty red (spec/suite/run.py)
        model = unwrap(proxy)  # a model the suite built of the implementation's rows (--model)
        built = isinstance(model, ModelOfRows)
        message += "\n" + reproduction(check, model.label if built else proxy._impl_label, built)
    return Result(check.id, check.kind, ops, outcome, message,
                  round(time.perf_counter() - start, 3), conventions, cause,
                  len(test.completed) if test is not None else 0)
