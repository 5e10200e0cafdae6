"""``python -m minibert_spec.protocol [--markdown]``: the op table's contract, from the rows."""

import sys

from minibert_spec.protocol import OPS, protocol_markdown

if "--markdown" in sys.argv[1:]:
    print(protocol_markdown())
else:
    for op in OPS.values():
        print(f"{op.name}: {op.doc}" + (f"\n    backward -> {op.returns()}" if op.returns()
                                        else ""))
