"""The subjects of a module matched to the ops: each probe's forward run on each subject
(the forward output against the reference's, the one numeric evidence), the op's form
decided (a declared variant, a LayerNorm's fixed eps, GELU's tanh form, the ranks it runs
on), and :func:`infer`, the mappings found and what could not be mapped."""

from __future__ import annotations

import inspect

import numpy as np

from minibert_spec.suite.infer.backward import _again_values, _backward
from minibert_spec.suite.infer.blocks import infer_blocks  # the block row (blocks.py)
from minibert_spec.suite.infer.decoder_recorded import infer_decoder  # the decoder row
from minibert_spec.suite.infer.fnblocks import infer_function_blocks  # of functions
from minibert_spec.suite.infer.losses import LOSS_OPS, declare_forms, rerun
from minibert_spec.suite.infer.optim import infer_optimizers  # the adam row (optim.py)
from minibert_spec.suite.infer.positions import POSITION_OPS, settle  # positions.py
from minibert_spec.suite.infer.probes import (
    BACKWARDS,
    EPS_NAMES,
    FIXED_EPS,
    FORWARD_RTOL,
    NORM_EPS,
    PROBES,
    VARIANT_PROBES,
    Mapping_,
    Probe,
    _probe_values,
    _reference_forward,
    deviation,
    one_line,
)
from minibert_spec.suite.infer.subjects import (
    ClassLayer,
    FunctionPair,
    _module_functions,
    _pairs,
    load_module,
)
from minibert_spec.suite.infer.training import infer_training  # schedule, clip (training.py)


def _output(got, want):
    """(output index or None, max relative deviation) when what the forward returned is (or
    begins with) the reference's output; None otherwise: the one numeric evidence."""
    for index, out in ([(None, got)] + ([(0, got[0])] if isinstance(got, tuple) and got
                                        else [])):
        # an array, or a loss's one number (a NumPy or a Python float)
        if isinstance(out, (np.ndarray, np.floating, float)):
            dev = deviation(out, want)
            if dev <= FORWARD_RTOL:
                return index, dev
    return None


def _size_expr(size: int, probe: Probe, layouts: dict) -> str:
    """The protocol expression of a constructor size: the first argument (parameters before x,
    in the layer's own layout) with an axis of that size."""
    for name, value in probe.scalars.items():  # a keyword of the protocol's (n_heads)
        if value == size:
            return name
    for name in (*probe.params, "x"):
        shape = layouts.get(name)
        if shape is None:
            continue
        for axis in range(len(shape)):
            if shape[axis] == size:
                return f"{name}.shape[{axis if name != 'x' else axis - len(shape)}]"
    return repr(size)


def _try(subject, probe: Probe) -> tuple[Mapping_ | None, list[str]]:
    """The mapping of ``subject`` to the probe's op (its standard form, else a variant)."""
    m, missing = _try_form(subject, probe)
    if m is None and not probe.params and not probe.ints and probe.lift:
        # an elementwise or last-axis op written for attention scores alone ([B, A, T, T]): the
        # probe one rank up (the ranks it runs on are then declared by _ranks)
        lifted = _lifted(probe)
        m, missing = _try_form(subject, lifted)
        probe = lifted if m is not None else probe
    variant = VARIANT_PROBES.get(probe.op)
    if m is None and variant is not None:
        m, missing = _try_form(subject, variant)
        if m is not None:
            m.declares = variant.declares
            m.evidence.append(f"the declared form {variant.declares} (the standard one does "
                              "not match)")
    if m is not None and probe.op == "gelu":
        _gelu_form(m, subject, probe)
    if m is not None and probe.op in NORM_EPS and "eps" not in (*m.ctor.values(), *m.inputs):
        _declare_eps(subject, m, variant if m.declares else probe)
    if m is not None and probe.op in LOSS_OPS:  # ignore_index, reduction (losses.py)
        declare_forms(subject, m, probe)
    if m is not None and probe.op in POSITION_OPS:  # a table's gradient, the encoding function
        return settle(subject, m, probe, missing)
    return m, missing


# told apart from the candidates of FIXED_EPS (probes.py) on rows of variance ~1e-4, where eps
# changes the output by eps / (2 var): 5e-9 for 1e-12 against 0, and one candidate from the
# next by more; FIXED_EPS_RTOL lies below all of those and far above float64's rounding of a
# LayerNorm (~1e-15)
FIXED_EPS_RTOL = 1e-9


def _declare_eps(subject, m: Mapping_, probe: Probe) -> None:
    """A norm without an eps argument: the one eps of FIXED_EPS its output on rows of small
    variance equals, declared and fixed; else (0, none or several) eps=False."""
    vals = _probe_values(probe)
    x = 1e-2 * vals["x"]  # rows of variance (mean square) ~1e-4
    op = probe.op
    try:
        out = rerun(subject, m, probe, vals, x)
    except Exception:  # noqa: BLE001 -- ran on the probe: a failure here is not a form
        out = None
    hits = []
    for eps in FIXED_EPS if out is not None else ():
        want = _reference_forward(op, {**vals, "x": x}, eps=eps)
        if out.shape == want.shape and \
                np.max(np.abs(out - want)) <= FIXED_EPS_RTOL * np.max(np.abs(want)):
            hits.append(eps)
    kind = "class" if m.cls else "function"
    if len(hits) == 1 and hits[0] > 0:
        # declared, the suite calls it at that eps alone; fixed, the adapter takes that call
        m.declares = {op: {**m.declares.get(op, {}), "eps": hits[0]}}
        m.fixed = {**m.fixed, "eps": hits[0]}
        m.evidence.append(f"no eps argument: its output on rows of variance ~1e-4 equals the "
                          f"reference's at eps={hits[0]:g} (to {FIXED_EPS_RTOL:g}) and at no "
                          f"other of {', '.join(f'{e:g}' for e in FIXED_EPS)}: declared "
                          f"eps={hits[0]:g}, fixed in the code (fixed={{'eps': {hits[0]!r}}})")
        return
    m.declares = {op: {**m.declares.get(op, {}), "eps": False}}
    found = ("it equals the reference's at eps=0" if hits == [0.0] else
             f"its output on rows of variance ~1e-4 matches "
             f"{'none' if not hits else 'several'} of eps {', '.join(f'{e:g}' for e in FIXED_EPS)}")
    m.evidence.append(f"no eps argument ({found}): declared eps=False (the suite passes eps=0; a "
                      f"{kind} with another eps fixed inside is then red on near-constant rows: "
                      "review)")


def _gelu_form(m: Mapping_, subject, probe: Probe) -> None:
    """Which GELU the subject computes: the erf form (the protocol's default) or the tanh
    approximation (they differ by ~3e-4), by the forward output alone."""
    import minibert_reference

    x = _probe_values(probe)["x"]
    try:
        got = rerun(subject, m, probe, {"x": x})
    except Exception:  # noqa: BLE001 -- already matched once; nothing to decide
        return
    dev = {form: float(np.max(np.abs(got - minibert_reference.gelu_forward(x, form)[0])))
           for form in ("none", "tanh")}
    if dev["tanh"] < dev["none"] / 100:
        m.fixed = {"approximate": "tanh"}
        m.evidence.append(f"the tanh approximation: {dev['tanh']:.1e} from the reference's tanh "
                          f"GELU, {dev['none']:.1e} from the erf one (fixed approximate=tanh)")


def _forward_hits(subject, probe: Probe) -> list:
    """[(trial, output index, deviation, returned, object)] of the trials that match."""
    vals = _probe_values(probe)
    wants: dict = {}  # the reference's output without the optional parameters left unplaced
    found = []
    for trial in subject.trials(probe):
        absent = tuple(b for b in probe.optional if b not in trial.placed)
        if absent not in wants:
            wants[absent] = _reference_forward(probe.op, {k: v for k, v in vals.items()
                                                          if k not in absent})
        want = wants[absent]
        try:
            returned, obj = subject.run(trial, probe, vals, vals["x"])
        except Exception as e:  # noqa: BLE001 -- a candidate that does not run is not the mapping
            subject.raised = one_line(e)
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
    # sizes from the protocol's arguments; the protocol's eps and parameters to the constructor's
    ctor = {k: "eps" if k in EPS_NAMES else k if k in probe.params else
            "x.dtype" if k == "dtype" else
            _size_expr(v, probe, layouts) for k, v in trial.fixed.items()} if is_class else {}
    m = Mapping_(probe.op, subject.cls if is_class else None, ctor, dict(trial.placed),
                 forward=subject.forward, transposed=trial.transposed, output=index,
                 trial=trial)
    if not is_class:
        m.backward, m.inputs = subject.backward, subject.inputs(trial)
    else:
        m.inputs = _class_inputs(subject, probe)
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
    absent = [b for b in probe.optional if b not in trial.placed]
    if absent:
        m.evidence.append(f"no bias found: calls with {' / '.join(absent)} are not applicable")
    missing = _backward(subject, m, probe, vals, trial, returned, obj)
    _ranks(subject, m, probe, vals)
    return m, missing


def _lifted(probe: Probe) -> Probe:
    """``probe`` with one more leading axis on x and its extra inputs."""
    from dataclasses import replace

    return replace(probe, shapes={k: (4, *s) if k in ("x", *probe.extra) else s
                                  for k, s in probe.shapes.items()})


def _class_inputs(subject: ClassLayer, probe: Probe) -> tuple:
    """What a class's forward takes, in its order: the input, the probe's extra inputs, then
    each further argument named as one of the protocol's (``mask``, ``ignore_index``,
    ``reduction``), up to the first that is not; () where that is the input alone."""
    from minibert_spec.suite.adapters import protocol_signature

    protocol = protocol_signature(probe.op, "forward").parameters
    params = list(inspect.signature(getattr(subject.cls, subject.forward)).parameters)[1:]
    inputs = ["x", *probe.extra][:len(params)]
    for name in params[len(inputs):]:
        if name not in protocol or name in inputs:
            break
        inputs.append(name)
    return tuple(inputs) if len(inputs) > 1 else ()


def _ranks(subject, m: Mapping_, probe: Probe, vals: dict) -> None:
    """Where the forward and backward run on some input ranks (1 .. the probe's) only,
    ``CAPABILITIES["ranks"]`` declares those (the suite then reshapes); only for the ops it
    can reshape (RANK_ADAPTABLE)."""
    from minibert_spec.protocol.capabilities import RANK_ADAPTABLE

    if probe.op not in RANK_ADAPTABLE:
        return
    ok = []
    for rank in range(1, vals["x"].ndim + 1):
        x = vals["x"][(0,) * (vals["x"].ndim - rank)]
        try:
            returned, obj = subject.run(m.trial, probe, vals, x)
            out = returned[m.output] if m.output is not None else returned
            roles = m.again or (("dout",) if m.upstream else ())
            subject.backward_call(obj)(*_again_values(
                roles, m.trial, vals, x, np.ones_like(out), returned, m.output))
            ok.append(rank)
        except Exception:  # noqa: BLE001 -- this rank does not run
            continue
    if ok and len(ok) < vals["x"].ndim:
        m.ranks = tuple(ok)
        m.evidence.append(f"forward and backward run on inputs of rank {ok} only: "
                          f"CAPABILITIES ranks {m.op}: {tuple(ok)}")


def infer(module) -> tuple[list[Mapping_], list[str]]:
    """(the mappings found, what could not be mapped) for the module's subjects."""
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
            if m is not None and m.unusable:  # the forward is the op's; its backward is not
                missing += miss  # usable as called: the reason, and no row
                used.add(subject)
            elif m is not None:
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
    unmapped = [s for s in subjects[:len(classes)] if s not in used and s.forward]
    blocks, why_block, miss_block = infer_blocks([s.cls for s in unmapped])  # blocks.py
    missing += miss_block + [why_block.get(s.cls) or _unmapped_class(s) for s in unmapped
                             if s.cls not in {b.cls for b in blocks}]
    # a block written as functions (fnblocks.py), where no class is the block row
    fn_blocks, why_fn, tried = ([], [], set()) if blocks else infer_function_blocks(
        mod, [f for s in pairs if s not in used for f in (s.fn, s.bfn)])
    missing += why_fn + [f"functions {s.label}, {s.bfn.__name__}: match no op this can infer"
                         + _raised(s) for s in pairs if s not in used and s.label not in tried]
    rows, why = infer_optimizers(classes)  # the adam row: optimizer classes (optim.py)
    more, why_more = infer_training(mod)  # the schedule and clip rows (training.py)
    lm, why_lm = infer_decoder(mod)  # the decoder row: a whole decoder-only LM (decoder*.py)
    return (mappings + blocks + fn_blocks + rows + more + lm,
            missing + why + why_more + why_lm)


def _unmapped_class(subject: ClassLayer) -> str:
    """Why a class with a forward was not mapped: an op's forward without a backward method
    (its backward written elsewhere) is named as such; otherwise it matches no probe."""
    if subject.backward is None:
        ops = [op for op, probe in PROBES.items() if _forward_hits(subject, probe)]
        if ops:
            return (f"class {subject.label}: its forward gives the reference's "
                    f"{' / '.join(ops)} output, but it has no backward method "
                    f"({', '.join(BACKWARDS)}): write the backward's call by hand")
    return f"class {subject.label}: matches no op this can infer ({', '.join(PROBES)})" + \
        _raised(subject)


def _raised(subject) -> str:
    # ``unmapped``: why a forward that matched was still not mapped (positions.settle)
    return (f" (its forward raised {subject.raised})" if subject.raised else "") + \
        getattr(subject, "unmapped", "")
