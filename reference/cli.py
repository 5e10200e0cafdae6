"""``minibert`` command line.  Subcommands import what they need lazily, so ``minibert --help``
stays fast and the NumPy-only core never imports the tooling."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from reference import commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minibert", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    # Each module of reference/commands/ defines register(subparsers) for one subcommand.
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        importlib.import_module(f"reference.commands.{info.name}").register(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
