"""Hostile adapter: correct ops, but the process dies (``os._exit(3)``) inside the oracle
subprocess of ``minibert check`` (``MINIBERT_ORACLE=1``).  A crashed oracle run used to read
"no oracle tests" and exit 0; it must be "could not run" (exit 2)."""

from __future__ import annotations

import os

from tests.examples.classy_adapter import *  # noqa: F403
from tests.examples.classy_adapter import relu_backward  # noqa: F401
from tests.examples.classy_adapter import relu_forward as _relu_forward


def relu_forward(x):
    if os.environ.get("MINIBERT_ORACLE") == "1":
        os._exit(3)
    return _relu_forward(x)
