"""The wheel's import names are the project's own (``minibert_spec``, ``minibert_reference``).

The folders keep the repository's layout (``spec/``, ``reference/``) and ``package-dir`` in
pyproject.toml maps them to those names.  Checked here: the package list names every folder
that is a package, under its import name; no module of the project imports a generic top-level
name (``spec``, ``reference``), which a checkout would still resolve (pytest puts the rootdir
on the path) while the wheel does not ship it; and the built wheel puts nothing at the top of
site-packages but those two packages (slow tier: it builds the wheel).  tests/wheel_user_repo.py
installs that wheel beside a user's own ``spec/``, ``reference.py``, ``tests/`` and
``conftest.py``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own TOML reader
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
OWN_NAMES = {"minibert_spec", "minibert_reference"}
GENERIC = {"spec", "reference", "tests", "docs", "conftest"}


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"]


def test_every_package_folder_is_listed_under_its_import_name():
    table = _setuptools()
    folders = table["package-dir"]
    assert set(folders) == OWN_NAMES, folders
    want = set()
    for name, folder in folders.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            rel = init.parent.relative_to(ROOT / folder).parts
            want.add(".".join((name, *rel)))
    assert sorted(table["packages"]) == sorted(want), (
        f"pyproject's packages list and the folders disagree: missing "
        f"{sorted(want - set(table['packages']))}, extra {sorted(set(table['packages']) - want)}")


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append((node.lineno, node.module))
    return out


def test_no_module_imports_a_generic_top_level_name():
    files = [ROOT / "conftest.py"]
    for folder in ("spec", "reference", "tests"):
        files += [p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts]
    bad = [f"{p.relative_to(ROOT)}:{line}: import {name}"
           for p in files for line, name in _imports(p)
           if name.split(".")[0] in ("spec", "reference")]
    assert not bad, "imports of a generic name the wheel does not ship:\n" + "\n".join(bad)


def test_the_checker_sees_a_generic_import(tmp_path):
    """The scan above can fail: a module importing ``spec.suite`` is named."""
    bad = tmp_path / "m.py"
    bad.write_text("import os\nfrom spec.suite import run\nimport reference.ops as ops\n")
    assert [n for _, n in _imports(bad) if n.split(".")[0] in ("spec", "reference")] == [
        "spec.suite", "reference.ops"]


def wheel_top_level(wheel: Path) -> set[str]:
    """The first path component of every file in a wheel, less its .dist-info folder."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    return {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}


@pytest.mark.slow
def test_the_wheel_holds_only_the_projects_own_names(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                           "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wheel = next(tmp_path.glob("minibert_spec-*.whl"))
    top = wheel_top_level(wheel)
    assert top == OWN_NAMES, f"top level of {wheel.name}: {sorted(top)}"
    assert not top & GENERIC
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = next(z.read(n).decode() for n in names
                            if n.endswith(".dist-info/entry_points.txt"))
    # the shipped data the suite reads, and the plugin's uniquely named entry module
    assert "minibert_spec/results/mutation_matrix.json" in names
    assert "minibert_spec/report/templates/blueprint.css" in names or any(
        n.startswith("minibert_spec/report/templates/") for n in names)
    assert "minibert = minibert_spec._pytestplugin" in entry_points
    assert "minibert = minibert_spec.cli:main" in entry_points


def test_wheel_top_level_reads_a_wheel(tmp_path):
    """The wheel check can fail: a wheel that also ships ``spec/`` is seen to."""
    w = tmp_path / "x-0-py3-none-any.whl"
    with zipfile.ZipFile(w, "w") as z:
        for n in ("minibert_spec/__init__.py", "spec/__init__.py", "x-0.dist-info/RECORD"):
            z.writestr(n, "")
    assert wheel_top_level(w) == {"minibert_spec", "spec"}
