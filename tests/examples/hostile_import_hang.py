"""Hostile adapter: its import never returns (sleeps an hour)."""

import time

time.sleep(3600)
