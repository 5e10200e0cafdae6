"""Lambdified SymPy maps, and the outcomes of the SymPy proofs, kept on disk.

A check reads its maps from the Python source generated at development time
(spec/equations/_generated, ``minibert regenerate``) and builds nothing; the disk cache below
serves what was not generated (an equation edited and not yet regenerated, the tests' own
builders) and the proofs.

``sympy.diff`` and ``lambdify`` of the larger derivations take seconds each (~25 s for every
map of the SymPy <-> code checks), and every process that checks an implementation needed
them again.  A builder decorated with :func:`maps_cache` is run once per machine: what it
returns -- lambdified maps (minibert_spec.equations._sym.lambdify_map), alone or in tuples, lists
and dicts -- is written as the generated Python source of each map, and read back by later
processes in milliseconds.

The key is a digest of the equations' source (every file of this package: a map is built from
helpers of other modules too) with SymPy's, NumPy's and Python's versions, the builder's name
and its arguments: editing an equation rebuilds its maps, nothing stale is ever read.  The
directory is ``$XDG_CACHE_HOME/minibert-spec/sympy`` (default ``~/.cache``).  Each entry is
written atomically (a temporary file renamed over it: two processes writing the same entry at
once both leave a whole file); an entry that does not parse or does not rebuild is ignored
(the maps are built again and the entry rewritten); a directory that cannot be written only
costs the rebuild.  A proof's outcome (Equation.run_proof) is kept the same way, keyed by its
module's source and the modules it imports (:func:`module_digest`).  Private: it registers no
equation.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import sys
from pathlib import Path

FORMAT = 1  # bump when the entry layout changes


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/minibert-spec`` (``~/.cache`` when unset or not absolute, as the XDG
    base directory specification says)."""
    root = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(root) if os.path.isabs(root) else Path.home() / ".cache"
    return base / "minibert-spec"


def cache_dir() -> Path:
    """Where the maps and proofs are kept: ``cache_root() / "sympy"``."""
    return cache_root() / "sympy"


@functools.cache
def source_digest() -> str:
    """sha256 of every file of the equations package and of the library versions the
    generated code depends on."""
    import numpy
    import sympy

    h = hashlib.sha256(f"{FORMAT} {sympy.__version__} {numpy.__version__} "
                       f"{sys.version_info[:2]}".encode())
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def module_digest(path: str | Path) -> str:
    """sha256 of an equation module's source and of every module of the ``minibert_spec`` package it
    imports, the equation modules followed transitively (a proof is built from their
    helpers), with the library versions: the key of that module's proofs (editing one
    equation re-proves its module and the modules built on it, not all of them)."""
    return _module_digest(str(Path(path).resolve()))


@functools.cache
def _module_digest(path: str) -> str:
    import numpy
    import sympy

    spec_root = Path(__file__).parent.parent
    h = hashlib.sha256(f"{FORMAT} {sympy.__version__} {numpy.__version__} "
                       f"{sys.version_info[:2]}".encode())
    for p in sorted(module_closure(path)):
        h.update(str(p.relative_to(spec_root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def module_closure(path: str | Path) -> set[Path]:
    """The files of ``minibert_spec`` an equation module imports: the equation modules followed
    transitively, any other module of ``minibert_spec`` by its own file."""
    import ast

    here = Path(__file__).parent
    spec_root = here.parent
    seen: set[Path] = set()
    todo = [Path(path).resolve()]
    while todo:
        p = todo.pop()
        if p in seen or not p.exists():
            continue
        seen.add(p)
        if p.parent != here:
            continue  # a module of spec outside the equations: its own source only
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                     if isinstance(node, ast.ImportFrom) and node.module else [])
            for name in names:
                if name.split(".")[0] != "minibert_spec":
                    continue
                rel = Path(*name.split(".")[1:])
                for cand in (spec_root / rel.with_suffix(".py"), spec_root / rel / "__init__.py"):
                    if cand.exists():
                        todo.append(cand)
    return seen


def read_proof(eq) -> dict | None:
    """The stored outcome of ``eq``'s proof (``{"status", "sizes", "detail", "seconds"}``),
    or None."""
    path = proof_path(eq)
    if path is None:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != FORMAT or data.get("id") != eq.id:
            return None
        return data["proof"]
    except Exception:  # noqa: BLE001 -- absent or corrupt: proved again
        return None


def write_proof(eq, proof: dict) -> None:
    from minibert_reference.train.fileio import atomic_write

    path = proof_path(eq)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(str(path), json.dumps({"format": FORMAT, "id": eq.id, "proof": proof}))
    except (OSError, TypeError, ValueError):
        pass  # a directory that cannot be written, a detail that is no JSON: proved again


def proof_path(eq) -> Path | None:
    """Where the proof of a registered equation is kept (None for one built elsewhere, as the
    tests' synthetic equations are: their proof is no file's source)."""
    file = Path(eq.file).resolve() if eq.file else None
    if file is None or file.parent != Path(__file__).parent or not file.exists():
        return None
    key = hashlib.sha256(f"{module_digest(eq.file)}|proof|{eq.id}".encode()).hexdigest()
    return cache_dir() / f"proof-{key[:40]}.json"


@contextlib.contextmanager
def computing(path: Path | None):
    """Hold an advisory lock on ``<path>.lock`` while this process computes what ``path`` will
    hold, so that a second process wanting the same entry waits and reads it instead of
    computing it again: on a cold machine the two workers of ``pytest -n 2`` otherwise proved
    every equation, and collected the tests, twice at once.  The caller looks for the entry
    again once the lock is held.  The operating system releases the lock when its process
    dies, so a killed holder never blocks the next.  No lock (the entry is only computed)
    where ``path`` is None, the platform has no ``fcntl`` or the directory cannot be written."""
    fd = None
    if path is not None:
        try:
            import fcntl

            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except (ImportError, OSError):
            if fd is not None:
                os.close(fd)
            fd = None
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the lock


def once(path: Path | None, read, compute):
    """``read()`` if it finds the entry at ``path`` (not None), else ``compute()`` under
    :func:`computing`'s lock -- unless another process wrote the entry while this one waited
    for the lock, which is then read."""
    value = read()
    if value is not None:
        return value
    with computing(path):
        value = read()
        return compute() if value is None else value


def entry_path(name: str, args: tuple) -> Path:
    key = hashlib.sha256(f"{source_digest()}|{name}|{args!r}".encode()).hexdigest()
    return cache_dir() / f"{key[:40]}.json"


# --------------------------------------------------------------------------- (de)serialising
def _dump(value):
    """A JSON tree of ``value`` (maps in tuples, lists, dicts), or None if some part is not a
    lambdified map (such a value is not cached)."""
    spec = getattr(value, "cache_spec", None)
    if spec is not None:
        return {"map": spec}
    if isinstance(value, (tuple, list)):
        parts = [_dump(v) for v in value]
        return None if any(p is None for p in parts) else {type(value).__name__: parts}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        parts = {k: _dump(v) for k, v in value.items()}
        return None if any(p is None for p in parts.values()) else {"dict": parts}
    return None


def _load(tree):
    from minibert_spec.equations._sym import map_from_spec

    (kind, body), = tree.items()
    if kind == "map":
        return map_from_spec(body)
    if kind == "tuple":
        return tuple(_load(v) for v in body)
    if kind == "list":
        return [_load(v) for v in body]
    if kind == "dict":
        return {k: _load(v) for k, v in body.items()}
    raise ValueError(f"unknown entry kind {kind!r}")


def read(path: Path):
    """The value stored at ``path``, or None (absent, unreadable, corrupt: rebuilt)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != FORMAT or data.get("digest") != source_digest():
            return None
        return _load(data["value"])
    except Exception:  # noqa: BLE001 -- a corrupt entry of any shape is a cache miss
        return None


def write(path: Path, name: str, value) -> bool:
    """Store ``value`` if it is made of lambdified maps; False if it is not, or the directory
    cannot be written (the cache is an optimisation: never an error)."""
    tree = _dump(value)
    if tree is None:
        return False
    from minibert_reference.train.fileio import atomic_write

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(str(path), json.dumps({"format": FORMAT, "digest": source_digest(),
                                            "builder": name, "value": tree}))
    except OSError:
        return False
    return True


_BUILDERS: dict = {}
_WRAPPERS: list = []  # every maps_cache wrapper: regenerating empties their caches
# while regenerating (:func:`recording`): (label, key, value) of every build, in order; None
# otherwise
_RECORD: list | None = None


def entry_key(label: str, args: tuple) -> str:
    """The name of one builder call among the generated maps (spec/equations/_generated)."""
    return f"{label}|{args!r}"


def maps_cache(fn=None, *, name: str | None = None):
    """``functools.cache`` for a builder of lambdified maps, backed first by the generated
    source committed beside the equations (spec/equations/_generated, written by ``minibert
    regenerate``: no SymPy work at all), then by the disk cache.  ``name`` tells apart
    builders that share a qualified name (closures made per call)."""
    if fn is None:
        return functools.partial(maps_cache, name=name)
    label = name or f"{fn.__module__}.{fn.__qualname__}"
    if _BUILDERS.setdefault(label, fn) is not fn:  # two builders, one key: wrong maps read
        raise ValueError(f"maps_cache: two builders are named {label!r}; pass name= to tell "
                         "them apart")

    @functools.cache
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        key_args = args + tuple(sorted(kwargs.items()))
        if _RECORD is not None:  # regenerating: built from SymPy, nothing read
            value = fn(*args, **kwargs)
            _RECORD.append((label, entry_key(label, key_args), value))
            return value
        from minibert_spec.equations._generated import generated_map

        value = generated_map(entry_key(label, key_args))
        if value is not None:
            return value
        path = entry_path(label, key_args)
        value = read(path)
        if value is None:
            value = fn(*args, **kwargs)
            write(path, label, value)
        return value

    wrapper.builder = fn  # the uncached build (tests compare the two)
    _WRAPPERS.append(wrapper)
    return wrapper


@contextlib.contextmanager
def recording():
    """Every builder call in the block builds its maps from SymPy (neither the generated
    source nor the disk cache is read) and is recorded: yields the list of ``(label, key,
    value)``.  The builders' in-memory caches are emptied before and after."""
    global _RECORD
    for w in _WRAPPERS:
        w.cache_clear()
    _RECORD = []
    try:
        yield _RECORD
    finally:
        _RECORD = None
        for w in _WRAPPERS:
            w.cache_clear()
