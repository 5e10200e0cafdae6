"""Hostile adapter: ``relu_forward`` calls ``sys.exit(0)``.  Only ``Exception`` used to be caught,
so the SystemExit ended ``minibert check`` with status 0 and no output; it must fail relu."""

from __future__ import annotations

import sys

from tests.examples.classy_adapter import *  # noqa: F403
from tests.examples.classy_adapter import relu_backward  # noqa: F401


def relu_forward(x):
    sys.exit(0)
