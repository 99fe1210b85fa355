"""Echo (Wang et al. 2025: co-scheduling online and offline LLM tasks) reproduction: offline throughput
normalised to BS with online SLO attainment (Figs 6-7), the diagnostics of Figs 8-10 and the
resource-planning procedure of section 5.4 (with the results of section 7.2 as sanity checks) on
``echo-hybrid``.

Published: Echo up to 3.3x BS in offline throughput (dataset unstated); BS+E slightly below 1;
Echo > BS+E+S > BS+E; every SLO-aware strategy meets the 90% online SLO; BS has the lowest TTFT;
Echo's prefix hit rate 78.6% on LooGLE QA Short; active offline requests move opposite to online
ones; running tasks hold more than 50% of the memory in most iterations. Section 5.4 gives a
procedure (resources for the peak window, then offline throughput) but no number.

Configurations: the scenario's defaults in the full version (40,000 offline requests submitted at
t = 0, 600 s, 150K KV tokens; the offline pool never drains); the quick version stops
at 150 s with an 8,000-request pool, which does not drain either (checked in the report). At
150K tokens Echo's KV use stays far below the capacity, so its two memory mechanisms (the
task-aware eviction order and the predictor's KV threshold) never act and Echo equals BS+E+S;
the "Echo > BS+E+S" ordering is therefore tested in a memory-bound configuration,
``engine.kv_capacity_tokens = 25,000``: capacity / offline prompt is about 6 there, as for LooGLE's
23.5K-token prompts in the paper's ~150K tokens.

Departures: the online trace is synthetic (diurnal, time-compressed to 10 minutes; the real trace
is not public) and the offline pool is the scenario's system-prompt groups (4,096-token shared
heads), not LooGLE, so the 3.3x and 78.6% are reported next to ours as "not comparable" and the
orderings are judged. The hit rate here is hit tokens / prompt tokens looked up by offline
admissions (re-admissions after a preemption included), not the summary's ``prefix_hit_rate``,
whose denominator counts the prompts of the never-started pool. The "resource" of section 5.4 is
the KV capacity (the paper leaves the unit open).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmsched_gym.core.scenarios import get_scenario
from llmsched_gym.reproduce.report import (
    PaperReport,
    Row,
    missing_policies,
    not_comparable,
    ordering_verdict,
)
from llmsched_gym.sim import SimResult, simulate

POLICIES = ("echo-bs", "echo-bs-e", "echo-bs-e-s", "echo")
LABELS = {"echo-bs": "BS", "echo-bs-e": "BS+E", "echo-bs-e-s": "BS+E+S", "echo": "Echo"}
ECHO_EVICTION_ONLY: dict[str, Any] = {"name": "echo", "k_sigma": 0.0}
"""Echo's task-aware eviction with the KV threshold reduced to ``mu - U_on`` (ablation)."""

MEMORY_BOUND_KV = 25_000
"""KV tokens of the memory-bound configuration (capacity / offline prompt about 6, as LooGLE's)."""

QUICK_HORIZON_S, QUICK_POOL = 150.0, 8_000
PLAN_GRID = (6_000, 8_000, 10_000, 12_000, 16_000, 24_000, 32_000, 48_000, 64_000, 100_000, 150_000)
"""KV capacities (the "resource levels") scanned by the section 5.4 planner, smallest first."""


def scenario(quick: bool, kv_tokens: int | None = None) -> dict[str, Any]:
    """``echo-hybrid`` as the report runs it (scenario defaults unless ``quick``)."""
    ov: dict[str, Any] = {}
    if quick:
        ov = {"workload.horizon_s": QUICK_HORIZON_S, "engine.horizon_s": QUICK_HORIZON_S,
              "workload.classes.offline.n_requests": QUICK_POOL}
    if kv_tokens is not None:
        ov["engine.kv_capacity_tokens"] = kv_tokens
    return get_scenario("echo-hybrid", ov)


def measure(result: SimResult) -> dict[str, float]:
    """The numbers the report compares, from one run."""
    s, req, it = result.summary, result.requests, result.iterations
    online = req["task_class"] == 0
    offline = ~online
    first = np.isfinite(req["first_token_s"]) & online
    started = np.isfinite(req["first_scheduled_s"]) & offline
    looked_up = (req["prompt_tokens"][started] * (1 + req["preemptions"][started])).sum()
    # active requests over time (admitted and unfinished; preemptions ignored), 100 points
    end = float(s["sim_time_s"])
    grid = np.linspace(0.0, end, 101)[1:-1]
    done = np.where(np.isfinite(req["completion_s"]), req["completion_s"], np.inf)
    sched = np.where(np.isfinite(req["first_scheduled_s"]), req["first_scheduled_s"], np.inf)

    def active(mask: np.ndarray) -> np.ndarray:
        return ((sched[mask][None, :] <= grid[:, None]) & (done[mask][None, :] > grid[:, None])).sum(axis=1)

    act_on, act_off = active(online), active(offline)
    corr = float(np.corrcoef(act_on, act_off)[0, 1]) if act_on.std() > 0 and act_off.std() > 0 else float("nan")
    return {
        "offline_tps": float(s["by_class"]["offline"]["throughput_tokens_per_s"]),
        "slo": float(s["by_class"]["online"]["slo_attainment"]),
        "p99_ttft": float(np.percentile(req["ttft_s"][first], 99)),
        "hit": float(req["cached_tokens"][started].sum() / looked_up) if looked_up else float("nan"),
        "preemptions": float(s["preemptions"]),
        "recomputed": float(s["recomputed_tokens"]),
        "kv_peak": float(s["kv_peak_frac"]),
        "mem_over_half": float(np.mean(it["kv_used"] / it["kv_capacity"] > 0.5)),
        "active_corr": corr,
        "pool_left": float(np.count_nonzero(offline & ~np.isfinite(req["first_scheduled_s"]))),
        "mean_iter_s": float(np.mean(it["duration"])),
        "busy": float(s["busy_frac"]),
    }


def plan_resources() -> tuple[int | None, dict[int, float]]:
    """Section 5.4 step 1: online-only serving of the 5-minute peak window (the diurnal trace
    re-centred on its peak) at growing KV capacities; the first that meets the 90% SLO."""
    seen: dict[int, float] = {}
    for kv in PLAN_GRID:
        spec = get_scenario("echo-hybrid", {
            "workload.classes.offline.n_requests": 0, "workload.horizon_s": 300.0, "engine.horizon_s": 300.0,
            "workload.arrival.peak_s": 150.0, "engine.kv_capacity_tokens": kv})
        seen[kv] = float(simulate(spec, "echo", 0).summary["by_class"]["online"]["slo_attainment"])
        if seen[kv] >= 0.9:
            return kv, seen
    return None, seen


def _table(m: dict[str, dict[str, float]], key: str, f: str, labels: dict[str, str] = LABELS) -> str:
    return ", ".join(f"{labels.get(p, p)} {format(v[key], f)}" for p, v in m.items())


def _throughput_rows(m: dict[str, dict[str, float]], mb: dict[str, dict[str, float]],
                     mb_evict: dict[str, float]) -> list[Row]:
    """Fig. 6's offline throughput normalised to BS and its orderings, at the default capacity
    (``m``) and memory-bound (``mb``; ``mb_evict``: Echo's eviction order alone)."""
    rows: list[Row] = []
    off = {p: v["offline_tps"] for p, v in m.items()}
    norm = {p: off[p] / off["echo-bs"] for p in POLICIES}
    rows.append(Row("Offline throughput Echo / BS (Fig. 6, best case), with online SLO attainment",
                    "up to 3.3x; SLO-aware variants >= 90%",
                    f"{norm['echo']:.3g}x ({', '.join(f'{LABELS[p]} {norm[p]:.3g}x' for p in POLICIES)}; "
                    f"{off['echo']:.4g} vs {off['echo-bs']:.4g} offline tokens/s); online SLO attainment "
                    f"{_table(m, 'slo', '.1%')}",
                    not_comparable("synthetic online trace and system-prompt offline pool (not LooGLE; the paper "
                                   "does not say which dataset gives 3.3x); same order of magnitude, orderings "
                                   "below")))
    rows.append(Row("BS+E slightly below BS in offline throughput (SLO gating idles the GPU)", "< 1 (slightly)",
                    f"{norm['echo-bs-e']:.3g}x (memory-bound {mb['echo-bs-e']['offline_tps'] / mb['echo-bs']['offline_tps']:.3g}x)",
                    ordering_verdict(norm["echo-bs-e"] < 1.0)
                    + ("" if norm["echo-bs-e"] < 1.0 else
                       f": the gate does not idle the GPU here (busy {m['echo-bs-e']['busy']:.1%} vs BS "
                       f"{m['echo-bs']['busy']:.1%}): some pooled offline request always fits the time budget, and "
                       f"both fill the KV and thrash the LRU prefix cache (hit rate {m['echo-bs']['hit']:.1%} / "
                       f"{m['echo-bs-e']['hit']:.1%})")))
    rows.append(Row("BS+E+S > BS+E in offline throughput (prefix-aware selection)", "ordering",
                    f"{off['echo-bs-e-s']:.4g} vs {off['echo-bs-e']:.4g} tokens/s (hit rate "
                    f"{m['echo-bs-e-s']['hit']:.1%} vs {m['echo-bs-e']['hit']:.1%})",
                    ordering_verdict(off["echo-bs-e-s"] > off["echo-bs-e"])))
    same = off["echo"] == off["echo-bs-e-s"]
    rows.append(Row("Echo > BS+E+S in offline throughput, default capacity (150K tokens)", "ordering",
                    f"{off['echo']:.4g} vs {off['echo-bs-e-s']:.4g} tokens/s (Echo's peak KV use "
                    f"{m['echo']['kv_peak']:.0%})",
                    not_comparable("KV memory never binds here, so Echo's eviction order and KV threshold never "
                                   "act and the runs are identical; tested in the memory-bound row below")
                    if same else ordering_verdict(off["echo"] > off["echo-bs-e-s"])))
    e, s3 = mb["echo"], mb["echo-bs-e-s"]
    rows.append(Row(f"Echo > BS+E+S in offline throughput, memory-bound ({MEMORY_BOUND_KV:,} KV tokens)",
                    "ordering (task-aware KV manager)",
                    f"{e['offline_tps']:.4g} vs {s3['offline_tps']:.4g} tokens/s ({e['offline_tps'] / s3['offline_tps']:.3f}x); "
                    f"preemptions {e['preemptions']:.0f} vs {s3['preemptions']:.0f}, recomputed tokens "
                    f"{e['recomputed']:.3g} vs {s3['recomputed']:.3g}; eviction order alone (k_sigma = 0) "
                    f"{mb_evict['offline_tps']:.4g} tokens/s; Echo / BS {e['offline_tps'] / mb['echo-bs']['offline_tps']:.3g}x",
                    ordering_verdict(e["offline_tps"] > s3["offline_tps"])
                    + ("" if e["offline_tps"] > s3["offline_tps"] else
                       ": the KV threshold cuts offline preemptions but the memory it reserves for online bursts "
                       "costs more than the recomputation it saves (a preempted offline request loses only its "
                       "own tokens; the shared 4,096-token head stays cached); the eviction order alone gives "
                       f"{mb_evict['offline_tps'] / s3['offline_tps']:.3f}x BS+E+S, as the radix-order scheduler "
                       "mostly keeps the running group's head in use, so few needed heads are idle when eviction happens")))
    return rows


def _latency_rows(m: dict[str, dict[str, float]], mb: dict[str, dict[str, float]]) -> list[Row]:
    """The online SLO attainment of the SLO-aware strategies and BS's lowest TTFT."""
    rows: list[Row] = []
    slo_ok = all(v[p]["slo"] >= 0.9 for v in (m, mb) for p in POLICIES[1:])
    rows.append(Row("SLO-aware strategies (BS+E, BS+E+S, Echo) meet the online SLO (>= 90%; TTFT 1 s, TPOT 0.05 s)",
                    ">= 90%", f"default: {_table({p: m[p] for p in POLICIES[1:]}, 'slo', '.1%')}; memory-bound: "
                    f"{_table({p: mb[p] for p in POLICIES[1:]}, 'slo', '.1%')} (BS {m['echo-bs']['slo']:.1%} / "
                    f"{mb['echo-bs']['slo']:.1%})", ordering_verdict(slo_ok)))
    bs_lowest = all(v["echo-bs"]["p99_ttft"] <= min(x["p99_ttft"] for x in v.values()) for v in (m, mb))
    rows.append(Row("BS has the lowest online TTFT (online always admitted, regardless of SLO)", "ordering",
                    f"p99 TTFT default: {_table(m, 'p99_ttft', '.3g')} s; memory-bound: {_table(mb, 'p99_ttft', '.3g')} s",
                    ordering_verdict(bs_lowest)
                    + ("" if bs_lowest else
                       ": our Echo family admits online requests FCFS without the SLO gate in every variant "
                       "(baselines/echo.py departure), so the paper's cause never applies; BS's ungated offline "
                       f"prefills make its iterations longer (mean {m['echo-bs']['mean_iter_s'] * 1e3:.3g} ms vs "
                       f"Echo {m['echo']['mean_iter_s'] * 1e3:.3g} ms) and its full KV makes online requests wait "
                       "for preemptions")))
    return rows


def _diagnostic_rows(m: dict[str, dict[str, float]], mb: dict[str, dict[str, float]]) -> list[Row]:
    """Figs 8-10: the prefix hit rate, active offline vs online requests, the memory held."""
    rows: list[Row] = []
    e = mb["echo"]
    rows.append(Row("Echo prefix hit rate (LooGLE QA Short)", "78.6%",
                    f"{m['echo']['hit']:.1%} (offline admissions; memory-bound {e['hit']:.1%}; BS "
                    f"{m['echo-bs']['hit']:.1%})",
                    not_comparable("offline pool is synthetic system-prompt groups, not LooGLE")))
    corr = m["echo"]["active_corr"]
    rows.append(Row("Active offline requests move opposite to active online requests under Echo (Fig. 8)",
                    "opposite (no number)", f"correlation over time {corr:.2f} (memory-bound {e['active_corr']:.2f})",
                    ordering_verdict(corr < 0)))
    rows.append(Row("Running tasks hold more than 50% of the memory in most iterations under Echo (Fig. 10)",
                    "most iterations", f"memory-bound: {e['mem_over_half']:.0%} of iterations; default capacity: "
                    f"{m['echo']['mem_over_half']:.0%} (peak {m['echo']['kv_peak']:.0%})",
                    ordering_verdict(e["mem_over_half"] > 0.5)
                    + ("" if m["echo"]["mem_over_half"] > 0.5 else
                       " in the memory-bound configuration (LooGLE-like pressure); at 150K tokens our "
                       "4.1-4.4K-token offline prompts cannot fill the memory under the SLO gate")))
    return rows


def _planning_row(quick: bool) -> Row:
    """Section 5.4's resource planning: the smallest KV capacity meeting the online SLO on the peak
    window, then Echo's offline throughput with it."""
    kv, seen = plan_resources()
    plan_txt = ", ".join(f"{k // 1000}K {v:.1%}" for k, v in seen.items())
    if kv is None:
        return Row("Resource planning (section 5.4): KV capacity for the 5-minute peak window, online only",
                   "procedure only (no number)", f"no level up to {PLAN_GRID[-1]:,} meets 90% ({plan_txt})",
                   not_comparable("the paper reports no number"))
    at = measure(simulate(scenario(quick, kv), "echo", 0))
    return Row("Resource planning (section 5.4): smallest KV capacity meeting the 90% online SLO on the "
               "5-minute peak window, then Echo's offline throughput with it", "procedure only (no number)",
               f"{kv:,} tokens (online-only attainment {plan_txt}); Echo at {kv:,}: offline "
               f"{at['offline_tps']:.4g} tokens/s, online SLO {at['slo']:.1%}",
               not_comparable("the paper reports no number; ours shows the procedure runs end to end"))


def run(quick: bool = False) -> PaperReport:
    """The Echo report: throughput, latency and diagnostic rows at the default capacity and
    memory-bound, and the resource-planning row."""
    missing = missing_policies(list(POLICIES))
    if missing:
        return PaperReport("echo", "Echo (Wang et al. 2025)", [
            Row("Offline throughput Echo / BS (Fig. 6)", "up to 3.3x", "-",
                not_comparable(f"policy {missing[0]} not available"))])
    spec = scenario(quick)
    horizon = float(spec["engine"]["horizon_s"])
    pool = int(spec["workload"]["classes"]["offline"]["n_requests"])
    m = {p: measure(simulate(spec, p, 0)) for p in POLICIES}
    mb_spec = scenario(quick, MEMORY_BOUND_KV)
    mb = {p: measure(simulate(mb_spec, p, 0)) for p in POLICIES}
    mb_evict = measure(simulate(mb_spec, ECHO_EVICTION_ONLY, 0))
    rows = (_throughput_rows(m, mb, mb_evict) + _latency_rows(m, mb) + _diagnostic_rows(m, mb)
            + [_planning_row(quick)])
    pool_left = min(v[p]["pool_left"] for v in (m, mb) for p in POLICIES)
    return PaperReport(
        "echo", "Echo (Wang et al. 2025)", rows,
        notes=[f"echo-hybrid, {horizon:g} s, {pool:,} offline requests submitted at t = 0, seed 0; memory-bound: "
               f"the same with engine.kv_capacity_tokens = {MEMORY_BOUND_KV:,}. Offline throughput is output tokens "
               "of completed offline requests per second.",
               f"The offline pool never drained: at the end at least {pool_left:,.0f} offline requests had never "
               "started in every run.",
               "Hit rate: cached prompt tokens / prompt tokens looked up by offline admissions (re-admissions "
               "included). Active-request correlation: Pearson over 99 instants of the admitted, unfinished "
               "online and offline requests.",
               "Resource planning: online-only echo-hybrid over 300 s with the diurnal peak in the middle (the "
               "5-minute peak window), KV capacity as the resource (the paper leaves the unit open)."],
        config=f"echo-hybrid, horizon {horizon:g} s, offline pool {pool:,}; memory-bound: {MEMORY_BOUND_KV:,} KV tokens")
