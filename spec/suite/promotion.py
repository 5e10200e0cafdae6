"""Where a float32 -> float64 promotion comes from: the line of the implementation that first makes
a float64 value out of float32 inputs, and why (NumPy >= 2's promotion rules, NEP 50).

The most common red on real hand-written code: ``scores = q @ k.T / np.sqrt(d)`` with an int
``d``.  ``np.sqrt(d)`` is a float64 *NumPy scalar*, and under NEP 50 (NumPy >= 2) a NumPy
scalar or a 0-d array is strongly typed: float32 array / float64 scalar is float64 (NumPy 1.x
looked at the value and kept float32).  A Python float (``math.sqrt(d)``, ``d ** 0.5``) is
weak and keeps float32.  The same for ``np.array(1e-5)``, ``np.float64(...)``, and arrays made
without a dtype (``np.zeros(n)`` is float64).

:func:`locate` reruns one op on float32 inputs (its case family's fixed-seed example) under a
line tracer that watches the implementation's own frames only, and returns the first line after
which a local (or the return value) is float64, with the line's text, the likely cause and the
fix.  The verdict never depends on it: it only says where a red that is already a red comes
from (minibert_spec.suite.run adds it to the message and to the red's cause, so the report groups
the reds of one line).
"""

from __future__ import annotations

import linecache
import os
import re
import sys
from dataclasses import dataclass

import numpy as np

# the patterns of a source line that make float64 out of float32, in the order they are tried:
# (regex, the cause in words, the fix)
_CAUSES = (
    (re.compile(r"\bnp\.(sqrt|log|exp|power|float_power|cbrt)\s*\("),
     "np.{0} of a Python number is a float64 NumPy scalar, and under NEP 50 (NumPy >= 2) a "
     "float32 array combined with it is float64",
     "use a Python float (math.{0}(d), d ** 0.5) or cast it: x.dtype.type(np.{0}(d))"),
    (re.compile(r"\bnp\.float64\s*\("),
     "np.float64(...) is a float64 NumPy scalar: under NEP 50 it promotes float32 arrays",
     "use a Python float, or x.dtype.type(...)"),
    (re.compile(r"\bnp\.(as)?array\s*\(\s*[-+\w.]+\s*\)"),
     "np.array of a Python scalar is a float64 0-d array: under NEP 50 it promotes float32 "
     "arrays",
     "use the Python scalar itself, or np.asarray(v, dtype=x.dtype)"),
    (re.compile(r"\bnp\.(zeros|ones|empty|full|eye|arange|linspace|identity|tri|tril|triu)\s*\("),
     "np.{0} without a dtype makes float64",
     "pass dtype=x.dtype (or use np.{0}_like(x) where it exists)"),
    (re.compile(r"\bnp\.random\.|\brng\.|\.standard_normal\(|\.normal\(|\.uniform\("),
     "random numbers are drawn in float64",
     "cast them: .astype(x.dtype)"),
    (re.compile(r"\.astype\(\s*(float|np\.float64|'float64'|\"float64\")\s*\)"),
     "an explicit cast to float64",
     "cast to the input's dtype instead: .astype(x.dtype)"),
)


@dataclass(frozen=True)
class Promotion:
    """The first float64 value made by the implementation's own code."""

    file: str
    line: int
    function: str
    text: str  # the source line
    name: str  # the local it went into ("return value" for a return)
    cause: str
    fix: str

    def where(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"

    def describe(self) -> str:
        return (f"float64 first appears at {self.where()} in {self.function} "
                f"(`{self.text}`, into {self.name}): {self.cause}; fix: {self.fix}")


# the cause of a line that matches none of _CAUSES
UNKNOWN = ("a float64 value enters the computation here (a float64 constant, array or NumPy "
           "scalar: NEP 50 promotes float32 with it)",
           "make it a Python float or give it the input's dtype")
# origins collected per traced call before one is chosen (a bound on the tracer's work)
MAX_ORIGINS = 32
_NAME = re.compile(r"[A-Za-z_]\w*")


def explain(text: str) -> tuple[str, str]:
    """(cause, fix) of a source line that makes float64 from float32 values."""
    for rx, cause, fix in _CAUSES:
        m = rx.search(text)
        if m:
            word = m.group(1) if m.groups() and m.group(1) else ""
            return cause.format(word), fix.format(word)
    return UNKNOWN


def _is_float64(v) -> bool:
    return (isinstance(v, np.ndarray) and v.dtype == np.float64 and v.size > 0) or \
        isinstance(v, np.float64)


def _is_float32(v) -> bool:
    return isinstance(v, (np.ndarray, np.float32)) and v.dtype == np.float32


def _sees_float32(frame) -> bool:
    """Whether a float32 value is within the frame's reach: a local, an item of a local list,
    tuple or dict, or an attribute of ``self``.  A float64 made without one (a constructor's
    float64 initial weights, which the suite replaces) is no promotion of float32 inputs."""
    values = list(frame.f_locals.values())
    own = frame.f_locals.get("self")
    if own is not None and hasattr(own, "__dict__"):
        values += list(vars(own).values())
    for v in values:
        items = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else (v,)
        if any(_is_float32(x) for x in items):
            return True
    return False


def in_adapter(frame) -> bool:
    """Whether the frame runs an adapter of a file of its own (``minibert adapter new`` /
    ``infer`` write one: ``import mybert as impl``): a module that defines protocol names and
    holds another module of the user's.  Its stand-ins (a key mask of ones, zeros for an absent
    bias) are float64 before the implementation runs, and naming one fixes nothing (issue 41):
    its float64 reaches the implementation's frames, which are named instead.  A file that holds
    its classes and their ``layer()`` together is the implementation itself."""
    import types

    from minibert_spec.protocol import OPS
    from minibert_spec.suite.shrink import is_user_path

    module = frame.f_globals
    if not any(name in module for op in OPS.values() for name in op.names):
        return False
    return any(isinstance(v, types.ModuleType) and v.__name__ != module.get("__name__")
               and is_user_path(getattr(v, "__file__", None) or "<none>")
               for v in module.values())


def trace(fn, *args, **kwargs) -> Promotion | None:
    """Run ``fn(*args, **kwargs)`` under a line tracer over the implementation's own frames
    (minibert_spec.suite.shrink.is_user_path, an adapter's own file left out: :func:`in_adapter`)
    and return the line where float64 comes from: a line after which a local or the return value
    is float64 where it was not before, in a frame that holds float32 values
    (:func:`_sees_float32`), and whose text names no local that was float64 already (an
    *origin*; ``e = np.exp(s)`` after a float64 ``s`` only carries it on).  The first origin
    whose line has a known cause (``np.sqrt(d)``, ``np.zeros(n)``...: :data:`_CAUSES`) is
    chosen, else the first origin: a float64 table cast back to float32 on its next line is an
    origin too, and naming it instead of the ``/ np.sqrt(d)`` that promotes fixes nothing.
    None: no origin, or the call raised before one.  Exceptions of ``fn`` are swallowed: this
    only locates."""
    from minibert_spec.suite.shrink import is_user_path

    found: list[Promotion] = []
    state: dict = {}  # frame -> (last line, {name: is float64})

    def snapshot(frame) -> dict:
        return {k: _is_float64(v) for k, v in frame.f_locals.items()}

    def record(frame, line: int, name: str, before: dict) -> None:
        text = linecache.getline(frame.f_code.co_filename, line).strip()
        if {n for n, f64 in before.items() if f64} & set(_NAME.findall(text)):
            return  # it reads a float64 local: carried on, not made here
        cause, fix = explain(text)
        found.append(Promotion(frame.f_code.co_filename, line, frame.f_code.co_name, text, name,
                               cause, fix))

    def local(frame, event, arg):
        if len(found) >= MAX_ORIGINS:
            return None
        last, before = state.get(frame, (frame.f_lineno, {}))
        if event in ("line", "return"):
            now = snapshot(frame)
            new = [k for k, f64 in now.items() if f64 and not before.get(k)]
            if new and last is not None and _sees_float32(frame):
                record(frame, last, new[0], before)
            elif event == "return" and _is_float64(arg) and _sees_float32(frame):
                record(frame, frame.f_lineno, "the return value", before)
            state[frame] = (frame.f_lineno, now)
        return local

    adapters: dict = {}  # id of a module's globals -> whether it is an adapter's

    def adapter(frame) -> bool:
        key = id(frame.f_globals)
        if key not in adapters:
            adapters[key] = in_adapter(frame)
        return adapters[key]

    def calls(frame, event, arg):
        if len(found) >= MAX_ORIGINS or event != "call" \
                or not is_user_path(frame.f_code.co_filename) or adapter(frame):
            return None
        state[frame] = (None, snapshot(frame))  # its arguments: the caller's doing
        return local

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        fn(*args, **kwargs)
    except Exception:  # noqa: BLE001 -- locating only: the check already judged the call
        pass
    finally:
        sys.settrace(previous)
    known = [p for p in found if (p.cause, p.fix) != UNKNOWN]
    return (known or found or [None])[0]


def locate(impl, ops) -> Promotion | None:
    """The first float64 line of the implementation on float32 inputs: each op pair of ``ops``
    run forward and backward on its case families' fixed-seed examples cast to float32 (the
    families the implementation's declarations reach), then ``adam_step`` on float32
    parameters; None when none of them makes float64."""
    from minibert_spec.protocol import OPS, capabilities
    from minibert_spec.protocol.capabilities import unmet
    from minibert_spec.suite import strategies as S
    from minibert_spec.suite.checks.invariants import cast_case

    caps = capabilities(impl)
    for op in ops:
        for family in (f for f in S.families() if f.op == op and not unmet(caps, dict(f.needs))):
            try:
                examples = family.examples(caps)
                forward, backward = family.bind(impl)
            except Exception:  # noqa: BLE001 -- nothing to run for this family
                continue
            for case in examples:
                c = cast_case(case, np.float32)
                hit = _run_pair(forward, backward, c)
                if hit is not None:
                    return hit
        if op == "adam" and OPS["adam"].names:
            hit = _run_adam(impl)
            if hit is not None:
                return hit
    return None


def _run_pair(forward, backward, case) -> Promotion | None:
    """The forward traced, then the backward: a forward's promotion is named before anything
    the backward does (:func:`trace` chooses among the origins of one call)."""
    holder = {}

    def run_forward():
        holder["out"] = forward(**case.inputs, **case.fixed)

    hit = trace(run_forward)
    if hit is not None or "out" not in holder:
        return hit
    _, cache = holder["out"]
    return trace(lambda: backward(case.dout, cache))


def _run_adam(impl) -> Promotion | None:
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((3, 4)).astype(np.float32),
              "b": rng.standard_normal(4).astype(np.float32)}
    grads = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in params.items()}

    def step():
        impl.adam_step(params, grads, impl.adam_init(params), lr=1e-3)

    return trace(step)
