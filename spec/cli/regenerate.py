"""``minibert regenerate``: everything the project generates from its definitions, in one
command, after adding or changing an op: the protocol table of ``PROTOCOL_DOC`` (from the op table,
``python -m minibert_spec.protocol --markdown``; tests/suite/test_protocol_doc.py fails while it is
stale), the layer tables of ``ARCHITECTURE_DOC`` (from the import-linter contracts of
pyproject.toml, the one place the layers are written; tests/test_architecture.py fails while they
are stale), the numeric functions of the SymPy derivations as Python source
(spec/equations/_generated, minibert_spec.equations._codegen: minutes; a check then builds
nothing; tests/equations/test_generated_maps.py fails while they are stale), the index the
SymPy <-> code checks are listed from without importing SymPy (``_generated/_checks.py``,
seconds, even with ``--no-maps``) and
the mutation matrix's stale rows (``minibert mutate --matrix``: only the rows whose mutant,
tagged tests or test files changed rerun; the audit reads the matrix).  Needs the checkout."""

from __future__ import annotations

import re
import sys

# the file that holds the generated protocol table (the README links to it)
PROTOCOL_DOC = "docs/check-your-implementation.md"
TABLE = re.compile(r"(<!-- protocol-table:[^\n]*-->\n)(.*?)(\n<!-- /protocol-table -->)", re.S)
# the file that draws the layers, and its generated block
ARCHITECTURE_DOC = "docs/architecture.md"
LAYERS = re.compile(r"(<!-- layers:[^\n]*-->\n)(.*?)(\n<!-- /layers -->)", re.S)


def register(sub) -> None:
    g = sub.add_parser("regenerate", help="regenerate the protocol table and the layer tables "
                                          "(docs/) and the stale rows of the mutation matrix "
                                          "(after adding an op)")
    g.add_argument("--no-matrix", action="store_true",
                   help="not the matrix's stale rows (they take minutes)")
    g.add_argument("--no-maps", action="store_true",
                   help="not the SymPy maps' generated source (spec/equations/_generated: "
                        "minutes; the checks' index there is still rewritten, seconds)")
    g.add_argument("--jobs", "-j", type=int, default=2,
                   help="mutants run in parallel (default: 2)")
    g.set_defaults(func=run)


def _regenerated(text: str, block: re.Pattern, doc: str, body) -> str:
    """``text`` (the file ``doc``) with the body of its generated ``block`` (an opening comment,
    the body, a closing comment) replaced by ``body()``."""
    if not block.search(text):
        marker = block.pattern.split(":", 1)[0].removeprefix("(<!-- ")
        raise ValueError(f"{doc}: no <!-- {marker}: ... --> block to regenerate")
    return block.sub(lambda m: m.group(1) + body() + m.group(3), text, count=1)


def _layer_comments(block: str) -> list[tuple[str, str]]:
    """``(layer, its comment)`` in the order of the ``layers = [...]`` array of one contract's
    TOML text: the ``#`` lines above an entry (and one after it on its line) are its comment."""
    body = re.search(r"^layers = \[\n(.*?)^\]", block, re.S | re.M)
    if body is None:
        raise ValueError("a layers contract without a `layers = [` ... `]` array")
    rows, words = [], []
    for line in body.group(1).splitlines():
        line = line.strip()
        if line.startswith("#"):
            words.append(line.lstrip("#").strip())
        elif entry := re.fullmatch(r'"([^"]+)",?\s*(?:#\s*(.*))?', line):
            rows.append((entry.group(1), " ".join(words + [entry.group(2) or ""]).strip()))
            words = []
        elif line:
            raise ValueError(f"a layers array line neither an entry nor a comment: {line!r}")
    return rows


def layer_tables(pyproject: str) -> str:
    """Every layers contract of ``pyproject``'s ``[tool.importlinter]`` as a Markdown table, top
    layer first, each layer with the comment written above it there.  The layers are read with
    the TOML parser and the comments from the text; the two must name the same layers."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pytest's own TOML reader
        import tomli as tomllib

    contracts = [c for c in tomllib.loads(pyproject)["tool"]["importlinter"]["contracts"]
                 if c["type"] == "layers"]
    blocks = [b for b in pyproject.split("[[tool.importlinter.contracts]]")[1:]
              if re.search(r'^type = "layers"', b, re.M)]
    out = []
    for contract, block in zip(contracts, blocks, strict=True):
        rows = _layer_comments(block)
        if [layer for layer, _ in rows] != contract["layers"]:
            raise ValueError(f"{contract['name']}: the layers read from the text differ from "
                             f"the TOML's: {[r[0] for r in rows]} != {contract['layers']}")
        container = ", ".join(f"`{c}`" for c in contract["containers"])
        out += [f"**{contract['name']}** (in {container})", "",
                "| layer (top to bottom) | what lives there |", "|---|---|"]
        for layer, comment in rows:
            names = " \\| ".join(f"`{name.strip()}`" for name in layer.split("|"))
            out.append(f"| {names} | {comment.replace('|', chr(92) + '|')} |")
        out.append("")
    return "\n".join(out).rstrip("\n")


def architecture_doc(text: str, pyproject: str) -> str:
    """``text`` (``ARCHITECTURE_DOC``) with its layer tables regenerated from ``pyproject``."""
    return _regenerated(text, LAYERS, ARCHITECTURE_DOC, lambda: layer_tables(pyproject))


def run(args) -> int:
    import argparse

    from minibert_reference.train.fileio import atomic_write
    from minibert_spec.paths import need_checkout
    from minibert_spec.protocol import protocol_markdown

    try:
        home = need_checkout("minibert regenerate")
        readme = home / PROTOCOL_DOC
        text = readme.read_text(encoding="utf-8")
        new = _regenerated(text, TABLE, PROTOCOL_DOC, protocol_markdown)
        layers_doc = home / ARCHITECTURE_DOC
        layers_text = layers_doc.read_text(encoding="utf-8")
        new_layers = architecture_doc(
            layers_text, (home / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        print(f"minibert regenerate: {e}", file=sys.stderr)
        return 2
    for path, old, now, what in ((readme, text, new, f"{PROTOCOL_DOC}: protocol table"),
                                 (layers_doc, layers_text, new_layers,
                                  f"{ARCHITECTURE_DOC}: layer tables")):
        if now != old:
            atomic_write(path, now)
        print(f"{what} {'rewritten' if now != old else 'already current'}")
    from minibert_spec.equations import _codegen

    # the checks' index always (seconds); the maps unless --no-maps (minutes)
    files = ({_codegen.CHECKS_INDEX: _codegen.checks_index()} if args.no_maps
             else _codegen.generate())
    changed = _codegen.write(files, prune=not args.no_maps)
    print(f"spec/equations/_generated: {len(changed)} file(s) rewritten"
          + (f" ({', '.join(changed)})" if changed else " (already current)"))
    if args.no_matrix:
        return 0
    from minibert_spec.cli import mutate

    # the stale rows as `minibert mutate --matrix -j N` reruns them: its own parser gives every
    # option its default (a Namespace written here by hand missed the options added since)
    parser = argparse.ArgumentParser(prog="minibert")
    mutate.register(parser.add_subparsers())
    return mutate.run(parser.parse_args(["mutate", "--matrix", "-j", str(args.jobs)]))
