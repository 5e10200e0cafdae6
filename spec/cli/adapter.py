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

# adapter infer: seconds for the import and the inference together (~2 s on the examples)
INFER_TIMEOUT = 60.0
# what the module printed is shown up to this many characters (its end: where it stopped)
SHOWN_OUTPUT = 20_000


def register(sub) -> None:
    g = sub.add_parser("adapter", help="write the skeleton of an adapter (every protocol name "
                                       "and capability, one line of help each)")
    actions = g.add_subparsers(dest="action", required=True)
    for name, func, said in (
            ("new", run, "print a skeleton adapter for MODULE"),
            ("infer", run_infer, "propose an adapter for MODULE's classes and forward/backward "
                                 "function pairs, chosen by their forward outputs and shapes "
                                 "only")):
        a = actions.add_parser(name, help=said)
        a.add_argument("module", help="the import name of your implementation (e.g. mybert)")
        a.add_argument("-o", "--output", help="write it to this file (refused if it exists) "
                                              "instead of printing it")
        a.set_defaults(func=func)
    actions.choices["infer"].add_argument(
        "--timeout", type=float, default=INFER_TIMEOUT,
        help="seconds for importing MODULE and running its classes and functions, in a child "
             f"process (default {INFER_TIMEOUT:g})")


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
        return "(*args, **kwargs)"  # no reference function to read: valid Python still


def _default_imports() -> list[str]:
    """The imports the signatures' function defaults need once a row is uncommented
    (adam_step's ``no_decay=default_no_decay``), from the reference module that defines each."""
    from minibert_spec.protocol import OPS

    out = {}
    for row in OPS.values():
        for name in row.names:
            try:
                fn = getattr(importlib.import_module(f"minibert_reference.{row.module}"), name)
                params = inspect.signature(fn).parameters.values()
            except (ImportError, AttributeError, TypeError, ValueError):
                continue
            for p in params:
                if inspect.isfunction(p.default):
                    out[f"from {p.default.__module__} import {p.default.__name__}  # noqa: "
                        f"F401 -- {name}(..., {p.name}=)"] = None
    return list(out)


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
            standard = option.standard or option.default  # what declaring nothing means
            out.append(f"    #     {name!r}: {standard!r},  # {accepted(op, name)}{how}")
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
           '"""', "", "import numpy as np  # noqa: F401 -- the dtypes of the signatures below",
           "", (f"import {module}" if alias == module else f"import {module} as {alias}")
           + "  # noqa: F401 -- your implementation",
           "from minibert_spec.suite.adapters import layer, optimizer  # noqa: F401 -- classes",
           *_default_imports(),
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
    import os

    from minibert_spec.suite.plan import import_root

    text = skeleton(args.module)
    cwd = os.getcwd()  # searched as minibert check searches it; the module is not run
    if import_root(args.module, cwd) is None:
        print(f"minibert adapter: note: module {args.module!r} is not found from {cwd} (the "
              "current directory and sys.path): the skeleton imports it", file=sys.stderr)
    return _write(text, args.output)


def run_infer(args) -> int:
    """The adapter inferred in a child process, as ``minibert check`` runs an implementation:
    only the adapter goes to stdout (or ``-o``); what the module printed goes to stderr; a
    module that hangs, exits, crashes or raises is one line, exit 2."""
    import os

    from minibert_spec.suite.infer import infer_isolated
    from minibert_spec.suite.plan import import_root

    if args.timeout is not None and not args.timeout > 0:
        raise ValueError(f"--timeout: expected a positive number of seconds, got {args.timeout}")
    if args.output and os.path.exists(args.output):  # refused before the module runs
        raise ValueError(f"--output: {args.output} exists; not overwritten")
    cwd = os.getcwd()
    paths = [p for p in dict.fromkeys([cwd, import_root(args.module, cwd)]) if p]
    got = infer_isolated(args.module, args.timeout, paths=paths)
    if got.output:
        shown = got.output[-SHOWN_OUTPUT:]
        print(f"minibert adapter infer: what {args.module} printed"
              + (f" (its last {SHOWN_OUTPUT} characters)" if shown != got.output else "")
              + ":", file=sys.stderr)
        print(shown.rstrip("\n"), file=sys.stderr)
    if got.reason is not None:
        raise ValueError(got.reason)
    if not got.mapped:  # an adapter of nothing is no adapter: a red, with the first reason
        said = [m for m in got.missing if not m.endswith("gives the reference's output")]
        raise ValueError(f"{args.module}: nothing could be mapped to an op; "
                         f"{(said or list(got.missing) or ['nothing found'])[0]}")
    for line in got.missing:  # the module's own code raised while it was probed: said here too
        if " raised " in line:
            print(f"minibert adapter infer: note: {line}", file=sys.stderr)
    # the adapter was imported and its rows run by the quick tier before this says done
    red = [(op, why) for op, why in got.checked if why != "ok"]
    print(f"minibert adapter infer: checked: the adapter imports; its {len(got.checked)} row(s) "
          f"under minibert check --quick (no oracle): {len(got.checked) - len(red)} green"
          + (f", {len(red)} not: review each (a bug of your code, or a decision above)"
             if red else ""), file=sys.stderr)
    for op, why in red:
        print(f"minibert adapter infer:   {op}: {why}", file=sys.stderr)
    return _write(got.source, args.output, "review each decision, then minibert check it")


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
