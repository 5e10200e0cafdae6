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
    print(len(ids), sorted(m for m in ("torch", "transformers") if m in sys.modules))
""")


def test_a_check_builds_no_sympy_map(tmp_path):
    r = subprocess.run([sys.executable, "-c", NOTHING_BUILT], cwd=ROOT, capture_output=True,
                       text=True, timeout=300,
                       env={**__import__("os").environ, "XDG_CACHE_HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-3000:]
    count, modules = r.stdout.split(maxsplit=1)
    assert int(count) > 40 and modules.strip() == "[]"
    assert not (tmp_path / "minibert-spec").exists()  # and nothing written to the disk cache


@pytest.mark.slow  # derives every map from SymPy: minutes
def test_regenerating_the_maps_changes_no_byte():
    files = _codegen.generate()
    assert set(files) >= {"_index.py", "layernorm.py", "softmax.py"}
    assert _codegen.stale(files) == [], (
        "spec/equations/_generated is stale: run `minibert regenerate --no-matrix`")
