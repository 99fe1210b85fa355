"""Analytic batch-time models: ``unit`` rounds, Ao et al. 2025's ``linear``, Li et al. 2025's
``piecewise`` and Sheng et al. 2024's ``affine`` prefill/decode fit."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmsched_gym.core.latency.base import LatencyModel, kv_args, register_latency


class UnitLatency(LatencyModel):
    """Every iteration takes one unit (the theory papers' rounds)."""

    name = "unit"

    def batch_time(
        self, prefill_tokens: int, prefill_ctx_tokens: int, n_prefill: int, n_decode: int, decode_ctx_tokens: int
    ) -> float:
        return 1.0

    def decode_times(self, n_decode: int, decode_ctx_tokens: np.ndarray) -> np.ndarray:
        return np.ones(len(decode_ctx_tokens))


class LinearKVLatency(LatencyModel):
    """Ao et al. 2025's Eq. 1 (section 2.3): ``tau = d0 + d1 * (KV tokens of the requests in the batch)``.

    A prefill request counts its context after the chunk, a decode request its KV including the
    token it is about to produce, so the KV in the batch is
    ``prefill_ctx_tokens + decode_ctx_tokens + n_decode``. Resident but paused requests do not
    count.

    The paper publishes no coefficients. The defaults are our estimate for Llama-2-7B
    fp16 on one A100: ``d1`` = 0.5 MiB of KV per token at about 2 TB/s,
    ``d0`` = streaming 13.5 GB of weights (7-12 ms). Calibrate with :func:`fit_linear`.

    :param d0: fixed cost per iteration, seconds.
    :param d1: cost per KV token in the batch, seconds.
    """

    def __init__(self, d0: float = 0.01, d1: float = 2.6e-7) -> None:
        self.d0 = float(d0)
        self.d1 = float(d1)
        self.name = f"linear:d0={self.d0!r},d1={self.d1!r}"

    def batch_time(
        self, prefill_tokens: int, prefill_ctx_tokens: int, n_prefill: int, n_decode: int, decode_ctx_tokens: int
    ) -> float:
        return self.d0 + self.d1 * (prefill_ctx_tokens + decode_ctx_tokens + n_decode)

    def decode_times(self, n_decode: int, decode_ctx_tokens: np.ndarray) -> np.ndarray:
        ctx = np.asarray(decode_ctx_tokens, dtype=np.float64)
        return self.d0 + self.d1 * (ctx + n_decode)


class PiecewiseLatency(LatencyModel):
    """Li et al. (2025), as cited in Ao et al. 2025, section 2.3: ``tau = c + a * max(0, b' - b0)``.

    Flat below ``b0`` (the weights' memory read dominates), linear above it (compute-bound).
    The paper does not define the load ``b'``; we read it as the tokens computed in the
    iteration, ``prefill_tokens + n_decode``, which is the batch size for a decode-only batch.

    The defaults are ours, read off the ``roofline:llama-2-7b/a100`` preset: its decode floor
    (~9.8 ms), its compute cost per token (2 x 6.7e9 FLOP at 156 TFLOP/s = 86 us) and the knee
    where compute overtakes the weight read (~96 tokens).

    :param c: iteration time below the knee, seconds.
    :param a: extra seconds per token above the knee.
    :param b0: the knee, in tokens per iteration.
    """

    def __init__(self, c: float = 0.0098, a: float = 8.6e-5, b0: float = 96.0) -> None:
        self.c = float(c)
        self.a = float(a)
        self.b0 = float(b0)
        self.name = f"piecewise:c={self.c!r},a={self.a!r},b0={self.b0!r}"

    def batch_time(
        self, prefill_tokens: int, prefill_ctx_tokens: int, n_prefill: int, n_decode: int, decode_ctx_tokens: int
    ) -> float:
        excess = prefill_tokens + n_decode - self.b0
        return self.c + self.a * excess if excess > 0.0 else self.c

    def decode_times(self, n_decode: int, decode_ctx_tokens: np.ndarray) -> np.ndarray:
        # Independent of the context, so the scalar path gives the (only) value.
        return np.full(len(decode_ctx_tokens), self.batch_time(0, 0, 0, n_decode, 0))


class AffineLatency(LatencyModel):
    """Separate affine prefill and decode costs; a mixed batch pays both.

    * prefill (when ``prefill_tokens > 0``): ``prefill_base_s + prefill_per_seq_s * n_prefill
      + prefill_per_token_s * prefill_tokens + prefill_per_ctx_s * prefill_ctx_tokens``;
    * decode (when ``n_decode > 0``): ``decode_base_s + decode_per_seq_s * n_decode
      + decode_per_kv_s * (decode_ctx_tokens + n_decode)`` (KV in use after the step).

    A mixed batch costs the sum of the two parts, as in engines that run the prefill and the
    decode forward passes one after the other (S-LoRA/LightLLM, where Sheng et al. 2024 measured).

    Defaults: Sheng et al. 2024's A10G / Llama-2-7B profile (our fit to their artifact's
    ``cost_profile.json``): prefill ms = 35.7 + 0.21 x batch + 0.2086 x input tokens; decode
    ms = 16.3 + 0.245 x batch + 0.00202 x KV tokens (residuals within 4 ms).
    ``prefill_per_ctx_s`` (attention over a cached prefix) is 0 there; it is ours to set.
    All coefficients are in seconds. Calibrate with :func:`fit_affine`.
    """

    COEFFS = (
        "prefill_base_s",
        "prefill_per_seq_s",
        "prefill_per_token_s",
        "prefill_per_ctx_s",
        "decode_base_s",
        "decode_per_seq_s",
        "decode_per_kv_s",
    )

    def __init__(
        self,
        prefill_base_s: float = 35.7e-3,
        prefill_per_seq_s: float = 0.21e-3,
        prefill_per_token_s: float = 0.2086e-3,
        prefill_per_ctx_s: float = 0.0,
        decode_base_s: float = 16.3e-3,
        decode_per_seq_s: float = 0.245e-3,
        decode_per_kv_s: float = 0.00202e-3,
    ) -> None:
        self.prefill_base_s = float(prefill_base_s)
        self.prefill_per_seq_s = float(prefill_per_seq_s)
        self.prefill_per_token_s = float(prefill_per_token_s)
        self.prefill_per_ctx_s = float(prefill_per_ctx_s)
        self.decode_base_s = float(decode_base_s)
        self.decode_per_seq_s = float(decode_per_seq_s)
        self.decode_per_kv_s = float(decode_per_kv_s)
        self.name = "affine:" + ",".join(f"{k}={getattr(self, k)!r}" for k in self.COEFFS)

    def batch_time(
        self, prefill_tokens: int, prefill_ctx_tokens: int, n_prefill: int, n_decode: int, decode_ctx_tokens: int
    ) -> float:
        if n_decode > 0:
            t = (
                self.decode_base_s
                + self.decode_per_seq_s * n_decode
                + self.decode_per_kv_s * (decode_ctx_tokens + n_decode)
            )
        else:
            t = 0.0
        if prefill_tokens > 0:
            t += (
                self.prefill_base_s
                + self.prefill_per_seq_s * n_prefill
                + self.prefill_per_token_s * prefill_tokens
                + self.prefill_per_ctx_s * prefill_ctx_tokens
            )
        return t

    def decode_times(self, n_decode: int, decode_ctx_tokens: np.ndarray) -> np.ndarray:
        ctx = np.asarray(decode_ctx_tokens, dtype=np.float64)
        if n_decode <= 0:
            return np.zeros(len(ctx))
        return self.decode_base_s + self.decode_per_seq_s * n_decode + self.decode_per_kv_s * (ctx + n_decode)



def _keywords(cls: type[LatencyModel]):
    def build(args: dict[str, Any]) -> LatencyModel:
        return cls(**args)
    return build


register_latency("unit", lambda rest: None if rest else UnitLatency(), "",
                 listing={"unit": "every iteration takes 1 round (theory papers)"},
                 from_dict=lambda args: None if args else UnitLatency())
register_latency("linear", lambda rest: LinearKVLatency(**kv_args(rest, ("d0", "d1"), "linear")), "",
                 listing={"linear": "d0 + d1 x KV tokens in the batch, d0=10 ms, d1=2.6e-7 s (Ao et al. 2025, Eq. 1; "
                                    "our estimate)"},
                 from_dict=_keywords(LinearKVLatency))
register_latency("piecewise", lambda rest: PiecewiseLatency(**kv_args(rest, ("c", "a", "b0"), "piecewise")), "",
                 listing={"piecewise": "flat 9.8 ms up to 96 tokens, then 86 us/token (Li et al. 2025 form; ours)"},
                 from_dict=_keywords(PiecewiseLatency))
register_latency("affine", lambda rest: AffineLatency(**kv_args(rest, AffineLatency.COEFFS, "affine")), "",
                 listing={"affine": "separate prefill and decode fits, A10G / Llama-2-7B (Sheng et al. 2024's profile)"},
                 from_dict=_keywords(AffineLatency))
