"""Nothing built on the user's clock (issue 40): the numeric functions of the SymPy derivations
are Python source generated at development time (``minibert regenerate``,
minibert_spec.equations._codegen) and committed in spec/equations/_generated; a check reads them
and runs no lambdify and no derivation.  Regenerating them changes no byte (the slow tier: it
derives every map, minutes), and they are the current equations' (else they are not used)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from minibert_spec.equations import _codegen
from minibert_spec.equations import _generated as generated
from minibert_spec.equations._generated import _current_index
from minibert_spec.equations._generated._index import DIGEST, INDEX
from tests import ROOT


def test_the_generated_maps_are_the_current_equations():
    """An equation edited and not regenerated: this fails (and the maps are built from SymPy
    meanwhile, never read stale)."""
    assert DIGEST == generated.equations_digest(), (
        "spec/equations changed since its maps were generated: run `minibert regenerate "
        "--no-matrix`")
    assert _current_index() == INDEX and len(INDEX) > 50


def test_an_edited_equation_is_not_read_from_stale_source(monkeypatch):
    monkeypatch.setattr(generated, "equations_digest", lambda: "an edited equation")
    _current_index.cache_clear()
    try:
        assert _current_index() == {}
    finally:
        monkeypatch.undo()
        _current_index.cache_clear()


# in a fresh process, as a worker has it: every SymPy <-> code map a check needs, with lambdify
# and every derivative refused; and the suite loaded without torch or transformers
NOTHING_BUILT = textwrap.dedent("""
    import sys
    import sympy
    import sympy.core.function
    import sympy.utilities.lambdify

    def refuse(*args, **kwargs):
        raise AssertionError("SymPy work during a check")

    sympy.lambdify = sympy.utilities.lambdify.lambdify = refuse
    sympy.core.function.Derivative.__new__ = staticmethod(refuse)
    from minibert_spec.suite import selected_checks
    from minibert_spec.suite.checks.sympy_code import build_sympy_maps, implementation_equations

    checks = selected_checks(deep=True)
    ids = implementation_equations()
    for eq_id in ids:
        build_sympy_maps(eq_id)
    modules = sorted(m for m in ("torch", "transformers") if m in sys.modules)
    # and the checks themselves on the reference: a map built at its first call (not when the
    # check is prepared) was never generated, and derived on the user's clock
    from minibert_spec.suite.run import run_check

    reds = [(r.id, r.message[:300]) for r in (run_check(c, "minibert_reference")
                                              for c in checks if c.kind == "sympy")
            if r.outcome not in ("passed", "n/a")]
    print(len(ids), modules, reds)
""")


def test_a_check_builds_no_sympy_map(tmp_path):
    r = subprocess.run([sys.executable, "-c", NOTHING_BUILT], cwd=ROOT, capture_output=True,
                       text=True, timeout=300,
                       env={**__import__("os").environ, "XDG_CACHE_HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-3000:]
    count, modules, reds = r.stdout.strip().split(maxsplit=2)
    assert int(count) > 40 and modules == "[]" and reds == "[]", r.stdout[-3000:]
    assert not (tmp_path / "minibert-spec").exists()  # and nothing written to the disk cache


@pytest.mark.slow  # derives every map from SymPy: minutes
def test_regenerating_the_maps_changes_no_byte():
    files = _codegen.generate()
    assert set(files) >= {"_index.py", "layernorm.py", "softmax.py"}
    assert _codegen.stale(files) == [], (
        "spec/equations/_generated is stale: run `minibert regenerate --no-matrix`")


# --------------------------------------------------------------------------- the checks' index
def test_the_checks_index_is_current():
    """The SymPy <-> code checks are listed from spec/equations/_generated/_checks.py: it is
    the equations' current one (else: `minibert regenerate --no-maps --no-matrix`)."""
    assert _codegen.stale({_codegen.CHECKS_INDEX: _codegen.checks_index()}, False) == [], (
        "spec/equations/_generated/_checks.py is stale: run `minibert regenerate --no-maps "
        "--no-matrix`")


def test_a_stale_checks_index_is_never_listed_from(monkeypatch):
    """An equation added (or its variant changed) without regenerating the index: the
    listing names the file and comes from the equations, never from the stale index (which
    would leave the new equation's check out: a green never earned)."""
    from minibert_spec.equations import load
    from minibert_spec.equations._generated import _checks, numeric_entries
    from minibert_spec.suite.checks import sympy_code

    current = numeric_entries(load())
    dropped = next(e for e in current if e.startswith("layernorm."))
    monkeypatch.setattr(_checks, "NUMERIC", [(k, v) for k, v in _checks.NUMERIC if k != dropped])
    monkeypatch.setitem(_checks.SOURCES, "layernorm.py", "0" * 64)
    sympy_code.numeric_equations.cache_clear()
    try:
        with pytest.warns(sympy_code.StaleIndexWarning, match=r"\(layernorm\.py changed"):
            listed = sympy_code.numeric_equations()
    finally:
        sympy_code.numeric_equations.cache_clear()
    assert listed == current and dropped in listed


# a fresh process as `minibert check` runs: the command line up to the moment the checks are
# dealt to the workers (run_isolated), with what the parent had imported by then
PARENT_IMPORTS = textwrap.dedent("""
    import json, os, sys
    os.environ["MINIBERT_FORKSERVER"] = "0"
    from minibert_spec.suite import pool

    def run_isolated(impl, checks, **kwargs):
        heavy = sorted({m.split(".")[0] for m in sys.modules} & {"sympy", "mpmath", "torch",
                                                                  "transformers"})
        print(json.dumps({"sympy_checks": sum(c.kind == "sympy" for c in checks),
                          "heavy": heavy}))
        raise SystemExit(0)

    pool.run_isolated = run_isolated
    from minibert_spec.cli import main

    sys.exit(main(["check", "minibert_reference", "--ops", "layernorm", "attention"]))
""")


def test_the_parent_lists_the_checks_without_sympy_torch_or_transformers():
    """SymPy (~0.5 s, and ~0.3 s more to load the equations), torch and transformers are the
    workers' (issue 40): the process that selects the checks imports none of them."""
    r = subprocess.run([sys.executable, "-c", PARENT_IMPORTS], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    seen = __import__("json").loads(r.stdout.strip().splitlines()[-1])
    assert seen["sympy_checks"] >= 10, seen
    assert seen["heavy"] == [], f"the parent imported {seen['heavy']}"


def test_the_fork_server_loads_the_equations_for_sympy_checks_alone():
    """The SymPy <-> code checks' equations are warmed once in the fork server (before the
    workers fork again), and only when such a check is selected."""
    import importlib.util

    from minibert_spec.suite import select
    from minibert_spec.suite.pool import KIND_PRELOAD, extra_groups

    assert extra_groups(select(kinds=["sympy"], ops=["layernorm"]), "off") == [
        KIND_PRELOAD["sympy"]]
    assert extra_groups(select(kinds=["fd"], ops=["layernorm"]), "off") == []
    assert all(importlib.util.find_spec(m) for m in KIND_PRELOAD["sympy"])
