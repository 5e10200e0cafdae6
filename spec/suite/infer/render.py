"""The adapter's source written from what :func:`~minibert_spec.suite.infer.match.infer`
found: one comment per decision with its evidence, one ``layer()`` call per op (the package's
docstring, :mod:`minibert_spec.suite.infer`, says how each is decided)."""

from __future__ import annotations

import inspect
import re

from minibert_spec.suite.infer.blocks import BlockMapping
from minibert_spec.suite.infer.decoder import DecoderMapping
from minibert_spec.suite.infer.fnblocks import FnBlockMapping
from minibert_spec.suite.infer.match import infer
from minibert_spec.suite.infer.optim import OptimMapping, adapter_imports, optimizer_call
from minibert_spec.suite.infer.positions import encoding_source
from minibert_spec.suite.infer.probes import Mapping_
from minibert_spec.suite.infer.subjects import _fixed_role, import_name
from minibert_spec.suite.infer.training import TrainingMapping, training_code


def _protocol(m: Mapping_, name):
    """A probe's name as the protocol's (``x`` is the op's first argument)."""
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


def _op_row(m: Mapping_, alias: str) -> tuple[str, list[str]]:
    """(``layer()``'s constructor, its own keywords) of an op's row."""
    if m.cls is None:
        return "None", _function_call(m, alias) + ([f"grads={m.grads!r}"] if m.grads else [])
    ctor = {k: re.sub(r"^x\b", _protocol(m, "x"), v) for k, v in m.ctor.items()}
    args = sorted({re.match(r"\w+", e).group(0) for e in ctor.values()
                   if re.match(r"[A-Za-z_]", e)})
    ctor = ", ".join(f"{k}={v}" for k, v in ctor.items())
    new = f"lambda {', '.join(args)}: {alias}.{m.cls.__name__}({ctor})" if m.ctor else \
        f"{alias}.{m.cls.__name__}"
    return new, _given((m.params, f"params={m.params!r}"), (m.grads, f"grads={m.grads!r}"),
                       (m.forward != "forward", f"forward={m.forward!r}"),
                       (m.backward != "backward", f"backward={m.backward!r}"),
                       (m.inputs, f"inputs={tuple(_protocol(m, n) for n in m.inputs)!r}"))


def _block_row(m: BlockMapping, alias: str) -> tuple[str, list[str]]:
    """(``layer()``'s constructor, its own keywords) of a block class's row."""
    ctor = ", ".join(f"{k}={v}" for k, v in m.ctor.items())
    return (f"{m.new_source}{alias}.{m.cls.__name__}({ctor})",
            [f"params={m.params!r}", f"grads={m.grads!r}"])


def _fn_block_row(m: FnBlockMapping, alias: str) -> tuple[str, list[str]]:
    """(``layer()``'s constructor, its own keywords) of a block's function pair."""
    where = f"{alias}.{m.owner}." if m.owner else f"{alias}."
    kw = "".join(f", {m.call[k]}={k}" for k in m.inputs[2:])
    return "None", [f"forward=lambda {', '.join(m.inputs)}: {where}{m.fwd_name}(x, p{kw})",
                    f"backward={where}{m.bwd_name}", f"inputs={m.inputs!r}"]


def _given(*keywords) -> list[str]:
    """The texts of the (condition, text) pairs whose condition holds."""
    return [text for condition, text in keywords if condition]


def _layer_call(m, new: str, own: list[str]) -> str:
    """The adapter's ``<op>_forward, <op>_backward = layer(<op>, new, ...)``: the row's ``own``
    keywords, then those every row may take, after a mask converter's def where it has one."""
    again, mask = tuple(_protocol(m, n) for n in m.again), getattr(m, "mask_name", "")
    kw = own + _given((m.transposed, f"transposed={m.transposed!r}"), (again, f"again={again!r}"),
                      (not m.upstream, "upstream=False"),
                      (m.output is not None, f"output={m.output}"),
                      (m.fixed, f"fixed={m.fixed!r}"), (mask, f"mask={mask}"),
                      (m.accumulate, "accumulate=True"), (m.single_use, "single_use=True"))
    call = (f"layer(\n    {m.op!r}, {new},\n    " + ",\n    ".join(kw) + ")" if kw else
            f"layer({m.op!r}, {new})")
    head = getattr(m, "mask_source", "")
    return (f"{head}\n\n" if head else "") + f"{m.op}_forward, {m.op}_backward = {call}"


def infer_source(module: str) -> str:
    """The adapter's source for ``module`` (see the module's docstring)."""
    import_name(module)
    return render_source(module, *infer(module))


def capabilities(mappings) -> dict:
    """The adapter's ``CAPABILITIES``: what each row declares (two rows' options of one op
    merged), and the input ranks an op runs on where not all."""
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
        row = _fn_block_row if isinstance(m, FnBlockMapping) else \
            _block_row if isinstance(m, BlockMapping) else _op_row
        out += [training_code(m, alias) if isinstance(m, TrainingMapping) else
                optimizer_call(m, alias) if isinstance(m, OptimMapping) else
                _layer_call(m, *row(m, alias)), ""]
        out += encoding
    out.append("# not mapped (write these by hand, or leave them n/a):")
    out += [f"#   {s}" for s in missing] or ["#   nothing"]
    return "\n".join(out) + "\n"
