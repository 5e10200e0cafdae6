"""Every red says what differed and where: expected and actual values even for a non-finite
result, the Adam reds' expected step ratio, the user's own line for an exception raised deep in
NumPy, one line for repeated conventions, the line and fix of a NEP 50 float64 promotion, a
pipeline red blamed on the op at fault -- and no false red of the float32-vs-float64 LayerNorm
invariant where the terms dx sums are larger than dx."""

from __future__ import annotations

import re
import textwrap

import numpy as np
import pytest

from minibert_spec.suite.report import CheckReport
from minibert_spec.suite.run import Result
from tests.examples import (
    guarded_optim,
    nep50_promotion,
    promotion_impl,
    promotion_impl_adapter,
    realstyle_minigpt,
)
from tests.unshrunk import check_implementation


def _module(tmp_path, monkeypatch, name, source):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    return importlib.import_module(name)


def test_a_non_finite_loss_names_the_expected_value(tmp_path, monkeypatch):
    """A cross-entropy without the max shift overflows at logits of 1e4: the red says "loss:
    inf, expected <the float64 log-sum-exp loss>", never the inf alone."""
    impl = _module(tmp_path, monkeypatch, "unshifted_ce", """
        import numpy as np

        def cross_entropy_forward(logits, labels, *, ignore_index=-100, reduction="mean"):
            e = np.exp(logits)  # no max shift: overflows
            p = e / e.sum(-1, keepdims=True)
            keep = labels != ignore_index
            safe = np.where(keep, labels, 0)
            pick = np.take_along_axis(p, safe[..., None], -1)[..., 0]
            n = max(int(keep.sum()), 1) if reduction == "mean" else 1
            return -(np.log(pick) * keep).sum() / n, (p, safe, keep, n)

        def cross_entropy_backward(dloss, cache):
            p, safe, keep, n = cache
            d = p.copy()
            np.put_along_axis(d, safe[..., None], np.take_along_axis(d, safe[..., None], -1) - 1,
                              -1)
            return (d * keep[..., None] * dloss / n,)
        """)
    report = check_implementation(impl, match=r"large_logits-f64")
    messages = [r.message for r in report.failures()]
    assert messages, report.summary()
    assert any(re.search(r"loss at logits of magnitude 1e4: (nan|inf), expected \d+\.\d+", m)
               for m in messages), messages


def test_an_adam_red_names_the_expected_step_ratio(monkeypatch):
    monkeypatch.setattr(guarded_optim, "BUGS", {"adam"})
    report = check_implementation(guarded_optim, ids=["invariant[adam.first_step]"])
    (r,) = report.failures()
    assert re.search(r"step / lr at index \(\d+(, \d+)*\): got [\d.]+, expected 1\b", r.message), \
        r.message


def test_an_exception_inside_numpy_is_located_at_the_users_line(tmp_path, monkeypatch):
    impl = _module(tmp_path, monkeypatch, "einsum_linear", """
        import numpy as np

        def linear_forward(x, W, b=None):
            y = np.einsum("...i,ij->...j", x, W.T)  # W.T: the shapes do not chain
            return (y if b is None else y + b), (x, W)

        def linear_backward(dy, cache):
            x, W = cache
            return dy @ W.T, x.reshape(-1, x.shape[-1]).T @ dy.reshape(-1, W.shape[1]), None
        """)
    report = check_implementation(impl, ids=["fd[linear_nobias]"])
    (r,) = report.failures()
    assert "raised in linear_forward, einsum_linear.py:5" in r.message, r.message
    assert "einsumfunc.py" not in r.message


def test_repeated_conventions_collapse_to_one_line_with_a_count():
    def result(i, text):
        return Result(f"invariant[x{i}]", "invariant", ("cross_entropy",), "passed",
                      conventions=[text])

    lines = [f"cross_entropy: loss promoted to float64: float32 rounding would change it by "
             f"{v:.1e}" for v in (1e-8, 2e-8, 2e-8)]
    report = CheckReport("impl", [result(i, t) for i, t in enumerate(lines)]
                         + [result(9, "lr(0) = 0 (declared)")])
    got = report.conventions()["cross_entropy"]
    assert got == [f"{lines[0]} (x3 checks, values differ)", "lr(0) = 0 (declared)"]


def test_a_nep50_promotion_is_named_with_its_line_and_fix():
    report = check_implementation(nep50_promotion, ops=["softmax"], kinds=["invariant"])
    failed = report.failures()
    assert failed and {r.ops for r in failed} == {("softmax",)}
    source = open(nep50_promotion.__file__).read().splitlines()
    line = next(i for i, text in enumerate(source, 1) if "/ np.sqrt(TEMPERATURE)" in text)
    where = f"nep50_promotion.py:{line}"
    first = next(r for r in failed if "cause:" in r.message)
    assert f"float64 first appears at {where}" in first.message
    assert "NEP 50" in first.message and "math.sqrt(d)" in first.message
    # the reds of that line are one group, named by the line
    (group,) = report.groups()
    assert group["cause"].endswith(f"at {where}") and group["count"] == len(failed)


def test_a_promotion_is_not_blamed_on_a_constructor_that_holds_no_float32(tmp_path,
                                                                          monkeypatch):
    """A class whose constructor draws float64 initial weights (which the adapter replaces)
    and whose forward scales by ``np.sqrt(int)``: the cause is the forward's line, not the
    constructor's (found on a public repository: a Xavier init was blamed)."""
    mod = _module(tmp_path, monkeypatch, "classy_promotion", """
        import numpy as np
        from minibert_spec.suite.adapters import layer

        class Softmax:
            def __init__(self, d=4):
                self.d = d
                scale = np.sqrt(2 / d)  # a float64 local: the constructor's Xavier scale
                self.unused = np.random.default_rng(0).standard_normal((d, d)) * scale

            def forward(self, x):
                s = x / np.sqrt(self.d)
                e = np.exp(s - s.max(-1, keepdims=True))
                self.p = e / e.sum(-1, keepdims=True)
                return self.p

            def backward(self, dp):
                p = self.p
                return p * (dp - (p * dp).sum(-1, keepdims=True)) / np.sqrt(self.d)

        softmax_forward, softmax_backward = layer("softmax", Softmax)
        """)
    report = check_implementation(mod, ops=["softmax"], kinds=["invariant"])
    first = next(r for r in report.failures() if "cause:" in r.message)
    source = (tmp_path / "classy_promotion.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if "s = x / np.sqrt(self.d)" in text)
    assert f"float64 first appears at classy_promotion.py:{line} in forward" in first.message, \
        first.message[:600]


def test_a_promotion_is_named_where_it_is_made_not_where_a_table_is_cast_back(tmp_path,
                                                                              monkeypatch):
    """A softmax whose float64 table (made from integers) is cast to the input's dtype on its
    way in, then scaled by ``np.sqrt(d)``, a float64 scalar: the cause is the scaling line --
    the cast table was a float64 local first, and naming it fixes nothing (met on a RoPE
    attention: ``cos, sin = (t.astype(x.dtype) for t in tables(T))`` was blamed).  A line that
    only carries a float64 on (``np.exp(s - ...)``) is not named either."""
    mod = _module(tmp_path, monkeypatch, "cast_table_promotion", """
        import numpy as np

        def _table(n):
            return np.arange(n) / n  # float64 from integers

        def softmax_forward(x, mask=None):
            (w,) = (t.astype(x.dtype) for t in [_table(x.shape[-1])])
            s = (x + 0 * w) / np.sqrt(x.shape[-1])
            e = np.exp(s - s.max(-1, keepdims=True))
            p = e / e.sum(-1, keepdims=True)
            return p, p

        def softmax_backward(dp, p):
            return (p * (dp - (p * dp).sum(-1, keepdims=True)),)
        """)
    report = check_implementation(mod, ops=["softmax"], kinds=["invariant"])
    first = next(r for r in report.failures() if "cause:" in r.message)
    source = (tmp_path / "cast_table_promotion.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if "/ np.sqrt(x.shape[-1])" in text)
    assert f"float64 first appears at cast_table_promotion.py:{line} in softmax_forward" in \
        first.message, first.message[:600]
    assert "math.sqrt(d)" in first.message, first.message[:600]


def test_a_promotion_is_named_in_the_implementation_not_its_adapter():
    """An adapter in a file of its own (tests/examples/promotion_impl_adapter.py) makes a
    harmless float64 stand-in before the implementation promotes: the cause is the
    implementation's line, never the adapter's (issue 41: its advice fixed nothing)."""
    report = check_implementation(promotion_impl_adapter, ops=["softmax"], kinds=["invariant"])
    caused = [r.message for r in report.failures() if "cause:" in r.message]
    assert caused, report.summary()
    source = open(promotion_impl.__file__).read().splitlines()
    line = next(i for i, text in enumerate(source, 1) if "s = x / np.sqrt(self.d)" in text)
    for message in caused:
        assert f"float64 first appears at promotion_impl.py:{line} in forward" in message, \
            message[:600]
        assert "promotion_impl_adapter.py" not in message, message[:600]


@pytest.mark.parametrize("bug", ["clip", "schedule"])
def test_a_pipeline_red_blames_the_op_at_fault(bug, monkeypatch):
    monkeypatch.setattr(realstyle_minigpt, "BUGS", {bug} if bug == "clip" else set())
    if bug == "schedule":  # decays to lr > 0 at total_steps: an off-by-one in the denominator
        monkeypatch.setattr(realstyle_minigpt, "warmup_linear_lr",
                            lambda step, *, peak_lr, warmup_steps, total_steps: (
                                peak_lr * step / warmup_steps if step < warmup_steps else
                                peak_lr * (total_steps - step) / (total_steps - warmup_steps + 1)))
    report = check_implementation(realstyle_minigpt, ids=["oracle.forward[adam.pipeline]"])
    (r,) = report.failures()
    assert r.ops == (bug,), r.message
    others = " and ".join(op for op in ("adam", "schedule", "clip") if op != bug)
    assert f"{others} pass with the reference's others: not at fault" in r.message
    assert re.search(r"got -?[\d.]+(e-?\d+)?, expected -?[\d.]+", r.message)


@pytest.mark.filterwarnings("ignore:Using `assume` outside")
def test_the_float32_layernorm_floor_scales_with_the_terms_dx_sums():
    """A row of variance ~1e-2 beside a row [0, 0, 0, 1] (found at seed 1, 200 examples): dx
    sums terms of |dy| / sigma ~ 13 that cancel to 1e-3, so float32 rounding of those terms
    (~1e-6) is not a disagreement -- the reference was red here."""
    import minibert_reference
    from minibert_spec.suite import strategies as S
    from minibert_spec.suite.registry import get
    from minibert_spec.suite.run import as_proxy

    x = np.array([[0.0, 0.0, 0.0, 1.0], [-0.4375, -0.68575469, -0.5, -0.4375]])
    dout = np.array([[0.0, 0.0, 0.0, 0.0], [-0.4375, -0.6875, -0.5, -0.4375]])
    case = S.OpCase({"x": x, "gamma": None, "beta": None}, {"eps": 1e-12}, dout, 0)
    check = get("invariant[layernorm_plain.float32_vs_float64]")
    check.call(as_proxy(minibert_reference), {"case": case})  # raised AssertionError before the fix
