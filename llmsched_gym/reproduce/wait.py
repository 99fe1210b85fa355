"""Seed 003 (Ao, Luo, Simchi-Levi, Wang, "Optimizing LLM Inference: Fluid-Guided Online Scheduling
with Memory Constraints") reproduction: Example 2's FCFS loss and the throughput of WAIT / Nested
WAIT against vLLM and Sarathi with the ratio to the fluid bound (digest §5.2-5.5, §6.7-6.8).

The text gives no per-algorithm numbers (figures missing), so the rows are the Example 2 range
(12-25% FCFS loss at C = M* = 12) and the orderings "WAIT > vLLM, Sarathi" and "Nested WAIT >
vLLM, Sarathi" in throughput, with our numbers and ``ratio_to_fluid``.

Departures: the batch-time model is ours (roofline Llama-3-8B on an A100; ``d0, d1`` of the fluid
bound are a least-squares fit of it); the paper's rates (thousands of req/s) overload one GPU, so
the wait-high run is the companion code's burst-then-drain, where ``ratio_to_fluid`` is far below
1 and the capacity-aware (non-paper) ratio is reported too.
"""

from __future__ import annotations

from typing import Any

from llmsched_gym.core.scenarios import get_scenario
from llmsched_gym.reproduce.report import (
    PaperReport,
    Row,
    add_reference_metrics,
    missing_policies,
    not_comparable,
    ordering_verdict,
)
from llmsched_gym.sim import simulate

EXAMPLE2: dict[str, Any] = {
    "name": "wait-example2",
    "workload": {"types": [{"rate": 4.0, "prompt": 1, "output": 1}], "n_requests": 4000},
    "engine": {"kv_capacity_tokens": 12, "block_size": 1, "prefill_emits_token": False,
               "overflow": "preempt_lifo_recompute", "preempt_mode": "restart"},
    "latency": {"type": "linear", "d0": 0.4, "d1": 0.05},
    "policy": "fcfs",
}
"""Example 2 (digest §6.7 toy_example2): l = l' = 1, lambda = 4, C = M* = 12, d0 = 0.4, d1 = 0.05."""

EXAMPLE2_POLICY = "fcfs-greedy-lifo"
"""Digest §3.1's FCFS: everything admitted at once, LIFO eviction restarting the evicted."""

WAIT_LOW: dict[str, Any] = {"workload.types": [{"rate": 1000, "prompt": 10, "output": 10},
                                               {"rate": 1000, "prompt": 10, "output": 20}]}

CONFIGS: tuple[tuple[str, str, dict[str, Any], str], ...] = (
    ("WAIT, low demand (Fig. 7)", "wait-high", WAIT_LOW, "wait"),
    ("WAIT, high demand (Fig. 8)", "wait-high", {}, "wait"),
    ("Nested WAIT, synthetic 4-type (Fig. 11)", "nested-synth4", {}, "nested-wait"),
)
BASELINES = ("vllm-v0", "sarathi")


def run(quick: bool = False) -> PaperReport:
    rows: list[Row] = []
    n = 2000 if quick else None
    if missing_policies([EXAMPLE2_POLICY]):
        rows.append(Row("Example 2: FCFS throughput loss", "12-25%", "-", not_comparable(f"policy {EXAMPLE2_POLICY} not available")))
    else:
        spec = get_scenario("wait-high")  # only for the name; EXAMPLE2 is complete
        spec.update(EXAMPLE2)
        s = add_reference_metrics(simulate(spec, EXAMPLE2_POLICY, 0).summary, spec)
        loss = 1.0 - s["ratio_to_fluid"]
        rows.append(Row(f"Example 2: FCFS ({EXAMPLE2_POLICY}) throughput loss vs the fluid optimum (C = M* = 12)", "12-25%",
                        f"{100 * loss:.1f}% (throughput {s['throughput_tokens_per_s']:.3g} vs Throughput* "
                        f"{s['fluid_throughput_star']:.3g} tokens/s)",
                        ordering_verdict(0.12 <= loss <= 0.25)))
    for claim, scenario, overrides, ours_policy in CONFIGS:
        ov = dict(overrides)
        if n:
            ov["workload.n_requests"] = n
        missing = missing_policies([ours_policy, *BASELINES])
        if missing:
            rows.append(Row(claim, "ordering", "-", not_comparable(f"policy {missing[0]} not available")))
            continue
        spec = get_scenario(scenario, ov)
        res = {p: add_reference_metrics(simulate(spec, p, 0).summary, spec) for p in (ours_policy, *BASELINES)}
        thr = {p: r["throughput_tokens_per_s"] for p, r in res.items()}
        txt = "; ".join(f"{p} {thr[p]:.5g} tok/s (ratio_to_fluid {res[p]['ratio_to_fluid']:.3g}"
                        + (f", capacity-aware {res[p]['ratio_to_fluid_capacity_aware']:.3g}"
                           if "ratio_to_fluid_capacity_aware" in res[p] else "")
                        + f", mean E2E {res[p]['e2e_s']['mean']:.3g} s)" for p in res)
        rows.append(Row(f"{claim}: throughput above vLLM and Sarathi", "ordering (figures missing)", txt,
                        ordering_verdict(all(thr[ours_policy] > thr[b] for b in BASELINES))))
    return PaperReport("wait", "Seed 003, WAIT / Nested WAIT (Ao et al.)", rows,
                       notes=["No per-algorithm numbers are in the text; orderings only (digest §5.5).",
                              "ratio_to_fluid = measured output tokens/s / Throughput* (Prop. 2); the capacity-aware "
                              "value (digest §2.6) is not from the paper.",
                              f"Requests per run: {n or 'scenario default'}; seed 0."],
                       config="Example 2 toy; wait-high (and its low-demand types); nested-synth4")
