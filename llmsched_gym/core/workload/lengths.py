"""Length samplers: ``int64`` arrays of token counts clipped to ``[1, max_tokens]``."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from llmsched_gym.core.request import MAX_TOKENS, WorkloadError
from llmsched_gym.core.workload.checks import RngLike, _num


def _clip(x: np.ndarray, max_tokens: int | None) -> np.ndarray:
    hi = MAX_TOKENS if max_tokens is None else _num(max_tokens, "max", ge=1, le=MAX_TOKENS, integer=True)
    return np.clip(np.rint(x), 1, hi).astype(np.int64)


def fixed(value: int, size: int) -> np.ndarray:
    """``size`` copies of ``value`` tokens."""
    return np.full(size, int(_num(value, "value", ge=1, le=MAX_TOKENS, integer=True)), dtype=np.int64)


def uniform(lo: int, hi: int, size: int, rng: RngLike = None) -> np.ndarray:
    """Integers drawn uniformly from ``lo..hi`` inclusive."""
    lo = int(_num(lo, "lo", ge=1, le=MAX_TOKENS, integer=True))
    hi = int(_num(hi, "hi", ge=lo, le=MAX_TOKENS, integer=True))
    return np.random.default_rng(rng).integers(lo, hi + 1, size, dtype=np.int64)


def lognormal_params(mean: float, median: float) -> tuple[float, float]:
    """``(mu, sigma)`` of the lognormal with this mean and median:
    ``mu = ln(median)``, ``sigma = sqrt(2 ln(mean / median))`` (since mean = exp(mu + sigma^2 / 2)).

    LMSYS prompts (Jaillet et al. 2025, mean 40.62, median 11) give ``(ln 11, 1.616)``.
    """
    median, mean = _num(median, "median", gt=0), _num(mean, "mean", gt=0)
    if mean < median:
        raise WorkloadError(f"mean: expected a number >= median ({median:g}), got {mean:g}")
    return math.log(median), math.sqrt(2.0 * math.log(mean / median))


def lognormal(mean: float, median: float, size: int, rng: RngLike = None, *,
              max_tokens: int | None = None) -> np.ndarray:
    """Lognormal lengths with the given mean and median (see :func:`lognormal_params`), rounded
    and clipped to ``[1, max_tokens]`` (clipping lowers the realised mean)."""
    mu, sigma = lognormal_params(mean, median)
    return _clip(np.random.default_rng(rng).lognormal(mu, sigma, size), max_tokens)


def zipf(a: float, size: int, rng: RngLike = None, *, max_tokens: int | None = None) -> np.ndarray:
    """Zipf lengths, ``P(k) ~ k^-a`` for k >= 1 (``a`` > 1; heavy-tailed, so set ``max_tokens``)."""
    a = _num(a, "a", gt=1)
    return _clip(np.random.default_rng(rng).zipf(a, size).astype(np.float64), max_tokens)


def empirical(values: Sequence[int] | np.ndarray, size: int, rng: RngLike = None, *,
              max_tokens: int | None = None) -> np.ndarray:
    """Resample observed lengths with replacement (e.g. a trace column)."""
    try:
        v = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise WorkloadError("values: expected a non-empty list of finite numbers") from None
    if v.ndim != 1 or len(v) == 0 or not np.all(np.isfinite(v)):
        raise WorkloadError("values: expected a non-empty list of finite numbers")
    return _clip(np.random.default_rng(rng).choice(v, size), max_tokens)
