"""Hostile adapter: raises while it is imported."""

raise RuntimeError("this adapter is broken at import time")
