"""The backward of a subject whose forward matched: its call decided by its parameters'
names (``again=``), run once, and its gradients mapped by shape and name (never by value),
its conventions (``accumulate``, ``single_use``) read from its source."""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping

import numpy as np

from minibert_spec.suite.infer.probes import (
    CACHE_NAMES,
    GRAD_DEPTH,
    INPUT_NAMES,
    OUT_NAMES,
    PROTOCOL_EPS,
    UPSTREAM_NAMES,
    Mapping_,
    Probe,
    Trial,
    _reference_forward,
)
from minibert_spec.suite.infer.subjects import _arrays, _extra


def _grad_candidates(changed: dict, returned, shape) -> list[str]:
    """Where a gradient of ``shape`` may be after the backward: a new or replaced array
    attribute, an item of the returned tuple or of the dict returned beside dx."""
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


def read_conventions(m: Mapping_, src: str) -> None:
    """``m.accumulate`` (the backward's source ``src`` adds, ``+=``, into a gradient it was
    mapped to) and ``m.single_use`` (it deletes its activations, ``del self.``)."""
    m.accumulate = any(re.search(rf"\b{re.escape(p.split('.')[-1])}[\"'\]\s]*\+=", src)
                       for p in m.grads.values())
    m.single_use = bool(re.search(r"\bdel\s+self\.", src))


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
            role = None  # the upstream gradient, or the forward's second result (below)
        else:
            break
        roles.append(role)
    unknown = [i for i, r in enumerate(roles) if r is None]
    if cached and len(unknown) == 2 and "forward[1]" not in roles:
        # dy and t of gelu_backward(dy, x, t), the forward having returned (y, t): the one named
        # as a gradient is the upstream gradient, the other the forward's second result
        grad = [i for i in unknown if UPSTREAM_NAMES.fullmatch(params[i].name)]
        if len(grad) == 1:
            roles[next(i for i in unknown if i != grad[0])] = "forward[1]"
    return tuple("dout" if r is None else r for r in roles)


def _again_values(roles, trial: Trial, vals: dict, x, dout, returned, output):
    """The backward's arguments for ``roles`` on a probe run."""
    out = returned[output] if output is not None else returned
    given = {"x": x, "dout": dout, "out": out, "eps": PROTOCOL_EPS,
             **dict(zip(trial.extra, _extra(trial.extra, vals, x)))}  # labels at x's rank
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
    if probe.scalar and "dout" not in again:
        # a loss's backward from dloss = 1 (classes that return dL/dlogits): the suite scales it
        m.upstream = False
        m.evidence.append(f"backward {call.__name__}({', '.join(p.name for p in params)}) takes "
                          "no upstream gradient: the gradient of the loss itself (upstream=False)")
    elif again.count("dout") != 1:
        m.unusable = True  # no call of the backward decided: no row
        return [f"{m.op}: {subject.label}: backward {call.__name__}{sig} takes "
                f"{'no' if 'dout' not in again else 'more than one'} upstream gradient I can "
                "tell"]
    if again != ("dout",) and (m.upstream or again):
        m.again = again
        m.evidence.append(f"backward {call.__name__}({', '.join(p.name for p in params)}): "
                          f"again={again!r} (by the parameters' names)")
    before = _arrays(obj, GRAD_DEPTH) if obj is not None else {}
    dout = np.random.default_rng(1).standard_normal(np.shape(_reference_forward(probe.op, vals)))
    try:
        back = call(*_again_values(again, trial, vals, vals["x"], dout, returned, m.output))
    except Exception as e:  # noqa: BLE001
        # the call is decided and the user's backward raises: the row is written (minibert
        # check makes the raise a red naming it; infer's own check says so before it is done)
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
    read_conventions(m, subject.source())
    if m.accumulate:
        m.evidence.append("accumulate=True: the backward adds (+=) into its gradients")
    if m.single_use:
        m.evidence.append("single_use=True: the backward deletes its activations (del self.)")
    return missing
