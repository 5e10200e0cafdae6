"""A softmax class that promotes float32 to float64 (``/ np.sqrt(d)``: a float64 NumPy scalar
under NEP 50), checked through the adapter of its own file, promotion_impl_adapter.py, which
makes a harmless float64 stand-in first (tests/suite/test_messages.py: the cause names this
file's line, never the adapter's)."""

import numpy as np


class Softmax:
    def __init__(self, d):
        self.d = d

    def forward(self, x):
        s = x / np.sqrt(self.d)  # the promotion: float64 from here on
        e = np.exp(s - s.max(-1, keepdims=True))
        self.p = e / e.sum(-1, keepdims=True)
        return self.p

    def backward(self, dp):
        p = self.p
        return p * (dp - (p * dp).sum(-1, keepdims=True)) / np.sqrt(self.d)
