"""llm-d's endpoint picker: filters, weighted scorers and a max-score picker (llm-d inference
scheduler, 2025, built on the Kubernetes Gateway API Inference Extension's ``EndpointPickerConfig``;
its prefix-heavy benchmark: llm-d blog, "KV-cache wins you can see", 2025).

Each replica that can hold the request (filter: its KV capacity holds prompt + output) gets

    score = w_prefix * prefix + w_queue * queue + w_kv * kv + w_active * active

with every scorer in [0, 1]:

* ``prefix`` (``prefix-cache-scorer``): the fraction of the request's first ``max_prefix_blocks``
  prompt blocks found on the replica. ``prefix="precise"`` reads the replica's actual prefix cache
  (llm-d's precise scorer, fed by vLLM's KV events: ``view.prefix_hit``); ``"approximate"`` an
  LRU index per replica built from the router's own routing history (``blockSizeTokens`` 16,
  ``lruCapacityPerServer`` 31,250 blocks, ``maxPrefixBlocksToMatch`` 256); ``"none"`` drops it.
* ``queue`` (``queue-scorer``): ``(max - q) / (max - min)`` of the queued requests, 1 when all are equal.
* ``kv`` (``kv-cache-utilization-scorer``): ``1 - kv_used / kv_capacity``.
* ``active`` (``active-request-scorer``): as ``queue`` on the requests in flight.

The highest score wins; ties are broken at random (the max-score picker shuffles first). Default
weights are the issue's precise profile, "precise-prefix-cache 2, queue-depth 1, kv-utilization 1"
(as BLIS uses them). Departure: llm-d scrapes queue and KV metrics from each pod; here they are
the cluster's load snapshot (``refresh_s``), plus the requests routed since.
"""

from __future__ import annotations

import numpy as np

from llmsched_gym.config import ConfigError
from llmsched_gym.core.cluster import ClusterView, Router

from .route_index import PrefixIndexes

PREFIX_MODES = ("precise", "approximate", "none")


def _spread(x: np.ndarray) -> np.ndarray:
    """``(max - x) / (max - min)``; all ones when every value is equal."""
    lo, hi = x[x.argmin()], x[x.argmax()]  # min() and max() by index: the same values, cheaper on small arrays
    if hi == lo:
        return np.ones(len(x))
    return (hi - x) / (hi - lo)


def _weighted(w: float, x: np.ndarray) -> np.ndarray:
    """``w * x`` (``x`` itself when ``w`` is 1: the same floats, one array operation fewer)."""
    return x if w == 1.0 else w * x


class LLMD(Router):
    """llm-d's scorer pipeline (see the module docstring)."""

    name = "llm-d"
    params = {"prefix": "precise", "w_prefix": 2.0, "w_queue": 1.0, "w_kv": 1.0, "w_active": 0.0,
              "block": 16, "max_prefix_blocks": 256, "lru_capacity": 31_250}

    def __init__(self, **params) -> None:
        super().__init__(**params)
        if self.prefix not in PREFIX_MODES:
            raise ConfigError(f"router.prefix: unknown value {self.prefix!r} (allowed: {', '.join(PREFIX_MODES)})")

    def reset(self, n_replicas: int, rng: np.random.Generator) -> None:
        super().reset(n_replicas, rng)
        self.index = PrefixIndexes(n_replicas, int(self.lru_capacity))
        self._kv_key: bytes | None = None
        self._kv = np.zeros(n_replicas)

    def scores(self, rid: int, view: ClusterView) -> np.ndarray:
        """Every replica's weighted score for ``rid`` (``-inf`` where the filter drops it)."""
        # the weighted terms summed in a fixed order (prefix, queue, kv, active), the first one
        # taken as the start (0 + x is x: the same floats as summing into zeros)
        terms = []
        if self.w_prefix and self.prefix != "none":
            terms.append(self.w_prefix * self._prefix_scores(rid, view))
        if self.w_queue:
            terms.append(_weighted(self.w_queue, _spread(view.waiting)))
        if self.w_kv:
            terms.append(self._kv_term(view))
        if self.w_active:
            terms.append(_weighted(self.w_active, _spread(view.outstanding)))
        s = None
        for t in terms:
            if s is None:
                s = t.copy() if t is self._kv else t
            else:
                s += t
        if s is None:
            s = np.zeros(self.n_replicas)
        if not view.can_take_all(rid):
            ok = view.can_take(rid)
            if ok.any():
                s[~ok] = -np.inf
        return s

    def _kv_term(self, view: ClusterView) -> np.ndarray:
        """``w_kv * (1 - kv_used / kv_capacity)``, computed again only when the view's KV signals
        change (once per routing point, not per request)."""
        key = view.kv_used.tobytes() + view.kv_capacity.tobytes()
        if key != self._kv_key:
            self._kv_key = key
            self._kv = _weighted(self.w_kv, 1.0 - view.kv_used / view.kv_capacity)
        return self._kv

    def _prefix_scores(self, rid: int, view: ClusterView) -> np.ndarray:
        prompt = int(view.prompt_tokens[rid])
        considered = min(-(-prompt // int(self.block)), int(self.max_prefix_blocks))
        if self.prefix == "precise":
            hit, top = view.prefix_hit(rid), considered * int(self.block)
            if hit[hit.argmax()] > top:
                hit = np.minimum(hit, top)
            return hit / top
        hashes = view.block_hashes(rid, int(self.block))[: int(self.max_prefix_blocks)]
        return self.index.match(hashes) / considered

    def route(self, rid: int, view: ClusterView) -> int:
        s = self.scores(rid, view)
        r = int(s.argmax())  # the first best; the others, if any, only on a tie (rare)
        m, rest = s[r], s[r + 1:]
        if m != m or (len(rest) and rest[rest.argmax()] == m):
            best = np.flatnonzero(s == m)
            r = int(best[0]) if len(best) == 1 else int(self.rng.choice(best))
        if self.prefix == "approximate":
            self.index.insert(r, view.block_hashes(rid, int(self.block))[: int(self.max_prefix_blocks)])
        return r
