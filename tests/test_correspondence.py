"""Correspondence is checked, not promised: every equation needs a SymPy proof or refutation, an
implementing function, a finite-difference test (if it states a gradient), an oracle test (if
torch has the op) and a SymPy <-> code check; every ID used anywhere must be defined.

``PENDING`` lists the evidence that other parts of the project deliver (the FD and oracle test
suites, ``reference/optim.py``); it is strict both ways -- a gap not listed fails, and a listed
gap that has been closed fails too, so the list can only shrink.  ``minibert audit`` reports the
same gaps and exits 1 while any remain.
"""

from __future__ import annotations

import textwrap

import pytest

from spec.audit import ROOT, TaggedTest, collect_implementations, join, scan_tests
from spec.equations import Equation, Proof, load

EQUATIONS = load()

_FD_ORACLE = ("fd", "oracle")
PENDING: dict[str, tuple[str, ...]] = {}

GAP_KINDS = {"no SymPy proof": "proof", "no implementing function": "impl",
             "no finite-difference test": "fd", "no oracle test": "oracle",
             "SymPy <-> code check cannot run": "numeric", "no SymPy <-> code check": "numeric",
             "target": "target", "ID used by": "unknown"}


def kinds(gaps) -> set[str]:
    out = set()
    for g in gaps:
        out |= {k for prefix, k in GAP_KINDS.items() if g.startswith(prefix)} or {g}
    return out


@pytest.fixture(scope="module")
def real_rows(impl):
    tests = scan_tests(ROOT / "tests", EQUATIONS)
    return {r.id: r for r in join(EQUATIONS, collect_implementations(impl), tests, impl=impl,
                                  run_proofs=False)}


@pytest.mark.parametrize("eq_id", sorted(EQUATIONS))
def test_equation_evidence(real_rows, eq_id):
    row = real_rows[eq_id]
    expected = set(PENDING.get(eq_id, ()))
    got = kinds(row.gaps)
    assert got <= expected, f"{eq_id}: gaps {sorted(got - expected)}: {row.gaps}"
    assert expected <= got, (f"{eq_id}: {sorted(expected - got)} is no longer missing -- remove "
                             "it from PENDING in tests/test_correspondence.py")


def test_no_unknown_ids(real_rows):
    unknown = {i: r.gaps for i, r in real_rows.items() if r.kind == "unknown"}
    assert not unknown, f"IDs used by code or tests but not defined in spec/equations: {unknown}"


def test_pending_names_real_equations():
    assert set(PENDING) <= set(EQUATIONS)


def test_static_scan_agrees_with_pytest_markers(request):
    """The AST scan finds at least the equation IDs pytest attaches to every collected test
    (the audit runs without collecting, so it must not miss what collection sees)."""
    scanned = {}
    for t in scan_tests(ROOT / "tests", EQUATIONS):
        scanned.setdefault((t.file.split("/")[-1], t.name.split(".")[-1]), set()).update(t.ids)
    missing = {}
    for item in request.session.items:
        ids = {a for m in item.iter_markers("equation") for a in m.args}
        if not ids:
            continue
        key = (item.path.name, getattr(item, "originalname", item.name))
        if not ids <= scanned.get(key, set()):
            missing[item.nodeid] = sorted(ids - scanned.get(key, set()))
    assert not missing, f"tags pytest sees that the static scan misses: {missing}"


# --------------------------------------------------------------------------- synthetic data
def _write(root, name, text):
    path = root / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def synthetic_tests(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    _write(tests, "__init__.py", "")
    _write(tests, "fdhelp.py", """
        import pytest
        from spec.gradcheck import elementwise_check

        class Op:
            def __init__(self, name, equations):
                self.name, self.equations = name, equations

        OPS = [Op("a", ("eq.a", "eq.b"))]

        def op_params():
            return [pytest.param(op, marks=pytest.mark.equation(*op.equations)) for op in OPS]

        def check_op(op):
            return elementwise_check(None, None, None)
        """)
    _write(tests, "test_synth.py", """
        import pytest
        from spec.gradcheck import directional_check
        from tests.fdhelp import check_op, op_params

        IDS = ("eq.c",)

        def _helper():
            return directional_check(None, None, None)

        @pytest.mark.equation("eq.a")
        def test_fd_direct():
            _helper()

        @pytest.mark.equation(*IDS)
        def test_tagged_not_fd():
            assert True

        @pytest.mark.parametrize("op", op_params())
        def test_dynamic(op):
            check_op(op)

        def test_untagged():
            _helper()

        @pytest.mark.equation("eq.d")
        class TestGroup:
            def test_in_class(self):
                pass
        """)
    _write(tests, "test_oracle_synth.py", """
        import pytest

        pytestmark = [pytest.mark.oracle, pytest.mark.equation("eq.b")]

        def test_module_marked():
            pass
        """)
    return tests


def test_scanner_on_synthetic_tests(synthetic_tests):
    known = {"eq.a", "eq.b", "eq.c", "eq.d"}
    got = {t.name: (t.ids, t.oracle, t.fd) for t in scan_tests(synthetic_tests, known)}
    assert got == {
        "test_fd_direct": (("eq.a",), False, True),
        "test_tagged_not_fd": (("eq.c",), False, False),
        "test_dynamic": (("eq.a", "eq.b"), False, True),  # marks built in tests/fdhelp.py
        "TestGroup.test_in_class": (("eq.d",), False, False),
        "test_module_marked": (("eq.b",), True, False),
    }


def _eq(id, **kw):
    kw.setdefault("numeric_na", "synthetic")
    return Equation(id, id, ("synthetic §1",), "x", lambda: Proof("proven", (1,)), **kw)


def _synthetic():
    from spec.audit import ImplRef
    eqs = {e.id: e for e in (
        _eq("op.forward", torch_op="torch.op"),
        _eq("op.backward", gradient=True, torch_op="torch.op"),
        _eq("op.helper"),
        Equation("op.doc", "doc form", ("synthetic §2",), "x",
                 lambda: Proof("refuted", (1,), "at x=1: 2 vs 3"), kind="document",
                 expected="refuted", target="op.backward"))}
    impls = {i: [ImplRef(f"mod.{i}", "mod.py", 1)] for i in ("op.forward", "op.backward",
                                                             "op.helper")}
    tests = [TaggedTest("tests/t.py", "test_fd", 1, ("op.backward",), False, True),
             TaggedTest("tests/t.py", "test_oracle", 2, ("op.forward", "op.backward"), True, False)]
    return eqs, impls, tests


def _gaps(eqs, impls, tests):
    return {r.id: sorted(kinds(r.gaps)) + [f"R:{x}" for x in r.regressions]
            for r in join(eqs, impls, tests) if r.gaps or r.regressions}


def test_join_on_synthetic_registry():
    eqs, impls, tests = _synthetic()
    assert _gaps(eqs, impls, tests) == {}
    rows = {r.id: r for r in join(eqs, impls, tests)}
    assert rows["op.doc"].verdict == "refuted (code: op.backward)"
    assert rows["op.doc"].fd_tests == ["tests/t.py::test_fd"]  # the target's evidence
    assert rows["op.backward"].verdict == "verified"


@pytest.mark.parametrize("delete", ["proof", "implementation tag", "fd test", "oracle test",
                                    "document target", "recorded verdict", "unknown id"])
def test_join_flags_every_deletion(delete):
    """Deleting any piece of evidence makes exactly the expected gap (or regression) appear."""
    eqs, impls, tests = _synthetic()
    if delete == "proof":
        eqs["op.helper"].proof = None
        want = {"op.helper": ["proof"]}
    elif delete == "implementation tag":
        del impls["op.forward"]
        want = {"op.forward": ["impl"]}
    elif delete == "fd test":
        tests = [t for t in tests if not t.fd]
        want = {"op.backward": ["fd"]}
    elif delete == "oracle test":
        tests = [t for t in tests if not t.oracle]
        want = {"op.forward": ["oracle"], "op.backward": ["oracle"]}
    elif delete == "document target":
        eqs["op.doc"].target = "op.gone"
        want = {"op.doc": ["target"]}
    elif delete == "recorded verdict":
        eqs["op.doc"].expected = "proven"
        want = {"op.doc": ["R:SymPy gives refuted, recorded proven"]}
    else:
        tests = tests + [TaggedTest("tests/t.py", "test_typo", 3, ("op.fowrard",), False, True)]
        want = {"op.fowrard": ["unknown"]}
    assert _gaps(eqs, impls, tests) == want


def test_join_flags_deletions_in_the_real_data(impl):
    """The same on the project's own equations, implementations and tests."""
    tests = scan_tests(ROOT / "tests", EQUATIONS)
    impls = collect_implementations(impl)
    eq_id = "softmax.jacobian"
    base = {r.id: kinds(r.gaps) for r in join(EQUATIONS, impls, tests, run_proofs=False)}
    assert base[eq_id] == set()
    no_tag = {k: v for k, v in impls.items() if k != eq_id}
    no_fd = [t for t in tests if not (t.fd and eq_id in t.ids)]
    no_oracle = [t for t in tests if not (t.oracle and eq_id in t.ids)]
    for args, gap in (((EQUATIONS, no_tag, tests), "impl"), ((EQUATIONS, impls, no_fd), "fd"),
                      ((EQUATIONS, impls, no_oracle), "oracle")):
        rows = {r.id: kinds(r.gaps) for r in join(*args, run_proofs=False)}
        assert rows[eq_id] == {gap}
    saved = EQUATIONS[eq_id].proof
    try:
        EQUATIONS[eq_id].proof = None
        rows = {r.id: kinds(r.gaps) for r in join(EQUATIONS, impls, tests, run_proofs=False)}
        assert rows[eq_id] == {"proof"}
    finally:
        EQUATIONS[eq_id].proof = saved
