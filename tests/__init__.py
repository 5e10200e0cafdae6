"""The project's own tests, by area: reference/ (the NumPy maths), train/ (the training tooling),
hf/ (Hugging Face checkpoints), suite/ (the judging suite on the reference and on the examples),
equations/ (SymPy, correspondence, claims), mutation/, report/ (the blueprint and the check page),
cli/, bench/; test_architecture.py for the whole.  ``examples/`` holds implementations written
as real code is, ``benchmarks/`` the scripts that measure (never asserted in a test)."""

from pathlib import Path

# the repository's root (the checkout): every test that needs a path of the project uses it
ROOT = Path(__file__).resolve().parent.parent
