"""``minibert adapter infer``'s optimizer row for a trainer's per-name update with the step
counter kept by the training loop (spec/suite/infer/optim.py, ``each=``):
tests/examples/realstyle_loop_counter.py's ``adam_update(name, p, g, t, lr=...)`` mapped to
``optimizer(..., each=..., each_args=..., first_t=...)`` -- the counter's two conventions tried
-- only where three steps equal the reference's ``adam_step``.  The example's planted bug (v
corrected with ``beta2 ** t``, the 0-based counter taken as 1-based) and a textbook update's
bugs are listed as not mapped, never adapted away; near misses (SGD, momentum alone, an update
that changes nothing) get a reason and no row."""

from __future__ import annotations

import numpy as np
import pytest

from minibert_spec.suite.infer import infer_source
from minibert_spec.suite.infer.optim import OPTIM_RTOL, infer_optimizers, optimizer_call
from tests.examples import realstyle_loop_counter
from tests.suite.infer_support import exec_source, not_mapped_deviation
from tests.suite.infer_support import load_source as _load

MODULE = realstyle_loop_counter.__name__
ROW = "adam_init, adam_step = optimizer("


def _row(cls) -> tuple[str, list[str]]:
    rows, missing = infer_optimizers([cls])
    return (optimizer_call(rows[0], "impl") if rows else ""), missing


def test_the_loop_counter_trainer_gets_its_per_name_row():
    """The hand adapter's row: each_args in the method's order, the 0-based counter (first_t=0),
    lr the per-call keyword, the betas and eps where the constructor stored them."""
    row, missing = _row(realstyle_loop_counter.Trainer)
    assert not missing, missing
    for want in ("impl.Trainer", "'lr': 'lr='", "'beta1': 'beta1'", "'beta2': 'beta2'",
                 "'eps': 'eps'", "m='m'", "v='v'", "each='adam_update'",
                 "each_args=('name', 'param', 'grad', 't')", "first_t=0"):
        assert want in row, row
    assert "step=" not in row and "t=" not in row.replace("first_t=", ""), row


def test_the_written_adapter_equals_the_reference_and_leaves_its_arguments_alone():
    """infer's adapter for the example, run against the reference's adam_step with the rate
    changing at each step (a schedule's, passed per call): the same parameters, moments and
    step; the in-place ``p -= ...`` of the update changes the adapter's copies, never the
    parameters adam_step was given (the protocol's adam_step is pure)."""
    from minibert_reference.optim import adam_init as ref_init
    from minibert_reference.optim import adam_step as ref_step

    src = infer_source(MODULE)
    assert "CAPABILITIES = {'weight_decay': False}" in src, src
    assert "each='adam_update'" in src and "first_t=0" in src, src
    adapter = exec_source(src)
    rng = np.random.default_rng(5)
    p = {"enc.W": rng.standard_normal((3, 2)), "enc.b": rng.standard_normal(2)}
    state, ref, rp = adapter.adam_init(p), ref_init(p), p
    for step in range(4):
        g = {k: rng.standard_normal(x.shape) for k, x in p.items()}
        given = {k: x.copy() for k, x in p.items()}
        hyper = {"lr": 0.05 / (step + 1), "beta1": 0.8, "beta2": 0.9, "eps": 1e-4}
        new, state = adapter.adam_step(p, g, state, **hyper)
        for k in p:
            assert np.array_equal(p[k], given[k]), f"adam_step changed its argument {k!r}"
        p = new
        rp, ref = ref_step(rp, g, ref, **hyper)
    for k in p:
        np.testing.assert_allclose(p[k], rp[k], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(state["m"][k], ref["m"][k], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(state["v"][k], ref["v"][k], rtol=1e-12, atol=1e-14)
    assert state["step"] == ref["step"] == 4


def test_the_examples_planted_bug_is_not_mapped(monkeypatch):
    """BUGS "adam" (v corrected with beta2**t, m with beta1**(t + 1)) is right under neither
    convention of the counter: both tried, no row, and the line says by how much and where."""
    monkeypatch.setattr(realstyle_loop_counter, "BUGS", {"adam"})
    row, missing = _row(realstyle_loop_counter.Trainer)
    assert not_mapped_deviation(row, missing, "Trainer") > 1e3 * OPTIM_RTOL, missing
    assert "each='adam_update'" in missing[0], missing
    assert "at step 1; 2 candidate adapter(s) tried" in missing[0], missing
    assert missing[0].endswith("no adam row written"), missing


@pytest.mark.slow  # the slow tier: minibert check's adam row (~4 s, more under load)
def test_the_inferred_row_is_green_and_the_planted_bug_is_not(tmp_path, monkeypatch):
    """``minibert check``'s verdict on the adam row: ok under infer's adapter for the correct
    example; under the planted bug infer writes no row (n/a, its reason in the adapter), and the
    correct code's adapter run on the buggy code FAILs -- no adapter makes the bug green."""
    from tests.unshrunk import check_implementation

    src = infer_source(MODULE)
    adapter = _load(tmp_path, monkeypatch, src, "inferred_loop_counter")
    assert check_implementation(adapter, ops=["adam"]).verdicts()["adam"] == "ok"
    monkeypatch.setattr(realstyle_loop_counter, "BUGS", {"adam"})
    verdict = check_implementation(adapter, ops=["adam"], first_red=True).verdicts()["adam"]
    assert verdict == "FAIL", verdict
    buggy = infer_source(MODULE)
    assert ROW not in buggy and "class Trainer: optimizer(" in buggy, buggy
    adapter = _load(tmp_path, monkeypatch, buggy, "inferred_loop_counter_bug")
    verdict = check_implementation(adapter, ops=["adam"], first_red=True).verdicts()["adam"]
    assert verdict != "ok", verdict


def test_another_order_a_1_based_counter_and_a_returned_parameter(tmp_path, monkeypatch):
    """The roles by the arguments' names in another order (``update(p, g, key, step)``), the
    counter 1-based, the rate stored by the constructor, the new parameter returned rather than
    written in place: mapped as such."""
    mod = _load(tmp_path, monkeypatch, """
        import numpy as np

        class Trainer:
            def __init__(self, params, learning_rate=1e-3, b1=0.9, b2=0.999, epsilon=1e-8):
                self.learning_rate, self.b1, self.b2, self.epsilon = learning_rate, b1, b2, epsilon
                self.moments = {k: (np.zeros_like(p), np.zeros_like(p)) for k, p in params.items()}

            def apply_update(self, p, g, key, step):
                m, v = self.moments[key]
                m = self.b1 * m + (1 - self.b1) * g
                v = self.b2 * v + (1 - self.b2) * g * g
                self.moments[key] = (m, v)
                m_hat, v_hat = m / (1 - self.b1 ** step), v / (1 - self.b2 ** step)
                return p - self.learning_rate * m_hat / (np.sqrt(v_hat) + self.epsilon)
        """, "optim_each_reordered")
    row, missing = _row(mod.Trainer)
    assert not missing, missing
    for want in ("'lr': 'learning_rate'", "'beta1': 'b1'", "each='apply_update'",
                 "each_args=('param', 'grad', 'name', 't')", "first_t=1",
                 "m=lambda o: {k: s[0] for k, s in o.moments.items()}"):
        assert want in row, row
    rows, _ = infer_optimizers([mod.Trainer])
    assert any("by returning it" in e for e in rows[0].evidence), rows[0].evidence


# A per-name update, 0-based counter, with textbook bugs behind a switch
PER_NAME = """
    import numpy as np

    BUG = BUG_NAME


    class Trainer:
        def __init__(self, params, beta1=0.9, beta2=0.999, eps=1e-8):
            self.beta1, self.beta2, self.eps = beta1, beta2, eps
            self.m = {k: np.zeros_like(p) for k, p in params.items()}
            self.v = {k: np.zeros_like(p) for k, p in params.items()}

        def update(self, name, p, g, t, lr=1e-3):
            t = t + (2 if BUG == "off_by_two" else 0)
            self.m[name] = self.beta1 * self.m[name] + (1 - self.beta1) * g
            self.v[name] = self.beta2 * self.v[name] + (1 - self.beta2) * g * g
            bc1 = 1.0 if BUG == "no_bias_correction" else 1 - self.beta1 ** (t + 1)
            bc2 = 1.0 if BUG == "no_bias_correction" else 1 - self.beta2 ** (
                t + 2 if BUG == "mixed_counter" else t + 1)
            m_hat, v_hat = self.m[name] / bc1, self.v[name] / bc2
            if BUG == "eps_inside_sqrt":
                p -= lr * m_hat / np.sqrt(v_hat + self.eps)
            else:
                p -= lr * m_hat / (np.sqrt(v_hat) + self.eps)
"""
BUGS = ("no_bias_correction", "eps_inside_sqrt", "mixed_counter", "off_by_two")


def test_the_textbook_per_name_update_is_mapped(tmp_path, monkeypatch):
    mod = _load(tmp_path, monkeypatch, PER_NAME.replace("BUG_NAME", "''"), "optim_each_ok")
    row, missing = _row(mod.Trainer)
    assert not missing, missing
    assert "each='update'" in row and "first_t=0" in row, row


@pytest.mark.parametrize("bug", BUGS)
def test_a_bug_of_a_per_name_update_is_never_inferred_away(bug, tmp_path, monkeypatch):
    """Each differs from the reference under both conventions of the counter (a counter two
    off, one correction's counter off by one against the other's): not mapped.  (A counter
    shifted by one in both corrections is the other convention: first_t says which.)"""
    mod = _load(tmp_path, monkeypatch, PER_NAME.replace("BUG_NAME", repr(bug)),
                f"optim_each_{bug}")
    row, missing = _row(mod.Trainer)
    assert not_mapped_deviation(row, missing, "Trainer") > 1e3 * OPTIM_RTOL, missing


def test_per_name_near_misses_get_a_reason_and_no_row(tmp_path, monkeypatch):
    """SGD (no moments), momentum alone (one signed moment, no v) and an update that rebinds
    its parameter without returning it (it changes nothing): each named with why; a class
    with no step-like method is no optimizer and not listed."""
    mod = _load(tmp_path, monkeypatch, """
        import numpy as np

        class SGDTrainer:
            def __init__(self, params, lr=0.1):
                self.lr = lr

            def sgd_update(self, name, p, g, t):
                p -= self.lr * g

        class MomentumTrainer:
            def __init__(self, params, lr=0.1, beta1=0.9):
                self.lr, self.beta1 = lr, beta1
                self.velocity = {k: np.zeros_like(p) for k, p in params.items()}

            def update(self, name, p, g, t):
                self.velocity[name] = self.beta1 * self.velocity[name] + g
                p -= self.lr * self.velocity[name]

        class RebindingTrainer:
            def __init__(self, params, lr=0.1):
                self.lr = lr

            def update(self, name, p, g, t):
                p = p - self.lr * g

        class Logger:
            def __init__(self, params):
                self.rows = []

            def log(self, name, p, g, t):
                self.rows.append(name)
        """, "optim_each_near")
    rows, missing = infer_optimizers([mod.SGDTrainer, mod.MomentumTrainer,
                                      mod.RebindingTrainer, mod.Logger])
    assert rows == []
    no_moments = ("no moments: after two steps of {}, no pair of containers keyed like the "
                  "parameters (one signed: m, one >= 0: v)")
    assert missing == [
        "class SGDTrainer: " + no_moments.format("sgd_update"),
        "class MomentumTrainer: " + no_moments.format("update"),
        "class RebindingTrainer: no method updates the parameter it is given when called per "
        "name as method(name, param, grad, t) in some order (update(name, param, grad, t) left "
        "it unchanged)"], missing
