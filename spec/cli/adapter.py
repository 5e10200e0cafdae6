"""``minibert adapter new MODULE``: a skeleton adapter for an implementation, generated from the
op table (every protocol name with its signature and its contract in one line; every capability,
convention, guard and variant option with what it accepts, from the protocol's tables), so that
an adapter starts from the table.  Every row is commented out: the file imports as it is and
provides nothing until a row is filled in (``minibert check`` then says so: exit 2, never a
pass)."""

from __future__ import annotations

import importlib
import inspect
import re
import sys


def register(sub) -> None:
    g = sub.add_parser("adapter", help="write the skeleton of an adapter (every protocol name "
                                       "and capability, one line of help each)")
    actions = g.add_subparsers(dest="action", required=True)
    new = actions.add_parser("new", help="print a skeleton adapter for MODULE")
    new.add_argument("module", help="the import name of your implementation (e.g. mybert)")
    new.add_argument("-o", "--output", help="write it to this file (refused if it exists) "
                                            "instead of printing it")
    new.set_defaults(func=run)
    inf = actions.add_parser("infer", help="propose an adapter for MODULE's classes and "
                                           "forward/backward function pairs, chosen by their "
                                           "forward outputs and shapes only")
    inf.add_argument("module", help="the import name of your implementation (e.g. mybert)")
    inf.add_argument("-o", "--output", help="write it to this file (refused if it exists) "
                                            "instead of printing it")
    inf.set_defaults(func=run_infer)


def _signature(row, name: str) -> str:
    try:
        fn = getattr(importlib.import_module(f"minibert_reference.{row.module}"), name)
        sig = inspect.signature(fn)
        sig = sig.replace(parameters=[p.replace(annotation=p.empty)
                                      for p in sig.parameters.values()],
                          return_annotation=sig.empty)
        text = re.sub(r"<class 'numpy\.(\w+)'>", r"np.\1", str(sig))
        return re.sub(r"<function (\w+) at 0x[0-9a-f]+>", r"\1", text)  # no_decay's rule
    except (ImportError, AttributeError, TypeError, ValueError):
        return "(...)"


def capabilities_lines() -> list[str]:
    """The CAPABILITIES block of the skeleton, commented out: every key at its default with
    what it accepts, every convention, every guard with its range, every op's options with
    each value's meaning -- all generated from the protocol's tables and the text its
    refusals use (minibert_spec.protocol.capabilities.accepted), never restated here."""
    from minibert_spec.protocol import CONVENTIONS, DEFAULT_CAPABILITIES
    from minibert_spec.protocol.capabilities import VARIANTS, accepted
    from minibert_spec.protocol.guards import GUARDS

    out = ["CAPABILITIES = {"]
    for key, default in DEFAULT_CAPABILITIES.items():
        out.append(f"    # {key!r}: {default!r},  # {accepted(key)}")
        if key == "conventions":
            out += [f"    #     {c!r}" for c in sorted(CONVENTIONS)]
        if key == "guards":
            out += [f"    #     {k!r}: {accepted('guards', k)}: {v}" for k, v in GUARDS.items()]
    for op, options in VARIANTS.items():
        out.append(f"    # {op!r}: {{  # {accepted(op)}; the first value is the standard form")
        for name, option in options.items():
            how = (f" (selected by {option.argument}=: every value your {option.argument}= "
                   "takes, or the one form of code without it)" if option.argument else "")
            out.append(f"    #     {name!r}: {option.default!r},  # {accepted(op, name)}{how}")
            out += [f"    #         {v!r}: {option.meaning[v]}" for v in option.values]
            if option.number is not None:
                out.append(f"    #         1e-06: {option.means(1e-06)}")
        out.append("    # },")
    return out + ["}"]


def skeleton(module: str) -> str:
    """The adapter skeleton for ``module`` as Python source."""
    from minibert_spec.protocol import OPS

    if not re.fullmatch(r"[A-Za-z_][\w.]*", module):
        raise ValueError(f"module: expected an import name like mybert or pkg.model, got "
                         f"{module!r}")
    alias = module.rsplit(".", 1)[-1]
    out = [f'"""Adapter: {module} under the minibert protocol (from `minibert adapter new '
           f'{module}`).',
           "",
           "Uncomment and fill in the rows your code has; delete the others (a missing name is",
           "reported n/a, never passed).  Check it with: minibert check <this module>",
           '"""', "", (f"import {module}" if alias == module else f"import {module} as {alias}")
           + "  # noqa: F401 -- your implementation",
           "from minibert_spec.suite.adapters import layer, optimizer  # noqa: F401 -- classes",
           "", "# What you do not support or do differently (absent keys claim everything;",
           "# anything else is refused before a check runs, naming what it accepts):"]
    out += capabilities_lines() + [""]
    for row in OPS.values():
        returns = row.returns()
        out.append(f"# --- {row.name}: {row.doc}" + (f"; backward returns {returns}"
                                                      if returns else ""))
        for name in row.names:
            sig = _signature(row, name)
            out.append(f"# def {name}{sig}:")
            out.append("#     ...")
        if row.pair is not None:
            fwd, bwd = row.pair
            out.append(f"# or a class layer: {fwd}, {bwd} = layer({row.name!r}, "
                       f"{alias}.SomeLayer, grads={{...}})")
        if row.name == "adam":
            out.append(f"# or an optimizer class: adam_init, adam_step = optimizer("
                       f"{alias}.Adam, hyper={{'lr': 'lr', ...}}, m='m', v='v')")
        out.append("")
    return "\n".join(out)


def run(args) -> int:
    return _write(skeleton(args.module), args.output)


def run_infer(args) -> int:
    from minibert_spec.suite.infer import infer_source

    return _write(infer_source(args.module), args.output,
                  "review each decision, then minibert check it")


def _write(text: str, output: str | None,
           then: str = "fill in the rows your code has, then minibert check it") -> int:
    import os

    if output is None:
        sys.stdout.write(text)
        return 0
    if os.path.exists(output):
        raise ValueError(f"--output: {output} exists; not overwritten")
    with open(output, "x", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {output}: {then}")
    return 0
