"""Arrival processes: sorted ``float64`` arrays of arrival times, bounded by ``n`` requests and/or
``horizon_s`` seconds (whichever is hit first)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from llmsched_gym.config import MAX_REQUESTS
from llmsched_gym.core.request import WorkloadError
from llmsched_gym.core.workload.checks import RngLike, _bounds, _cut, _expected, _num

MAX_CV = 100.0
"""Largest inter-arrival CV of a ``gamma`` arrival (Gamma shape ``1e-4``; real traces are near 1)."""
MAX_ROUND_B = 100_000
"""Largest ``B`` of a ``round_counts`` arrival (``binomial``, ``uniform``): the count distribution is
tabulated, one entry per possible count."""


def _renewal(draw_gaps: Callable[[int], np.ndarray], mean_gap: float, n: int | None,
             horizon_s: float | None) -> np.ndarray:
    if n is not None:
        return _cut(np.cumsum(draw_gaps(n)), None, horizon_s)
    assert horizon_s is not None  # _bounds guarantees one bound
    _expected(horizon_s, 1.0 / mean_gap)
    chunks, t0 = [], 0.0
    size = int(horizon_s / mean_gap * 1.1) + 16
    while t0 < horizon_s:
        chunk = t0 + np.cumsum(draw_gaps(size))
        chunks.append(chunk)
        t0 = chunk[-1]
    return _cut(np.concatenate(chunks), None, horizon_s)


def poisson(rate: float, *, n: int | None = None, horizon_s: float | None = None,
            rng: RngLike = None) -> np.ndarray:
    """Poisson arrivals: exponential gaps with mean ``1/rate`` seconds, the first one after t = 0."""
    rate = _num(rate, "rate", gt=0)
    n, horizon_s = _bounds(n, horizon_s)
    rng = np.random.default_rng(rng)
    return _renewal(lambda k: rng.exponential(1.0 / rate, k), 1.0 / rate, n, horizon_s)


def gamma(rate: float, cv: float, *, n: int | None = None, horizon_s: float | None = None,
          rng: RngLike = None) -> np.ndarray:
    """Gamma-renewal arrivals with mean rate ``rate`` and inter-arrival CV ``cv``.

    The Gamma shape is ``1/cv**2`` (cv > 1 is burstier than Poisson; the Azure conv trace has
    shape 0.87, i.e. cv 1.07; cv = 1 is Poisson).
    """
    rate, cv = _num(rate, "rate", gt=0), _num(cv, "cv", gt=0, le=MAX_CV)
    n, horizon_s = _bounds(n, horizon_s)
    rng = np.random.default_rng(rng)
    shape = 1.0 / cv**2
    return _renewal(lambda k: rng.gamma(shape, 1.0 / (rate * shape), k), 1.0 / rate, n, horizon_s)


def deterministic(rate: float, *, n: int | None = None, horizon_s: float | None = None) -> np.ndarray:
    """Evenly spaced arrivals at ``k / rate`` for k = 1, 2, ..."""
    rate = _num(rate, "rate", gt=0)
    n, horizon_s = _bounds(n, horizon_s)
    if n is not None:
        count = n
    else:
        assert horizon_s is not None  # _bounds guarantees one bound
        _expected(horizon_s, rate)
        count = math.ceil(horizon_s * rate) + 1
    return _cut(np.arange(1, count + 1) / rate, n, horizon_s)


def all_at_zero(n: int) -> np.ndarray:
    """``n`` requests that all arrive at t = 0 (a batch or offline pool)."""
    return np.zeros(int(_num(n, "n_requests", ge=0, integer=True)))


def on_off(rate_on: float, on_s: float, off_s: float, *, n: int | None = None,
           horizon_s: float | None = None, rng: RngLike = None) -> np.ndarray:
    """Poisson arrivals at ``rate_on`` during ON windows of ``on_s``, none during OFF windows of
    ``off_s``; the first window (from t = 0) is ON.

    Sampled exactly: a Poisson stream in "ON time" is mapped onto the wall clock.
    """
    rate_on, on_s = _num(rate_on, "rate_on", gt=0), _num(on_s, "on_s", gt=0)
    off_s = _num(off_s, "off_s", ge=0)
    n, horizon_s = _bounds(n, horizon_s)
    cycle = on_s + off_s
    on_horizon = None
    if horizon_s is not None:
        full, rest = divmod(horizon_s, cycle)
        on_horizon = full * on_s + min(rest, on_s)
    t_on = poisson(rate_on, n=n, horizon_s=on_horizon, rng=rng)
    windows, within = np.divmod(t_on, on_s)
    return windows * cycle + within


def thinned(rate_fn: Callable[[np.ndarray], np.ndarray], rate_max: float, *, n: int | None = None,
            horizon_s: float | None = None, rng: RngLike = None) -> np.ndarray:
    """Inhomogeneous Poisson arrivals with intensity ``rate_fn(t)`` (vectorised, ``<= rate_max``),
    by thinning a rate-``rate_max`` Poisson stream (Lewis and Shedler).

    With only ``n`` given, the intensity must not vanish for ever, or sampling never ends.
    """
    rate_max = _num(rate_max, "rate_max", gt=0)
    n, horizon_s = _bounds(n, horizon_s)
    rng = np.random.default_rng(rng)
    if horizon_s is not None:
        t = poisson(rate_max, horizon_s=horizon_s, rng=rng)
        return _cut(t[rng.random(len(t)) * rate_max < rate_fn(t)], n, None)
    assert n is not None  # _bounds guarantees one bound
    kept, total, t0 = [], 0, 0.0
    while total < n:
        t = t0 + poisson(rate_max, n=max(2 * (n - total), 64), rng=rng)
        keep = t[rng.random(len(t)) * rate_max < rate_fn(t)]
        kept.append(keep)
        total += len(keep)
        t0 = t[-1]
    return np.concatenate(kept)[:n] if kept else np.zeros(0)


def piecewise(rates: Sequence[float], boundaries_s: Sequence[float], *, n: int | None = None,
              horizon_s: float | None = None, rng: RngLike = None) -> np.ndarray:
    """Poisson arrivals whose rate is ``rates[i]`` between ``boundaries_s[i-1]`` and
    ``boundaries_s[i]`` (with 0 before the first breakpoint; the last rate holds on), by thinning.

    Example: ``piecewise([2, 10, 2], [60, 120])`` is a one-minute 5x burst after one minute.
    """
    r = np.array([_num(x, f"rates[{i}]", ge=0) for i, x in enumerate(rates)])
    bounds = np.array([_num(b, f"boundaries_s[{i}]", gt=0) for i, b in enumerate(boundaries_s)])
    if len(r) == 0 or len(bounds) != len(r) - 1:
        raise WorkloadError(f"boundaries_s: expected len(rates) - 1 = {len(r) - 1} breakpoints, "
                            f"got {len(bounds)}")
    if np.any(np.diff(bounds) <= 0):
        raise WorkloadError("boundaries_s: must be strictly increasing")
    if r.max() == 0 or (horizon_s is None and r[-1] == 0):
        raise WorkloadError("rates: need a rate > 0 (and a last rate > 0 when only n_requests is given)")

    def rate_fn(t: np.ndarray) -> np.ndarray:
        return r[np.searchsorted(bounds, t, side="right")]

    return thinned(rate_fn, float(r.max()), n=n, horizon_s=horizon_s, rng=rng)


def diurnal(mean_rate: float, amplitude: float, period_s: float, *, peak_s: float = 0.0,
            n: int | None = None, horizon_s: float | None = None, rng: RngLike = None) -> np.ndarray:
    """Poisson arrivals with a sinusoidal (day/night) rate, by thinning:
    ``mean_rate * (1 + amplitude * cos(2 pi (t - peak_s) / period_s))``.

    Echo's 24 h trace (Wang et al. 2025) (peak 12:00-14:00, peak/trough about 6) is
    ``diurnal(r, 5 / 7, 86400, peak_s=13 * 3600)``.
    """
    mean_rate = _num(mean_rate, "mean_rate", gt=0)
    amplitude = _num(amplitude, "amplitude", ge=0, le=1)
    period_s, peak_s = _num(period_s, "period_s", gt=0), _num(peak_s, "peak_s")

    def rate_fn(t: np.ndarray) -> np.ndarray:
        return mean_rate * (1.0 + amplitude * np.cos(2.0 * np.pi * (t - peak_s) / period_s))

    return thinned(rate_fn, mean_rate * (1.0 + amplitude), n=n, horizon_s=horizon_s, rng=rng)


def round_counts(pmf: Sequence[float] | np.ndarray, *, n: int | None = None, horizon_s: float | None = None,
                 rng: RngLike = None) -> np.ndarray:
    """Round mode (Jaillet et al. 2025): i.i.d. integer arrival counts per round, ``P(count = c) = pmf[c]``.

    Arrival times are round indices 0, 1, 2, ... (as floats); ``horizon_s`` is the number of
    rounds. E.g. Uniform{0..2}: ``round_counts([1/3, 1/3, 1/3], horizon_s=100, rng=0)``.
    """
    p = np.array([_num(x, f"pmf[{i}]", ge=0) for i, x in enumerate(pmf)])
    if len(p) == 0 or not math.isclose(p.sum(), 1.0, rel_tol=1e-6):
        raise WorkloadError(f"pmf: probabilities must sum to 1, got {p.sum():g}")
    if n is not None and horizon_s is None and p[0] >= 1.0:
        raise WorkloadError("pmf: P(0 arrivals) = 1 never reaches n_requests")
    n, horizon_s = _bounds(n, horizon_s)
    if horizon_s is not None and horizon_s > MAX_REQUESTS:
        raise WorkloadError(f"horizon_s: {horizon_s:g} rounds; at most {MAX_REQUESTS:,} (round mode counts rounds)")
    rng = np.random.default_rng(rng)
    p = p / p.sum()
    if horizon_s is not None:
        counts = rng.choice(len(p), size=math.ceil(horizon_s), p=p)
    else:
        assert n is not None  # _bounds guarantees one bound
        mean = float(p @ np.arange(len(p)))
        chunks, total = [np.zeros(0, dtype=np.int64)], 0
        while total < n:
            chunks.append(rng.choice(len(p), size=int((n - total) / mean) + 16, p=p))
            total += int(chunks[-1].sum())
        counts = np.concatenate(chunks)
    return _cut(np.repeat(np.arange(len(counts), dtype=np.float64), counts), n, None)
