"""A class of submissions for ``minibert check --many``, generated from a few templates: correct,
buggy (a wrong LayerNorm backward), hanging (in a call, or at import), crashing (the process
killed in a call, or ended at import), mixed (LayerNorm right, softmax wrong), one that does not
compile, one package.  tests/suite/test_many.py and tests/benchmarks/many_time.py use it.

Every submission provides the LayerNorm and softmax pairs (the run selects those ops): what
each template must come to is :data:`EXPECTED` (per op verdict, or the exit status alone).
"""

from __future__ import annotations

from pathlib import Path

# the options of every run over the class: two ops, the checks that need no torch, a short
# time limit (a hang is a red within it)
ARGS = ["--ops", "layernorm", "softmax", "--kinds", "fd", "invariant", "--oracle", "off",
        "--timeout", "3", "-j", "1"]

RIGHT = """\
from minibert_reference.ops import layernorm_backward, layernorm_forward  # noqa: F401
from minibert_reference.ops import softmax_backward, softmax_forward  # noqa: F401
"""
TEMPLATES = {
    "correct": RIGHT,
    "buggy": RIGHT + """
from minibert_reference.ops import layernorm_backward as _right


def layernorm_backward(dy, cache):  # dx 1% too large
    dx, dgamma, dbeta = _right(dy, cache)
    return dx * 1.01, dgamma, dbeta
""",
    "hangs": RIGHT + """

def layernorm_forward(*args, **kwargs):
    while True:  # a hang in Python: the check's time limit ends it
        pass
""",
    "crashes": RIGHT + """
import os


def layernorm_forward(*args, **kwargs):
    os._exit(3)  # the process running the check ends
""",
    "mixed": RIGHT + """
from minibert_reference.ops import softmax_backward as _right


def softmax_backward(dy, cache):  # the sign of the Jacobian's rank-one term flipped
    dx = _right(dy, cache)
    return -dx
""",
    "import_exit": "import os\nos._exit(0)\n" + RIGHT,
    "import_hang": "import time\ntime.sleep(3600)\n" + RIGHT,
    "syntax": RIGHT + "\ndef broken(:\n",
}
# per template: {op: verdict}, or None when the implementation could not be checked (exit 2)
EXPECTED = {
    "correct": {"layernorm": "ok", "softmax": "ok"},
    "buggy": {"layernorm": "FAIL", "softmax": "ok"},
    "hangs": {"layernorm": "FAIL", "softmax": "ok"},
    "crashes": {"layernorm": "FAIL", "softmax": "ok"},
    "mixed": {"layernorm": "ok", "softmax": "FAIL"},
    "import_exit": None,
    "import_hang": None,
    "syntax": None,
}
# 20 submissions: the template of each (a package for the last correct one)
CLASS = (["correct"] * 6 + ["buggy"] * 3 + ["hangs"] * 2 + ["crashes"] * 2 + ["mixed"] * 3
         + ["import_exit", "import_hang", "syntax", "correct"])


def write_class(root: Path, templates=CLASS) -> dict[str, str]:
    """The submissions written under ``root`` (student_NN.py; the last one a package);
    {name as the table shows it: template}."""
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for i, template in enumerate(templates):
        if i == len(templates) - 1:
            package = root / f"team_{i:02d}"
            package.mkdir(exist_ok=True)
            (package / "__init__.py").write_text(TEMPLATES[template])
            out[package.name] = template
        else:
            (root / f"student_{i:02d}.py").write_text(TEMPLATES[template])
            out[f"student_{i:02d}.py"] = template
    return out
