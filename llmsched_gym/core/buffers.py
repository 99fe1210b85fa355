"""Per-request buffers that grow at run time (a cluster's replicas get their requests one by one):
rows to spare, doubled when full, so that a request costs O(1) amortised."""

from __future__ import annotations

import numpy as np


def resized(a: np.ndarray, cap: int, fill: float | bool = 0) -> np.ndarray:
    """A buffer of ``cap`` rows of ``a``'s dtype: ``a``'s rows first, then ``fill``."""
    out = np.zeros(cap, dtype=a.dtype) if fill == 0 else np.full(cap, fill, dtype=a.dtype)
    out[:len(a)] = a
    return out
