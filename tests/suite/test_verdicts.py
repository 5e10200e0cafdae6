"""Verdicts you can trust (issue 11, and issue 19's worker processes): never falsely green,
the right op blamed, usable on real code.  Each finding has its regression test here (hostile
adapters and class-based implementations in tests/examples/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from minibert_spec.cli import main as minibert
from minibert_spec.numerics.finite_differences import directional_check, elementwise_check
from minibert_spec.protocol import ImplementationExit, ImplProxy, NotApplicable
from minibert_spec.suite.run import CheckTimeout, time_limit
from tests import ROOT
from tests.examples import (
    classy_adapter,
    realstyle_minigpt,
    realstyle_numpy_transformer,
    realstyle_tutorial,
)
from tests.unshrunk import check_implementation

EX = "tests.examples."
FAST = ["--quick", "--oracle", "off"]  # every check on its fixed-seed cases: seconds


def verdicts(impl, ops=None, **kw) -> dict[str, str]:
    report = check_implementation(impl, ops=ops, **kw)
    return report.verdicts()


def _cli(capsys, *args):
    code = minibert(["check", *args])
    captured = capsys.readouterr()
    # the table wraps long lines: compare the words
    return code, " ".join(captured.out.split()), captured.err


# ----------------------------------------------------------------- never falsely green
def test_sys_exit_inside_an_op_fails_that_op(capsys):
    """An op calling sys.exit(0) used to end `minibert check` with status 0 and no output."""
    code, out, _ = _cli(capsys, EX + "hostile_exit", *FAST)
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
    report = check_implementation(Impl(), ops=["relu"], kinds=["fd"])
    cell = report.grid()["relu"]["fd"]
    assert cell.status == "FAIL" and "KeyboardInterrupt" in cell.detail


def test_an_implementation_providing_nothing_could_not_run(capsys):
    """It used to read "0 op(s) conform", exit 0."""
    code, out, _ = _cli(capsys, EX + "hostile_nothing", *FAST)
    assert code == 2 and "provides no protocol name" in out
    assert "op(s) conform" not in out


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_a_sleeping_op_fails_within_its_timeout(capsys, tmp_path):
    """The hanging op is red at its first check's time limit; every later check that calls it
    fails at once (no second wait): at most one wait per worker, whatever the machine's load."""
    report = tmp_path / "r.json"
    code, out, _ = _cli(capsys, EX + "hostile_sleep", "--oracle", "off", "--timeout", "2",
                        "--ops", "relu", "linear", "-o", str(report))
    assert code == 1
    assert "an example did not finish within 2 s (inside relu_forward)" in out
    assert "relu_forward did not return within the time limit" in out
    assert "1 op(s) fail: relu" in out
    relu = [r for r in json.loads(report.read_text())["results"] if "relu" in r["ops"]]
    waited = [r for r in relu if "did not finish within 2 s" in r["message"]]
    assert 1 <= len(waited) <= 2, [r["id"] for r in waited]  # one per worker at most
    assert all(r["outcome"] == "failed" for r in relu if r["outcome"] != "n/a")


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_a_hang_inside_compiled_code_is_killed(tmp_path, capsys, monkeypatch):
    """A hang the SIGALRM cannot interrupt (a C call that ignores signals): the worker is
    killed after the time limit plus the grace period, the check fails, the others run."""
    from minibert_spec.suite import pool

    (tmp_path / "c_hang.py").write_text(
        "import ctypes, signal\n"
        "from tests.examples.classy_adapter import *  # noqa\n"
        "from tests.examples.classy_adapter import relu_backward  # noqa\n"
        "def relu_forward(x):\n"
        "    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])\n"
        "    ctypes.CDLL(None).sleep(3600)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pool, "GRACE_SECONDS", 2.0)
    code, out, _ = _cli(capsys, "c_hang", "--oracle", "off", "--timeout", "1",
                        "--total-timeout", "120", "--quick", "-k", r"^fd\[(relu|linear_bias)\]$")
    assert code == 1  # not 2: the kill came from the check's deadline, not the run's
    assert "did not respond to its time limit" in out and "its process was killed" in out
    assert "1 op(s) fail: relu" in out


def test_an_implementation_killing_its_process_fails_the_check(tmp_path, capsys, monkeypatch):
    (tmp_path / "exits.py").write_text(
        "import os\n"
        "from tests.examples.classy_adapter import *  # noqa\n"
        "from tests.examples.classy_adapter import relu_backward  # noqa\n"
        "def relu_forward(x):\n"
        "    os._exit(7)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    code, out, _ = _cli(capsys, "exits", *FAST, "--ops", "relu", "linear")
    assert code == 1 and "ended the process running this check (exited with status 7)" in out
    assert "1 op(s) fail: relu" in out


def test_time_limit_is_a_base_exception_the_implementation_cannot_swallow():
    def stubborn():
        try:
            time.sleep(5)
        except Exception:  # noqa: BLE001 -- what careless implementation code does
            return "swallowed"

    with pytest.raises(CheckTimeout), time_limit(0.2, "stubborn"):
        stubborn()


def test_an_adapter_raising_on_import_is_one_line(capsys):
    code, out, err = _cli(capsys, EX + "hostile_import", *FAST)
    assert code == 2 and out == ""
    assert err.strip().startswith("minibert check: could not run: impl: importing "
                                  "'tests.examples.hostile_import' raised RuntimeError: this "
                                  "adapter is broken at import time")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_an_unloadable_module_is_one_line(capsys):
    code, out, err = _cli(capsys, "no_such_module_xyz:thing", *FAST)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "cannot import 'no_such_module_xyz'" in err


def test_input_mutation_is_an_invariant_of_every_op(capsys):
    code, out, _ = _cli(capsys, EX + "hostile_mutate", *FAST, "--ops", "relu", "linear")
    assert code == 1 and "forward leaves its inputs untouched" in out
    assert "backward leaves dout" in out and "1 op(s) fail: relu" in out


def test_float32_promoted_to_float64_is_a_failure(capsys):
    code, out, _ = _cli(capsys, EX + "hostile_upcast", *FAST, "--ops", "linear", "relu")
    assert code == 1 and "float32 in -> float32 out (got float64)" in out
    assert "1 op(s) fail: linear" in out


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_missing_oracle_is_exit_2_unless_turned_off(capsys, monkeypatch):
    """Without torch, `minibert check` used to exit 0 having checked half."""
    from minibert_spec.suite import registry

    monkeypatch.setattr(registry.Check, "missing_requirements",
                        lambda self: list(self.requires))  # torch "not installed"
    code, out, err = _cli(capsys, EX + "classy_adapter", "--ops", "relu")
    assert code == 2 and out == ""
    assert "pip install 'minibert-spec[oracle]'" in err and "--oracle off" in err
    code, out, _ = _cli(capsys, EX + "classy_adapter", "--ops", "relu", "--oracle", "off")
    assert code == 0 and "oracle: off (the PyTorch columns were not run)" in out


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
    report = check_implementation(_Leaky(), ops=["heads", "adam", "clip"], kinds=["invariant"],
                                  quick=True)
    detail = {op: cells["invariants"].detail for op, cells in report.grid().items()}
    failed = {r.id: r.message for r in report.failures()}
    text = " ".join(failed.values())
    assert set(detail) == {"heads", "adam", "clip"}
    assert "float32 in -> float32 out" in failed["invariant[heads.inverse_and_adjoint]"]
    assert "adam_step leaves params, grads and state untouched" in text
    assert "float32 in -> float32 out" in failed["invariant[adam.pure]"]
    assert "clip_by_global_norm leaves its input untouched" in text
    assert "float32 in -> float32 out" in failed["invariant[clip.exact_norm_and_passthrough]"]


# ----------------------------------------------------------------- the pytest side
def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
               **extra)
    return env


def _pytest_impl(tmp_path, spec, *args, timeout=300):
    report = tmp_path / "r.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         f"--minibert-impl={spec}", "--minibert-oracle=off", *args], cwd=tmp_path,
        capture_output=True, text=True, timeout=timeout, env=_env(MINIBERT_REPORT=str(report)))
    records = ([json.loads(x) for x in report.read_text().splitlines()]
               if report.exists() else [])
    return proc, records


def test_pytest_minibert_impl_unloadable_is_a_usage_error_at_once(tmp_path):
    """A typo in the implementation's name used to run the whole suite into 401 errors."""
    for spec, why in (("nope.mod", "cannot import 'nope.mod'"),
                      (EX + "hostile_import", "raised RuntimeError")):
        proc, _ = _pytest_impl(tmp_path, spec)
        assert proc.returncode == 4, proc.stdout + proc.stderr  # pytest's usage error
        err = [x for x in proc.stderr.splitlines() if x.strip()]
        assert any(x.startswith(f"ERROR: --minibert-impl {spec}:") and why in x for x in err)


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_pytest_minibert_impl_providing_nothing_is_red(tmp_path):
    proc, records = _pytest_impl(tmp_path, EX + "hostile_nothing", "--minibert-quick")
    assert proc.returncode == 1, proc.stdout[-2000:]
    failed = [r["nodeid"] for r in records if r["outcome"] == "failed"]
    assert failed == ["spec/suite/test_implementation.py::test_check[protocol[provides]]"] or \
        [f.split("::")[-1] for f in failed] == ["test_check[protocol[provides]]"]


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_pytest_minibert_impl_fails_on_sys_exit(tmp_path):
    proc, records = _pytest_impl(tmp_path, EX + "hostile_exit", "--minibert-quick", "-k", "relu")
    assert proc.returncode == 1, proc.stdout[-2000:]
    failed = sorted(r["nodeid"].split("::")[-1] for r in records if r["outcome"] == "failed")
    assert failed == sorted(f"test_check[{c}]" for c in (
        "fd[relu]", "invariant[relu.zero_upstream]", "invariant[relu.linear_in_upstream]",
        "invariant[relu.bit_identical_and_pure]", "invariant[relu.float32_vs_float64]",
        "invariant[relu.zero_below_zero]"))


# ----------------------------------------------------------------- usable on real code
REALSTYLE = {
    realstyle_tutorial: {"linear", "layernorm", "attention", "adam"},
    realstyle_minigpt: {"softmax", "ffn", "cross_entropy", "adam", "schedule", "clip"},
    realstyle_numpy_transformer: {"embedding", "sinusoidal_position", "relu", "adam"},
}
BUGGY = [(m, op) for m, ops in REALSTYLE.items() for op in sorted(ops)
         if not (m is realstyle_minigpt and op in ("adam", "schedule"))]


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("module", list(REALSTYLE), ids=lambda m: m.__name__.split(".")[-1])
def test_realstyle_implementation_is_green_in_every_row_it_provides(module, monkeypatch):
    monkeypatch.setattr(module, "BUGS", set())
    report = check_implementation(module)
    got = report.verdicts()
    assert {op for op, v in got.items() if v == "ok"} == REALSTYLE[module], {
        r.id: r.message for r in report.failures()}
    assert {op for op, v in got.items() if v == "n/a"} == set(got) - REALSTYLE[module]


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("module,bug", BUGGY,
                         ids=[f"{m.__name__.split('.')[-1]}-{op}" for m, op in BUGGY])
def test_a_bug_in_one_op_makes_only_that_row_red(module, bug, monkeypatch):
    monkeypatch.setattr(module, "BUGS", {bug})
    report = check_implementation(module, ops=REALSTYLE[module], quick=True)
    got = report.verdicts()
    assert [op for op, v in got.items() if v == "FAIL"] == [bug]


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_conventions_are_reported_with_the_number_they_change(monkeypatch):
    monkeypatch.setattr(realstyle_minigpt, "BUGS", set())
    ops = ["cross_entropy", "schedule", "clip"]
    report = check_implementation(realstyle_minigpt, ops=ops, quick=True)
    assert all(report.verdict(c) == "ok" for c in report.grid().values())
    conventions = report.conventions()
    assert any("loss promoted to float64" in c and "would change it by" in c
               for c in conventions["cross_entropy"])
    assert any("lr(0) = 0" in c and "instead of peak / warmup = 0.0001" in c
               for c in conventions["schedule"])
    assert any("guard" in c and "relative" in c for c in conventions["clip"])
    # undeclared, lr(0) = 0 is the reference's off-by-one: a failure naming the declaration
    monkeypatch.setitem(realstyle_minigpt.CAPABILITIES, "conventions", ())
    report = check_implementation(realstyle_minigpt, ops=["schedule"], quick=True)
    cell = report.grid()["schedule"]["invariants"]
    assert cell.status == "FAIL" and "CAPABILITIES['conventions']" in cell.detail


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
