"""What the tests of ``minibert adapter infer`` share: a user's module written to a temporary
directory and imported, and an adapter's source executed as a module of its own."""

from __future__ import annotations

import importlib
import sys
import textwrap
import types


def load_source(tmp_path, monkeypatch, source: str, name: str):
    """``source`` (dedented) as the module ``name`` on a temporary ``sys.path`` entry, imported
    afresh."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    return importlib.import_module(name)


def exec_source(source: str, name: str = "inferred"):
    """An adapter's source executed as a module of its own (never put on ``sys.path``)."""
    module = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)  # noqa: S102 -- our own output
    return module
