"""Batch-time models: how long one engine iteration takes.

Every model is a pure function of the batch's shape (noise is applied by the engine, indexed by
iteration number, so fast-forward and step-by-step runs draw the same noise):

* ``prefill_tokens``: new prompt tokens computed this iteration (sum of chunks);
* ``prefill_ctx_tokens``: sum over the prefill requests of their context after the chunk
  (cached prefix + earlier chunks + this chunk), for the attention cost;
* ``n_prefill``: number of requests with a prefill chunk in the batch;
* ``n_decode``: number of decode tokens (one per decoding request);
* ``decode_ctx_tokens``: sum over decoding requests of the tokens they attend to (their KV
  before this iteration).

``decode_times`` is the vectorised decode-only case used by fast-forward; it must equal
``batch_time(0, 0, 0, n_decode, c)`` element by element, bit for bit.
"""

from __future__ import annotations

import numpy as np


class LatencyModel:
    name = "base"

    def batch_time(
        self, prefill_tokens: int, prefill_ctx_tokens: int, n_prefill: int, n_decode: int, decode_ctx_tokens: int
    ) -> float:
        raise NotImplementedError

    def decode_times(self, n_decode: int, decode_ctx_tokens: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class UnitLatency(LatencyModel):
    """Every iteration takes one unit (the theory papers' rounds)."""

    name = "unit"

    def batch_time(self, prefill_tokens, prefill_ctx_tokens, n_prefill, n_decode, decode_ctx_tokens) -> float:
        return 1.0

    def decode_times(self, n_decode: int, decode_ctx_tokens: np.ndarray) -> np.ndarray:
        return np.ones(len(decode_ctx_tokens))


def make_latency(spec: str | dict | LatencyModel) -> LatencyModel:
    if isinstance(spec, LatencyModel):
        return spec
    if spec == "unit":
        return UnitLatency()
    raise ValueError(f"latency: unknown model {spec!r}; allowed: unit")
