"""``minibert`` command line.

One module per subcommand in this package, each with ``register(subparsers)``; subcommands
import what they need lazily, so ``minibert --help`` stays fast.  The CLI lives in ``spec``
because it drives the checks: ``spec`` imports ``reference``, never the reverse.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minibert", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}").register(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
