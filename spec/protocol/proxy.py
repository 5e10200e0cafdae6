"""The proxy every check reaches an implementation through: a missing name is not applicable
(never a silent pass), a ``SystemExit`` inside the implementation is a failure, the
implementation's CAPABILITIES are applied (unclaimed biases, masks, weight decay are not
applicable; ranks are adapted), the names called and the names executing are recorded (a time
limit names the op it caught), a name that hung once is not waited on again, and an
implementation computing on another array library than NumPy gets its calls converted
(spec/protocol/arrays.py: NumPy in, its namespace out and back)."""

from __future__ import annotations

import functools
import importlib
import inspect
import unittest
from collections.abc import Callable

import numpy as np

from minibert_spec.protocol import arrays, variants
from minibert_spec.protocol.capabilities import (
    RANK_ADAPTABLE,
    capabilities,
    not_claimed_message,
    target_lead,
)
from minibert_spec.protocol.table import OPS, op_of_name


class NotApplicable(unittest.SkipTest):
    """The implementation lacks a protocol name the check needs, or does not claim a capability
    it uses.  A ``unittest.SkipTest``: Hypothesis re-raises it at once (no shrinking of a
    missing name) and pytest reports it as a skip with its reason."""


def not_applicable_message(label: str, name: str) -> str:
    return f"not applicable: {label} lacks {name}"


class ImplementationAbort(BaseException):
    """The check cannot go on with this implementation, whatever the inputs: a failure of the
    check that called it.  A BaseException, so that neither the implementation's own ``except
    Exception`` nor Hypothesis (which would shrink it, 5 s per check, for nothing: every input
    fails the same way) takes it for an ordinary error; the runner (minibert_spec.suite.run) reports
    it
    as the check's failure, never as the end of the run."""


class ImplementationExit(ImplementationAbort):
    """Implementation code raised a BaseException that is not an Exception (``SystemExit``,
    ``KeyboardInterrupt`` not caused by a real Ctrl-C, ``GeneratorExit``), converted so that no
    harness mistakes it for the end of the run (``sys.exit(0)`` inside an op must never read as
    success)."""


class ImplementationHung(ImplementationAbort):
    """A protocol name that ran past a check's time limit is called again: failed at once."""


# SIGINT seen by this process (install_interrupt_flag): a KeyboardInterrupt from a real Ctrl-C
# still stops the run; one raised by implementation code is a failure like any other.
_SIGINT_SEEN = False


def sigint_seen() -> bool:
    """A real Ctrl-C reached this process (install_interrupt_flag)."""
    return _SIGINT_SEEN


def install_interrupt_flag() -> None:
    """Record real Ctrl-Cs (main thread only; a no-op elsewhere)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGINT)
    if getattr(previous, "_minibert_flag", False):
        return

    def handler(signum, frame):
        global _SIGINT_SEEN
        _SIGINT_SEEN = True
        if callable(previous):
            return previous(signum, frame)
        raise KeyboardInterrupt

    handler._minibert_flag = True
    signal.signal(signal.SIGINT, handler)


def _converted(name: str, e: BaseException) -> BaseException | None:
    """The ImplementationExit for a BaseException raised by implementation code, else None
    (Exceptions, the harness's own outcomes -- pytest.skip, time-outs -- and real Ctrl-Cs)."""
    if isinstance(e, Exception):
        return None
    if isinstance(e, KeyboardInterrupt) and _SIGINT_SEEN:
        return None
    if isinstance(e, (SystemExit, KeyboardInterrupt, GeneratorExit)) or (
            type(e).__name__ == "Exit" and type(e).__module__.startswith("_pytest")):
        return ImplementationExit(f"{name} raised {type(e).__name__}"
                                  + (f"({e})" if str(e) else "") + " inside the implementation")
    return None


class _RankCache:
    """The cache of a rank-adapted forward: the implementation's cache and the shapes to undo."""

    def __init__(self, inner, lead, target):
        self.inner, self.lead, self.target = inner, lead, target


class ImplProxy:
    """Wraps an implementation; reading a name it lacks calls ``on_missing(message)`` (the
    conftest passes ``pytest.skip``, the checker raises :class:`NotApplicable`), so a missing
    name can never make a check pass silently.  Every protocol function read through it is
    wrapped as the module's docstring says (:meth:`calls`: a verdict credits only the ops a
    test actually ran)."""

    def __init__(self, obj, label: str, on_missing: Callable[[str], object] | None = None):
        self._impl_obj = obj
        self._impl_label = label
        self._impl_on_missing = on_missing or _raise_not_applicable
        self._impl_called = {}  # ordered set of names called
        self._impl_active = []  # the protocol names executing now
        self._impl_hung = {}  # name -> the check it did not return in
        # the names executing when a harness interrupt (a time limit) went through them
        self._impl_interrupted = []
        self._impl_wrapped = {}
        self._impl_caps = capabilities(obj)
        # the conversion layer (spec/protocol/arrays.py): None for a NumPy implementation
        self._impl_arrays = arrays.converter(self._impl_caps["arrays"])

    def __getattr__(self, name: str):
        try:  # past __getattr__: a copy being built has no _impl_obj yet (AttributeError)
            value = resolve(object.__getattribute__(self, "_impl_obj"), name)
        except AttributeError:
            # Probes by Python, pytest or Hypothesis (e.g. hypothesis_internal_is_this_a_mock_check)
            # are not protocol names: answer them like any object would.
            if name.startswith(("_", "hypothesis_")) or name in _HOST_PROBES:
                raise
        else:
            if name.startswith("_") or not callable(value) or inspect.isclass(value):
                return value
            hit = self._impl_wrapped.get(name)
            if hit is None or hit[0] is not value:
                hit = self._impl_wrapped[name] = (value, self._wrap(name, value))
            return hit[1]
        self._missing(not_applicable_message(self._impl_label, name))

    def __repr__(self) -> str:
        return f"<impl {self._impl_label}>"

    # ---------------------------------------------------------------- bookkeeping
    def calls(self) -> list[str]:
        """Protocol names called through the proxy since the last :meth:`reset_calls`."""
        return list(self._impl_called)

    def reset_calls(self) -> None:
        self._impl_called.clear()

    def active(self) -> list[str]:
        """The protocol names executing right now, outermost first (a time-out names them)."""
        return list(self._impl_active)

    def mark_hung(self, where: str) -> list[str]:
        """The names executing now did not return within ``where``'s time limit: later calls
        of them fail at once (ImplementationHung) instead of hanging again.  Returns them."""
        names = list(self._impl_interrupted or self._impl_active)
        self._impl_interrupted.clear()
        for name in names:
            self._impl_hung.setdefault(name, where)
        self._impl_active.clear()
        return names

    def _missing(self, message: str):
        self._impl_on_missing(message)
        raise NotApplicable(message)  # on_missing returned

    def _not_claimed(self, what: str):
        self._missing(not_claimed_message(self._impl_label, what))

    def _wrap(self, name: str, fn):
        called, caps = self._impl_called, self._impl_caps
        op = op_of_name(name)
        adapt = None
        if op is not None and name.endswith(("_forward", "_backward")):
            adapt = self._adapter(op.name, name, caps)
        elif name == "adam_step" and not caps["weight_decay"]:
            def adapt(args, kwargs):
                if kwargs.get("weight_decay"):
                    self._not_claimed(variants.CLAIMS["weight_decay"].what)
                kwargs = {k: v for k, v in kwargs.items()
                          if k not in ("weight_decay", "no_decay")}
                return args, kwargs, None
        elif name == "adam_step":  # no no_decay keyword: the suite applies the rule (issue 23)
            from minibert_spec.protocol.optim_contract import adam_step_adapter

            adapt = adam_step_adapter(fn)

        active, hung, interrupted = self._impl_active, self._impl_hung, self._impl_interrupted
        converter = self._impl_arrays

        @functools.wraps(fn)
        def call(*args, **kwargs):
            called[name] = None
            if name in hung:
                raise ImplementationHung(f"{name} did not return within the time limit in "
                                         f"{hung[name]}: not called again")
            args, kwargs, post = (args, kwargs, None) if adapt is None else adapt(args, kwargs)
            active.append(name)
            try:
                out = (fn(*args, **kwargs) if converter is None
                       else converter.call(name, fn, args, kwargs))
            except BaseException as e:
                converted = _converted(name, e)
                if converted is not None:
                    raise converted from e
                if not isinstance(e, (Exception, ImplementationAbort)) and not interrupted:
                    interrupted.extend(active)  # a time limit: where it found the code
                raise
            finally:
                if active and active[-1] == name:
                    active.pop()
            return post(out) if post is not None else out

        return call

    def _adapter(self, op: str, name: str, caps: dict):
        """(args, kwargs) -> (args, kwargs, post) applying CAPABILITIES to one op function."""
        # the claims and options declared (spec/protocol/variants.py): forms the
        # implementation does not declare are not applicable, per-head layouts and probability
        # losses are adapted; then a declared rank
        steps = variants.layers(op, name, caps, self._not_claimed)
        ranks = caps["ranks"].get(op)
        if ranks and op in RANK_ADAPTABLE:
            steps.append(functools.partial(_rank_forward, op, ranks)
                         if name.endswith("_forward") else functools.partial(_rank_backward, op))
        if not steps:
            return None

        def adapt(args, kwargs):
            posts = []
            for step in steps:
                args, kwargs, post = step(args, kwargs)
                posts.append(post)
            posts = [p for p in reversed(posts) if p is not None]
            if not posts:
                return args, kwargs, None

            def post_all(result):
                for p in posts:
                    result = p(result)
                return result

            return args, kwargs, post_all

        return adapt


def _rank_forward(op, ranks, args, kwargs):
    names = OPS[op].args
    lead = tuple(np.shape(variants.get(op, args, kwargs, names[0]))[:-1])
    target = target_lead(lead, ranks)
    if target is None:
        return args, kwargs, None

    def reshape(a):
        if isinstance(a, np.ndarray) and a.shape[:len(lead)] == lead:
            return a.reshape(target + a.shape[len(lead):])
        return a

    ranked = RANK_ADAPTABLE[op]
    args = tuple(reshape(a) if n in ranked else a for n, a in zip(names, args)) + args[len(names):]
    kwargs = {k: reshape(v) if k in ranked else v for k, v in kwargs.items()}

    def post(result):
        out, cache = result
        if np.ndim(out) > 0:
            out = np.asarray(out)
            out = out.reshape(lead + out.shape[len(target):])
        return out, _RankCache(cache, lead, target)

    return args, kwargs, post


def _rank_backward(op, args, kwargs):
    if not (len(args) >= 2 and isinstance(args[1], _RankCache)):
        return args, kwargs, None
    dout, rc = args[0], args[1]
    if isinstance(dout, np.ndarray) and dout.ndim > 0:
        dout = dout.reshape(rc.target + dout.shape[len(rc.lead):])
    ranked, inputs = RANK_ADAPTABLE[op], OPS[op].inputs

    def post(grads):
        return tuple(g.reshape(rc.lead + g.shape[len(rc.target):])
                     if isinstance(g, np.ndarray) and i < len(inputs)
                     and inputs[i] in ranked else g for i, g in enumerate(grads))

    return (dout, rc.inner, *args[2:]), kwargs, post


# where a protocol name may live besides the object itself: a package's optimizer submodule; a
# module's whole-model declaration (WHOLE_MODEL = whole_model(...): its row beside the op rows)
SUBNAMESPACES = ("optim", "WHOLE_MODEL")
# Hypothesis looks these up on a test's first argument (its executor hooks).
_HOST_PROBES = frozenset({"execute_example", "setup_example", "teardown_example"})


def resolve(obj, name: str):
    """``obj.<name>``, else ``obj.optim.<name>`` (a package may keep its optimizer in a
    submodule), else ``obj.WHOLE_MODEL.<name>``: raises AttributeError when none exists."""
    try:
        return getattr(obj, name)
    except AttributeError:
        pass
    if not name.startswith("_"):
        for sub in SUBNAMESPACES:
            ns = getattr(obj, sub, None)
            if ns is None and sub == "optim" and inspect.ismodule(obj) \
                    and getattr(obj, "__path__", None):
                try:  # a package's submodule that nothing imported yet
                    ns = importlib.import_module(f"{obj.__name__}.{sub}")
                except ImportError:
                    ns = None
            if ns is not None and hasattr(ns, name):
                return getattr(ns, name)
    raise AttributeError(f"{label_of(obj)} has no attribute {name!r}")


def _has(obj, name: str) -> bool:
    try:
        resolve(obj, name)
        return True
    except AttributeError:
        return False


def _raise_not_applicable(message: str):
    raise NotApplicable(message)


def unwrap(impl):
    """The object behind an :class:`ImplProxy` (or ``impl`` itself)."""
    return impl._impl_obj if isinstance(impl, ImplProxy) else impl


def provides(impl, *names: str) -> bool:
    """True when the implementation has every one of ``names`` (never skips)."""
    obj = unwrap(impl)
    return all(_has(obj, n) for n in names)


def label_of(impl) -> str:
    if isinstance(impl, ImplProxy):
        return impl._impl_label
    return getattr(impl, "__name__", type(impl).__name__)


