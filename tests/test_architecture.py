"""The dependency direction: ``spec`` checks ``reference``, never the reverse.

The maths modules of ``reference`` import NumPy and the standard library only; the tooling
(training loop, tokenizer, checkpoints, plots) lives in ``reference.train`` and the CLI in
``spec.cli``.  Checked in a fresh interpreter, so what this test process already imported
(pytest, hypothesis, torch) cannot hide an import.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MATHS_MODULES = ("reference", "reference.ops", "reference.model", "reference.data_parallel",
                 "reference.parallel", "reference.optim", "reference.accumulation",
                 "reference.config", "reference.validate", "reference.registry")
FORBIDDEN = ("spec", "sympy", "torch", "rich", "tokenizers", "safetensors", "matplotlib",
             "tqdm", "hypothesis", "pytest", "scipy", "transformers", "reference.train",
             "reference.hf")


def loaded_modules(*modules: str) -> set[str]:
    """Names in sys.modules after importing ``modules`` in a fresh interpreter."""
    code = ("import importlib, json, sys\n"
            f"for m in {list(modules)!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    return set(json.loads(out.stdout))


def forbidden_in(names) -> list[str]:
    return sorted(n for n in names if any(n == f or n.startswith(f + ".") for f in FORBIDDEN))


@pytest.mark.parametrize("module", MATHS_MODULES)
def test_maths_modules_load_numpy_and_stdlib_only(module):
    bad = forbidden_in(loaded_modules(module))
    assert not bad, f"importing {module} loaded {bad}: the maths needs NumPy alone"


def test_boundary_check_sees_a_forbidden_import(tmp_path):
    """The check can fail: a scratch package that imports rich is caught."""
    pkg = tmp_path / "scratchpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import rich\n")
    code = ("import json, sys\n" f"sys.path.insert(0, {str(tmp_path)!r})\n"
            "import scratchpkg\nprint(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "rich" in forbidden_in(json.loads(out.stdout))


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_nothing_in_reference_imports_spec():
    """Every file of reference/, the training tooling included, lazily or not."""
    offenders = {str(p.relative_to(ROOT)): sorted(n for n in _imports(p)
                                                  if n == "spec" or n.startswith("spec."))
                 for p in (ROOT / "reference").rglob("*.py")}
    assert not {k: v for k, v in offenders.items() if v}
