"""Per-request records, the summary JSON (see the README), fairness and SLO metrics.

Conventions:

* ``e2e = completion - arrival``; ``ttft = first token - arrival``; ``tpot = (completion - first
  token) / (output - 1)`` for requests with more than one output token; ``queue_delay = first
  scheduled - arrival``. Latency statistics cover completed requests.
* ``n_arrived == n_completed + n_rejected + n_unfinished`` always holds; unfinished requests are
  listed with their progress in the per-request table, never dropped.
* Service (Sheng et al. 2024, section 3.1) of a client = ``w_p x prompt tokens prefilled + w_q x output tokens``, with
  the paper's ``w_p = 1, w_q = 2``.
* SLO attainment (Wang et al. 2025): the fraction of completed requests with SLOs whose TTFT and mean
  TPOT are within them; ``goodput`` counts those per second.
* SLO targets (DistServe, Zhong et al., OSDI 2024, section 2; a scenario's ``slo`` section or
  ``llmsched goodput --slo``): :func:`slo_attainment` over every arrived request, the fraction
  meeting the TTFT target, the TPOT target and both; ``summary["slo"]`` when a target is given.
* ``summary["serving"]`` repeats the latency and throughput figures under the names and units
  ``vllm bench serve`` uses (:func:`serving_metrics`), so that they read like a real benchmark.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from llmsched_gym.core.fairness import fairness_report
from llmsched_gym.core.information import information_of

if TYPE_CHECKING:
    from llmsched_gym.core.engine import Engine

STATE_NAMES = ("pending", "waiting", "running", "completed", "rejected")


def metric_value(summary: dict[str, Any], path: str) -> float:
    """The number at a dotted path of a run summary (``serving.p99_ttft_ms``); nan when absent."""
    node: Any = summary
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return math.nan
        node = node[part]
    try:
        return float(node)
    except (TypeError, ValueError):
        return math.nan


def _stats(x: np.ndarray) -> dict[str, float]:
    x = x[np.isfinite(x)]
    if not len(x):
        return {"mean": math.nan, "p50": math.nan, "p90": math.nan, "p99": math.nan, "max": math.nan}
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return {"mean": float(x.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99), "max": float(x.max())}


SERVING_LATENCIES = ("ttft", "tpot", "itl", "e2el")
"""``vllm bench serve``'s latency metrics: time to first token, time per output token (after the
first), inter-token latency, end-to-end latency; each reported in ms as mean, median, std, P90, P99."""


def _ms_stats(name: str, seconds: np.ndarray, weights: np.ndarray | None = None) -> dict[str, float]:
    """Mean, median, std, P90 and P99 of ``seconds`` in ms (NumPy's linear percentiles, as vLLM);
    with ``weights``, each value counts that many times (the lower weighted percentile)."""
    keys = [f"{k}_{name}_ms" for k in ("mean", "median", "std", "p90", "p99")]
    x = 1e3 * np.asarray(seconds, dtype=np.float64)
    w = np.ones(len(x)) if weights is None else np.asarray(weights, dtype=np.float64)
    keep = np.isfinite(x) & (w > 0)
    x, w = x[keep], w[keep]
    if not len(x):
        return dict.fromkeys(keys, math.nan)
    mean = float(np.average(x, weights=w))
    std = float(np.sqrt(np.average((x - mean) ** 2, weights=w)))
    if weights is None:
        pct = np.percentile(x, [50, 90, 99])
    else:
        order = np.argsort(x, kind="stable")
        cum = np.cumsum(w[order])
        pct = x[order][np.minimum(np.searchsorted(cum, np.array([0.5, 0.9, 0.99]) * cum[-1]), len(x) - 1)]
    return dict(zip(keys, (mean, float(pct[0]), std, float(pct[1]), float(pct[2])), strict=True))


def serving_metrics(engine: Engine, span: float) -> dict[str, float]:
    """The run's figures as ``vllm bench serve`` names them (its result JSON's keys).

    ``completed``, ``duration`` (s), ``total_input_tokens`` and ``total_output_tokens`` of the
    completed requests, ``request_throughput`` (req/s), ``output_throughput`` and
    ``total_token_throughput`` (tok/s), and ``{mean,median,std,p90,p99}_{ttft,tpot,itl,e2el}_ms``;
    :func:`summarize` adds ``request_goodput`` (req/s meeting their SLOs) when the workload has SLOs.

    TTFT, TPOT and E2EL are per completed request (TPOT over requests with more than one output
    token), as vLLM computes them. ITL is per output token after the first: the mean is exact
    (decode time over decoded gaps); its spread is the iteration durations weighted by the
    requests that decoded in them, which are the token gaps except where a request was paused or
    preempted between two of its tokens (that wait shows in TPOT and E2EL instead).
    """
    wl = engine.workload
    done = engine.state == 3
    arr, out = wl.arrival_s, wl.output_tokens
    e2el = (engine.completion_s - arr)[done]
    ttft = (engine.first_token_s - arr)[done]
    multi = done & (out > 1)
    decode_s = (engine.completion_s - engine.first_token_s)[multi]
    gaps = (out - 1)[multi]
    tpot = decode_s / gaps
    r: dict[str, float] = {
        "completed": int(done.sum()),
        "duration": float(span),
        "total_input_tokens": int(wl.prompt_tokens[done].sum()),
        "total_output_tokens": int(out[done].sum()),
    }
    r["request_throughput"] = r["completed"] / span
    r["output_throughput"] = r["total_output_tokens"] / span
    r["total_token_throughput"] = (r["total_input_tokens"] + r["total_output_tokens"]) / span
    log = engine.log.columns()
    itl = _ms_stats("itl", log["duration"], log["n_decode"])
    if gaps.sum():
        itl["mean_itl_ms"] = float(1e3 * decode_s.sum() / gaps.sum())
    r.update(_ms_stats("ttft", ttft))
    r.update(_ms_stats("tpot", tpot))
    r.update(itl)
    r.update(_ms_stats("e2el", e2el))
    return r


def client_service(engine: Engine, w_p: float = 1.0, w_q: float = 2.0) -> np.ndarray:
    """Weighted service received by each client so far (prefill + decode tokens)."""
    wl = engine.workload
    n_clients = wl.n_clients
    arrived = engine.state != 0
    # prefilled counts only the current (re)start; completed requests served their prompt fully
    prompt_done = np.where(engine.state == 3, wl.prompt_tokens, np.minimum(engine.prefilled, wl.prompt_tokens))
    svc = w_p * prompt_done + w_q * engine.generated
    return np.bincount(wl.client[arrived], weights=svc[arrived], minlength=n_clients)


def jain_index(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=float)
    if not len(x) or not np.any(x):
        return 1.0
    return float(x.sum() ** 2 / (len(x) * (x**2).sum()))


def summarize(engine: Engine, scenario: str = "", policy: str = "", wall_time_s: float = 0.0) -> dict[str, Any]:
    """The run summary (the keys are listed in the README): what ran, request counts and rates,
    latency statistics, memory and work, the ``vllm bench serve`` view, and, when the workload has
    them, SLO attainment, fairness across clients and the prefix cache's hit rate."""
    wl = engine.workload
    t0 = float(wl.arrival_s[0]) if len(wl.arrival_s) else 0.0
    span = max(engine.clock - t0, 1e-12)
    s: dict[str, Any] = {
        **_what_ran(engine, scenario, policy),
        **_counts_and_rates(engine, span, wall_time_s),
        **_latencies(engine),
        **_memory_and_work(engine, span),
        "serving": serving_metrics(engine, span),
    }
    if wl.has_slo:
        s.update(_slo(engine, span))
        s["serving"]["request_goodput"] = s["goodput_requests_per_s"]
    if wl.n_clients > 1:
        s["fairness"] = _fairness(engine)
    if wl.has_prefix:
        s.update(_prefix_cache(engine))
    return s


def _what_ran(engine: Engine, scenario: str, policy: str) -> dict[str, Any]:
    wl = engine.workload
    return {
        "scenario": scenario,
        "policy": policy,
        "seed": engine.seed,
        # which requests ran: a real trace (with its file's sha256), a synthetic stand-in for a
        # missing trace, or the scenario's own generator
        "workload_source": wl.meta.get("workload_source",
                                       {"kind": "generator", "name": scenario, "sha256": None}),
        # the batch-time model that ran (a spec that rebuilds it): a missing Vidur profile's
        # calibrated stand-in shows here
        "latency_model": str(getattr(engine.latency, "name", type(engine.latency).__name__)),
        # what the policy knew about output lengths: clairvoyant, predicted or blind
        "information": information_of(wl),
    }


def _counts_and_rates(engine: Engine, span: float, wall_time_s: float) -> dict[str, Any]:
    state = engine.state
    n_completed = int(np.count_nonzero(state == 3))
    completed_tokens = int(engine.workload.output_tokens[state == 3].sum())
    return {
        "n_arrived": int(np.count_nonzero(state != 0)),
        "n_completed": n_completed,
        "n_rejected": int(np.count_nonzero(state == 4)),
        "n_unfinished": int(np.count_nonzero((state == 1) | (state == 2))),
        "n_not_arrived": int(np.count_nonzero(state == 0)),
        "sim_time_s": float(engine.clock),
        "wall_time_s": float(wall_time_s),
        "iterations": int(engine.n_iterations),
        "throughput_tokens_per_s": float(engine.total_decoded / span),
        "completed_output_tokens_per_s": float(completed_tokens / span),
        "requests_per_s": float(n_completed / span),
    }


def _latencies(engine: Engine) -> dict[str, Any]:
    """Statistics of the completed requests' end-to-end latency, TTFT, TPOT and queueing delay."""
    wl = engine.workload
    done = engine.state == 3
    arr, out = wl.arrival_s, wl.output_tokens
    e2e = (engine.completion_s - arr)[done]
    multi = done & (out > 1)
    return {
        "e2e_s": _stats(e2e),
        "ttft_s": _stats((engine.first_token_s - arr)[done]),
        "tpot_s": _stats(((engine.completion_s - engine.first_token_s) / np.maximum(out - 1, 1))[multi]),
        "queue_delay_s": _stats((engine.first_scheduled_s - arr)[done]),
        "total_latency_s": float(e2e.sum()),
    }


def _memory_and_work(engine: Engine, span: float) -> dict[str, Any]:
    """KV use, busy time, preemptions and token counts, and why the run stopped."""
    cap = engine.kv.capacity_tokens
    return {
        "kv_capacity_tokens": int(cap),
        "kv_peak_frac": float(engine.kv_peak_blocks * engine.kv.block_size / cap),
        "kv_mean_frac": float(engine.kv_time_integral * engine.kv.block_size / cap / span),
        "busy_frac": float(engine.busy_time / span),
        "preemptions": int(engine.n_preempt_events),
        "evictions": int(engine.n_preempt_events),
        "overflow_events": int(engine.n_overflow_events),
        "clears": int(engine.n_clears),
        "recomputed_tokens": int(engine.recomputed_tokens.sum()),
        "decoded_tokens": int(engine.total_decoded),
        "discarded_tokens": int(engine.discarded_tokens),
        "prefill_tokens": int(engine.total_prefill_tokens),
        "non_terminating": bool(engine.non_terminating),
        "stop_reason": engine.stop_reason,
    }


def _slo(engine: Engine, span: float) -> dict[str, Any]:
    """SLO attainment and goodput (Wang et al. 2025), overall and per task class."""
    wl = engine.workload
    state = engine.state
    done = state == 3
    arr, out = wl.arrival_s, wl.output_tokens
    has = done & (np.isfinite(wl.ttft_slo_s) | np.isfinite(wl.tpot_slo_s))
    ok_ttft = (engine.first_token_s - arr) <= wl.ttft_slo_s
    tp = np.where(out > 1, (engine.completion_s - engine.first_token_s) / np.maximum(out - 1, 1), 0.0)
    ok = ok_ttft & (tp <= wl.tpot_slo_s)
    with_slo = (np.isfinite(wl.ttft_slo_s) | np.isfinite(wl.tpot_slo_s)) & (state != 0)
    n_slo = int(np.count_nonzero(with_slo))
    n_ok = int(np.count_nonzero(has & ok))
    by_class = {}
    for cls, name in ((0, "online"), (1, "offline")):
        m = (wl.task_class == cls) & (state != 0)
        if m.any():
            dm = m & done
            by_class[name] = {
                "n": int(m.sum()),
                "completed": int(dm.sum()),
                "throughput_tokens_per_s": float(out[dm].sum() / span),
                "slo_attainment": float(np.count_nonzero(dm & ok & with_slo) / max(1, np.count_nonzero(m & with_slo)))
                if np.any(m & with_slo) else None,
            }
    return {"slo_attainment": float(n_ok / n_slo) if n_slo else math.nan,
            "goodput_requests_per_s": float(n_ok / span), "by_class": by_class}


_ROUNDING = 1e-9


def slo_attainment(requests: Mapping[str, np.ndarray], ttft_s: float = math.inf,
                   tpot_s: float = math.inf) -> dict[str, float]:
    """SLO attainment against one TTFT and one TPOT target (DistServe, Zhong et al., OSDI 2024,
    section 2: the fraction of requests meeting each target and both), from a per-request table
    (:func:`llmsched_gym.core.records.request_table`: columns ``state``, ``ttft_s``, ``tpot_s``).

    Every row counts (every arrived request): a request meets the TTFT target when its first token
    came within ``ttft_s`` of its arrival (a request with no first token misses it), and the TPOT
    target when it completed with a mean time per output token after the first within ``tpot_s``
    (a completed request with one output token has no TPOT and meets it; an unfinished or rejected
    one misses it). ``attainment`` is the fraction meeting both; ``inf`` disables a target. A
    latency equal to its target up to float rounding (a relative 1e-9: ``(a + 1) - a`` need not be 1)
    meets it.

    >>> slo_attainment({"state": np.array([3, 3, 3, 2]), "ttft_s": np.array([0.1, 0.5, 0.2, 0.2]),
    ...                 "tpot_s": np.array([0.02, 0.01, 0.09, np.nan])}, ttft_s=0.25, tpot_s=0.05)
    {'ttft_s': 0.25, 'tpot_s': 0.05, 'n': 4, 'ttft_attainment': 0.75, 'tpot_attainment': 0.5, 'attainment': 0.25}
    """
    ttft, tpot = float(ttft_s), float(tpot_s)
    for name, v in (("ttft_s", ttft), ("tpot_s", tpot)):
        if not v > 0:  # nan fails too
            raise ValueError(f"slo.{name}: expected a number of seconds > 0, got {v!r}")
    state = np.asarray(requests["state"])
    done = state == 3
    with np.errstate(invalid="ignore"):
        ttft_ok = np.asarray(requests["ttft_s"], dtype=np.float64) <= ttft * (1 + _ROUNDING)
        tp = np.asarray(requests["tpot_s"], dtype=np.float64)
        tpot_ok = done & (np.isnan(tp) | (tp <= tpot * (1 + _ROUNDING)))
    n = len(state)
    frac = (lambda m: float(np.count_nonzero(m) / n)) if n else (lambda m: math.nan)
    return {"ttft_s": ttft, "tpot_s": tpot, "n": int(n), "ttft_attainment": frac(ttft_ok),
            "tpot_attainment": frac(tpot_ok), "attainment": frac(ttft_ok & tpot_ok)}


def add_slo(summary: dict[str, Any], requests: Mapping[str, np.ndarray],
            slo: Mapping[str, float] | None) -> dict[str, Any]:
    """Put :func:`slo_attainment` of ``requests`` under ``summary["slo"]`` when ``slo`` (a checked
    ``slo`` section: ``ttft_s`` and/or ``tpot_s``) is given; without it the summary is unchanged.
    Returns ``summary``."""
    if slo:
        summary["slo"] = slo_attainment(requests, slo.get("ttft_s", math.inf), slo.get("tpot_s", math.inf))
    return summary


def _fairness(engine: Engine) -> dict[str, Any]:
    """End-of-run service totals across clients (equal for every policy that completes everything),
    then Sheng et al. 2024's over-time view: the largest accumulated gap, the per-tick difference and
    service curves (:func:`~llmsched_gym.core.fairness.fairness_report`)."""
    wl = engine.workload
    svc = client_service(engine)
    active = np.bincount(wl.client[engine.state != 0], minlength=wl.n_clients) > 0
    sv = svc[active] / wl.client_weight[active]
    return {
        "max_service_diff": float(sv.max() - sv.min()) if len(sv) else 0.0,
        "avg_service_diff": float(np.mean(np.abs(sv - sv.mean()))) if len(sv) else 0.0,
        "jain": jain_index(sv),
        "service_per_client": [float(v) for v in svc],
        **fairness_report(engine, n_times=50),
    }


def _prefix_cache(engine: Engine) -> dict[str, Any]:
    """Prefix-cache hits per cache lookup: every admission (a re-admission after a preemption looks
    up again) of a request that started; requests still queued never asked the cache."""
    wl = engine.workload
    started = np.isfinite(engine.first_scheduled_s)
    looked_up = int((wl.prompt_tokens[started] * (1 + engine.preemptions[started])).sum())
    return {
        "prefix_hit_rate": float(engine.cached_tokens.sum() / looked_up) if looked_up else 0.0,
        "prefix_hit_tokens": int(engine.cached_tokens.sum()),
        "prefix_evicted_blocks": int(engine.kv.evicted_blocks),
    }
