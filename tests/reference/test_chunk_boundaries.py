"""The optimizer's chunked loops across their chunk boundaries.

``minibert_reference.optim`` streams Adam's update and the gradient norm's sum of squares through a
cache-sized buffer, ``_CHUNK`` elements at a time (``_CHUNK_PARALLEL`` with several workers);
both constants are read at call time, so these tests shrink them (down to 1 element) and reach
every boundary with small arrays: sizes below, at, just above and several times the chunk, and
uneven last chunks.  The expected values are the formulas written out here on whole float64
arrays, with no chunking -- never the code under test.  One test keeps the real chunk sizes
(64K elements; 256K with two workers) and goes through the ``impl`` fixture.

The finiteness checks split the tensors among the workers (``minibert_reference.parallel``): every
bad tensor is found whichever worker's group it falls in.
"""

from __future__ import annotations

import numpy as np
import pytest

from minibert_reference import optim as O
from minibert_reference import parallel
from minibert_reference.validate import DOT_FROM, all_finite, check_all_finite, non_finite
from minibert_spec.tolerances import F32_VS_F64_RTOL, F64_IDENTITY_RTOL

CHUNKS = (1, 2, 3, 7)  # elements per chunk; 1: every element is its own chunk
WORKERS = (1, 2)
KW = dict(lr=3e-3, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.05)
NO_DECAY = ("b",)


def _sizes(c: int) -> list[int]:
    """Below, at, just above and several times the chunk, with uneven last chunks."""
    return sorted({n for n in (c - 1, c, c + 1, 2 * c - 1, 2 * c, 2 * c + 1, 3 * c + c // 2 + 1,
                               5 * c + 1) if n >= 1})


def _shape(n: int) -> tuple[int, ...]:
    return (2, n // 2) if n % 2 == 0 and n > 2 else (n,)  # reshape(-1) of 2-D tensors too


def _tensors(c: int, seed: int, dtype=np.float64, scale=1.0) -> dict[str, np.ndarray]:
    """One tensor per size, mixed signs and magnitudes; "b" (exempt from decay) the largest."""
    rng = np.random.default_rng(seed)
    sizes = _sizes(c)
    out = {f"t{n}": rng.standard_normal(_shape(n)) * 10.0 ** rng.uniform(-3, 1, _shape(n))
           for n in sizes[:-1]}
    out["b"] = rng.standard_normal(_shape(sizes[-1]))
    return {k: (scale * v).astype(dtype) for k, v in out.items()}


@pytest.fixture
def chunk(request, monkeypatch):
    """(chunk size, worker count): both of the optimizer's chunk sizes shrunk to ``c``."""
    c, workers = request.param
    monkeypatch.setattr(O, "_CHUNK", c)
    monkeypatch.setattr(O, "_CHUNK_PARALLEL", c)
    with parallel.workers(workers):
        yield c


CASES = pytest.mark.parametrize("chunk", [(c, w) for c in CHUNKS for w in WORKERS],
                                indirect=True, ids=[f"chunk{c}-w{w}" for c in CHUNKS
                                                    for w in WORKERS])


# --------------------------------------------------------------------------- gradient norm
def _norm(grads) -> float:
    """sqrt of the sum of every square, on whole float64 arrays."""
    return float(np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads.values())))


@pytest.mark.equation("clip.global_norm")
@CASES
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_global_norm_across_chunk_boundaries(chunk, dtype):
    grads = _tensors(chunk, seed=chunk, dtype=dtype)
    # every tensor alone too: a stale tail is not averaged away by the other tensors
    for k, g in grads.items():
        assert O.global_grad_norm({k: g}) == pytest.approx(_norm({k: g}), rel=F64_IDENTITY_RTOL,
                                                           abs=0), (k, g.size)
    assert O.global_grad_norm(grads) == pytest.approx(_norm(grads), rel=F64_IDENTITY_RTOL, abs=0)


@pytest.mark.equation("clip.global_norm")
@CASES
def test_clipping_across_chunk_boundaries(chunk):
    grads = _tensors(chunk, seed=10 + chunk)
    norm = _norm(grads)
    clipped, got = O.clip_by_global_norm(grads, norm / 3)
    assert got == pytest.approx(norm, rel=F64_IDENTITY_RTOL, abs=0)
    for k, g in grads.items():
        np.testing.assert_allclose(clipped[k], g * ((norm / 3) / norm), rtol=F64_IDENTITY_RTOL,
                                   atol=0, err_msg=k)


# --------------------------------------------------------------------------- Adam
def _adam(p, g, m, v, t, *, lr, beta1, beta2, eps, weight_decay):
    """Adam / AdamW of the Mini-BERT derivation §5.1 (decoupled decay) on whole arrays."""
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat = m / (1 - beta1 ** t)
    v_hat = v / (1 - beta2 ** t)
    return p - lr * weight_decay * p - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


def _expected(params, state, grads, t):
    out = {k: _adam(params[k].astype(np.float64), grads[k].astype(np.float64),
                    state["m"][k].astype(np.float64), state["v"][k].astype(np.float64), t,
                    **{**KW, "weight_decay": 0.0 if k in NO_DECAY else KW["weight_decay"]})
           for k in params}
    return ({k: o[0] for k, o in out.items()}, {k: o[1] for k, o in out.items()},
            {k: o[2] for k, o in out.items()})


def _assert_step(p, state, expected, rtol, what):
    """Within ``rtol`` of each expected tensor's largest entry (float32 rounds the moments of
    opposite-signed terms, so no element-wise bound holds there)."""
    for name, got, want in (("params", p, expected[0]), ("m", state["m"], expected[1]),
                            ("v", state["v"], expected[2])):
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=0,
                                       atol=rtol * np.max(np.abs(want[k])),
                                       err_msg=f"{what}: {name}[{k}] ({want[k].size} elements)")


def _copy(d):
    return {k: v.copy() for k, v in d.items()}


def _poisoned(d):
    """Arrays to write into, full of NaN: an element the update never writes stays NaN."""
    return {k: np.full_like(v, np.nan) for k, v in d.items()}


@pytest.mark.equation("optim.adam", "optim.adamw")
@CASES
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_adam_across_chunk_boundaries(chunk, dtype):
    """Three steps of the pure (new arrays), in-place and double-buffered (``out=``, into
    NaN-filled arrays) updates, each against the formula on whole arrays from its own inputs."""
    rtol = F64_IDENTITY_RTOL if dtype == np.float64 else F32_VS_F64_RTOL
    params = _tensors(chunk, seed=20 + chunk, dtype=dtype)
    kw = {**KW, "no_decay": NO_DECAY}
    pure = (params, O.adam_init(params))
    inplace = (_copy(params), O.adam_init(params))
    double = (_copy(params), O.adam_init(params))
    for step in range(1, 4):
        grads = _tensors(chunk, seed=100 * step + chunk, dtype=dtype)

        expected, before, given = _expected(*pure, grads, step), _copy(pure[0]), pure[0]
        pure = O.adam_step(pure[0], grads, pure[1], **kw)
        assert all(np.array_equal(before[k], given[k]) for k in params)  # a new dict out
        _assert_step(*pure, expected, rtol, f"adam_step, step {step}")

        expected = _expected(*inplace, grads, step)
        inplace = (inplace[0], O.adam_step_inplace(inplace[0], grads, inplace[1], **kw))
        _assert_step(*inplace, expected, rtol, f"adam_step_inplace, step {step}")

        expected = _expected(*double, grads, step)
        kept = _copy(double[0]), _copy(double[1]["m"]), _copy(double[1]["v"])
        target = (_poisoned(params), {"m": _poisoned(params), "v": _poisoned(params)})
        new = O.adam_step(double[0], grads, double[1], out=target, **kw)
        assert new[0] is target[0] and new[1]["m"] is target[1]["m"] and new[1]["step"] == step
        for k in params:  # the inputs stay intact until the caller swaps them
            for a, b in zip(kept, (double[0], double[1]["m"], double[1]["v"])):
                assert np.array_equal(a[k], b[k]), k
        double = new
        _assert_step(*double, expected, rtol, f"adam_step(out=...), step {step}")


@pytest.mark.equation("clip.global_norm", "optim.adam", "optim.adamw")
@pytest.mark.parametrize("workers", WORKERS)
def test_real_chunk_sizes(impl, workers):
    """The chunk sizes as shipped (not shrunk), through the implementation under test: tensors
    one below, at, one above and three and a bit times 64K and 256K elements."""
    sizes = [n for c in (1 << 16, 1 << 18) for n in (c - 1, c, c + 1)] + [3 * (1 << 16) + 17,
                                                                         2 * (1 << 18) + 3]
    rng = np.random.default_rng(workers)
    params = {f"t{n}": rng.standard_normal(n) for n in sizes}
    grads = {k: rng.standard_normal(v.shape) * 10.0 ** rng.uniform(-3, 1, v.shape)
             for k, v in params.items()}
    with parallel.workers(workers):
        for k, g in grads.items():
            assert impl.global_grad_norm({k: g}) == pytest.approx(
                _norm({k: g}), rel=F64_IDENTITY_RTOL, abs=0), k
        state = impl.adam_init(params)
        new, new_state = impl.adam_step(params, grads, state, **KW, no_decay=NO_DECAY)
    _assert_step(new, new_state, _expected(params, state, grads, 1), F64_IDENTITY_RTOL,
                 "adam_step")


# --------------------------------------------------------------------------- finiteness
@pytest.mark.parametrize("workers", (1, 2, 3))
@pytest.mark.parametrize("n_tensors", (1, 2, 3, 4, 7))
def test_non_finite_found_in_every_worker_group(workers, n_tensors):
    """Tensors of unequal sizes split among 1-3 workers: a NaN, +inf or -inf at the first, a
    middle or the last element of any one tensor (or of several) is found, the names come back
    in the dict's order, and the ValueError names the first bad tensor and index."""
    sizes = [1 + 5 * i * (i % 3) for i in range(n_tensors)]
    clean = {f"t{i}": np.random.default_rng(i).standard_normal(n) for i, n in enumerate(sizes)}
    with parallel.workers(workers):
        assert non_finite(clean) == []
        check_all_finite(clean)
        for bad_value in (np.nan, np.inf, -np.inf):
            for i, name in enumerate(clean):
                for where in sorted({0, sizes[i] // 2, sizes[i] - 1}):
                    named = {**clean, name: clean[name].copy()}
                    named[name][where] = bad_value
                    assert non_finite(named) == [name]
                    with pytest.raises(ValueError, match=rf"^{name}: .*at index \({where},\)"):
                        check_all_finite(named)
            bad = {k: (np.full_like(v, bad_value) if j % 2 else v)
                   for j, (k, v) in enumerate(clean.items())}
            assert non_finite(bad) == [k for j, k in enumerate(clean) if j % 2]


@pytest.mark.parametrize("n", [9, DOT_FROM + 9], ids=["isfinite", "dot"])  # both paths
@pytest.mark.parametrize("dtype, big", [(np.float32, 1e20), (np.float64, 1e160)])
def test_all_finite_when_the_fast_dot_product_overflows(dtype, big, n):
    """x . x overflows for finite |x| > sqrt(max): the check then looks at every element."""
    x = np.full(n, big, dtype=dtype)
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.dot(x, x))  # the case: the fast path's dot overflows
    assert all_finite(x)
    for where in (0, n // 2, n - 1):
        for bad_value in (np.nan, np.inf):
            y = x.copy()
            y[where] = bad_value
            assert not all_finite(y)


@pytest.mark.parametrize("chunk", [(3, 1), (3, 2)], indirect=True, ids=["w1", "w2"])
def test_adam_refuses_a_non_finite_gradient_in_the_last_chunk(chunk):
    params = _tensors(chunk, seed=5)
    grads = _tensors(chunk, seed=6)
    last = list(grads)[-1]
    grads[last].reshape(-1)[-1] = np.nan
    state = O.adam_init(params)
    with pytest.raises(ValueError, match=rf"grads\['{last}'\]: expected finite values"):
        O.adam_step(params, grads, state, **KW)
    with pytest.raises(ValueError, match=rf"grads\['{last}'\]: expected finite values"):
        O.adam_step_inplace(_copy(params), grads, state, **KW)
