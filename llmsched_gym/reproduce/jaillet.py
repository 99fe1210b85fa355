"""Jaillet et al. 2025: the Figure 5 sweep and the alpha-greedy loop scan.

Figure 5: mean end-to-end latency of MC-SF and of six alpha-protection configurations against the
number of arrivals N = 1000..10000 (the first N requests of one Poisson stream; paper section
7), at high (50/s, ``jaillet-high``) and low (10/s, ``jaillet-low``) demand. The headline
statistic is the slope of mean latency vs N (least squares) and the ratio best-benchmark/MC-SF
(paper: about 3 at high demand, at least 8 at low demand; sections 7.1-7.2). Figures 9-10 and
12-13 sweep alpha at beta = 0.1, 0.2 and beta at alpha = 0.1, 0.2 (:func:`param_sweeps`).

Engine conventions (scenario defaults): token-level KV, ``prefill_emits_token = False``
(convention A), so a request completes at the end of its last iteration; in round mode the
engine's completion time is the paper's ``c_i + 1``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmsched_gym.core.scenarios import get_scenario
from llmsched_gym.parallel import Cell, run_cells, values
from llmsched_gym.sim import simulate

FIGURE5: tuple[tuple[str, str, dict[str, float]], ...] = (
    ("mcsf", "mcsf", {}),
    ("alpha=0.30", "alpha-greedy", {"alpha": 0.30}),
    ("alpha=0.25", "alpha-greedy", {"alpha": 0.25}),
    ("alpha=0.2,beta=0.2", "alpha-beta", {"alpha": 0.2, "beta": 0.2}),
    ("alpha=0.2,beta=0.1", "alpha-beta", {"alpha": 0.2, "beta": 0.1}),
    ("alpha=0.1,beta=0.2", "alpha-beta", {"alpha": 0.1, "beta": 0.2}),
    ("alpha=0.1,beta=0.1", "alpha-beta", {"alpha": 0.1, "beta": 0.1}),
)
"""(label, policy, parameters) of the seven Figure 5 algorithms."""

_NAMED_RATES = {50.0: "jaillet-high", 10.0: "jaillet-low"}


def scenario_for(rate: float, n_requests: int) -> dict[str, Any]:
    """The jaillet scenario at Poisson ``rate`` (req/s) cut to the first ``n_requests`` requests."""
    name = _NAMED_RATES.get(float(rate))
    overrides: dict[str, Any] = {"workload.n_requests": int(n_requests)}
    if name is None:
        name = "jaillet-high"
        overrides["workload.arrival.rate"] = float(rate)
    spec = get_scenario(name, overrides)
    # the scenario's default policy parameters must not leak into the policies compared here
    spec["policy"] = "mcsf"
    return spec


def run_many(runs: list[tuple[float, int, str, dict[str, float], int]]) -> list[dict[str, Any]]:
    """:func:`run_one` on every ``(rate, n_requests, policy, params, seed)``, as one sweep (the
    ``--jobs``/``--backend`` of ``llmsched reproduce``; :mod:`llmsched_gym.parallel`), in order."""
    cells = [Cell(f"{policy} {params} N={n} seed {seed} rate {rate:g}", (rate, n, policy, params, seed))
             for rate, n, policy, params, seed in runs]
    return values(run_cells(cells, _run_cell, label=f"jaillet runs at rate {runs[0][0]:g}" if runs else ""))


def _run_cell(args: tuple[float, int, str, dict[str, float], int]) -> dict[str, Any]:
    return run_one(*args)


def run_one(rate: float, n_requests: int, policy: str, params: dict[str, float], seed: int) -> dict[str, Any]:
    """One run; the summary keys the sweep reports."""
    s = simulate(scenario_for(rate, n_requests), {"name": policy, **params}, seed=seed).summary
    return {
        "mean_e2e_s": s["e2e_s"]["mean"], "n_completed": s["n_completed"], "iterations": s["iterations"],
        "clears": s["clears"], "recomputed_tokens": s["recomputed_tokens"], "kv_peak_frac": s["kv_peak_frac"],
        "kv_mean_frac": s["kv_mean_frac"],
        "non_terminating": s["non_terminating"], "stop_reason": s["stop_reason"], "wall_time_s": s["wall_time_s"],
    }


def slope(n_values: list[int], latencies: list[float]) -> float:
    """Least-squares slope of mean latency against N (seconds per additional arrival)."""
    if len(n_values) < 2:
        return float("nan")
    return float(np.polyfit(np.asarray(n_values, float), np.asarray(latencies, float), 1)[0])


def loop_scan(rate: float, n_requests: int, alphas: list[float], seed: int = 0) -> dict[str, Any]:
    """alpha-greedy on every ``alpha``: which runs the loop detector stops, and the smallest alpha
    from which every larger grid value terminates (the paper's "smallest loop-free alpha")."""
    done = run_many([(rate, n_requests, "alpha-greedy", {"alpha": a}, seed) for a in alphas])
    runs = {round(a, 4): r for a, r in zip(alphas, done, strict=True)}
    looping = sorted(a for a, r in runs.items() if r["non_terminating"])
    above = [a for a in sorted(runs) if not looping or a > looping[-1]]
    return {"n_requests": n_requests, "seed": seed, "runs": runs, "looping": looping,
            "smallest_loop_free_alpha": above[0] if above else None}


def run_sweep(rate: float, n_values: list[int], seeds: list[int], quick: bool = False) -> dict[str, Any]:
    """Figure 5 at ``rate``: every configuration of :data:`FIGURE5` for each N and seed.

    Returns ``{"rate", "scenario", "n_values", "seeds", "policies", "best_benchmark",
    "slope_ratio_best_benchmark_to_mcsf", "loop_scan"}``; ``policies[label]`` holds ``runs``
    (``runs[i][j]``: N = ``n_values[i]``, seed ``seeds[j]``), ``mean_e2e_s`` (seed mean per N),
    ``slope`` and ``terminated`` (no run stopped by the loop detector). The best benchmark is the
    terminating alpha configuration with the smallest slope. Unless ``quick``, ``loop_scan`` is
    :func:`loop_scan` on the alpha grid 0.01..0.30 (step 0.01) at the largest N and first seed.
    """
    n_values = [int(n) for n in n_values]
    policies: dict[str, Any] = {}
    done = iter(run_many([(rate, n, policy, params, seed) for _, policy, params in FIGURE5
                          for n in n_values for seed in seeds]))
    for label, policy, params in FIGURE5:
        runs = [[next(done) for _ in seeds] for _ in n_values]
        mean = [float(np.mean([r["mean_e2e_s"] for r in row])) for row in runs]
        policies[label] = {"policy": policy, "params": params, "runs": runs, "mean_e2e_s": mean,
                           "slope": slope(n_values, mean),
                           "terminated": not any(r["non_terminating"] for row in runs for r in row)}
    bench = {k: v for k, v in policies.items() if k != "mcsf" and v["terminated"]}
    best = min(bench, key=lambda k: bench[k]["slope"]) if bench else None
    ratio = bench[best]["slope"] / policies["mcsf"]["slope"] if best else float("nan")
    scan = None
    if not quick:
        grid = [round(0.01 * k, 2) for k in range(1, 31)]
        scan = loop_scan(rate, max(n_values), grid, seeds[0])
    return {"rate": rate, "scenario": scenario_for(rate, max(n_values))["name"], "n_values": n_values,
            "seeds": list(seeds), "policies": policies, "best_benchmark": best,
            "slope_ratio_best_benchmark_to_mcsf": ratio, "loop_scan": scan}


SWEEP_GRID: tuple[float, ...] = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3)
"""alpha (Figs 9/12) and beta (Figs 10/13) values of :func:`param_sweeps`."""


def param_sweeps(rate: float, n_requests: int, seed: int = 0) -> dict[str, dict[float, dict[float, float]]]:
    """Mean E2E latency of alpha-beta clearing over :data:`SWEEP_GRID`: ``alpha[beta][alpha]``
    (Fig. 9/12: beta in {0.1, 0.2}) and ``beta[alpha][beta]`` (Fig. 10/13: alpha in {0.1, 0.2}).
    A run stopped by the loop detector counts as infinite latency."""

    pairs = list(dict.fromkeys([(a, b) for b in (0.1, 0.2) for a in SWEEP_GRID]
                               + [(a, b) for a in (0.1, 0.2) for b in SWEEP_GRID]))
    done = run_many([(rate, n_requests, "alpha-beta", {"alpha": a, "beta": b}, seed) for a, b in pairs])
    seen = {p: float("inf") if r["non_terminating"] else float(r["mean_e2e_s"]) for p, r in zip(pairs, done, strict=True)}

    def lat(alpha: float, beta: float) -> float:
        return seen[alpha, beta]

    return {"alpha": {b: {a: lat(a, b) for a in SWEEP_GRID} for b in (0.1, 0.2)},
            "beta": {a: {b: lat(a, b) for b in SWEEP_GRID} for a in (0.1, 0.2)}}
