"""Hostile adapter: ends the process with status 0 while it is imported (``os._exit(0)``: no
exception to catch).  ``pytest --minibert-impl`` used to end with exit 0 and no output."""

import os

os._exit(0)
