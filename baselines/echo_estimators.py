"""Echo's estimation toolkit (Wang et al. 2025, section 5): the batch-time model and the
online KV-memory predictor that the Echo family of policies (``baselines/echo.py``) consults.

* :class:`BatchTimeEstimator`: Eq. 6 ``T_prefill = max(alpha l^2 + beta l, c)``, Eq. 7
  ``T_decode = gamma max(L) + delta mean(L)`` and Eq. 8 ``T = lambda max(Tp, Td) + (1 - lambda)
  min(Tp, Td)``, fitted by least squares to "micro-benchmarks" of the engine's ground-truth latency
  model (section 5.2; the paper gives no coefficients). Eq. 7 has no intercept and no batch-size
  term, exactly as in the paper, so the estimate carries the paper's model error.
  Several prefills in one batch: the sum of their Eq. 6 times (our reading; the paper is silent).
* :class:`ExactEstimator`: the engine's own latency model (an oracle estimator, for ablations).
* :class:`OnlineKVPredictor`: ``mu + k sigma`` of the online KV demand over the past ``window_s``
  seconds, sampled every iteration and averaged per ``bucket_s`` second (section 5.3).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from llmsched_gym.core.latency import LatencyModel


@dataclass
class BatchTimeEstimator:
    """Echo's Eq. 6-8 with fitted coefficients (seconds; lengths in tokens)."""

    alpha: float
    beta: float
    c: float
    gamma: float
    delta: float
    lam: float

    def prefill(self, n: int) -> float:
        """Eq. 6 for ``n`` computed (uncached) prompt tokens (the paper's ``l``)."""
        t = self.alpha * n * n + self.beta * n
        return t if t > self.c else self.c

    def batch(self, prefills: list[tuple[int, int]], n_decode: int, sum_ctx: int, max_ctx: int) -> float:
        """Estimated iteration time of prefill chunks ``(computed tokens, context after)`` plus
        ``n_decode`` decodes whose contexts sum to ``sum_ctx`` (longest ``max_ctx``). Eq. 6 uses
        the computed tokens only, as the paper's model has no context term."""
        tp = sum(self.prefill(n) for n, _ in prefills)
        td = self.gamma * max_ctx + self.delta * sum_ctx / n_decode if n_decode else 0.0
        if not prefills:
            return td
        if not n_decode:
            return tp
        hi, lo = (tp, td) if tp > td else (td, tp)
        return self.lam * hi + (1.0 - self.lam) * lo

    @classmethod
    def fit(cls, latency: LatencyModel, max_tokens: int = 32_768, seed: int = 0) -> BatchTimeEstimator:
        """Fit Eq. 6 on prefill-only, Eq. 7 on decode-only and Eq. 8 on mixed batches of
        ``latency`` (the simulated micro-benchmarks of section 5.2; deterministic in ``seed``)."""
        from scipy.optimize import nnls  # imported here: scipy costs ~0.3 s and only the fit needs it

        rng = np.random.default_rng(seed)
        # Eq. 6: c = the flat (weight-bound) floor, alpha/beta on the rising part
        ls = np.unique(np.geomspace(1, max_tokens, 64).astype(np.int64))
        tp = np.array([latency.batch_time(int(n), int(n), 1, 0, 0) for n in ls])
        c = float(tp.min())
        rising = tp > 1.2 * c
        if rising.sum() >= 2:
            x = ls[rising].astype(float)
            (alpha, beta), _ = nnls(np.column_stack([x * x, x]), tp[rising])
        else:
            alpha, beta = 0.0, 0.0
        # Eq. 7: random decode batches, short and long contexts mixed
        feats, td = [], []
        for _ in range(400):
            n = int(rng.integers(1, 257))
            top = float(rng.choice([256, 1024, 4096, 16384]))
            ctx = rng.integers(1, int(min(top, max_tokens)) + 1, size=n)
            feats.append((float(ctx.max()), float(ctx.mean())))
            td.append(latency.batch_time(0, 0, 0, n, int(ctx.sum())))
        (gamma, delta), _ = nnls(np.array(feats), np.array(td))
        est = cls(float(alpha), float(beta), c, float(gamma), float(delta), 1.0)
        # Eq. 8: lambda by least squares on (T - min) = lambda (max - min), unconstrained
        num = den = 0.0
        for _ in range(200):
            p = int(rng.integers(16, max_tokens // 4 + 1))
            n = int(rng.integers(1, 129))
            ctx = rng.integers(1, 4097, size=n)
            t = latency.batch_time(p, p, 1, n, int(ctx.sum()))
            a, b = est.prefill(p), est.gamma * ctx.max() + est.delta * ctx.mean()
            hi, lo = max(a, b), min(a, b)
            num += (t - lo) * (hi - lo)
            den += (hi - lo) ** 2
        est.lam = float(num / den) if den > 0 else 1.0
        return est


class ExactEstimator:
    """The engine's ground-truth latency model used as the estimator (no model error)."""

    def __init__(self, latency: LatencyModel) -> None:
        self.latency = latency

    def batch(self, prefills: list[tuple[int, int]], n_decode: int, sum_ctx: int, max_ctx: int) -> float:
        p = sum(n for n, _ in prefills)
        ctx = sum(c for _, c in prefills)
        return self.latency.batch_time(p, ctx, len(prefills), n_decode, sum_ctx)


class OnlineKVPredictor:
    """Predicted online KV demand ``mu + k_sigma * sigma`` over the last ``window_s`` seconds.

    :param window_s: history window (the paper: one hour).
    :param k_sigma: the ``2`` of ``mu + 2 sigma`` (footnote 2: tunable).
    :param bucket_s: samples are averaged per bucket; mean and deviation are over buckets.
    """

    def __init__(self, window_s: float = 3600.0, k_sigma: float = 2.0, bucket_s: float = 1.0) -> None:
        self.window_s, self.k_sigma, self.bucket_s = float(window_s), float(k_sigma), float(bucket_s)
        self._buckets: deque[tuple[int, float]] = deque()
        self._cur = -1
        self._sum = 0.0
        self._n = 0
        self.prediction = 0.0

    def observe(self, now: float, demand_tokens: float) -> None:
        b = int(now // self.bucket_s) if math.isfinite(now) else self._cur
        if b != self._cur:
            if self._n:
                self._close()
            self._cur, self._sum, self._n = b, 0.0, 0
        self._sum += demand_tokens
        self._n += 1

    def _close(self) -> None:
        buckets = self._buckets
        buckets.append((self._cur, self._sum / self._n))
        horizon = self._cur - int(self.window_s // self.bucket_s)
        while len(buckets) > 1 and buckets[0][0] <= horizon:  # the newest bucket stays (window < bucket)
            buckets.popleft()
        v = np.fromiter((x for _, x in buckets), dtype=np.float64, count=len(buckets))
        self.prediction = float(v.mean() + self.k_sigma * v.std())
