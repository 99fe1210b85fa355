"""Observation layout of ``LLMSched-v0``: feature tables (name, bounds, meaning) and the spaces.

Every feature is a float32 inside finite documented bounds; values are clipped into them. Token
counts use ``log1p(x) / log1p(M)`` (``M`` = KV capacity in tokens, so 1 means "as large as the
whole cache"), durations ``log1p(t / u) / log1p(TIME_RANGE)`` with ``u`` the scenario's
time unit (the batch time of a one-token decode, or of a one-token prefill when decodes are free;
1 in round mode). The tables below are the source of the env's docstring table.
"""

from __future__ import annotations

import math

import numpy as np
from gymnasium import spaces

TIME_RANGE = 1e6
"""Durations saturate at a million time units."""

REMAINING_BIN_EDGES = (2, 8, 32, 128, 512, 2048, 8192)
"""Histogram bins of predicted remaining output tokens: [1,2), [2,8), ..., [8192, inf)."""

# (name, low, high, meaning)
QUEUE_FEATURES: tuple[tuple[str, float, float, str], ...] = (
    ("present", 0.0, 1.0, "1 if a request occupies the slot (all other features are 0 when not)"),
    ("prompt", 0.0, 1.0, "tokens to prefill (prompt, + generated after a recompute preemption), log-scaled"),
    ("predicted_output", 0.0, 1.0, "predicted output tokens still to generate, log-scaled"),
    ("uncertainty", 0.0, 1.0, "relative spread of the predictor (0 oracle, x for noisy(x), bucket width)"),
    ("age", 0.0, 1.0, "time since arrival, log-scaled"),
    ("prefix_hit", 0.0, 1.0, "fraction of the prompt the prefix cache would serve now"),
    ("service_deficit", 0.0, 1.0, "(max client service - this client's) / (max + 1), weighted service"),
    ("task_class", 0.0, 1.0, "0 online, 1 offline"),
    ("slo_slack", -1.0, 1.0, "(TTFT deadline - now) / TTFT SLO, clipped; 1 without a TTFT SLO"),
    ("fits_now", 0.0, 1.0, "1 if it passes the 'current' admission rule given the batch so far"),
    ("fits_future", 0.0, 1.0, "1 if it passes the 'future' (MC-SF Eq. (1)) rule given the batch so far "
     "(chosen requests counted at their peak unless admission='future')"),
)

RUNNING_FEATURES: tuple[tuple[str, float, float, str], ...] = (
    ("count", 0.0, 1.0, "running requests + requests chosen for this batch, log1p(n) / log1p(M)"),
    ("kv_used", 0.0, 2.0, "(KV used + KV reserved by the batch being formed) / capacity"),
    *(
        (f"remaining_hist_{i}", 0.0, 1.0,
         f"fraction of them with predicted remaining output in [{lo}, {hi})")
        for i, (lo, hi) in enumerate(zip((1, *REMAINING_BIN_EDGES), (*REMAINING_BIN_EDGES, "inf"), strict=True))
    ),
    ("future_peak", 0.0, 2.0, "predicted future KV peak of the running requests alone (Eq. (1)) / capacity"),
    ("selected", 0.0, 1.0, "requests chosen for this batch so far (select mode), log1p(n) / log1p(M)"),
)

GLOBAL_FEATURES: tuple[tuple[str, float, float, str], ...] = (
    ("kv_used", 0.0, 2.0, "KV used / capacity (above 1 only after an overflow a clear handler left)"),
    ("queue_len", 0.0, 1.0, "waiting requests not chosen yet, log1p(n) / log1p(N requests)"),
    ("arrival_rate", 0.0, 1.0, "arrivals in the last RATE_WINDOW time units, log1p(n) / log1p(N requests)"),
    ("since_batch", 0.0, 1.0, "time since the last batch that admitted a request, log-scaled"),
    ("last_iteration", 0.0, 1.0, "duration of the last iteration, log-scaled"),
    ("arrived", 0.0, 1.0, "fraction of the episode's requests that have arrived"),
)

RATE_WINDOW = 100.0
"""Window of the arrival-rate feature, in time units."""


def _box(table, n: int = 1) -> spaces.Box:
    low = np.tile(np.array([f[1] for f in table], dtype=np.float32), n)
    high = np.tile(np.array([f[2] for f in table], dtype=np.float32), n)
    return spaces.Box(low, high, dtype=np.float32)


def observation_space(k: int, flat: bool) -> spaces.Space:
    """``Dict(queue=Box(K*F), running=Box(R), globals=Box(G))``, or their concatenation when ``flat``."""
    parts = {"queue": _box(QUEUE_FEATURES, k), "running": _box(RUNNING_FEATURES), "globals": _box(GLOBAL_FEATURES)}
    if flat:
        low = np.concatenate([p.low for p in parts.values()])
        high = np.concatenate([p.high for p in parts.values()])
        return spaces.Box(low, high, dtype=np.float32)
    return spaces.Dict(parts)


def token_scale(capacity_tokens: int) -> np.ndarray:
    """Lookup table ``log1p(x) / log1p(M)`` for ``x = 0..M`` (float32)."""
    return (np.log1p(np.arange(capacity_tokens + 1, dtype=np.float64)) / math.log1p(capacity_tokens)).astype(np.float32)


def predictor_spread(spec: dict | None, predicted: np.ndarray) -> np.ndarray:
    """The ``uncertainty`` feature of every request, from the workload's ``predictor`` spec."""
    n = len(predicted)
    if not spec:
        return np.zeros(n, np.float32)
    kind = spec.get("type", "oracle") if isinstance(spec, dict) else str(spec)
    if kind == "noisy":
        return np.full(n, min(float(spec.get("x", 0.0)), 1.0), np.float32)
    if kind == "bucketed":
        edges = np.asarray(spec.get("edges", ()), dtype=np.float64)
        lower = np.concatenate(([0.0], edges))
        i = np.minimum(np.searchsorted(edges, predicted, side="left"), len(edges) - 1)
        width = edges[i] - lower[i]
        return np.clip(width / np.maximum(edges[i], 1.0), 0.0, 1.0).astype(np.float32)
    return np.zeros(n, np.float32)
