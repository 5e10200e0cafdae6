"""Issue 23 (adapters in a few lines; every red says what differed): declarative class-layer
adapters and their accumulation check, the optimizer contract supplied by the suite, guards
judged as guards, reds that name the tensor, the index and both values, and
``minibert adapter new``."""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from minibert_spec.cli import main as minibert
from minibert_spec.suite.run import check_settings
from tests import ROOT
from tests.examples import accum_layers, classy_adapter, guarded_optim, realstyle_minigpt
from tests.unshrunk import check_implementation

EXAMPLES = {accum_layers: ["linear", "layernorm", "relu"],
            guarded_optim: ["cross_entropy", "adam", "clip"]}
# "<what>: ... index (i, j): <ours> X, <theirs> Y": the tensor, the index and both values
NAMED = re.compile(r"index \([0-9, ]*\):? (got|ours|analytic|code) [-+0-9.e]+,? "
                   r"(expected|torch|finite difference|sympy) [-+0-9.e]+")


def _verdicts(report):
    return report.verdicts()


# ----------------------------------------------------------------- the examples
@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("module", list(EXAMPLES), ids=lambda m: m.__name__.split(".")[-1])
def test_correct_example_is_green_in_its_rows_and_na_elsewhere(module, monkeypatch):
    monkeypatch.setattr(module, "BUGS", set())
    report = check_implementation(module, ops=EXAMPLES[module])
    got = {op: v for op, v in _verdicts(report).items() if v != "n/a"}
    assert got == dict.fromkeys(EXAMPLES[module], "ok"), {
        r.id: r.message for r in report.failures()}
    rest = check_implementation(module, quick=True, oracle="off")
    assert {op for op, v in _verdicts(rest).items() if v != "n/a"} == set(EXAMPLES[module])


BUGGY = [(m, op) for m, ops in EXAMPLES.items() for op in ops if op != "relu"]


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("module,bug", BUGGY,
                         ids=[f"{m.__name__.split('.')[-1]}-{op}" for m, op in BUGGY])
def test_buggy_example_is_red_on_exactly_its_op_naming_index_and_values(module, bug,
                                                                        monkeypatch):
    monkeypatch.setattr(module, "BUGS", {bug})
    report = check_implementation(module, ops=EXAMPLES[module],
                                  kinds=["fd", "invariant", "oracle"])
    assert [op for op, v in _verdicts(report).items() if v == "FAIL"] == [bug]
    messages = [r.message for r in report.failures()]
    assert any(NAMED.search(m) for m in messages), messages


def test_accumulation_bug_is_seen_only_by_the_accumulation_check(monkeypatch):
    """'=' for one gradient where the others have '+=': right on one backward (FD, oracle
    green), wrong when gradients accumulate -- the check names the attribute and the fix."""
    monkeypatch.setattr(accum_layers, "BUGS", {"linear"})
    report = check_implementation(accum_layers, ops=["linear"])
    failed = {r.id: r.message for r in report.failures()}
    assert list(failed) == ["invariant[linear.grad_accumulates]"]
    msg = failed["invariant[linear.grad_accumulates]"]
    assert "db (layer attribute 'b.grad')" in msg and "= instead of +=" in msg
    assert NAMED.search(msg)


def test_an_undeclared_accumulation_is_named(monkeypatch):
    """A layer that accumulates, adapted with accumulate=False: the declaration is wrong."""
    from minibert_spec.suite.adapters import layer

    fwd, bwd = layer("linear", lambda W: accum_layers.Linear(*W.shape),
                     params={"W": "W.value", "b": "b.value"},
                     grads={"W": "W.grad", "b": "b.grad"})
    impl = type("Undeclared", (), {"linear_forward": staticmethod(fwd),
                                   "linear_backward": staticmethod(bwd)})()
    report = check_implementation(impl, ids=["invariant[linear.grad_accumulates]"])
    (r,) = report.failures()
    assert "declare accumulate=True" in r.message


# ----------------------------------------------------------------- adapters in a few lines
def _adapter_lines(path: Path) -> int:
    text = path.read_text()
    marker = "-" * 77 + " the adapter"
    body = text.split(marker, 1)[1] if marker in text else text
    return len(body.strip().splitlines())


@pytest.mark.parametrize("name", ["classy_adapter", "accum_layers", "realstyle_tutorial",
                                  "realstyle_minigpt", "realstyle_numpy_transformer"])
def test_class_style_adapters_are_at_most_30_lines(name):
    assert _adapter_lines(ROOT / "tests" / "examples" / f"{name}.py") <= 30


def test_layer_refuses_names_that_are_not_protocol_arguments():
    from minibert_spec.suite.adapters import layer

    with pytest.raises(ValueError, match=r"grads names \['weight'\]"):
        layer("linear", lambda W: None, grads={"weight": "dW"})


def test_layer_without_a_class_needs_a_forward_function_and_no_attributes():
    from minibert_spec.suite.adapters import layer

    with pytest.raises(ValueError, match="new=None .* needs a function as forward"):
        layer("relu", None)
    with pytest.raises(ValueError, match="pass the arguments as inputs"):
        layer("linear", None, forward=np.matmul, params={"W": "W"})


def test_an_unmapped_protocol_keyword_is_not_applicable_never_dropped():
    from minibert_spec.protocol import NotApplicable

    with pytest.raises(NotApplicable, match="takes no reduction"):
        classy_adapter.cross_entropy_forward(np.zeros((2, 3)), np.array([0, 1]),
                                             reduction="sum")


# ----------------------------------------------------------------- the optimizer contract
def test_the_suite_supplies_no_decay_and_clip_eps_and_says_so(monkeypatch):
    monkeypatch.setattr(guarded_optim, "BUGS", set())
    report = check_implementation(guarded_optim, ops=["adam", "clip"])
    assert {op: v for op, v in _verdicts(report).items() if v != "n/a"} == {"adam": "ok",
                                                                             "clip": "ok"}
    conventions = report.conventions()
    assert any("has no no_decay keyword" in c for c in conventions["adam"])
    assert any("has no eps keyword" in c for c in conventions["clip"])
    # the default rule is really applied: the undecayed tensors do not move with zero grads
    from minibert_spec.protocol import ImplProxy

    proxy = ImplProxy(guarded_optim, "g")
    params = {"embeddings.token.W": np.ones((2, 2)), "mlm.W": np.ones((2, 2))}
    zero = {k: np.zeros_like(v) for k, v in params.items()}
    new, _ = proxy.adam_step(params, zero, proxy.adam_init(params), lr=0.1, weight_decay=0.5)
    assert np.array_equal(new["embeddings.token.W"], params["embeddings.token.W"])
    assert np.allclose(new["mlm.W"], 0.95)


# ----------------------------------------------------------------- guards
@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_an_undeclared_log_guard_is_red_and_named(monkeypatch):
    monkeypatch.setattr(guarded_optim, "BUGS", set())
    monkeypatch.setattr(guarded_optim, "CAPABILITIES", {})
    report = check_implementation(guarded_optim, ops=["cross_entropy"], kinds=["invariant"])
    text = " ".join(r.message for r in report.failures())
    assert _verdicts(report)["cross_entropy"] == "FAIL"
    assert "CAPABILITIES['guards']" in text and "log_eps" in text


def test_an_undeclared_clip_guard_is_red_naming_the_eps_it_implies(monkeypatch):
    monkeypatch.setattr(realstyle_minigpt, "BUGS", set())
    monkeypatch.setitem(realstyle_minigpt.CAPABILITIES, "guards", {})
    report = check_implementation(realstyle_minigpt, ops=["clip"], quick=True)
    (r,) = report.failures()
    assert "divisor guard norm + eps with eps = 1e-06" in r.message
    assert "CAPABILITIES['guards'] = {'clip_eps': 1e-06}" in r.message
    monkeypatch.setitem(realstyle_minigpt.CAPABILITIES, "guards", {"clip_eps": 1e-6})
    report = check_implementation(realstyle_minigpt, ops=["clip"], quick=True)
    assert not report.failures()
    assert any("clip_eps=1e-06" in c for c in report.conventions()["clip"])


def test_a_guard_too_large_to_be_a_guard_is_refused():
    from minibert_spec.protocol import ImplProxy

    class Impl:
        CAPABILITIES = {"guards": {"log_eps": 0.1}}

    with pytest.raises(ValueError, match=r"guards'\]\['log_eps'\]: expected a number"):
        ImplProxy(Impl(), "big")


# ----------------------------------------------------------------- every red says what differed
def test_no_bare_assert_in_the_suite():
    """An ``assert x`` without a message fails as "AssertionError: " with nothing to read."""
    bare = []
    for path in sorted((ROOT / "spec").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assert) and node.msg is None:
                bare.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bare, f"asserts without a message: {bare}"


def test_hypothesis_reports_one_failure_never_an_exception_group():

    assert check_settings().report_multiple_bugs is False


class _Broken:
    """The reference with every protocol function made wrong in one of four ways, by name:
    values off by 10%, an extra axis, float64 out of float32, or a ValueError with no
    message."""

    def __init__(self, how):
        import minibert_reference

        self._ref, self._how = minibert_reference, how

    def __getattr__(self, name):
        fn = getattr(self._ref, name)
        if name.startswith("_") or not callable(fn) or name in ("param_shapes", "init_params"):
            return fn
        how = self._how

        def spoil(v):
            if isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.floating):
                return {"values": v * 1.1, "shape": v[None], "dtype": v.astype(np.float64)
                        if v.dtype == np.float32 else v.astype(np.float32)}[how]
            if isinstance(v, tuple):
                return tuple(spoil(x) for x in v)
            if isinstance(v, dict):
                return {k: spoil(x) for k, x in v.items()}
            if isinstance(v, float) and how == "values":
                return v * 1.1
            return v

        def wrong(*args, **kwargs):
            if how == "raise":
                raise ValueError()
            out = fn(*args, **kwargs)
            if name.endswith("_forward") and isinstance(out, tuple) and len(out) == 2:
                return spoil(out[0]), out[1]  # the cache stays usable
            return spoil(out)

        return wrong


@pytest.mark.slow  # every check, once per spoiling: 20-60 s each (issue 40)
@pytest.mark.parametrize("how", ["values", "shape", "dtype", "raise"])
def test_no_check_fails_with_an_empty_message(how):
    """Every check on an implementation broken four ways: each failure's first line says
    something (never "AssertionError" alone, never Hypothesis's "N distinct failures"), and
    each failure ends with the line that reruns it."""
    from hypothesis import Phase, settings

    from minibert_spec.suite import all_checks
    from minibert_spec.suite.run import run_check

    quick = settings(check_settings(max_examples=2), phases=[Phase.explicit, Phase.generate])
    impl = _Broken(how)
    failed = 0
    for check in all_checks():
        if check.id.startswith(("oracle.forward[model.bert", "oracle.backward[model.bert")) or \
                "bert" in check.id and check.oracle:
            continue  # transformers models: minutes; their messages come from the same asserts
        if how in ("shape", "dtype") and not check.in_quick_run:
            continue  # the quick run's checks see these; all checks see the other two
        r = run_check(check, impl, settings=quick, timeout=20)
        if r.outcome != "failed":
            continue
        failed += 1
        first = r.message.strip().splitlines()[0]
        assert first.strip() not in ("", "AssertionError", "AssertionError:", "ValueError",
                                     "failed without a message"), (check.id, r.message)
        assert "distinct failures" not in r.message, (check.id, r.message)
        assert len(first) > 20, (check.id, r.message)
        assert "rerun: minibert check" in r.message, (check.id, r.message)
    assert failed > 20  # the broken implementation is red almost everywhere


# ----------------------------------------------------------------- minibert adapter new
def test_adapter_new_lists_every_name_and_capability_and_imports(tmp_path, capsys,
                                                                 monkeypatch):
    from minibert_spec.protocol import CONVENTIONS, DEFAULT_CAPABILITIES, OPS
    from minibert_spec.protocol.capabilities import VARIANTS, accepted
    from minibert_spec.protocol.guards import GUARDS, guard_range

    assert minibert(["adapter", "new", "mybert_xyz"]) == 0
    text = capsys.readouterr().out
    for row in OPS.values():
        assert f"# --- {row.name}: {row.doc}" in text
        for name in row.names:
            assert f"# def {name}(" in text, name
    # every key with what it accepts: the text the refusals use (one definition)
    for key, default in DEFAULT_CAPABILITIES.items():
        assert f"# {key!r}: {default!r},  # {accepted(key)}" in text, key
    for key in sorted(CONVENTIONS):
        assert repr(key) in text
    for name, what in GUARDS.items():  # each guard with its range
        low, high = guard_range(name)
        assert f"{name!r}: a number in [{low:.3g}, {high:g}]: {what}" in text, name
    from minibert_spec.protocol.guards import CROSS_ENTROPY_GUARDS

    assert f"at most one of {list(CROSS_ENTROPY_GUARDS)}" in text
    assert "ranks integers in [1, 8]" in text and "'linear_cross_entropy'" in text
    for op, options in VARIANTS.items():  # every option, every value with its meaning
        assert f"# {op!r}: {{  # {accepted(op)}" in text, op
        for name, option in options.items():
            standard = option.standard or option.default  # what declaring nothing means
            assert f"{name!r}: {standard!r},  # {accepted(op, name)}" in text
            for value in option.values:
                assert f"{value!r}: {option.meaning[value]}" in text, (op, name, value)
    # it is Python that imports (every row commented out) once the module exists
    (tmp_path / "mybert_xyz.py").write_text("")
    (tmp_path / "my_adapter.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("my_adapter")
    assert mod.CAPABILITIES == {}
    sys.modules.pop("my_adapter", None)
    # -o writes a file, and never overwrites one
    out = tmp_path / "new.py"
    assert minibert(["adapter", "new", "mybert_xyz", "-o", str(out)]) == 0
    assert out.read_text() == text
    assert minibert(["adapter", "new", "mybert_xyz", "-o", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
