"""``minibert regenerate``: everything the project generates from its definitions, in one
command, after adding or changing an op: the protocol table of ``PROTOCOL_DOC`` (from the op table,
``python -m minibert_spec.protocol --markdown``; tests/suite/test_protocol_doc.py fails while it is
stale), the numeric functions of the SymPy derivations as Python source
(spec/equations/_generated, minibert_spec.equations._codegen: minutes; a check then builds
nothing; tests/equations/test_generated_maps.py fails while they are stale) and
the mutation matrix's stale rows (``minibert mutate --matrix``: only the rows whose mutant,
tagged tests or test files changed rerun; the audit reads the matrix).  Needs the checkout."""

from __future__ import annotations

import re
import sys

# the file that holds the generated protocol table (the README links to it)
PROTOCOL_DOC = "docs/check-your-implementation.md"
TABLE = re.compile(r"(<!-- protocol-table:[^\n]*-->\n)(.*?)(\n<!-- /protocol-table -->)", re.S)


def register(sub) -> None:
    g = sub.add_parser("regenerate", help="regenerate the protocol table (docs/) and the stale "
                                          "rows of the mutation matrix (after adding an op)")
    g.add_argument("--no-matrix", action="store_true",
                   help="not the matrix's stale rows (they take minutes)")
    g.add_argument("--no-maps", action="store_true",
                   help="not the SymPy maps' generated source (spec/equations/_generated: "
                        "minutes)")
    g.add_argument("--jobs", "-j", type=int, default=2,
                   help="mutants run in parallel (default: 2)")
    g.set_defaults(func=run)


def readme_table(text: str) -> str:
    """``text`` (``PROTOCOL_DOC``) with its protocol table regenerated from the op table."""
    from minibert_spec.protocol import protocol_markdown

    if not TABLE.search(text):
        raise ValueError(f"{PROTOCOL_DOC}: no <!-- protocol-table: ... --> block to regenerate")
    return TABLE.sub(lambda m: m.group(1) + protocol_markdown() + m.group(3), text, count=1)


def run(args) -> int:
    import argparse

    from minibert_reference.train.fileio import atomic_write
    from minibert_spec.paths import need_checkout

    try:
        home = need_checkout("minibert regenerate")
        readme = home / PROTOCOL_DOC
        text = readme.read_text(encoding="utf-8")
        new = readme_table(text)
    except (OSError, ValueError) as e:
        print(f"minibert regenerate: {e}", file=sys.stderr)
        return 2
    if new != text:
        atomic_write(readme, new)
    print(f"{PROTOCOL_DOC}: protocol table {'rewritten' if new != text else 'already current'}")
    if not args.no_maps:
        from minibert_spec.equations import _codegen

        changed = _codegen.write(_codegen.generate())
        print(f"spec/equations/_generated: {len(changed)} file(s) rewritten"
              + (f" ({', '.join(changed)})" if changed else " (already current)"))
    if args.no_matrix:
        return 0
    from rich.console import Console

    from minibert_spec.mutation import matrix_command

    stale = argparse.Namespace(mutants=[], jobs=args.jobs, profile="ci", timeout=600.0,
                               no_baseline=False, rerun=False, output=None,
                               tests=["tests/suite/test_conformance.py", "tests"])
    return matrix_command(stale, Console(width=None if sys.stdout.isatty() else 160))
