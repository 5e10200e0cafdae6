"""The adapter of promotion_impl.py, in a file of its own as ``minibert adapter new`` writes
one: its key mask stand-in ``np.ones`` is float64 and harmless (compared, never computed with),
and it is the first float64 the call makes -- the cause line must still be the
implementation's."""

import numpy as np

from tests.examples import promotion_impl as impl


def softmax_forward(x, mask=None):
    keep = np.ones(x.shape) if mask is None else np.asarray(mask)  # a stand-in: all kept
    layer = impl.Softmax(x.shape[-1])
    return layer.forward(np.where(keep > 0, x, -np.inf)), layer


def softmax_backward(dp, layer):
    return (layer.backward(dp),)
