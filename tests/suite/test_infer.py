"""``minibert adapter infer``: the adapter it proposes for class-style code
(tests/examples/infer_layers.py: a transposed weight, gradients in a dict added into, a backward
needing its input again, a single-use backward, a tuple output) and for function-style code
(tests/examples/infer_functions.py: forward/backward pairs of module functions, with a returned
cache, the input, a weight or the output needed again, gradients returned in an order of their
own) takes every class and pair for its op, is green on the correct code, and -- decided by
forward outputs and shapes only -- never turns a catalog bug of those ops into a pass."""

from __future__ import annotations

import re
import textwrap

import numpy as np
import pytest

from minibert_spec.mutants import CATALOG
from minibert_spec.suite.infer import PROBES, infer_source
from tests.examples import infer_functions, infer_layers, infer_near_miss
from tests.suite.infer_support import assert_no_bug_inferred_away
from tests.suite.infer_support import exec_source as _exec
from tests.suite.infer_support import load_source as _load
from tests.unshrunk import check_implementation

MODULE = infer_layers.__name__
EXAMPLES = (MODULE, infer_functions.__name__)  # class-style, function-style
_TARGET = re.compile(r"^ops\._(?P<op>[a-z_]+)_(forward|backward)$")


# kernels named otherwise than the op's forward/backward: the table sinusoidal_position adds
_KERNEL_OPS = {"ops._sinusoidal_encoding": "sinusoidal_position"}


def _op(m) -> str | None:
    """The op a mutant breaks, when all its edits are kernels of one op infer knows."""
    found = [(t, _TARGET.match(t)) for t in m.targets]
    ops = {_KERNEL_OPS.get(t) or (f.group("op") if f else None) for t, f in found}
    return ops.pop() if len(ops) == 1 and None not in ops and ops <= set(PROBES) else None


MUTANTS = sorted(n for n, m in CATALOG.items() if _op(m))


def test_infer_decides_each_convention_with_its_evidence():
    src = infer_source(MODULE)
    for want in ("transposed=('W',)", "grads={'W': 'grad_weight', 'b': 'grad_bias'}",
                 "grads={'gamma': 'grads.gamma', 'beta': 'grads.beta'}", "accumulate=True",
                 "eps=eps", "again=('x', 'dout')", "single_use=True", "output=0",
                 "params={'W_1': 'fc1.W', 'b_1': 'fc1.b', 'W_2': 'fc2.W', 'b_2': 'fc2.b'}",
                 "grads={'W_1': 'fc1.grad.W', 'b_1': 'fc1.grad.b', 'W_2': 'fc2.grad.W', "
                 "'b_2': 'fc2.grad.b'}"):
        assert want in src, src
    assert "equals the reference linear_forward" in src
    assert "nothing" in src.split("# not mapped")[1], src  # every class mapped


def test_infer_maps_function_pairs_with_their_conventions():
    """Module-level forward/backward pairs, paired by name and decided by the forward's output:
    a returned cache (forward[1]), the input, a weight and the output needed again (by the
    backward's parameter names), gradients found in the returned tuple by shape (two of one
    shape in the forward's argument order), a keyword call past a skipped argument."""
    src = infer_source(infer_functions.__name__)
    for want in ("forward=impl.dense,", "backward=impl.dense_backward,",
                 "inputs=('x', 'W', 'b')", "again=('dout', 'x', 'W')", "transposed=('W',)",
                 "forward=lambda x, gamma, beta, eps: impl.layer_norm(x, gamma=gamma, "
                 "beta=beta, eps=eps)", "grads={'gamma': 'return[1]', 'beta': 'return[2]'}",
                 "again=('dout', 'forward[1]')", "backward=impl.relu_grad,",
                 "again=('dout', 'x')", "backward=impl.gelu_bwd,", "again=('dout', 'out')",
                 "grads={'W_1': 'return[1]', 'b_1': 'return[3]', 'W_2': 'return[2]', "
                 "'b_2': 'return[4]'}"):
        assert want in src, src
    assert "equals the reference ffn_forward" in src
    assert "nothing" in src.split("# not mapped")[1], src  # every pair mapped


def test_a_forward_function_without_backward_is_named(tmp_path, monkeypatch):
    """A forward function with no backward of its name is not mapped; where it gives an op's
    output the adapter's not-mapped list names it and the names its backward could have.  A
    backward whose upstream gradient cannot be told from its parameters' names is listed too
    (its row, called with dout alone, then fails: never a pass)."""
    _load(tmp_path, monkeypatch, textwrap.dedent("""
        import numpy as np

        def relu(x):
            return np.maximum(x, 0)

        def softmax(x):
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            return e / e.sum(axis=-1, keepdims=True)

        def softmax_backward(dout, grad_out):  # two upstream gradients?
            return dout
        """), "fn_alone")
    src = infer_source("fn_alone")
    assert "relu_forward" not in src, src
    assert "relu: function relu gives the reference's output, but has no backward function " \
        "(relu_backward" in src, src
    assert "softmax: softmax: backward softmax_backward(dout, grad_out) takes more than one " \
        "upstream gradient I can tell" in src, src


def test_a_forward_close_to_the_reference_but_not_equal_is_left_unmapped():
    """A forward 1e-2 (relative) off the reference's is no evidence (issue 41): the exact class
    is mapped, the near-miss class and function pair are named as matching no op (a looser
    match would write an adapter under which a bug passes)."""
    src = infer_source(infer_near_miss.__name__)
    assert "lambda W: impl.Dense(n_in=W.shape[0], n_out=W.shape[1])" in src, src
    mapped = src.split("# not mapped")[0]
    assert "DenseOff" not in mapped and "impl.relu" not in mapped, src
    assert "class DenseOff: matches no op" in src, src
    assert "functions relu, relu_backward: match no op" in src, src


def test_a_class_with_a_forward_and_no_backward_method_is_named(tmp_path, monkeypatch):
    """A LayerNorm class whose backward lives elsewhere (one model-wide backward function, as
    in Jessitoii/numpy-gpt): not mapped, and the not-mapped list says its forward gives the
    op's output but it has no backward method -- not "matches no op"."""
    _load(tmp_path, monkeypatch, textwrap.dedent("""
        import numpy as np

        class LayerNorm:
            def __init__(self, dim, eps=1e-12):
                self.eps, self.gamma, self.beta = eps, np.ones(dim), np.zeros(dim)

            def forward(self, x):
                x_hat = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True)
                                                                  + self.eps)
                return self.gamma * x_hat + self.beta

        class Noise:
            def forward(self, x):
                return x + 1.0
        """), "cls_alone")
    src = infer_source("cls_alone")
    assert "layernorm_forward" not in src, src
    assert "class LayerNorm: its forward gives the reference's layernorm output, but it has no " \
        "backward method (backward," in src, src
    assert "class Noise: matches no op this can infer" in src, src


def test_a_class_built_from_its_parameter_arrays_is_mapped(tmp_path, monkeypatch):
    """Tutorial code's ``LayerNorm(gamma, beta, eps)`` takes the arrays themselves, not sizes
    (tests/examples/realstyle_tutorial.py): infer builds it with arrays of the probe's shapes,
    and the adapter passes the protocol's gamma and beta to the constructor: it computes the
    reference's forward and backward (the full verdict on such code: tests/benchmarks/
    adapter_share.py runs minibert check on the adapter infer writes for that example)."""
    _load(tmp_path, monkeypatch, textwrap.dedent("""
        import numpy as np

        class LayerNorm:
            def __init__(self, gamma, beta, eps=1e-12):
                self.gamma, self.beta, self.eps = gamma, beta, eps

            def forward(self, x):
                self.rstd = 1.0 / np.sqrt(x.var(-1, keepdims=True) + self.eps)
                self.x_hat = (x - x.mean(-1, keepdims=True)) * self.rstd
                return self.gamma * self.x_hat + self.beta

            def backward(self, dy):
                self.dgamma = (dy * self.x_hat).reshape(-1, dy.shape[-1]).sum(0)
                self.dbeta = dy.reshape(-1, dy.shape[-1]).sum(0)
                g = dy * self.gamma
                return self.rstd * (g - g.mean(-1, keepdims=True)
                                    - self.x_hat * (g * self.x_hat).mean(-1, keepdims=True))
        """), "ln_from_arrays")
    src = infer_source("ln_from_arrays")
    assert "impl.LayerNorm(eps=eps, gamma=gamma, beta=beta)" in src, src
    assert "grads={'gamma': 'dgamma', 'beta': 'dbeta'}" in src, src
    import minibert_reference as R

    adapter = _load(tmp_path, monkeypatch, src, "ln_from_arrays_adapter")
    rng = np.random.default_rng(3)
    x, dy = rng.standard_normal((2, 3, 5)), rng.standard_normal((2, 3, 5))
    gamma, beta = 1 + 0.5 * rng.standard_normal(5), rng.standard_normal(5)
    got, cache = adapter.layernorm_forward(x, gamma, beta, 1e-5)
    want, ref_cache = R.layernorm_forward(x, gamma, beta, 1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    for g, w in zip(adapter.layernorm_backward(dy, cache), R.layernorm_backward(dy, ref_cache)):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


def test_a_linear_layer_without_a_bias_is_mapped(tmp_path, monkeypatch):
    """Tutorial code's ``y = x W`` (no bias; tests/examples/realstyle_tutorial.py): mapped with
    W alone, calls with b left n/a; the adapter computes the reference's bias-free linear
    forward and backward."""
    _load(tmp_path, monkeypatch, textwrap.dedent("""
        import numpy as np

        class NoBias:
            def __init__(self, n_in, n_out):
                self.W = np.zeros((n_in, n_out))

            def forward(self, x):
                self.x = x
                return x @ self.W

            def backward(self, dy):
                self.dW = self.x.reshape(-1, self.x.shape[-1]).T @ dy.reshape(-1, dy.shape[-1])
                return dy @ self.W.T
        """), "linear_nobias")
    src = infer_source("linear_nobias")
    assert "linear_forward, linear_backward = layer(" in src, src
    assert "no bias found: calls with b are not applicable" in src, src
    import minibert_reference as R

    adapter = _load(tmp_path, monkeypatch, src, "linear_nobias_adapter")
    rng = np.random.default_rng(4)
    x, W, dy = (rng.standard_normal(s) for s in ((2, 3, 4), (4, 5), (2, 3, 5)))
    got, cache = adapter.linear_forward(x, W, None)
    want, ref_cache = R.linear_forward(x, W, None)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    for g, w in zip(adapter.linear_backward(dy, cache), R.linear_backward(dy, ref_cache)):
        assert (g is None) == (w is None), (g, w)
        if w is not None:
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("module", EXAMPLES)
def test_the_inferred_adapter_is_green_on_correct_code(module, tmp_path, monkeypatch):
    adapter = _load(tmp_path, monkeypatch, infer_source(module), "inferred_ok")
    report = check_implementation(adapter, ops=list(PROBES))
    failed = [f"{r.id}: {r.message[:300]}" for r in report.failures()]
    assert not failed, "\n".join(failed)
    assert all(report.verdicts()[op] == "ok" for op in PROBES), report.verdicts()


def _fingerprint(module: str, op: str) -> list:
    """What the example's class or functions for ``op`` compute on two probes: the forward
    output and every gradient (through the hand-checked adapter inferred from the correct
    code), to tell whether a mutant reaches it at all."""
    from minibert_spec.suite.infer import _probe_values

    adapter = _CORRECT.setdefault(module, _exec(infer_source(module)))
    fwd, bwd = getattr(adapter, f"{op}_forward"), getattr(adapter, f"{op}_backward")
    out = []
    for seed in (0, 1):
        vals = _probe_values(PROBES[op], seed)
        y, cache = fwd(*vals.values(), **PROBES[op].scalars)
        out += [y, *(g for g in bwd(np.cos(y), cache) if g is not None)]
    return out


_CORRECT: dict = {}


def test_the_catalog_mutants_of_the_inferred_ops_are_tried():
    assert len(MUTANTS) >= 15, MUTANTS


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("module", EXAMPLES)
@pytest.mark.parametrize("name", MUTANTS)
def test_infer_never_infers_a_bug_away(name, module, tmp_path, monkeypatch):
    """Under the mutant, the class's (the function's) forward either no longer equals the
    reference's (the op is not mapped: n/a, never a pass) or the adapter maps it and the op is
    red.  A mutant that does not change what the example computes (a branch it never takes: the
    tanh GELU, LayerNorm without its affine map) does not apply to it."""
    op = _op(CATALOG[name])
    assert_no_bug_inferred_away(name, op, module, lambda: _fingerprint(module, op),
                                f"{op}_forward, {op}_backward = layer(", tmp_path, monkeypatch)


def test_infer_declares_the_ranks_a_layer_runs_on(tmp_path, monkeypatch):
    """A Dense whose backward transposes (0, 2, 1) runs on [B, T, n] inputs only: the adapter
    declares CAPABILITIES ranks linear (3,), so that the suite reshapes the other ranks."""
    _load(tmp_path, monkeypatch, textwrap.dedent("""
        import numpy as np

        class Dense:
            def __init__(self, units, inputs=None):
                self.w, self.b = np.zeros((inputs, units)), np.zeros(units)

            def forward(self, X):
                self.X = X
                return X @ self.w + self.b

            def backward(self, error):
                self.grad_w = np.sum(np.matmul(self.X.transpose(0, 2, 1), error), axis=0)
                self.grad_b = np.sum(error, axis=(0, 1))
                return error @ self.w.T
        """), "rank3_dense")
    src = infer_source("rank3_dense")
    assert "CAPABILITIES = {'ranks': {'linear': (3,)}}" in src, src
    assert "impl.Dense(units=W.shape[1], inputs=W.shape[0])" in src, src


def test_minibert_adapter_infer_writes_the_adapter_once(tmp_path, capsys):
    from minibert_spec.cli import main as minibert

    out = tmp_path / "inferred.py"
    assert minibert(["adapter", "infer", MODULE, "-o", str(out)]) == 0
    assert out.read_text() == infer_source(MODULE)
    assert minibert(["adapter", "infer", MODULE, "-o", str(out)]) == 2  # never overwritten
    assert "exists" in capsys.readouterr().err


def test_the_written_adapter_is_imported_and_checked_before_infer_says_done(capsys,
                                                                             monkeypatch):
    """Every row infer writes is run by the quick tier before it says done: all green on the
    correct code; with two planted backward bugs, exactly those rows named, each with its red
    (the tensor, the index, both values) -- and the adapter is still written: a red is a
    finding, never a reason to drop a row."""
    from minibert_spec.cli import main as minibert

    module = "tests.examples.realstyle_minigpt"
    monkeypatch.delenv("MINIBERT_EXAMPLE_BUGS", raising=False)
    assert minibert(["adapter", "infer", module]) == 0
    err = capsys.readouterr().err
    assert "the adapter imports; its 6 row(s) under minibert check --quick" in err, err
    assert ": 6 green" in err and " not:" not in err, err
    monkeypatch.setenv("MINIBERT_EXAMPLE_BUGS", "ffn,softmax")
    assert minibert(["adapter", "infer", module]) == 0
    out, err = capsys.readouterr()
    assert "ffn_forward, ffn_backward = layer(" in out and "softmax_forward" in out, out
    assert "4 green, 2 not" in err, err
    red = dict(re.findall(r"infer:   (\w+): (.*)", err))
    assert set(red) == {"ffn", "softmax"}, err
    for line in red.values():
        assert re.search(r"at index \(.*analytic .* finite difference", line), line


def test_a_backward_taking_the_forwards_second_result_is_called_with_it(tmp_path,
                                                                        monkeypatch):
    """GPT-2 ports' ``gelu(x) -> (y, t)`` with ``gelu_backward(dy, x, t)``: the argument named
    as a gradient is the upstream one, the other the forward's second result; a backward whose
    call cannot be decided (two arguments neither named as a gradient) gets no row -- a row
    whose backward fails on every call would be red on correct code -- and the reason."""
    _load(tmp_path, monkeypatch, textwrap.dedent("""
        import numpy as np
        C = float(np.sqrt(2 / np.pi))  # a Python float: float32 stays float32

        def gelu(x):
            t = np.tanh(C * (x + 0.044715 * x ** 3))
            return 0.5 * x * (1 + t), t

        def gelu_backward(dy, x, t):
            return dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * C * (1 + 3 * 0.044715 * x * x))

        def relu(x):
            return np.maximum(x, 0), x > 0

        def relu_backward(u, v):
            return u * v
    """), "gelu_pair")
    src = infer_source("gelu_pair")
    assert "again=('dout', 'x', 'forward[1]')" in src, src
    assert "relu_forward" not in src, src
    assert re.search(r"relu: relu: backward relu_backward\(u, v\) takes more than one "
                     r"upstream gradient", src), src
    adapter = _load(tmp_path, monkeypatch, src, "gelu_pair_adapter")
    report = check_implementation(adapter, ops=["gelu"], quick=True, oracle="off")
    assert report.verdicts()["gelu"] == "ok", [f.message[:300] for f in report.failures()]


def test_infer_declares_a_layernorm_without_affine_map_or_eps(tmp_path, monkeypatch):
    """A LayerNorm written as (x - mu) / std with a Jacobian backward (no gamma, beta or eps):
    the standard form does not match its forward, the affine-free one does; the adapter
    declares affine=False and eps=False, and the class is green in its row (eps = 0 calls are
    taken by a class layer with no eps)."""
    _load(tmp_path, monkeypatch, textwrap.dedent("""
        import numpy as np

        class LayerNorm:
            def forward(self, x):
                self.sigma = x.std(axis=-1, keepdims=True)
                self.xs = x - x.mean(axis=-1, keepdims=True)
                return self.xs / self.sigma

            def backward(self, dy):
                N = self.xs.shape[-1]
                s, xs = self.sigma[..., None], self.xs[..., None]
                D = -(xs * xs.swapaxes(-1, -2) + s ** 2) / s ** 3 / N
                D[..., range(N), range(N)] += 1 / s.squeeze(-1)
                return (D @ dy[..., None]).squeeze(-1)
        """), "plain_ln")
    src = infer_source("plain_ln")
    assert "CAPABILITIES = {'layernorm': {'affine': False, 'eps': False}}" in src, src
    assert "it equals the reference's at eps=0" in src, src
    adapter = _load(tmp_path, monkeypatch, src, "plain_ln_adapter")
    report = check_implementation(adapter, ops=["layernorm"])
    assert report.verdicts()["layernorm"] == "ok", report.summary()
    assert report.counts().get("passed", 0) >= 8, report.counts()


PINNED_LN = {  # a LayerNorm whose eps is a constant of its code, not an argument
    "class": """
        from minibert_reference import ops

        class LayerNorm:
            def __init__(self, dim):
                self.gamma, self.beta = ops.np.ones(dim), ops.np.zeros(dim)

            def forward(self, x):
                y, self.cache = ops._layernorm_forward(x, self.gamma, self.beta, {eps})
                return y

            def backward(self, dy):
                dx, self.dgamma, self.dbeta = ops._layernorm_backward(dy, self.cache)
                return dx
        """,
    "function": """
        from minibert_reference import ops

        def layer_norm(x, gamma, beta):
            return ops._layernorm_forward(x, gamma, beta, {eps})

        def layer_norm_backward(dout, cache):
            return ops._layernorm_backward(dout, cache)
        """}


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("style", sorted(PINNED_LN))
@pytest.mark.parametrize("eps", [1e-6, 1e-5])
def test_infer_finds_the_eps_a_layernorm_fixes_inside(style, eps, tmp_path, monkeypatch):
    """No eps argument, eps fixed in the code: the forward on rows of small variance tells which
    of the common values it is, the adapter declares that number (CAPABILITIES), and the row is
    green -- where eps=False (the suite passes eps=0) would be red on correct maths."""
    name = f"pinned_{style}_{str(eps).replace('-', '_')}"
    _load(tmp_path, monkeypatch, textwrap.dedent(PINNED_LN[style].format(eps=eps)), name)
    src = infer_source(name)
    assert f"CAPABILITIES = {{'layernorm': {{'eps': {eps!r}}}}}" in src, src
    assert f"declared eps={eps:g}, fixed in the code" in src, src
    adapter = _load(tmp_path, monkeypatch, src, f"{name}_adapter")
    report = check_implementation(adapter, ops=["layernorm"])
    assert report.verdicts()["layernorm"] == "ok", report.summary()
    assert report.counts().get("passed", 0) >= 8, report.counts()


def test_an_eps_fixed_at_no_common_value_is_left_to_review(tmp_path, monkeypatch):
    """3e-6 is none of the values infer tries: eps=False with the reason, never a guess (the row
    is then red, and the user declares the number)."""
    _load(tmp_path, monkeypatch, textwrap.dedent(PINNED_LN["function"].format(eps=3e-6)),
          "pinned_odd")
    src = infer_source("pinned_odd")
    assert "CAPABILITIES = {'layernorm': {'eps': False}}" in src, src
    assert "matches none of eps 0, 1e-12" in src, src


def test_infer_tells_the_tanh_gelu_from_the_erf_one(tmp_path, monkeypatch):
    """The two GELUs differ by ~3e-4: the forward output decides, and a tanh-only class is
    declared fixed={'approximate': 'tanh'} -- green on the tanh form, n/a on the erf one."""
    from minibert_spec.protocol import ImplProxy, NotApplicable

    _load(tmp_path, monkeypatch, textwrap.dedent("""
        import math

        import numpy as np

        class GELU:
            def forward(self, x):
                self.x = x
                self.t = np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))
                return 0.5 * x * (1 + self.t)

            def backward(self, dy):
                x, t = self.x, self.t
                du = math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * x ** 2)
                return dy * (0.5 * (1 + t) + 0.5 * x * (1 - t ** 2) * du)
        """), "tanh_gelu")
    src = infer_source("tanh_gelu")
    assert "fixed={'approximate': 'tanh'}" in src, src
    adapter = _load(tmp_path, monkeypatch, src, "tanh_gelu_adapter")
    report = check_implementation(adapter, ops=["gelu"])
    assert report.verdicts()["gelu"] == "ok", [f.message[:300] for f in report.failures()]
    with pytest.raises(NotApplicable, match="computes approximate='tanh' only"):
        ImplProxy(adapter, "tanh_gelu").gelu_forward(np.ones(3), approximate="none")


def test_a_module_that_does_not_import_is_a_clear_error(capsys):
    from minibert_spec.cli import main as minibert

    assert minibert(["adapter", "infer", "no_such_module_xyz"]) == 2
    assert "module 'no_such_module_xyz' does not import: ModuleNotFoundError" in \
        capsys.readouterr().err
