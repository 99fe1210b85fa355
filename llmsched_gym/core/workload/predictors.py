"""Output-length predictors: what a scheduler is told about each request's output length."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from llmsched_gym.core.request import Workload, WorkloadError
from llmsched_gym.core.workload.checks import RngLike, _num

_PREDICTORS = {"oracle": ((), ()), "lognormal": (("sigma",), ()), "noisy": (("x",), ()),
               "bucketed": (("edges",), ("point",)), "none": ((), ())}

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
