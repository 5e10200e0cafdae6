"""Correspondence is checked, not promised: every equation needs a SymPy proof or refutation, an
implementing function, a finite-difference test (if it states a gradient), an oracle test (if
torch has the op) and a SymPy <-> code check; every ID used anywhere must be defined.

``PENDING`` lists the evidence that other parts of the project deliver (the FD and oracle test
suites, ``reference/optim.py``); it is strict both ways -- a gap not listed fails, and a listed
gap that has been closed fails too, so the list can only shrink.  ``minibert audit`` reports the
same gaps and exits 1 while any remain.

The test side comes from ``pytest --collect-only`` (a subprocess, as the audit runs it): each
collected case with the IDs its markers carry, however they are built.  Synthetic test
directories check the collection (per-case marks, op-table marks, classes, ``pytestmark``, the FD
rule, ``--impl`` passthrough), the join (untagged equation, unknown ID) and that a collection
error fails loudly.
"""

from __future__ import annotations

import textwrap

import pytest

from minibert_spec.audit import (
    ROOT,
    ImplRef,
    TaggedTest,
    collect_implementations,
    join,
    scan_tests,
    tagged_tests,
)
from minibert_spec.components import COMPONENTS
from minibert_spec.equations import Equation, Proof, load
from minibert_spec.evidence import CollectionError, collect_items

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
def real_records():
    """pytest --collect-only of the project's tests (a subprocess, as `minibert audit` runs it)."""
    return collect_items(ROOT / "tests")


@pytest.fixture(scope="module")
def real_tests(real_records):
    return tagged_tests(real_records, ROOT / "tests")


@pytest.fixture(scope="module")
def real_rows(impl, real_tests):
    return {r.id: r for r in join(EQUATIONS, collect_implementations(impl), real_tests, impl=impl,
                                  run_proofs=False, components=COMPONENTS)}


@pytest.mark.parametrize("eq_id", sorted(EQUATIONS))
def test_equation_evidence(real_rows, eq_id):
    row = real_rows[eq_id]
    expected = set(PENDING.get(eq_id, ()))
    got = kinds(row.gaps)
    assert got <= expected, f"{eq_id}: gaps {sorted(got - expected)}: {row.gaps}"
    assert expected <= got, (f"{eq_id}: {sorted(expected - got)} is no longer missing -- remove "
                             "it from PENDING in tests/equations/test_correspondence.py")


def test_no_unknown_ids(real_rows):
    unknown = {i: r.gaps for i, r in real_rows.items() if r.kind == "unknown"}
    assert not unknown, f"IDs used by code or tests but not defined in spec/equations: {unknown}"


@pytest.mark.parametrize("component_id", sorted(COMPONENTS))
def test_component_evidence(real_rows, component_id):
    """A component (spec/components.py) has an implementation and tagged tests."""
    row = real_rows[component_id]
    assert row.kind == "component" and not row.gaps, row.gaps
    assert row.implementations and row.tests


def test_pending_names_real_equations():
    assert set(PENDING) <= set(EQUATIONS)


def test_rows_carry_every_site(real_rows):
    """Each row names its definition (spec/equations/<prefix>.py:line), its implementing
    functions (file:line) and its test cases at case granularity (nodeids)."""
    for eq_id, row in real_rows.items():
        prefix = eq_id.split(".")[0]
        home = "spec/components.py" if row.kind == "component" else f"spec/equations/{prefix}.py"
        assert row.where.startswith(f"{home}:"), (eq_id, row.where)
        assert all(i.endswith(")") and ":" in i.rsplit(" (", 1)[-1]
                   for i in row.implementations), (eq_id, row.implementations)
    cases = real_rows["layernorm.backward.dx"].fd_tests
    assert "tests/suite/test_suite_reference.py::test_conformance[fd[layernorm]]" in cases
    assert not any(c.endswith("[softmax]") for c in cases), "another op's case credited"


def test_collection_agrees_with_this_session(request, real_records):
    """The audit's collection subprocess attaches the same equation IDs to every test case as
    this pytest session does (for the cases this session collected)."""
    by_nodeid = {r["nodeid"]: set(r["ids"]) for r in real_records}
    wrong = {}
    for item in request.session.items:
        ids = {a for m in item.iter_markers("equation") for a in m.args}
        ids |= {a for m in item.iter_markers("suite_check")
                for a in m.kwargs.get("equations", ())}
        if item.nodeid not in by_nodeid:
            wrong[item.nodeid] = "not collected by the audit"
        elif by_nodeid[item.nodeid] != ids:
            wrong[item.nodeid] = (sorted(ids), sorted(by_nodeid[item.nodeid]))
    assert not wrong, f"session vs audit collection: {wrong}"


# --------------------------------------------------------------------------- synthetic data
def _write(root, name, text):
    path = root / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture(scope="module")
def synthetic_tests(tmp_path_factory):
    tests = tmp_path_factory.mktemp("synthetic") / "tests"
    tests.mkdir()
    _write(tests, "__init__.py", "")
    _write(tests, "fdhelp.py", """
        import pytest
        from minibert_spec.numerics.finite_differences import elementwise_check

        class Op:
            def __init__(self, name, equations):
                self.name, self.equations = name, equations

        OPS = {"a": Op("a", ("eq.a",)), "b": Op("b", ("eq.b",))}

        def op_params():
            return [pytest.param(op, id=op.name, marks=pytest.mark.equation(*op.equations))
                    for op in OPS.values()]

        def check_op(op):
            return elementwise_check(None, None, None)
        """)
    _write(tests, "test_synth.py", """
        import os

        import pytest
        from minibert_spec.numerics.finite_differences import directional_check
        from tests.fdhelp import OPS, check_op, op_params

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

        @pytest.mark.equation(*OPS["a"].equations)
        def test_op_table():
            pass

        def test_untagged():
            _helper()

        @pytest.mark.equation("eq.d")
        class TestGroup:
            def test_in_class(self):
                pass

        @pytest.mark.equation("eq.typo")
        def test_unknown_id():
            pass

        @pytest.mark.parametrize("impl", [os.environ.get("MINIBERT_IMPL", "unset")])
        def test_impl_passed(impl):
            pass
        """)
    _write(tests, "test_oracle_synth.py", """
        import pytest

        pytestmark = [pytest.mark.oracle, pytest.mark.equation("eq.b")]

        def test_module_marked():
            pass
        """)
    return tests


@pytest.fixture(scope="module")
def synthetic_records(synthetic_tests):
    return collect_items(synthetic_tests, impl_spec="pkg.mod:obj")


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_collection_on_synthetic_tests(synthetic_tests, synthetic_records):
    got = {t.nodeid: (t.ids, t.oracle, t.fd)
           for t in tagged_tests(synthetic_records, synthetic_tests)}
    s, o = "tests/test_synth.py::", "tests/test_oracle_synth.py::"
    assert got == {
        s + "test_fd_direct": (("eq.a",), False, True),
        s + "test_tagged_not_fd": (("eq.c",), False, False),
        s + "test_dynamic[a]": (("eq.a",), False, True),  # marks built in tests/fdhelp.py
        s + "test_dynamic[b]": (("eq.b",), False, True),  # per case, not per function
        s + "test_op_table": (("eq.a",), False, False),  # mark from an op table: dynamic
        s + "TestGroup::test_in_class": (("eq.d",), False, False),
        s + "test_unknown_id": (("eq.typo",), False, False),
        o + "test_module_marked": (("eq.b",), True, False),
    }
    nodeids = {r["nodeid"] for r in synthetic_records}
    assert s + "test_untagged" in nodeids  # collected, but no evidence for anything
    assert s + "test_impl_passed[pkg.mod:obj]" in nodeids  # impl_spec reaches the tests


def test_join_on_synthetic_collection(synthetic_tests, synthetic_records):
    """The collected synthetic tests joined with a synthetic registry: an equation no test is
    tagged with is a gap, an FD-only equation lacks its oracle test, an ID only a test uses is
    reported."""
    eqs = {e.id: e for e in (_eq("eq.a", gradient=True, torch_op="torch.a"),
                             _eq("eq.b", gradient=True, torch_op="torch.b"),
                             _eq("eq.c"), _eq("eq.d"),
                             _eq("eq.untagged", gradient=True))}
    impls = {i: [ImplRef(f"mod.{i}", "mod.py", 1)] for i in eqs}
    rows = {r.id: r for r in join(eqs, impls, tagged_tests(synthetic_records, synthetic_tests))}
    assert {i: kinds(r.gaps) for i, r in rows.items() if r.gaps} == {
        "eq.a": {"oracle"}, "eq.untagged": {"fd"}, "eq.typo": {"unknown"}}
    assert rows["eq.b"].fd_tests == ["tests/test_synth.py::test_dynamic[b]"]
    assert rows["eq.b"].oracle_tests == ["tests/test_oracle_synth.py::test_module_marked"]
    assert "tests/test_synth.py::test_unknown_id" in rows["eq.typo"].gaps[0]


def test_collection_error_fails_loudly(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    _write(tests, "test_ok.py", """
        import pytest

        @pytest.mark.equation("eq.a")
        def test_ok():
            pass
        """)
    _write(tests, "test_broken.py", "import a_module_that_does_not_exist\n")
    with pytest.raises(CollectionError, match="a_module_that_does_not_exist"):
        scan_tests(tests)
    with pytest.raises(CollectionError, match="does not exist"):
        collect_items(tmp_path / "no_such_dir")


def _eq(id, **kw):
    kw.setdefault("numeric_na", "synthetic")
    return Equation(id, id, ("synthetic §1",), "x", lambda: Proof("proven", (1,)), **kw)


def _synthetic():
    eqs = {e.id: e for e in (
        _eq("op.forward", torch_op="torch.op"),
        _eq("op.backward", gradient=True, torch_op="torch.op"),
        _eq("op.helper"),
        Equation("op.doc", "doc form", ("synthetic §2",), "x",
                 lambda: Proof("refuted", (1,), "at x=1: 2 vs 3"), kind="document",
                 expected="refuted", target="op.backward"))}
    impls = {i: [ImplRef(f"mod.{i}", "mod.py", 1)] for i in ("op.forward", "op.backward",
                                                             "op.helper")}
    tests = [TaggedTest("tests/t.py::test_fd[x]", "tests/t.py", "test_fd", 1, ("op.backward",),
                        False, True),
             TaggedTest("tests/t.py::test_oracle", "tests/t.py", "test_oracle", 2,
                        ("op.forward", "op.backward"), True, False)]
    return eqs, impls, tests


def _gaps(eqs, impls, tests):
    return {r.id: sorted(kinds(r.gaps)) + [f"R:{x}" for x in r.regressions]
            for r in join(eqs, impls, tests) if r.gaps or r.regressions}


def test_join_on_synthetic_registry():
    eqs, impls, tests = _synthetic()
    assert _gaps(eqs, impls, tests) == {}
    rows = {r.id: r for r in join(eqs, impls, tests)}
    assert rows["op.doc"].verdict == "refuted (code: op.backward)"
    assert rows["op.doc"].fd_tests == ["tests/t.py::test_fd[x]"]  # the target's evidence
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
        tests = tests + [TaggedTest("tests/t.py::test_typo", "tests/t.py", "test_typo", 3,
                                    ("op.fowrard",), False, True)]
        want = {"op.fowrard": ["unknown"]}
    assert _gaps(eqs, impls, tests) == want


def test_join_flags_deletions_in_the_real_data(impl, real_tests):
    """The same on the project's own equations, implementations and tests."""
    tests = real_tests
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
