"""Least-squares fits of the analytic models to measured profile rows (:data:`PROFILE_COLUMNS`
order)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from llmsched_gym.core.latency.analytic import AffineLatency, LinearKVLatency
from llmsched_gym.core.latency.table import PROFILE_COLUMNS


def _shapes(rows: Iterable[Sequence[float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a = np.array([list(r) for r in rows], dtype=np.float64).reshape(-1, len(PROFILE_COLUMNS))
    p, nd = a[:, 0], a[:, 3]
    return a, a[(nd == 0) & (p > 0)], a[(p == 0) & (nd > 0)]


def _lstsq(columns: list[np.ndarray], y: np.ndarray) -> list[float]:
    """Least squares on the columns that add rank, in order; dropped columns get 0.

    A profile often leaves columns collinear (one request per prefill, no cached prefix);
    dropping them keeps the coefficients interpretable instead of splitting them.
    """
    kept: list[int] = []
    for j in range(len(columns)):
        trial = np.column_stack([columns[i] for i in [*kept, j]])
        if np.linalg.matrix_rank(trial) == len(kept) + 1:
            kept.append(j)
    sol = np.linalg.lstsq(np.column_stack([columns[i] for i in kept]), y, rcond=None)[0]
    coef = [0.0] * len(columns)
    for i, c in zip(kept, sol, strict=True):
        coef[i] = float(c)
    return coef


def fit_affine(rows: Iterable[Sequence[float]]) -> AffineLatency:
    """Least-squares :class:`AffineLatency` from profile rows (:data:`PROFILE_COLUMNS` order).

    Prefill-only rows fit the prefill part, decode-only rows the decode part; mixed rows are
    ignored. Coefficients a profile cannot identify (a constant or collinear column) are 0.
    """
    _, pre, dec = _shapes(rows)
    if len(pre) == 0 or len(dec) == 0:
        raise ValueError("latency: fit_affine needs prefill-only and decode-only rows")
    one_p, one_d = np.ones(len(pre)), np.ones(len(dec))
    p0, p_tok, p_seq, p_ctx = _lstsq([one_p, pre[:, 0], pre[:, 2], pre[:, 1]], pre[:, 5])
    d0, d_seq, d_kv = _lstsq([one_d, dec[:, 3], dec[:, 4] + dec[:, 3]], dec[:, 5])
    return AffineLatency(p0, p_seq, p_tok, p_ctx, d0, d_seq, d_kv)


def fit_linear(rows: Iterable[Sequence[float]]) -> LinearKVLatency:
    """Least-squares :class:`LinearKVLatency` (Ao et al. 2025's ``d0``, ``d1``) from all profile rows."""
    a, _, _ = _shapes(rows)
    if len(a) < 2:
        raise ValueError("latency: fit_linear needs at least 2 rows")
    d0, d1 = _lstsq([np.ones(len(a)), a[:, 1] + a[:, 4] + a[:, 3]], a[:, 5])
    return LinearKVLatency(d0, d1)

