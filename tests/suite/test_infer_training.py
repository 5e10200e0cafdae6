"""``minibert adapter infer``'s training rows (spec/suite/infer/training.py): the ``schedule``
row (``warmup_linear_lr``, from a function of the step with its arguments in any order, or a
class) and the ``clip`` row (``global_grad_norm``, ``clip_by_global_norm``, from a clip
function returning (clipped, norm), the clipped dict, or clipping in place), decided by running
the adapter's own text against the reference -- so that a schedule's or a clipping's bug (the
examples' ``BUGS``, per-tensor clipping, a warmup off by one) is listed as not mapped, never
adapted away; the lr(0) = 0 convention and a divisor guard are declared by their numbers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from minibert_spec.suite.infer import infer_source
from minibert_spec.suite.infer.training import infer_training, training_code
from tests.examples import realstyle_minigpt
from tests.suite.infer_support import load_source as _load


def _rows(mod) -> tuple[dict, list[str]]:
    rows, missing = infer_training(mod)
    return {m.op: m for m in rows}, missing


def _ns(mod, row) -> dict:
    """The row's written text, executed against the module (as the adapter runs it)."""
    ns = {"impl": mod}
    exec(training_code(row, "impl"), ns)  # noqa: S102 -- the text under test
    return ns


def _grads(seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    return {"a": scale * rng.standard_normal((3, 4)), "b": 5 * scale * rng.standard_normal(4)}


def _assert_clip_is_reference(ns, eps=0.0):
    from minibert_reference.optim import clip_by_global_norm, global_grad_norm

    for seed, scale in ((0, 1.0), (1, 1e-4), (2, 10.0)):
        g = _grads(seed, scale)
        norm = global_grad_norm(g)
        assert abs(ns["global_grad_norm"](g) - norm) <= 1e-12 * norm
        for max_norm in (norm / 3, 2 * norm):
            got, n = ns["clip_by_global_norm"](g, max_norm)
            want, _ = clip_by_global_norm(g, max_norm, eps=eps)
            assert abs(n - norm) <= 1e-12 * norm
            for k in g:
                np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=0)


# ------------------------------------------------------------------------- realstyle_minigpt
def test_minigpt_rows_are_written_with_the_convention_and_the_guard(monkeypatch):
    monkeypatch.setattr(realstyle_minigpt, "BUGS", set())
    rows, missing = _rows(realstyle_minigpt)
    assert not missing, missing
    assert training_code(rows["schedule"], "impl") == (
        "def warmup_linear_lr(step, *, peak_lr, warmup_steps, total_steps):\n"
        "    return impl.lr_at(step, peak_lr, warmup_steps, total_steps)\n")
    assert rows["schedule"].declares == {"conventions": ("lr(0)=0",)}
    clip = training_code(rows["clip"], "impl")
    assert "def clip_by_global_norm(grads, max_norm, *, eps=1e-06):\n" \
           "    return impl.clip_grad_norm(grads, max_norm, eps=eps)\n" in clip, clip
    assert rows["clip"].declares == {"guards": {"clip_eps": 1e-6}}
    _assert_clip_is_reference(_ns(realstyle_minigpt, rows["clip"]), eps=1e-6)


def test_minigpt_per_tensor_clipping_is_not_mapped(monkeypatch):
    """The example's BUGS=clip (each tensor clipped by its own norm): no clip row, one line
    with the deviation; the schedule row is unaffected."""
    monkeypatch.setattr(realstyle_minigpt, "BUGS", {"clip"})
    rows, missing = _rows(realstyle_minigpt)
    assert sorted(rows) == ["schedule"], rows
    assert len(missing) == 1, missing
    assert missing[0].startswith("clip: function clip_grad_norm: the adapter around it differs "
                                 "from the reference clip_by_global_norm by "), missing
    assert missing[0].endswith("not mapped"), missing


def test_the_minigpt_adapter_declares_the_convention_and_the_guard(monkeypatch):
    monkeypatch.setattr(realstyle_minigpt, "BUGS", set())
    src = infer_source(realstyle_minigpt.__name__)
    assert "'conventions': ('lr(0)=0',), 'guards': {'clip_eps': 1e-06}}" in src, src
    assert "schedule: no probe" not in src and "#   clip:" not in src, src


# ------------------------------------------------------------------------- schedule forms
SCHEDULES = """
    BUG = {bug!r}


    def get_lr(step, total, peak, warmup):
        # the protocol's form, its arguments in another order
        if step < warmup:
            return peak * (step + 1) / (warmup + (1 if BUG == "warmup_plus_one" else 0))
        end = total if BUG == "decay_over_total" else total - warmup
        return peak * max(0.0, (total - step) / end)


    class WarmupLinear:
        def __init__(self, peak_lr, warmup, total):
            self.peak, self.warmup, self.total = peak_lr, warmup, total

        def lr(self, step):
            if step < self.warmup:
                return self.peak * (step + 1) / self.warmup
            return self.peak * max(0.0, (self.total - step) / (self.total - self.warmup))
"""


def test_a_schedule_with_permuted_arguments_is_mapped_by_its_numbers(tmp_path, monkeypatch):
    mod = _load(tmp_path, monkeypatch, SCHEDULES.format(bug=""), "sched_forms_ok")
    rows, _ = _rows(mod)
    m = rows["schedule"]
    assert "return impl.get_lr(step, total_steps, peak_lr, warmup_steps)" in m.code, m.code
    assert m.declares == {}, m.declares  # the reference's form: no convention
    assert "also matches: class WarmupLinear.lr" in m.evidence[-1], m.evidence
    from minibert_reference.optim import warmup_linear_lr

    fn = _ns(mod, m)["warmup_linear_lr"]
    for step in range(12):
        kw = dict(peak_lr=1e-3, warmup_steps=4, total_steps=11)
        assert fn(step, **kw) == pytest.approx(warmup_linear_lr(step, **kw), rel=1e-14)


def test_a_schedule_class_is_mapped_when_no_function_is(tmp_path, monkeypatch):
    src = SCHEDULES.format(bug="").split("class WarmupLinear")[1]
    mod = _load(tmp_path, monkeypatch, "class WarmupLinear" + src, "sched_class_only")
    rows, missing = _rows(mod)
    assert "return impl.WarmupLinear(peak_lr, warmup_steps, total_steps).lr(step)" in \
        rows["schedule"].code, (rows, missing)


@pytest.mark.parametrize("bug", ["warmup_plus_one", "decay_over_total"])
def test_a_schedule_bug_is_never_inferred_away(bug, tmp_path, monkeypatch):
    """The function is wrong under every permutation: not mapped, with its closest deviation,
    and still named when the correct class beside it is the row."""
    mod = _load(tmp_path, monkeypatch, SCHEDULES.format(bug=bug), f"sched_bug_{bug}")
    rows, missing = _rows(mod)
    assert "impl.WarmupLinear(" in rows["schedule"].code, rows["schedule"].code
    with_class = [s for s in missing if s.startswith("schedule:")]
    mod2 = _load(tmp_path, monkeypatch, SCHEDULES.format(bug=bug).split("class")[0],
                 f"sched_bug_{bug}_alone")
    rows, missing = _rows(mod2)
    assert "schedule" not in rows, rows
    alone = [s for s in missing if s.startswith("schedule:")]
    assert len(alone) == 1 and with_class == alone, (alone, with_class)
    assert alone[0].startswith("schedule: function get_lr: no mapping of its arguments total, "
                               "peak, warmup to peak_lr, warmup_steps, total_steps gives"), alone
    assert alone[0].endswith("not mapped"), alone
    dev = float(alone[0].split("differs by ")[1].split()[0])
    assert dev > 1e-3, alone


# ------------------------------------------------------------------------- clip forms
CLIPS = {
    # the clipped dict alone, the norm from its own function
    "dict": """
        def grad_norm(grads):
            return float(np.sqrt(sum((g * g).sum() for g in grads.values())))

        def clip(grads, max_norm):
            s = min(1.0, max_norm / grad_norm(grads))
            return {k: g * s for k, g in grads.items()}
        """,
    # torch's clip_grad_norm_: in place, returning the norm, eps fixed inside (no argument)
    "inplace_norm": """
        def clip_grad_norm_(grads, max_norm):
            norm = float(np.sqrt(sum((g * g).sum() for g in grads.values())))
            s = min(1.0, max_norm / (norm + 1e-6))
            for k in grads:
                grads[k] *= s
            return norm
        """,
    # in place, returning nothing; (norm, clipped) order elsewhere is covered by the tuple
    "inplace": """
        def total_norm(grads):
            return float(np.sqrt(sum((g * g).sum() for g in grads.values())))

        def clip_gradients(grads, max_norm):
            s = min(1.0, max_norm / total_norm(grads))
            for g in grads.values():
                g *= s
        """,
    "tuple10": """
        def clip_global(grads, max_norm):
            norm = float(np.sqrt(sum((g * g).sum() for g in grads.values())))
            s = min(1.0, max_norm / norm)
            return norm, {k: g * s for k, g in grads.items()}
        """,
}


@pytest.mark.parametrize("form", sorted(CLIPS))
def test_each_clip_form_is_written_and_equals_the_reference(form, tmp_path, monkeypatch):
    mod = _load(tmp_path, monkeypatch, "import numpy as np\n" + textwrap.dedent(CLIPS[form]),
                f"clip_form_{form}")
    rows, missing = _rows(mod)
    assert "clip" in rows, missing
    eps = 1e-6 if form == "inplace_norm" else 0.0
    assert rows["clip"].declares == ({"guards": {"clip_eps": 1e-6}} if eps else {})
    code = rows["clip"].code
    assert ("g.copy()" in code) == form.startswith("inplace"), code
    assert ("clip_by_global_norm(grads, float(\"inf\"))[1]" in code) == (form in (
        "inplace_norm", "tuple10")), code
    _assert_clip_is_reference(_ns(mod, rows["clip"]), eps=eps)


CLIP_BUGS = {
    "per_tensor": "{k: g * min(1.0, max_norm / float(np.linalg.norm(g))) for k, g in "
                  "grads.items()}, norm",
    "always_scales": "{k: g * (max_norm / norm) for k, g in grads.items()}, norm",
    "squared_norm": "{k: g * min(1.0, max_norm / norm) for k, g in grads.items()}, norm ** 2",
    "large_eps": "{k: g * min(1.0, max_norm / (norm + 1e-2)) for k, g in grads.items()}, norm",
}


@pytest.mark.parametrize("bug", sorted(CLIP_BUGS))
def test_a_clipping_bug_is_never_inferred_away(bug, tmp_path, monkeypatch):
    """Per-tensor clipping, a scale below max_norm too, the squared norm returned, and a
    "guard" of 1e-2 (another clipping rule: outside clip_eps's range) are not mapped."""
    mod = _load(tmp_path, monkeypatch, f"""
        import numpy as np

        def clip_grads(grads, max_norm):
            norm = float(np.sqrt(sum((g * g).sum() for g in grads.values())))
            return {CLIP_BUGS[bug]}
        """, f"clip_bug_{bug}")
    rows, missing = _rows(mod)
    assert "clip" not in rows, rows["clip"].code
    line = next(s for s in missing if s.startswith("clip:"))
    assert line.startswith("clip: function clip_grads: ") and line.endswith(
        "not mapped"), line
    if bug == "large_eps":
        assert "divides by norm + 0.01, outside the clip_eps guard's range" in line, line


def test_a_module_without_either_adds_no_line(tmp_path, monkeypatch):
    """Layers alone (no function of a step computing a rate, no clip function): no row and no
    not-mapped line (the adapter's list stays "nothing" where every layer is mapped), as for
    classes that are no optimizer."""
    mod = _load(tmp_path, monkeypatch, """
        def relu(x):
            return x * (x > 0)

        def attention(q, k, v, mask):
            return q @ k.T @ v
        """, "training_none")
    assert _rows(mod) == ({}, [])


# ------------------------------------------------------------------------- minibert check
@pytest.mark.slow  # the slow tier: minibert check subprocesses (issue 40)
def test_the_inferred_rows_are_green_and_go_red_on_the_clip_bug(tmp_path):
    """The adapter inferred for realstyle_minigpt passes minibert check on its schedule and
    clip rows; the same adapter run on the example's BUGS=clip is red."""
    from minibert_spec.cli import main as minibert

    out = tmp_path / "inferred_minigpt_training.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    env.pop("MINIBERT_EXAMPLE_BUGS", None)
    assert minibert(["adapter", "infer", realstyle_minigpt.__name__, "-o", str(out)]) == 0
    assert "def warmup_linear_lr(" in out.read_text() and "def clip_by_global_norm(" in \
        out.read_text()
    cmd = [sys.executable, "-m", "minibert_spec.cli", "check", out.stem, "--ops", "clip",
           "schedule", "--quick", "-j", "1"]
    check = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-2000:]
    assert "2 op(s) conform" in check.stdout, check.stdout[-2000:]
    red = subprocess.run(cmd, capture_output=True, text=True,
                         env={**env, "MINIBERT_EXAMPLE_BUGS": "clip"})
    assert red.returncode != 0, red.stdout[-3000:]
    assert "1 op(s) fail: clip" in red.stdout, red.stdout[-2000:]
