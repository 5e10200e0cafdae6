"""Forwards close to the reference's but not equal (1e-2 relative), beside an exact one, for
``minibert adapter infer`` (tests/suite/test_infer.py): a near miss must be left unmapped -- an
adapter built on it would hand the suite a forward that is not the op's.  ``Dense`` is the
exact linear layer (mapped), ``DenseOff`` and the ``relu`` pair are 1% off (unmapped)."""

import numpy as np

OFF = 1.01  # 1e-2 relative: ten times infer's FORWARD_RTOL


class Dense:
    def __init__(self, n_in, n_out):
        self.W = np.zeros((n_in, n_out))
        self.b = np.zeros(n_out)

    def forward(self, x):
        self.x = x
        return x @ self.W + self.b

    def backward(self, dy):
        self.dW = self.x.reshape(-1, self.x.shape[-1]).T @ dy.reshape(-1, dy.shape[-1])
        self.db = dy.reshape(-1, dy.shape[-1]).sum(0)
        return dy @ self.W.T


class DenseOff(Dense):
    def forward(self, x):
        return super().forward(x) * OFF


def relu(x):
    return np.maximum(x, 0) * OFF


def relu_backward(dout, x):
    return dout * (x > 0) * OFF
