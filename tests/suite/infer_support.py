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


def assert_no_bug_inferred_away(name: str, op: str, module: str, fingerprint, row_line: str,
                                tmp_path, monkeypatch) -> None:
    """Issue 39's "no adapter under which a bug passes", for catalog mutant ``name`` of the
    ``op`` row of ``module``: skipped where the mutant does not change what ``fingerprint()``
    (the example's outputs and gradients on fixed probes) computes; otherwise infer is run under
    the mutant, and the op is not "ok" under the adapter it writes -- unmapped (n/a), or, where
    the row (``row_line``) is written, FAIL."""
    import numpy as np
    import pytest

    from minibert_spec.mutants import applied
    from minibert_spec.suite.infer import infer_source
    from tests.unshrunk import check_implementation

    want = fingerprint()
    with applied(name):
        try:
            got = fingerprint()
        except Exception:  # noqa: BLE001 -- the mutant changes what it computes: it applies
            got = []
    if len(got) == len(want) and all(np.shape(a) == np.shape(b) and np.array_equal(a, b)
                                     for a, b in zip(got, want)):
        pytest.skip(f"{name} does not change what the example's {op} code computes")
    with applied(name):
        source = infer_source(module)
        adapter = load_source(tmp_path, monkeypatch, source, f"inferred_{name}")
        report = check_implementation(adapter, ops=[op], first_red=True)
    verdict = report.verdicts()[op]
    assert verdict != "ok", f"{name} passes under the inferred adapter:\n{source}"
    if row_line in source:
        assert verdict == "FAIL", (verdict, report.summary())


def not_mapped_deviation(row: str, missing: list[str], cls: str) -> float:
    """The optimizer class ``cls`` that infer did not map (no row; one not-mapped line, its
    closest candidate adapter's ``optimizer(...)`` call): that line's relative deviation from
    the reference's adam_step."""
    assert row == "", row
    assert len(missing) == 1 and missing[0].startswith(f"class {cls}: optimizer("), missing
    return float(missing[0].split("differs from the reference adam_step by ")[1].split()[0])
