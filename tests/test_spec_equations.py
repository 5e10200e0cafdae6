"""Every equation's SymPy check (proven / refuted with a printed counterexample / convention)
and, for the derivations the reference implements, lambdified SymPy == the implementation on
Hypothesis float64 inputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from spec.equations import load
from spec.tolerances import SYMPY_CODE_FLOOR, SYMPY_CODE_RTOL

EQUATIONS = load()


def _params(with_numeric: bool):
    # no equation markers: these tests iterate the spec itself, they are not evidence *for* it
    return [pytest.param(e.id, id=e.id)
            for e in EQUATIONS.values() if not with_numeric or e.numeric is not None]


@pytest.mark.parametrize("eq_id", _params(False))
def test_sympy_verdict(eq_id):
    """Proven at every size tried, or refuted by a concrete counterexample (printed), or a
    convention (both readings checked): exactly the verdict the spec records."""
    eq = EQUATIONS[eq_id]
    proof = eq.run_proof()
    print(f"{eq_id}: {proof.status} at sizes {proof.sizes}; {proof.detail}")
    assert proof.status == eq.expected, (
        f"{eq_id}: SymPy gives {proof.status}, the spec records {eq.expected}: {proof.detail}")
    if proof.status in ("refuted", "convention"):
        assert proof.detail, f"{eq_id}: a {proof.status} verdict needs its counterexample"
    assert proof.sizes, f"{eq_id}: no size recorded"


def _arrays(spec: dict):
    """Hypothesis strategies for a Numeric.inputs spec (bounded elements, small shapes)."""
    out = {}
    for name, s in spec.items():
        if s[0] == "float":
            out[name] = hnp.arrays(np.float64, s[1], elements=st.floats(
                -s[2], s[2], allow_nan=False, allow_infinity=False, allow_subnormal=False))
        elif s[0] == "float_away":  # magnitude in [margin, bound], either sign
            mag = hnp.arrays(np.float64, s[1], elements=st.floats(s[3], s[2]))
            sign = hnp.arrays(np.float64, s[1], elements=st.sampled_from([-1.0, 1.0]))
            out[name] = st.tuples(mag, sign).map(lambda ms: ms[0] * ms[1])
        elif s[0] == "int":
            out[name] = hnp.arrays(np.int64, s[1], elements=st.integers(0, s[2] - 1))
        else:
            out[name] = hnp.arrays(np.bool_, s[1], elements=st.booleans())
    return st.fixed_dictionaries(out)


def _error(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = max(np.max(np.abs(a), initial=0.0), np.max(np.abs(b), initial=0.0), SYMPY_CODE_FLOOR)
    return float(np.max(np.abs(a - b), initial=0.0) / scale)


@pytest.mark.parametrize("eq_id", _params(True))
@given(data=st.data())
def test_sympy_matches_code(impl, eq_id, data):
    """The lambdified SymPy map (forward, or the backward derived with sympy.diff) equals the
    implementation's function within SYMPY_CODE_RTOL."""
    num = EQUATIONS[eq_id].numeric
    missing = [n for n in num.needs if not hasattr(impl, n)]
    if missing:
        pytest.skip(f"implementation lacks {missing} (pending; the audit lists it as a gap)")
    size = data.draw(st.sampled_from(num.sizes), label="size")
    arrays = data.draw(_arrays(num.inputs(size)), label="inputs")
    if num.accept is not None:
        assume(num.accept(size, **arrays))
    expected = num.sympy(size)(**arrays)
    got = num.code(impl, size, **arrays)
    assert len(got) == len(expected)
    for k, (a, b) in enumerate(zip(got, expected)):
        assert np.shape(a) == np.shape(b), f"{eq_id} output {k}: shape {np.shape(a)} vs SymPy " \
                                           f"{np.shape(b)}"
        err = _error(a, b)
        assert err <= SYMPY_CODE_RTOL, (
            f"{eq_id} output {k} at size {size}: error {err:.2e} > {SYMPY_CODE_RTOL:g}\n"
            f"code  {np.asarray(a)}\nsympy {np.asarray(b)}")


def test_every_derivation_is_checked_against_code():
    """A derivation either has a SymPy <-> code check or says why none applies."""
    missing = [e.id for e in EQUATIONS.values()
               if e.kind == "derivation" and e.numeric is None and not e.numeric_na]
    assert not missing, f"derivations without a SymPy <-> code check: {missing}"


def test_document_entries_point_at_derivations():
    bad = {e.id: e.target for e in EQUATIONS.values()
           if e.kind == "document" and (e.target not in EQUATIONS
                                        or EQUATIONS[e.target].kind != "derivation")}
    assert not bad, f"document entries whose target is not a derivation: {bad}"


def test_refutation_detects_a_wrong_closed_form():
    """The comparison machinery itself: a closed form with a wrong sign is refuted with
    numbers, the right one proven (guards against a compare() that always says 'equal')."""
    from spec.equations import layernorm as ln
    from spec.equations._sym import compare
    r = ln.row(3)
    ok, _ = compare(r["dx"], ln.closed_dx(r), r["aux"])
    wrong_ok, detail = compare(r["dx"], -ln.closed_dx(r), r["aux"])
    assert ok and not wrong_ok and "sympy.diff gives" in detail


def test_each_id_prefix_is_its_module():
    """One hop from an ID to its file: ``softmax.jacobian`` is registered by
    spec/equations/softmax.py, at the file:line the audit prints."""
    import linecache
    from pathlib import Path

    wrong = {}
    for e in EQUATIONS.values():
        prefix = e.id.split(".")[0]
        line = linecache.getline(e.file, e.line)
        if e.module != f"spec.equations.{prefix}" or Path(e.file).name != f"{prefix}.py" \
                or "register(" not in line:
            wrong[e.id] = (e.module, e.where, line.strip())
    assert not wrong, f"equations registered outside spec/equations/<prefix>.py: {wrong}"


def test_modules_are_discovered():
    """load() imports every public module of spec/equations (no list to keep in sync); each of
    them registers equations, the private helpers (_sym, _nn) none."""
    from pathlib import Path

    import spec.equations as pkg

    files = {p.stem for p in Path(pkg.__file__).parent.glob("*.py") if p.stem != "__init__"}
    assert set(pkg.modules()) == {f for f in files if not f.startswith("_")}
    registering = {e.module.rsplit(".", 1)[-1] for e in EQUATIONS.values()}
    assert registering == set(pkg.modules())
