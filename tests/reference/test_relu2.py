"""Squared ReLU, relu(x)^2 (issue 39: the MLP activation of the nanoGPT speedrun and Primer), in
the reference: its kernels at hand-computed values (the kink included: relu2 is C^1, so the
gradient at 0 is 0 by continuity, no convention), the FFN and both configs taking it by name,
and every refusal naming the argument, the values it takes and the one it got."""

from __future__ import annotations

import numpy as np
import pytest

from minibert_reference import ops
from minibert_reference.config import BertConfig, DecoderConfig

# x, relu(x)^2 and 2 relu(x) worked by hand (exact in binary floating point)
X = np.array([[-3.0, -0.5, 0.0], [0.25, 1.5, 4.0]])
Y = np.array([[0.0, 0.0, 0.0], [0.0625, 2.25, 16.0]])
SLOPE = np.array([[0.0, 0.0, 0.0], [0.5, 3.0, 8.0]])


@pytest.mark.equation("relu2.forward", "relu2.backward")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_relu2_values_and_gradient_by_hand(dtype):
    dy = np.array([[1.0, -2.0, 3.0], [-4.0, 0.5, 2.0]], dtype=dtype)
    y, cache = ops._activation_forward(X.astype(dtype), "relu2")
    (dx,) = ops._activation_backward(dy, cache)
    assert y.dtype == dx.dtype == dtype
    np.testing.assert_array_equal(y, Y.astype(dtype))
    np.testing.assert_array_equal(dx, (dy * SLOPE).astype(dtype))


@pytest.mark.equation("relu2.forward", "relu2.backward")
def test_the_ffn_applies_relu2_between_its_linears():
    """ffn_forward(activation="relu2") with identity weights and zero biases is relu2 itself,
    and its dx is dy * 2 relu(x); with W_1 = 2 I the pre-activation doubles, the output
    quadruples."""
    eye, zero = np.eye(3), np.zeros(3)
    y, cache = ops.ffn_forward(X, eye, zero, eye, zero, activation="relu2")
    dy = np.arange(6.0).reshape(2, 3) - 2.0
    np.testing.assert_array_equal(y, Y)
    np.testing.assert_array_equal(ops.ffn_backward(dy, cache)[0], dy * SLOPE)
    y2, _ = ops.ffn_forward(X, 2 * eye, zero, eye, zero, activation="relu2")
    np.testing.assert_array_equal(y2, 4 * Y)


def test_both_configs_take_relu2_and_refuse_other_names():
    assert BertConfig(activation="relu2").activation == "relu2"
    assert DecoderConfig(activation="relu2").activation == "relu2"
    for make in (BertConfig, DecoderConfig):
        with pytest.raises(ValueError, match=r"^activation: expected .*'relu2', got 'relu3'$"):
            make(activation="relu3")
    with pytest.raises(ValueError, match=r"^activation: expected one of \(.*'relu2'\), got "
                                         r"'relu3'$"):
        ops.ffn_forward(X, np.eye(3), None, np.eye(3), None, activation="relu3")


def test_the_reference_declares_relu2():
    import minibert_reference

    assert "relu2" in minibert_reference.CAPABILITIES["ffn"]["activation"]
    assert "relu2" in ops.ACTIVATIONS
