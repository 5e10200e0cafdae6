"""A model class's parameter names and shapes where the module gives no parameter source (the
decoder row of :mod:`minibert_spec.suite.infer.decoder`): the class built on a
:class:`RecordingDict` -- a dict that records every key the code looks up and answers with
arrays -- and run on ids, the dict grown (:func:`grow`) until the forward runs through: a
missing key added with the likeliest shape of what its name reads as; a key only asked
(``.get``, ``in``) added or left out as the run's *policy* says (:data:`ABSENT`,
:data:`PRESENT`); a key missing from a dict the code built from ours by prefix added under each
prefix asked; on a shape error the keys' other shapes tried, the one under which the run gets
further (more operations on the parameters) kept.

Nothing here decides what a name is: the sets found are candidates, each judged by the decoder
row's logits against the reference's.  Keys that change nothing are left out (:func:`prune`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from minibert_spec.suite.infer.decoder import KINDS

ABSENT, PRESENT = "absent", "present"  # a key only asked: left out, or added
# the runs one set may take to grow (each a forward of a tiny model)
MAX_RUNS = 400
# the bias (beta) of a weight (gain) spelt alike: "attn.q.w" -> "attn.q.b"
BIAS_OF = {"w": "b", "weight": "bias", "kernel": "bias", "g": "b", "gamma": "beta"}
_WEIGHT = re.compile(r"^(.*[._])(w|weight|kernel|g|gamma)$")
# SwiGLU's three matrices as ports spell them (gate, up, down): an MLP's fc / proj respelt
SWIGLU_SPELLINGS = (("gate", "up", "down"), ("gate_proj", "up_proj", "down_proj"),
                    ("w1", "w3", "w2"))


class Missing(KeyError):
    """A key of the recording dict looked up and not there (or only asked, under PRESENT)."""


@dataclass
class Log:
    """What one run asked: the prefixes its keys were asked to start with, and how far it got
    (the operations on the parameters before it stopped)."""

    prefixes: list = field(default_factory=list)
    steps: int = 0


class _Key(str):
    """A key as the recording dict yields it: ``startswith`` / ``removeprefix`` record the
    prefix (a sub-dict built by prefix)."""

    def __new__(cls, value: str, log: Log):
        key = super().__new__(cls, value)
        key.log = log
        return key

    def startswith(self, prefix, *args):
        for p in prefix if isinstance(prefix, tuple) else (prefix,):
            if isinstance(p, str) and p not in self.log.prefixes:
                self.log.prefixes.append(p)
        return str.startswith(self, prefix, *args)

    def removeprefix(self, prefix):
        self.startswith(prefix)
        return str.removeprefix(self, prefix)


class _Counted(np.ndarray):
    """A parameter whose every ufunc (an add, a matmul) counts a step of the run."""

    log: Log | None = None

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        for x in inputs:
            if isinstance(x, _Counted) and x.log is not None:
                x.log.steps += 1
                break
        inputs = tuple(x.view(np.ndarray) if isinstance(x, _Counted) else x for x in inputs)
        if "out" in kwargs:
            kwargs["out"] = tuple(x.view(np.ndarray) if isinstance(x, _Counted) else x
                                  for x in kwargs["out"])
        return getattr(ufunc, method)(*inputs, **kwargs)


class RecordingDict(dict):
    """The parameter dict the class is built on: its lookups recorded, a missing key raising
    :class:`Missing` (a key only asked: under PRESENT too, else answered as absent)."""

    def __init__(self, values: dict, policy: str, log: Log):
        super().__init__(values)
        self.policy, self.log = policy, log

    def __getitem__(self, key):
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        raise Missing(key)

    def _asked(self, key) -> bool:
        if dict.__contains__(self, key):
            return True
        if self.policy == PRESENT and isinstance(key, str):
            raise Missing(key)
        return False

    def get(self, key, default=None):
        return dict.__getitem__(self, key) if self._asked(key) else default

    def __contains__(self, key):
        return self._asked(key)

    def keys(self):
        return [_Key(k, self.log) for k in dict.keys(self)]

    def __iter__(self):
        return iter(self.keys())

    def items(self):
        return [(_Key(k, self.log), dict.__getitem__(self, k)) for k in dict.keys(self)]


def arrays(shapes: dict, seed: int = 0) -> dict:
    """Float64 arrays of the shapes, every one distinct (gains away from 0)."""
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s) * (0.5 if len(s) == 2 else 0.3) + (1.0 if len(s) == 1
                                                                          else 0.0)
            for k, s in shapes.items()}


@dataclass
class Outcome:
    """One run: its logits (None where it stopped), what stopped it, how far it got."""

    logits: np.ndarray | None
    error: BaseException | None
    log: Log

    @property
    def signature(self) -> tuple:
        e = self.error
        return (type(e).__name__, e.args[0] if isinstance(e, KeyError) and e.args else str(e))


def run(build: Callable, shapes: dict, policy: str, values: dict | None = None) -> Outcome:
    """``build`` (the user's class and forward) on a recording dict of the shapes."""
    log = Log()
    params = {}
    for k, v in (values if values is not None else arrays(shapes)).items():
        params[k] = v.view(_Counted)
        params[k].log = log
    try:
        logits = build(RecordingDict(params, policy, log))
    except Exception as e:  # noqa: BLE001 -- the user's code stops: what it says is read
        return Outcome(None, e, log)
    return Outcome(np.asarray(logits, dtype=float), None, log)


@dataclass
class Grown:
    """A set of keys the forward ran through, with their shapes; or the reason it did not."""

    shapes: dict
    reason: str | None = None


def grow(build: Callable, options: Callable, policy: str, seed: dict | None = None) -> Grown:
    """Keys added (and reshaped) until ``build`` runs through; ``options(key)``: its shapes."""
    shapes, order = dict(seed or {}), list(seed or {})
    out = run(build, shapes, policy)
    for _ in range(MAX_RUNS):
        if out.error is None:
            return Grown(shapes)
        e = out.error
        if isinstance(e, KeyError) and e.args and isinstance(e.args[0], str):
            keys = [e.args[0]] if isinstance(e, Missing) else \
                [p + e.args[0] for p in out.log.prefixes] + [e.args[0]]
            better = _first_further(build, shapes, policy, out, [
                {**shapes, k: options(k)[0]} for k in keys if k not in shapes and options(k)])
            if better is None:
                return Grown(shapes, f"no key {e.args[0]!r} it looks up runs")
            order.append(next(k for k in better[0] if k not in shapes))
        else:
            reshaped = [{**shapes, k: s} for k in reversed(order) for s in options(k)
                        if s != shapes[k]]
            better = _first_further(build, shapes, policy, out, reshaped)
            if better is None:
                return Grown(shapes, f"{out.signature[0]}: {out.signature[1]}")
        shapes, out = better
    return Grown(shapes, f"not through in {MAX_RUNS} runs")


def _first_further(build, shapes, policy, before: Outcome, candidates):
    """(shapes, outcome) of the first candidate under which the run gets further than
    ``before``: through, or more steps, or as many and stopped by something else."""
    for cand in candidates:
        out = run(build, cand, policy)
        if out.error is None or out.log.steps > before.log.steps or (
                out.log.steps == before.log.steps and out.signature != before.signature
                and isinstance(before.error, KeyError)):
            return cand, out
    return None


def prune(build: Callable, shapes: dict, policy: str) -> dict:
    """The keys whose values change the logits (each changed alone): one that does not is left
    out where the logits are the same without it (a ``weights.get("config")`` the PRESENT
    policy filled is no parameter)."""
    values = arrays(shapes)
    base = run(build, shapes, policy, values)
    if base.error is not None:
        return shapes
    kept, rng = dict(shapes), np.random.default_rng(1)
    for k in list(shapes):
        # a random change (a constant one is what a LayerNorm after a bias takes out)
        changed = {**values, k: values[k] + rng.standard_normal(np.shape(values[k]))}
        out = run(build, shapes, policy, changed)
        if out.error is None and np.array_equal(out.logits, base.logits):
            fewer = {n: s for n, s in kept.items() if n != k}
            without = run(build, fewer, ABSENT, {n: values[n] for n in fewer})
            if without.error is None and np.array_equal(without.logits, base.logits):
                kept = fewer
    return kept


def bias_siblings(shapes: dict, options: Callable) -> dict:
    """The bias (beta) of each weight (gain) spelt alike (``attn.q.w`` -> ``attn.q.b``) that
    is not there, with its shape: candidates the forward then uses or ignores."""
    out = {}
    for k in shapes:
        m = _WEIGHT.match(k)
        if m:
            sib = m.group(1) + BIAS_OF[m.group(2)]
            if sib not in shapes and options(sib):
                out[sib] = options(sib)[0]
    return out


def swiglu_respelt(shapes: dict, read: Callable, spelling: tuple) -> dict | None:
    """The set with its MLP (the keys read as ``ffn.*_1`` / ``ffn.*_2``) respelt as SwiGLU's
    gate and up (the first's shape) and down (the second's); None without an MLP."""
    out, any_mlp = {}, False
    gate, up, down = spelling
    for k, shape in shapes.items():
        role = read(k)
        if role not in ("ffn.W_1", "ffn.b_1", "ffn.W_2", "ffn.b_2"):
            out[k] = shape
            continue
        any_mlp = True
        parts = k.split(".")
        at = -2 if len(parts) > 1 and parts[-1].lower() in KINDS else -1
        for new in ((gate, up) if role.endswith("_1") else (down,)):
            out[".".join([*parts[:at], new, *parts[len(parts) + at + 1:]])] = shape
    return out if any_mlp else None
