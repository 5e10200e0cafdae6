"""Implementations on other array libraries (spec/protocol/arrays.py, the proxy's conversion
layer): a torch-tensor implementation with a hand-written backward, and an array-API one on
array-api-strict, get exactly the verdicts of their NumPy twins -- correct ones green in the
same rows, buggy ones red on the same checks naming tensor, index and values -- and the layer
keeps the protocol's contract: dtypes kept, ids and masks converted, caches opaque, inputs
never mutated (seen on the implementation's own arrays), nothing of it imported for NumPy."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from minibert_spec.protocol import DeclarationError, ImplProxy, capabilities
from minibert_spec.suite.compare import compare
from tests import ROOT
from tests.examples import (
    array_api_ops,
    backprop_numpy,
    backprop_torch,
    hostile_mutate,
    hostile_upcast,
)
from tests.unshrunk import check_implementation

torch = pytest.importorskip("torch")
pytest.importorskip("array_api_strict")

# "<tensor> ... index (i, j) ...: <ours> X, <theirs> Y" (FD, oracle and invariant reds alike)
NAMED = r"index \([0-9, ]*\).*[-+]?\d\.\d+(e[-+]\d+)?.*[-+]?\d\.\d+(e[-+]\d+)?"
TORCH_OPS = ["embedding", "linear", "layernorm", "softmax", "gelu", "relu", "cross_entropy"]
BUGGY = {"embedding", "linear", "layernorm", "softmax", "gelu", "cross_entropy"}
# (NumPy twin, twin on another library, its ops, its bugs)
TWINS = {"torch": (lambda: backprop_numpy, lambda: backprop_torch, TORCH_OPS, BUGGY),
         "array_api_strict": (lambda: array_api_ops.on("numpy"), lambda: array_api_ops,
                              list(array_api_ops.PROVIDED), set(array_api_ops.PROVIDED))}


def _as_json(report) -> dict:
    return json.loads(json.dumps(report.to_json()))


def _twin_reports(library: str, bugs: set, monkeypatch) -> tuple[dict, dict, list]:
    numpy_twin, other, ops, _ = TWINS[library]
    for module in (backprop_numpy, backprop_torch, array_api_ops):
        monkeypatch.setattr(module, "BUGS", set(bugs))
    reports = [check_implementation(impl(), ops=ops) for impl in (numpy_twin, other)]
    return _as_json(reports[0]), _as_json(reports[1]), reports


@pytest.mark.slow  # the slow tier (conftest.py): every check, twice
@pytest.mark.parametrize("library", sorted(TWINS))
def test_a_correct_implementation_on_another_library_is_green_where_its_numpy_twin_is(
        library, monkeypatch):
    ours, theirs, reports = _twin_reports(library, set(), monkeypatch)
    assert compare(ours, theirs) == []
    ops = TWINS[library][2]
    for report in reports:
        failed = [f"{r.id}: {r.message[:300]}" for r in report.failures()]
        assert not failed, "\n".join(failed)
        assert {op: v for op, v in report.verdicts().items() if v != "n/a"} == dict.fromkeys(
            ops, "ok")
    passed = [r["id"] for r in theirs["results"] if r["outcome"] == "passed"]
    assert any(i.startswith("fd[") for i in passed) and any(i.startswith("oracle.") for i in
                                                             passed), passed


@pytest.mark.slow  # the slow tier (conftest.py): every check, twice
@pytest.mark.parametrize("library", sorted(TWINS))
def test_a_buggy_implementation_on_another_library_is_red_on_exactly_its_twins_checks(
        library, monkeypatch):
    bugs = TWINS[library][3]
    ours, theirs, reports = _twin_reports(library, bugs, monkeypatch)
    assert compare(ours, theirs) == []
    failed_ids = [{r["id"] for r in rep["results"] if r["outcome"] == "failed"}
                  for rep in (ours, theirs)]
    assert failed_ids[0] == failed_ids[1] and failed_ids[0]
    report = reports[1]
    assert {op for op, v in report.verdicts().items() if v == "FAIL"} == bugs
    import re

    for op in bugs:  # each red op has a red naming the tensor, the index and both values
        messages = [r.message for r in report.failures() if op in r.ops]
        assert any(re.search(NAMED, m) for m in messages), (op, messages[:2])


@pytest.mark.parametrize("name", ["backprop_torch", "backprop_numpy", "array_api_ops"])
def test_the_example_adapters_are_at_most_30_lines(name):
    from tests.suite.test_adapters import _adapter_lines

    assert _adapter_lines(ROOT / "tests" / "examples" / f"{name}.py") <= 30


# --------------------------------------------------------------------------- the layer itself
class _TorchRecorder:
    """Records what a torch implementation is handed; its cache is an object of its own."""

    CAPABILITIES = {"arrays": "torch"}

    class Cache:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    def __init__(self):
        self.seen, self.caches = {}, []

    def embedding_forward(self, ids, W):
        self.seen["ids"], self.seen["W"] = ids, W
        return W[ids], self._cache(ids=ids, V=W.shape[0])

    def embedding_backward(self, dout, cache):
        self.seen["cache"] = cache
        dW = torch.zeros((cache.V, dout.shape[-1]), dtype=dout.dtype)
        dW.index_put_((cache.ids,), dout, accumulate=True)
        return (dW,)

    def softmax_forward(self, x, mask=None):
        self.seen["mask"] = mask
        p = torch.softmax(torch.where(mask, x, -torch.inf), -1)
        return p, p

    def cross_entropy_forward(self, logits, labels, *, ignore_index=-100, reduction="mean"):
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 labels.reshape(-1), ignore_index=ignore_index,
                                                 reduction=reduction)
        return loss, None

    def _cache(self, **kw):
        self.caches.append(self.Cache(**kw))
        return self.caches[-1]


def test_inputs_arrive_as_tensors_of_their_dtype_and_results_come_back_as_numpy():
    impl = _TorchRecorder()
    proxy = ImplProxy(impl, "recorder")
    rng = np.random.default_rng(0)
    ids = np.array([[0, 2, 2], [1, 0, 3]])
    W = rng.standard_normal((4, 3)).astype(np.float32)
    out, cache = proxy.embedding_forward(ids, W)
    assert isinstance(impl.seen["W"], torch.Tensor) and impl.seen["W"].dtype == torch.float32
    assert impl.seen["ids"].dtype == torch.int64
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    np.testing.assert_array_equal(out, W[ids])
    # the cache is opaque: the very object the forward returned reaches the backward
    assert cache is impl.caches[-1]
    (dW,) = proxy.embedding_backward(np.ones((2, 3, 3), np.float32), cache)
    assert impl.seen["cache"] is cache and dW.dtype == np.float32
    np.testing.assert_array_equal(dW[:, 0], [2, 1, 2, 1])
    mask = np.array([[True, False, True]])
    p, _ = proxy.softmax_forward(rng.standard_normal((1, 3)), mask)
    assert impl.seen["mask"].dtype == torch.bool and p[0, 1] == 0 and p.dtype == np.float64
    loss, _ = proxy.cross_entropy_forward(rng.standard_normal((2, 3)).astype(np.float32),
                                          np.array([1, -100]))
    assert isinstance(loss, np.float32)  # a 0-d tensor is a NumPy scalar, as NumPy's sums are


class _TorchUpcast:
    """hostile_upcast on torch tensors: linear computes in float64 whatever it is given."""

    CAPABILITIES = {"arrays": "torch"}

    @staticmethod
    def linear_forward(x, W, b=None):
        y = x.double() @ W.double() + (0 if b is None else b.double())
        return y, (x, W, b)

    @staticmethod
    def linear_backward(dy, cache):
        x, W, b = cache
        x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
        return dy @ W.T, x2.T @ dy2, None if b is None else dy2.sum(0)


class _TorchMutate:
    """hostile_mutate on torch tensors: relu clamps its input in place, and the backward scales
    the upstream gradient in place."""

    CAPABILITIES = {"arrays": "torch"}

    @staticmethod
    def relu_forward(x):
        mask = x > 0
        return x.clamp_(min=0), mask

    @staticmethod
    def relu_backward(dy, mask):
        dy *= mask
        return (dy,)


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("numpy_one,torch_one,op", [(hostile_upcast, _TorchUpcast(), "linear"),
                                                    (hostile_mutate, _TorchMutate(), "relu")],
                         ids=["upcast", "mutate"])
def test_a_torch_implementation_breaking_the_contract_is_red_where_numpy_one_is(
        numpy_one, torch_one, op):
    """An upcast (float32 in, float64 out) and a mutated input are red on the same checks for a
    torch implementation as for a NumPy one: the mutation is seen on the implementation's own
    tensors (they are copies of the suite's arrays)."""
    kinds = ["fd", "invariant", "oracle"]
    reds = [{r.id for r in check_implementation(impl, ops=[op], kinds=kinds).failures()}
            for impl in (numpy_one, torch_one)]
    assert reds[0] and reds[0] == reds[1]


@pytest.mark.parametrize("library", ["torch", "array_api_strict"])
def test_an_input_changed_later_through_the_cache_is_seen(library):
    """The forward keeps only a view of its input; the backward, after other calls, changes it
    in place: the suite's array changes as it would under a NumPy implementation (on
    array-api-strict the handed array itself is gone by then: the last calls' arrays are
    kept)."""
    class Later:
        CAPABILITIES = {"arrays": library}

        def tanh_forward(self, x):
            xp = array_namespace(x)
            y = xp.tanh(x)
            return y, (xp.reshape(x, (-1,)), y)  # a view: the handed array may be dropped

        def tanh_backward(self, dy, cache):
            flat, y = cache
            flat[...] = 0  # the caller's input, through the view
            return (dy * (1 - y * y),)

    from array_api_compat import array_namespace

    proxy = ImplProxy(Later(), "later")
    x = np.linspace(-1, 1, 6).reshape(2, 3)
    before = x.copy()
    _, cache = proxy.tanh_forward(x)
    np.testing.assert_array_equal(x, before)
    for _ in range(2):  # other calls in between, as the FD check makes
        proxy.tanh_forward(x + 1)
    proxy.tanh_backward(np.ones_like(x), cache)
    np.testing.assert_array_equal(x, 0)


def test_a_numpy_result_or_a_tensor_requiring_grad_is_a_red_naming_the_function():
    class Leaky:
        CAPABILITIES = {"arrays": "array_api_strict"}

        def relu_forward(self, x):
            return np.maximum(x, 0), None  # a NumPy call on a strict array: NumPy's array back

        def relu_backward(self, dy, cache):
            return (dy,)

    class Autograd:
        CAPABILITIES = {"arrays": "torch"}

        def relu_forward(self, x):
            x = x.clone().requires_grad_()
            return torch.relu(x), x

    with pytest.raises(TypeError, match=r"relu_forward returned a numpy\.ndarray, not an array "
                                        r"of array_api_strict"):
        ImplProxy(Leaky(), "leaky").relu_forward(np.ones(3))
    with pytest.raises(TypeError, match="relu_forward returned: a torch tensor that requires "
                                        "grad"):
        ImplProxy(Autograd(), "autograd").relu_forward(np.ones(3))
    (r,) = check_implementation(Leaky(), ids=["fd[relu]"]).results
    assert r.outcome == "failed" and "not an array of array_api_strict" in r.message


def test_the_declaration_is_validated_naming_the_key():
    """A bad declaration is a DeclarationError naming CAPABILITIES['arrays'] before any check
    runs (a library that does not import too): a report that could not run, never a verdict."""
    class Declares:
        CAPABILITIES = {"arrays": 3}

    with pytest.raises(DeclarationError, match=r"CAPABILITIES\['arrays'\]: expected the import "
                                               r"name of the array library.*, got 3$"):
        capabilities(Declares())
    Declares.CAPABILITIES = {"arrays": "no_such_array_library"}
    with pytest.raises(DeclarationError, match=r"CAPABILITIES\['arrays'\] = "
                                               "'no_such_array_library': cannot import it"):
        ImplProxy(Declares(), "declares")
    report = check_implementation(Declares(), ids=["fd[relu]"])
    assert report.exit_code() == 2 and "cannot import it" in report.load_error
    assert capabilities(backprop_numpy)["arrays"] == "numpy"


def test_a_check_runs_torch_on_one_thread_and_restores_the_callers_setting():
    """torch's intra-op pool is held at one thread while a check runs (minibert_spec.suite.run
    .one_torch_thread: two threads spinning on a loaded machine made these checks 8x slower),
    and the caller's setting is back afterwards."""
    seen = []

    class Counts:
        CAPABILITIES = {"arrays": "torch"}

        def relu_forward(self, x):
            seen.append(torch.get_num_threads())
            return torch.clamp(x, min=0), x > 0

        def relu_backward(self, dy, positive):
            return (dy * positive,)

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        report = check_implementation(Counts(), ids=["fd[relu]"], oracle="off")
        assert report.exit_code() == 0, report.summary()
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_nothing_of_torch_is_imported_for_a_numpy_implementation_with_the_oracle_off():
    """The suite on a NumPy implementation with the oracle off imports neither torch nor the
    conversion's array-api-compat (checked in a fresh interpreter)."""
    code = textwrap.dedent("""
        import sys
        import minibert_reference
        from minibert_spec.suite import check_implementation
        report = check_implementation(minibert_reference, oracle="off", quick=True,
                                      ops=["linear", "layernorm", "softmax", "block"])
        assert report.exit_code() == 0, report.summary()
        print(sorted(m for m in sys.modules
                     if m.split(".")[0] in ("torch", "transformers", "array_api_compat")))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


# --------------------------------------------------------------------------- CuPy (a GPU)
def _cuda_devices() -> int:
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed (pip install cupy-cuda12x "
                                              "on a machine with an NVIDIA GPU)")
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception as e:  # noqa: BLE001 -- no driver, no device: the same skip
        pytest.skip(f"CuPy finds no GPU here ({type(e).__name__}: {e})")


def test_a_cupy_implementation_gets_its_numpy_twins_verdicts(monkeypatch):
    """The array-API example on CuPy arrays (on the GPU; compared on the host): the same
    verdicts as on NumPy, correct and with its softmax bug.  Skips without CuPy or a GPU."""
    if _cuda_devices() < 1:
        pytest.skip("CuPy finds no GPU here")
    for bugs in (set(), {"softmax"}):
        monkeypatch.setattr(array_api_ops, "BUGS", bugs)
        ours, theirs = (_as_json(check_implementation(array_api_ops.on(lib),
                                                      ops=list(array_api_ops.PROVIDED)))
                        for lib in ("numpy", "cupy"))
        assert compare(ours, theirs) == []
        assert (theirs["exit_code"] == 0) == (not bugs)
