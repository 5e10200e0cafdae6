"""What the audit and the mutation runner both read: the tagged tests and the mutation matrix.

* **Tagged tests**: ``pytest --collect-only`` of ``tests/`` in a fresh interpreter with this module
  as a plugin (``-p minibert_spec.evidence``, :func:`pytest_collection_finish`) -- every collected
  case's nodeid, file, function, line, the equation IDs of its ``equation`` markers (and, for a
  check of the judging suite, its id, kind and defining file).  The audit joins them with the
  equations (``minibert_spec.audit``); the mutation runner runs the cases tagged with a mutant's
  equation (``minibert_spec.mutation``).
* **The mutation matrix file** (``spec/results/mutation_matrix.json``): per catalog mutant, the
  tests tagged with its equation and those that killed it, keyed by a :func:`fingerprint` of
  what decides the outcome -- the mutant's edits, the tagged node ids, the contents of the files
  holding them and of the helper modules they import -- so an edited catalog or test makes the
  record stale (an audit gap) until ``minibert mutate --matrix`` runs again.  The runner writes
  it (:func:`write_matrix`), the audit reads it (:func:`read_matrix`).

Below both (``[tool.importlinter]`` in pyproject.toml): neither the audit nor the mutation runner
imports the other.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from minibert_spec.paths import HOME, RESULTS

ROOT = HOME

# --------------------------------------------------------------------------- tagged tests
COLLECT_ENV = "MINIBERT_AUDIT_COLLECT"  # where the collection plugin writes its JSON


def pytest_collection_finish(session) -> None:
    """Collection plugin (``-p minibert_spec.evidence``): every collected item's nodeid, file,
    function,
    line, equation IDs and oracle flag, as JSON to $MINIBERT_AUDIT_COLLECT."""
    import pytest  # only ever loaded as a plugin of a pytest run

    out = os.environ.get(COLLECT_ENV)
    if not out:
        return
    root = Path(session.config.rootpath)
    records = []
    for item in session.items:
        classes = [n.name for n in item.listchain() if isinstance(n, pytest.Class)]
        name = getattr(item, "originalname", None) or item.name.split("[")[0]
        try:
            file = Path(item.path).resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            file = str(item.path)
        record = {
            "nodeid": item.nodeid, "file": file, "function": ".".join([*classes, name]),
            "line": (item.location[1] or 0) + 1,
            "ids": sorted({str(a) for m in item.iter_markers("equation") for a in m.args}),
            "oracle": any(True for _ in item.iter_markers("oracle"))}
        check = item.get_closest_marker("suite_check")
        if check is not None:  # a check of the judging suite: where it is defined, its kind
            from minibert_spec.suite.registry import get

            c = get(check.args[0])
            src, line = c.source
            try:
                src = Path(src).resolve().relative_to(root.resolve().parent).as_posix()
            except ValueError:
                pass
            record.update(check=c.id, kind=c.kind, ids=sorted(set(record["ids"])
                                                              | set(c.equations)),
                          oracle=record["oracle"] or c.oracle, source=src, source_line=line)
        records.append(record)
    Path(out).write_text(json.dumps(records), encoding="utf-8")


class CollectionError(RuntimeError):
    """pytest could not collect the tests: the audit cannot say what they cover."""


def collect_items(tests_dir: Path | str = ROOT / "tests", *, impl_spec: str | None = None,
                  timeout: float = 600) -> list[dict]:
    """``pytest --collect-only`` on ``tests_dir`` in a fresh interpreter, with this module as a
    plugin: one record per collected item.  Any collection error (or an unusable tests
    directory) raises :class:`CollectionError` with pytest's output -- never an empty list.
    The project's own tests/ are collected once per source: the records are kept on disk
    (:func:`_collection_path`: keyed by every source file of the checkout, the interpreter,
    pytest's version, ``impl_spec`` and the MINIBERT_* environment), ~10 s each time."""
    from minibert_spec.equations._cache import once

    cached = _collection_path(Path(tests_dir), impl_spec)

    def collect():
        records = _collect_items(tests_dir, impl_spec=impl_spec, timeout=timeout)
        if cached is not None:
            from minibert_reference.train.fileio import atomic_write

            try:
                cached.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(str(cached), json.dumps(records))
            except OSError:
                pass  # a cache that cannot be written: collected again next time
        return records

    # another process collecting the same tests: wait and read
    return once(cached, lambda: _read_collection(cached), collect)


def _read_collection(cached: Path | None) -> list[dict] | None:
    """The records kept at ``cached``, or None (none kept, unreadable)."""
    if cached is None:
        return None
    try:
        return json.loads(cached.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _collection_path(tests_dir: Path, impl_spec: str | None) -> Path | None:
    """Where the collection of the project's own tests/ is kept (None for any other
    directory: a scratch or synthetic tests folder is always collected)."""
    import pytest

    from minibert_spec.equations._cache import cache_root

    tests_dir = tests_dir.resolve()
    if tests_dir != (ROOT / "tests").resolve() or not tests_dir.is_dir():
        return None
    h = hashlib.sha256(f"{sys.executable}|{pytest.__version__}|{impl_spec}".encode())
    for k in sorted(os.environ):
        if k.startswith("MINIBERT_") and k != "MINIBERT_REPORT":
            h.update(f"{k}={os.environ[k]}".encode())
    files = [ROOT / "conftest.py", ROOT / "pyproject.toml"]
    for part in ("spec", "reference", "tests"):
        files += sorted((ROOT / part).rglob("*.py"))
    for f in files:
        try:
            h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
        except OSError:
            h.update(str(f).encode() + b"<missing>")
    return cache_root() / "collect" / f"{h.hexdigest()[:40]}.json"


def _collect_items(tests_dir: Path | str, *, impl_spec: str | None, timeout: float
                   ) -> list[dict]:
    tests_dir = Path(tests_dir).resolve()
    if not tests_dir.is_dir():
        raise CollectionError(f"tests directory {tests_dir} does not exist")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTEST_ADDOPTS", "MINIBERT_REPORT", "PYTEST_PLUGINS")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    if impl_spec:
        env["MINIBERT_IMPL"] = impl_spec  # what --impl defaults to (conftest.py)
    env["MINIBERT_SLOW"] = "1"  # every test is evidence, the slow tier's too (conftest.py)
    with tempfile.TemporaryDirectory(prefix="minibert-audit-") as tmp:
        env[COLLECT_ENV] = out = str(Path(tmp) / "items.json")
        cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
               "-p", __name__, f"--rootdir={tests_dir.parent}", str(tests_dir)]
        proc = subprocess.run(cmd, cwd=tests_dir.parent, env=env, capture_output=True,
                              text=True, timeout=timeout)
        # 0: collected; 5: nothing to collect (a directory without tests)
        if proc.returncode not in (0, 5) or not Path(out).is_file():
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-40:]
            raise CollectionError(f"pytest --collect-only {tests_dir} exited {proc.returncode}:"
                                  "\n" + "\n".join(tail))
        return json.loads(Path(out).read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- the matrix file
MATRIX_PATH = RESULTS / "mutation_matrix.json"
MATRIX_VERSION = 1
# the helper modules a test or check imports by name that its fingerprint covers: beside the
# tests, and the judging suite's and the numerics' modules (minibert_spec.suite.*,
# minibert_spec.numerics.*)
HELPER_PACKAGES = (("minibert_spec", "suite"), ("minibert_spec", "numerics"))
# the folder of the repository that holds each import name's package (package-dir in pyproject)
FOLDERS = {"minibert_spec": "spec", "minibert_reference": "reference"}


def evidence_file(nodeid: str, root: Path = ROOT) -> str:
    """The file that holds a test's evidence: its own file, or for a check of the judging suite
    run through ``parametrize_with_checks`` (``...::test_conformance[fd[layernorm]]``) the
    module that defines the check."""
    file = nodeid.split("::")[0]
    if "[" not in nodeid:
        return file
    check_id = nodeid.split("[", 1)[1][:-1]
    return _check_file(check_id, str(root.resolve())) or file


@functools.cache
def _check_file(check_id: str, root: str) -> str | None:
    """The file defining a registered check, relative to ``root`` (once per process: the
    fingerprints of the ~90 mutants ask for the same checks, and finding a function's source
    costs milliseconds)."""
    from minibert_spec.suite.registry import all_checks

    for c in all_checks():
        if c.id == check_id:
            return Path(c.source[0]).resolve().relative_to(root).as_posix()
    return None


@functools.lru_cache(maxsize=512)
def _imported_names(source: str) -> frozenset:
    """Every dotted name a module's source imports (parsed once per distinct source)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return frozenset(names)


def _helper_files(test_file: Path, tests_dir: Path) -> list[Path]:
    """The helper modules (``tests/x.py``, or a module of a package of ``HELPER_PACKAGES``:
    ``spec/suite/x.py``, ``spec/numerics/x.py``; not ``test_*``) a test or check module imports
    by name; a package imported by name (``minibert_spec.suite.strategies``: a folder with an
    ``__init__.py``) is every ``*.py`` file of its folder."""
    try:
        names = _imported_names(test_file.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return []
    out = []
    for dotted in sorted(names):
        parts = dotted.split(".")
        base = tests_dir
        if parts[0] == tests_dir.name:
            parts = parts[1:]
        else:
            package = next((pkg for pkg in HELPER_PACKAGES if tuple(parts[:len(pkg)]) == pkg),
                           None)
            if package is not None:
                base, parts = ROOT.joinpath(FOLDERS[package[0]], *package[1:]), parts[len(package):]
        if not parts:
            continue
        folder = base.joinpath(*parts)
        candidates = (sorted(folder.glob("*.py")) if (folder / "__init__.py").is_file()
                      else [folder.with_suffix(".py")])
        out.extend(p for p in candidates
                   if p.is_file() and not p.name.startswith("test_") and p != test_file)
    return list(dict.fromkeys(out))


def fingerprint(mutant_name: str, nodeids: Sequence[str], root: Path = ROOT) -> str:
    """sha256 of the mutant's definition, the tagged node ids and the files they live in (plus
    the helper modules those files import)."""
    from minibert_spec.mutants import (
        CATALOG,  # (it loads the protocol and reference: only when asked)
    )

    m = CATALOG[mutant_name]
    h = hashlib.sha256()
    h.update(json.dumps([m.name, m.equation, [(e.target, e.old, e.new) for e in m.edits]])
             .encode())
    h.update(json.dumps(sorted(nodeids)).encode())
    tests_dir = root / "tests"
    files = sorted({root / n.split("::")[0] for n in nodeids}
                   | {root / evidence_file(n, root) for n in nodeids})
    helpers = sorted({h_ for f in files for h_ in _helper_files(f, tests_dir)} - set(files))
    for f in [*files, *helpers]:
        h.update(f.relative_to(root).as_posix().encode())
        try:
            h.update(hashlib.sha256(f.read_bytes()).digest())
        except OSError:
            h.update(b"<missing>")
    return h.hexdigest()


def read_matrix(path: Path = MATRIX_PATH) -> dict | None:
    """The recorded matrix ({"version", "rows": {mutant: row dict}}), or None if absent or
    unreadable."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != MATRIX_VERSION \
            or not isinstance(data.get("rows"), dict):
        return None
    return data


def write_matrix(rows: dict[str, dict], path: Path = MATRIX_PATH, **meta) -> None:
    """Atomically: a temporary file beside ``path``, fsynced, then renamed over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"version": MATRIX_VERSION, **meta,
            "rows": {k: rows[k] for k in sorted(rows)}}
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
