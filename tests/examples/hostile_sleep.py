"""Hostile adapter: ``relu_forward`` never returns (sleeps an hour).  Every mode used to hang;
``minibert check --timeout 2`` must fail relu within its time-out."""

from __future__ import annotations

import time

from tests.examples.classy_adapter import *  # noqa: F403
from tests.examples.classy_adapter import relu_backward  # noqa: F401


def relu_forward(x):
    time.sleep(3600)
