"""``llmsched benchmark``: a fixed suite of scheduling tasks, and the scores any policy or agent gets.

Every task fixes a scenario, its size and load, the metric it scores (and whether lower is
better), the training seeds an agent may learn on, one validation seed and the test seeds every
entrant is scored on. The protocol is the same for everybody, so two users' results compare:

* every entrant runs on every test seed (the same workloads: paired);
* the references are computed, not typed in: every registered baseline at its defaults (the best
  one that completes every request is *the best baseline*), and a small grid over each engine
  policy's main knob (Sarathi's ``chunk_size``, vLLM v1's ``max_num_seqs``): the best of grid and
  defaults is *the best static tuning*;
* per task and entrant: the mean with a 95% t-interval, the standard deviation, the paired
  per-seed relative difference to the best baseline with its 95% t-interval, and a normalised
  score, 0 for FCFS and 1 for the best baseline (above 1 beats it).

Outputs: ``results.json`` (everything, per seed), ``leaderboard.md`` and ``scores.png``.
``--quick`` runs two tasks on small workloads and two seeds (CI).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from llmsched_gym.core.scenarios import build_scenario, get_scenario
from llmsched_gym.data import synthetic_note
from llmsched_gym.parallel import Cell, Settings, run_cells

TRAIN_SEEDS = (1000, 1999)
"""Training workloads: seeds 1000 to 1999 (inclusive); never used for scoring."""
VALIDATION_SEED = 99
TEST_SEEDS = (100, 101, 102, 103, 104)
QUICK_TEST_SEEDS = (100, 101)
GRID = {"sarathi": ("chunk_size", (128, 256, 512, 1024, 2048)),
        "vllm-v1": ("max_num_seqs", (16, 32, 64, 128, 256))}
"""Each engine policy's main knob and the static values the suite tries."""


@dataclass(frozen=True)
class Task:
    """One benchmark task.

    :param scenario: a scenario name (``llmsched list``).
    :param overrides: dotted scenario overrides (size, load).
    :param metric: dotted path into the run summary (``serving.mean_e2el_ms``: ``vllm bench serve``'s
        names and units).
    :param lower_is_better: the metric's direction.
    :param label: how the metric is printed.
    """

    name: str
    scenario: str
    overrides: dict[str, Any]
    metric: str
    lower_is_better: bool
    label: str
    quick_overrides: dict[str, Any] = field(default_factory=dict)


TASKS: tuple[Task, ...] = (
    Task("azure-conv", "azure-conv", {"workload.n_requests": 1000}, "serving.mean_e2el_ms", True, "Mean E2EL (ms)",
         {"workload.n_requests": 150}),
    # held out in time: windows from the trace's second half only (agents train on its first half,
    # ``workload.trace.part: [0, 0.5]``), so no test request was ever seen in training
    Task("azure-conv-late", "azure-conv", {"workload.n_requests": 1000, "workload.trace.part": [0.5, 1.0]},
         "serving.mean_e2el_ms", True, "Mean E2EL (ms)", {"workload.n_requests": 150}),
    Task("jaillet-high", "jaillet-high", {"workload.n_requests": 500}, "serving.mean_e2el_ms", True, "Mean E2EL (ms)",
         {"workload.n_requests": 400}),
    Task("jaillet-noisy", "jaillet-noisy", {"workload.n_requests": 500}, "serving.mean_e2el_ms", True, "Mean E2EL (ms)",
         {"workload.n_requests": 400}),
    Task("jaillet-bursty", "jaillet-high",
         {"workload.n_requests": 500, "workload.arrival": {"type": "gamma", "rate": 50.0, "cv": 4.0}},
         "serving.p99_ttft_ms", True, "P99 TTFT (ms)", {"workload.n_requests": 120}),
    Task("echo-hybrid", "echo-hybrid",
         {"workload.n_requests": 200, "workload.classes.offline.n_requests": 2000, "engine.horizon_s": 60.0},
         "serving.request_goodput", False, "Request goodput (req/s)",
         {"workload.n_requests": 40, "workload.classes.offline.n_requests": 200, "engine.horizon_s": 15.0}),
    # a seeded window of the trace, so that the test seeds are different workloads
    Task("vtc-arena", "vtc-arena", {"workload.n_requests": 1000, "workload.trace.window": "random"},
         "fairness.tick_diff.max", True, "max per-tick service difference", {"workload.n_requests": 150}),
)
QUICK_TASKS = ("azure-conv", "jaillet-high")


def metric_value(summary: dict[str, Any], path: str) -> float:
    node: Any = summary
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return math.nan
        node = node[part]
    try:
        return float(node)
    except (TypeError, ValueError):
        return math.nan


def t_interval(x: list[float] | np.ndarray) -> tuple[float, float, float]:
    """Mean, half-width of the 95% t-interval and standard deviation (nan where undefined)."""
    from scipy import stats

    a = np.asarray([v for v in x if np.isfinite(v)], dtype=float)
    if len(a) == 0:
        return math.nan, math.nan, math.nan
    if len(a) == 1:
        return float(a[0]), math.nan, math.nan
    sd = float(a.std(ddof=1))
    return float(a.mean()), float(stats.t.ppf(0.975, len(a) - 1) * sd / math.sqrt(len(a))), sd


def normalised(value: float, fcfs: float, best: float) -> float:
    """0 at FCFS, 1 at the best baseline (above 1 beats it; nan when the two coincide)."""
    if not (np.isfinite(value) and np.isfinite(fcfs) and np.isfinite(best)) or best == fcfs:
        return math.nan
    return (value - fcfs) / (best - fcfs)


@dataclass
class Entry:
    """One entrant's per-seed results on a task."""

    name: str
    kind: str  # "baseline", "grid", "policy" or "agent"
    values: list[float]
    completed: list[bool]
    params: dict[str, Any] = field(default_factory=dict)


def _policy_label(spec: str | dict) -> str:
    if isinstance(spec, str):
        return spec
    extra = ",".join(f"{k}={v}" for k, v in spec.items() if k != "name")
    return f"{spec['name']}:{extra}" if extra else spec["name"]


def _completed(s: dict[str, Any]) -> bool:
    """Every request served (none rejected), or the horizon reached without a loop."""
    return (s["n_completed"] + s["n_rejected"] == s["n_arrived"] and s["n_rejected"] == 0
            or (s["stop_reason"] == "horizon" and not s["non_terminating"]))


def policy_cell(args: tuple) -> tuple[float, bool]:
    """One sweep cell: ``(task, policy spec, seed, overrides)`` -> (metric, completed)."""
    from llmsched_gym.sim import simulate

    task, spec, seed, overrides = args
    s = simulate(task.scenario, spec, seed, overrides).summary
    return metric_value(s, task.metric), _completed(s)


def agent_cell(args: tuple) -> tuple[float, bool, str]:
    """One sweep cell: ``(task, agent path, best, seed, overrides)`` -> (metric, completed, agent name);
    masked, deterministic actions."""
    from agents.agent import make_env, run_episode
    from agents.evaluate import cached_agent

    task, path, best, seed, overrides = args
    agent = cached_agent(path, best)
    env_kwargs = {k: v for k, v in agent.env_kwargs.items() if k not in ("overrides", "n_requests", "horizon_s")}
    env = make_env(task.scenario, env_kwargs, overrides)
    try:
        summary, _, _ = run_episode(agent, env, seed)
    finally:
        env.close()
    done = summary["n_completed"] + summary["n_rejected"] == summary["n_arrived"] or summary["stop_reason"] == "horizon"
    return metric_value(summary, task.metric), done, agent.name


@dataclass
class _Entrant:
    """One entrant of one task while the cells run: its kind, label, spec (or agent path) and cells."""

    task: Task
    kind: str
    label: str
    spec: Any
    params: dict[str, Any]
    cells: list[int] = field(default_factory=list)


def score_task(task: Task, entries: list[Entry]) -> dict[str, Any]:
    """References (best baseline, best static tuning) and every entrant's statistics."""
    sign = 1.0 if task.lower_is_better else -1.0

    def mean(e: Entry) -> float:
        return float(np.mean(e.values)) if e.values else math.nan

    complete = [e for e in entries if e.kind == "baseline" and all(e.completed) and np.isfinite(mean(e))]
    best = min(complete, key=lambda e: sign * mean(e)) if complete else None
    tuned_pool = [e for e in entries if e.kind in ("baseline", "grid") and all(e.completed) and np.isfinite(mean(e))]
    tuned = min(tuned_pool, key=lambda e: sign * mean(e)) if tuned_pool else None
    fcfs = next((e for e in entries if e.kind == "baseline" and e.name == "fcfs"), None)
    rows = []
    for e in entries:
        m, half, sd = t_interval(e.values)
        row: dict[str, Any] = {"name": e.name, "kind": e.kind, "mean": m, "ci95": half, "std": sd,
                               "values": e.values, "complete": all(e.completed), "params": e.params}
        if best is not None:
            rel = [(x - b) / b for x, b in zip(e.values, best.values, strict=True) if b]
            row["paired_rel_vs_best"], row["paired_rel_ci95"], _ = t_interval(rel)
            row["normalised"] = (normalised(m, mean(fcfs) if fcfs else math.nan, mean(best)) if all(e.completed)
                                 else math.nan)  # an incomplete run's latencies cover the served requests only
        rows.append(row)
    rows.sort(key=lambda r: (not r["complete"], sign * r["mean"] if np.isfinite(r["mean"]) else math.inf))
    first: dict[tuple, str] = {}
    for row in rows:  # identical on every test seed: the same decisions on these workloads
        key = tuple(row["values"])
        if key in first:
            row["same_as"] = first[key]
        else:
            first[key] = row["name"]
    return {"task": asdict(task), "best_baseline": best.name if best else None,
            "best_baseline_mean": mean(best) if best else math.nan,
            "best_static_tuning": tuned.name if tuned else None,
            "best_static_tuning_mean": mean(tuned) if tuned else math.nan,
            "fcfs_mean": mean(fcfs) if fcfs else math.nan, "rows": rows}


def run_benchmark(tasks: list[str] | None = None, policies: list[str | dict] | None = None,
                  agents: list[str] | None = None, quick: bool = False, best_model: bool = False,
                  out: str | Path = "runs/benchmark", baselines: list[str] | None = None,
                  progress: Callable[[str], None] | None = None, settings: Settings | None = None) -> dict[str, Any]:
    """Score ``policies`` (extra parameterised baselines) and ``agents`` (run folders) on the suite.

    Every (task, entrant, seed) is one cell of a sweep run with ``settings`` (jobs, backend, progress
    bar; :mod:`llmsched_gym.parallel`), the results identical whatever the settings. A baseline that
    cannot run a task is skipped with its reason; so is an entrant with a failing cell, named.

    :param tasks: task names (default: all; ``quick``: azure-conv and jaillet-high).
    :param baselines: the default-parameter references (default: every registered policy).
    :returns: the ``results.json`` content.
    """
    from baselines import available, validate_spec

    policies = [validate_spec(p, "policies") for p in policies or []]  # one line before anything runs
    t0 = time.perf_counter()
    by_name = {t.name: t for t in TASKS}
    names = tasks or (list(QUICK_TASKS) if quick else list(by_name))
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"task: unknown {unknown[0]!r}; allowed: {', '.join(by_name)}")
    seeds = list(QUICK_TEST_SEEDS if quick else TEST_SEEDS)
    refs = baselines if baselines is not None else available()
    results: dict[str, Any] = {"protocol": {"train_seeds": f"{TRAIN_SEEDS[0]}-{TRAIN_SEEDS[1]}",
                                            "validation_seed": VALIDATION_SEED, "test_seeds": seeds,
                                            "quick": quick, "grid": {k: list(v[1]) for k, v in GRID.items()}},
                               "tasks": {}}
    # every (task, entrant, seed) is one cell of one sweep; the entrants are then scored in order
    entrants: list[_Entrant] = []
    for name in names:
        task = by_name[name]
        entrants += [_Entrant(task, "baseline", ref, ref, {}) for ref in refs]
        entrants += [_Entrant(task, "grid", _policy_label({"name": pol, knob: v}), {"name": pol, knob: v}, {knob: v})
                     for pol, (knob, grid) in GRID.items() for v in grid]
        entrants += [_Entrant(task, "policy", _policy_label(spec), spec, {}) for spec in policies or []]
        for path in agents or []:
            # an agent is scored on the tasks of the scenario it was trained on
            trained_on = _agent_scenario(str(path), best_model)
            if trained_on not in (None, task.scenario):
                results.setdefault("skipped", {}).setdefault(name, {})[str(path)] = (
                    f"{path} was trained on {trained_on}, not {task.scenario}")
                continue
            entrants.append(_Entrant(task, "agent", str(path), str(path), {"path": str(path)}))
    cells: list[Cell] = []
    for e in entrants:
        for seed in seeds:
            e.cells.append(len(cells))
            cells.append(_cell(e, seed, quick, best_model))
    outcomes = run_cells(cells, _run_cell, settings, label="benchmark")
    # the score's zero point: FCFS overflows a scenario's forbid handler, so it runs again with
    # vLLM's LIFO preemption instead (said in the results)
    retry = [e for e in entrants if e.kind == "baseline" and e.spec == "fcfs"
             and not all(outcomes[i].ok for i in e.cells)]
    if retry:
        again = [_cell(e, seed, quick, best_model, {"engine.overflow": "preempt_lifo_recompute"})
                 for e in retry for seed in seeds]
        redone = run_cells(again, _run_cell, settings, label="benchmark: fcfs again")
        for k, e in enumerate(retry):
            first = next(outcomes[i] for i in e.cells if not outcomes[i].ok)
            results.setdefault("notes", {})[e.task.name] = (
                f"fcfs ran with engine.overflow=preempt_lifo_recompute ({first.error})")
            for j, i in enumerate(e.cells):
                outcomes[i] = redone[k * len(seeds) + j]
    for name in names:
        entries: list[Entry] = []
        for e in (e for e in entrants if e.task.name == name):
            got = [outcomes[i] for i in e.cells]
            failed = next((o for o in got if not o.ok), None)
            if failed is not None:  # reported by its cell; the other entrants are scored
                reason = failed.error if e.kind == "baseline" else f"{failed.error} (cell {failed.name})"
                results.setdefault("skipped", {}).setdefault(name, {})[e.label] = reason
                continue
            label = got[0].value[2] if e.kind == "agent" else e.label
            entries.append(Entry(label, e.kind, [o.value[0] for o in got], [o.value[1] for o in got], e.params))
        task = by_name[name]
        results["tasks"][name] = score_task(task, entries)
        # a trace task on a clone without the trace runs its synthetic stand-in: the leaderboard says so
        overrides = {**task.overrides, **(task.quick_overrides if quick else {})}
        results["tasks"][name]["workload_source"] = build_scenario(get_scenario(task.scenario, overrides),
                                                                   seeds[0])[0].meta.get("workload_source")
        if progress:
            r = results["tasks"][name]
            progress(f"{name}: best baseline {r['best_baseline']} {r['best_baseline_mean']:.4g}, "
                     f"best static tuning {r['best_static_tuning']} {r['best_static_tuning_mean']:.4g}")
    results["wall_s"] = time.perf_counter() - t0
    write_outputs(results, Path(out))
    return results


def _agent_scenario(path: str, best: bool) -> str | None:
    from agents.evaluate import cached_agent

    return cached_agent(path, best).scenario


def _cell(e: _Entrant, seed: int, quick: bool, best: bool, extra: dict[str, Any] | None = None) -> Cell:
    overrides = {**e.task.overrides, **(e.task.quick_overrides if quick else {}), **(extra or {})}
    args = (e.task, e.spec, best, seed, overrides) if e.kind == "agent" else (e.task, e.spec, seed, overrides)
    return Cell(f"{e.task.name}: {e.label} seed {seed}", (e.kind, args))


def _run_cell(args: tuple) -> tuple:
    kind, rest = args
    return agent_cell(rest) if kind == "agent" else policy_cell(rest)


def leaderboard(results: dict[str, Any]) -> str:
    """The markdown leaderboard: per task, every entrant with its figures."""
    p = results["protocol"]
    lines = ["# llmsched benchmark", "",
             f"Test seeds {p['test_seeds']} (paired: every entrant runs the same workloads), validation seed "
             f"{p['validation_seed']}, training seeds {p['train_seeds']}" + (" (quick sizes)." if p["quick"] else "."),
             "Normalised score: 0 = fcfs, 1 = the best baseline at its defaults; above 1 beats it. "
             "Paired: the per-seed relative difference to the best baseline, mean and 95% t-interval. "
             "Incomplete runs (requests left unserved) are listed last and never chosen as references. "
             "`(= X)`: identical to X on every test seed (the policies take the same decisions on these "
             "workloads, e.g. SJF and MC-SF while memory never binds).", ""]
    notes = results.get("notes", {})
    for name, r in results["tasks"].items():
        t = r["task"]
        note = [f"Note: {notes[name]}.", ""] if name in notes else []
        tag = synthetic_note(r.get("workload_source"))
        lines += [f"## {name}{tag} ({t['label']}, {'lower' if t['lower_is_better'] else 'higher'} is better)", "",
                  f"Best baseline: **{r['best_baseline']}** ({r['best_baseline_mean']:.4g}); best static tuning: "
                  f"**{r['best_static_tuning']}** ({r['best_static_tuning_mean']:.4g}); fcfs {r['fcfs_mean']:.4g}.", "",
                  *note, "| entrant | kind | mean ± 95% CI | std | paired vs best | normalised |", "|---|---|---|---|---|---|"]
        for row in r["rows"]:
            paired = (f"{100 * row['paired_rel_vs_best']:+.1f}% ± {100 * row['paired_rel_ci95']:.1f}%"
                      if np.isfinite(row.get("paired_rel_vs_best", math.nan)) else "-")
            ci = f" ± {row['ci95']:.3g}" if np.isfinite(row["ci95"]) else ""
            norm = f"{row['normalised'] + 0.0:.3f}" if np.isfinite(row.get("normalised", math.nan)) else "-"
            name_cell = row["name"] + ("" if row["complete"] else " (incomplete)")
            if "same_as" in row:
                name_cell += f" (= {row['same_as']})"
            lines.append(f"| {name_cell} | {row['kind']} | {row['mean']:.4g}{ci} | {row['std']:.3g} | {paired} | {norm} |")
        lines.append("")
        skipped = results.get("skipped", {}).get(name, {})
        if skipped:
            lines += ["Not scored on this task:", "", *(f"* {who}: {why}" for who, why in skipped.items()), ""]
    return "\n".join(lines)


def write_outputs(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=float) + "\n")
    (out / "leaderboard.md").write_text(leaderboard(results) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the plot needs the rl extra
        return
    tasks = list(results["tasks"])
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 4.0), squeeze=False)
    for ax, name in zip(axes[0], tasks, strict=True):
        rows = [r for r in results["tasks"][name]["rows"] if r["kind"] != "grid" and np.isfinite(r.get("normalised", math.nan))][:10]
        ax.barh([r["name"] for r in rows][::-1], [r["normalised"] for r in rows][::-1],
                color=["tab:orange" if r["kind"] == "agent" else "tab:blue" for r in rows][::-1])
        ax.axvline(1.0, color="k", lw=0.8, ls="--")
        ax.axvline(0.0, color="grey", lw=0.8)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("normalised score (0 fcfs, 1 best baseline)")
        ax.tick_params(labelsize=8)
    fig.tight_layout()
    fig.savefig(out / "scores.png", dpi=110)
    plt.close(fig)
