"""The training rows of ``minibert adapter infer``: ``schedule`` (``warmup_linear_lr``) and
``clip`` (``global_grad_norm``, ``clip_by_global_norm``), mapped from the module's functions (a
schedule also from a class built from its three numbers) by running them; names only order the
candidates and pick those worth running (a training loop is never run).

* schedule: ``f(step, a, b, c)`` (or ``C(a, b, c)`` with a method of the step) whose arguments,
  under some permutation, give the reference's rate at every step of :data:`SCHEDULE_GRID` --
  or the lr(0) = 0 form, then declared (``CAPABILITIES["conventions"]``);
* clip: ``f(grads, max_norm, ...)`` named like a clip, returning ``(clipped, norm)``, the
  clipped dict, or clipping in place; its divisor guard (``max_norm / (norm + eps)``) measured
  at a small norm, where it changes the factor, and declared (``guards: clip_eps``).

The one numeric evidence of each row: the adapter's own text for it, executed, equals the
reference to :data:`SCHEDULE_RTOL` / :data:`CLIP_RTOL`.  Code that does not is listed as not
mapped with its deviation: a bug (per-tensor clipping, a warmup off by one) stays a finding.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from minibert_spec.suite.infer.probes import EPS_NAMES, deviation, one_line
from minibert_spec.suite.infer.subjects import own_functions

# (peak_lr, warmup_steps, total_steps): three distinct values each, so that no permutation of
# the arguments gives the same rates; a one-step warmup and a one-step decay among them
SCHEDULE_GRID = ((0.37, 5, 23), (2e-3, 1, 7), (0.05, 3, 4))
SCHEDULE_ROLES = ("peak_lr", "warmup_steps", "total_steps")
# float64: a correct schedule differs from the reference by its operations' order (~1e-16)
SCHEDULE_RTOL = 1e-12
# a schedule class's method of the step: __call__, or a public one whose name says a rate
SCHEDULE_METHOD_WORDS = ("lr", "rate", "sched", "value", "get")
# a clip function's and a norm function's names: which functions are run with gradients at
# all (a module's other one- and two-argument functions may be anything, a training loop too)
CLIP_WORDS = ("clip",)
NORM_WORDS = ("norm",)
# float64: a correct clipping differs from the reference by the order of its sums (~1e-16)
CLIP_RTOL = 1e-12
# the gradients of the evidence: several tensors of different norms, so that per-tensor
# clipping differs from global clipping; SMALL_NORM is where a divisor guard eps ~ 1e-6
# changes the factor by 1e-2 (a guard of 1e-15 still by 1e-11, beyond CLIP_RTOL)
CLIP_SHAPES = {"encoder.W": (3, 4), "encoder.b": (4,), "head.W": (4, 2)}
SMALL_NORM = 1e-4
PROTOCOL_NAMES = ("warmup_linear_lr", "global_grad_norm", "clip_by_global_norm")


@dataclass
class TrainingMapping:
    """The ``schedule`` or ``clip`` row: the adapter's text, evidence, declaration."""

    op: str
    code: str
    evidence: list = field(default_factory=list)
    declares: dict = field(default_factory=dict)  # CAPABILITIES (conventions, guards)
    ranks: tuple = ()  # (as Mapping_'s: the rows take no arrays of a rank)


def training_code(m: TrainingMapping, alias: str) -> str:
    """The adapter's definitions for the row (written for the alias ``impl``)."""
    return m.code if alias == "impl" else m.code.replace("impl.", f"{alias}.")


def executed(code: str, mod) -> dict:
    """The adapter's text executed against the module ``impl``: its namespace (what is tried
    is what is written)."""
    namespace = {"impl": mod}
    exec(compile(code, "<inferred adapter>", "exec"), namespace)  # noqa: S102 -- our own text
    return namespace


def _functions(mod) -> list[tuple[str, object]]:
    """(the name the module holds it by, function) of each function defined in ``mod``, once
    (an alias such as ``clip_by_global_norm = clip_grad_norm`` is the same function); the
    user's own names before the protocol's (those are likely a hand adapter already)."""
    seen, out = set(), []
    for name, f in own_functions(mod):
        if id(f) in seen:
            continue
        seen.add(id(f))
        own = f.__name__ if getattr(mod, f.__name__, None) is f else name
        out.append((own, f))
    return sorted(out, key=lambda nf: nf[0] in PROTOCOL_NAMES)


def _params(fn) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []


def _required(params) -> list[inspect.Parameter]:
    return [p for p in params if p.default is p.empty
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _says(name: str, words) -> bool:
    return any(w in name.lower() for w in words)


# ------------------------------------------------------------------------- schedule
def reference_lr(step: int, peak: float, warmup: int, total: int, convention: bool) -> float:
    """The protocol's rate (the reference's), or the derivation's lr(0) = 0 form (Hugging
    Face's get_linear_schedule_with_warmup) when ``convention``."""
    from minibert_reference.optim import warmup_linear_lr

    if convention and step < warmup:
        return peak * step / warmup
    return warmup_linear_lr(step, peak_lr=peak, warmup_steps=warmup, total_steps=total)


@dataclass(frozen=True)
class _Schedule:
    """A schedule candidate: a function of (step, a, b, c), or a class built from (a, b, c)
    with a method of the step; ``args``: its three arguments, in its order."""

    label: str
    args: tuple
    keyword: tuple  # those of args passed by keyword (keyword-only)
    call: str  # the adapter's expression, {args} standing for the arguments

    def code(self, roles: dict) -> str:
        given = ", ".join(roles[a] if a not in self.keyword else f"{a}={roles[a]}"
                          for a in self.args)
        return ("def warmup_linear_lr(step, *, peak_lr, warmup_steps, total_steps):\n"
                f"    return {self.call.format(args=given)}\n")


def _schedule_candidates(mod, functions) -> list[_Schedule]:
    out = []
    for name, f in functions:
        params = _params(f)
        if not params or params[0].kind != params[0].POSITIONAL_OR_KEYWORD \
                or params[0].default is not params[0].empty:
            continue
        rest = _required(params[1:])
        if len(rest) == 3 and all(p.kind != p.VAR_POSITIONAL for p in params):
            out.append(_Schedule(f"function {name}", tuple(p.name for p in rest),
                                 tuple(p.name for p in rest if p.kind == p.KEYWORD_ONLY),
                                 f"impl.{name}(step, {{args}})"))
    for cname, cls in inspect.getmembers(mod, inspect.isclass):
        if cls.__module__ != mod.__name__:
            continue
        ctor = _required(_params(cls))
        if len(ctor) != 3:
            continue
        for meth in _schedule_methods(cls):
            out.append(_Schedule(f"class {cname}.{meth}", tuple(p.name for p in ctor),
                                 tuple(p.name for p in ctor if p.kind == p.KEYWORD_ONLY),
                                 f"impl.{cname}({{args}})"
                                 + ("(step)" if meth == "__call__" else f".{meth}(step)")))
    return out


def _schedule_methods(cls) -> list[str]:
    """Methods taking the step alone: ``__call__``, or a public one whose name says a rate."""
    names = ["__call__"] if "__call__" in vars(cls) else []
    names += sorted(n for n in dir(cls) if not n.startswith("_")
                    and _says(n, SCHEDULE_METHOD_WORDS) and callable(getattr(cls, n, None)))
    return [n for n in names if len(_required(_params(getattr(cls, n)))) == 2]


def _role_order(args: tuple) -> list[tuple]:
    """The permutations of the protocol's roles over ``args``, those matching the arguments'
    names (peak/lr, warm, total) first: all are run, the numbers decide."""
    words = {"peak_lr": ("peak", "lr", "rate", "max_lr", "base"), "warmup_steps": ("warm",),
             "total_steps": ("total", "num", "steps", "end", "max")}

    def score(perm):
        return -sum(_says(a, words[r]) for a, r in zip(args, perm))

    return sorted(itertools.permutations(SCHEDULE_ROLES), key=score)


def _schedule_deviation(fn, convention: bool) -> tuple[float, str]:
    """(the largest deviation from the form over SCHEDULE_GRID, relative to the peak; where)."""
    worst, where = 0.0, ""
    for peak, warmup, total in SCHEDULE_GRID:
        for step in range(total + 1):
            try:
                got = fn(step, peak_lr=peak, warmup_steps=warmup, total_steps=total)
                dev = abs(float(got) - reference_lr(step, peak, warmup, total, convention)) / peak
            except Exception as e:  # noqa: BLE001 -- the user's code under this candidate
                return float("inf"), f"raised {one_line(e)} at step {step} of " \
                    f"(peak {peak:g}, warmup {warmup}, total {total})"
            if not dev <= worst:
                worst, where = (dev if np.isfinite(dev) else float("inf")), \
                    f"step {step} of (peak {peak:g}, warmup {warmup}, total {total})"
            if not dev <= SCHEDULE_RTOL:
                return worst, where
    return worst, where


def infer_schedule(mod, functions) -> tuple[list[TrainingMapping], list[str]]:
    """([the schedule row] or [], its not-mapped line)."""
    found, near = [], []
    for cand in _schedule_candidates(mod, functions):
        best, hits = None, 0
        for perm in _role_order(cand.args):
            code = cand.code(dict(zip(cand.args, perm)))
            fn = executed(code, mod)["warmup_linear_lr"]
            for convention in (False, True):
                dev, where = _schedule_deviation(fn, convention)
                hits += dev <= SCHEDULE_RTOL
                if best is None or dev < best[0]:
                    best = (dev, where, code, convention, perm, hits)
        if best is not None and best[0] <= SCHEDULE_RTOL:
            found.append((cand, best[:-1] + (hits,)))
        elif best is not None and np.isfinite(best[0]):  # it computes a rate, a wrong one
            near.append(f"schedule: {cand.label}: no mapping of its arguments "
                        f"{', '.join(cand.args)} to {', '.join(SCHEDULE_ROLES)} gives the "
                        f"reference's warmup_linear_lr or the lr(0)=0 form: the closest "
                        f"differs by {best[0]:.1e} of the peak (at {best[1]}): a bug, or a "
                        "form this cannot infer: not mapped")
    if not found:  # (no candidate computing a rate: no line, as optim.py's non-optimizers)
        return [], near
    cand, (dev, where, code, convention, perm, hits) = found[0]
    grid = "; ".join(f"(peak {p:g}, warmup {w}, total {t})" for p, w, t in SCHEDULE_GRID)
    form = "the lr(0)=0 form (the derivation's §8.1, Hugging Face's)" if convention else \
        "the reference's warmup_linear_lr"
    ev = [f"{cand.label}: its arguments {', '.join(cand.args)} are "
          f"{', '.join(perm)}: at steps 0..total of {grid} it equals {form} to {dev:.0e} "
          "(of the peak; " + ("no other permutation or form does)" if hits == 1 else
                              f"{hits - 1} other permutation(s) or form(s) too: review)")]
    declares = {}
    if convention:
        declares = {"conventions": ("lr(0)=0",)}
        ev.append("lr(0) = 0 (peak * step / warmup): CAPABILITIES conventions ('lr(0)=0',) -- "
                  "the suite then judges it against Hugging Face's schedule")
    if len(found) > 1:
        ev.append(f"also matches: {', '.join(c.label for c, _ in found[1:])}")
    return [TrainingMapping("schedule", code, ev, declares)], near  # the wrong ones: findings


# ------------------------------------------------------------------------- clip
def _grads(seed: int, norm: float | None = None) -> dict:
    rng = np.random.default_rng(seed)
    g = {k: rng.standard_normal(s) * (1 + 3 * i) for i, (k, s) in enumerate(CLIP_SHAPES.items())}
    if norm is not None:
        scale = norm / np.sqrt(sum(float((a * a).sum()) for a in g.values()))
        g = {k: a * scale for k, a in g.items()}
    return g


def _norm(g: Mapping) -> float:
    from minibert_reference.optim import global_grad_norm

    return global_grad_norm(g)


def _clip_form(f, g: dict, max_norm: float) -> tuple[str | None, bool, str]:
    """(what ``f`` returns -- ``tuple01``/``tuple10`` (clipped, norm) in either order,
    ``dict``, or ``norm``/``none`` clipping in place --, whether it changes its argument, why it
    is none of those), from one call on a copy."""
    given = {k: a.copy() for k, a in g.items()}
    try:
        out = f(given, max_norm)
    except Exception as e:  # noqa: BLE001 -- the user's code
        return None, False, f"raised {one_line(e)}"
    moved = any(not np.array_equal(given[k], g[k]) for k in g)
    if isinstance(out, (tuple, list)) and len(out) == 2:
        kinds = [isinstance(o, Mapping) for o in out]
        if kinds in ([True, False], [False, True]):
            return ("tuple01" if kinds[0] else "tuple10"), moved, ""
    if isinstance(out, Mapping):
        return "dict", moved, ""
    if moved:
        return ("none" if out is None else "norm"), moved, ""
    return None, moved, ("returns neither (clipped, norm), the clipped dict, nor clips its "
                         "argument in place")


def _eps_arg(f) -> inspect.Parameter | None:
    """An optional argument named as a divisor guard (``eps``, ``epsilon``)."""
    return next((p for p in _params(f)[2:] if p.name in EPS_NAMES and p.default is not p.empty
                 and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)), None)


def _clip_code(name: str, form: str, moved: bool, norm_fn: str | None,
               eps: inspect.Parameter | None) -> str:
    """The adapter's global_grad_norm and clip_by_global_norm for ``impl.name`` returning
    ``form`` (``moved``: it clips its argument, the adapter gives it a copy; ``eps``: the
    guard argument the protocol's eps keyword is passed to)."""
    sig = f", *, eps={eps.default!r}" if eps is not None else ""
    call = f"impl.{name}(grads, max_norm" + (f", {eps.name}=eps)" if eps is not None else ")")
    if norm_fn:
        norm = f"def global_grad_norm(grads):\n    return impl.{norm_fn}(grads)\n"
    else:  # the clip function's own norm, at a max_norm that never clips
        norm = ("def global_grad_norm(grads):\n"
                "    return clip_by_global_norm(grads, float(\"inf\"))[1]\n")
    before = ["norm = global_grad_norm(grads)"] if form in ("dict", "none") else []
    if moved:  # the protocol's clipping is pure
        before.append("grads = {k: g.copy() for k, g in grads.items()}  # it clips in place")
    body = {"tuple01": [f"return {call}"],
            "tuple10": [f"norm, clipped = {call}", "return clipped, norm"],
            "dict": [f"return {call}, norm"],
            "norm": [f"norm = {call}", "return grads, norm"],
            "none": [call, "return grads, norm"]}[form]
    return norm + f"\n\ndef clip_by_global_norm(grads, max_norm{sig}):\n" + \
        "".join(f"    {line}\n" for line in before + body)


def _clip_deviation(ns: dict, eps: float, passes_eps: bool) -> tuple[float, str]:
    """(the largest relative deviation of the adapter's functions from the reference's
    clipping with the guard ``eps`` -- norms, clipped tensors, the input left untouched --,
    what it is)."""
    from minibert_reference.optim import clip_by_global_norm as ref_clip

    cases = [(f"gradient set {s}, max_norm = norm / 4", _grads(s), 0.25) for s in range(3)]
    cases += [("gradient set 0, max_norm = 2 norm (no clipping)", _grads(0), 2.0),
              (f"norm {SMALL_NORM:g}, max_norm = norm / 4", _grads(1, SMALL_NORM), 0.25)]
    worst, where = 0.0, ""
    for what, g, factor in cases:
        norm = _norm(g)
        calls = [({}, eps)] + ([({"eps": 0.0}, 0.0), ({"eps": 1e-6}, 1e-6)]
                               if passes_eps else [])
        for kw, e in calls:
            given = {k: a.copy() for k, a in g.items()}
            try:
                devs = {"global_grad_norm": abs(ns["global_grad_norm"](given) - norm) / norm}
                clipped, got = ns["clip_by_global_norm"](given, factor * norm, **kw)
            except Exception as ex:  # noqa: BLE001 -- the user's code under this adapter
                return float("inf"), f"raised {one_line(ex)} ({what})"
            want, _ = ref_clip(g, factor * norm, eps=e)
            devs["the norm it returns"] = abs(float(got) - norm) / norm
            devs.update({f"clipped[{k!r}]": deviation(clipped[k], want[k]) for k in g})
            devs["its input"] = 0.0 if all(np.array_equal(given[k], g[k]) for k in g) \
                else float("inf")
            name, dev = max(devs.items(), key=lambda kv: kv[1] if np.isfinite(kv[1]) else np.inf)
            dev = dev if np.isfinite(dev) else float("inf")
            if dev > worst:
                worst, where = dev, f"{name}, {what}" + (f", eps={e:g} passed" if kw else "")
    return worst, where


def _guard_candidates(ns: dict, default) -> list[float]:
    """The divisor guards to try: none, the function's eps default, and the one its clipped
    norm implies at a small norm (norm max_norm / (norm + eps), rounded to 2 digits)."""
    from minibert_spec.protocol.guards import implied_clip_eps

    out = [0.0] + ([float(default)] if isinstance(default, float) and default > 0 else [])
    try:
        clipped, _ = ns["clip_by_global_norm"](_grads(1, SMALL_NORM), SMALL_NORM / 4)
        implied = implied_clip_eps(SMALL_NORM, SMALL_NORM / 4, _norm(clipped))
    except Exception:  # noqa: BLE001 -- the evidence says why
        implied = float("nan")
    if np.isfinite(implied) and implied > 0:
        out.append(float(f"{implied:.2g}"))
    return list(dict.fromkeys(out))


@dataclass(frozen=True)
class _Clip:
    """A clip function that passed the evidence: the adapter's text and what decided it."""

    name: str
    code: str
    form: str
    moved: bool
    guard: float
    dev: float
    passed: inspect.Parameter | None  # its guard argument, given the protocol's eps keyword


def _try_clip(name: str, f, norm_fn: str | None, mod) -> tuple[_Clip | None, str]:
    """The clip row of ``impl.name`` (its norm from ``impl.norm_fn`` or its own), or (None,
    why not): the first guard argument's use and divisor guard under which the adapter's text
    equals the reference."""
    g = _grads(0)
    form, moved, why = _clip_form(f, g, 0.25 * _norm(g))
    if form is None:
        return None, why
    if form in ("dict", "none") and norm_fn is None:
        return None, ("returns no norm, and the module has no global norm function (one "
                      "argument, its name saying norm) giving the reference's")
    eps = _eps_arg(f)
    tries = []
    for passed in ([eps, None] if eps is not None else [None]):
        code = _clip_code(name, form, moved, norm_fn, passed)
        ns = executed(code, mod)
        for guard in _guard_candidates(ns, eps.default if eps is not None else None):
            dev, where = _clip_deviation(ns, guard, passed is not None)
            tries.append((dev, where, guard))
            if dev <= CLIP_RTOL:
                return _Clip(name, code, form, moved, guard, dev, passed), ""
    dev, where, guard = min(tries, key=lambda t: t[0])
    return None, (f"the adapter around it differs from the reference clip_by_global_norm by "
                  f"{dev:.1e} (relative, {where}; closest with the guard norm + {guard:g}): not "
                  "global-norm clipping -- a bug, or a form this cannot infer")


def _norm_functions(functions) -> list[tuple[str, str]]:
    """(name, evidence) of the one-argument norm functions giving the reference's norm."""
    out = []
    for name, f in functions:
        if not _says(name, NORM_WORDS) or len(_required(_params(f))) != 1:
            continue
        devs = []
        for s in range(3):
            g = _grads(s)
            try:
                devs.append(abs(float(f({k: a.copy() for k, a in g.items()})) - _norm(g))
                            / _norm(g))
            except Exception:  # noqa: BLE001 -- the user's code: not a norm of gradients
                devs.append(float("inf"))
        if max(devs) <= CLIP_RTOL:
            out.append((name, f"function {name}(grads) equals the reference global_grad_norm "
                              f"to {max(devs):.0e} (relative, 3 gradient sets)"))
    return out


def infer_clip(mod, functions) -> tuple[list[TrainingMapping], list[str]]:
    """([the clip row] or [], its not-mapped lines): the first clip function that passes."""
    from minibert_spec.protocol.guards import GUARDS, guard_range

    norms = _norm_functions(functions)
    missing = []
    for name, f in functions:
        if not _says(name, CLIP_WORDS) or len(_required(_params(f))) != 2:
            continue
        found, why = _try_clip(name, f, norms[0][0] if norms else None, mod)
        low, high = guard_range("clip_eps")
        if found is not None and found.guard and not low <= found.guard <= high:
            found, why = None, (f"divides by norm + {found.guard:g}, outside the clip_eps "
                                f"guard's range [{low:.2g}, {high:g}] ({GUARDS['clip_eps']}): "
                                "another clipping rule, not a guard")
        if found is None:
            missing.append(f"clip: function {name}: {why}: not mapped")
            continue
        declares = {"guards": {"clip_eps": found.guard}} if found.guard else {}
        return [TrainingMapping("clip", found.code, _clip_evidence(found, norms),
                                declares)], missing  # the wrong ones before: findings
    return [], missing  # (no clip function: no line, as optim.py's non-optimizers)


def _clip_evidence(c: _Clip, norms: list) -> list[str]:
    said = {"tuple01": "returns (clipped, norm)", "tuple10": "returns (norm, clipped)",
            "dict": "returns the clipped gradients alone", "norm": "returns the norm",
            "none": "returns nothing"}[c.form]
    ev = [f"function {c.name}(grads, max_norm) {said}" + (
        " and clips its argument in place (the adapter clips a copy: the protocol's is pure)"
        if c.moved else "")]
    ev.append(norms[0][1] if norms else f"no global norm function: the norm {c.name} returns "
              "at max_norm = inf")
    if c.guard:
        ev.append(f"at norm {SMALL_NORM:g} it scales by max_norm / (norm + {c.guard:g}): "
                  f"CAPABILITIES guards clip_eps {c.guard:g}")
    if c.passed is not None:
        ev.append(f"its {c.passed.name} argument is the guard (eps=0 and eps=1e-6 passed give "
                  "the reference's): the adapter passes the protocol's eps keyword to it")
    ev.append(f"norms and clipped tensors on 3 gradient sets (above and below max_norm) and at "
              f"norm {SMALL_NORM:g} equal the reference clip_by_global_norm (eps={c.guard:g}) "
              f"to {c.dev:.0e} (relative), its input untouched")
    return ev


# ------------------------------------------------------------------------- infer
def infer_training(mod) -> tuple[list[TrainingMapping], list[str]]:
    """([the schedule row, the clip row] as found, the not-mapped lines of those not)."""
    functions = _functions(mod)
    rows, missing = infer_schedule(mod, functions)
    clip_rows, clip_missing = infer_clip(mod, functions)
    return rows + clip_rows, missing + clip_missing
