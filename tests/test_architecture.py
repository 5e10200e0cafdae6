"""The architecture, checked.

* ``minibert_spec`` is layered and ``minibert_reference`` imports neither ``minibert_spec`` nor
torch/transformers: the
  contracts of ``[tool.importlinter]`` in pyproject.toml (the architecture's documentation, a
  comment per layer) hold -- ``lint-imports`` passes here, and fails naming the import on a copy
  of the packages with an upward import and a forbidden one added.
* No import circle between modules of ``minibert_spec``: a layers contract does not see one inside a
  layer (two modules of ``minibert_spec.suite`` importing each other), so it is looked for here, on
  the same import graph (grimp, import-linter's), every import counted, a deferred one inside a
  function included.
* The maths modules of ``minibert_reference`` load NumPy and the standard library only: the tooling
  (training loop, tokenizer, checkpoints, plots) lives in ``minibert_reference.train`` and the CLI
  in ``minibert_spec.cli``.  Checked in a fresh interpreter, so what this test process already
  imported (pytest, hypothesis, torch) cannot hide an import -- what runs is what counts, an
  optional third-party import included, which an import graph of the project's own modules cannot
  say.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minibert_spec.cli.regenerate import ARCHITECTURE_DOC, architecture_doc, layer_tables
from tests import ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own TOML reader
    import tomli as tomllib

MATHS_MODULES = tuple(f"minibert_reference{m}" for m in (
    "", ".ops", ".model", ".data_parallel", ".parallel", ".optim", ".accumulation", ".config",
    ".validate", ".registry"))
FORBIDDEN = ("minibert_spec", "sympy", "torch", "rich", "tokenizers", "safetensors", "matplotlib",
             "tqdm", "hypothesis", "pytest", "scipy", "transformers", "minibert_reference.train",
             "minibert_reference.hf")
# `lint-imports`, by the interpreter running the tests (the console script does just this)
LINT_IMPORTS = [sys.executable, "-c", "import sys; from importlinter.cli import "
                "lint_imports_command; sys.exit(lint_imports_command())", "--no-cache"]
# Import circles known and owned elsewhere, each removed when its owner breaks it (the test
# fails on a circle gone as on a new one, so this list cannot go stale):
KNOWN_CIRCLES: list[set[str]] = []  # none: a circle found is a failure


# --------------------------------------------------------------------------- the contracts
def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(LINT_IMPORTS, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_import_contracts_hold():
    out = lint_imports(ROOT)
    assert out.returncode == 0, f"lint-imports failed:\n{out.stdout}{out.stderr}"
    assert "3 kept, 0 broken" in out.stdout, out.stdout  # the three contracts were read and checked


def _copy_packages(dest: Path) -> None:
    """spec/, reference/ (their Python files) under their import names, and pyproject.toml, to
    run lint-imports on (the copy is first on the path there, ahead of the editable install)."""
    def keep_python(folder, names):
        return [n for n in names if not (n.endswith(".py") or (Path(folder) / n).is_dir())
                or n == "__pycache__"]

    for folder, package in (("spec", "minibert_spec"), ("reference", "minibert_reference")):
        shutil.copytree(ROOT / folder, dest / package, ignore=keep_python)
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")


def test_lint_imports_fails_on_an_upward_and_a_forbidden_import(tmp_path):
    """The contracts can fail: on a copy, the protocol (a low layer) imports the suite (above
    it), the suite's drawing kit imports its runner (above it, inside the suite) and the
    reference's config imports spec; lint-imports exits non-zero naming all three."""
    _copy_packages(tmp_path)
    for file, line in (("minibert_spec/protocol/table.py", "import minibert_spec.suite.registry"),
                       ("minibert_spec/suite/strategies/kit.py", "import minibert_spec.suite.run"),
                       ("minibert_reference/config.py", "import minibert_spec.paths")):
        with open(tmp_path / file, "a", encoding="utf-8") as f:
            f.write(f"\n{line}  # deliberately against the contract (a test)\n")
    out = lint_imports(tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    assert "0 kept, 3 broken" in text, text
    assert "minibert_spec.protocol.table -> minibert_spec.suite.registry" in text, text
    assert "minibert_spec.suite.strategies.kit -> minibert_spec.suite.run" in text, text
    assert "minibert_reference.config -> minibert_spec.paths" in text, text


# --------------------------------------------------------------------------- import circles
def _contract() -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (layers,) = [c for c in config["tool"]["importlinter"]["contracts"]
                 if c["type"] == "layers" and c["containers"] == ["minibert_spec"]]
    return layers


def spec_graph():
    """The import graph of spec (every import, deferred ones too), without the arrows the
    layers contract lists in ``ignore_imports`` (each commented with when it goes)."""
    import grimp

    graph = grimp.build_graph("minibert_spec", cache_dir=None)
    for expression in _contract().get("ignore_imports", []):
        importer, imported = (s.strip() for s in expression.split("->"))
        graph.remove_import(importer=importer, imported=imported)
    return graph


def circles(graph) -> list[set[str]]:
    """The import circles of ``graph``: its strongly connected components of more than one
    module (Tarjan), each a set of modules that reach each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph.find_modules_directly_imported_by(module)):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = set()
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.add(other)
                if other == module:
                    break
            if len(component) > 1:
                found.append(component)

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def _describe(graph, circle: set[str]) -> str:
    """One circle as a chain that comes back to where it started."""
    start = min(circle)
    nxt = min(m for m in graph.find_modules_directly_imported_by(start) if m in circle)
    back = graph.find_shortest_chain(importer=nxt, imported=start)
    return " -> ".join([start, *back]) + f" (circle of {len(circle)} modules)"


def test_no_import_circle_in_spec():
    graph = spec_graph()
    found = circles(graph)
    new = [c for c in found if c not in KNOWN_CIRCLES]
    gone = [c for c in KNOWN_CIRCLES if c not in found]
    assert not new, "import circles in spec/ (move the shared piece down a layer):\n" + \
        "\n".join(_describe(graph, c) for c in new)
    assert not gone, f"these circles are gone: remove them from KNOWN_CIRCLES: {gone}"


def test_the_circle_finder_sees_a_circle():
    """Two bottom-layer modules importing each other, in a layer where the layers contract
    cannot see it: the finder does."""
    graph = spec_graph()
    graph.add_import(importer="minibert_spec.paths", imported="minibert_spec.tolerances")
    graph.add_import(importer="minibert_spec.tolerances", imported="minibert_spec.paths")
    assert {"minibert_spec.paths", "minibert_spec.tolerances"} in circles(graph)


# --------------------------------------------------------------------------- reference's maths
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


# ------------------------------------------------------------------- the layers, written once
def _layers_doc() -> tuple[str, str]:
    return ((ROOT / ARCHITECTURE_DOC).read_text(encoding="utf-8"),
            (ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_the_drawn_layers_are_the_contracts():
    """docs/architecture.md's layer tables are what `minibert regenerate` writes from the
    contracts of pyproject.toml, every layer of each contract in its order."""
    doc, pyproject = _layers_doc()
    assert architecture_doc(doc, pyproject) == doc, (
        f"{ARCHITECTURE_DOC}: the layer tables are stale: run `minibert regenerate --no-matrix "
        "--no-maps`")
    config = tomllib.loads(pyproject)
    for contract in config["tool"]["importlinter"]["contracts"]:
        if contract["type"] != "layers":
            continue
        rows = [line for line in doc.splitlines() if line.startswith("| `")]
        for layer in contract["layers"]:
            names = " \\| ".join(f"`{n.strip()}`" for n in layer.split("|"))
            assert any(row.startswith(f"| {names} |") for row in rows), (contract["name"], layer)


def test_a_layer_changed_in_pyproject_changes_the_drawing():
    """The drawing follows the contracts (so the test above can fail): a layer renamed or a
    comment changed in pyproject.toml changes the tables; a layers array the reader cannot
    follow is a ValueError, not a table missing a layer."""
    doc, pyproject = _layers_doc()
    renamed = pyproject.replace('"pool",', '"pools",', 1)
    assert 'pools' in layer_tables(renamed) and architecture_doc(doc, renamed) != doc
    reworded = pyproject.replace("# the five source documents, named once",
                                 "# the five source documents, named twice", 1)
    assert "named twice" in layer_tables(reworded)
    unreadable = pyproject.replace('    "pool",\n', '    "pool", "forkserver-copy",\n', 1)
    with pytest.raises(ValueError, match="neither an entry nor a comment"):
        layer_tables(unreadable)


def test_the_layers_are_written_only_in_pyproject():
    """No other file lists the layers by hand (they went stale three times): no tracked text
    file outside pyproject.toml holds a layer of siblings as the contract spells it ("audit |
    mutation") or two adjacent layers as an arrow (``cli`` -> ``report``); the generated
    tables are drawn with backticks and escaped bars, so they do not match."""
    _, pyproject = _layers_doc()
    config = tomllib.loads(pyproject)
    patterns = []
    for contract in config["tool"]["importlinter"]["contracts"]:
        if contract["type"] != "layers":
            continue
        layers = contract["layers"]
        patterns += [re.escape(layer) for layer in layers if "|" in layer]
        patterns += [rf"`*{re.escape(a.split('|')[-1].strip())}`*\s*->\s*"
                     rf"`*{re.escape(b.split('|')[0].strip())}`*\b"
                     for a, b in zip(layers, layers[1:])]
    copy = re.compile("|".join(patterns))
    files = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.toml", "*.txt"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    found = [f"{name}: {m.group(0)!r}" for name in files if name != "pyproject.toml"
             for m in [copy.search((ROOT / name).read_text(encoding="utf-8", errors="replace"))]
             if m]
    assert not found, "the layers copied by hand (write them in pyproject.toml only):\n" + (
        "\n".join(found))
