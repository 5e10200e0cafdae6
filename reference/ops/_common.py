"""What every section shares: the ignored label, the row view of a batch and the sum over its
leading axes."""

from __future__ import annotations

import numpy as np

# the public ops of this section: the package gathers them into minibert_reference.ops.__all__
__all__ = ["IGNORE_INDEX"]

IGNORE_INDEX = -100


def _rows(a: np.ndarray) -> np.ndarray:
    """[..., n] -> [N, n], every leading axis flattened into rows (a view when ``a`` is
    contiguous).  Matrix products go through this: ``np.matmul`` of a [B, T, n] array runs one
    small GEMM per batch row (repacking the weight each time), 1.2-1.5x slower than one GEMM
    over all B*T rows (measured for every Mini-BERT projection)."""
    return a.reshape(-1, a.shape[-1])


def _sum_to_last(a: np.ndarray) -> np.ndarray:
    """Sum every leading axis: the gradient of a parameter broadcast over [*, n]."""
    return _rows(a).sum(axis=0)
