"""Hostile adapter: provides no protocol name at all.  It used to read "0 op(s) conform", exit
0; now it is "could not run" (exit 2)."""

SOMETHING_ELSE = 1
