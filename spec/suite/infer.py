"""``minibert adapter infer MODULE``: propose an adapter
(:func:`minibert_spec.suite.adapters.layer`) for the classes and the module-level function pairs of
a module, from their forward outputs and shapes only.

The subjects are the module's classes with a forward-like and a backward-like method
(:class:`ClassLayer`) and its functions paired by name, ``f`` or ``f_forward`` with
``f_backward`` (``_grad``, ``d_f``, ...: :class:`FunctionPair`; a notebook's functions, whose
``__module__`` is None, count as the module's).  For each op it knows (:data:`PROBES`: linear,
layernorm, relu, gelu, softmax, the ReLU FFN) and each subject, it

* builds the class with its integer arguments drawn from the probe's distinct sizes (so a
  size names its axis: ``Linear(4, 5)`` is ``n_in = W.shape[0]``), and places the protocol's
  parameters on the array attributes of their shape, or of the transposed shape
  (``transposed``); a function's parameters go to its arguments after the first (the input),
  each in either layout, ``eps``/``epsilon`` getting the protocol's eps,
* runs the forward on the probe's input: the candidate is kept only where the output (or item
  0 of a tuple) equals the reference forward's (the *only* numeric evidence),
* decides the backward's call by its parameters' names (the forward's input or arguments
  again, its cache ``forward[1]``, its output ``out``, the upstream gradient), runs it once
  and maps each gradient by shape -- attributes, a returned dict, a returned tuple's items --
  and, where shapes tie, by the parameter's name in the gradient's path (a tuple's items: in
  the forward's argument order, the protocol's rule): the gradient *values* are never
  compared with anything, so that no bug of a backward can be inferred away -- the adapter it
  writes is then judged by ``minibert check`` like a hand-written one,
* reads a class backward's source for the conventions (``+=`` into a gradient:
  ``accumulate``; ``del self.``: ``single_use``).

It returns the adapter's source: one comment per decision with its evidence, and the list of
what it could not map (a forward function without a backward is named there).  The user
reviews it and keeps it.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

__all__ = ["PROBES", "Mapping_", "infer", "infer_isolated", "infer_source"]

FORWARDS = ("forward", "__call__", "call", "fprop", "forward_pass")
BACKWARDS = ("backward", "backprop", "bprop", "backward_pass")
# module-level functions: a forward's name with one of these suffixes or none (``softmax``,
# ``relu_forward``), its backward's the same base with one of these (prefix, suffix)
FORWARD_SUFFIXES = ("_forward", "_fwd", "_fprop", "_forward_pass")
BACKWARD_AFFIXES = (("", "_backward"), ("", "_bwd"), ("", "_bprop"), ("", "_backprop"),
                    ("", "_backward_pass"), ("", "_grad"), ("", "_gradient"),
                    ("", "_derivative"), ("", "_deriv"), ("", "_prime"), ("d_", ""),
                    ("grad_", ""), ("backward_", ""))
# a forward function found without a backward is reported when its name says an op
OP_NAMES = {"linear": ("linear", "dense", "affine"), "layernorm": ("layernorm", "layer_norm"),
            "relu": ("relu",), "gelu": ("gelu",), "softmax": ("softmax",),
            "ffn": ("ffn", "feed_forward", "feedforward", "mlp")}
# a backward's parameter names: its cache, the forward's output, the upstream gradient
CACHE_NAMES = re.compile(r"cache\w*|ctx|saved\w*")
OUT_NAMES = re.compile(r"(\w+_)?(out|output|y|p|probs?|a|s|result)")
UPSTREAM_NAMES = re.compile(r"d_?[A-Za-z]\w*|grad\w*|delta\w*|upstream\w*|err\w*")
INPUT_NAMES = ("x", "X", "input", "inputs", "z", "logits")
EPS_NAMES = ("eps", "epsilon")
# the protocol's LayerNorm eps (minibert_reference.layernorm_forward's default)
PROTOCOL_EPS = 1e-12
# the forward output must equal the reference's to this (float64; a LayerNorm eps of 1e-5
# against the protocol's 1e-12 changes it by ~1e-5 on rows of unit variance)
FORWARD_RTOL = 1e-3
# how deep gradients are looked for: one level below a sub-layer (an FFN's
# linear1.gradients.dLdW), where parameters are found two levels down (linear1.weights)
GRAD_DEPTH = 3


@dataclass(frozen=True, eq=False)
class Probe:
    """An op's probe: the input and parameters (float64, distinct sizes) in the protocol's
    layout, and the sizes a constructor may be given."""

    op: str
    params: tuple[str, ...]  # the protocol's parameters the class may hold
    shapes: Mapping[str, tuple]  # x and each parameter
    sizes: tuple[int, ...]  # the sizes an integer constructor argument may take
    declares: dict = field(default_factory=dict)  # the CAPABILITIES of this form of the op


# B = 2, T = 3: distinct from every size, so a size found on an axis names that axis alone
PROBES = {
    "linear": Probe("linear", ("W", "b"), {"x": (2, 3, 4), "W": (4, 5), "b": (5,)}, (4, 5)),
    "layernorm": Probe("layernorm", ("gamma", "beta"),
                       {"x": (2, 3, 6), "gamma": (6,), "beta": (6,)}, (6,)),
    "relu": Probe("relu", (), {"x": (2, 3, 4)}, ()),
    "gelu": Probe("gelu", (), {"x": (2, 3, 4)}, ()),
    "softmax": Probe("softmax", (), {"x": (2, 3, 5)}, ()),
    # H = 4, I = 7: W_1 [H, I] and W_2 [I, H] told apart by shape, each bias by its length
    "ffn": Probe("ffn", ("W_1", "b_1", "W_2", "b_2"),
                 {"x": (2, 3, 4), "W_1": (4, 7), "b_1": (7,), "W_2": (7, 4), "b_2": (4,)},
                 (4, 7)),
}
# the declared forms tried where a class matches no standard probe of its op
VARIANT_PROBES = {
    "layernorm": Probe("layernorm", (), {"x": (2, 3, 6)}, (6,),
                       {"layernorm": {"affine": False}}),
}


@dataclass
class Mapping_:
    """What was inferred for one op: the class, its construction, and the layer() arguments,
    each with its evidence."""

    op: str
    cls: type | None  # None: module-level functions (``forward``, ``backward``)
    ctor: dict  # constructor argument -> expression of the protocol's arguments
    params: dict = field(default_factory=dict)  # protocol name -> attribute path
    grads: dict = field(default_factory=dict)
    transposed: tuple = ()
    forward: str | Callable = "forward"
    backward: str | Callable = "backward"
    output: int | None = None
    again: tuple = ()
    accumulate: bool = False
    single_use: bool = False
    ranks: tuple = ()  # the input ranks its forward and backward run on, where not all do
    declares: dict = field(default_factory=dict)  # the op's declared form (CAPABILITIES)
    fixed: dict = field(default_factory=dict)  # the one value of an argument it computes
    evidence: list = field(default_factory=list)
    inputs: tuple = ()  # a forward function's protocol arguments in its own order
    trial: Trial | None = None  # how the probe ran it


def _probe_values(probe: Probe, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    vals = {k: rng.standard_normal(s) for k, s in probe.shapes.items()}
    if "gamma" in vals:  # gamma away from 1, so gamma and beta cannot be confused
        vals["gamma"] = 1 + 0.5 * vals["gamma"]
    if probe.op == "relu":  # no pre-activation near the kink
        vals["x"] = np.where(np.abs(vals["x"]) < 0.1, 0.5, vals["x"])
    return vals


def _reference_forward(op: str, vals: dict):
    """The reference's output on the probe (a parameter the probe lacks: None, the op's form
    without it)."""
    import minibert_reference

    fwd = getattr(minibert_reference, f"{op}_forward")
    return fwd(vals["x"], *(vals.get(p) for p in PROBES[op].params))[0]


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
    """kwargs to build ``cls`` with: its required arguments, and those defaulting to None or an
    integer (a size the class may build its parameters from), given each an ordering of the
    probe's sizes; an ``eps``/``epsilon`` the protocol's (a LayerNorm's)."""
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):
        return
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    sized = [p for p in sig.parameters.values() if p.kind in kinds and (
        p.default is p.empty or p.default is None or
        (isinstance(p.default, int) and not isinstance(p.default, bool)))
        and p.name not in EPS_NAMES]
    fixed = _eps_args(sig.parameters, probe)
    required = [p for p in sized if p.default is p.empty]
    if len(required) > 3:
        return
    optional = [p for p in sized if p.default is not p.empty][:3 - len(required)]
    sizes = probe.sizes or (4,)
    for n_opt in range(len(optional) + 1):  # the fewest arguments first
        names = required + optional[:n_opt]
        for combo in itertools.product(sizes, repeat=len(names)):
            yield {**{p.name: int(v) for p, v in zip(names, combo)}, **fixed}


def _eps_args(names, probe: Probe) -> dict:
    """A LayerNorm's ``eps``/``epsilon`` argument (of a constructor or a forward function):
    the protocol's eps, which the adapter then passes on."""
    return {n: PROTOCOL_EPS for n in names if n in EPS_NAMES and probe.op == "layernorm"}


def _place(slots: dict, probe: Probe):
    """Every way to put the probe's parameters in the slots (attribute path or argument name
    -> the shape there, None: any), each in its shape or the transposed one: [({param: slot},
    transposed)]."""
    options = []
    for p in probe.params:
        shape = probe.shapes[p]
        here = [(slot, False) for slot, s in slots.items() if s is None or s == shape]
        if len(shape) == 2 and shape[0] != shape[1]:
            here += [(slot, True) for slot, s in slots.items() if s is None or s == shape[::-1]]
        options.append(here + ([(None, False)] if p == "b" else []))
    for combo in itertools.product(*options):
        paths = [c[0] for c in combo if c[0] is not None]
        if len(paths) != len(set(paths)):
            continue
        yield ({p: c[0] for p, c in zip(probe.params, combo) if c[0] is not None},
               tuple(p for p, c in zip(probe.params, combo) if c[1]))


@dataclass(frozen=True)
class Trial:
    """One way to run a subject on a probe: constructor or forward-function arguments fixed
    (``fixed``: sizes, the protocol's eps), the probe's parameters placed (``placed``: param ->
    attribute path or argument name), some stored ``transposed``."""

    fixed: dict
    placed: dict
    transposed: tuple

    def layout(self, p: str, vals: dict):
        """The probe's parameter ``p`` in the subject's own layout."""
        return vals[p].T.copy() if p in self.transposed else vals[p].copy()


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
                arrays = _arrays(self.cls(**kwargs))
            except Exception:  # noqa: BLE001 -- these sizes do not build it
                continue
            slots = {path: a.shape for path, a in arrays.items()}
            for placed, transposed in _place(slots, probe):
                yield Trial(kwargs, placed, transposed)

    def run(self, trial: Trial, probe: Probe, vals: dict, x):
        """(what the forward returned, the object) on input ``x``."""
        from minibert_spec.suite.adapters import set_path

        obj = self.cls(**trial.fixed)
        for p, path in trial.placed.items():
            set_path(obj, path, trial.layout(p, vals))
        if "b" in probe.params and "b" not in trial.placed:
            for path, a in _arrays(obj).items():  # a bias we did not place must not be used
                if a.shape == probe.shapes["b"]:
                    set_path(obj, path, np.zeros_like(a))
        return getattr(obj, self.forward)(x.copy()), obj

    def forward_names(self, trial: Trial) -> dict:
        params = list(inspect.signature(getattr(self.cls, self.forward)).parameters)
        return {params[1]: "x"} if len(params) > 1 else {}  # (self, x, ...)

    def backward_call(self, obj):
        return getattr(obj, self.backward)

    def source(self) -> str:
        try:
            return inspect.getsource(getattr(self.cls, self.backward))
        except (OSError, TypeError):
            return ""

    def describe(self, trial: Trial) -> str:
        return f"{self.label}({', '.join(f'{k}={v}' for k, v in trial.fixed.items())})." \
            f"{self.forward}"


class FunctionPair:
    """Module-level functions: a forward (its first argument the input, the others the op's
    parameters or its eps) and its backward, paired by name (``layer_norm`` /
    ``layer_norm_backward``, ``relu_forward`` / ``relu_backward``); ``backward`` None for a
    forward found alone."""

    raised = ""  # as ClassLayer.raised

    def __init__(self, forward, backward=None):
        self.fn, self.bfn = forward, backward
        self.label = forward.__name__
        self.forward, self.backward = forward, backward
        self.args = [p for p in inspect.signature(forward).parameters.values()
                     if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]

    def trials(self, probe: Probe):
        if not self.args:
            return
        rest = [p for p in self.args[1:] if p.name not in EPS_NAMES]
        fixed = _eps_args([p.name for p in self.args[1:]], probe)
        needed = {p.name for p in rest if p.default is p.empty}
        for placed, transposed in _place({p.name: None for p in rest}, probe):
            if needed <= set(placed.values()):
                yield Trial(fixed, placed, transposed)

    def run(self, trial: Trial, probe: Probe, vals: dict, x):
        kwargs = {arg: trial.layout(p, vals) for p, arg in trial.placed.items()}
        return self.fn(x.copy(), **kwargs, **trial.fixed), None

    def forward_names(self, trial: Trial) -> dict:
        return {self.args[0].name: "x", **{arg: p for p, arg in trial.placed.items()},
                **{arg: "eps" for arg in trial.fixed}}

    def backward_call(self, obj):
        return self.bfn

    def source(self) -> str:
        return ""

    def describe(self, trial: Trial) -> str:
        args = [self.args[0].name] + [f"{arg}={p}" for p, arg in trial.placed.items()] + \
            [f"{arg}=eps" for arg in trial.fixed]
        return f"{self.label}({', '.join(args)})"

    def inputs(self, trial: Trial) -> tuple:
        """The protocol arguments in the order of the function's own: None where one is
        skipped (a keyword call then)."""
        back = {**{arg: p for p, arg in trial.placed.items()}, **{a: "eps" for a in trial.fixed}}
        names = [p.name for p in self.args]
        last = max((names.index(a) for a in back), default=0)
        return ("x",) + tuple(back.get(n) for n in names[1:last + 1])


def _output(got, want):
    """(output index or None, max relative deviation) when what the forward returned is (or
    begins with) the reference's output; None otherwise: the one numeric evidence."""
    for index, out in ([(None, got)] + ([(0, got[0])] if isinstance(got, tuple) and got
                                        else [])):
        out = np.asarray(out) if isinstance(out, np.ndarray) else None
        if out is not None and out.shape == want.shape and np.all(np.isfinite(out)):
            dev = float(np.max(np.abs(out - want)) / max(np.max(np.abs(want)), 1e-300))
            if dev <= FORWARD_RTOL:
                return index, dev
    return None


def _size_expr(size: int, probe: Probe, layouts: dict) -> str:
    """The protocol expression of a constructor size: the first argument (parameters before x,
    in the layer's own layout) with an axis of that size."""
    for name in (*probe.params, "x"):
        shape = layouts.get(name)
        if shape is None:
            continue
        for axis in range(len(shape)):
            if shape[axis] == size:
                return f"{name}.shape[{axis if name != 'x' else axis - len(shape)}]"
    return repr(size)


def _grad_candidates(changed: dict, returned, shape) -> list[str]:
    """Where a gradient of ``shape`` may be after the backward: a new or replaced array
    attribute, an item of the dict the backward returned beside dx, or an item of the tuple it
    returned."""
    cands = [path for path, a in changed.items() if a.shape == shape]
    if isinstance(returned, tuple):
        if len(returned) > 1 and isinstance(returned[1], Mapping):
            cands += [f"return[1].{k}" if str(k).isidentifier() else f"return[1]['{k}']"
                      for k, a in returned[1].items()
                      if isinstance(a, np.ndarray) and a.shape == shape]
        cands += [f"return[{i}]" for i, a in enumerate(returned)
                  if isinstance(a, np.ndarray) and a.shape == shape]
    return cands


def _map_grads(changed: dict, returned, m: Mapping_, probe: Probe, order: list) -> list[str]:
    """Gradient locations by shape (the parameter's name in the path breaks a tie; items of a
    returned tuple tied by shape follow the forward's argument order, ``order``); returns what
    could not be mapped.  No gradient value is looked at."""
    missing = []
    for p in probe.params:
        if p not in m.params:
            continue
        shape = probe.shapes[p][::-1] if p in m.transposed else probe.shapes[p]
        cands = _grad_candidates(changed, returned, shape)
        how = "by shape and name only"
        if len(cands) > 1:  # a tie of shapes: the parameter's own name in the path decides
            own = m.params[p].split(".")[-1].lower()
            named = [c for c in cands if own in re.sub(r"return\[\d+\]", "", c.lower())]
            cands = named if len(named) == 1 else cands
        if len(cands) > 1 and all(re.fullmatch(r"return\[\d+\]", c) for c in cands):
            tied = [q for q in order if q in m.params and (probe.shapes[q][::-1] if q in
                    m.transposed else probe.shapes[q]) == shape]
            if len(tied) == len(cands):  # the protocol's rule: the forward's argument order
                cands = [cands[tied.index(p)]]
                how = f"by shape, the {len(tied)} of that shape in the forward's argument order"
        if len(cands) == 1:
            m.grads[p] = cands[0]
            m.evidence.append(f"grad {p} -> {cands[0]} (after backward, the one gradient of "
                              f"{p}'s shape {list(shape)}, {how})")
        else:
            missing.append(f"{m.op}: the gradient of {p} ({len(cands)} candidates of shape "
                           f"{list(shape)}: {cands})")
    return missing


def _roles(params, names: dict, cached: bool) -> tuple[str, ...]:
    """What the backward's parameters are (``again=``): the forward's input ``x`` or another of
    its arguments (by name), its cache (``forward[1]``, where the forward returned ``(out,
    cache)``), its output (``out``), and the upstream gradient (``dout``: any other required
    parameter).  An optional parameter is passed only while its role is known."""
    roles = []
    for p in params:
        if p.name in names:
            role = names[p.name]
        elif p.name in INPUT_NAMES:
            role = "x"
        elif cached and CACHE_NAMES.fullmatch(p.name):
            role = "forward[1]"
        elif OUT_NAMES.fullmatch(p.name) and not UPSTREAM_NAMES.fullmatch(p.name):
            role = "out"
        elif p.default is p.empty:
            role = "dout"
        else:
            break
        roles.append(role)
    return tuple(roles)


def _again_values(roles, trial: Trial, vals: dict, x, dout, returned, output):
    """The backward's arguments for ``roles`` on a probe run."""
    out = returned[output] if output is not None else returned
    given = {"x": x, "dout": dout, "out": out, "eps": PROTOCOL_EPS}
    return [returned[1] if r == "forward[1]" else given[r] if r in given else
            trial.layout(r, vals) for r in roles]


def _backward(subject, m: Mapping_, probe: Probe, vals: dict, trial: Trial, returned, obj
              ) -> list[str]:
    """Decide the backward's call (upstream gradient, inputs needed again) and its gradients."""
    call = subject.backward_call(obj)
    sig = inspect.signature(call)
    params = [p for p in sig.parameters.values()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY)]
    cached = m.output == 0 and len(returned) == 2
    again = _roles(params, subject.forward_names(trial), cached)
    if again.count("dout") != 1:
        return [f"{m.op}: {subject.label}: backward {call.__name__}{sig} takes "
                f"{'no' if 'dout' not in again else 'more than one'} upstream gradient I can "
                "tell"]
    if again != ("dout",):
        m.again = again
        m.evidence.append(f"backward {call.__name__}({', '.join(p.name for p in params)}): "
                          f"again={again!r} (by the parameters' names)")
    before = _arrays(obj, GRAD_DEPTH) if obj is not None else {}
    dout = np.random.default_rng(1).standard_normal(vals["x"].shape[:-1] + (
        _reference_forward(probe.op, vals).shape[-1],))
    try:
        back = call(*_again_values(again, trial, vals, vals["x"], dout, returned, m.output))
    except Exception as e:  # noqa: BLE001
        return [f"{m.op}: {subject.label}: {call.__name__} raised {type(e).__name__}: {e}"]
    after = _arrays(obj, GRAD_DEPTH) if obj is not None else {}

    def named_grad(path: str) -> bool:
        parts = path.lower().split(".")
        return parts[-1].startswith("d") or any("grad" in q for q in parts)

    changed = {p: a for p, a in after.items()  # new or replaced arrays, or gradient-named
               if p not in m.params.values() and (p not in before or before[p] is not a
                                                 or named_grad(p))}
    order = list(probe.params)  # a class's parameters: the protocol's order
    if m.cls is None:  # a function's: the order of its own arguments
        args = [a.name for a in subject.args]
        order = sorted(m.params, key=lambda p: args.index(m.params[p]))
    missing = _map_grads(changed, back, m, probe, order)
    src = subject.source()
    for path in m.grads.values():
        last = path.split(".")[-1]
        if re.search(rf"\b{re.escape(last)}[\"'\]\s]*\+=", src):
            m.accumulate = True
    if m.accumulate:
        m.evidence.append("accumulate=True: the backward adds (+=) into its gradients")
    if re.search(r"\bdel\s+self\.", src):
        m.single_use = True
        m.evidence.append("single_use=True: the backward deletes its activations (del self.)")
    return missing


def _try(subject, probe: Probe) -> tuple[Mapping_ | None, list[str]]:
    """The mapping of ``subject`` to the probe's op (its standard form, else a declared
    variant)."""
    m, missing = _try_form(subject, probe)
    variant = VARIANT_PROBES.get(probe.op)
    if m is None and variant is not None:
        m, missing = _try_form(subject, variant)
        if m is not None:
            m.declares = variant.declares
            m.evidence.append(f"the declared form {variant.declares} (the standard one does "
                              "not match)")
    if m is not None and probe.op == "gelu":
        _gelu_form(m, subject)
    if m is not None and probe.op == "layernorm" and \
            "eps" not in (*m.ctor.values(), *m.inputs):
        _declare_eps(subject, m, probe if m.declares.get("layernorm", {}).get("affine", True)
                     else variant)
    return m, missing


# the eps values a LayerNorm fixes in its code (0: none), told apart by its forward on rows of
# variance ~1e-4, where eps changes the output by eps / (2 var): 5e-9 for 1e-12 against 0, and
# one candidate from the next by more; FIXED_EPS_RTOL lies below all of those and far above
# float64's rounding of a LayerNorm (~1e-15)
FIXED_EPS = (0.0, 1e-12, 1e-10, 1e-9, 1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3)
FIXED_EPS_RTOL = 1e-9


def _declare_eps(subject, m: Mapping_, probe: Probe) -> None:
    """The declaration of a LayerNorm without an eps argument: the eps it fixes inside, found
    by its forward output on rows of small variance (the one candidate of FIXED_EPS it equals);
    eps=False (the suite passes eps=0) where that is 0, or where none or several match."""
    from minibert_reference.ops import layernorm_forward

    vals = _probe_values(probe)
    x = 1e-2 * vals["x"]  # rows of variance ~1e-4
    gamma = vals.get("gamma", np.ones(x.shape[-1]))
    beta = vals.get("beta", np.zeros(x.shape[-1]))
    try:
        returned, _ = subject.run(m.trial, probe, vals, x)
        out = np.asarray(returned[m.output] if m.output is not None else returned, np.float64)
    except Exception:  # noqa: BLE001 -- ran on the probe: a failure here is not a form
        out = None
    hits = []
    for eps in FIXED_EPS if out is not None else ():
        want = layernorm_forward(x, gamma, beta, eps)[0]
        if out.shape == want.shape and \
                np.max(np.abs(out - want)) <= FIXED_EPS_RTOL * np.max(np.abs(want)):
            hits.append(eps)
    kind = "class" if m.cls else "function"
    if len(hits) == 1 and hits[0] > 0:
        # declared, the suite calls it at that eps alone; fixed, the adapter takes that call
        m.declares = {"layernorm": {**m.declares.get("layernorm", {}), "eps": hits[0]}}
        m.fixed = {**m.fixed, "eps": hits[0]}
        m.evidence.append(f"no eps argument: its output on rows of variance ~1e-4 equals the "
                          f"reference's at eps={hits[0]:g} (to {FIXED_EPS_RTOL:g}) and at no "
                          f"other of {', '.join(f'{e:g}' for e in FIXED_EPS)}: declared "
                          f"eps={hits[0]:g}, fixed in the code (fixed={{'eps': {hits[0]!r}}})")
        return
    m.declares = {"layernorm": {**m.declares.get("layernorm", {}), "eps": False}}
    found = ("it equals the reference's at eps=0" if hits == [0.0] else
             f"its output on rows of variance ~1e-4 matches "
             f"{'none' if not hits else 'several'} of eps {', '.join(f'{e:g}' for e in FIXED_EPS)}")
    m.evidence.append(f"no eps argument ({found}): declared eps=False (the suite passes eps=0; a "
                      f"{kind} with another eps fixed inside is then red on near-constant rows: "
                      "review)")


def _gelu_form(m: Mapping_, subject) -> None:
    """Which GELU the subject computes: the erf form (the protocol's default) or the tanh
    approximation (they differ by ~3e-4), by the forward output alone."""
    import minibert_reference

    x = _probe_values(PROBES["gelu"])["x"]
    try:
        got = subject.run(m.trial, PROBES["gelu"], {"x": x}, x)[0]
        got = np.asarray(got[m.output] if m.output is not None else got)
    except Exception:  # noqa: BLE001 -- already matched once; nothing to decide
        return
    dev = {form: float(np.max(np.abs(got - minibert_reference.gelu_forward(x, form)[0])))
           for form in ("none", "tanh")}
    if dev["tanh"] < dev["none"] / 100:
        m.fixed = {"approximate": "tanh"}
        m.evidence.append(f"the tanh approximation: {dev['tanh']:.1e} from the reference's tanh "
                          f"GELU, {dev['none']:.1e} from the erf one (fixed approximate=tanh)")


def _forward_hits(subject, probe: Probe) -> list:
    """[(trial, output index, deviation, returned, object)] for every trial whose forward
    gives the reference's output on the probe."""
    vals = _probe_values(probe)
    want = _reference_forward(probe.op, vals)
    found = []
    for trial in subject.trials(probe):
        try:
            returned, obj = subject.run(trial, probe, vals, vals["x"])
        except Exception as e:  # noqa: BLE001 -- a candidate that does not run is not the mapping
            subject.raised = f"{type(e).__name__}: {str(e).strip().partition(chr(10))[0]}"
            continue
        hit = _output(returned, want)
        if hit is not None:
            found.append((trial, *hit, returned, obj))
    return found


def _try_form(subject, probe: Probe) -> tuple[Mapping_ | None, list[str]]:
    if subject.forward is None or subject.backward is None:
        return None, []
    found = _forward_hits(subject, probe)
    if not found:
        return None, []
    trial, index, dev, returned, obj = found[0]
    vals = _probe_values(probe)
    layouts = {p: probe.shapes[p][::-1] if p in trial.transposed else probe.shapes[p]
               for p in probe.params}
    layouts["x"] = probe.shapes["x"]
    is_class = isinstance(subject, ClassLayer)
    # sizes from the protocol's arguments; the protocol's eps to the constructor's
    ctor = {k: "eps" if k in EPS_NAMES else _size_expr(v, probe, layouts)
            for k, v in trial.fixed.items()} if is_class else {}
    m = Mapping_(probe.op, subject.cls if is_class else None, ctor, dict(trial.placed),
                 forward=subject.forward, transposed=trial.transposed, output=index,
                 trial=trial)
    if not is_class:
        m.backward, m.inputs = subject.backward, subject.inputs(trial)
    where = "at ." if is_class else "as argument "
    m.evidence.append(f"{subject.describe(trial)} equals the reference {probe.op}_forward to "
                      f"{dev:.1e} (relative)"
                      + (f" with {', '.join(f'{p} {where}{q}' for p, q in trial.placed.items())}"
                         if trial.placed else "")
                      + (f"; {', '.join(trial.transposed)} stored transposed"
                         if trial.transposed else "")
                      + ("; the forward returns a tuple, item 0 is the output"
                         if index == 0 else ""))
    if len(found) > 1:
        m.evidence.append(f"{len(found)} placements match the forward; the first is kept")
    if "b" in probe.params and "b" not in trial.placed:
        m.evidence.append("no bias found: calls with b are not applicable")
    missing = _backward(subject, m, probe, vals, trial, returned, obj)
    _ranks(subject, m, probe, vals)
    return m, missing


def _ranks(subject, m: Mapping_, probe: Probe, vals: dict) -> None:
    """The input ranks (1 .. the probe's) on which the forward and the backward run; where
    some do not, ``CAPABILITIES["ranks"]`` declares those that do (the suite then reshapes)."""
    ok = []
    for rank in range(1, vals["x"].ndim + 1):
        x = vals["x"][(0,) * (vals["x"].ndim - rank)]
        try:
            returned, obj = subject.run(m.trial, probe, vals, x)
            out = returned[m.output] if m.output is not None else returned
            subject.backward_call(obj)(*_again_values(
                m.again or ("dout",), m.trial, vals, x, np.ones_like(out), returned, m.output))
            ok.append(rank)
        except Exception:  # noqa: BLE001 -- this rank does not run
            continue
    if ok and len(ok) < vals["x"].ndim:
        m.ranks = tuple(ok)
        m.evidence.append(f"forward and backward run on inputs of rank {ok} only: "
                          f"CAPABILITIES ranks {m.op}: {tuple(ok)}")


def _pairs(functions) -> tuple[list[FunctionPair], list]:
    """(forward/backward pairs by name, the forwards found without a backward): ``f`` or
    ``f_forward`` with ``f_backward`` (``_bwd``, ``_grad``, ``_derivative``, ``d_f``, ...)."""
    by_name = {f.__name__: f for f in functions}
    pairs, alone, taken = [], [], set()
    for f in functions:
        name = f.__name__
        if name in taken or any((b and name.startswith(b)) or (a and name.endswith(a))
                                for b, a in BACKWARD_AFFIXES):
            continue
        stem = re.sub(rf"({'|'.join(FORWARD_SUFFIXES)})$", "", name)
        back = next((by_name[b + base + a] for base in (name, stem) for b, a in BACKWARD_AFFIXES
                     if b + base + a in by_name and b + base + a != name), None)
        if back is not None:
            pairs.append(FunctionPair(f, back))
            taken.add(back.__name__)
        elif any(alias in name.lower() for aliases in OP_NAMES.values() for alias in aliases):
            alone.append(f)
    return pairs, alone


def _module_functions(mod) -> list:
    """The functions defined in ``mod`` (``__module__`` None too: code executed from a
    notebook's cells into the module's namespace), not those it imported."""
    return [f for _, f in inspect.getmembers(mod, inspect.isfunction)
            if f.__module__ in (mod.__name__, None) and not f.__name__.startswith("_")]


def load_module(module: str):
    """The user's module, imported; a ValueError saying why it does not import."""
    try:
        return importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 -- the user's module: say why, never a traceback
        raise ValueError(f"module {module!r} does not import: {type(e).__name__}: {e}") from e


def infer(module) -> tuple[list[Mapping_], list[str]]:
    """(the mappings found, what could not be mapped) for the classes and the module-level
    function pairs defined in ``module``."""
    mod = load_module(module) if isinstance(module, str) else module
    classes = [c for _, c in inspect.getmembers(mod, inspect.isclass)
               if c.__module__ == mod.__name__]
    pairs, alone = _pairs(_module_functions(mod))
    subjects = [ClassLayer(c) for c in classes] + pairs
    mappings, missing, used = [], [], set()
    for op, probe in PROBES.items():
        hits = []
        for subject in subjects:
            if subject in used:
                continue
            m, miss = _try(subject, probe)
            if m is not None:
                hits.append((subject, m, miss))
        if not hits:
            missing.append(f"{op}: no class or function pair whose forward gives the "
                           "reference's output")
            missing += [f"{op}: function {f.__name__} gives the reference's output, but has no "
                        f"backward function ({f.__name__}_backward, _grad, d_{f.__name__}, "
                        "...)" for f in alone if _forward_hits(FunctionPair(f), probe)]
            continue
        subject, m, miss = hits[0]
        if len(hits) > 1:
            m.evidence.append(f"also matches: {', '.join(h[0].label for h in hits[1:])}")
        used.add(subject)
        mappings.append(m)
        missing += miss
    missing += [_unmapped_class(s) for s in subjects[:len(classes)]
                if s not in used and s.forward]
    missing += [f"functions {s.label}, {s.bfn.__name__}: match no op this can infer"
                + _raised(s) for s in pairs if s not in used]
    return mappings, missing


def _unmapped_class(subject: ClassLayer) -> str:
    """Why a class with a forward was not mapped: a forward that gives an op's output with no
    backward method beside it (its backward written elsewhere, e.g. one model-wide function)
    is named as such; otherwise it matches no probe."""
    if subject.backward is None:
        ops = [op for op, probe in PROBES.items() if _forward_hits(subject, probe)]
        if ops:
            return (f"class {subject.label}: its forward gives the reference's "
                    f"{' / '.join(ops)} output, but it has no backward method "
                    f"({', '.join(BACKWARDS)}): write the backward's call by hand")
    return f"class {subject.label}: matches no op this can infer ({', '.join(PROBES)})" + \
        _raised(subject)


def _raised(subject) -> str:
    return f" (its forward raised {subject.raised})" if subject.raised else ""


def _function_call(m: Mapping_, alias: str) -> list[str]:
    """``None, forward=..., backward=..., inputs=...`` of a function pair: the protocol's
    arguments passed in the function's own order (by keyword where it skips one)."""
    fwd = f"{alias}.{m.forward.__name__}"
    if None in m.inputs:  # an argument in between left at its default: call by keyword
        back = {**m.params, **({"eps": next(iter(m.trial.fixed))} if m.trial.fixed else {})}
        given = [n for n in m.inputs if n is not None]
        fwd = f"lambda {', '.join(given)}: {fwd}({given[0]}, " + \
            ", ".join(f"{back[n]}={n}" for n in given[1:]) + ")"
    kw = [f"forward={fwd}", f"backward={alias}.{m.backward.__name__}"]
    inputs = tuple(n for n in m.inputs if n is not None)
    return kw + ([f"inputs={inputs!r}"] if inputs != ("x",) else [])


def _call(m: Mapping_, alias: str) -> str:
    if m.cls is None:
        new, kw = "None", _function_call(m, alias) + ([f"grads={m.grads!r}"] if m.grads else [])
    else:
        args = sorted({re.match(r"\w+", e).group(0) for e in m.ctor.values()
                       if re.match(r"[A-Za-z_]", e)})
        ctor = ", ".join(f"{k}={v}" for k, v in m.ctor.items())
        new = f"lambda {', '.join(args)}: {alias}.{m.cls.__name__}({ctor})" if m.ctor else \
            f"{alias}.{m.cls.__name__}"
        kw = [f"params={m.params!r}"] if m.params else []
        kw += [f"grads={m.grads!r}"] if m.grads else []
        if m.forward != "forward":
            kw.append(f"forward={m.forward!r}")
        if m.backward != "backward":
            kw.append(f"backward={m.backward!r}")
    for name in ("transposed", "again"):
        if getattr(m, name):
            kw.append(f"{name}={getattr(m, name)!r}")
    if m.output is not None:
        kw.append(f"output={m.output}")
    if m.fixed:
        kw.append(f"fixed={m.fixed!r}")
    for name in ("accumulate", "single_use"):
        if getattr(m, name):
            kw.append(f"{name}=True")
    name = m.op
    return f"{name}_forward, {name}_backward = layer(\n    {name!r}, {new},\n    " + \
        ",\n    ".join(kw) + ")" if kw else \
        f"{name}_forward, {name}_backward = layer({name!r}, {new})"


def infer_source(module: str) -> str:
    """The adapter's source for ``module`` (see the module's docstring)."""
    if not re.fullmatch(r"[A-Za-z_][\w.]*", module):
        raise ValueError(f"module: expected an import name like mybert or pkg.model, got "
                         f"{module!r}")
    return render_source(module, *infer(module))


def render_source(module: str, mappings: list[Mapping_], missing: list[str]) -> str:
    """The adapter's source for what :func:`infer` found in ``module``."""
    alias = "impl"
    out = [f'"""Adapter: {module} under the minibert protocol (from `minibert adapter infer '
           f'{module}`).', "",
           "Each mapping was chosen by forward outputs and shapes only (never by gradients):",
           "review it, then check it with: minibert check <this module>", '"""', "",
           f"import {module} as {alias}", "from minibert_spec.suite.adapters import layer", ""]
    caps: dict = {}
    for m in mappings:
        caps.update(m.declares)
        if m.ranks:  # the input ranks the op runs on (other ranks are reshaped to one of them)
            caps.setdefault("ranks", {})[m.op] = m.ranks
    if caps:
        out += ["# what the code declares (its forms, the ranks it runs on)",
                f"CAPABILITIES = {caps!r}", ""]
    for m in mappings:
        out += [f"# {e}" for e in m.evidence]
        out += [_call(m, alias), ""]
    out.append("# not mapped (write these by hand, or leave them n/a):")
    out += [f"#   {s}" for s in missing] or ["#   nothing"]
    return "\n".join(out) + "\n"


# The child of infer_isolated: sys.path as the parent's, the module imported (then a word in the
# stage file, so that a hang or an exit is said to be the import's or the inference's), the
# adapter's source (or why there is none) in the result file.  Whatever the module prints goes
# to the child's stdout and stderr, which the parent shows on its stderr; os._exit ends it even
# with a leftover non-daemon thread of the module's.
_INFER_CHILD = """\
import json, os, sys
module, stage, result = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path[:] = json.loads(sys.argv[4])


def say(**what):
    with open(result + ".part", "w") as f:
        json.dump(what, f)
    os.replace(result + ".part", result)


try:
    from minibert_spec.suite.infer import infer, load_module, render_source

    load_module(module)
    with open(stage, "w") as f:
        f.write("imported")
    mappings, missing = infer(module)
    say(source=render_source(module, mappings, missing), mapped=len(mappings),
        missing=missing)
except ValueError as e:  # the module does not import, or an argument refused: its one line
    say(refused=str(e))
except BaseException as e:  # SystemExit and KeyboardInterrupt too: the user's code raised
    lines = str(e).strip().splitlines()
    say(raised=type(e).__name__ + (": " + lines[0] if lines else ""))
for stream in (sys.stdout, sys.stderr):
    try:
        stream.flush()
    except BaseException:
        pass
os._exit(0)
"""


@dataclass(frozen=True)
class Inferred:
    """What :func:`infer_isolated` got: the adapter's ``source``, or the one-line ``reason``
    there is none; ``output``, what the module printed (stdout and stderr); ``mapped``, the
    number of ops mapped, and ``missing``, what was not."""

    source: str | None
    reason: str | None
    output: str
    mapped: int = 0
    missing: tuple = ()


def infer_isolated(module: str, timeout: float | None, *, paths=()) -> Inferred:
    """:func:`infer_source` of ``module`` run as ``minibert check`` runs an implementation: in
    a child interpreter (this process's ``sys.path``, ``paths`` first) of its own session,
    under a time limit of ``timeout`` seconds for the import and the inference together (None:
    none), with what the module prints captured.  An import or an inference that hangs, exits
    (``sys.exit`` or ``os._exit``), crashes or raises gives a reason of one line, never a
    source."""
    import json
    import os
    import subprocess
    import sys
    import tempfile

    from minibert_spec.suite.probe import _kill_group, ended

    if not re.fullmatch(r"[A-Za-z_][\w.]*", module):
        raise ValueError(f"module: expected an import name like mybert or pkg.model, got "
                         f"{module!r}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout: expected a positive number of seconds, got {timeout}")
    path = list(dict.fromkeys(os.path.abspath(p or os.curdir) for p in [*paths, *sys.path]))
    with tempfile.TemporaryDirectory(prefix="minibert-infer-") as tmp:
        stage, result = os.path.join(tmp, "stage"), os.path.join(tmp, "result")
        printed = os.path.join(tmp, "output")
        with open(printed, "wb") as out:
            child = subprocess.Popen(
                [sys.executable, "-c", _INFER_CHILD, module, stage, result, json.dumps(path)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)  # a hang's children are killed with it
            try:
                code = child.wait(timeout)
            except subprocess.TimeoutExpired:
                _kill_group(child)
                code = None
        with open(printed, "rb") as f:
            output = f.read().decode("utf-8", "replace")
        what = (f"inferring an adapter for {module!r} (its classes and functions run)"
                if os.path.exists(stage) else f"importing {module!r}")
        if code is None:
            return Inferred(None, f"impl: {what} did not finish within {timeout:g} s", output)
        if not os.path.exists(result):
            return Inferred(None, ended(what, code, "before it finished",
                                           "nothing could be inferred"), output)
        with open(result, encoding="utf-8") as f:
            said = json.load(f)
    if "source" in said:
        return Inferred(said["source"], None, output, said["mapped"], tuple(said["missing"]))
    if "refused" in said:
        return Inferred(None, said["refused"], output)
    return Inferred(None, f"impl: {what} raised {said['raised']}", output)
