"""Seeded workload generators: arrival processes, length samplers, clients, task classes, prefixes.

Everything is pre-sampled into NumPy arrays (see :class:`~llmsched_gym.core.request.Workload`).
The building blocks compose by hand::

    rng = np.random.default_rng(0)
    t = poisson(50.0, n=1000, rng=rng)                       # sorted arrival times
    wl = Workload(t, lognormal(40.62, 11, len(t), rng), lognormal(85.32, 45, len(t), rng))
    wl = wl.with_(predicted_output=predict(wl, "noisy", rng, x=0.2))

or from a declarative spec (what scenarios use)::

    build_workload({"arrival": {"type": "poisson", "rate": 50}, "n_requests": 1000,
                    "prompt": {"type": "lognormal", "mean": 40.62, "median": 11},
                    "output": {"type": "lognormal", "mean": 85.32, "median": 45}}, seed=0)

Arrival processes return sorted ``float64`` arrays and take ``n`` (number of requests), ``horizon_s``
(keep arrivals with ``t < horizon_s``) or both (whichever bound is hit first). Length samplers
return ``int64`` arrays clipped to ``[1, max_tokens]``. Generators that need more than arrivals
and lengths (typed mixtures, Definition 4 queues, clients, task classes) return a ``Workload``.

Spec of :func:`build_workload` (every key optional unless said; unknown keys raise
:class:`WorkloadError` naming the field and the allowed keys):

``n_requests`` (int >= 0), ``horizon_s`` (float > 0)
    Bounds of the workload; at least one is needed unless the arrival process, the ``users``
    prefix model or the trace fixes the count.
``arrival`` (mapping, ``type`` plus its parameters)
    ``poisson``: ``rate``. ``gamma``: ``rate``, ``cv`` (inter-arrival coefficient of variation;
    Gamma shape ``1/cv**2``). ``deterministic``: ``rate`` (arrivals at ``k/rate``, k = 1, 2, ...).
    ``all_at_zero``: no parameters (needs ``n_requests``). ``on_off``: ``rate_on``, ``on_s``,
    ``off_s`` (Poisson during ON windows, starting ON at t = 0). ``piecewise``: ``rates``,
    ``boundaries_s`` (``len(rates) - 1`` increasing breakpoints; the last rate holds on).
    ``diurnal``: ``mean_rate``, ``amplitude`` (in [0, 1]), ``period_s``, optional ``peak_s``
    (rate ``mean_rate * (1 + amplitude * cos(2 pi (t - peak_s) / period_s))``; peak/trough
    ratio ``(1 + a) / (1 - a)``, so 6x is ``a = 5/7``). ``round_counts``: integer arrival counts
    per round (times are round indices 0, 1, ...; ``horizon_s`` counts rounds), ``dist`` one of
    ``binomial`` (``B``, ``p``), ``uniform`` (``B``: uniform on {0..B}) or ``pmf`` (``pmf``: the
    probabilities of 0, 1, 2, ... arrivals).
    Default: Poisson at the sum of the ``types`` rates when ``types`` is given.
``prompt``, ``output`` (length spec)
    An int (every request gets it) or a mapping: ``fixed`` (``value``), ``uniform`` (``lo``,
    ``hi``, inclusive), ``lognormal`` (``mean``, ``median``: mu = ln median,
    sigma = sqrt(2 ln(mean / median))), ``zipf`` (``a`` > 1), ``empirical`` (``values``, or
    ``path`` plus ``column`` of a CSV file, resampled with replacement). Every mapping also takes
    ``max`` (clip to at most this many tokens). Defaults: ``prompt`` is required except with
    ``types``, ``users`` or ``trace``; ``output`` likewise, except with ``users`` where it is 1.
``types`` (list of ``{"rate", "prompt", "output"}``)
    Ao et al. 2025's prompt types: type j arrives as a Poisson process of rate ``rate`` with lengths
    ``prompt`` and ``output`` (ints or length specs); sets ``type_id``. With an explicit
    ``arrival`` the rates only set the mix.
``clients`` (list of ``{"rate" or "arrival", "weight", "prompt", "output"}``)
    One stream per client (Poisson at ``rate`` unless ``arrival`` is given), merged by time;
    client i gets id i and weight ``weight`` (default 1). ``prompt``/``output`` default to the
    top-level ones. Excludes a top-level ``arrival`` and ``types``.
``classes`` (mapping: ``offline``, ``ttft_slo_s``, ``tpot_slo_s``)
    Echo (Wang et al. 2025): the main stream is online with the given SLOs (defaults 1 s and 0.05 s);
    ``offline`` is a spec (``n_requests``, ``prompt``, ``output``, ``prefix``) whose requests all
    arrive at t = 0 with infinite SLOs.
``prefix`` (mapping)
    ``{"type": "system", "groups": G, "tokens": S, "weights": [...]}``: each request picks one
    of G system prompts (uniformly or by ``weights``) of S tokens, prepended to its prompt; each
    stream (each client, the offline pool) gets its own G prompts.
    ``{"type": "users", "users", "k", "user_tokens", "doc_tokens", "base_tokens", "s",
    "shuffle"}``: Dexter et al. 2025's Definition 4 queue (see :func:`regular_shuffled_queue`); an explicit
    ``arrival`` replaces the regular slots ``s, 2s, ...``.
``predictor`` (mapping)
    ``oracle``, ``lognormal`` (``sigma``), ``noisy`` (``x``), ``bucketed`` (``edges``, ``point`` =
    ``upper`` | ``mid``) or ``none``: see :func:`predict`. Default: oracle. The predictor sets the
    scenario's information model (:mod:`llmsched_gym.core.information`): ``oracle`` is
    clairvoyant, ``none`` is blind, any other is predicted; ``meta["information"]`` records it.
``trace`` (mapping: ``format``, ``path``, ``on_zero``, ``time_scale``)
    Load requests from a file (``format``: ``azure``, ``vtc``, ``csv``, ``jsonl``, ``sharegpt``;
    see :mod:`llmsched_gym.core.traces`). ``path`` is a file, or a known trace's name
    (``azure-conv``, ``vtc-arena``) looked up by :func:`llmsched_gym.data.resolve_data`: the
    cache that ``llmsched data download`` fills, then ``../shared/traces``. Without ``path``
    (the ``azure`` and ``vtc`` formats) a missing trace falls back to
    :func:`~llmsched_gym.core.traces.synthetic_azure_conv` or
    :func:`~llmsched_gym.core.traces.synthetic_vtc_arena`, with one line on stderr, and
    ``meta["workload_source"]`` says which ran (``kind`` ``trace`` with the file's ``sha256``, or
    ``synthetic``).
    An ``arrival`` replaces the trace's timestamps (required for ``sharegpt``); ``time_scale``
    multiplies them (0.5 doubles the rate). ``n_requests``/``horizon_s`` cut the trace: from its
    first row (``window: head``, the default) or from a seeded start row (``window: random``,
    arrivals shifted to start at 0), so that different seeds give different workloads. ``part``
    (``[start, end]``, fractions of the rows, default ``[0, 1]``) keeps only that part of the trace
    first, so that training and test windows can come from disjoint parts.

Randomness: each part of the spec draws from its own stream derived from ``(seed, field path)``,
so the same seed gives identical arrays, and changing, say, the predictor leaves the arrivals and
lengths unchanged (common random numbers across scenario variants).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from llmsched_gym.config import MAX_REQUESTS
from llmsched_gym.core.information import information_of_predictor
from llmsched_gym.core.request import MAX_TOKENS, OFFLINE, ONLINE, Segments, Workload, WorkloadError

RngLike = np.random.Generator | int | None


# ---------------------------------------------------------------------------------------------
# argument checks (messages name the argument; build_workload prefixes the spec path)


def _num(value: Any, name: str, *, gt: float | None = None, ge: float | None = None,
         le: float | None = None, integer: bool = False) -> float:
    ok = isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)
    if ok and integer:
        ok = float(value).is_integer()
    def show(x: float) -> str:
        return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"

    bounds = [f"> {show(gt)}" if gt is not None else "", f">= {show(ge)}" if ge is not None else "",
              f"<= {show(le)}" if le is not None else ""]
    want = f"{'an integer' if integer else 'a number'} {' and '.join(b for b in bounds if b)}".rstrip()
    if ok:
        v = float(value)
        ok = math.isfinite(v) and (gt is None or v > gt) and (ge is None or v >= ge) and (le is None or v <= le)
    if not ok:
        raise WorkloadError(f"{name}: expected {want}, got {value!r}")
    return int(value) if integer else float(value)


MAX_CV = 100.0
"""Largest inter-arrival CV of a ``gamma`` arrival (Gamma shape ``1e-4``; real traces are near 1)."""
MAX_ROUND_B = 100_000
"""Largest ``B`` of a ``round_counts`` arrival (``binomial``, ``uniform``): the count distribution is
tabulated, one entry per possible count."""


def _bounds(n: int | None, horizon_s: float | None) -> tuple[int | None, float | None]:
    if n is None and horizon_s is None:
        raise WorkloadError("n_requests: give n_requests and/or horizon_s")
    n = None if n is None else int(_num(n, "n_requests", ge=0, le=MAX_REQUESTS, integer=True))
    horizon_s = None if horizon_s is None else _num(horizon_s, "horizon_s", gt=0)
    return n, horizon_s


def _expected(horizon_s: float, rate: float) -> None:
    """Refuse a horizon that would draw more than MAX_REQUESTS arrivals (memory, not a message)."""
    if horizon_s * rate > MAX_REQUESTS:
        raise WorkloadError(f"horizon_s: {horizon_s:g} s at {rate:g} requests/s is about {horizon_s * rate:.3g} "
                            f"requests; at most {MAX_REQUESTS:,} (shorten it or set n_requests)")


def _cut(t: np.ndarray, n: int | None, horizon_s: float | None) -> np.ndarray:
    if horizon_s is not None:
        t = t[t < horizon_s]
    return t if n is None else t[:n]


# ---------------------------------------------------------------------------------------------
# arrival processes: sorted float64 arrays of arrival times


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


# ---------------------------------------------------------------------------------------------
# length samplers: int64 arrays clipped to [1, max_tokens]


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


# ---------------------------------------------------------------------------------------------
# structured workloads


_ROW_ARRAYS = ("arrival_s", "prompt_tokens", "output_tokens", "predicted_output", "client", "task_class",
               "type_id", "ttft_slo_s", "tpot_slo_s")


def merge(parts: Sequence[Workload], client_weight: Sequence[float] | None = None) -> Workload:
    """Concatenate workloads and sort them by arrival (stable: ties keep part order).

    Request ids are renumbered (row order of the result). Segment ids are kept as they are, so
    parts may deliberately share segments; give parts disjoint ids otherwise. ``client_weight``
    defaults to the weights of the part with the most clients (1.0 for ids beyond them).
    """
    if not parts:
        raise WorkloadError("parts: need at least one workload")
    cat: dict[str, Any] = {name: np.concatenate([getattr(p, name) for p in parts]) for name in _ROW_ARRAYS}
    order = np.argsort(cat["arrival_s"], kind="stable")
    cat = {name: a[order] for name, a in cat.items()}
    prefix = None
    if any(p.prefix is not None for p in parts):
        flat = [s for p in parts for s in (p.prefix or [None] * len(p))]
        prefix = [flat[i] for i in order]
    if client_weight is None:
        n_clients = int(cat["client"].max()) + 1 if len(cat["client"]) else 1
        longest = max((np.asarray(p.client_weight) for p in parts), key=len)
        weight = np.concatenate([longest, np.ones(max(n_clients - len(longest), 0))])
    else:
        weight = np.asarray(client_weight, dtype=np.float64)
    return Workload(**cat, prefix=prefix, client_weight=weight)


def merge_clients(parts: Sequence[Workload], weights: Sequence[float] | None = None) -> Workload:
    """Sheng et al. 2024's multi-client workload: part ``i`` becomes client ``i`` with weight ``weights[i]``
    (default 1), merged by arrival time."""
    w = [1.0] * len(parts) if weights is None else [_num(x, f"weights[{i}]", gt=0) for i, x in enumerate(weights)]
    if len(w) != len(parts):
        raise WorkloadError(f"weights: expected {len(parts)} entries (one per client), got {len(w)}")
    tagged = [p.with_(client=np.full(len(p), i), client_weight=np.ones(i + 1)) for i, p in enumerate(parts)]
    return merge(tagged, client_weight=w)


def with_task_classes(online: Workload, offline: Workload, *, ttft_slo_s: float = 1.0,
                      tpot_slo_s: float = 0.05) -> Workload:
    """Echo's co-located serving (Wang et al. 2025): ``online`` requests keep their arrivals and get the SLOs;
    ``offline`` requests all arrive at t = 0 with no SLO (``inf``)."""
    ttft_slo_s, tpot_slo_s = _slo(ttft_slo_s, "ttft_slo_s"), _slo(tpot_slo_s, "tpot_slo_s")
    n_on, n_off = len(online), len(offline)
    on = online.with_(task_class=np.full(n_on, ONLINE), ttft_slo_s=np.full(n_on, ttft_slo_s),
                      tpot_slo_s=np.full(n_on, tpot_slo_s))
    off = offline.with_(arrival_s=np.zeros(n_off), task_class=np.full(n_off, OFFLINE),
                        ttft_slo_s=np.full(n_off, np.inf), tpot_slo_s=np.full(n_off, np.inf))
    return merge([on, off])


def _slo(value: Any, name: str) -> float:
    return math.inf if value == math.inf else _num(value, name, gt=0)


def _mix(rates: Sequence[float], size: int, rng: np.random.Generator) -> np.ndarray:
    r = np.array([_num(x, f"types[{i}].rate", gt=0) for i, x in enumerate(rates)])
    if len(r) == 0:
        raise WorkloadError("types: need at least one type")
    return rng.choice(len(r), size=size, p=r / r.sum())


def typed_mixture(types: Sequence[tuple[float, int, int]], *, n: int | None = None,
                  horizon_s: float | None = None, rng: RngLike = None) -> Workload:
    """Ao et al. 2025's prompt types: type ``j = (rate_j, prompt_j, output_j)`` arrives as its own
    Poisson process; sets ``type_id`` = j.

    Sampled as one Poisson stream at ``sum(rate_j)`` whose requests pick type j with probability
    ``rate_j / sum(rate)`` (the same process, by superposition).
    """
    rng = np.random.default_rng(rng)
    rates = [t[0] for t in types]
    t = poisson(sum(_num(r, f"types[{i}].rate", gt=0) for i, r in enumerate(rates)),
                n=n, horizon_s=horizon_s, rng=rng)
    type_id = _mix(rates, len(t), rng)
    prompt = np.array([_num(x[1], f"types[{j}].prompt", ge=1, integer=True) for j, x in enumerate(types)])
    output = np.array([_num(x[2], f"types[{j}].output", ge=1, integer=True) for j, x in enumerate(types)])
    return Workload(t, prompt[type_id], output[type_id], type_id=type_id)


def shared_system_prompts(workload: Workload, groups: int, tokens: int, rng: RngLike = None, *,
                          weights: Sequence[float] | None = None, first_segment_id: int = 0) -> Workload:
    """Prepend one of ``groups`` shared system prompts of ``tokens`` tokens to every prompt.

    Request i picks group g (uniformly, or with probability proportional to ``weights[g]``); its
    prompt grows by ``tokens`` and its prefix becomes ``((first_segment_id + g, tokens),)``
    followed by any segments it already had.
    """
    groups = int(_num(groups, "groups", ge=1, integer=True))
    tokens = int(_num(tokens, "tokens", ge=1, integer=True))
    if weights is None:
        p = None
    else:
        w = np.array([_num(x, f"weights[{i}]", ge=0) for i, x in enumerate(weights)])
        if len(w) != groups or w.sum() <= 0:
            raise WorkloadError(f"weights: expected {groups} non-negative weights (one per group), not all 0")
        p = w / w.sum()
    g = np.random.default_rng(rng).choice(groups, size=len(workload), p=p) + int(first_segment_id)
    old = workload.prefix or [None] * len(workload)
    prefix = [((int(gi), tokens),) + (segs or ()) for gi, segs in zip(g, old, strict=True)]
    return workload.with_(prompt_tokens=workload.prompt_tokens + tokens, prefix=prefix)


def regular_shuffled_queue(n_users: int, k: int, user_tokens: int, doc_tokens: int, s: float = 0.0, *,
                           base_tokens: int = 0, output_tokens: int | np.ndarray = 1,
                           arrival_s: np.ndarray | None = None, shuffle: bool = True,
                           rng: RngLike = None, first_segment_id: int = 0) -> Workload:
    """Dexter et al. 2025's Definition 4 ("Regular Arrival Shuffled Queue"): ``n = n_users * k`` prompts
    ``(base)(user)(doc)``.

    Each user prefix (``user_tokens``) is shared by exactly ``k`` prompts; each doc
    (``doc_tokens``) is unique; the optional base prompt (``base_tokens`` > 0) is shared by all.
    Arrivals fill the slots ``s, 2s, ..., n s`` (all 0 when ``s`` = 0, a burst) in a uniformly
    random user order; ``shuffle=False`` cycles users 0, 1, ..., n_users - 1, 0, 1, ... instead
    (the paper's toy example U1D1, U2D2, U1D3, U2D4). ``arrival_s`` (n sorted times, e.g. Poisson)
    replaces the regular slots, as in the paper's SGLang experiment.

    Segments: base ``first_segment_id``, then one id per user, then one id per doc, so distinct
    users and distinct docs never overlap; ``meta`` records the id ranges.
    """
    n_users = int(_num(n_users, "users", ge=1, integer=True))
    k = int(_num(k, "k", ge=1, integer=True))
    u = int(_num(user_tokens, "user_tokens", ge=1, integer=True))
    d = int(_num(doc_tokens, "doc_tokens", ge=1, integer=True))
    b = int(_num(base_tokens, "base_tokens", ge=0, integer=True))
    n = n_users * k
    if arrival_s is None:
        arrival_s = _num(s, "s", ge=0) * np.arange(1, n + 1)
    elif len(arrival_s) != n:
        raise WorkloadError(f"arrival: expected users * k = {n} arrivals, got {len(arrival_s)}")
    user = np.tile(np.arange(n_users), k)
    if shuffle:
        user = np.random.default_rng(rng).permutation(user)
    user_base = first_segment_id + (1 if b else 0)
    doc_base = user_base + n_users
    head: Segments = ((first_segment_id, b),) if b else ()
    prefix: list[Segments | None] = [head + ((user_base + int(ui), u), (doc_base + i, d))
                                     for i, ui in enumerate(user)]
    meta = {"base_segment": first_segment_id if b else None, "user_segments": (user_base, doc_base),
            "doc_segments": (doc_base, doc_base + n)}
    out = np.broadcast_to(np.asarray(output_tokens), (n,)).copy()
    return Workload(arrival_s, np.full(n, b + u + d), out, prefix=prefix, meta=meta)


# ---------------------------------------------------------------------------------------------
# output-length predictors


RANKER_TAU = 0.56
"""Kendall's tau between a learned output-length ranker's scores and the true lengths on chat
traffic: an OPT-125M ranker trained with a listwise loss (Fu et al. 2024, "Efficient LLM
Scheduling by Learning to Rank", NeurIPS, section 4), measured at 0.559 in-distribution by a
public reproduction of that predictor (model card of ``Luna2099/vllm-ltr-predictors`` on
Hugging Face, 2025), against 0.194 for a 10-bucket classifier of the same size."""

RANKER_SIGMA = 0.7
"""The ``lognormal`` predictor's ``sigma`` whose Kendall's tau with the true lengths is
:data:`RANKER_TAU` on the Azure conversation trace's output lengths (Patel et al. 2024): 0.566 on
the synthetic stand-in, 0.559 on the real trace (one draw each, all 19,366 rows); see
:func:`sigma_for_tau`."""


def kendall_tau(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall's tau-b of two samples (ties counted as Fu et al. 2024 count them)."""
    from scipy.stats import kendalltau

    return float(kendalltau(np.asarray(a), np.asarray(b)).statistic)


def sigma_for_tau(tau: float, lengths: np.ndarray, rng: RngLike = 0, *, lo: float = 0.01,
                  hi: float = 5.0, iterations: int = 30) -> float:
    """The ``lognormal`` predictor's ``sigma`` whose Kendall's tau with ``lengths`` is ``tau``
    (bisection on one seeded draw; tau falls as sigma grows).

    This is how :data:`RANKER_SIGMA` was set: ``sigma_for_tau(RANKER_TAU,
    synthetic_azure_conv(0).output_tokens)`` is 0.70 to two decimals. For log-normal lengths
    with log-spread ``s`` it is the closed form ``s * sqrt(1 / sin(pi tau / 2)**2 - 1)``.
    """
    tau = _num(tau, "tau", gt=0, le=1)
    lengths = np.asarray(lengths, dtype=np.int64)
    z = np.random.default_rng(rng).standard_normal(len(lengths))
    for _ in range(iterations):
        mid = (lo + hi) / 2
        pred = np.maximum(np.rint(lengths * np.exp(mid * z)), 1)
        lo, hi = (mid, hi) if kendall_tau(lengths, pred) > tau else (lo, mid)
    return (lo + hi) / 2


def predict(workload: Workload, kind: str = "oracle", rng: RngLike = None, *, x: float | None = None,
            edges: Sequence[int] | None = None, point: str = "upper", sigma: float | None = None) -> np.ndarray:
    """A predicted output length per request (assign it to ``predicted_output``).

    * ``oracle``: the true length (the clairvoyant information model).
    * ``lognormal``: ``round(true * exp(sigma * Z))``, Z standard normal, at least 1: a
      multiplicative, median-unbiased error, the model of a learned length predictor whose
      ranking is right more often the further apart two lengths are. ``sigma`` =
      :data:`RANKER_SIGMA` (0.7) reproduces the Kendall's tau of a published learned ranker on
      chat traffic (:data:`RANKER_TAU`, 0.56, Fu et al. 2024); 0 is the oracle.
    * ``none``: no prediction (the blind information model): all zeros, which policies cannot
      read (the engine raises on ``view.predicted_output``).
    * ``noisy``: ``round(true * U(1 - x, 1 + x))``, at least 1 (``x`` in [0, 1]).
    * ``bucketed``: the bucket ``(edges[i-1], edges[i]]`` holding the true length, predicted as
      its upper edge (``point="upper"``, a safe over-estimate for memory reservation) or its
      midpoint (``point="mid"``, with ``edges[-1]`` taken as 0). Lengths above the last edge get
      the last edge (an under-estimate; choose a last edge >= the longest output to avoid it).
    """
    true = workload.output_tokens
    if kind == "oracle":
        return true.copy()
    if kind == "none":
        return np.zeros(len(true), dtype=np.int64)
    if kind == "lognormal":
        sigma = _num(sigma, "sigma", ge=0, le=10)
        z = np.random.default_rng(rng).standard_normal(len(true))
        return np.maximum(np.rint(true * np.exp(sigma * z)), 1).astype(np.int64)
    if kind == "noisy":
        x = _num(x, "x", ge=0, le=1)
        factor = np.random.default_rng(rng).uniform(1.0 - x, 1.0 + x, len(true))
        return np.maximum(np.rint(true * factor), 1).astype(np.int64)
    if kind == "bucketed":
        if edges is None or len(edges) == 0:
            raise WorkloadError("edges: expected a non-empty increasing list of token counts")
        e = np.array([_num(v, f"edges[{i}]", ge=1, integer=True) for i, v in enumerate(edges)])
        if np.any(np.diff(e) <= 0):
            raise WorkloadError("edges: must be strictly increasing")
        i = np.minimum(np.searchsorted(e, true, side="left"), len(e) - 1)
        if point == "upper":
            return e[i].astype(np.int64)
        if point == "mid":
            lower = np.concatenate(([0], e))[i]
            return np.maximum(np.rint((lower + e[i]) / 2), 1).astype(np.int64)
        raise WorkloadError(f"point: unknown value {point!r} (allowed: upper, mid)")
    raise WorkloadError(f"kind: unknown value {kind!r} (allowed: {', '.join(_PREDICTORS)})")


# ---------------------------------------------------------------------------------------------
# declarative entry point

_TOP_KEYS = ("n_requests", "horizon_s", "arrival", "prompt", "output", "predictor", "clients",
             "classes", "prefix", "types", "trace")
_ARRIVALS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {  # type: (required, optional)
    "poisson": (("rate",), ()),
    "gamma": (("rate", "cv"), ()),
    "deterministic": (("rate",), ()),
    "all_at_zero": ((), ()),
    "on_off": (("rate_on", "on_s", "off_s"), ()),
    "piecewise": (("rates", "boundaries_s"), ()),
    "diurnal": (("mean_rate", "amplitude", "period_s"), ("peak_s",)),
    "round_counts": (("dist",), ("B", "p", "pmf")),
}
_RATE_ARRIVALS: dict[str, Callable[..., np.ndarray]] = {
    "poisson": poisson, "gamma": gamma, "on_off": on_off, "piecewise": piecewise, "diurnal": diurnal,
}
_ROUND_DISTS = {"binomial": ("B", "p"), "uniform": ("B",), "pmf": ("pmf",)}
_LENGTHS = {
    "fixed": (("value",), ()), "uniform": (("lo", "hi"), ()), "lognormal": (("mean", "median"), ()),
    "zipf": (("a",), ()), "empirical": ((), ("values", "path", "column")),
}
_PREDICTORS = {"oracle": ((), ()), "lognormal": (("sigma",), ()), "noisy": (("x",), ()),
               "bucketed": (("edges",), ("point",)), "none": ((), ())}
_PREFIXES = {
    "system": (("groups", "tokens"), ("weights",)),
    "users": (("users", "k", "user_tokens", "doc_tokens"), ("base_tokens", "s", "shuffle")),
}


@contextmanager
def _field(path: str) -> Iterator[None]:
    """Prefix error messages raised inside with the spec path (``arrival`` + ``rate: ...``)."""
    try:
        yield
    except WorkloadError as e:
        raise WorkloadError(f"{path}.{e}") from None


def _mapping(value: Any, path: str, allowed: Sequence[str]) -> dict:
    """Check that ``value`` is a mapping with only ``allowed`` keys (``path`` "" is the top level)."""
    if not isinstance(value, dict):
        raise WorkloadError(f"{path or 'workload'}: expected a mapping, got {value!r}")
    unknown = [key for key in value if key not in allowed]
    if unknown:
        where = f"{path}.{unknown[0]}" if path else str(unknown[0])
        raise WorkloadError(f"{where}: unknown key (allowed: {', '.join(allowed)})")
    return value


def _typed(value: Any, path: str, table: dict[str, tuple[tuple[str, ...], tuple[str, ...]]],
           extra: Sequence[str] = ()) -> tuple[str, dict]:
    """Check a ``{"type": ..., params}`` mapping against ``table``; return (type, params)."""
    if not isinstance(value, dict):
        raise WorkloadError(f"{path}: expected a mapping with a 'type', got {value!r}")
    kind = value.get("type")
    if not isinstance(kind, str) or kind not in table:
        raise WorkloadError(f"{path}.type: unknown value {kind!r} (allowed: {', '.join(table)})")
    required, optional = table[kind]
    _mapping(value, path, ("type", *required, *optional, *extra))
    for key in required:
        if key not in value:
            raise WorkloadError(f"{path}.{key}: required for type {kind!r}")
    return kind, {key: v for key, v in value.items() if key != "type"}


class _Builder:
    """One build: derives an independent random stream per spec path and hands out globally
    unique segment ids."""

    def __init__(self, seed: int) -> None:
        self.seed = int(_num(seed, "seed", ge=0, integer=True))
        self.next_segment = 0

    def rng(self, path: str) -> np.random.Generator:
        return np.random.default_rng([self.seed, zlib.crc32(path.encode())])

    def segments(self, count: int) -> int:
        first, self.next_segment = self.next_segment, self.next_segment + count
        return first

    def arrivals(self, spec: Any, path: str, n: int | None, horizon_s: float | None) -> np.ndarray:
        kind, p = _typed(spec, path, _ARRIVALS)
        if n is None and horizon_s is None:
            raise WorkloadError("n_requests: give n_requests and/or horizon_s")
        rng = self.rng(path)
        with _field(path):
            if kind == "all_at_zero":
                if n is None:
                    raise WorkloadError("type: all_at_zero needs n_requests")
                return all_at_zero(n)
            if kind == "deterministic":
                return deterministic(p["rate"], n=n, horizon_s=horizon_s)
            if kind == "round_counts":
                return round_counts(self._pmf(p), n=n, horizon_s=horizon_s, rng=rng)
            fn = _RATE_ARRIVALS[kind]
            return fn(**p, n=n, horizon_s=horizon_s, rng=rng)

    @staticmethod
    def _pmf(p: dict) -> np.ndarray:
        dist = p["dist"]
        if dist not in _ROUND_DISTS:
            raise WorkloadError(f"dist: unknown value {dist!r} (allowed: {', '.join(_ROUND_DISTS)})")
        for key in ("B", "p", "pmf"):
            if (key in p) != (key in _ROUND_DISTS[dist]):
                raise WorkloadError(f"{key}: {'required' if key not in p else 'not allowed'} for dist {dist!r}")
        if dist == "pmf":
            return p["pmf"]
        big_b = int(_num(p["B"], "B", ge=0, le=MAX_ROUND_B, integer=True))
        if dist == "uniform":
            return np.full(big_b + 1, 1.0 / (big_b + 1))
        q = _num(p["p"], "p", ge=0, le=1)
        if big_b <= 1000:  # exact (math.comb fits a float)
            return np.array([math.comb(big_b, c) * q**c * (1 - q) ** (big_b - c) for c in range(big_b + 1)])
        from scipy.stats import binom

        return binom.pmf(np.arange(big_b + 1), big_b, q)

    def lengths(self, spec: Any, path: str, size: int) -> np.ndarray:
        if spec is None:
            raise WorkloadError(f"{path}: required (an int or a length mapping)")
        if not isinstance(spec, dict):
            return np.full(size, int(_num(spec, path, ge=1, le=MAX_TOKENS, integer=True)), dtype=np.int64)
        kind, p = _typed(spec, path, _LENGTHS, extra=("max",))
        rng = self.rng(path)
        max_tokens = p.pop("max", None)
        with _field(path):
            if kind == "fixed":
                return _clip(fixed(p["value"], size), max_tokens)
            if kind == "uniform":
                return _clip(uniform(p["lo"], p["hi"], size, rng), max_tokens)
            if kind == "lognormal":
                return lognormal(p["mean"], p["median"], size, rng, max_tokens=max_tokens)
            if kind == "zipf":
                return zipf(p["a"], size, rng, max_tokens=max_tokens)
            return empirical(_empirical_values(p), size, rng, max_tokens=max_tokens)

    def stream(self, spec: dict, path: str, n: int | None, horizon_s: float | None) -> Workload:
        """Arrivals + lengths + types + prefix of one stream (the top level, a client, offline)."""
        prefix = spec.get("prefix")
        if prefix is not None:
            kind, pp = _typed(prefix, f"{path}prefix", _PREFIXES)
            if kind == "users":
                return self._users(spec, pp, path, n, horizon_s)
        types = spec.get("types")
        if types is not None:
            wl = self._types(spec, types, path, n, horizon_s)
        else:
            if "arrival" not in spec:
                raise WorkloadError(f"{path}arrival: required (a mapping with a 'type')")
            t = self.arrivals(spec["arrival"], f"{path}arrival", n, horizon_s)
            wl = Workload(t, self.lengths(spec.get("prompt"), f"{path}prompt", len(t)),
                          self.lengths(spec.get("output"), f"{path}output", len(t)))
        if prefix is not None:
            with _field(f"{path}prefix"):
                first = self.segments(int(_num(pp["groups"], "groups", ge=1, integer=True)))
                wl = shared_system_prompts(wl, pp["groups"], pp["tokens"], self.rng(f"{path}prefix"),
                                           weights=pp.get("weights"), first_segment_id=first)
        return wl

    def _types(self, spec: dict, types: Any, path: str, n: int | None, horizon_s: float | None) -> Workload:
        tp = f"{path}types"
        if not isinstance(types, list) or not types:
            raise WorkloadError(f"{tp}: expected a non-empty list of {{rate, prompt, output}} mappings")
        for j, t in enumerate(types):
            _mapping(t, f"{tp}[{j}]", ("rate", "prompt", "output"))
            for key in ("rate", "prompt", "output"):
                if key not in t:
                    raise WorkloadError(f"{tp}[{j}].{key}: required")
        for key in ("prompt", "output"):
            if key in spec:
                raise WorkloadError(f"{path}{key}: not allowed with types (each type sets its own)")
        rates = [t["rate"] for t in types]
        if "arrival" in spec:
            arr = self.arrivals(spec["arrival"], f"{path}arrival", n, horizon_s)
        else:
            total = sum(_num(r, f"{tp}[{j}].rate", gt=0) for j, r in enumerate(rates))
            arr = poisson(total, n=n, horizon_s=horizon_s, rng=self.rng(f"{path}arrival"))
        type_id = _mix(rates, len(arr), self.rng(tp)) if len(arr) else np.zeros(0, dtype=np.int64)
        prompt, output = np.ones(len(arr), np.int64), np.ones(len(arr), np.int64)
        for j, t in enumerate(types):
            mask = type_id == j
            prompt[mask] = self.lengths(t["prompt"], f"{tp}[{j}].prompt", int(mask.sum()))
            output[mask] = self.lengths(t["output"], f"{tp}[{j}].output", int(mask.sum()))
        return Workload(arr, prompt, output, type_id=type_id)

    def _users(self, spec: dict, pp: dict, path: str, n: int | None, horizon_s: float | None) -> Workload:
        pre = f"{path}prefix"
        with _field(pre):
            users = int(_num(pp["users"], "users", ge=1, integer=True))
            total = users * int(_num(pp["k"], "k", ge=1, integer=True))
        if n is not None and n != total:
            raise WorkloadError(f"{path}n_requests: must equal prefix.users * prefix.k = {total} (or be omitted)")
        for key in ("types", "prompt"):
            if key in spec:
                raise WorkloadError(f"{path}{key}: not allowed with prefix type 'users' (it sets the prompts)")
        arr = None
        if "arrival" in spec:
            arr = self.arrivals(spec["arrival"], f"{path}arrival", total, None)
            if len(arr) < total:
                raise WorkloadError(f"{path}arrival: produced {len(arr)} arrivals, need {total}")
        out = 1 if spec.get("output") is None else self.lengths(spec["output"], f"{path}output", total)
        with _field(pre):
            base = int(_num(pp.get("base_tokens", 0), "base_tokens", ge=0, integer=True))
            first = self.segments((1 if base else 0) + users + total)
            wl = regular_shuffled_queue(users, pp["k"], pp["user_tokens"], pp["doc_tokens"], pp.get("s", 0.0),
                                        base_tokens=base, output_tokens=out, arrival_s=arr,
                                        shuffle=bool(pp.get("shuffle", True)), rng=self.rng(pre),
                                        first_segment_id=first)
        return _cut_workload(wl, None, horizon_s)


def _empirical_values(p: dict) -> np.ndarray:
    if ("values" in p) == ("path" in p):
        raise WorkloadError("values: give either values or path + column")
    if "values" in p:
        return np.asarray(p["values"])
    if "column" not in p:
        raise WorkloadError("column: required with path")
    from llmsched_gym.core import traces  # traces builds on this module

    return traces.read_column(p["path"], p["column"])


_EXPLICIT_INTS = ("prompt_tokens", "output_tokens", "predicted_output", "client", "task_class", "type_id")
_EXPLICIT_FLOATS = ("arrival_s", "ttft_slo_s", "tpot_slo_s", "client_weight")


def explicit_workload(spec: Any) -> Workload:
    """The workload a scenario lists request by request (``workload.explicit``): ``arrival_s``,
    ``prompt_tokens``, ``output_tokens`` (required lists, one entry per request), optionally
    ``predicted_output``, ``client``, ``task_class``, ``type_id`` (integers), ``ttft_slo_s``,
    ``tpot_slo_s``, ``client_weight`` (numbers) and ``prefix`` (per request: null or a list of
    ``[segment_id, tokens]`` pairs). Integers must be integers (``5.9`` is an error, not 5), token
    counts at most :data:`MAX_TOKENS`; messages name ``explicit.FIELD[i]``."""
    allowed = (*_EXPLICIT_FLOATS[:1], *_EXPLICIT_INTS, *_EXPLICIT_FLOATS[1:], "prefix")
    ex = _mapping(spec, "explicit", allowed)
    kw: dict[str, Any] = {}
    for key in ("arrival_s", "prompt_tokens", "output_tokens"):
        if key not in ex:
            raise WorkloadError(f"explicit.{key}: required (a list, one entry per request)")
    for key, value in ex.items():
        path = f"explicit.{key}"
        if not isinstance(value, list | tuple):
            raise WorkloadError(f"{path}: expected a list (one entry per request), got {str(value)[:40]!r}")
        if len(value) > MAX_REQUESTS:
            raise WorkloadError(f"{path}: {len(value):,} entries; at most {MAX_REQUESTS:,}")
        if key == "prefix":
            kw[key] = [_explicit_prefix(p, f"{path}[{i}]") for i, p in enumerate(value)]
            continue
        integer = key in _EXPLICIT_INTS
        hi = MAX_TOKENS if integer else None
        lo = 1 if key in ("prompt_tokens", "output_tokens", "predicted_output") else 0
        kw[key] = np.array([_num(x, f"{path}[{i}]", ge=lo, le=hi, integer=integer) if key != "ttft_slo_s"
                            and key != "tpot_slo_s" else _slo(x, f"{path}[{i}]") for i, x in enumerate(value)],
                           dtype=np.int64 if integer else np.float64)
    return Workload(**kw)


def _explicit_prefix(p: Any, path: str) -> Segments | None:
    if p is None or p == []:
        return None
    if not isinstance(p, list | tuple) or not all(isinstance(seg, list | tuple) and len(seg) == 2 for seg in p):
        raise WorkloadError(f"{path}: expected null or a list of [segment_id, tokens] pairs, got {str(p)[:40]!r}")
    return tuple((int(_num(a, f"{path}.segment_id", ge=0, integer=True)),
                  int(_num(k, f"{path}.tokens", ge=1, le=MAX_TOKENS, integer=True))) for a, k in p)


def _cut_workload(wl: Workload, n: int | None, horizon_s: float | None) -> Workload:
    keep = len(wl) if horizon_s is None else int(np.searchsorted(wl.arrival_s, horizon_s, side="left"))
    keep = keep if n is None else min(keep, n)
    if keep == len(wl):
        return wl
    # Workload.take would turn the prefix tuples into a nested object array; slice the list instead.
    rows = {name: getattr(wl, name)[:keep] for name in _ROW_ARRAYS}
    return wl.with_(**rows, prefix=None if wl.prefix is None else wl.prefix[:keep])


def build_workload(spec: dict, seed: int) -> Workload:
    """Build a :class:`Workload` from a declarative spec (keys: see the module docstring).

    :param spec: the mapping (e.g. a scenario's ``workload:`` section from YAML).
    :param seed: non-negative int; the same ``(spec, seed)`` always gives identical arrays.
    :raises WorkloadError: on an unknown key or a bad value, naming the field and what is allowed.
    """
    _mapping(spec, "", _TOP_KEYS)
    b = _Builder(seed)
    n = spec.get("n_requests")
    horizon_s = spec.get("horizon_s")
    n = None if n is None else int(_num(n, "n_requests", ge=0, integer=True))
    horizon_s = None if horizon_s is None else _num(horizon_s, "horizon_s", gt=0)

    source = None
    if "trace" in spec:
        wl, source = _from_trace(b, spec, n, horizon_s)
    elif "clients" in spec:
        wl = _clients(b, spec, n, horizon_s)
    else:
        wl = b.stream(spec, "", n, horizon_s)

    if "classes" in spec:
        c = _mapping(spec["classes"], "classes", ("offline", "ttft_slo_s", "tpot_slo_s"))
        offline = _mapping(c.get("offline", {"n_requests": 0, "prompt": 1, "output": 1}), "classes.offline",
                           ("n_requests", "prompt", "output", "prefix"))
        if "n_requests" not in offline:
            raise WorkloadError("classes.offline.n_requests: required")
        m = int(_num(offline["n_requests"], "classes.offline.n_requests", ge=0, integer=True))
        off = b.stream({**offline, "arrival": {"type": "all_at_zero"}}, "classes.offline.", m, None)
        with _field("classes"):
            wl = with_task_classes(wl, off, ttft_slo_s=c.get("ttft_slo_s", 1.0),
                                   tpot_slo_s=c.get("tpot_slo_s", 0.05))

    kind = "oracle"
    if "predictor" in spec:
        kind, p = _typed(spec["predictor"], "predictor", _PREDICTORS)
        with _field("predictor"):
            wl = wl.with_(predicted_output=predict(wl, kind, b.rng("predictor"), **p))
    wl.meta = {**wl.meta, "seed": b.seed, "information": information_of_predictor(kind)}
    if source is not None:
        wl.meta["workload_source"] = source
    return wl


def _clients(b: _Builder, spec: dict, n: int | None, horizon_s: float | None) -> Workload:
    for key in ("arrival", "types"):
        if key in spec:
            raise WorkloadError(f"{key}: not allowed with clients (give each client its own rate or arrival)")
    clients = spec["clients"]
    if not isinstance(clients, list) or not clients:
        raise WorkloadError("clients: expected a non-empty list of {rate or arrival, weight, prompt, output}")
    if n is None and horizon_s is None:
        raise WorkloadError("n_requests: give n_requests and/or horizon_s")
    parts, weights = [], []
    for i, c in enumerate(clients):
        path = f"clients[{i}]"
        _mapping(c, path, ("rate", "arrival", "weight", "prompt", "output", "prefix"))
        if ("rate" in c) == ("arrival" in c):
            raise WorkloadError(f"{path}: give exactly one of rate or arrival")
        sub = {"arrival": c.get("arrival") or {"type": "poisson", "rate": c["rate"]},
               "prompt": c.get("prompt", spec.get("prompt")), "output": c.get("output", spec.get("output")),
               "prefix": c.get("prefix", spec.get("prefix"))}
        parts.append(b.stream({k: v for k, v in sub.items() if v is not None}, f"{path}.", n, horizon_s))
        weights.append(_num(c.get("weight", 1.0), f"{path}.weight", gt=0))
    wl = merge_clients(parts, weights)
    return _cut_workload(wl, n, horizon_s)


def _from_trace(b: _Builder, spec: dict, n: int | None, horizon_s: float | None) -> tuple[Workload, dict]:
    """The trace's workload and its ``workload_source`` (real file and its sha256, or synthetic)."""
    from llmsched_gym import data
    from llmsched_gym.core import traces  # traces builds on this module

    for key in ("clients", "types", "prompt", "output", "prefix"):
        if key in spec:
            raise WorkloadError(f"{key}: not allowed with trace (the trace supplies it)")
    t = _mapping(spec["trace"], "trace", ("format", "path", "on_zero", "time_scale", "window", "part"))
    window = t.get("window", "head")
    if window not in ("head", "random"):
        raise WorkloadError(f"trace.window: unknown value {window!r} (allowed: head, random)")
    part = _trace_part(t.get("part", (0.0, 1.0)))
    fmt = t.get("format")
    if fmt not in traces.FORMATS:
        raise WorkloadError(f"trace.format: unknown value {fmt!r} (allowed: {', '.join(traces.FORMATS)})")
    on_zero = t.get("on_zero", "error")
    if on_zero not in ("error", "clip"):
        raise WorkloadError(f"trace.on_zero: unknown value {on_zero!r} (allowed: error, clip)")
    path = t.get("path") or traces.DEFAULT_FILES.get(fmt)
    if path is None:
        raise WorkloadError(f"trace.path: required for format {fmt!r}")
    try:
        found = data.resolve_data(path)
    except data.DataError as e:
        raise WorkloadError(f"trace.path: {e}") from None
    ds = data.known(str(path))
    if found is None:  # a known trace (resolve_data raised for anything else) that is nowhere local
        if fmt not in traces.SYNTHETIC or "path" in t:
            raise WorkloadError(f"trace.path: {path!r} not found; `llmsched data download {ds.name}` fetches it")
        data.notify_fallback(ds.name)
        source = {"kind": "synthetic", "name": ds.name, "sha256": None}
    else:
        source = data.trace_source(found, ds)  # a known name is checked against its published sha256
    if found is None:
        wl = traces.SYNTHETIC[fmt](b.seed)
    elif fmt == "sharegpt":
        if "arrival" not in spec:
            raise WorkloadError("arrival: required with trace format 'sharegpt' (ShareGPT has no timestamps)")
        wl = traces.load_sharegpt(found, lambda k: b.arrivals(spec["arrival"], "arrival", k, None),
                                  on_zero=on_zero)
    else:
        wl = traces.load_trace(fmt, found, on_zero=on_zero)
    if "arrival" in spec and fmt != "sharegpt":
        arr = b.arrivals(spec["arrival"], "arrival", len(wl), None)
        if len(arr) < len(wl):
            raise WorkloadError(f"arrival: produced {len(arr)} arrivals for {len(wl)} trace rows")
        wl = wl.with_(arrival_s=arr)
    if "time_scale" in t:
        wl = wl.with_(arrival_s=wl.arrival_s * _num(t["time_scale"], "trace.time_scale", gt=0))
    if part != (0.0, 1.0):
        lo, hi = (int(round(f * len(wl))) for f in part)
        rows = {name: getattr(wl, name)[lo:hi] for name in _ROW_ARRAYS}
        rows["arrival_s"] = rows["arrival_s"] - rows["arrival_s"][0]
        wl = wl.with_(**rows, prefix=None if wl.prefix is None else wl.prefix[lo:hi])
    if window == "random":
        wl = _random_window(wl, n, horizon_s, b.rng("trace.window"))
    return _cut_workload(wl, n, horizon_s), source


def _trace_part(value: Any) -> tuple[float, float]:
    """``trace.part``: ``[start, end]`` fractions of the trace's rows (held-out windows: train on
    one part of a trace, test on another)."""
    try:
        lo, hi = (float(x) for x in value)
    except (TypeError, ValueError):
        raise WorkloadError(f"trace.part: expected [start, end] fractions of the rows, got {value!r}") from None
    if not 0.0 <= lo < hi <= 1.0:
        raise WorkloadError(f"trace.part: need 0 <= start < end <= 1, got [{lo}, {hi}]")
    return lo, hi


def _random_window(wl: Workload, n: int | None, horizon_s: float | None, rng: np.random.Generator) -> Workload:
    """The trace from a seeded start row on (arrivals shifted to start at 0), such that ``n`` rows
    (or ``horizon_s`` seconds) remain; the whole trace when it is not longer than that."""
    t = wl.arrival_s
    if n is not None:
        last_start = len(wl) - n
    elif horizon_s is not None:
        last_start = int(np.searchsorted(t, t[-1] - horizon_s, side="right")) - 1
    else:
        return wl
    if last_start <= 0:
        return wl
    start = int(rng.integers(0, last_start + 1))
    rows = {name: getattr(wl, name)[start:] for name in _ROW_ARRAYS}
    rows["arrival_s"] = rows["arrival_s"] - rows["arrival_s"][0]
    return wl.with_(**rows, prefix=None if wl.prefix is None else wl.prefix[start:])
