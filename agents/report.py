"""Comparison runs and their report: policies on the same seeded workloads, means with 95% CIs.

One :class:`RunRecord` per (policy, load level, seed) keeps the summary JSON plus what the plots
need (per-request E2E/TTFT, KV usage over time). :func:`aggregate` turns records into means and
t-distribution 95% confidence intervals; :func:`write_report` writes ``report.md``,
``results.json``, ``results.csv`` and the PNG plots (matplotlib, Agg backend) into one folder.

Baselines run through :func:`llmsched_gym.sim.simulate` exactly as ``llmsched run`` does, so the
numbers of a baseline here equal ``llmsched run --policy P --seed S`` for the same settings.
"""

from __future__ import annotations

import copy
import csv
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from llmsched_gym.config import ConfigError
from llmsched_gym.parallel import Cell, Settings, run_cells

# (key, label, getter, lower is better)
METRICS: list[tuple[str, str, Callable[[dict], float], bool]] = [
    # names and units as `vllm bench serve` prints them (the summary's "serving" block)
    ("mean_e2el_ms", "Mean E2EL (ms)", lambda s: s["serving"]["mean_e2el_ms"], True),
    ("p99_e2el_ms", "P99 E2EL (ms)", lambda s: s["serving"]["p99_e2el_ms"], True),
    ("mean_ttft_ms", "Mean TTFT (ms)", lambda s: s["serving"]["mean_ttft_ms"], True),
    ("p99_ttft_ms", "P99 TTFT (ms)", lambda s: s["serving"]["p99_ttft_ms"], True),
    ("mean_tpot_ms", "Mean TPOT (ms)", lambda s: s["serving"]["mean_tpot_ms"], True),
    ("mean_itl_ms", "Mean ITL (ms)", lambda s: s["serving"]["mean_itl_ms"], True),
    ("output_throughput", "Output token throughput (tok/s)", lambda s: s["serving"]["output_throughput"], False),
    ("completed_frac", "completed", lambda s: s["n_completed"] / max(1, s["n_arrived"]), False),
    ("preemptions", "evictions", lambda s: float(s["preemptions"]), True),
    ("recomputed_tokens", "recomputed tok", lambda s: float(s["recomputed_tokens"]), True),
    ("slo_attainment", "SLO attain.", lambda s: s.get("slo_attainment", math.nan), False),
    ("request_goodput", "Request goodput (req/s)", lambda s: s["serving"].get("request_goodput", math.nan), False),
]
METRIC_KEYS = [m[0] for m in METRICS]
COMPLETE_FRAC = 0.99


@dataclass
class RunRecord:
    """One policy on one seeded workload at one load level."""

    policy: str
    seed: int
    load: float
    summary: dict[str, Any]
    e2e_s: np.ndarray = field(repr=False)
    ttft_s: np.ndarray = field(repr=False)
    t_s: np.ndarray = field(repr=False)
    kv_frac: np.ndarray = field(repr=False)

    def metrics(self) -> dict[str, float]:
        return {k: float(get(self.summary)) for k, _, get, _ in METRICS}


MAX_SEEDS = 10_000
"""Most workload seeds one evaluation takes (each is one episode per policy and load)."""


def parse_seeds(text: str) -> list[int]:
    """``"0-4"`` -> [0, 1, 2, 3, 4]; ``"1,5,7-8"`` -> [1, 5, 7, 8]."""
    seeds: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            lo, _, hi = part.partition("-")
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise ConfigError(f"seeds: {text!r} is not a list like 0-4 or 1,3,5") from None
        if not (0 <= first <= last < 2**63) or len(seeds) + last - first + 1 > MAX_SEEDS:
            raise ConfigError(f"seeds: {text!r} names {'more than ' + format(MAX_SEEDS, ',') if first <= last else 'no'} "
                              f"seeds; give at most {MAX_SEEDS:,} seeds in [0, 2^63), each range low-high")
        seeds.extend(range(first, last + 1))
    if not seeds:
        raise ConfigError(f"seeds: {text!r} names no seed")
    return seeds


def scenario_spec(scenario: str | dict, overrides: dict[str, Any] | None = None, load: float = 1.0) -> dict:
    """The scenario dict with ``overrides`` applied and the arrival rate scaled by ``load``."""
    from llmsched_gym.core.scenarios import get_scenario

    # a copy: the load scaling below must not compound over the cells of a sweep
    spec = get_scenario(scenario, overrides) if isinstance(scenario, str) else copy.deepcopy(scenario)
    if load != 1.0:
        arrival = spec.get("workload", {}).get("arrival")
        key = next((k for k in ("rate", "mean_rate") if isinstance(arrival, dict) and k in arrival), None)
        if key is None:
            raise ConfigError(f"loads: scenario {spec.get('name')!r} has no workload.arrival.rate to scale")
        arrival[key] = float(arrival[key]) * load
    return spec


def spec_for_policy(spec: dict, name: str) -> dict:
    """``spec`` for running policy ``name``: the scenario's default-policy parameters (e.g. the
    jaillet scenarios' ``fcfs`` with ``admission=reserve``) apply only to that policy."""
    pol = spec.get("policy")
    if isinstance(pol, dict) and pol.get("name") not in (None, name):
        spec = {**spec, "policy": pol["name"]}
    return spec


def record_from_result(name: str, seed: int, load: float, summary: dict, requests: dict, iterations: dict) -> RunRecord:
    cap = max(1, int(summary.get("kv_capacity_tokens", 1)))
    t = np.asarray(iterations.get("t_start", np.empty(0)), dtype=float)
    kv = np.asarray(iterations.get("kv_used", np.empty(0)), dtype=float) / cap
    e2e = np.asarray(requests.get("e2e_s", np.empty(0)), dtype=float)
    ttft = np.asarray(requests.get("ttft_s", np.empty(0)), dtype=float)
    return RunRecord(name, seed, load, summary, e2e[np.isfinite(e2e)], ttft[np.isfinite(ttft)], t, kv)


def run_baseline(spec: dict, name: str, seed: int, load: float = 1.0,
                 policy_params: dict[str, Any] | None = None) -> RunRecord:
    """Simulate baseline ``name`` on ``spec`` with ``seed`` (the same call ``llmsched run`` makes);
    ``name`` may carry parameters (``sarathi:chunk_size=256``, :func:`baselines.parse_spec`), which
    take precedence over ``policy_params``."""
    from baselines import parse_spec
    from llmsched_gym.sim import simulate

    parsed = parse_spec(name)
    base, own = (parsed, {}) if isinstance(parsed, str) else (parsed["name"], {k: v for k, v in parsed.items()
                                                                                if k != "name"})
    res = simulate(spec_for_policy(spec, base), base, seed, None, {**(policy_params or {}), **own} or None)
    return record_from_result(name, seed, load, res.summary, res.requests, res.iterations)


def params_for(name: str, policy_params: dict[str, Any]) -> dict[str, Any]:
    """The ``--set policy.X`` values that policy ``name`` accepts (the others are for other policies)."""
    import baselines

    accepted = baselines.policy_params(name) if name in baselines.available() else {}
    return {k: v for k, v in policy_params.items() if k in accepted}


def baseline_cell(args: tuple) -> RunRecord:
    """One sweep cell: ``(scenario, name, seed, load, overrides, policy_params)`` -> its record."""
    scenario, name, seed, load, overrides, params = args
    return run_baseline(scenario_spec(scenario, overrides, load), name, seed, load, params)


def run_baselines(scenario: str | dict, names: Iterable[str], seeds: list[int], loads: list[float],
                  overrides: dict[str, Any] | None = None, policy_params: dict[str, Any] | None = None,
                  settings: Settings | None = None) -> tuple[list[RunRecord], dict[str, str]]:
    """Every baseline in ``names`` on every (load, seed), one sweep cell each (``settings``: jobs,
    backend, progress bar; see :mod:`llmsched_gym.parallel`). A baseline that refuses the scenario
    (a PolicyError, or any error of a policy that cannot run it) is skipped with its reason, the
    first failing cell's error; the records keep the serial order (load, name, seed)."""
    cells = [Cell(f"{name} seed {seed} load {load:g}",
                  (scenario, name, seed, load, overrides, params_for(name, policy_params or {})))
             for load in loads for name in names for seed in seeds]
    outcomes = run_cells(cells, baseline_cell, settings, label="baselines")
    skipped: dict[str, str] = {}
    for cell, o in zip(cells, outcomes, strict=True):
        if not o.ok:
            skipped.setdefault(cell.args[1], o.error or "")
    return [o.value for c, o in zip(cells, outcomes, strict=True) if o.ok and c.args[1] not in skipped], skipped


def mean_ci(x: Iterable[float]) -> tuple[float, float, int]:
    """Mean and the half-width of its 95% t-interval (nan with fewer than 2 finite values)."""
    from scipy import stats

    a = np.asarray([v for v in x if np.isfinite(v)], dtype=float)
    n = len(a)
    if n == 0:
        return math.nan, math.nan, 0
    if n == 1:
        return float(a[0]), math.nan, 1
    half = float(stats.t.ppf(0.975, n - 1) * a.std(ddof=1) / math.sqrt(n))
    return float(a.mean()), half, n


def aggregate(records: list[RunRecord]) -> dict[float, dict[str, dict[str, dict[str, float]]]]:
    """``{load: {policy: {metric: {"mean", "ci95", "n"}}}}`` over seeds."""
    out: dict[float, dict[str, dict[str, dict[str, float]]]] = {}
    groups: dict[tuple[float, str], list[RunRecord]] = {}
    for r in records:
        groups.setdefault((r.load, r.policy), []).append(r)
    for (load, pol), recs in groups.items():
        ms = [r.metrics() for r in recs]
        out.setdefault(load, {})[pol] = {
            k: dict(zip(("mean", "ci95", "n"), mean_ci(m[k] for m in ms), strict=True)) for k in METRIC_KEYS
        }
    return out


def _table_order(per: dict, policy: str, agents: Iterable[str]) -> tuple:
    """Agents first, then by mean E2E, policies that left requests incomplete last."""
    return (policy not in agents, per[policy]["completed_frac"]["mean"] < COMPLETE_FRAC,
            per[policy]["mean_e2el_ms"]["mean"])


def best_policy(agg_load: dict[str, dict[str, dict[str, float]]], metric: str, exclude: Iterable[str] = ()) -> str | None:
    """The policy with the best mean ``metric`` at one load level (ties: the first). Latencies
    cover completed requests only, so a policy that completes less than ``COMPLETE_FRAC`` of the
    requests (e.g. one that rejects them) is not eligible."""
    lower = next(m[3] for m in METRICS if m[0] == metric)
    cands = [(v[metric]["mean"], p) for p, v in agg_load.items()
             if p not in set(exclude) and np.isfinite(v[metric]["mean"])
             and v["completed_frac"]["mean"] >= COMPLETE_FRAC]
    if not cands:
        return None
    return (min if lower else max)(cands)[1]


def _cell(v: dict[str, float], key: str) -> str:
    m, h = v["mean"], v["ci95"]
    if not np.isfinite(m):
        return "-"
    digits = 0 if key in ("preemptions", "recomputed_tokens", "output_throughput") else 1 if key.endswith("_ms") else 3
    if not np.isfinite(h):
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ± {h:.{digits}f}"


def visible_metrics(agg: dict) -> list[tuple[str, str]]:
    """Metric columns that have a value for at least one policy (SLO attainment needs SLOs)."""
    cols = []
    for key, label, _, _ in METRICS:
        if any(np.isfinite(v[key]["mean"]) for per in agg.values() for v in per.values()):
            cols.append((key, label))
    return cols


def identical_groups(records: list[RunRecord]) -> dict[tuple[float, str], str]:
    """``(load, policy) -> the first policy`` whose per-seed metrics are identical to it (the same
    decisions on these workloads, e.g. SJF and MC-SF while memory never binds)."""
    by: dict[tuple[float, str], list[tuple]] = {}
    for r in sorted(records, key=lambda r: r.seed):
        by.setdefault((r.load, r.policy), []).append(tuple(sorted(r.metrics().items())))
    first: dict[tuple, str] = {}
    out: dict[tuple[float, str], str] = {}
    for (load, pol), key in by.items():
        k = (load, tuple(key))
        if k in first:
            out[(load, pol)] = first[k]
        else:
            first[k] = pol
    return out


def markdown_tables(agg: dict, agents: Iterable[str] = (), same: dict[tuple[float, str], str] | None = None) -> str:
    """One markdown table per load level; the best mean per column is bold (not when several tie).
    ``same``: policies identical to another on every seed (:func:`identical_groups`), marked ``(= X)``."""
    agents = set(agents)
    same = same or {}
    cols = visible_metrics(agg)
    lines: list[str] = []
    for load in sorted(agg):
        per = agg[load]
        lines += [f"### load x{load:g}", "", "| policy | " + " | ".join(lbl for _, lbl in cols) + " |",
                  "|---|" + "---:|" * len(cols)]
        best = {k: best_policy(per, k) for k, _ in cols}
        order = sorted(per, key=lambda p: _table_order(per, p, agents))
        for p in order:
            cells = []
            for k, _ in cols:
                c = _cell(per[p][k], k)
                b = best[k]
                tied = b is not None and sum(_cell(per[q][k], k) == _cell(per[b][k], k) for q in per) > 1
                cells.append(f"**{c}**" if b == p and not tied else c)
            name = f"**{p}** (agent)" if p in agents else p
            if per[p]["completed_frac"]["mean"] < COMPLETE_FRAC:
                name += " †"
            if (load, p) in same:
                name += f" (= {same[(load, p)]})"
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def agent_vs_best(agg: dict, agents: Iterable[str], metrics: Iterable[str] = ("mean_e2el_ms", "p99_ttft_ms")) -> list[str]:
    """Lines such as ``load x1: ppo Mean E2EL 15200 vs best baseline mcsf 15800 (-3.8%)``."""
    agents = list(agents)
    out = []
    for load in sorted(agg):
        per = agg[load]
        for a in agents:
            if a not in per:
                continue
            for m in metrics:
                b = best_policy(per, m, exclude=agents)
                if b is None:
                    continue
                va, vb = per[a][m]["mean"], per[b][m]["mean"]
                rel = 100.0 * (va - vb) / vb if vb else math.nan
                out.append(f"load x{load:g}: {a} {m} {va:.4g} vs best baseline {b} {vb:.4g} ({rel:+.1f}%)")
    return out


def paired_vs_baselines(records: list[RunRecord], agg: dict, agent: str, metric: str = "mean_e2el_ms",
                        top: int = 5, exclude: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The agent against the ``top`` best complete baselines (by mean ``metric``; ``exclude``: other
    agents), paired by seed: per baseline the mean relative difference ``(agent - baseline) /
    baseline`` over the seeds with its 95% t-interval, and a verdict (better, worse, or a tie when
    the interval includes 0)."""
    lower = next(m[3] for m in METRICS if m[0] == metric)
    skip = {agent, *exclude}
    out = []
    for load in sorted(agg):
        per = agg[load]
        if agent not in per:
            continue
        mine = {r.seed: r.metrics()[metric] for r in records if r.policy == agent and r.load == load}
        base = [p for p in per if p not in skip and per[p]["completed_frac"]["mean"] >= COMPLETE_FRAC
                and np.isfinite(per[p][metric]["mean"])]
        base.sort(key=lambda p: per[p][metric]["mean"] if lower else -per[p][metric]["mean"])
        for b in base[:top]:
            theirs = {r.seed: r.metrics()[metric] for r in records if r.policy == b and r.load == load}
            rel = [(mine[s] - theirs[s]) / theirs[s] for s in mine if s in theirs and theirs[s]]
            m, h, n = mean_ci(rel)
            better = (m < 0) if lower else (m > 0)
            verdict = ("better" if better else "worse") if np.isfinite(h) and abs(m) > h else "tie (CI includes 0)"
            out.append({"load": load, "baseline": b, "baseline_mean": per[b][metric]["mean"],
                        "agent_mean": per[agent][metric]["mean"], "paired_rel": m, "paired_rel_ci95": h, "n": n,
                        "verdict": verdict})
    return out


LINE_PLOT_BASELINES = 8


def _line_policies(per: dict, agents: set[str]) -> list[str]:
    """The agents and the ``LINE_PLOT_BASELINES`` best baselines by mean E2E (complete ones first):
    more lines than that are unreadable."""
    base = sorted((p for p in per if p not in agents), key=lambda p: _table_order(per, p, agents))
    return sorted(agents & set(per)) + base[:LINE_PLOT_BASELINES]


def _tagged(per: dict, p: str) -> str:
    """A policy's label in the plots: incomplete runs are marked (their latencies cover the served
    requests only)."""
    return p + (" † incomplete" if per[p]["completed_frac"]["mean"] < COMPLETE_FRAC else "")


def _plot_cdfs(plt: Any, recs: list[RunRecord], per: dict, lines: list[str], colors: dict[str, Any],
               agents: set[str], load: float, shown: str, path: Path) -> Path:
    """E2E and TTFT latency CDFs over all seeds of the line policies (agents drawn thick)."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for ax, attr, title in ((axes[0], "e2e_s", "E2E latency"), (axes[1], "ttft_s", "TTFT")):
        for p in lines:
            x = np.sort(np.concatenate([getattr(r, attr) for r in recs if r.policy == p]))
            if len(x):
                ax.plot(x, np.arange(1, len(x) + 1) / len(x), label=_tagged(per, p), color=colors[p],
                        lw=2.4 if p in agents else 1.2, ls="-" if p in agents else "--")
        ax.set_xscale("symlog", linthresh=0.1)
        ax.set_xlabel("seconds")
        ax.set_ylabel("CDF")
        ax.set_title(f"{title} (all seeds, load x{load:g})", fontsize=10)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle(f"latency CDFs{shown}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_kv(plt: Any, recs: list[RunRecord], per: dict, lines: list[str], colors: dict[str, Any],
             agents: set[str], load: float, shown: str, path: Path) -> Path:
    """KV usage over time on the first seed, one line per line policy."""
    fig, ax = plt.subplots(figsize=(11, 4))
    first_seed = min(r.seed for r in recs)
    for p in lines:
        r = next((r for r in recs if r.policy == p and r.seed == first_seed), None)
        if r is not None and len(r.t_s):
            ax.plot(r.t_s, r.kv_frac, label=_tagged(per, p), color=colors[p], lw=1.6 if p in agents else 0.8)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("KV used / capacity")
    ax.set_title(f"KV usage over time (seed {first_seed}, load x{load:g}{shown})", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_bars(plt: Any, per: dict, pols: list[str], colors: dict[str, Any], agents: set[str], load: float,
               cols: list[tuple[str, str]], path: Path) -> Path:
    """One bar chart per metric: every policy's mean with its 95% CI (incomplete runs hatched)."""
    ncol = 3
    nrow = -(-len(cols) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.2 * nrow), squeeze=False)
    for ax, (key, label) in zip(axes.flat, cols, strict=False):
        means = np.array([per[p][key]["mean"] for p in pols])
        errs = np.nan_to_num(np.array([per[p][key]["ci95"] for p in pols]))
        # every metric here is non-negative: the lower error bar stops at 0
        yerr = np.vstack((np.minimum(errs, np.nan_to_num(np.maximum(means, 0.0))), errs))
        bars = ax.bar(range(len(pols)), means, yerr=yerr, color=[colors[p] for p in pols], capsize=2,
                      edgecolor=["k" if p in agents else "none" for p in pols])
        for b, p in zip(bars, pols, strict=True):
            if per[p]["completed_frac"]["mean"] < COMPLETE_FRAC:
                b.set_hatch("//")
        ax.set_xticks(range(len(pols)))
        ax.set_xticklabels([_tagged(per, p) for p in pols], rotation=60, ha="right", fontsize=7)
        ax.set_title(label, fontsize=9)
    for ax in list(axes.flat)[len(cols):]:
        ax.axis("off")
    fig.suptitle(f"means with 95% CI (load x{load:g})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_plots(records: list[RunRecord], out: Path, agents: Iterable[str] = ()) -> list[Path]:
    """Latency CDFs and KV usage over time (first seed) for the agents and the best baselines, and
    a bar chart per metric for every policy, per load level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agents = set(agents)
    agg = aggregate(records)
    paths: list[Path] = []
    # one colour per policy across every figure and load level
    everyone = sorted({r.policy for r in records}, key=lambda p: (p not in agents, p))
    palette = list(plt.get_cmap("tab20").colors) + list(plt.get_cmap("tab20b").colors)
    color_of = {p: palette[i % len(palette)] for i, p in enumerate(everyone)}
    for load in sorted(agg):
        recs = [r for r in records if r.load == load]
        per = agg[load]
        pols = sorted(per, key=lambda p: _table_order(per, p, agents))  # the table's order
        lines = _line_policies(per, agents)
        shown = "" if len(lines) == len(pols) else f"; agents and the {LINE_PLOT_BASELINES} best baselines"
        colors = {p: color_of[p] for p in pols}
        tag = f"load{load:g}".replace(".", "p")
        paths.append(_plot_cdfs(plt, recs, per, lines, colors, agents, load, shown, out / f"cdf_{tag}.png"))
        paths.append(_plot_kv(plt, recs, per, lines, colors, agents, load, shown, out / f"kv_{tag}.png"))
        paths.append(_plot_bars(plt, per, pols, colors, agents, load, visible_metrics({load: agg[load]}),
                                out / f"bars_{tag}.png"))
    return paths


def write_report(records: list[RunRecord], out: str | Path, meta: dict[str, Any],
                 skipped: dict[str, str] | None = None, agents: Iterable[str] = (), plots: bool = True) -> dict:
    """Write ``report.md``, ``results.json``, ``results.csv`` and the plots into ``out``; returns
    the results dict."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    agents = list(agents)
    agg = aggregate(records)
    skipped = skipped or {}
    results = {
        **meta,
        "agents": agents,
        "skipped": skipped,
        "aggregate": {f"{load:g}": per for load, per in agg.items()},
        "runs": [{"policy": r.policy, "seed": r.seed, "load": r.load, "metrics": r.metrics(), "summary": r.summary}
                 for r in records],
    }
    with (out / "results.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["load", "policy", "metric", "mean", "ci95_low", "ci95_high", "n"])
        for load in sorted(agg):
            for pol, per in agg[load].items():
                for k in METRIC_KEYS:
                    m, h, n = per[k]["mean"], per[k]["ci95"], per[k]["n"]
                    w.writerow([f"{load:g}", pol, k, m, m - h, m + h, n])
    pngs = write_plots(records, out, agents) if plots else []
    from llmsched_gym.data import synthetic_note

    tag = synthetic_note(records[0].summary.get("workload_source")) if records else ""
    md = [f"# {meta.get('scenario', '')}{tag}: policies on identical seeded workloads", "",
          f"seeds {meta.get('seeds')}, loads {meta.get('loads')}, overrides `{meta.get('overrides') or {}}`; "
          "mean ± 95% CI half-width (t-distribution over seeds); best mean per column in bold.", ""]
    lines = agent_vs_best(agg, agents)
    if lines:
        md += ["## Agent vs the best baseline", ""] + [f"- {x}" for x in lines] + [""]
    for a in agents:
        pairs = paired_vs_baselines(records, agg, a, exclude=agents)
        if pairs:
            md += [f"## {a}: paired per-seed differences in Mean E2EL (ms) against the five best baselines", "",
                   "| load | baseline | baseline mean (ms) | agent mean (ms) | paired difference | verdict |",
                   "|---|---|---:|---:|---:|---|"]
            md += [f"| x{x['load']:g} | {x['baseline']} | {x['baseline_mean']:.1f} | {x['agent_mean']:.1f} | "
                   f"{100 * x['paired_rel']:+.1f}% ± {100 * x['paired_rel_ci95']:.1f}% | {x['verdict']} |" for x in pairs]
            md += [""]
            results.setdefault("paired", {})[a] = pairs
    same = identical_groups(records)
    incomplete = any(v["completed_frac"]["mean"] < COMPLETE_FRAC for per in agg.values() for v in per.values())
    md += ["## Results", "", markdown_tables(agg, agents, same)]
    if incomplete:
        md += [f"† completed fewer than {COMPLETE_FRAC:.0%} of the requests: its latencies cover the completed "
               "ones only, so it is not eligible for best."]
    if same:
        md += ["`(= X)`: identical to X on every seed: the two policies take the same decisions on these workloads "
               "(e.g. SJF and MC-SF while memory never binds, or the VTC variants with one client)."]
    md += ["Bold: the best mean of a column, unless several policies tie on it.", ""]
    results["identical_to"] = {f"{load:g}/{p}": q for (load, p), q in same.items()}
    if skipped:
        md += ["## Skipped (not applicable)", ""] + [f"- `{k}`: {v}" for k, v in skipped.items()] + [""]
    if pngs:
        md += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in pngs] + [""]
    (out / "report.md").write_text("\n".join(md))
    (out / "results.json").write_text(json.dumps(results, indent=2, default=float) + "\n")
    return results


def print_table(agg: dict, agents: Iterable[str] = (), title: str = "") -> None:
    """The comparison as rich tables (one per load level)."""
    from rich.console import Console
    from rich.table import Table

    agents = set(agents)
    con = Console(width=200)
    cols = visible_metrics(agg)
    for load in sorted(agg):
        per = agg[load]
        t = Table(title=f"{title} load x{load:g} (mean ± 95% CI)")
        t.add_column("policy")
        for _, lbl in cols:
            t.add_column(lbl, justify="right")
        best = {k: best_policy(per, k) for k, _ in cols}
        for p in sorted(per, key=lambda p: _table_order(per, p, agents)):
            cells = [(f"[bold]{_cell(per[p][k], k)}[/bold]" if best[k] == p else _cell(per[p][k], k)) for k, _ in cols]
            t.add_row(f"[red]{p}[/red]" if p in agents else p, *cells)
        con.print(t)
