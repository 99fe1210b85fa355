"""Jaillet et al. 2025: the Figure 5 sweep, the alpha-greedy loop scan and the report (:func:`run`).

Figure 5: mean end-to-end latency of MC-SF and of six alpha-protection configurations against the
number of arrivals N = 1000..10000 (the first N requests of one Poisson stream; paper section
7), at high (50/s, ``jaillet-high``) and low (10/s, ``jaillet-low``) demand. The headline
statistic is the slope of mean latency vs N (least squares) and the ratio best-benchmark/MC-SF
(paper: about 3 at high demand, at least 8 at low demand; sections 7.1-7.2). Figures 9-10 and
12-13 sweep alpha at beta = 0.1, 0.2 and beta at alpha = 0.1, 0.2 (:func:`param_sweeps`).

Engine conventions (scenario defaults): token-level KV, ``prefill_emits_token = False``
(convention A), so a request completes at the end of its last iteration; in round mode the
engine's completion time is the paper's ``c_i + 1``.

:func:`run` (``llmsched reproduce jaillet``) adds to the sweep the optimum rows (the integer
program of Appendix B.1), the Thm 6.2 instances and a calibrated low demand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from llmsched_gym.core.scenarios import get_scenario
from llmsched_gym.parallel import Cell, run_cells, values
from llmsched_gym.reproduce.report import (
    PaperReport,
    Plot,
    Row,
    fmt,
    missing_policies,
    not_comparable,
    ordering_verdict,
    policy_vs_optimum,
    within,
)
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


# --- the report: Figure 5 and its sweeps, the optimum references, the Thm 6.2 instances -------------


def ip_vs_exhaustive(n_instances: int, seed: int = 0) -> tuple[int, int]:
    """(agreements, instances): the IP's TEL equals exhaustive search on random tiny instances."""
    from llmsched_gym.optimum import Instance, solve_exhaustive, solve_ip

    rng = np.random.default_rng(seed)
    agree = 0
    for _ in range(n_instances):
        n = int(rng.integers(2, 6))
        inst = Instance(arrival=np.sort(rng.integers(0, 5, n)), prompt=rng.integers(1, 4, n),
                        output=rng.integers(1, 6, n), M=int(rng.integers(9, 16)))
        agree += solve_ip(inst).tel == solve_exhaustive(inst).tel
    return agree, n_instances


def mcsf_ratios(n_instances: int, n: int = 8, seed: int = 0) -> list[float]:
    """MC-SF's TEL / OPT on random small online instances (Poisson-like arrivals, M = 20)."""
    from llmsched_gym.optimum import Instance

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_instances):
        inst = Instance(arrival=np.sort(rng.integers(0, 2 * n, n)), prompt=rng.integers(1, 5, n),
                        output=rng.integers(1, 9, n), M=20)
        out.append(policy_vs_optimum(inst, "mcsf")["ratio_to_opt"])
    return out


def adversarial_mcsf_ratios(eps: float, Ms: list[int]) -> list[float]:
    """MC-SF's TEL (engine, round mode) over the TEL of Thm 6.2's offline strategy A3 on the
    :func:`~llmsched_gym.reproduce.adversarial.adversarial_deterministic` instance for each ``M`` (MC-SF starts
    the lone long request at round 0, so the adversary's ``t' = 0``). A3's TEL bounds OPT above,
    so each value is a lower bound on MC-SF's ratio to the optimum."""
    from llmsched_gym.optimum import total_latency
    from llmsched_gym.reproduce.adversarial import adversarial_deterministic, adversarial_wait_schedule
    from llmsched_gym.reproduce.report import paper_tel, round_mode_scenario
    from llmsched_gym.sim import simulate

    out = []
    for M in Ms:
        inst = adversarial_deterministic(M, eps)
        tel = paper_tel(simulate(round_mode_scenario(inst), "mcsf", 0).summary)
        out.append(tel / total_latency(inst, adversarial_wait_schedule(inst)))
    return out


@dataclass(frozen=True)
class Demand:
    """One Figure 5 demand level as the report runs it."""

    label: str
    rate: float
    paper_ratio: str  # the paper's best-benchmark / MC-SF slope statement
    paper_slopes: str
    paper_alpha: float  # smallest loop-free alpha
    best_alpha: tuple[float, float]  # the alpha range the alpha sweep finds best (Figs 9/12)
    good_beta: tuple[float, float]  # the beta range that performs well (Figs 10/13)
    note: str = ""


DEMANDS = (
    Demand("high", 50.0, "about 3x", "MC-SF ~1/6, best benchmark ~1/2", 0.21, (0.15, 0.25), (0.05, 0.25)),
    Demand("low", 10.0, "at least 8x", "MC-SF ~1/800, best benchmark ~1/100", 0.24, (0.10, 0.25), (0.05, 0.20),
           "the paper's rate; under our batch times nothing is overloaded here"),
    Demand("low, calibrated", 20.0, "at least 8x", "MC-SF ~1/800, best benchmark ~1/100", 0.24, (0.10, 0.25),
           (0.05, 0.20), "our analogue of the paper's low demand: the rate at which our MC-SF's slope is about "
           "the paper's 1/800 s per arrival (a scan with seed 0 and N = 2000, 6000, 10000 gave 3.8e-4 at lambda = "
           "15, 8.5e-4 at 20, 3.5e-3 at 30; 9.0e-4 at 20 with the plain roofline batch times it was first chosen "
           "under), i.e. MC-SF near-stable with the memory near its limit; only the rate "
           "is calibrated, on MC-SF alone, so the benchmark slopes and the ratio remain a test"),
)
"""Jaillet et al. 2025's two demand levels, plus the calibrated low demand (see the report's notes)."""


def _ratio_verdict(d: Demand, ratio: float, mcsf_slope: float, bench_slope: float) -> str:
    if mcsf_slope <= 0 or bench_slope <= 0 or mcsf_slope < 1e-4 * bench_slope:
        return not_comparable("latency does not grow with N at this rate under our batch times (slopes <= 0 or "
                              "MC-SF's negligible): the system is not overloaded, so the slope ratio is "
                              "meaningless; see the calibrated low demand")
    if d.paper_ratio.startswith("at least"):
        return ordering_verdict(ratio >= 8.0) + ("" if ratio >= 8.0 or ratio < 7.2 else
                                                 f": {100 * (1 - ratio / 8):.0f}% short of 8x")
    return within(ratio, 3.0, 0.34)


def _lat(x: float) -> str:
    return "loops" if math.isinf(x) else fmt(x)


def _sweep_rows(d: Demand, sw: dict[str, Any]) -> list[Row]:
    rows = []
    best = {b: min(v, key=v.get) for b, v in sw["alpha"].items()}
    lo, hi = d.best_alpha
    rows.append(Row(f"{d.label} demand (Fig. {'9' if d.rate == 50 else '12'}): alpha in [{lo}, {hi}] gives the "
                    "lowest latency at beta = 0.1 and 0.2", f"[{lo}, {hi}]",
                    "; ".join(f"beta = {b}: best alpha {a} ({', '.join(f'{x}: {_lat(y)}' for x, y in sw['alpha'][b].items())} s)"
                              for b, a in best.items()),
                    ordering_verdict(all(lo <= a <= hi for a in best.values()))))
    drop = {b: v[0.05] / min(x for a, x in v.items() if a >= 0.1) for b, v in sw["alpha"].items()}
    rows.append(Row(f"{d.label} demand: alpha < 0.1 degrades sharply (alpha = 0.05 over the best alpha >= 0.1)",
                    "sharp drop (no number)", ", ".join(f"beta = {b}: " + ("loops" if math.isinf(r) else f"{fmt(r)}x") for b, r in drop.items()),
                    ordering_verdict(all(r > 1.1 for r in drop.values()))))
    lo, hi = d.good_beta
    spread = {a: max(y for b, y in v.items() if lo <= b <= hi) / min(v.values()) for a, v in sw["beta"].items()}
    rows.append(Row(f"{d.label} demand (Fig. {'10' if d.rate == 50 else '13'}): beta in [{lo}, {hi}] performs "
                    "well (worst within 10% of the best beta) at alpha = 0.1 and 0.2", f"[{lo}, {hi}]",
                    "; ".join(f"alpha = {a}: worst / best {fmt(r)} ({', '.join(f'{x}: {_lat(y)}' for x, y in sw['beta'][a].items())} s)"
                              for a, r in spread.items()),
                    ordering_verdict(all(r <= 1.1 for r in spread.values()))))
    return rows


def _figure5_rows(d: Demand, sw: dict[str, Any], n_values: list[int]) -> tuple[list[Row], Plot]:
    """Figure 5 at one demand: the slope ratio, MC-SF's ordering, its memory (Figs 8/11) and, at
    the low demands, the best benchmark; with the latency-vs-N plot."""
    rows = []
    ratio = sw["slope_ratio_best_benchmark_to_mcsf"]
    pol = sw["policies"]
    mcsf_slope = pol["mcsf"]["slope"]
    best = sw["best_benchmark"]
    slopes = ", ".join(f"{k} {v['slope']:.3g}" for k, v in pol.items())
    verdict = _ratio_verdict(d, ratio, mcsf_slope, pol[best]["slope"] if best else 0.0)
    overloaded = not verdict.startswith("not comparable")
    rows.append(Row(f"{d.label} demand (lambda = {d.rate:g}): best benchmark slope / MC-SF slope (Fig. 5)",
                    f"{d.paper_ratio} ({d.paper_slopes} s/arrival)",
                    f"{ratio:.3g} (best {best}; slopes s/arrival: {slopes})", verdict))
    rows.append(Row(f"{d.label} demand: MC-SF has the smallest latency slope", "ordering",
                    f"MC-SF {mcsf_slope:.3g} vs best benchmark {pol[best]['slope'] if best else float('nan'):.3g}",
                    ordering_verdict(all(mcsf_slope <= v["slope"] for v in pol.values())) if overloaded else
                    not_comparable("not overloaded: every slope is about 0")))
    last = pol["mcsf"]["runs"][-1]
    peak = max(r["kv_peak_frac"] for r in last)
    mean = float(np.mean([r["kv_mean_frac"] for r in last]))
    rows.append(Row(f"{d.label} demand: MC-SF's memory stays within M (Fig. {'8' if d.rate == 50 else '11'})"
                    + ("" if d.rate == 50 else ", near the limit most of the time"),
                    "<= M" + ("" if d.rate == 50 else ", near M"),
                    f"peak {peak:.3f} M, time-average {mean:.2f} M (N = {n_values[-1]})",
                    ordering_verdict(peak <= 1.0) if d.rate == 50 else
                    ordering_verdict(peak <= 1.0 and mean >= 0.5)
                    + ("" if mean >= 0.5 or overloaded else
                       ": the memory is mostly idle because this rate does not overload our batch times")))
    if d.rate != 50:
        rows.append(Row(f"{d.label} demand: best benchmarks are (alpha = 0.2, beta = 0.2) and (0.2, 0.1)",
                        "(0.2, 0.2), (0.2, 0.1)", f"best {best}",
                        ordering_verdict(best in ("alpha=0.2,beta=0.2", "alpha=0.2,beta=0.1")) if overloaded
                        else not_comparable("not overloaded: every slope is about 0")))
    plot = Plot(f"fig5_{d.label.replace(', ', '_')}", f"Fig. 5 analogue, lambda = {d.rate:g}",
                "N (arrivals)", "mean E2E latency (s)",
                {k: (n_values, v["mean_e2e_s"]) for k, v in pol.items()})
    return rows, plot


def _loop_scan_row(d: Demand, scan: dict[str, Any] | None) -> Row:
    """The smallest loop-free alpha of alpha-greedy at one demand (the scan runs only in the full
    version)."""
    if scan is None:
        return Row(f"{d.label} demand: smallest loop-free alpha (alpha-greedy)", fmt(d.paper_alpha), "-",
                   not_comparable("loop scan runs only in the full version"))
    a = scan["smallest_loop_free_alpha"]
    looping = scan["looping"]
    verdict = (not_comparable("no alpha loops at this rate (the memory never fills), so there is no "
                              "threshold to compare") if not looping else
               ordering_verdict(a is not None and abs(a - d.paper_alpha) <= 0.03)
               + ("" if a is not None and abs(a - d.paper_alpha) <= 0.03 else
                  ": where clear-all starts to loop depends on how close the protected admissions fill "
                  "M, i.e. on the length distribution and batch timing, which are ours"))
    return Row(f"{d.label} demand: smallest loop-free alpha (alpha-greedy, grid 0.01, N = {scan['n_requests']})",
               fmt(d.paper_alpha), f"{a} (looping: {looping[0]}..{looping[-1]})" if looping else f"{a}",
               verdict)


def _optimum_rows(quick: bool) -> list[Row]:
    """The optimum references: the IP against exhaustive search, MC-SF's ratio to the optimum on
    random small instances and on the Thm 6.2 instances, and the Thm 6.2 bound itself."""
    from llmsched_gym.reproduce.adversarial import adversarial_ratio_lower_bound

    rows = []
    agree, total = ip_vs_exhaustive(10 if quick else 50)
    rows.append(Row("IP (Appendix B.1, linearised) equals exhaustive search on random tiny instances", "exact (ours)",
                    f"{agree}/{total}", ordering_verdict(agree == total)))
    if missing_policies(["mcsf"]):
        rows.append(Row("MC-SF ratio to the hindsight optimum", "about 1.005-1.05 (later versions)", "-",
                        not_comparable("policy mcsf not available")))
    else:
        r = mcsf_ratios(10 if quick else 60)
        rows.append(Row("MC-SF TEL / OPT on random small online instances (n = 8, M = 20; exact OPT by the IP)",
                        "about 1.047 online, 1.005 all-at-once (later versions, not this seed)",
                        f"mean {np.mean(r):.4f}, max {np.max(r):.4f}, min {np.min(r):.4f} over {len(r)} instances",
                        not_comparable("the later version's instances are larger (not solvable exactly here); ours "
                                       "are random tiny ones") if np.mean(r) > 1.05 else
                        ordering_verdict(min(r) >= 1)))
        eps, Ms = 0.1, [160, 320, 640, 1280, 2560]
        ar = adversarial_mcsf_ratios(eps, Ms)
        lbs = [adversarial_ratio_lower_bound(M, eps) for M in Ms]
        rows.append(Row(f"Thm 6.2 instances (eps = {eps}): MC-SF's ratio grows with M towards 1/eps "
                        "(ours: MC-SF TEL / TEL of the offline strategy A3, a lower bound on its ratio to OPT)",
                        "CR >= min(A1, A2) / A3 -> 1/eps = 10; " + ", ".join(f"{b:.3g}" for b in lbs),
                        ", ".join(f"M={M}: {x:.3g}" for M, x in zip(Ms, ar, strict=True)),
                        ordering_verdict(all(x < y for x, y in zip(ar, ar[1:], strict=False))
                                         and all(x >= b for x, b in zip(ar, lbs, strict=True)))))
    eps = 0.1
    big = (100, 1000, 10000, 100000)
    lbs = [adversarial_ratio_lower_bound(M, eps) for M in big]
    rows.append(Row(f"Thm 6.2: the bound min(A1, A2) / A3 itself grows to 1/eps (eps = {eps})", "-> 10",
                    ", ".join(f"M={M}: {b:.3g}" for M, b in zip(big, lbs, strict=True)),
                    ordering_verdict(all(x < y for x, y in zip(lbs, lbs[1:], strict=False)) and lbs[-1] > 9)))
    return rows


def run(quick: bool = False) -> PaperReport:
    """Jaillet et al. 2025: Figure 5 slopes and ratios, smallest loop-free alpha, alpha/beta sweeps,
    optimum references and the Thm 6.2 instances."""
    rows: list[Row] = []
    plots: list[Plot] = []
    notes = [f"The batch times are {get_scenario('jaillet-high')['latency']} (Llama-2-70B on 2xA100: our "
             "offline stand-in of the profile model built on Vidur's A100 measurements at TP 2, where the paper ran "
             "Vidur itself), and the lengths are lognormal fits of the LMSYS mean/median, so absolute slopes differ (and the paper's own "
             "1/6 s per arrival contradicts its 200 s claim, erratum E6): the slope ratios and orderings are "
             "compared."]
    missing = missing_policies(["mcsf", "alpha-greedy", "alpha-beta"])
    n_values = [1000, 2000, 3000] if quick else [1000, 2000, 4000, 6000, 8000, 10000]
    seeds = [0] if quick else [0, 1, 2]
    for d in DEMANDS:
        if d.note:
            notes.append(f"{d.label} demand (lambda = {d.rate:g}): {d.note}.")
        if missing:
            reason = not_comparable(f"policy {missing[0]} not available")
            rows.append(Row(f"{d.label} demand: best benchmark slope / MC-SF slope", d.paper_ratio, "-", reason))
            continue
        sw = run_sweep(d.rate, n_values, seeds, quick=quick)
        demand_rows, plot = _figure5_rows(d, sw, n_values)
        rows += demand_rows
        plots.append(plot)
        rows.append(_loop_scan_row(d, sw["loop_scan"]))
        if not quick and d.rate != 10.0:
            rows += _sweep_rows(d, param_sweeps(d.rate, n_values[-1], seeds[0]))
    rows += _optimum_rows(quick)
    return PaperReport("jaillet", "MC-SF (Jaillet et al. 2025)", rows, plots, notes,
                       config=f"jaillet-high / jaillet-low (and lambda = 20), N = {n_values}, seeds {seeds}"
                       + ("" if quick else f"; alpha/beta sweeps at N = {n_values[-1]}, seed {seeds[0]}"))
