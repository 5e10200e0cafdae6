"""The protocol's prose comes from the op table: the protocol table of
docs/check-your-implementation.md is the generated one (`minibert regenerate --no-matrix`), so a
row added, renamed or re-documented in spec/protocol/table.py without regenerating it fails
here."""

from __future__ import annotations

import re

from minibert_spec.cli.regenerate import PROTOCOL_DOC
from minibert_spec.protocol import OPS, protocol_markdown
from tests import ROOT

README = ROOT / PROTOCOL_DOC


def test_readme_protocol_table_is_the_generated_one():
    text = README.read_text(encoding="utf-8")
    m = re.search(r"<!-- protocol-table:[^\n]*-->\n(.*?)\n<!-- /protocol-table -->", text, re.S)
    assert m, f"{PROTOCOL_DOC}: the protocol table's markers are missing"
    assert m.group(1) == protocol_markdown(), (
        f"{PROTOCOL_DOC}: the protocol table is stale: regenerate it with "
        "`minibert regenerate --no-matrix --no-maps`")


def test_every_row_is_documented_and_its_backward_follows_its_inputs():
    for op in OPS.values():
        assert op.doc, op.name
        names = [n for n in op.names if n.endswith("_forward")] or list(op.names)
        assert names[0].split("(")[0] in op.doc, (op.name, names[0])
        if op.pair and not op.backward_doc:
            assert op.returns() == "(" + ", ".join(f"d{n}" for n in op.inputs) + (
                "," if len(op.inputs) == 1 else "") + ")"


def test_regenerate_reruns_the_matrix_as_minibert_mutate_does(monkeypatch, capsys):
    """``minibert regenerate`` ends with ``minibert mutate --matrix``'s own arguments: it built
    a Namespace by hand, which lacked the options added to mutate since (matrix_file, shard,
    durations, json) and ended in an internal AttributeError after regenerating the docs."""
    from minibert_spec.cli import main, mutate

    seen = []
    monkeypatch.setattr(mutate, "run", lambda args: seen.append(args) or 0)
    assert main(["regenerate", "--no-maps", "-j", "1"]) == 0
    (args,) = seen
    assert args.matrix and args.jobs == 1 and not args.rerun
    assert args.matrix_file is None and args.shard is None and args.durations is None
