"""The numeric functions of the SymPy derivations, as Python source generated once, at
development time, and committed: one module per equation module (``softmax.py`` holds the maps
of spec/equations/softmax.py), and ``_index.py``, which names each builder call's module and the
digest of the equations' source they were generated from.  ``minibert regenerate`` writes them
(spec/equations/_codegen.py, with SymPy's NumPy code printer through lambdify);
tests/equations/test_generated_maps.py fails when regenerating would change a byte.

A check reads a map here in milliseconds: no derivation, no lambdify, nothing built on the
user's clock.  While the equations' source differs from the one the maps were generated from
(an equation edited and not yet regenerated), nothing here is used: the maps are built from
SymPy as before (spec/equations/_cache.py), never read stale.

``_checks.py`` lists the equations with a SymPy <-> code check, with the digest of each
equations file: the process that selects the checks reads it and imports no SymPy
(:func:`listed_numeric`); a file changed since is named, and the equations are loaded instead."""

from __future__ import annotations

import functools
import hashlib
import importlib
from pathlib import Path

# how maps are stored and generated, not what they compute: left out of equations_digest
STORAGE = ("_cache.py", "_codegen.py")


def source_files() -> list[Path]:
    """The files of the equations package that decide what the maps compute and which
    equations have a SymPy <-> code check (not :data:`STORAGE`, nor this folder), by name."""
    return [path for path in sorted(Path(__file__).resolve().parent.parent.glob("*.py"))
            if path.name not in STORAGE]


@functools.cache
def equations_digest() -> str:
    """sha256 of :func:`source_files`: the generated maps are used only while it is the one
    they were generated from, so an equation edited and not regenerated is built from SymPy,
    never read stale."""
    h = hashlib.sha256()
    for path in source_files():
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def file_digests() -> dict[str, str]:
    """file name -> sha256 of each of :func:`source_files` (the checks' index records them, so
    a stale index names the files that changed)."""
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in source_files()}


def numeric_entries(equations) -> dict[str, dict]:
    """equation id -> the protocol variant it is (``Numeric.variant``) of every equation of
    ``equations`` (the loaded registry) with a ``Numeric``, by file name and line: what the
    SymPy <-> code checks are listed from (minibert_spec.suite.checks.sympy_code).  Not in
    registration order, which follows whatever imported an equation module first (a test
    importing spec/equations/block.py registered block's equations before attention's, and
    the index read as stale in that process)."""
    ordered = sorted(equations.values(), key=lambda e: (Path(e.file).name if e.file else "",
                                                        e.line or 0))
    return {e.id: dict(e.numeric.variant) for e in ordered if e.numeric is not None}


def listed_numeric() -> tuple[dict[str, dict] | None, list[str]]:
    """(:func:`numeric_entries` as the generated index ``_checks.py`` recorded them, []) while
    the equations' files are the ones it was generated from -- read without importing SymPy or
    any equation; else (None, the names of the files that changed, appeared or went): the
    caller then loads the equations, never lists from a stale index."""
    try:
        from minibert_spec.equations._generated._checks import NUMERIC, SOURCES
    except ImportError:
        return None, ["_generated/_checks.py (missing)"]
    now = file_digests()
    changed = sorted(n for n in now.keys() | SOURCES.keys() if now.get(n) != SOURCES.get(n))
    return (None, changed) if changed else (dict(NUMERIC), [])


@functools.cache
def _current_index() -> dict:
    """key -> module, or {} when there is no index or it is not the equations' current one."""
    try:
        from minibert_spec.equations._generated._index import DIGEST, INDEX
    except ImportError:
        return {}
    return INDEX if DIGEST == equations_digest() else {}


def generated_map(key: str):
    """What one builder call (spec/equations/_cache.entry_key) returns -- a map, or tuples,
    lists and dicts of maps -- from its generated source; None when it was not generated (or
    the equations changed since)."""
    module = _current_index().get(key)
    if module is None:
        return None
    return importlib.import_module(f"{__name__}.{module}").MAPS[key]


def map_of(fn, names, shapes):
    """The map over named arrays around a generated function of their flattened elements (as
    lambdify_map makes it)."""
    from minibert_spec.equations._sym import _map_call

    return _map_call(fn, names, shapes)
