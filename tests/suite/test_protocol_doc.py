"""The protocol's prose comes from the op table: README's protocol table is the generated one
(`python -m spec.protocol --markdown`), so a row added, renamed or re-documented in
spec/protocol/table.py without regenerating the README fails here."""

from __future__ import annotations

import re

from spec.protocol import OPS, protocol_markdown
from tests import ROOT

README = ROOT / "README.md"


def test_readme_protocol_table_is_the_generated_one():
    text = README.read_text(encoding="utf-8")
    m = re.search(r"<!-- protocol-table:[^\n]*-->\n(.*?)\n<!-- /protocol-table -->", text, re.S)
    assert m, "README.md: the protocol table's markers are missing"
    assert m.group(1) == protocol_markdown(), (
        "README.md's protocol table is stale: regenerate it with "
        "`python -m spec.protocol --markdown`")


def test_every_row_is_documented_and_its_backward_follows_its_inputs():
    for op in OPS.values():
        assert op.doc, op.name
        names = [n for n in op.names if n.endswith("_forward")] or list(op.names)
        assert names[0].split("(")[0] in op.doc, (op.name, names[0])
        if op.pair and not op.backward_doc:
            assert op.returns() == "(" + ", ".join(f"d{n}" for n in op.inputs) + (
                "," if len(op.inputs) == 1 else "") + ")"
