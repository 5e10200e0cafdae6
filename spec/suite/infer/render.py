"""The adapter's source written from what :func:`~minibert_spec.suite.infer.match.infer`
found: one comment per decision with its evidence, one ``layer()`` call per op (the package's
docstring, :mod:`minibert_spec.suite.infer`, says how each is decided)."""

from __future__ import annotations

import inspect
import re

from minibert_spec.suite.infer.blocks import BlockMapping, block_call, conventions, layer_text
from minibert_spec.suite.infer.decoder import DecoderMapping
from minibert_spec.suite.infer.fnblocks import FnBlockMapping, fn_block_call
from minibert_spec.suite.infer.match import infer
from minibert_spec.suite.infer.optim import OptimMapping, adapter_imports, optimizer_call
from minibert_spec.suite.infer.positions import encoding_source
from minibert_spec.suite.infer.probes import Mapping_
from minibert_spec.suite.infer.subjects import _fixed_role
from minibert_spec.suite.infer.training import TrainingMapping, training_code


def _protocol(m: Mapping_, name):
    """A name of the probe's in the protocol's: its input ``x`` is the op's first argument
    (``ids`` of an embedding, ``logits`` of a loss)."""
    from minibert_spec.protocol.table import OPS

    return OPS[m.op].args[0] if name == "x" else name


def _function_call(m: Mapping_, alias: str) -> list[str]:
    """``None, forward=..., backward=..., inputs=...`` of a function pair: the protocol's
    arguments passed in the function's own order (by keyword where it skips one)."""
    fwd = f"{alias}.{m.forward.__name__}"
    keyword_only = [p.name for p in inspect.signature(m.forward).parameters.values()
                    if p.kind is p.KEYWORD_ONLY]
    back = {**m.params, **{_fixed_role(a): a for a in m.trial.fixed}}
    # an argument in between left at its default, or one taken by keyword only: call by keyword
    if None in m.inputs or any(back.get(n) in keyword_only for n in m.inputs):
        given = [_protocol(m, n) for n in m.inputs if n is not None]
        fwd = f"lambda {', '.join(given)}: {fwd}({given[0]}, " + \
            ", ".join(f"{back[n]}={n}" for n in given[1:]) + ")"
    kw = [f"forward={fwd}", f"backward={alias}.{m.backward.__name__}"]
    inputs = tuple(_protocol(m, n) for n in m.inputs if n is not None)
    return kw + ([f"inputs={inputs!r}"] if inputs != (_protocol(m, "x"),) else [])


def _call(m: Mapping_, alias: str) -> str:
    if m.cls is None:
        new, kw = "None", _function_call(m, alias) + ([f"grads={m.grads!r}"] if m.grads else [])
    else:
        ctor = {k: re.sub(r"^x\b", _protocol(m, "x"), v) for k, v in m.ctor.items()}
        args = sorted({re.match(r"\w+", e).group(0) for e in ctor.values()
                       if re.match(r"[A-Za-z_]", e)})
        ctor = ", ".join(f"{k}={v}" for k, v in ctor.items())
        new = f"lambda {', '.join(args)}: {alias}.{m.cls.__name__}({ctor})" if m.ctor else \
            f"{alias}.{m.cls.__name__}"
        kw = [f"params={m.params!r}"] if m.params else []
        kw += [f"grads={m.grads!r}"] if m.grads else []
        if m.forward != "forward":
            kw.append(f"forward={m.forward!r}")
        if m.backward != "backward":
            kw.append(f"backward={m.backward!r}")
        if m.inputs:
            kw.append(f"inputs={tuple(_protocol(m, n) for n in m.inputs)!r}")
    if m.transposed:
        kw.append(f"transposed={m.transposed!r}")
    if m.again:
        kw.append(f"again={tuple(_protocol(m, n) for n in m.again)!r}")
    if not m.upstream:
        kw.append("upstream=False")
    if m.output is not None:
        kw.append(f"output={m.output}")
    if m.fixed:
        kw.append(f"fixed={m.fixed!r}")
    return layer_text(m.op, new, kw + conventions(m))


def infer_source(module: str) -> str:
    """The adapter's source for ``module`` (see the module's docstring)."""
    if not re.fullmatch(r"[A-Za-z_][\w.]*", module):
        raise ValueError(f"module: expected an import name like mybert or pkg.model, got "
                         f"{module!r}")
    return render_source(module, *infer(module))


def capabilities(mappings) -> dict:
    """The adapter's ``CAPABILITIES``: what each row declares, the options two rows declare of
    one op merged (a layernorm row's eps and a block row's ``layernorm.affine``), and the input
    ranks an op runs on where not all (other ranks are reshaped to one of them)."""
    caps: dict = {}
    for m in mappings:
        for op, options in m.declares.items():
            if isinstance(options, dict) and isinstance(caps.get(op), dict):
                caps[op] = {**caps[op], **options}
            else:
                caps[op] = options
        if m.ranks:
            caps.setdefault("ranks", {})[m.op] = m.ranks
    return caps


def render_source(module: str, mappings: list[Mapping_], missing: list[str]) -> str:
    """The adapter's source for what :func:`infer` found in ``module``."""
    alias = "impl"
    # each sinusoidal row's sinusoidal_encoding, written beside it (positions.py)
    encodings = [encoding_source(m, alias) for m in mappings]
    out = [f'"""Adapter: {module} under the minibert protocol (from `minibert adapter infer '
           f'{module}`).', "",
           "Each mapping was chosen by forward outputs and shapes only (never by gradients):",
           "review it, then check it with: minibert check <this module>", '"""', "",
           f"import {module} as {alias}",
           *(["import numpy as np"] if any(encodings) or
             any(getattr(m, "needs_numpy", False) for m in mappings) else []),
           f"from minibert_spec.suite.adapters import "
           f"{adapter_imports([m for m in mappings if not isinstance(m, TrainingMapping)])}"
           + (", decoder" if any(isinstance(m, DecoderMapping) for m in mappings) else ""), ""]
    caps = capabilities(mappings)
    if caps:
        out += ["# what the code declares (its forms, the ranks it runs on)",
                f"CAPABILITIES = {caps!r}", ""]
    for m, encoding in zip(mappings, encodings):
        out += [f"# {e}" for e in m.evidence]
        out += [fn_block_call(m, alias) if isinstance(m, FnBlockMapping) else
                block_call(m, alias) if isinstance(m, BlockMapping) else
                training_code(m, alias) if isinstance(m, TrainingMapping) else
                optimizer_call(m, alias) if isinstance(m, OptimMapping) else _call(m, alias), ""]
        out += encoding
    out.append("# not mapped (write these by hand, or leave them n/a):")
    out += [f"#   {s}" for s in missing] or ["#   nothing"]
    return "\n".join(out) + "\n"
