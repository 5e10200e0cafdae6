"""``minibert adapter infer``'s adam, schedule, clip and block rows never infer a bug away
(issue 39: "each catalog mutant that applies to a class-style example is red under the adapter
``infer`` writes").  tests/examples/infer_training.py computes through the reference's optimizer
functions and block kernels at call time, so a catalog mutant patched into the reference is a
bug of the example too; under the mutant ``infer`` is run again, and the adapter it writes must
be red for the row's op, or the row not written (n/a) -- never green.

infer's own evidence for these rows compares against the reference, which the mutant patches
too: the row may well be written (the example equals the mutated reference), and then the
suite's other checks (the oracle, the invariants) must catch the bug.  The same pattern as
tests/suite/test_infer.py's ``test_infer_never_infers_a_bug_away`` for the op probes, with its
skip for a mutant that does not change what the example computes."""

from __future__ import annotations

import numpy as np
import pytest

import minibert_reference.ops as reference_ops
from minibert_spec.mutants import CATALOG
from minibert_spec.suite.infer import infer_source
from tests.examples import infer_training as example
from tests.suite.infer_support import assert_no_bug_inferred_away
from tests.suite.infer_support import load_source as _load
from tests.unshrunk import check_implementation

MODULE = example.__name__
# the optimizer mutants' equations -> the row they break
OPTIM_OPS = {"optim.adam": "adam", "optim.adamw": "adam", "schedule.warmup_linear": "schedule",
             "clip.global_norm": "clip"}
# the example block's forms (infer_training.BLOCK) a block kernel's mutant is tried in; the
# other kernels' (attention, LayerNorm, the FFN, GELU, ...) in the first.  (SwiGLU is left
# out: the suite's SwiGLU oracle builds a LlamaConfig that transformers 5 rejects for an odd
# head size, so a correct SwiGLU + LayerNorm block is red already.)
BLOCK_FORMS = ("post", "pre", "inner")
# findings, not infer's: under these the inferred row is written (the example equals the
# mutated reference, as it must) and stays green -- the reference itself under the mutant is
# green on the same op, so the suite's checks of that row never reach the bug (a stability bug
# of a kernel the block runs, seen only at inputs the block's cases never draw).  Strict: a
# check that starts killing one flips it.  (The global norm's chunk tail was one, past 64K
# entries: invariant[clip.model_sized_tensors] kills it now; so were LayerNorm's one-pass
# variance and softmax without the max subtracted in the post-LN block: the block families'
# invariant[<family>.large_mean_and_logits_float32] kill them now.)
KNOWN_GREEN: dict[str, str] = {}
# each row's line in the adapter when infer writes it
ROW_LINES = {"adam": "adam_init, adam_step = optimizer(", "schedule": "def warmup_linear_lr(",
             "clip": "def clip_by_global_norm(", "block": "block_forward, block_backward = layer("}


def _in_blocks(target: str) -> bool:
    """Whether an ``ops.`` target is one of the block kernels (reference/ops/blocks.py)."""
    fn = getattr(reference_ops, target.split(".", 1)[1], None)
    return getattr(fn, "__module__", "") == "minibert_reference.ops.blocks"


def _cases() -> list:
    """(mutant, op, block form or None) for every catalog mutant whose targets are functions the
    rows reach: the optimizer's, the schedule's and clipping's, every ops kernel (those the
    block does not run are skipped by their fingerprint)."""
    out = []
    for name, m in sorted(CATALOG.items()):
        aliases = {t.split(".", 1)[0] for t in m.targets}
        if aliases == {"optim"} and m.equation in OPTIM_OPS:
            out.append((name, OPTIM_OPS[m.equation], None, name))
        elif aliases == {"ops"}:
            forms = BLOCK_FORMS if any(map(_in_blocks, m.targets)) else BLOCK_FORMS[:1]
            out += [(name, "block", f, f"{name}-{f}") for f in forms]
    return [pytest.param(n, op, f, id=i, marks=[pytest.mark.xfail(
        strict=True, reason=f"finding: {KNOWN_GREEN[i]}")] if i in KNOWN_GREEN else [])
            for n, op, f, i in out]


CASES = _cases()


def _grads(rng, shapes: dict) -> dict:
    return {k: rng.standard_normal(s) * (1 + 2 * i) for i, (k, s) in enumerate(shapes.items())}


def _fingerprint(op: str) -> list:
    """What the example's code for ``op`` computes on fixed probes (its parameters, moments,
    rates, norms, outputs and gradients), to tell whether a mutant reaches it at all."""
    rng = np.random.default_rng(0)
    if op == "adam":
        shapes = {"enc.W": (3, 4), "enc.b": (4,), "ln.gamma": (4,)}
        params = _grads(rng, shapes)
        opt = example.Adam(params, learning_rate=0.01, b1=0.7, b2=0.8, epsilon=1e-3, wd=0.1)
        out = []
        for _ in range(3):
            opt.step(params, _grads(rng, shapes), no_decay=("enc.b", "ln.gamma"))
            out += [*params.values(), *opt.m.values(), *opt.v.values(), np.asarray(opt.t)]
        return out
    if op == "schedule":
        return [np.asarray([example.lr_at(s, w, p, t) for s in range(t + 1)])
                for p, w, t in ((0.37, 5, 23), (2e-3, 1, 7), (0.05, 3, 4))]
    if op == "clip":
        shapes = {"enc.W": (3, 4), "enc.b": (4,), "head.W": (4, 2)}
        out = []
        for scale in (1.0, 1e-4, 1e5):
            g = {k: a * scale for k, a in _grads(rng, shapes).items()}
            n = example.grad_norm(g)
            norm, clipped = example.clip_gradients(g, 0.25 * n)
            out += [np.asarray([n, norm]), *clipped.values(),
                    *example.clip_gradients(g, 4 * n)[1].values()]
        big = {"emb": rng.standard_normal((3, 50_001))}  # past the norm's 64K-element chunk
        return out + [np.asarray(example.grad_norm(big))]
    H = 8
    block = example.Block(H, 2)
    p = {path: rng.standard_normal(getattr(block, path).shape) / 3 for path in block.names.values()}
    for path, a in p.items():
        setattr(block, path, a + 1 if path.endswith("_g") else a)
    x = rng.standard_normal((2, 3, H))
    y = block.forward(x)
    dx = block.backward(np.cos(y))
    return [y, dx, *(getattr(block, f"d{path}") for path in block.names.values())]


def _apply_form(monkeypatch, form) -> None:
    if form is not None:
        monkeypatch.setitem(example.BLOCK, "norm", form)


def test_the_example_is_fully_mapped_and_green(tmp_path, monkeypatch):
    """On the correct reference, infer writes each row for the example's code -- no "not
    mapped" line names a class or function of it -- and the adapter is green on each op."""
    for form in BLOCK_FORMS:
        _apply_form(monkeypatch, form)
        source = infer_source(MODULE)
        for line in ROW_LINES.values():
            assert line in source, source
        not_mapped = source.split("# not mapped")[1]
        for name in ("Adam", "Block", "lr_at", "grad_norm", "clip_gradients"):
            assert name not in not_mapped, not_mapped
        assert f"fixed={{'norm': {form!r}, 'activation': 'gelu', 'causal': False}}" in source
        if form == BLOCK_FORMS[0]:
            for want in ("hyper={'lr': 'learning_rate', 'beta1': 'b1', 'beta2': 'b2', "
                         "'eps': 'epsilon', 'weight_decay': 'wd'}", "no_decay='no_decay'",
                         "return impl.lr_at(step, warmup_steps, peak_lr, total_steps)",
                         "norm, clipped = impl.clip_gradients(grads, max_norm)",
                         "return impl.grad_norm(grads)"):
                assert want in source, source


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("form", BLOCK_FORMS)
def test_the_inferred_rows_are_green_on_correct_code(form, tmp_path, monkeypatch):
    _apply_form(monkeypatch, form)
    adapter = _load(tmp_path, monkeypatch, infer_source(MODULE), f"inferred_training_{form}")
    report = check_implementation(adapter, ops=list(ROW_LINES))
    failed = [f"{r.id}: {r.message[:300]}" for r in report.failures()]
    assert not failed, "\n".join(failed)
    assert all(report.verdicts()[op] == "ok" for op in ROW_LINES), report.verdicts()


def test_every_optimizer_mutant_and_the_block_kernels_are_tried():
    ids = {p.values[0] for p in CASES}
    optim = {n for n, m in CATALOG.items() if m.equation in OPTIM_OPS}
    assert optim <= ids and len(optim) >= 8, sorted(optim - ids)
    blocks = {n for n, m in CATALOG.items() if any(map(_in_blocks, m.targets))}
    assert blocks <= ids and len(blocks) >= 7, sorted(blocks - ids)
    assert set(KNOWN_GREEN) <= {p.id for p in CASES}, sorted(KNOWN_GREEN)


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("name,op,form", CASES)
def test_infer_never_infers_a_training_bug_away(name, op, form, tmp_path, monkeypatch):
    """Under the mutant, the example's code either no longer equals the reference's (the row is
    not written: n/a, never a pass) or the adapter writes the row and the op is red.  A mutant
    that does not change what the example computes (another block form's kernel, an op the
    block never runs) does not apply to it."""
    _apply_form(monkeypatch, form)
    assert_no_bug_inferred_away(name, op, MODULE, lambda: _fingerprint(op), ROW_LINES[op],
                                tmp_path, monkeypatch)
