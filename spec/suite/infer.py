"""``minibert adapter infer MODULE``: propose a class-layer adapter
(:func:`spec.suite.adapters.layer`) for the classes of a module, from their forward outputs
and shapes only.

For each op it knows (:data:`PROBES`: linear, layernorm, relu, gelu, softmax, the ReLU FFN) and
each class of the module with a forward-like and a backward-like method, it

* builds the class with its integer arguments drawn from the probe's distinct sizes (so a
  size names its axis: ``Linear(4, 5)`` is ``n_in = W.shape[0]``),
* places the protocol's parameters on the array attributes of their shape, or of the
  transposed shape (``transposed``), and runs the forward on the probe's input: the candidate
  is kept only where the output equals the reference forward's (the *only* numeric evidence),
* runs the backward once and maps each gradient by shape (and, where shapes tie, by the
  parameter's name in the gradient's path): the gradient *values* are never compared with
  anything, so that no bug of a backward can be inferred away -- the adapter it writes is then
  judged by ``minibert check`` like a hand-written one,
* reads the backward's source for the conventions (``+=`` into a gradient: ``accumulate``;
  ``del self.``: ``single_use``).

It returns the adapter's source: one comment per decision with its evidence, and the list of
what it could not map.  The user reviews it and keeps it.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

__all__ = ["PROBES", "Mapping_", "infer", "infer_source"]

FORWARDS = ("forward", "__call__", "call", "fprop", "forward_pass")
BACKWARDS = ("backward", "backprop", "bprop", "backward_pass")
INPUT_NAMES = ("x", "X", "input", "inputs", "z", "logits")
EPS_NAMES = ("eps", "epsilon")
PROTOCOL_EPS = 1e-12  # the protocol's LayerNorm eps (reference.layernorm_forward's default)
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
    cls: type
    ctor: dict  # constructor argument -> expression of the protocol's arguments
    params: dict = field(default_factory=dict)  # protocol name -> attribute path
    grads: dict = field(default_factory=dict)
    transposed: tuple = ()
    forward: str = "forward"
    backward: str = "backward"
    output: int | None = None
    again: tuple = ()
    accumulate: bool = False
    single_use: bool = False
    ranks: tuple = ()  # the input ranks its forward and backward run on, where not all do
    declares: dict = field(default_factory=dict)  # the op's declared form (CAPABILITIES)
    fixed: dict = field(default_factory=dict)  # the one value of an argument it computes
    evidence: list = field(default_factory=list)


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
    import reference

    fwd = getattr(reference, f"{op}_forward")
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
    fixed = {p: PROTOCOL_EPS for p in sig.parameters if p in EPS_NAMES and
             probe.op == "layernorm"}
    required = [p for p in sized if p.default is p.empty]
    if len(required) > 3:
        return
    optional = [p for p in sized if p.default is not p.empty][:3 - len(required)]
    sizes = probe.sizes or (4,)
    for n_opt in range(len(optional) + 1):  # the fewest arguments first
        names = required + optional[:n_opt]
        for combo in itertools.product(sizes, repeat=len(names)):
            yield {**{p.name: int(v) for p, v in zip(names, combo)}, **fixed}


def _place(obj, arrays: dict, probe: Probe, vals: dict):
    """Every way to put the probe's parameters on the object's arrays of their shape (or the
    transposed shape): [({param: path}, transposed)]."""
    options = []
    for p in probe.params:
        shape = probe.shapes[p]
        here = [(path, False) for path, a in arrays.items() if a.shape == shape]
        if len(shape) == 2 and shape[0] != shape[1]:
            here += [(path, True) for path, a in arrays.items() if a.shape == shape[::-1]]
        options.append(here + ([(None, False)] if p == "b" else []))
    for combo in itertools.product(*options):
        paths = [c[0] for c in combo if c[0] is not None]
        if len(paths) != len(set(paths)):
            continue
        yield ({p: c[0] for p, c in zip(probe.params, combo) if c[0] is not None},
               tuple(p for p, c in zip(probe.params, combo) if c[1]))


def _forward_matches(cls, kwargs, placed, transposed, fname, probe, vals, want):
    """(output index or None, max relative deviation) when the forward on ``vals`` gives the
    reference's output; None otherwise."""
    from spec.suite.adapters import set_path

    try:
        obj = cls(**kwargs)
        for p, path in placed.items():
            v = vals[p].T.copy() if p in transposed else vals[p].copy()
            set_path(obj, path, v)
        if "b" in probe.params and "b" not in placed:
            for path, a in _arrays(obj).items():  # a bias we did not place must not be used
                if a.shape == probe.shapes["b"]:
                    set_path(obj, path, np.zeros_like(a))
        got = getattr(obj, fname)(vals["x"].copy())
    except Exception:  # noqa: BLE001 -- a candidate that does not run is not the mapping
        return None
    for index, out in ([(None, got)] + ([(0, got[0])] if isinstance(got, tuple) and got
                                        else [])):
        out = np.asarray(out) if isinstance(out, np.ndarray) else None
        if out is not None and out.shape == want.shape and np.all(np.isfinite(out)):
            dev = float(np.max(np.abs(out - want)) / max(np.max(np.abs(want)), 1e-300))
            if dev <= FORWARD_RTOL:
                return index, dev, obj
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


def _map_grads(obj, before: dict, returned, m: Mapping_, probe: Probe, x_shape) -> list[str]:
    """Gradient paths by shape (the parameter's name in the path breaks a tie); returns what
    could not be mapped.  No gradient value is looked at."""
    after = _arrays(obj, GRAD_DEPTH)
    def named_grad(path: str) -> bool:
        parts = path.lower().split(".")
        return parts[-1].startswith("d") or any("grad" in q for q in parts)

    changed = {p: a for p, a in after.items()  # new or replaced arrays, or gradient-named
               if p not in m.params.values() and (p not in before or before[p] is not a
                                                 or named_grad(p))}
    missing = []
    for p in probe.params:
        if p not in m.params:
            continue
        shape = probe.shapes[p][::-1] if p in m.transposed else probe.shapes[p]
        cands = [path for path, a in changed.items() if a.shape == shape]
        if isinstance(returned, tuple) and len(returned) > 1 and isinstance(returned[1], Mapping):
            cands += [f"return[1].{k}" if str(k).isidentifier() else f"return[1]['{k}']"
                      for k, a in returned[1].items()
                      if isinstance(a, np.ndarray) and a.shape == shape]
        if len(cands) > 1:  # a tie of shapes: the parameter's own name in the path decides
            own = m.params[p].split(".")[-1].lower()
            named = [c for c in cands if own in c.lower().replace("return[1]", "")]
            cands = named if len(named) == 1 else cands
        if len(cands) == 1:
            m.grads[p] = cands[0]
            m.evidence.append(f"grad {p} -> {cands[0]} (after backward, the one gradient of "
                              f"{p}'s shape {list(shape)}, by shape and name only)")
        else:
            missing.append(f"{m.op}: the gradient of {p} ({len(cands)} candidates of shape "
                           f"{list(shape)}: {cands})")
    return missing


def _backward(cls, m: Mapping_, probe: Probe, vals: dict, obj) -> list[str]:
    """Decide the backward's call (upstream gradient, inputs needed again) and its gradients."""
    bname = _method(cls, BACKWARDS)
    if bname is None:
        return [f"{m.op}: {cls.__name__} has no backward method ({', '.join(BACKWARDS)})"]
    m.backward = bname
    params = [p for p in inspect.signature(getattr(obj, bname)).parameters.values()
              if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                     p.POSITIONAL_ONLY)]
    again = tuple("x" if p.name in INPUT_NAMES else "dout" for p in params)
    if "dout" not in again:
        return [f"{m.op}: {cls.__name__}.{bname}{inspect.signature(getattr(obj, bname))} takes "
                "no upstream gradient I can tell"]
    if again != ("dout",):
        m.again = again
        m.evidence.append(f"backward {bname}({', '.join(p.name for p in params)}): the forward's "
                          f"input again (again={again!r})")
    before = _arrays(obj, GRAD_DEPTH)
    dout = np.random.default_rng(1).standard_normal(vals["x"].shape[:-1] + (
        _reference_forward(probe.op, vals).shape[-1],))
    try:
        returned = getattr(obj, bname)(*(vals["x"] if a == "x" else dout for a in again))
    except Exception as e:  # noqa: BLE001
        return [f"{m.op}: {cls.__name__}.{bname} raised {type(e).__name__}: {e}"]
    src = ""
    try:
        src = inspect.getsource(getattr(cls, bname))
    except (OSError, TypeError):
        pass
    missing = _map_grads(obj, before, returned, m, probe, vals["x"].shape)
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


def _try_class(cls, probe: Probe) -> tuple[Mapping_ | None, list[str]]:
    """The mapping of ``cls`` to the probe's op (its standard form, else a declared variant)."""
    m, missing = _try_form(cls, probe)
    variant = VARIANT_PROBES.get(probe.op)
    if m is None and variant is not None:
        m, missing = _try_form(cls, variant)
        if m is not None:
            m.declares = variant.declares
            m.evidence.append(f"the declared form {variant.declares} (the standard one does "
                              "not match)")
    if m is not None and probe.op == "gelu":
        _gelu_form(m, cls)
    if m is not None and probe.op == "layernorm" and "eps" not in m.ctor.values():
        m.declares = {"layernorm": {**m.declares.get("layernorm", {}), "eps": False}}
        m.evidence.append("no eps argument: declared eps=False (the suite passes eps=0; a "
                          "class with a fixed eps inside is then red on near-constant rows: "
                          "review)")
    return m, missing


def _gelu_form(m: Mapping_, cls) -> None:
    """Which GELU the class computes: the erf form (the protocol's default) or the tanh
    approximation (they differ by ~3e-4), by the forward output alone."""
    import reference

    x = _probe_values(PROBES["gelu"])["x"]
    try:
        got = np.asarray(getattr(cls(), m.forward)(x.copy()))
    except Exception:  # noqa: BLE001 -- already matched once; nothing to decide
        return
    dev = {form: float(np.max(np.abs(got - reference.gelu_forward(x, form)[0])))
           for form in ("none", "tanh")}
    if dev["tanh"] < dev["none"] / 100:
        m.fixed = {"approximate": "tanh"}
        m.evidence.append(f"the tanh approximation: {dev['tanh']:.1e} from the reference's tanh "
                          f"GELU, {dev['none']:.1e} from the erf one (fixed approximate=tanh)")


def _try_form(cls, probe: Probe) -> tuple[Mapping_ | None, list[str]]:
    fname = _method(cls, FORWARDS)
    if fname is None or _method(cls, BACKWARDS) is None:
        return None, []
    vals = _probe_values(probe)
    want = _reference_forward(probe.op, vals)
    found: list = []
    for kwargs in _ctor_trials(cls, probe):
        try:
            arrays = _arrays(cls(**kwargs))
        except Exception:  # noqa: BLE001 -- these sizes do not build it
            continue
        for placed, transposed in _place(None, arrays, probe, vals):
            hit = _forward_matches(cls, kwargs, placed, transposed, fname, probe, vals, want)
            if hit is not None:
                found.append((kwargs, placed, transposed, hit))
    if not found:
        return None, []
    kwargs, placed, transposed, (index, dev, obj) = found[0]
    layouts = {p: probe.shapes[p][::-1] if p in transposed else probe.shapes[p]
               for p in probe.params}
    layouts["x"] = probe.shapes["x"]
    # sizes from the protocol's arguments; the protocol's eps to the constructor's
    ctor = {k: "eps" if k in EPS_NAMES else _size_expr(v, probe, layouts)
            for k, v in kwargs.items()}
    m = Mapping_(probe.op, cls, ctor, dict(placed), forward=fname, transposed=transposed,
                 output=index)
    m.evidence.append(f"{cls.__name__}({', '.join(f'{k}={v}' for k, v in kwargs.items())}).{fname}"
                      f" equals the reference {probe.op}_forward to {dev:.1e} (relative)"
                      + (f" with {', '.join(f'{p} at .{q}' for p, q in placed.items())}"
                         if placed else "")
                      + (f"; {', '.join(transposed)} stored transposed" if transposed else "")
                      + ("; the forward returns a tuple, item 0 is the output"
                         if index == 0 else ""))
    if len(found) > 1:
        m.evidence.append(f"{len(found)} placements match the forward; the first is kept")
    if "b" in probe.params and "b" not in placed:
        m.evidence.append("no bias found: calls with b are not applicable")
    missing = _backward(cls, m, probe, vals, obj)
    _ranks(cls, kwargs, m, probe, vals)
    return m, missing


def _ranks(cls, kwargs, m: Mapping_, probe: Probe, vals: dict) -> None:
    """The input ranks (1 .. the probe's) on which the forward and the backward run; where
    some do not, ``CAPABILITIES["ranks"]`` declares those that do (the suite then reshapes)."""
    from spec.suite.adapters import set_path

    ok = []
    for rank in range(1, vals["x"].ndim + 1):
        x = vals["x"][(0,) * (vals["x"].ndim - rank)]
        try:
            obj = cls(**kwargs)
            for p, path in m.params.items():
                set_path(obj, path, vals[p].T.copy() if p in m.transposed else vals[p].copy())
            out = getattr(obj, m.forward)(x.copy())
            out = out[m.output] if m.output is not None else out
            dout = np.ones_like(out)
            getattr(obj, m.backward)(*(x if a == "x" else dout for a in (m.again or ("dout",))))
            ok.append(rank)
        except Exception:  # noqa: BLE001 -- this rank does not run
            continue
    if ok and len(ok) < vals["x"].ndim:
        m.ranks = tuple(ok)
        m.evidence.append(f"forward and backward run on inputs of rank {ok} only: "
                          f"CAPABILITIES ranks {m.op}: {tuple(ok)}")


def infer(module) -> tuple[list[Mapping_], list[str]]:
    """(the mappings found, what could not be mapped) for the classes defined in ``module``."""
    if isinstance(module, str):
        try:
            mod = importlib.import_module(module)
        except Exception as e:  # noqa: BLE001 -- the user's module: say why, never a traceback
            raise ValueError(f"module {module!r} does not import: {type(e).__name__}: {e}") \
                from e
    else:
        mod = module
    classes = [c for _, c in inspect.getmembers(mod, inspect.isclass)
               if c.__module__ == mod.__name__]
    mappings, missing, used = [], [], set()
    for op, probe in PROBES.items():
        hits = []
        for cls in classes:
            if cls in used:
                continue
            m, miss = _try_class(cls, probe)
            if m is not None:
                hits.append((m, miss))
        if not hits:
            missing.append(f"{op}: no class whose forward gives the reference's output")
            continue
        m, miss = hits[0]
        if len(hits) > 1:
            m.evidence.append(f"also matches: {', '.join(h[0].cls.__name__ for h in hits[1:])}")
        used.add(m.cls)
        mappings.append(m)
        missing += miss
    mapped = {m.cls for m in mappings}
    missing += [f"class {c.__name__}: matches no op this can infer ({', '.join(PROBES)})"
                for c in classes if c not in mapped and _method(c, FORWARDS)]
    return mappings, missing


def _call(m: Mapping_, alias: str) -> str:
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
    mappings, missing = infer(module)
    alias = "impl"
    out = [f'"""Adapter: {module} under the minibert protocol (from `minibert adapter infer '
           f'{module}`).', "",
           "Each mapping was chosen by forward outputs and shapes only (never by gradients):",
           "review it, then check it with: minibert check <this module>", '"""', "",
           f"import {module} as {alias}", "from spec.suite.adapters import layer", ""]
    caps: dict = {}
    for m in mappings:
        caps.update(m.declares)
        if m.ranks:  # the input ranks the op runs on (other ranks are reshaped to one of them)
            caps.setdefault("ranks", {})[m.op] = m.ranks
    if caps:
        out += ["# what the classes declare (their forms, the ranks they run on)",
                f"CAPABILITIES = {caps!r}", ""]
    for m in mappings:
        out += [f"# {e}" for e in m.evidence]
        out += [_call(m, alias), ""]
    out.append("# not mapped (write these by hand, or leave them n/a):")
    out += [f"#   {s}" for s in missing] or ["#   nothing"]
    return "\n".join(out) + "\n"
