"""``minibert`` command line.

One module per subcommand in this package, each with ``register(subparsers)``; subcommands
import what they need lazily, so ``minibert --help`` stays fast.  The CLI lives in ``minibert_spec``
because it drives the checks: ``minibert_spec`` imports ``minibert_reference``, never the reverse.

A user's mistake (a missing file, a bad flag value, a corrupt checkpoint) is one line on
stderr saying what is wrong and what to do, exit status 2; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys


def command_modules(argv=None) -> list[str]:
    """The subcommand modules to register for ``argv``: the one it names (``minibert check
    ...`` imports check's module alone: a third of a second of every command's start went to
    importing the others, bench's among them), else every one (``minibert --help``, a typo:
    argparse then lists them all; ``argv`` None: a parser for any command line)."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
    first = next((a for a in argv or () if not a.startswith("-")), None)
    wanted = (first or "").replace("-", "_")  # fill-mask: spec/cli/fill_mask.py
    return [wanted] if wanted in names else names


def build_parser(argv=None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minibert", description=__doc__.split("\n\n")[0])
    parser.add_argument("--debug", action="store_true",
                        help="show Python tracebacks instead of one-line errors")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in command_modules(argv):
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def error_line(exc: BaseException) -> str:
    """What the user reads instead of a traceback: the message, the kind of error only where
    the message alone would be cryptic (a bare OSError or a bug)."""
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, ValueError):
        return msg
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        return f"{exc.strerror or msg}{where}"
    return f"internal error {type(exc).__name__}: {msg} (please report it with --debug output)"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    try:
        # every command under the thread and memory policy (minibert_reference.train.threads): one
        # worker per core, single-threaded BLAS, freed memory kept; train and bench set their own
        from minibert_reference.train.threads import choose, keep_freed_memory, use_threads

        keep_freed_memory()
        with use_threads(choose("auto")):
            return args.func(args)
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("minibert: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 -- every failure becomes one line unless --debug
        if args.debug:
            raise
        print(f"minibert {args.command}: error: {error_line(exc)} (--debug shows the traceback)",
              file=sys.stderr)
        return 2
