"""Hostile adapter: raises ``SystemExit(0)`` while it is imported (``sys.exit(0)``)."""

import sys

sys.exit(0)
