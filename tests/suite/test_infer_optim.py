"""``minibert adapter infer``'s optimizer row (spec/suite/infer/optim.py): the ``optimizer(...)``
call it writes for the realistic examples' optimizer classes (attributes, a hyperparameter dict
and ``update(..., skip_decay=())``, a ``betas`` tuple with ``(m, v)`` pairs per name, lr and t
passed to the step), decided by running them and written only where a few steps equal the
reference's ``adam_step`` -- so that an optimizer's bug (the examples' ``BUGS``, the catalog's
optimizer mutants written as classes) is listed as not mapped, never adapted away."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from minibert_spec.suite.infer import infer_source
from minibert_spec.suite.infer.optim import OPTIM_RTOL, infer_optimizers
from tests.examples import (
    realstyle_minigpt,
    realstyle_numpy_transformer,
    realstyle_step_kwargs,
    realstyle_tutorial,
)
from tests.suite.infer_support import load_source as _load
from tests.suite.infer_support import not_mapped_deviation

# example -> (its optimizer class, what the adapter's optimizer(...) call must hold)
EXAMPLES = {
    "tutorial": (realstyle_tutorial, "Adam", [
        "hyper={'lr': 'lr', 'beta1': 'b1', 'beta2': 'b2', 'eps': 'eps'}", "m='m'", "v='v'"]),
    "numpy_transformer": (realstyle_numpy_transformer, "Adam", [
        "step='update'", "hyper={'lr': 'hp.lr', 'beta1': 'hp.beta1', 'beta2': 'hp.beta2', "
        "'eps': 'hp.eps', 'weight_decay': 'hp.weight_decay'}", "no_decay='skip_decay'"]),
    "minigpt": (realstyle_minigpt, "AdamW", [
        "hyper={'lr': 'lr', ('beta1', 'beta2'): 'betas', 'eps': 'eps', 'weight_decay': 'wd'}",
        "m=lambda o: {k: s[0] for k, s in o.state.items()}",
        "v=lambda o: {k: s[1] for k, s in o.state.items()}", "no_decay='no_decay'"]),
    "step_kwargs": (realstyle_step_kwargs, "Adam", [
        "'lr': 'lr='", "('beta1', 'beta2'): 'betas'", "t='t='", "first_t=1"]),
}


def _row(cls) -> tuple[str, list[str]]:
    from minibert_spec.suite.infer.optim import optimizer_call

    rows, missing = infer_optimizers([cls])
    return (optimizer_call(rows[0], "impl") if rows else ""), missing


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_infer_finds_each_examples_optimizer_form(example):
    module, cls, want = EXAMPLES[example]
    row, missing = _row(getattr(module, cls))
    assert row.startswith(f"adam_init, adam_step = optimizer(\n    impl.{cls},"), (row, missing)
    for w in want:
        assert w in row, row
    assert not missing, missing


@pytest.mark.parametrize("example", ["tutorial", "numpy_transformer", "step_kwargs"])
def test_an_examples_buggy_optimizer_is_not_mapped(example, monkeypatch):
    """The examples' BUGS: a forgotten bias correction (tutorial), L2 folded into the gradient
    (numpy_transformer: only visible with weight decay), a counter off by one (step_kwargs):
    no row, and the one line says by how much it differs from the reference, and where."""
    module, cls, _ = EXAMPLES[example]
    monkeypatch.setattr(module, "BUGS", {"adam"})
    row, missing = _row(getattr(module, cls))
    assert row == "", row
    assert len(missing) == 1, missing
    assert missing[0].startswith(f"class {cls}: optimizer("), missing
    assert "differs from the reference adam_step by" in missing[0], missing
    assert "at step 1" in missing[0] and missing[0].endswith("no adam row written"), missing


# A textbook AdamW with each of the catalog's optimizer bugs (spec/mutants.py: optim.adam,
# optim.adamw) behind a switch, and an off-by-one counter
TEXTBOOK = """
    import numpy as np

    BUG = {bug!r}


    class Optim:
        def __init__(self, params, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
            self.lr, self.beta1, self.beta2, self.eps, self.wd = lr, beta1, beta2, eps, weight_decay
            self.m = [np.zeros_like(p) for p in params.values()]
            self.v = [np.zeros_like(p) for p in params.values()]
            self.step_count = 0

        def step(self, params, grads, no_decay=()):
            self.step_count += 1
            t = self.step_count + (1 if BUG == "off_by_one" else 0)
            for i, k in enumerate(params):
                decays = k not in no_decay or BUG == "decays_no_decay"
                g = grads[k] + (self.wd * params[k] if BUG == "coupled_l2" and decays else 0)
                self.m[i] = self.beta1 * self.m[i] + (1 - self.beta1) * g
                self.v[i] = self.beta2 * self.v[i] + (1 - self.beta2) * g * g
                bc1 = 1.0 if BUG == "no_bias_correction" else 1 - self.beta1 ** t
                bc2 = 1.0 if BUG == "no_bias_correction" else 1 - self.beta2 ** t
                m_hat, v_hat = self.m[i] / bc1, self.v[i] / bc2
                if BUG == "eps_inside_sqrt":
                    update = m_hat / np.sqrt(v_hat + self.eps)
                else:
                    update = m_hat / (np.sqrt(v_hat) + self.eps)
                if decays and BUG != "coupled_l2":
                    update = update + self.wd * params[k]
                params[k] -= self.lr * update
"""
BUGS = ("no_bias_correction", "eps_inside_sqrt", "coupled_l2", "decays_no_decay", "off_by_one")


def test_the_textbook_optimizer_is_mapped_with_its_list_moments(tmp_path, monkeypatch):
    mod = _load(tmp_path, monkeypatch, TEXTBOOK.format(bug=""), "optim_textbook_ok")
    row, missing = _row(mod.Optim)
    assert not missing, missing
    for w in ("hyper={'lr': 'lr', 'beta1': 'beta1', 'beta2': 'beta2', 'eps': 'eps', "
              "'weight_decay': 'wd'}", "m='m'", "v='v'", "t='step_count'", "no_decay='no_decay'"):
        assert w in row, row


@pytest.mark.parametrize("bug", BUGS)
def test_a_catalog_bug_of_an_optimizer_is_never_inferred_away(bug, tmp_path, monkeypatch):
    """Each bug differs from the reference under the evidence's configuration (weight decay,
    exempt names through no_decay, eps 1e-3, three steps): not mapped.  A no_decay keyword that
    ignores its names is a bug too: the row is not written without it."""
    mod = _load(tmp_path, monkeypatch, TEXTBOOK.format(bug=bug), f"optim_textbook_{bug}")
    row, missing = _row(mod.Optim)
    assert not_mapped_deviation(row, missing, "Optim") > 1e3 * OPTIM_RTOL, missing


def test_classes_that_are_no_adam_are_named_or_left_alone(tmp_path, monkeypatch):
    """SGD (a step, no moments) is named with why; a layer with no step method and a trainer
    whose step takes a batch are not optimizers and not listed."""
    mod = _load(tmp_path, monkeypatch, """
        import numpy as np

        class SGD:
            def __init__(self, params, lr=0.1):
                self.lr = lr

            def step(self, params, grads):
                for k in params:
                    params[k] -= self.lr * grads[k]

        class Dense:
            def __init__(self, W):
                self.W = W

            def forward(self, x):
                return x @ self.W

        class Trainer:
            def __init__(self, model):
                self.model = model

            def step(self, batch):
                return 0.0
        """, "optim_not_adam")
    rows, missing = infer_optimizers([mod.SGD, mod.Dense, mod.Trainer])
    assert rows == []
    assert missing == ["class SGD: no moments: after two steps of step, no pair of containers "
                       "keyed like the parameters (one signed: m, one >= 0: v)"], missing


def test_the_written_adapter_runs_and_equals_the_reference(tmp_path, monkeypatch):
    """A module holding only an optimizer without weight decay: the adapter imports optimizer
    alone, declares CAPABILITIES weight_decay False, and its adam_step is the reference's."""
    from minibert_reference.optim import adam_init as ref_init
    from minibert_reference.optim import adam_step as ref_step

    _load(tmp_path, monkeypatch, """
        import numpy as np

        class Adam:
            def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
                self.cfg = {"lr": lr, "betas": betas, "eps": eps}
                self.state = {k: {"m": np.zeros_like(p), "v": np.zeros_like(p)} for k, p in
                              params.items()}
                self.n = 0

            def apply(self, params, grads):
                self.n += 1
                (b1, b2), eps = self.cfg["betas"], self.cfg["eps"]
                for k, s in self.state.items():
                    s["m"] = b1 * s["m"] + (1 - b1) * grads[k]
                    s["v"] = b2 * s["v"] + (1 - b2) * grads[k] ** 2
                    params[k] -= self.cfg["lr"] * (s["m"] / (1 - b1 ** self.n)) / (
                        np.sqrt(s["v"] / (1 - b2 ** self.n)) + eps)
        """, "optim_only_adam")
    src = infer_source("optim_only_adam")
    assert "from minibert_spec.suite.adapters import optimizer\n" in src, src
    assert "CAPABILITIES = {'weight_decay': False}" in src, src
    assert "hyper={'lr': 'cfg.lr', ('beta1', 'beta2'): 'cfg.betas', 'eps': 'cfg.eps'}" in src
    assert "m=lambda o: {k: s['m'] for k, s in o.state.items()}" in src, src
    adapter = _load(tmp_path, monkeypatch, src, "optim_only_adam_adapter")
    rng = np.random.default_rng(3)
    p = {"a": rng.standard_normal((2, 3)), "b": rng.standard_normal(3)}
    state, ref, rp = adapter.adam_init(p), ref_init(p), p
    for _ in range(3):
        g = {k: rng.standard_normal(x.shape) for k, x in p.items()}
        p, state = adapter.adam_step(p, g, state, lr=0.05, beta1=0.8, beta2=0.9, eps=1e-4)
        rp, ref = ref_step(rp, g, ref, lr=0.05, beta1=0.8, beta2=0.9, eps=1e-4)
    for k in p:
        np.testing.assert_allclose(p[k], rp[k], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(state["v"][k], ref["v"][k], rtol=1e-12, atol=1e-14)
    assert state["step"] == 3


@pytest.mark.slow  # the slow tier: a minibert check subprocess (issue 40)
def test_the_inferred_optimizer_row_is_green_under_minibert_check(tmp_path):
    from minibert_spec.cli import main as minibert

    out = tmp_path / "inferred_tutorial.py"
    assert minibert(["adapter", "infer", realstyle_tutorial.__name__, "-o", str(out)]) == 0
    assert "adam_init, adam_step = optimizer(" in out.read_text()
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    env.pop("MINIBERT_EXAMPLE_BUGS", None)
    check = subprocess.run([sys.executable, "-m", "minibert_spec.cli", "check",
                            "inferred_tutorial", "--ops", "adam", "--quick", "-j", "1"],
                           capture_output=True, text=True, env=env)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-2000:]
    assert "1 op(s) conform" in check.stdout, check.stdout[-2000:]
