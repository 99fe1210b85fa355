"""Ao, Luo, Simchi-Levi and Wang 2025 ("Optimizing LLM Inference: Fluid-Guided Online Scheduling
with Memory Constraints") reproduction: Example 2's FCFS loss and the throughput of WAIT / Nested
WAIT against vLLM and Sarathi with the ratio to the fluid bound (sections 3.2 and 6).

The text gives no per-algorithm numbers (figures missing), so the rows are the Example 2 range
(12-25% FCFS loss at C = M* = 12, replayed deterministically from the paper's start; a Poisson
run is shown beside it) and the orderings "WAIT > vLLM, Sarathi" (Figs 7-8) and "Nested WAIT >
vLLM, Sarathi" in throughput and latency (Figs 11-13: synthetic 4-type, clustered 10-type at QPS
55 and 550), with our numbers and ``ratio_to_fluid``, all algorithms at the same batch-size limit
B (the paper's rule; WAIT with its section 6.1 practical thresholds of B).

Departures: the batch times are ours (the scenarios' ``calibrated:llama-3-8b/a100``, grounded in
Vidur's A100 measurements, where the paper ran Vidur itself; ``d0, d1`` of the fluid bound are a
least-squares fit of it); the paper's rates (thousands of req/s) overload one GPU, so
the wait-high runs are the companion code's burst-then-drain, where ``ratio_to_fluid`` is far below
1 and the capacity-aware (non-paper) ratio is reported too. The real-trace runs (Fig. 14) need the
LMSYS trace and are not run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmsched_gym.core.scenarios import get_scenario
from llmsched_gym.reproduce.report import (
    PaperReport,
    Row,
    add_reference_metrics,
    missing_policies,
    not_comparable,
    ordering_verdict,
)
from llmsched_gym.sim import SimResult, simulate

EXAMPLE2_LATENCY: dict[str, Any] = {"type": "linear", "d0": 0.4, "d1": 0.05}
"""toy_example2's Eq. 1 coefficients (the authors' companion code): DeltaT* = 1, so one iteration is one time unit."""

EXAMPLE2_POLICY = "fcfs-greedy-lifo"
"""Ao et al. 2025's FCFS (section 4.1, Example 2): everything admitted at once, LIFO eviction restarting the evicted."""


def example2(workload: dict[str, Any], horizon_s: float | None = None) -> dict[str, Any]:
    """Example 2: l = 1, l' = 1, C = 12 token-level KV, prefill emits no token, Eq. 1 times."""
    engine: dict[str, Any] = {"kv_capacity_tokens": 12, "block_size": 1, "prefill_emits_token": False,
                              "overflow": "forbid"}
    if horizon_s:
        engine["horizon_s"] = horizon_s
    return {"name": "toy_example2", "workload": workload, "engine": engine, "latency": EXAMPLE2_LATENCY}


def paper_start(horizon_s: float) -> dict[str, Any]:
    """The paper's start: 3 prompts prefilled at t = 0 (stage 1 when the 6 of t = 0.5 wait at
    stage 0, i.e. at t = 0.55), then 4 arrivals per unit time (one full iteration)."""
    arr = np.concatenate([np.zeros(3), np.full(6, 0.5), 0.55 + np.arange(1, int(4 * horizon_s)) / 4.0])
    n = len(arr)
    return example2({"explicit": {"arrival_s": arr.tolist(), "prompt_tokens": [1] * n, "output_tokens": [1] * n}},
                    horizon_s)


def poisson(horizon_s: float) -> dict[str, Any]:
    """Example 2 with Poisson(4) arrivals per unit time instead of the paper's deterministic 4."""
    return example2({"types": [{"rate": 4, "prompt": 1, "output": 1}], "horizon_s": horizon_s}, horizon_s)


def completions_per_iteration(result: SimResult) -> np.ndarray:
    """How many requests completed at the end of each engine iteration."""
    it = result.iterations
    ends = it["t_start"] + it["duration"]
    done = result.requests["completion_s"]
    done = done[np.isfinite(done)]
    return np.array([np.count_nonzero(done == t) for t in ends])


WAIT_LOW: dict[str, Any] = {"workload.types": [{"rate": 1000, "prompt": 10, "output": 10},
                                               {"rate": 1000, "prompt": 10, "output": 20}]}

CLUSTER_WEIGHTS = (23, 11, 8, 7, 6, 4, 3, 2, 1, 1)
"""Section 6.2's per-bin rate proportions of the 10 clustered decode lengths 50, 100, ..., 500."""


def clustered(qps: float, n_requests: int = 8000) -> dict[str, Any]:
    """Overrides of ``nested-synth4`` for the synthetic clustered workload (Figs 12-13): prefill
    60, decode 50..500 in 10 types at ``qps`` in total, rates in the real-trace proportions;
    8,000 requests as in the companion code's 10-type runs."""
    total = sum(CLUSTER_WEIGHTS)
    return {"workload.types": [{"rate": qps * w / total, "prompt": 60, "output": 50 * (k + 1)}
                               for k, w in enumerate(CLUSTER_WEIGHTS)],
            "workload.n_requests": n_requests}


CONFIGS: tuple[tuple[str, str, dict[str, Any], str, bool], ...] = (
    ("WAIT, low demand (Fig. 7)", "wait-high", WAIT_LOW, "wait", False),
    ("WAIT, high demand (Fig. 8)", "wait-high", {}, "wait", False),
    ("Nested WAIT, synthetic 4-type (Fig. 11)", "nested-synth4", {}, "nested-wait", True),
    ("Nested WAIT, clustered 10-type, QPS 55 (Fig. 12)", "nested-synth4", clustered(55.0), "nested-wait", True),
    ("Nested WAIT, clustered 10-type, QPS 550 (Fig. 13)", "nested-synth4", clustered(550.0), "nested-wait", True),
)
"""(claim, scenario, overrides, our policy, the paper also claims lower latency)."""
BASELINES = ("vllm-v0", "sarathi")
BATCH_LIMITS = (128, 256)
"""Shared batch-size limits B (the paper: "the same batch-size limit for all algorithms"): 128 is the
companion code's for the 4-type run (and Vidur's default cap), 256 vLLM's ``max_num_seqs``."""


def policies_at(ours: str, batch: int) -> list[dict[str, Any]]:
    """Our policy and the baselines at batch-size limit ``batch``: ``max_num_seqs`` for vLLM and
    Sarathi, ``batch_size`` for (Nested) WAIT, with WAIT's section 6.1 practical thresholds
    n_j = B lambda_j / (sum lambda (l'_j + 1)) (the companion code's reading)."""
    mine: dict[str, Any] = {"name": ours, "batch_size": batch}
    if ours == "wait":
        mine["rule"] = "practical"
    return [mine, *({"name": b, "max_num_seqs": batch} for b in BASELINES)]


def _name(policy: dict[str, Any]) -> str:
    return str(policy["name"])


def example2_rows(quick: bool) -> list[Row]:
    """Example 2 (C = M* = 12, DeltaT* = 1): FCFS's loss in completions per iteration on the
    paper's deterministic start, WAIT at the equilibrium thresholds, and FCFS under Poisson arrivals."""
    horizon = 300.0 if quick else 1000.0
    per = completions_per_iteration(simulate(paper_start(horizon), EXAMPLE2_POLICY, 0))[1:-1]
    loss = 1.0 - per.mean() / 4.0
    rows = [Row("Example 2: FCFS (fcfs-greedy-lifo) throughput loss, the paper's start (6 prompts at stage 0, "
                "3 at stage 1, then 4 arrivals per iteration; C = M* = 12)",
                "3-3.5 completions/iteration vs 4: 12-25%",
                f"{100 * loss:.2f}% (completions per iteration {per[:3].tolist()} then "
                f"{np.median(per[3:]):.0f} each; mean {per.mean():.3f} over {len(per)} iterations)",
                ordering_verdict(0.12 <= loss <= 0.25))]
    per_w = completions_per_iteration(simulate(paper_start(horizon), {"name": "wait", "thresholds": [4]}, 0))[1:-1]
    rows.append(Row("Example 2: WAIT at the equilibrium thresholds (n = 4) loses nothing on the same start",
                    "4 completions/iteration (Throughput*)", f"mean {per_w.mean():.3f} completions/iteration",
                    ordering_verdict(bool(np.all(per_w == 4)))))
    losses, wait_losses = [], []
    for seed in range(5):
        for policy, out in ((EXAMPLE2_POLICY, losses), ({"name": "wait", "thresholds": [4]}, wait_losses)):
            s = simulate(poisson(horizon), policy, seed).summary
            out.append(1.0 - s["n_completed"] / s["iterations"] / 4.0)
    rows.append(Row("Example 2 with Poisson(4) arrivals per unit time: FCFS loss (simulated, not the paper's "
                    "construction)", "12-25% (deterministic start)",
                    f"mean {100 * np.mean(losses):.1f}% (range {100 * min(losses):.1f}-{100 * max(losses):.1f}% "
                    f"over seeds 0-4, horizon {horizon:g}; WAIT n = 4: mean {100 * np.mean(wait_losses):.2f}%)",
                    not_comparable("random arrivals at the critical load lambda = 4 (no slack) add queueing "
                                   "losses the paper's deterministic cycle does not have; shown as the "
                                   "random-arrival counterpart (FCFS loses more, WAIT almost nothing)")))
    return rows


def _mean(summaries: list[dict[str, Any]], key: str, sub: str | None = None) -> float:
    return float(np.mean([r[key][sub] if sub else r[key] for r in summaries]))


def run(quick: bool = False) -> PaperReport:
    rows: list[Row] = []
    n = 2000 if quick else None
    if missing_policies([EXAMPLE2_POLICY, "wait"]):
        rows.append(Row("Example 2: FCFS throughput loss", "12-25%", "-",
                        not_comparable(f"policy {EXAMPLE2_POLICY} or wait not available")))
    else:
        rows += example2_rows(quick)
    seeds = [0] if quick else [0, 1, 2]
    limits = [128] if quick else list(BATCH_LIMITS)
    for claim, scenario, overrides, ours_policy, lower_latency in CONFIGS:
        ov = dict(overrides)
        if n:
            ov["workload.n_requests"] = n
        missing = missing_policies([ours_policy, *BASELINES])
        if missing:
            rows.append(Row(claim, "ordering", "-", not_comparable(f"policy {missing[0]} not available")))
            continue
        spec = get_scenario(scenario, ov)
        thr_txt, lat_txt, thr_ok, lat_ok = [], [], True, True
        for b in limits:
            res = {_name(p): [add_reference_metrics(simulate(spec, p, seed).summary, spec) for seed in seeds]
                   for p in policies_at(ours_policy, b)}
            thr = {p: _mean(v, "throughput_tokens_per_s") for p, v in res.items()}
            lat = {p: _mean(v, "e2e_s", "mean") for p, v in res.items()}
            cap = "ratio_to_fluid_capacity_aware" in res[ours_policy][0]
            thr_txt.append(f"B = {b}: " + ", ".join(
                f"{p} {thr[p]:.5g} tok/s (ratio_to_fluid {_mean(res[p], 'ratio_to_fluid'):.3g}"
                + (f", capacity-aware {_mean(res[p], 'ratio_to_fluid_capacity_aware'):.3g}" if cap else "")
                + ")" for p in res))
            lat_txt.append(f"B = {b}: " + ", ".join(f"{p} {lat[p]:.3g} s" for p in res))
            thr_ok &= all(thr[ours_policy] > thr[p] for p in BASELINES)
            lat_ok &= all(lat[ours_policy] < lat[p] for p in BASELINES)
        slack = res[ours_policy][0].get("fluid_memory_slack")
        rows.append(Row(f"{claim}: throughput above vLLM and Sarathi at the same batch-size limit B",
                        "ordering (figures missing)",
                        "; ".join(thr_txt) + ("" if slack is None else f"; C/M* = {slack:.3g}" if slack > 0 else
                                              "; M* infinite (d1 A >= 1: compute-overloaded)"),
                        ordering_verdict(thr_ok)))
        if lower_latency:
            rows.append(Row(f"{claim}: mean latency below vLLM and Sarathi", "ordering (figures missing)",
                            "; ".join(lat_txt), ordering_verdict(lat_ok)))
        else:  # the paper: latency "remains within acceptable limits", no ordering claimed
            rows[-1].ours += "; mean E2E " + "; ".join(lat_txt)
    return PaperReport("wait", "WAIT / Nested WAIT (Ao et al. 2025)", rows,
                       notes=["No per-algorithm numbers are in the text; orderings only (section 6).",
                              "ratio_to_fluid = measured output tokens/s / Throughput* (Prop. 2); the capacity-aware "
                              "value (our derivation) is not from the paper.",
                              f"Requests per run: {n or 'scenario default (clustered: 8,000)'}; seeds {seeds} "
                              "(throughput and latency are seed means); batch-size limits B = "
                              f"{', '.join(map(str, limits))}, shared by all algorithms (WAIT with the section 6.1 "
                              "practical thresholds of B; the fluid-recipe WAIT fills the memory with batches of "
                              "thousands, far past any shared limit, so it is not compared).",
                              "The wait-high configurations are the companion code's burst-then-drain (10,000 "
                              "requests at thousands of req/s arrive within seconds), so ratio_to_fluid is low "
                              "even where C/M* > 1: the fluid bound ignores the batch-size limit, which caps "
                              "every algorithm at about B tokens per iteration.",
                              "C/M* is the fluid memory slack (section 3.2): below 1 the configuration is memory-"
                              "overloaded and Throughput* is out of reach (Remark 1)."],
                       config="Example 2 toy; wait-high (and its low-demand types); nested-synth4; clustered "
                       "10-type at QPS 55 and 550")
