"""Verdicts you can trust (issue 11): never falsely green, the right op blamed, usable on real
code.  Each finding of the issue has its regression test here (hostile adapters and
class-based implementations in tests/examples/)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from spec.cli import main as minibert
from spec.conformance import OpTimeout, check_all, check_op, credited_ops, merge_oracle, time_limit
from spec.gradcheck import directional_check, elementwise_check
from spec.protocol import OPS, ImplementationExit, ImplProxy, NotApplicable
from tests.examples import (
    classy_adapter,
    realstyle_minigpt,
    realstyle_numpy_transformer,
    realstyle_tutorial,
)

ROOT = Path(__file__).resolve().parents[1]
EX = "tests.examples."


def _cli(capsys, *args):
    code = minibert(["check", *args])
    return code, capsys.readouterr().out


# ----------------------------------------------------------------- never falsely green
def test_sys_exit_inside_an_op_fails_that_op(capsys):
    """An op calling sys.exit(0) used to end `minibert check` with status 0 and no output."""
    code, out = _cli(capsys, EX + "hostile_exit", "--no-oracle")
    assert code == 1
    assert "relu_forward raised SystemExit(0)" in out and "1 op(s) fail: relu" in out


def test_keyboard_interrupt_from_the_implementation_is_a_failure():
    class Impl:
        @staticmethod
        def relu_forward(x):
            raise KeyboardInterrupt

        relu_backward = staticmethod(classy_adapter.relu_backward)

    with pytest.raises(ImplementationExit, match="KeyboardInterrupt"):
        ImplProxy(Impl(), "kbd").relu_forward(np.ones(2))
    report = check_op(Impl(), "relu")
    assert report.verdict == "FAIL" and "KeyboardInterrupt" in report.backward.detail


def test_an_implementation_providing_nothing_could_not_run(capsys):
    """It used to read "0 op(s) conform", exit 0."""
    code, out = _cli(capsys, EX + "hostile_nothing", "--no-oracle")
    assert code == 2 and "provides no protocol name" in out
    assert "op(s) conform" not in out


def test_a_sleeping_op_fails_within_its_timeout(capsys):
    start = time.perf_counter()
    code, out = _cli(capsys, EX + "hostile_sleep", "--no-oracle", "--timeout", "1",
                     "--ops", "relu", "linear")
    assert code == 1 and time.perf_counter() - start < 10
    assert "relu: the checks did not finish within 1 s" in out and "1 op(s) fail: relu" in out


def test_time_limit_is_a_base_exception_the_implementation_cannot_swallow():
    def stubborn():
        try:
            time.sleep(5)
        except Exception:  # noqa: BLE001 -- what careless implementation code does
            return "swallowed"

    with pytest.raises(OpTimeout), time_limit(0.2, "stubborn"):
        stubborn()


def test_an_adapter_raising_on_import_is_one_line(capsys):
    code, out = _cli(capsys, EX + "hostile_import", "--no-oracle")
    assert code == 2
    assert out.strip().startswith("could not run: impl: importing 'tests.examples.hostile_import'"
                                  " raised RuntimeError: this adapter is broken at import time")
    assert "Traceback" not in out


def test_input_mutation_is_an_invariant_of_every_op(capsys):
    code, out = _cli(capsys, EX + "hostile_mutate", "--no-oracle", "--ops", "relu", "linear")
    assert code == 1 and "forward leaves its inputs untouched" in out
    assert "backward leaves dout" in out and "1 op(s) fail: relu" in out


def test_float32_promoted_to_float64_is_a_failure(capsys):
    code, out = _cli(capsys, EX + "hostile_upcast", "--no-oracle", "--ops", "linear", "relu")
    assert code == 1 and "float32 in -> float32 out (got float64)" in out
    assert "1 op(s) fail: linear" in out


class _Leaky:
    """split_heads / adam_step / clip_by_global_norm that mutate their inputs and upcast:
    all three were missed before (even with the oracle)."""

    @staticmethod
    def split_heads(x, n_heads):
        B, T, H = x.shape
        out = x.astype(np.float64).reshape(B, T, n_heads, H // n_heads).transpose(0, 2, 1, 3)
        x += 0.0 * x  # harmless, but in place: fine; the next line is not
        x[..., 0] = x[..., 0]
        return out

    @staticmethod
    def merge_heads(x):
        B, A, T, d = x.shape
        return x.transpose(0, 2, 1, 3).reshape(B, T, A * d).astype(np.float64)

    @staticmethod
    def adam_init(params):
        return {"step": 0, "m": {k: np.zeros_like(v) for k, v in params.items()},
                "v": {k: np.zeros_like(v) for k, v in params.items()}}

    @staticmethod
    def adam_step(params, grads, state, *, lr, beta1=0.9, beta2=0.999, eps=1e-8,
                  weight_decay=0.0, no_decay=()):
        state["step"] += 1  # in place
        t = state["step"]
        for k, g in grads.items():
            state["m"][k] = beta1 * state["m"][k] + (1 - beta1) * g
            state["v"][k] = beta2 * state["v"][k] + (1 - beta2) * g * g
            m_hat = state["m"][k] / (1 - beta1 ** t)
            v_hat = state["v"][k] / (1 - beta2 ** t)
            params[k] = params[k] - lr * m_hat / (np.sqrt(v_hat) + eps)  # the caller's dict
            if k not in no_decay:
                params[k] = params[k] - lr * weight_decay * params[k]
            params[k] = params[k].astype(np.float64)
        return params, state

    @staticmethod
    def global_grad_norm(grads):
        return float(np.sqrt(sum(float((g * g).sum()) for g in grads.values())))

    @staticmethod
    def clip_by_global_norm(grads, max_norm):
        norm = _Leaky.global_grad_norm(grads)
        for k in grads:  # in place, and float64
            grads[k] = (grads[k] * min(1.0, max_norm / norm)).astype(np.float64)
        return grads, norm


def test_split_heads_adam_and_clip_get_the_mutation_and_dtype_invariants():
    reports = {r.op: r for r in check_all(_Leaky(), ["heads", "adam", "clip"])}
    assert "float32 in -> float32 out" in reports["heads"].invariants.detail
    assert "adam_step leaves params, grads and state untouched" in reports["adam"].invariants.detail
    assert "float32 in -> float32 out" in reports["adam"].invariants.detail
    assert "clip_by_global_norm leaves its input untouched" in reports["clip"].invariants.detail
    assert "float32 in -> float32 out" in reports["clip"].invariants.detail


def test_pytest_impl_unloadable_is_a_usage_error_at_once():
    """A typo in --impl used to run the whole suite into 401 errors."""
    for spec, why in (("nope.mod", "cannot import 'nope.mod'"),
                      (EX + "hostile_import", "raised RuntimeError"),
                      (EX + "hostile_nothing", "provides no protocol name")):  # was 447 skips
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "--impl", spec, "tests/test_smoke.py"], cwd=ROOT,
                              capture_output=True, text=True, timeout=120, env=_env())
        assert proc.returncode == 4, proc.stdout + proc.stderr  # pytest's usage error
        err = [x for x in proc.stderr.splitlines() if x.strip()]
        assert len(err) == 1 and err[0].startswith(f"ERROR: --impl {spec}:") and why in err[0]
        assert time.perf_counter() - start < 30


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
               **extra)
    return env


def test_pytest_impl_fails_on_sys_exit_and_skips_project_internal_tests(tmp_path):
    report = tmp_path / "r.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--impl",
         EX + "hostile_exit", "tests/test_conformance.py::test_op_conforms",
         "tests/test_conformance.py::test_every_op_is_checked_from_the_table",
         "tests/test_claims.py"], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=_env(MINIBERT_REPORT=str(report)))
    assert proc.returncode == 1, proc.stdout[-2000:]
    records = [json.loads(x) for x in report.read_text().splitlines()]
    failed = [r["nodeid"] for r in records if r["outcome"] == "failed"]
    assert failed == ["tests/test_conformance.py::test_op_conforms[relu]"]
    internal = [r for r in records if "test_claims.py" in r["nodeid"]
                or "test_every_op_is_checked" in r["nodeid"]]
    assert internal and all(r["outcome"] == "skipped" and "project-internal" in r["message"]
                            for r in internal)


# ----------------------------------------------------------------- the oracle subprocess
FAKE_ORACLE = (
    "import concurrent.futures  # noqa: F401 -- shadowed by a scratch file in the caller's dir\n"
    "import numpy as np\nimport pytest\n\npytestmark = pytest.mark.oracle\n"
    "torch = pytest.importorskip('torch')\n\n"
    "@pytest.mark.equation('relu.forward')\n"
    "def test_relu(impl):\n"
    "    out, _ = impl.relu_forward(np.array([[-1.0, 2.0]]))\n"
    "    assert out.tolist() == [[0.0, 2.0]]\n\n"
    "@pytest.mark.equation('relu.forward')\n"
    "@pytest.mark.parametrize('n', [1, 2])\n"
    "def test_relu_hypothesis(impl, n):\n"
    "    from hypothesis import given, strategies as st\n"
    "    @given(st.floats(0.1, 2))\n"
    "    def inner(v):\n"
    "        assert impl.relu_forward(np.array([v]))[0][0] == v\n"
    "    inner()\n")


@pytest.fixture
def fake_root(tmp_path):
    import shutil

    root = tmp_path / "root"
    (root / "tests").mkdir(parents=True)
    shutil.copy(ROOT / "conftest.py", root / "conftest.py")
    (root / "tests" / "test_oracle_fake.py").write_text(FAKE_ORACLE)
    return root


def _skip_without_torch():
    if importlib.util.find_spec("torch") is None:
        pytest.skip("not applicable: torch is not installed")


def test_a_crashed_oracle_run_could_not_run(fake_root, monkeypatch, capsys):
    """A crashed oracle run used to read "no oracle tests" (exit 0)."""
    from spec.cli import check

    _skip_without_torch()
    monkeypatch.setattr(check, "ROOT", fake_root)  # the fake oracle tests: seconds, not minutes
    code, out = _cli(capsys, EX + "hostile_oracle_crash", "--ops", "relu", "linear")
    assert code == 2 and "could not run: the oracle run exited with status 3" in out
    assert "op(s) conform" not in out


def test_oracle_run_is_isolated_from_the_callers_directory(fake_root, tmp_path, monkeypatch):
    """A scratch `concurrent.py` in the working directory (and next to the implementation)
    used to shadow the standard library in the oracle subprocess: a crash read as a pass.
    Nothing may be written into the caller's directory or the checkout (.hypothesis)."""
    from spec.cli.check import oracle_records

    _skip_without_torch()
    user = tmp_path / "user"
    user.mkdir()
    (user / "concurrent.py").write_text("raise RuntimeError('shadowed the standard library')\n")
    (user / "my_relu_impl.py").write_text(
        "from tests.examples.classy_adapter import relu_forward, relu_backward  # noqa\n")
    monkeypatch.chdir(user)
    records, note = oracle_records("my_relu_impl", root=fake_root, impl_path=str(user))
    assert [r["outcome"] for r in records] == ["passed"] * 3, records
    assert all(r["called"] == ["relu_forward"] for r in records)
    assert sorted(p.name for p in user.iterdir()) == ["concurrent.py", "my_relu_impl.py"]
    assert not (fake_root / ".hypothesis").exists() and not (user / ".hypothesis").exists()


# ----------------------------------------------------------------- the right op blamed
def test_a_test_credits_only_the_ops_it_called():
    rec = {"nodeid": "t::ffn", "outcome": "failed", "equations": ["ffn.forward",
                                                                  "relu.forward"],
           "called": ["ffn_forward"]}
    assert credited_ops(rec) == {"ffn"}  # not relu: no relu name was called
    assert credited_ops({**rec, "called": []}) == set()  # never touched the implementation
    assert credited_ops({"nodeid": "t::m", "outcome": "passed", "ops": ["model"],
                         "called": []}) == set()


def test_forward_and_backward_oracle_findings_apart():
    reports = check_all(classy_adapter, ["linear", "layernorm", "relu"])
    merge_oracle(reports, [
        {"nodeid": "t::lin_fwd", "outcome": "passed", "equations": ["linear.forward"],
         "called": ["linear_forward"]},
        {"nodeid": "t::lin_bwd", "outcome": "failed", "equations": ["linear.backward.dx"],
         "called": ["linear_forward", "linear_backward"], "message": "linear dW: mismatch"},
        {"nodeid": "t::ln", "outcome": "failed", "equations": ["layernorm.forward"],
         "called": ["layernorm_forward", "layernorm_backward"],
         "message": "layernorm forward: mismatch"},  # the forward compared first, failed
        {"nodeid": "t::ln2", "outcome": "passed", "equations": ["layernorm.forward"],
         "called": ["layernorm_forward", "layernorm_backward"]},
    ])
    by = {r.op: r for r in reports}
    assert by["linear"].forward.status == "ok"
    assert by["linear"].oracle_backward.status == "FAIL" and "linear dW: mismatch" in (
        by["linear"].oracle_backward.detail)
    assert by["layernorm"].forward.status == "FAIL" and "t::ln:" in by["layernorm"].forward.detail
    assert by["layernorm"].oracle_backward.detail == "1 oracle tests"  # t::ln2
    assert by["relu"].forward.status == by["relu"].oracle_backward.status == "n/a"


# ----------------------------------------------------------------- usable on real code
REALSTYLE = {
    realstyle_tutorial: {"linear", "layernorm", "attention", "adam"},
    realstyle_minigpt: {"softmax", "ffn", "cross_entropy", "adam", "schedule", "clip"},
    realstyle_numpy_transformer: {"embedding", "sinusoidal_position", "relu", "adam"},
}
BUGGY = [(m, op) for m, ops in REALSTYLE.items() for op in sorted(ops)
         if not (m is realstyle_minigpt and op in ("adam", "schedule"))]


@pytest.mark.parametrize("module", list(REALSTYLE), ids=lambda m: m.__name__.split(".")[-1])
def test_realstyle_implementation_is_green_in_every_row_it_provides(module, monkeypatch):
    monkeypatch.setattr(module, "BUGS", set())
    reports = {r.op: r for r in check_all(module)}
    assert {op for op, r in reports.items() if r.verdict == "ok"} == REALSTYLE[module], {
        op: r.failures for op, r in reports.items() if r.verdict == "FAIL"}
    assert {op for op, r in reports.items() if r.verdict == "n/a"} == set(OPS) - REALSTYLE[
        module]


@pytest.mark.parametrize("module,bug", BUGGY,
                         ids=[f"{m.__name__.split('.')[-1]}-{op}" for m, op in BUGGY])
def test_a_bug_in_one_op_makes_only_that_row_red(module, bug, monkeypatch):
    monkeypatch.setattr(module, "BUGS", {bug})
    reports = check_all(module)
    assert [r.op for r in reports if r.verdict == "FAIL"] == [bug]


def test_conventions_are_reported_with_the_number_they_change(monkeypatch):
    monkeypatch.setattr(realstyle_minigpt, "BUGS", set())
    reports = {r.op: r for r in check_all(realstyle_minigpt, ["cross_entropy", "schedule",
                                                              "clip"])}
    assert all(r.verdict == "ok" for r in reports.values())
    assert any("loss promoted to float64" in c and "would change it by" in c
               for c in reports["cross_entropy"].conventions)
    assert any("lr(0) = 0" in c and "instead of peak / warmup = 0.0001" in c
               for c in reports["schedule"].conventions)
    assert any("guard" in c and "relative" in c for c in reports["clip"].conventions)
    # undeclared, lr(0) = 0 is the reference's off-by-one: a failure naming the declaration
    monkeypatch.setitem(realstyle_minigpt.CAPABILITIES, "conventions", ())
    report = check_op(realstyle_minigpt, "schedule")
    assert report.verdict == "FAIL" and "CAPABILITIES['conventions']" in report.invariants.detail


def test_capabilities_adapt_the_checks():
    proxy = ImplProxy(realstyle_tutorial, "tutorial")
    x1 = np.arange(4.0)  # rank 1: the class only takes [B, T, H]; reshaped and back
    out, cache = proxy.linear_forward(x1, np.eye(4), None)
    assert out.shape == (4,) and proxy.linear_backward(np.ones(4), cache)[0].shape == (4,)
    x4 = np.ones((2, 2, 3, 4))  # rank 4: leading axes merged
    assert proxy.layernorm_forward(x4, np.ones(4), np.zeros(4))[0].shape == (2, 2, 3, 4)
    W = np.eye(4)
    with pytest.raises(NotApplicable, match="does not claim attention_bias"):
        proxy.attention_forward(np.ones((1, 2, 4)), W, W, W, W, np.ones(4), None, None, None,
                                n_heads=2)
    with pytest.raises(NotApplicable, match="does not claim key_mask"):
        proxy.attention_forward(np.ones((1, 2, 4)), W, W, W, W, n_heads=2,
                                mask=np.ones((1, 2)))
    with pytest.raises(NotApplicable, match="does not claim weight_decay"):
        proxy.adam_step({"w": W}, {"w": W}, proxy.adam_init({"w": W}), lr=0.1,
                        weight_decay=0.1)
    # weight_decay=0 / no_decay are dropped for an optimizer without them
    proxy.adam_step({"w": W}, {"w": W}, proxy.adam_init({"w": W}), lr=0.1, weight_decay=0.0,
                    no_decay=())


def test_unknown_capabilities_are_rejected(capsys):
    class Impl:
        CAPABILITIES = {"attention_biases": False}

    with pytest.raises(ValueError, match="unknown keys"):
        ImplProxy(Impl(), "typo")


# ----------------------------------------------------------------- FD floors from truncation
def test_fd_allows_its_own_truncation_error_and_nothing_more():
    """f = 30 x^3 at 0: the true derivative is 0, the central difference is 30 eps^2 = 3e-9,
    above the absolute floor 1e-9 (the block's LN2 rows [0, 0, 0, a] were such a case: the
    reference failed its own check).  The allowance is estimated from a second step, so a
    gradient wrong by more than FD's own error still fails."""
    def f(x):
        return float(30 * x[0] ** 3 + x[1])

    x = np.array([0.0, 1.0])
    assert elementwise_check(f, x, np.array([0.0, 1.0])).passed
    assert not elementwise_check(f, x, np.array([3e-8, 1.0])).passed
    rng = np.random.default_rng(0)
    assert directional_check(f, x, np.array([0.0, 1.0]), rng=rng).passed
    assert not directional_check(f, x, np.array([0.0, 1.0 + 1e-5]), rng=rng).passed
