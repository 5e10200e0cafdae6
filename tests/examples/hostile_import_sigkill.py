"""Hostile adapter: kills its own process while it is imported (SIGKILL: no handler runs)."""

import os
import signal

os.kill(os.getpid(), signal.SIGKILL)
