"""The subjects of :mod:`minibert_spec.suite.infer`: the user's module imported, its
classes with a forward and a backward (:class:`ClassLayer`) and its function pairs
(:class:`FunctionPair`) found, and how each is built and run on a probe (its constructor's
sizes, the probe's parameters placed on its arrays or arguments)."""

from __future__ import annotations

import importlib
import inspect
import itertools
import re

import numpy as np

from minibert_spec.suite.infer.probes import (
    BACKWARD_AFFIXES,
    BACKWARDS,
    EPS_NAMES,
    FORWARD_SUFFIXES,
    FORWARDS,
    NORM_EPS,
    OP_NAMES,
    Probe,
    Trial,
)


def _arrays(obj, depth: int = 2, prefix: str = "") -> dict[str, np.ndarray]:
    """path -> float array attribute of ``obj`` (through sub-objects and lists, ``depth``
    levels): where a layer may keep a parameter or a gradient."""
    out: dict[str, np.ndarray] = {}
    items = obj.items() if isinstance(obj, dict) else \
        vars(obj).items() if hasattr(obj, "__dict__") else ()
    for name, v in items:
        if not isinstance(name, str) or not name.isidentifier():
            continue
        path = f"{prefix}{name}"
        if isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.floating):
            out[path] = v
        elif depth > 1 and (isinstance(v, dict) or (
                hasattr(v, "__dict__") and not inspect.isroutine(v) and not isinstance(v, type)
                and type(v).__module__ != "builtins")):
            out.update(_arrays(v, depth - 1, path + "."))
    return out


def _method(cls, names) -> str | None:
    for n in names:
        if callable(getattr(cls, n, None)) and (n != "__call__" or "__call__" in vars(cls)):
            return n
    return None


def _ctor_trials(cls, probe: Probe):
    """kwargs to build ``cls`` with: its required arguments and those defaulting to None or an
    integer (a size) given each an ordering of the probe's sizes; an eps the protocol's; an
    argument named as a parameter (``Linear(W)``) an array of its shape (the placement then
    overwrites it)."""
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):
        return
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    sized = [p for p in sig.parameters.values() if p.kind in kinds and (
        p.default is p.empty or p.default is None or
        (isinstance(p.default, int) and not isinstance(p.default, bool)))
        and p.name not in EPS_NAMES and p.name not in probe.params and p.name != "dtype"]
    fixed = {**_eps_args(sig.parameters, probe), **_dtype_arg(sig.parameters, probe),
             **{n: np.zeros(probe.shapes[n]) for n in sig.parameters if n in probe.params}}
    required = [p for p in sized if p.default is p.empty]
    if len(required) > 3:
        return
    optional = [p for p in sized if p.default is not p.empty][:3 - len(required)]
    sizes = probe.sizes or (4,)
    for n_opt in range(len(optional) + 1):  # the fewest arguments first
        names = required + optional[:n_opt]
        for combo in itertools.product(sizes, repeat=len(names)):
            yield {**{p.name: int(v) for p, v in zip(names, combo)}, **fixed}


def _dtype_arg(names, probe: Probe) -> dict:
    """A constructor's ``dtype`` (``PositionalEncoding(T, d, dtype)``): float64 here, the
    adapter passes ``x.dtype`` (a float32 input gets a float32 table)."""
    return {"dtype": np.float64} if "dtype" in names and "x" not in probe.ints else {}


def _eps_args(names, probe: Probe) -> dict:
    """A norm's ``eps``/``epsilon`` argument: the protocol's eps of that norm."""
    return {n: NORM_EPS[probe.op] for n in names if n in EPS_NAMES and probe.op in NORM_EPS}


def _norm(name: str) -> str:
    """A name compared loosely: ``W_q``, ``Wq`` and ``w_q`` are one."""
    return name.lower().replace("_", "")


def _named(slots: dict, probe: Probe) -> dict:
    """{param: slot} where exactly one slot's own name (the path's last part) is the
    parameter's, loosely (``Wq`` for W_q), and its shape fits (or is not known yet: None)."""
    named = {}
    for p in probe.params:
        shape = probe.shapes[p]
        hits = [path for path, s in slots.items() if _norm(path.split(".")[-1]) == _norm(p)
                and (s is None or isinstance(s, str) or s in (shape, shape[::-1]))]
        if len(hits) == 1:
            named[p] = hits[0]
    return named


def _place(slots: dict, probe: Probe, named: dict | None = None):
    """Every way to put the probe's parameters in the slots (attribute path or argument name
    -> the shape there, None: any), each in its shape or the transposed one: [({param: slot},
    transposed)].  A parameter in ``named`` goes to that slot alone; none is tried at all when
    the ways exceed MAX_PLACEMENTS (eight same-shaped attention weights on unnamed slots)."""
    options = []
    named = named or {}
    for p in probe.params:
        shape = probe.shapes[p]
        slot = named.get(p)
        if slot is not None:  # a slot of the parameter's own name takes it alone
            s = slots[slot]
            if isinstance(s, tuple):  # its shape says which layout
                here = [(slot, s != shape)]
            else:  # an argument, or a weight not set yet: either layout
                here = [(slot, False)] + ([(slot, True)] if len(shape) == 2 and
                                          shape[0] != shape[1] else [])
        else:
            here = [(slot, False) for slot, s in slots.items() if s is None or s == shape]
            if len(shape) == 2 and shape[0] != shape[1]:
                here += [(slot, True) for slot, s in slots.items()
                         if s is None or s == shape[::-1]]
        options.append(here + ([(None, False)] if p in probe.optional else []))
    if np.prod([len(o) for o in options], dtype=float) > MAX_PLACEMENTS:
        return
    for combo in itertools.product(*options):
        paths = [c[0] for c in combo if c[0] is not None]
        if len(paths) != len(set(paths)):
            continue
        yield ({p: c[0] for p, c in zip(probe.params, combo) if c[0] is not None},
               tuple(p for p, c in zip(probe.params, combo) if c[1]))


class ClassLayer:
    """A class of the module with a forward-like and a backward-like method: built fresh for
    each run, the probe's parameters set on its array attributes."""

    raised = ""  # what its forward last raised on a probe: said where it maps to nothing

    def __init__(self, cls):
        self.cls, self.label = cls, cls.__name__
        self.forward, self.backward = _method(cls, FORWARDS), _method(cls, BACKWARDS)

    def trials(self, probe: Probe):
        for kwargs in _ctor_trials(self.cls, probe):
            try:
                obj = self.cls(**kwargs)
                arrays = _arrays(obj)
            except Exception:  # noqa: BLE001 -- these sizes do not build it
                continue
            slots = {path: a.shape for path, a in arrays.items()}
            # an attribute left None until the weights are set (nanoGPT ports), named as a
            # parameter: that parameter's slot (by name: a shape it has not got yet)
            slots.update(_named_none(obj, probe))
            for placed, transposed in _place(slots, probe, _named(slots, probe)):
                yield Trial(kwargs, placed, transposed, probe.extra)

    def run(self, trial: Trial, probe: Probe, vals: dict, x):
        """(what the forward returned, the object) on input ``x``."""
        from minibert_spec.suite.adapters import set_path

        obj = self.cls(**trial.fixed)
        for p, path in trial.placed.items():
            set_path(obj, path, trial.layout(p, vals))
        for b in probe.optional:  # a bias we did not place must not be used
            if b not in trial.placed:
                for path, a in _arrays(obj).items():
                    if a.shape == probe.shapes[b] and path not in trial.placed.values():
                        set_path(obj, path, np.zeros_like(a))
        return getattr(obj, self.forward)(x.copy(), *_extra(probe.extra, vals, x)), obj

    def forward_names(self, trial: Trial) -> dict:
        params = list(inspect.signature(getattr(self.cls, self.forward)).parameters)
        return dict(zip(params[1:], ("x", *trial.extra)))  # (self, x, labels, ...)

    def backward_call(self, obj):
        return getattr(obj, self.backward)

    def source(self) -> str:
        try:
            return inspect.getsource(getattr(self.cls, self.backward))
        except (OSError, TypeError):
            return ""

    def describe(self, trial: Trial) -> str:
        args = (f"{k}={k if isinstance(v, np.ndarray) or k == 'dtype' else v}"
                for k, v in trial.fixed.items())
        return f"{self.label}({', '.join(args)})." \
            f"{self.forward}"


class FunctionPair:
    """Module-level functions: a forward (its first argument the input, the others the op's
    parameters or its eps) and its backward paired by name (None for a forward found alone)."""

    raised = ""  # as ClassLayer.raised

    def __init__(self, forward, backward=None):
        self.fn, self.bfn = forward, backward
        self.label = forward.__name__
        self.forward, self.backward = forward, backward
        self.args = [p for p in inspect.signature(forward).parameters.values()
                     if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]

    def trials(self, probe: Probe):
        if len(self.args) < 1 + len(probe.extra):
            return
        # the protocol's keywords (n_heads) given their probe value, like an eps
        fixed = {**_eps_args([p.name for p in self.args[1:]], probe),
                 **{p.name: probe.scalars[p.name] for p in self.args[1:]
                    if p.name in probe.scalars}}
        for i, extra_args in enumerate(self._extra_slots(probe)):
            # the parameters' slots: the arguments after the input but the extra inputs'
            rest = [p for p in self.args[1:] if p.name not in fixed and p.name not in extra_args]
            needed = {p.name for p in rest if p.default is p.empty}
            slots = {p.name: None for p in rest}
            named = _named({p.name: "" for p in rest}, probe)
            if len(probe.params) > MAX_UNNAMED:  # attention's eight: by name, not every order
                slots = {a: "" for a in named.values()}
            for placed, transposed in _place(slots, probe, named):
                if needed <= set(placed.values()):
                    yield Trial(fixed, placed, transposed, probe.extra,
                                extra_args if i else ())  # after the parameters

    def _extra_slots(self, probe: Probe) -> list[tuple[str, ...]]:
        """The arguments that may take the probe's extra inputs (a loss's labels): those right
        after the input (``cross_entropy(logits, labels)``), or else the last required ones,
        after the parameters (``lm_loss(x, W, b, targets)``, the protocol's own order).  Which
        is right only the forward's output tells."""
        k = len(probe.extra)
        positional = [p for p in self.args[1:] if p.kind is not p.KEYWORD_ONLY]
        slots = [tuple(p.name for p in positional[:k])]
        required = [p.name for p in positional if p.default is p.empty]
        if k and len(required) >= k and tuple(required[-k:]) != slots[0]:
            slots.append(tuple(required[-k:]))
        return slots

    def _extra_names(self, trial: Trial) -> tuple[str, ...]:
        """The function's arguments that take the trial's extra inputs, in their order."""
        return trial.extra_args or tuple(a.name for a in self.args[1:1 + len(trial.extra)])

    def run(self, trial: Trial, probe: Probe, vals: dict, x):
        kwargs = {arg: trial.layout(p, vals) for p, arg in trial.placed.items()}
        extra = _extra(probe.extra, vals, x)
        if trial.extra_args:  # after the parameters: by their own names
            kwargs.update(zip(trial.extra_args, extra))
            extra = []
        return self.fn(x.copy(), *extra, **kwargs, **trial.fixed), None

    def forward_names(self, trial: Trial) -> dict:
        return {self.args[0].name: "x",
                **dict(zip(self._extra_names(trial), trial.extra)),
                **{arg: p for p, arg in trial.placed.items()},
                **{arg: _fixed_role(arg) for arg in trial.fixed}}

    def backward_call(self, obj):
        return self.bfn

    def source(self) -> str:
        return ""

    def describe(self, trial: Trial) -> str:
        # extra inputs after the parameters are passed by keyword, and shown so (run)
        args = [self.args[0].name, *(() if trial.extra_args else self._extra_names(trial))] + \
            [f"{arg}={p}" for p, arg in trial.placed.items()] + \
            [f"{arg}={_fixed_role(arg)}" for arg in trial.fixed] + \
            [f"{arg}={e}" for arg, e in zip(trial.extra_args, trial.extra)]
        return f"{self.label}({', '.join(args)})"

    def inputs(self, trial: Trial) -> tuple:
        """The protocol arguments in the function's own order (None: one skipped)."""
        back = self.forward_names(trial)
        names = [p.name for p in self.args]
        last = max(names.index(a) for a in back)
        return ("x",) + tuple(back.get(n) for n in names[1:last + 1])


# the most parameters placed in every order on a function's arguments (an FFN's four: 24
# orders); above, a parameter goes to the argument of its own name only
MAX_UNNAMED = 4
# the most placements tried for one construction of a class (each costs a forward)
MAX_PLACEMENTS = 5000


def _fixed_role(arg: str) -> str:
    """The protocol argument a fixed argument stands for (its eps, or its own name)."""
    return "eps" if arg in EPS_NAMES else arg


def _named_none(obj, probe: Probe) -> dict:
    """{attribute: its name} of the None attributes named as a probe's parameter."""
    return {p: p for p in probe.params if hasattr(obj, p) and getattr(obj, p) is None}


def _extra(names, vals: dict, x) -> list:
    """The extra inputs ``names`` (a loss's labels) for input ``x``: their leading axes cut as
    x's were (a rank below the probe's, ``_ranks``)."""
    cut = vals["x"].ndim - np.ndim(x)
    return [vals[e][(0,) * cut].copy() for e in names]


def _pairs(functions) -> tuple[list[FunctionPair], list]:
    """(forward/backward pairs by name, the forwards found without a backward): ``f`` or
    ``f_forward`` with ``f_backward`` (``_bwd``, ``_grad``, ``_derivative``, ``d_f``, ...)."""
    by_name = {f.__name__: f for f in functions}
    pairs, alone = pair_names(by_name)
    return [FunctionPair(by_name[f], by_name[b]) for f, b in pairs], [by_name[f] for f in alone]


def pair_names(names) -> tuple[list[tuple[str, str]], list[str]]:
    """:func:`_pairs` on names alone (a module's functions, or a namespace's attributes):
    ([(forward, backward)], the forwards without a backward that are named as an op)."""
    names = list(names)
    known = set(names)
    pairs, alone, taken = [], [], set()
    for name in names:
        if name in taken or any((b and name.startswith(b)) or (a and name.endswith(a))
                                for b, a in BACKWARD_AFFIXES):
            continue
        stem = re.sub(rf"({'|'.join(FORWARD_SUFFIXES)})$", "", name)
        back = next((b + base + a for base in (name, stem) for b, a in BACKWARD_AFFIXES
                     if b + base + a in known and b + base + a != name), None)
        if back is not None:
            pairs.append((name, back))
            taken.add(back)
        elif any(alias in name.lower() for aliases in OP_NAMES.values() for alias in aliases):
            alone.append(name)
    return pairs, alone


def _module_functions(mod) -> list:
    """The functions defined in ``mod`` (``__module__`` None too: code executed from a
    notebook's cells into the module's namespace), not those it imported."""
    return [f for _, f in inspect.getmembers(mod, inspect.isfunction)
            if f.__module__ in (mod.__name__, None) and not f.__name__.startswith("_")]


def own_functions(mod) -> list[tuple[str, object]]:
    """(name, function) of :func:`_module_functions` by the public names ``mod`` holds them."""
    return [(name, f) for name, f in inspect.getmembers(mod, inspect.isfunction)
            if f.__module__ in (mod.__name__, None) and not name.startswith("_")]


def import_name(module: str) -> None:
    """A ValueError unless ``module`` is an import name."""
    if not re.fullmatch(r"[A-Za-z_][\w.]*", module):
        raise ValueError(f"module: expected an import name like mybert or pkg.model, got "
                         f"{module!r}")


def load_module(module: str):
    """The user's module, imported; a ValueError saying why it does not import."""
    try:
        return importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 -- the user's module: say why, never a traceback
        raise ValueError(f"module {module!r} does not import: {type(e).__name__}: {e}") from e
