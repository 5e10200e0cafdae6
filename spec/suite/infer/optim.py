"""The optimizer row (``adam``) of ``minibert adapter infer``: an optimizer class built from the
parameters (a dict, its constructor's first argument) and updating them by ``(params, grads)``,
or a trainer's per-name update ``(name, param, grad, t)`` (``each=``, the counter kept by the
loop), mapped to :func:`minibert_spec.suite.adapters.optimizer` by running it:

* the step: the method that, run twice, updates what it is given (in place, or returning it);
* the hyperparameters: found where the object stores the distinct values it was built with
  (:data:`MARKS`);
* the moments: containers keyed like the parameters that the steps fill, m signed, v >= 0;
* the counter: an int attribute reading 0, 1, 2 over two steps (or the step's own argument,
  ``first_t`` 1 or 0 as the evidence agrees);
* no_decay: an optional argument of the step taking a collection of names.

The one numeric evidence: :data:`CHECK_STEPS` steps of the adapter so built, with weight decay
and exempt names, equal the reference ``adam_step`` (updates, moments, step) to
:data:`OPTIM_RTOL` in float64.  A class that does not is listed with its deviation, never
adapted into agreement: an optimizer's bug (no bias correction, a coupled decay) stays a finding.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from minibert_spec.suite.adapter_optim import optimizer
from minibert_spec.suite.adapter_paths import get_path
from minibert_spec.suite.infer.probes import deviation, one_line

# the step method's names, tried in this order (then any public method naming a step/update)
STEP_NAMES = ("step", "update", "apply", "apply_gradients", "apply_grads", "update_params")
STEP_WORDS = ("step", "update", "apply")
# a constructor argument's name -> the protocol's hyperparameter it is given the mark of; the
# numeric evidence, not the name, decides whether the row is written
HYPER_ARGS = {"lr": ("lr", "learning_rate", "alpha", "eta", "step_size"),
              "beta1": ("beta1", "beta_1", "b1"), "beta2": ("beta2", "beta_2", "b2"),
              "eps": ("eps", "epsilon"), "weight_decay": ("weight_decay", "wd", "decay")}
BETAS_ARGS = ("betas",)
# the values the constructor is given, to find where each is stored: distinct from each other
# and from every common default, so that a stored value names its hyperparameter alone
MARKS = {"lr": 0.0123, "beta1": 0.8123, "beta2": 0.9123, "eps": 1.23e-5, "weight_decay": 0.0345}
# the configuration of the numeric evidence: weight decay > 0, eps large enough to matter and
# several steps, so that the common bugs (no bias correction, a coupled or misplaced decay, eps
# inside the square root, an off-by-one counter) differ from the reference by far more than
# OPTIM_RTOL
CHECK = {"lr": 0.01, "beta1": 0.7, "beta2": 0.8, "eps": 1e-3, "weight_decay": 0.1}
CHECK_STEPS = 3
# float64: a correct Adam differs from the reference by the order of its operations (~1e-16)
OPTIM_RTOL = 1e-10
# the parameters of the evidence: matrices that decay and a bias and a gamma the protocol's
# default rule exempts (passed through the no_decay keyword where the step has one)
CHECK_SHAPES = {"encoder.W": (3, 4), "encoder.b": (4,), "ln.gamma": (4,), "head.W": (4, 2)}
# a counter found among several: these names first
COUNTER_NAMES = ("t", "step", "steps", "step_count", "timestep", "iteration", "iterations")
# a step argument given the step number (an outside counter: optimizer(t="t="))
T_ARGS = ("t", "step", "timestep", "iteration", "step_num")
# a per-name update's arguments (each=): the role an argument's name gives it; an argument no
# name places takes each free role in turn -- the numeric evidence, not the name, decides
EACH_ROLES = {"name": ("name", "key", "k", "pname", "param_name"),
              "param": ("p", "param", "w", "weight", "theta", "value", "x", "data", "arr"),
              "grad": ("g", "grad", "gradient", "dw", "dp", "dparam", "d_param"), "t": T_ARGS}
# a step keyword named with one of these is the no_decay keyword or nothing: a class whose
# ``no_decay`` does not give the reference's exemptions is never adapted by leaving it out
EXEMPT_WORDS = ("decay", "skip", "exclude", "exempt")
MAX_TRIES = 64  # combinations of the candidates the numeric evidence is run on


@dataclass
class OptimMapping:
    """What was inferred for the ``adam`` row: the class and :func:`optimizer`'s arguments
    (``kwargs``, run by the evidence; ``source``, the same as the adapter's text)."""

    cls: type
    kwargs: dict
    source: dict
    evidence: list = field(default_factory=list)
    declares: dict = field(default_factory=dict)  # CAPABILITIES (no weight decay)
    ranks: tuple = ()  # (as Mapping_'s: an optimizer runs on every rank)
    op: str = "adam"


@dataclass(frozen=True)
class _Slot:
    """Where one moment may be: the container at ``path`` (``expr``: the same as Python on
    ``o``), or its entry per name's item ``item`` (an ``(m, v)`` pair per name)."""

    path: str
    expr: str
    item: int | str | None = None

    def read(self, opt, names) -> dict:
        c = get_path(opt, self.path)
        if self.item is None:
            return dict(c) if isinstance(c, Mapping) else dict(zip(names, c))
        return {k: c[k][self.item] for k in names}

    def argument(self):
        """optimizer()'s m= or v=: the path, or a callable reading the pair's item."""
        if self.item is None:
            return self.path
        path, item = self.path, self.item
        return lambda o: {k: s[item] for k, s in get_path(o, path).items()}

    def text(self) -> str:
        if self.item is None:
            return repr(self.path)
        return f"lambda o: {{k: s[{self.item!r}] for k, s in {self.expr}.items()}}"


# ------------------------------------------------------------------------- walking an object
def _walk(obj, depth: int = 3, path: str = "", expr: str = "o"):
    """(path, expression, value) of every attribute and dict item of ``obj``, ``depth`` levels
    down (through dicts and plain objects, never arrays, lists or classes)."""
    if isinstance(obj, Mapping):
        items = obj.items()
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        items = vars(obj).items()
    else:
        return
    for key, v in list(items):
        if not isinstance(key, str):
            continue
        if key.isidentifier():
            here = f"{path}.{key}" if path else key
        elif path and "'" not in key:
            here = f"{path}['{key}']"
        else:
            continue
        e = f"{expr}[{key!r}]" if isinstance(obj, Mapping) else f"{expr}.{key}"
        yield here, e, v
        if depth > 1 and (isinstance(v, Mapping) or (
                hasattr(v, "__dict__") and not callable(v) and not isinstance(v, type)
                and type(v).__module__ not in ("builtins", "numpy"))):
            yield from _walk(v, depth - 1, here, e)


def _is_float(v) -> bool:
    return isinstance(v, (float, np.floating)) and not isinstance(v, bool)


def _stored(obj, value) -> list[str]:
    """The paths at which ``obj`` stores ``value`` (a float, or a tuple of floats)."""
    if isinstance(value, tuple):
        return [p for p, _, v in _walk(obj) if isinstance(v, (tuple, list))
                and len(v) == len(value) and all(_is_float(a) and a == b
                                                 for a, b in zip(v, value))]
    return [p for p, _, v in _walk(obj) if _is_float(v) and v == value]


def _counters(obj) -> dict[str, int]:
    return {p: int(v) for p, _, v in _walk(obj) if isinstance(v, (int, np.integer))
            and not isinstance(v, bool)}


def _shaped(a, shape) -> bool:
    return isinstance(a, np.ndarray) and a.shape == shape and np.issubdtype(a.dtype, np.floating)


def _slots(opt, shapes: dict) -> list[_Slot]:
    """Every container of ``opt`` holding one array per parameter, of its shape: a dict keyed
    like the parameters, a list in their order, or per name a tuple's item (a dict's key)."""
    names = list(shapes)
    found = []
    for path, expr, v in _walk(opt):
        if isinstance(v, Mapping) and set(v) == set(names):
            entries = [v[k] for k in names]
            if all(_shaped(a, shapes[k]) for k, a in zip(names, entries)):
                found.append(_Slot(path, expr))
            elif all(isinstance(e, (tuple, list)) for e in entries):
                found += [_Slot(path, expr, i) for i in range(min(map(len, entries)))
                          if all(_shaped(e[i], shapes[k]) for k, e in zip(names, entries))]
            elif all(isinstance(e, Mapping) for e in entries):
                keys = set.intersection(*(set(e) for e in entries))
                found += [_Slot(path, expr, key) for key in sorted(keys, key=str)
                          if all(_shaped(e[key], shapes[k]) for k, e in zip(names, entries))]
        elif isinstance(v, (list, tuple)) and len(v) == len(names) and \
                all(_shaped(a, shapes[k]) for k, a in zip(names, v)):
            found.append(_Slot(path, expr))
    return found


# ------------------------------------------------------------------------- the class's forms
def _positional(fn) -> list[inspect.Parameter]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD,
                                            p.KEYWORD_ONLY)]


def _role(name: str) -> str | None:
    return next((r for r, names in HYPER_ARGS.items() if name.lower() in names), None)


def _constructor(cls) -> tuple[dict, str | None]:
    """(the constructor's keyword arguments after the parameters, each hyperparameter given its
    mark; or why the class is no optimizer built from the parameters)."""
    args = _positional(cls)
    if not args or args[0].default is not args[0].empty or args[0].kind is args[0].KEYWORD_ONLY:
        return {}, "its constructor takes no parameters argument first"
    kwargs = {}
    for p in args[1:]:
        if p.name.lower() in BETAS_ARGS:
            kwargs[p.name] = (MARKS["beta1"], MARKS["beta2"])
        elif _role(p.name):
            kwargs[p.name] = MARKS[_role(p.name)]
        elif p.default is p.empty:
            return {}, f"its constructor's argument {p.name} is required and no hyperparameter"
    return kwargs, None


def _step_methods(cls) -> list[str]:
    """Methods that may be the update: a step-like name with ``(params, grads)`` first and
    nothing else required but a learning rate or a step number."""
    names = [n for n in STEP_NAMES if n in vars(cls)] + sorted(
        n for n in dir(cls) if not n.startswith("_") and n not in STEP_NAMES
        and any(w in n.lower() for w in STEP_WORDS))
    out = []
    for n in names:
        fn = getattr(cls, n, None)
        args = _positional(fn)[1:] if callable(fn) else []
        if len(args) >= 2 and all(p.default is not p.empty or _role(p.name) == "lr"
                                  or p.name in T_ARGS for p in args[2:]):
            out.append(n)
    return out


def _call_extras(cls, step: str) -> dict:
    """The step method's own learning rate and step number arguments: name -> "lr" / "t"."""
    extras = {}
    for p in _positional(getattr(cls, step))[3:]:
        if _role(p.name) == "lr":
            extras[p.name] = "lr"
        elif p.name in T_ARGS:
            extras[p.name] = "t"
    return extras


def _no_decay_keywords(cls, step: str, extras: dict) -> list[str]:
    """The step method's optional arguments that may take the names exempt from decay: a
    collection (or None) by default; those whose name says decay, skip or exclude first."""
    cands = [p.name for p in _positional(getattr(cls, step))[3:] if p.name not in extras
             and p.default is not p.empty
             and (p.default is None or isinstance(p.default, (tuple, list, set, frozenset)))]
    return sorted(cands, key=lambda n: not _says_exempt(n))


def _says_exempt(name: str) -> bool:
    return any(w in name.lower() for w in EXEMPT_WORDS)


def _values(seed: int) -> tuple[dict, list[dict]]:
    rng = np.random.default_rng(seed)
    params = {k: rng.standard_normal(s) for k, s in CHECK_SHAPES.items()}
    grads = [{k: rng.standard_normal(s) for k, s in CHECK_SHAPES.items()}
             for _ in range(CHECK_STEPS)]
    return params, grads


def _trial(cls, ctor: dict, one_step):
    """The class built with the marks and stepped twice by ``one_step(opt, params, grads, t)``
    (which updates ``params``): (the object, its int attributes after each, whether the
    parameters changed, what it raised)."""
    params, grads = _values(1)
    given = {k: a.copy() for k, a in params.items()}
    try:
        with np.errstate(all="ignore"):  # a broken update's inf and nan are for the evidence
            opt = cls({k: a.copy() for k, a in params.items()}, **ctor)
            ints = [_counters(opt)]
            for t, g in enumerate(grads[:2], 1):
                one_step(opt, given, {k: x.copy() for k, x in g.items()}, t)
                ints.append(_counters(opt))
    except Exception as e:  # noqa: BLE001 -- the user's code: a method that raises is no step
        return None, [], False, one_line(e)
    moved = any(not np.array_equal(given[k], params[k]) for k in params)
    return opt, ints, moved, ""


def _step_call(step: str, extras: dict):
    """One step of the class-step form: ``opt.step(params, grads)`` with its own keywords."""
    def one_step(opt, params, grads, t):
        getattr(opt, step)(params, grads, **_keywords(extras, t))
    return one_step


def _keywords(extras: dict, t: int) -> dict:
    """A trial call's keywords: each hyperparameter its CHECK value, a step number ``t``."""
    return {a: t if r == "t" else CHECK[r] for a, r in extras.items()}


# ------------------------------------------------------------------------- the evidence
@np.errstate(all="ignore")  # a broken update's inf and nan are its deviation
def _evidence(cls, kwargs: dict) -> tuple[float, str]:
    """(the largest relative deviation from adam_step over CHECK_STEPS steps, where)."""
    from minibert_reference.optim import adam_init as ref_init
    from minibert_reference.optim import adam_step as ref_step
    from minibert_reference.optim import default_no_decay

    flat = {k for keys in kwargs["hyper"] for k in (keys if isinstance(keys, tuple) else (keys,))}
    hyper = {k: v for k, v in CHECK.items() if k in flat}
    params, grads = _values(0)
    exempt = [k for k in params if default_no_decay(k)] if kwargs.get("no_decay") else []
    try:
        init, step = optimizer(cls, **kwargs)
        p, state = params, init(params)
        rp, ref = params, ref_init(params)
        worst, where = 0.0, ""
        for s, g in enumerate(grads, 1):
            extra = {"no_decay": exempt} if kwargs.get("no_decay") else {}
            p2, state = step(p, g, state, **hyper, **extra)
            rp2, ref = ref_step(rp, g, ref, **hyper, no_decay=exempt)
            devs = {f"the update of {k!r}": deviation(p2[k] - p[k], rp2[k] - rp[k])
                    for k in params}
            devs.update({f"{w} of {k!r}": deviation(state[w][k], ref[w][k])
                         for w in ("m", "v") for k in params})
            devs["the step count"] = 0.0 if state["step"] == ref["step"] else float("inf")
            what, dev = max(devs.items(), key=lambda kv: kv[1])
            if dev > worst:
                worst, where = dev, f"{what} at step {s}"
            if dev > OPTIM_RTOL:
                break
            p, rp = p2, rp2
    except Exception as e:  # noqa: BLE001 -- the user's code under this candidate adapter
        return float("inf"), f"the adapter raised {one_line(e)}"
    return worst, where


def _hyper_options(opt, ctor: dict, extras: dict) -> tuple[list[dict], list[str]]:
    """(every hyper= the marks' stored places allow, the hyperparameters given but found
    nowhere); a hyperparameter the step call takes (``extras``) is passed there."""
    per_role, lost = [], []
    for arg, mark in ctor.items():
        if isinstance(mark, tuple):  # betas: stored as the pair, or each beta on its own
            opts = [{("beta1", "beta2"): p} for p in _stored(opt, mark)]
            opts += [{"beta1": a, "beta2": b} for a in _stored(opt, mark[0])
                     for b in _stored(opt, mark[1])]
        else:
            opts = [{_role(arg): p} for p in _stored(opt, mark)]
        if opts:
            per_role.append(opts)
        else:
            lost.append(arg)
    per_role += [[{role: f"{arg}="}] for arg, role in extras.items() if role != "t"]
    return [dict(kv for part in combo for kv in part.items())
            for combo in itertools.product(*per_role)], lost


def _counter(ints: list[dict]) -> tuple[str | None, list[str]]:
    """(the int attribute reading 0, 1, 2 over the trial's steps, the others that do too)."""
    grows = [p for p in ints[0] if all(p in snap and snap[p] == i for i, snap in enumerate(ints))]
    grows.sort(key=lambda p: (p.split(".")[-1] not in COUNTER_NAMES, p))
    return (grows[0], grows[1:]) if grows else (None, [])


def _signed(opt, slot: _Slot) -> bool | None:
    """True for a moment with negative entries (m follows the gradient's sign), False for one
    >= 0 and not all 0 (v), None for one the steps left at 0."""
    vals = np.concatenate([np.ravel(a) for a in slot.read(opt, list(CHECK_SHAPES)).values()])
    return True if np.any(vals < 0) else False if np.any(vals > 0) else None


def _infer_class(cls) -> tuple[OptimMapping | None, str | None]:
    """The mapping of one class, or why it has none (None, None: not an optimizer at all): its
    ``step(params, grads)`` form first, else its per-name update (``each=``)."""
    steps = _step_methods(cls)
    eaches = [e for e in _each_methods(cls) if e[0] not in steps]
    if not steps and not eaches:
        return None, None
    ctor, why = _constructor(cls)
    if why:
        return None, why
    reasons = []
    for form, methods in ((_infer_step, steps), (_infer_each, eaches)):
        if methods:
            m, why = form(cls, ctor, methods)
            if m is not None:
                return m, None
            reasons.append(why)
    return None, "; ".join(reasons)


def _infer_step(cls, ctor: dict, steps: list[str]) -> tuple[OptimMapping | None, str | None]:
    """The class-step form: ``step(params, grads)`` updating the dict it is given."""
    tried = []
    for step in steps:
        extras = _call_extras(cls, step)
        opt, ints, moved, raised = _trial(cls, ctor, _step_call(step, extras))
        if opt is not None and moved:
            break
        tried.append(f"{step} {'raised ' + raised if raised else 'left them unchanged'}")
    else:
        return None, (f"no method updates a parameters dict in place when called as "
                      f"method(params, grads) ({'; '.join(tried)})")
    hypers, lost, pairs, why = _candidates(cls, ctor, opt, extras, step)
    if why:
        return None, why
    t, others = _counter(ints)
    outside = [a for a, r in extras.items() if r == "t"]
    if t is None and not outside:
        return None, (f"no step counter: no int attribute reads 0, 1, 2 over two steps of "
                      f"{step}")
    decays = any("weight_decay" in h for h in hypers)
    keywords = _no_decay_keywords(cls, step, extras) if decays else []
    if not any(map(_says_exempt, keywords)):  # else a keyword that ignores the names is a bug
        keywords.append(None)
    forms = [{"step": step, "t": f"{outside[0]}=" if outside else t, "no_decay": nd,
              "first_t": first}
             for nd, first in itertools.product(keywords, (1, 0) if outside else (None,))]

    def said(kw):
        how = (f"class {cls.__name__}: {step}(params, grads) updates the parameters dict in "
               "place (run twice)")
        if kw["first_t"] is not None:
            return how, (f"t -> the step keyword {kw['t'][:-1]}, counted outside: first_t="
                         f"{kw['first_t']} (the value at the first step the evidence agrees "
                         "with)")
        return how, (f"t -> .{kw['t']}: an int reading 0, 1, 2 over two steps"
                     + (f" (also: {', '.join(others)})" if others else ""))
    return _decide(cls, ctor, hypers, lost, pairs, forms, said)


def _candidates(cls, ctor: dict, opt, extras: dict, what: str):
    """(the hyper= options, the constructor arguments stored nowhere, the (m, v) pairs of
    ``opt`` after the trial's steps of ``what``, None), or why there are none as the last."""
    hypers, lost = _hyper_options(cls(_values(1)[0], **ctor), ctor, extras)
    if not any("lr" in h for h in hypers):
        return [], [], [], ("the learning rate is stored nowhere I can find (constructor "
                            f"arguments {', '.join(ctor) or 'none'}), nor taken by {what}")
    slots = _slots(opt, CHECK_SHAPES)
    signs = {s: _signed(opt, s) for s in slots}
    pairs = [(m, v) for m in slots for v in slots if signs[m] and signs[v] is False]
    if not pairs:
        return [], [], [], (f"no moments: after two steps of {what}, no pair of containers "
                            "keyed like the parameters (one signed: m, one >= 0: v)")
    return hypers, lost, pairs, None


def _decide(cls, ctor: dict, hypers: list, lost: list, pairs: list, forms: list, said):
    """The numeric evidence over the candidate adapters (each hyper=, (m, v) pair and form, up
    to MAX_TRIES): the first equal to the reference is the mapping (``said(kwargs)``: the
    form's own evidence lines), else the closest one's deviation is why there is none."""
    tries = []
    for hyper, (m, v), form in itertools.product(hypers, pairs, forms):
        kw = {**form, "hyper": hyper, "m": m.argument(), "v": v.argument()}
        dev, where = _evidence(cls, kw)
        tries.append((dev, where, kw, (m, v)))
        if dev <= OPTIM_RTOL or len(tries) >= MAX_TRIES:
            break
    dev, where, kw, (m, v) = min(tries, key=lambda x: x[0])
    if dev > OPTIM_RTOL:
        return None, (f"optimizer({', '.join(_arguments(kw, m, v)[1:])}) differs from the "
                      f"reference adam_step by {dev:.1e} (relative, {where}; {len(tries)} "
                      f"candidate adapter(s) tried, {_config(kw)}): not the protocol's "
                      "Adam/AdamW -- a bug, or a form this cannot infer: no adam row written")
    return _mapping(cls, kw, m, v, lost, (dev, where, len(tries)), ctor, said(kw)), None


# ------------------------------------------------------------------------- a per-name update
def _each_methods(cls) -> list[tuple[str, list[tuple[str, ...]]]]:
    """Methods that may be a trainer's per-name update (``each=``): a step-like name (or one
    naming adam), four positional arguments required -- a parameter's name, the parameter, its
    gradient and the step counter the loop keeps -- and nothing else; with the orders of those
    roles (``each_args``) that their names allow."""
    out = []
    for n in sorted(n for n in dir(cls) if not n.startswith("__")
                    and any(w in n.lower() for w in (*STEP_WORDS, "adam"))):
        fn = getattr(cls, n, None)
        args = _positional(fn)[1:] if callable(fn) else []
        required = [p for p in args if p.default is p.empty]
        if len(required) == 4 and args[:4] == required and \
                not any(p.kind is p.KEYWORD_ONLY for p in required):
            orders = _each_orders([p.name for p in required])
            if orders:
                out.append((n, orders))
    return out


def _each_orders(names: list[str]) -> list[tuple[str, ...]]:
    """The orders of EACH_ROLES over the arguments ``names``: one named as a role has it, the
    others take the free roles in every order (the numeric evidence decides); none where two
    are named as one role."""
    named = [next((r for r, words in EACH_ROLES.items() if n.lower() in words), None)
             for n in names]
    fixed = [r for r in named if r]
    if len(set(fixed)) < len(fixed):
        return []
    orders = []
    for free in itertools.permutations(r for r in EACH_ROLES if r not in fixed):
        rest = iter(free)
        orders.append(tuple(r or next(rest) for r in named))
    return orders


def _each_extras(cls, each: str) -> dict:
    """The per-name update's optional hyperparameter arguments (``lr=1e-3``): name -> role."""
    return {p.name: _role(p.name) for p in _positional(getattr(cls, each))[5:]
            if _role(p.name)}


def _each_call(each: str, order: tuple, extras: dict, returned: set):
    """One step of the per-name form as :func:`optimizer`'s ``each`` takes it: the arguments
    in ``order``, the parameter updated in place or returned (its name added to ``returned``)."""
    def one_step(opt, params, grads, t):
        for k in params:
            given = {"name": k, "param": params[k], "grad": grads[k], "t": t}
            r = getattr(opt, each)(*(given[a] for a in order), **_keywords(extras, t))
            if isinstance(r, np.ndarray) and r.shape == params[k].shape:
                params[k] = r
                returned.add(k)
    return one_step


def _infer_each(cls, ctor: dict, eaches: list) -> tuple[OptimMapping | None, str | None]:
    """The per-name form: ``each(name, param, grad, t)`` (in some order) with the counter kept
    outside, both of its conventions (first_t 1 and 0) tried by the evidence."""
    tried, forms, returns, trained = [], [], {}, None
    for each, orders in eaches:
        extras = _each_extras(cls, each)
        for order in orders:
            returned = set()
            opt, _, moved, raised = _trial(cls, ctor, _each_call(each, order, extras, returned))
            if opt is not None and moved:
                forms += [{"step": "step", "t": "t", "no_decay": None, "each": each,
                           "each_args": order, "first_t": first} for first in (1, 0)]
                returns[order] = bool(returned)
                trained = opt if trained is None else trained  # (the slots: the first's)
            elif order == orders[0]:
                tried.append(f"{each}({', '.join(order)}) "
                             f"{'raised ' + raised if raised else 'left it unchanged'}")
        if forms:
            break
    else:
        return None, ("no method updates the parameter it is given when called per name as "
                      f"method(name, param, grad, t) in some order ({'; '.join(tried)})")
    hypers, lost, pairs, why = _candidates(cls, ctor, trained, extras, each)
    if why:
        return None, why

    def said(kw):
        args = [p.name for p in _positional(getattr(cls, each))[1:5]]
        where = dict(zip(kw["each_args"], args))
        how = "by returning it" if returns[kw["each_args"]] else "in place"
        return (f"class {cls.__name__}: {each}({', '.join(args)}) updates each parameter it is "
                f"given {how} (run twice per name): each_args "
                + ", ".join(f"{a} -> {r}" for a, r in zip(args, kw["each_args"])),
                f"t -> its argument {where['t']}, counted outside: first_t={kw['first_t']} "
                "(the value at the first step the evidence agrees with: the update's own "
                "convention -- check that the training loop passes it so)")
    return _decide(cls, ctor, hypers, lost, pairs, forms, said)


# ------------------------------------------------------------------------- the row written
def _config(kw: dict) -> str:
    flat = {k for keys in kw["hyper"] for k in (keys if isinstance(keys, tuple) else (keys,))}
    return f"{CHECK_STEPS} steps at " + ", ".join(f"{k}={v:g}" for k, v in CHECK.items()
                                                  if k in flat) + \
        (", the exempt names through no_decay" if kw.get("no_decay") else "")


def _arguments(kw: dict, m: _Slot, v: _Slot) -> list[str]:
    """optimizer()'s arguments as source (those at their defaults left out)."""
    hyper = ", ".join(f"{k!r}: {p!r}" for k, p in kw["hyper"].items())
    out = [f"step={kw['step']!r}"] if kw["step"] != "step" else []
    out += [f"hyper={{{hyper}}}", f"m={m.text()}", f"v={v.text()}"]
    out += [f"t={kw['t']!r}"] if kw["t"] != "t" else []
    out += [f"no_decay={kw['no_decay']!r}"] if kw["no_decay"] else []
    out += [f"each={kw['each']!r}", f"each_args={kw['each_args']!r}"] if kw.get("each") else []
    out += [f"first_t={kw['first_t']}"] if kw["first_t"] is not None else []
    return ["impl"] + out


def _mapping(cls, kw: dict, m: _Slot, v: _Slot, lost: list, found: tuple, ctor: dict,
             said: tuple[str, str]) -> OptimMapping:
    """The row and its evidence (``said``: the form's own lines)."""
    dev, _, tries = found
    flat = {k for keys in kw["hyper"] for k in (keys if isinstance(keys, tuple) else (keys,))}
    marks = ", ".join(f"{a}={x!r}" for a, x in ctor.items())
    ev = [said[0],
          "hyper " + ", ".join(f"{'/'.join(k) if isinstance(k, tuple) else k} -> "
                               f"{'the step keyword ' + p[:-1] if p.endswith('=') else '.' + p}"
                               for k, p in kw["hyper"].items())
          + (f": where the object stores the values it was built with ({marks})" if marks
             else "")]
    if lost:
        ev.append(f"constructor argument(s) {', '.join(lost)} stored nowhere found: not set")
    ev.append(f"m -> {m.text()}, v -> {v.text()}: keyed like the parameters, filled by the "
              "steps (m signed, v >= 0)")
    ev.append(said[1])
    if kw["no_decay"]:
        ev.append(f"no_decay -> the step keyword {kw['no_decay']}: the exempt names passed "
                  "there give the reference's AdamW")
    elif "weight_decay" in flat:
        ev.append("no no_decay keyword: the suite applies the protocol's default rule")
    declares = {}
    if "weight_decay" not in flat:
        declares = {"weight_decay": False}
        ev.append("no weight decay found: CAPABILITIES weight_decay False")
    ev.append(f"{_config(kw)} equal the reference adam_step to {dev:.0e} (relative: updates, "
              f"m, v, step; candidate {tries} of those tried)")
    source = {"arguments": _arguments(kw, m, v)}
    return OptimMapping(cls, kw, source, ev, declares)


# ------------------------------------------------------------------------- infer / render
def infer_optimizers(classes) -> tuple[list[OptimMapping], list[str]]:
    """([the row of the first class the evidence passes] or [], the not-mapped lines)."""
    found, missing = [], []
    for cls in classes:
        m, why = _infer_class(cls)
        if m is not None and found:
            found[0].evidence.append(f"also matches: {cls.__name__}")
        elif m is not None:
            found.append(m)
        elif why:
            missing.append(f"class {cls.__name__}: {why}")
    return found, missing


def adapter_imports(mappings) -> str:
    """The names the adapter imports from minibert_spec.suite.adapters."""
    opt = any(isinstance(m, OptimMapping) for m in mappings)
    layers = any(not isinstance(m, OptimMapping) for m in mappings) or not opt
    return ", ".join(n for n, used in (("layer", layers), ("optimizer", opt)) if used)


def optimizer_call(m: OptimMapping, alias: str) -> str:
    """The adapter's ``adam_init, adam_step = optimizer(...)`` line(s)."""
    args = [f"{alias}.{m.cls.__name__}", *m.source["arguments"][1:]]
    return "adam_init, adam_step = optimizer(\n    " + ",\n    ".join(args) + ")"
