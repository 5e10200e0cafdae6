"""``minibert adapter infer``'s position rows: a sinusoidal table added to x
(``sinusoidal_position``, with the protocol's ``sinusoidal_encoding`` written beside it from
the class's table attribute, a module function or the forward at x = 0) and a learned table
(``position_embedding``, mapped only where its gradient is found)."""

from __future__ import annotations

import textwrap

import numpy as np

import minibert_reference as R
from minibert_spec.suite.infer import infer_source
from tests.examples import realstyle_numpy_transformer as numpy_transformer
from tests.suite.infer_support import exec_source as _exec
from tests.suite.infer_support import load_source as _load


def _assert_table(adapter, T=7, d=5):
    """The adapter's sinusoidal_encoding equals the reference's, in both dtypes."""
    for dtype in (np.float64, np.float32):
        got = adapter.sinusoidal_encoding(T, d, dtype)
        assert got.shape == (T, d) and got.dtype == dtype, (got.shape, got.dtype)
        np.testing.assert_allclose(got, R.sinusoidal_encoding(T, d, dtype), rtol=1e-6, atol=1e-7)


def test_a_positional_encoding_class_is_mapped_with_its_table():
    """realstyle_numpy_transformer's PositionalEncoding(T, d, dtype): T and d named by x's axes,
    dtype passed on, the encoding its .pe (the hand adapter's row)."""
    src = infer_source(numpy_transformer.__name__)
    assert "lambda x: impl.PositionalEncoding(T=x.shape[-2], d=x.shape[-1], dtype=x.dtype)" in src
    assert "return impl.PositionalEncoding(T=T, d=d, dtype=dtype).pe\n" in src, src
    adapter = _exec(src)
    _assert_table(adapter)
    x = np.random.default_rng(0).standard_normal((2, 6, 5)).astype(np.float32)
    y, _ = adapter.sinusoidal_position_forward(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, R.sinusoidal_position_forward(x)[0], rtol=1e-6)


def test_a_wrong_sinusoidal_table_is_not_mapped_to_either_position_row(monkeypatch):
    """sin and cos swapped (the example's bug): no sinusoidal row, and -- its table has no
    gradient -- no learned position row either; the class is named with why."""
    monkeypatch.setattr(numpy_transformer, "BUGS", {"sinusoidal_position"})
    src = infer_source(numpy_transformer.__name__)
    assert "sinusoidal_position_forward" not in src and "def sinusoidal_encoding" not in src
    assert "position_embedding_forward" not in src, src
    assert "class PositionalEncoding" in src and "no gradient of it was found" in src, src


def test_a_fixed_table_is_no_learned_position_embedding(tmp_path, monkeypatch):
    """A random buffer added to x, with no gradient: never a position_embedding row."""
    _load(tmp_path, monkeypatch, textwrap.dedent("""
        import numpy as np

        class Jitter:
            def __init__(self, max_len, dim):
                self.noise = np.random.default_rng(0).standard_normal((max_len, dim))

            def forward(self, x):
                return x + self.noise[:x.shape[1]]

            def backward(self, dy):
                return dy
        """), "fixed_table")
    src = infer_source("fixed_table")
    assert "position_embedding_forward" not in src, src
    assert "class Jitter" in src and "no gradient of it was found" in src, src


def test_a_learned_table_is_mapped_with_its_gradient():
    """infer_layers.LearnedPositions: W_pos [T_max, H] at .wpe, its gradient at .dwpe; the
    adapter equals the reference on T < T_max (the unused rows' gradient zero)."""
    from tests.examples import infer_layers

    src = infer_source(infer_layers.__name__)
    assert "params={'W_pos': 'wpe'}" in src and "grads={'W_pos': 'dwpe'}" in src, src
    adapter = _exec(src)
    rng = np.random.default_rng(1)
    x, W_pos, dy = (rng.standard_normal(s) for s in ((3, 4, 5), (6, 5), (3, 4, 5)))
    y, cache = adapter.position_embedding_forward(x, W_pos)
    want, ref_cache = R.position_embedding_forward(x, W_pos)
    np.testing.assert_allclose(y, want, rtol=1e-12)
    for g, w in zip(adapter.position_embedding_backward(dy, cache),
                    R.position_embedding_backward(dy, ref_cache)):
        np.testing.assert_allclose(g, w, rtol=1e-12)
    # the class table is [1, 512, d]: its first T rows, cast to the dtype asked for
    assert "np.asarray(impl.PositionalEncoding(d_model=d).pe, dtype=dtype).reshape(-1, d)[:T]" \
        in src, src
    _assert_table(adapter)


def test_the_table_function_is_found_with_its_sizes_in_its_order():
    """infer_functions.positional_encoding(d_model, max_len): called (d, T)."""
    from tests.examples import infer_functions

    src = infer_source(infer_functions.__name__)
    assert "return np.asarray(impl.positional_encoding(d, T), dtype=dtype)" in src, src
    _assert_table(_exec(src))


def test_without_a_table_function_the_encoding_is_the_forward_at_zero(tmp_path, monkeypatch):
    """A function pair alone: sinusoidal_encoding written as the forward at x = 0.  A function
    named like a table that does not give the reference's (zeros) is not taken for it."""
    _load(tmp_path, monkeypatch, textwrap.dedent("""
        import numpy as np
        import minibert_reference as R

        def pos_table(T, d):
            return np.zeros((T, d))

        def add_pe(x):
            return x + R.sinusoidal_encoding(x.shape[1], x.shape[2], x.dtype)

        def add_pe_backward(dout):
            return dout
        """), "pe_pair")
    src = infer_source("pe_pair")
    assert "sinusoidal_position_forward(np.zeros((1, T, d), dtype))[0].reshape(-1, d)[:T]" in src
    assert "pos_table" not in src and "the forward at x = 0" in src, src
    _assert_table(_exec(src))
