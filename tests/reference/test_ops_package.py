"""minibert_reference.ops is a package, one module per section (issue 38): every name a section
defines is still a name of ``minibert_reference.ops`` -- the public ops of ``__all__`` and the
kernels, caches, checks and tables that minibert_reference.model, .decoder, the mutation catalog
and the tests reach as ``ops.<name>`` -- each defined in exactly one section."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import minibert_reference.ops as ops


def sections() -> dict[str, object]:
    """Section name -> module, every module of the package."""
    return {info.name: importlib.import_module(f"{ops.__name__}.{info.name}")
            for info in pkgutil.iter_modules(ops.__path__)}


def top_level_names(module) -> list[str]:
    """The names a module's own source defines at its top level (functions, classes,
    assignments), read from the source: what it imports is not its definition; its ``__all__``
    is the section's list of its public ops, not a name of the package."""
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names += [n.id for n in ast.walk(t) if isinstance(n, ast.Name)]
    return [n for n in names if n != "__all__"]


def test_the_package_has_its_sections():
    assert set(sections()) == {"_common", "embeddings", "rope", "linear", "norms", "activations",
                               "attention", "ffn", "blocks", "heads", "losses"}


def test_every_name_of_all_is_importable_from_the_package():
    star: dict = {}
    exec("from minibert_reference.ops import *", star)  # noqa: S102 -- what a user's import sees
    star.pop("__builtins__")
    assert list(star) == list(dict.fromkeys(ops.__all__)) == ops.__all__
    for name in ops.__all__:
        assert star[name] is getattr(ops, name)


def test_all_is_the_sections_all_each_name_defined_by_its_section():
    """The package lists no name by hand: its ``__all__`` is its sections' ``__all__``, and a
    section lists only what it defines (a new op's pair goes in its section's list alone)."""
    gathered = [n for mod in sections().values() for n in mod.__all__]
    assert sorted(gathered) == sorted(ops.__all__)
    for s, mod in sections().items():
        stray = set(mod.__all__) - set(top_level_names(mod))
        assert not stray, f"{s}.__all__ names what {s} does not define: {stray}"


def test_every_name_a_section_defines_is_a_name_of_the_package():
    """The kernels and caches too (``ops._layernorm_backward``, ``ops.LayerNormCache``,
    ``ops.BLOCK_PARTS``): the very object the section defines, so a mutant swapped into either
    namespace is the one both run."""
    missing = [f"{s}.{n}" for s, mod in sections().items() for n in top_level_names(mod)
               if getattr(ops, n, None) is not getattr(mod, n)]
    assert not missing, f"defined in a section, not re-exported by the package: {missing}"


def test_every_name_is_defined_in_one_section():
    owners: dict[str, list[str]] = {}
    for s, mod in sections().items():
        for n in top_level_names(mod):
            owners.setdefault(n, []).append(s)
    twice = {n: s for n, s in owners.items() if len(s) > 1}
    assert not twice, f"defined in more than one section (one definition each): {twice}"
    assert set(ops.__all__) <= set(owners)


def test_functions_live_in_their_section():
    """A kernel's module is its section (the audit's file:line and a mutant's globals follow
    it), never the package's __init__."""
    for s, mod in sections().items():
        for n in top_level_names(mod):
            value = getattr(mod, n)
            if callable(value) and hasattr(value, "__module__"):
                assert value.__module__ == mod.__name__, (s, n, value.__module__)
