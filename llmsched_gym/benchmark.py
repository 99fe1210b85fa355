"""``llmsched benchmark``: a fixed suite of scheduling tasks, and the scores any policy or agent gets.

Every task fixes a scenario, its size and load, **the information entrants have** about output
lengths, the metric it scores (and whether lower is better), the training seeds an agent may learn
on, the validation seeds and the test seeds every entrant is scored on. The protocol is the same for
everybody, so two users' results compare:

* information: ``clairvoyant`` (true output lengths: the model of a paper that assumes them, or a
  labelled upper reference), ``predicted`` (a predictor with a stated error) or ``blind`` (no
  output-length information). The env and every policy read only what the task allows; a policy
  that needs more is listed as not applicable, with the reason;
* every entrant runs on every test seed (the same workloads: paired);
* the references are computed, not typed in: every registered baseline at its defaults (the best
  one that completes every request is *the best baseline*); *the best static heuristic*, the
  member of the static family (queue order x batch former x ``max_num_seqs``,
  :mod:`baselines.static`) that does best over the five validation workloads (seeds 95-99): the
  lowest mean over them of its metric divided by that workload's best member's, among the members
  that complete every request on every one (:func:`rank_family`; ties by label), then scored on
  the test seeds. One validation workload is not enough: on azure-conv-tail the member best on
  seed 99 alone collapses on two of the ten test workloads. Agents still pick their best model
  (``--best``) on one of these workloads, seed 99 (:data:`VALIDATION_SEED`, ``llmsched train``'s
  validation score); and *the hindsight reference*, per test workload the best schedule found with
  everything known (the full trace, true lengths: :mod:`llmsched_gym.hindsight`, starting from the
  family's best three on seed 99), never an entrant;
* the headroom of a task is ``(best static heuristic - hindsight) / best static heuristic``: how
  much any scheduler could still win over the best static policy. Under 5% the task is marked
  "no headroom";
* per task and entrant: the mean with a 95% t-interval, the paired per-seed relative difference to
  the best baseline and to the best static heuristic with their 95% t-intervals and a verdict
  (better, worse, or tie when the interval includes 0), and a normalised score, 0 for FCFS and 1 for
  the best baseline. An agent is scored beside its own untrained start (``start`` in its run
  folder), with the paired difference "learned: trained vs start";
* generalisation tasks score an agent of one task on workloads it never saw (another real trace, a
  lower and a higher load), with the static heuristic chosen on the agent's own task;
* routing tasks (``routing=True``) decide which replica of a cluster serves each request (the
  decision of ``LLMSchedCluster-v0``): the scenario declares the cluster (``cluster:``) and every
  replica runs its scheduler. The references are the routers (:data:`baselines.routers.ROUTERS`,
  each at its defaults); the best static router is chosen among them as the static heuristic is,
  over the validation workloads; the hindsight reference is, per test workload, the best router a search finds with the simulator
  (:func:`llmsched_gym.route_hindsight.route_hindsight`: llm-d's scorer weights and the load-signal
  refresh, ``ROUTE_HINDSIGHT_SIMS`` runs), never worse than any router's run there; agents trained
  on the task's scenario (``LLMSchedCluster-v0``) are entrants with their untrained start; the
  normalised score's zero point is round-robin.

Outputs: ``results.json`` (everything, per seed, the static family's values on every validation
workload included), ``leaderboard.md`` and ``scores.png``. ``--quick`` runs two tasks on small
workloads, two test and two validation seeds (98, 99), a reduced static family and a short hindsight
search (CI). ``--reuse OLD/results.json`` takes every cell whose inputs are the same from an earlier
run (same code: one cell per task runs again and must match exactly), so that a change to the
protocol reruns only what it changes; the leaderboard says, per task, how many cells were taken.
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

from llmsched_gym.core.metrics import metric_value
from llmsched_gym.core.scenarios import build_scenario, get_scenario
from llmsched_gym.data import synthetic_note
from llmsched_gym.parallel import Cell, Settings, run_cells

TRAIN_SEEDS = (1000, 1999)
"""Training workloads: seeds 1000 to 1999 (inclusive); never used for scoring."""
VALIDATION_SEEDS = (95, 96, 97, 98, 99)
"""The validation workloads on which each task's best static heuristic (a routing task's best static
router) is chosen by :func:`rank_family`; disjoint from the training and the test seeds."""
QUICK_VALIDATION_SEEDS = (98, 99)
VALIDATION_SEED = 99
"""The validation workload on which an agent picks its best model (``llmsched train``'s validation
score, ``--best``): one of :data:`VALIDATION_SEEDS`."""
TEST_SEEDS = tuple(range(100, 110))
QUICK_TEST_SEEDS = (100, 101)
NO_HEADROOM = 0.05
"""A task whose headroom over the best static heuristic is below this is marked "no headroom"."""
INFORMATION = ("clairvoyant", "predicted", "blind")
HINDSIGHT_SIMS = 60
"""Search runs per test workload of the hindsight search (``--quick``: 12), after its starting
candidates: the static family's best ``HINDSIGHT_START`` members on the validation seed
``VALIDATION_SEED``, run with true lengths. About 20 s per 1000-request workload on one core."""
QUICK_HINDSIGHT_SIMS = 12
HINDSIGHT_START = 3
ROUTE_HINDSIGHT_SIMS = 24
"""Search runs per test workload of a routing task's hindsight search (cluster simulations, 1-3 s
each: :func:`llmsched_gym.route_hindsight.route_hindsight`), after its starting candidates, the
``HINDSIGHT_START`` best routers on the validation seed ``VALIDATION_SEED`` (``--quick``: 8)."""
QUICK_ROUTE_HINDSIGHT_SIMS = 8


@dataclass(frozen=True)
class Task:
    """One benchmark task.

    :param scenario: a scenario name (``llmsched list``).
    :param overrides: dotted scenario overrides (size, load, predictor).
    :param metric: dotted path into the run summary (``serving.mean_e2el_ms``: ``vllm bench serve``'s
        names and units).
    :param lower_is_better: the metric's direction.
    :param label: how the metric is printed.
    :param information: what entrants know of output lengths: ``clairvoyant``, ``predicted`` or
        ``blind`` (it follows from the scenario's predictor; a test checks that they agree).
    :param trained_on: for a generalisation task, the task whose agents are scored here and on whose
        validation workload the static heuristic is chosen.
    :param why: what the task tests, one sentence.
    :param routing: the entrants are routers of the scenario's cluster, not replica schedulers.
    :param zero: the entrant whose mean is the normalised score's 0 (``fcfs``; round-robin for routing).
    """

    name: str
    scenario: str
    overrides: dict[str, Any]
    metric: str
    lower_is_better: bool
    label: str
    information: str
    quick_overrides: dict[str, Any] = field(default_factory=dict)
    trained_on: str | None = None
    why: str = ""
    routing: bool = False
    zero: str = "fcfs"


_E2EL = ("serving.mean_e2el_ms", True, "Mean E2EL (ms)")
_AZ = {"workload.n_requests": 1000}
_AZ_QUICK = {"workload.n_requests": 150}
_BLIND = {"workload.predictor": {"type": "none"}}
_ORACLE = {"workload.predictor": {"type": "oracle"}}
_LEARNED = {"workload.predictor": {"type": "lognormal", "sigma": 0.7}}
"""A learned ranker's error on chat traffic (Kendall's tau 0.56, Fu et al. 2024; azure-conv's own predictor)."""

TASKS: tuple[Task, ...] = (
    Task("azure-conv", "azure-conv", _AZ, *_E2EL, "predicted", _AZ_QUICK,
         why="real conversation traffic (Azure 2023) with a learned-predictor's error on output lengths"),
    # held out in time: windows from the trace's second half only (agents train on its first half,
    # ``workload.trace.part: [0, 0.5]``), so no test request was ever seen in training
    Task("azure-conv-late", "azure-conv", {**_AZ, "workload.trace.part": [0.5, 1.0]}, *_E2EL, "predicted",
         _AZ_QUICK, why="the same service an hour later: windows no agent trained on"),
    Task("azure-conv-blind", "azure-conv", {**_AZ, **_BLIND}, *_E2EL, "blind", _AZ_QUICK,
         why="no output-length information at all: prompt length, age and service so far"),
    Task("azure-conv-clairvoyant", "azure-conv", {**_AZ, **_ORACLE}, *_E2EL, "clairvoyant", _AZ_QUICK,
         why="an upper reference: what knowing the true lengths is worth (no server knows them)"),
    Task("jaillet-high", "jaillet-high", {"workload.n_requests": 500}, *_E2EL, "clairvoyant",
         {"workload.n_requests": 400}, why="Jaillet et al. 2025's model, which assumes known output lengths"),
    Task("jaillet-noisy", "jaillet-noisy", {"workload.n_requests": 500}, *_E2EL, "predicted",
         {"workload.n_requests": 400}, why="Jaillet et al. 2025's noisy predictions (x = 0.2)"),
    Task("jaillet-bursty", "jaillet-high",
         {"workload.n_requests": 500, "workload.arrival": {"type": "gamma", "rate": 50.0, "cv": 4.0}},
         "serving.p99_ttft_ms", True, "P99 TTFT (ms)", "clairvoyant", {"workload.n_requests": 120},
         why="bursts (Gamma arrivals, CV 4) scored on the tail"),
    Task("echo-hybrid", "echo-hybrid",
         {"workload.n_requests": 200, "workload.classes.offline.n_requests": 2000, "engine.horizon_s": 60.0, **_LEARNED},
         "serving.request_goodput", False, "Request goodput (req/s)", "predicted",
         {"workload.n_requests": 40, "workload.classes.offline.n_requests": 200, "engine.horizon_s": 15.0},
         why="online requests with SLOs beside offline batch work (Wang et al. 2025)"),
    # a seeded window of the trace, so that the test seeds are different workloads
    Task("vtc-arena", "vtc-arena", {"workload.n_requests": 1000, "workload.trace.window": "random", **_LEARNED},
         "fairness.tick_diff.max", True, "max per-tick service difference", "predicted", {"workload.n_requests": 150},
         why="per-client fairness on the Chatbot Arena trace (Sheng et al. 2024), lengths predicted (VTC's "
             "memory reservation reads them; the paper's oracle variant is not applicable)"),
    # tasks with measured headroom over the best static heuristic (>= 10% on their first measurement)
    Task("azure-conv-tail", "azure-conv", _AZ, "serving.p99_ttft_ms", True, "P99 TTFT (ms)", "predicted", _AZ_QUICK,
         why="the azure-conv service scored on its tail: which request waits is the whole game"),
    Task("azure-conv-tight-kv", "azure-conv", {**_AZ, "engine.kv_capacity_tokens": 24000}, *_E2EL, "predicted",
         {**_AZ_QUICK, "engine.kv_capacity_tokens": 24000},
         why="the azure-conv service with a fifth of the KV cache (a smaller GPU, a longer-context model): "
             "admission and preemption choices decide"),
    # generalisation: an azure-conv agent on workloads it never saw
    Task("azure-conv-load0.7", "azure-conv", {**_AZ, "workload.trace.time_scale": 1 / 0.7}, *_E2EL, "predicted",
         _AZ_QUICK, trained_on="azure-conv", why="generalisation: the azure-conv service at 0.7x its load"),
    Task("azure-conv-load1.3", "azure-conv", {**_AZ, "workload.trace.time_scale": 1 / 1.3}, *_E2EL, "predicted",
         _AZ_QUICK, trained_on="azure-conv", why="generalisation: the azure-conv service at 1.3x its load"),
    Task("azure-conv-arena", "azure-conv", {**_AZ, "workload.trace": {"format": "vtc", "window": "random"}}, *_E2EL,
         "predicted", _AZ_QUICK, trained_on="azure-conv",
         why="generalisation: another real trace (Chatbot Arena, Sheng et al. 2024) on azure-conv's engine"),
    # routing: the replica that serves each request (LLMSchedCluster-v0's decision); entrants are routers
    Task("route-mooncake", "mooncake-conv-8", {"workload.n_requests": 1000}, *_E2EL, "predicted",
         {"workload.n_requests": 150}, routing=True, zero="round-robin",
         why="routing the Mooncake conversation trace (Qin et al., FAST 2025) over 8 replicas: long multi-turn "
             "contexts whose prefix blocks repeat, scored on what LLMSchedCluster-v0's reward sums to"),
    # at 45 requests/s (llm-d's sweep runs 3 to 60): at the scenario's 30 the P90 TTFT is the cold prefill of
    # each group's first request (150 of 1,500 requests) whatever the router, and a router search finds < 1%
    Task("route-prefix-groups", "prefix-groups-8", {"workload.n_requests": 1500, "workload.arrival.rate": 45.0},
         "serving.p90_ttft_ms", True, "P90 TTFT (ms)", "predicted", {"workload.n_requests": 200}, routing=True,
         zero="round-robin",
         why="llm-d's prefix-heavy benchmark (150 groups of 6,000-token system prompts, 8 pods of Qwen3-32B) at "
             "45 requests/s, scored on P90 TTFT as llm-d reports it"),
)
QUICK_TASKS = ("azure-conv", "jaillet-high")


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


def paired(mine: list[float], theirs: list[float], lower_is_better: bool = True) -> dict[str, Any]:
    """The per-seed relative difference ``(mine - theirs) / theirs``: mean, 95% t-interval and the
    verdict: ``better`` or ``worse`` when the interval excludes 0, else ``tie``."""
    rel = [(x - y) / abs(y) for x, y in zip(mine, theirs, strict=True) if y and np.isfinite(x) and np.isfinite(y)]
    m, half, _ = t_interval(rel)
    if not np.isfinite(m):
        verdict = "-"
    elif np.isfinite(half) and abs(m) > half:
        verdict = "better" if (m < 0) == lower_is_better else "worse"
    else:
        verdict = "tie"
    return {"rel": m, "ci95": half, "verdict": verdict}


@dataclass
class Entry:
    """One entrant's per-seed results on a task.

    ``kind``: ``baseline`` (a registered policy at its defaults), ``static`` (the best static
    heuristic), ``policy`` (an extra entrant), ``agent``, ``start`` (an agent's untrained start) or
    ``reference`` (the hindsight reference: never an entrant).
    """

    name: str
    kind: str
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
    masked, deterministic actions. ``best`` is ``"start"`` for the run's untrained start."""
    from agents.agent import run_episode
    from agents.envs import make_env
    from agents.evaluate import cached_agent

    task, path, best, seed, overrides = args
    agent = cached_agent(str(Path(path) / "start.json"), False) if best == "start" else cached_agent(path, best)
    name = agent.name
    if best == "start":  # named for what it is: the run's structure, untrained
        from agents.agent import describe_run

        run = Path(path) / "run.json"
        name = describe_run(json.loads(run.read_text()) if run.exists() else {}, Path(path).name, start=True)
    env_kwargs = {k: v for k, v in agent.env_kwargs.items() if k not in ("overrides", "n_requests", "horizon_s")}
    env = make_env(task.scenario, env_kwargs, overrides)
    try:
        summary, _, _ = run_episode(agent, env, seed)
    finally:
        env.close()
    done = summary["n_completed"] + summary["n_rejected"] == summary["n_arrived"] or summary["stop_reason"] == "horizon"
    return metric_value(summary, task.metric), done, name


def router_cell(args: tuple) -> tuple[float, bool]:
    """One sweep cell of a routing task: ``(task, router spec, seed, overrides)`` -> (metric,
    completed); the scenario's cluster with that router, every replica the scenario's scheduler."""
    from llmsched_gym.cluster_sim import simulate_cluster

    task, router, seed, overrides = args
    s = simulate_cluster(task.scenario, router=router, seed=seed, overrides=overrides).summary
    return metric_value(s, task.metric), _completed(s)


def routers() -> list[str]:
    """A routing task's references: every router at its defaults (:data:`baselines.routers.ROUTERS`)."""
    from baselines.routers import ROUTERS

    return list(ROUTERS)


def hindsight_cell(args: tuple) -> tuple[float, dict[str, Any]]:
    """One sweep cell: ``(task, seed, overrides, start specs, sims)`` -> (value, details); a routing
    task's search is over routers (:func:`llmsched_gym.route_hindsight.route_hindsight`)."""
    from llmsched_gym.hindsight import hindsight
    from llmsched_gym.route_hindsight import route_hindsight

    task, seed, overrides, start, sims = args
    search = route_hindsight if task.routing else hindsight
    r = search(task.scenario, overrides, seed, task.metric, task.lower_is_better, start=start, sims=sims)
    return r.value, {"n_sims": r.n_sims, "wall_time_s": r.wall_s, "start_value": r.start_value,
                     "spec": {k: v for k, v in r.spec.items() if k != "priority"}}


@dataclass
class _Entrant:
    """One entrant of one task while the cells run: its kind, label, spec (or agent path) and cells."""

    task: Task
    kind: str
    label: str
    spec: Any
    params: dict[str, Any]
    cells: list[int] = field(default_factory=list)


def _sign(task: Task) -> float:
    return 1.0 if task.lower_is_better else -1.0


def score_task(task: Task, entries: list[Entry]) -> dict[str, Any]:
    """References (best baseline, best static heuristic, hindsight, headroom) and every entrant's statistics."""
    sign = _sign(task)

    def mean(e: Entry | None) -> float:
        return float(np.mean(e.values)) if e is not None and e.values else math.nan

    complete = [e for e in entries if e.kind == "baseline" and all(e.completed) and np.isfinite(mean(e))]
    best = min(complete, key=lambda e: sign * mean(e)) if complete else None
    static = next((e for e in entries if e.kind == "static" and all(e.completed)), None)
    ref = next((e for e in entries if e.kind == "reference"), None)
    fcfs = next((e for e in entries if e.kind == "baseline" and e.name == task.zero), None)
    starts = {e.params.get("path"): e for e in entries if e.kind == "start"}
    rows = []
    for e in entries:
        m, half, sd = t_interval(e.values)
        row: dict[str, Any] = {"name": e.name, "kind": e.kind, "mean": m, "ci95": half, "std": sd,
                               "values": e.values, "complete": all(e.completed), "params": e.params}
        if best is not None:
            vs = paired(e.values, best.values, task.lower_is_better)
            row["paired_rel_vs_best"], row["paired_rel_ci95"], row["verdict_vs_best"] = vs["rel"], vs["ci95"], vs["verdict"]
            row["normalised"] = (normalised(m, mean(fcfs), mean(best)) if all(e.completed)
                                 else math.nan)  # an incomplete run's latencies cover the served requests only
        if static is not None:
            vs = paired(e.values, static.values, task.lower_is_better)
            row["paired_rel_vs_static"], row["paired_rel_static_ci95"], row["verdict_vs_static"] = (
                vs["rel"], vs["ci95"], vs["verdict"])
        if e.kind == "agent" and e.params.get("path") in starts:
            start = starts[e.params["path"]]
            row["start"] = start.name
            row["learned"] = paired(e.values, start.values, task.lower_is_better)
        rows.append(row)
    rows.sort(key=lambda r: (not r["complete"], sign * r["mean"] if np.isfinite(r["mean"]) else math.inf))
    first: dict[tuple, str] = {}
    for row in rows:  # identical on every test seed: the same decisions on these workloads
        if row["kind"] == "reference":
            continue
        key = tuple(row["values"])
        if key in first:
            row["same_as"] = first[key]
        else:
            first[key] = row["name"]
    headroom = math.nan
    if static is not None and ref is not None and mean(static):
        headroom = sign * (mean(static) - mean(ref)) / abs(mean(static))
    return {"task": asdict(task), "information": task.information,
            "best_baseline": best.name if best else None, "best_baseline_mean": mean(best),
            "best_static": static.name if static else None, "best_static_mean": mean(static),
            "hindsight_mean": mean(ref), "headroom": headroom,
            "no_headroom": bool(np.isfinite(headroom) and headroom < NO_HEADROOM),
            "fcfs_mean": mean(fcfs), "zero": task.zero, "rows": rows}


def _task_entrants(task: Task, refs: list[str], chosen: dict | None, chosen_on: str, policies: list[str | dict],
                   agents: list[str], best_model: bool, sims: int, top: list[dict] | None,
                   skip: Callable[[str, str, str], None]) -> list[_Entrant]:
    """The entrants of one task: the default-parameter baselines that apply to its information,
    the static heuristic ``chosen`` on ``chosen_on`` (a task's validation workloads), the extra ``policies``,
    the ``agents`` trained on its scenario (with their untrained start where saved) and the
    hindsight search from ``top`` (the family's best few); what cannot run is ``skip``-ped with
    its reason."""
    from baselines import applicable

    name = task.name
    entrants: list[_Entrant] = []
    if task.routing:  # routers, the best of them on the validation seeds, routing agents, the router search
        entrants += [_Entrant(task, "baseline", r, r, {}) for r in routers()]
        if chosen is not None:
            entrants.append(_Entrant(task, "static", chosen, chosen, {"chosen_on": chosen_on}))
        for spec in policies:
            skip(name, _policy_label(spec), "a replica scheduler, not a router (this task scores routers)")
        entrants += _agent_entrants(task, agents, best_model, skip)
        if top is not None:
            entrants.append(_Entrant(task, "reference", "hindsight", top, {"sims": sims}))
        return entrants
    for ref in refs:
        ok, why = applicable(ref, task.information)
        if ok:
            entrants.append(_Entrant(task, "baseline", ref, ref, {}))
        else:
            skip(name, ref, f"not applicable: {why}")
    if chosen is not None:
        entrants.append(_Entrant(task, "static", _policy_label(chosen), chosen,
                                 {"chosen_on": chosen_on}))
    for spec in policies:
        ok, why = applicable(spec, task.information)
        if ok:
            entrants.append(_Entrant(task, "policy", _policy_label(spec), spec, {}))
        else:
            skip(name, _policy_label(spec), f"not applicable: {why}")
    entrants += _agent_entrants(task, agents, best_model, skip)
    if top is not None:  # the search starts from the family's best few on the agents' validation seed
        entrants.append(_Entrant(task, "reference", "hindsight", top, {"sims": sims}))
    return entrants


def _agent_entrants(task: Task, agents: list[str], best_model: bool,
                    skip: Callable[[str, str, str], None]) -> list[_Entrant]:
    """The agents trained on ``task``'s scenario (generalisation tasks included), each with its
    untrained start where the run saved one; the others are ``skip``-ped with the reason."""
    entrants = []
    for path in agents:
        trained_on = _agent_scenario(str(path), best_model)
        if trained_on not in (None, task.scenario):
            skip(task.name, str(path), f"{path} was trained on {trained_on}, not {task.scenario}")
            continue
        entrants.append(_Entrant(task, "agent", str(path), str(path), {"path": str(path)}))
        if (Path(path) / "start.json").exists():
            entrants.append(_Entrant(task, "start", f"{path} (start)", str(path), {"path": str(path)}))
    return entrants


def _entries(name: str, entrants: list[_Entrant], outcomes: list[Any],
             skip: Callable[[str, str, str], None]) -> list[Entry]:
    """The scored entries of task ``name`` from its entrants' cell outcomes; an entrant with a
    failing cell is ``skip``-ped with the cell's error (the other entrants are scored)."""
    entries: list[Entry] = []
    for e in entrants:
        got = [outcomes[i] for i in e.cells]
        failed = next((o for o in got if not o.ok), None)
        if failed is not None:  # reported by its cell; the other entrants are scored
            reason = failed.error if e.kind == "baseline" else f"{failed.error} (cell {failed.name})"
            if "NotApplicable" in (failed.error or ""):
                reason = f"not applicable: {failed.error.split(': ', 1)[-1]}"
            skip(name, e.label, reason)
            continue
        label = got[0].value[2] if e.kind in ("agent", "start") else e.label
        params = e.params
        if e.kind == "reference":  # the search's own figures, before the floor below
            params = {**e.params, "search": [{"value": o.value[0], **o.value[1]} for o in got]}
        entries.append(Entry(label, e.kind, [o.value[0] for o in got],
                             [True if e.kind == "reference" else o.value[1] for o in got], params))
    return entries


def run_benchmark(tasks: list[str] | None = None, policies: list[str | dict] | None = None,
                  agents: list[str] | None = None, quick: bool = False, best_model: bool = False,
                  out: str | Path = "runs/benchmark", baselines: list[str] | None = None,
                  progress: Callable[[str], None] | None = None, settings: Settings | None = None,
                  hindsight_sims: int | None = None, seeds: list[int] | None = None,
                  reuse: list[str | Path] | None = None) -> dict[str, Any]:
    """Score ``policies`` (extra parameterised baselines) and ``agents`` (run folders) on the suite.

    Three sweeps, each a list of cells run with ``settings`` (jobs, backend, progress bar;
    :mod:`llmsched_gym.parallel`), the results identical whatever the settings: the static family on
    the validation seeds (which picks each task's best static heuristic), then every entrant and the
    hindsight search on the test seeds. A baseline that cannot run a task (not applicable under the
    task's information, or failing) is listed with its reason; so is an entrant with a failing cell.

    :param tasks: task names (default: all; ``quick``: azure-conv and jaillet-high).
    :param baselines: the default-parameter references (default: every registered policy but ``static``).
    :param hindsight_sims: simulations per test workload of the hindsight search (0: none).
    :param seeds: the test seeds (default: the protocol's).
    :param reuse: earlier ``results.json`` files whose cells are taken instead of run where the
        inputs are the same (:func:`reusable_cells`: task definition, entrant, seed; the hindsight
        search's starting candidates and runs); one cell per task runs anyway as a witness and must
        give exactly the stored result. The results and the leaderboard say what was taken from where.
    :returns: the ``results.json`` content.
    """
    from baselines import available, validate_spec
    from baselines.static import static_family
    from llmsched_gym.env import ENV_ID

    policies = [validate_spec(p, "policies") for p in policies or []]  # one line before anything runs
    t0 = time.perf_counter()
    by_name = {t.name: t for t in TASKS}
    names = tasks or (list(QUICK_TASKS) if quick else list(by_name))
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"task: unknown {unknown[0]!r}; allowed: {', '.join(by_name)}")
    seeds = list(seeds or (QUICK_TEST_SEEDS if quick else TEST_SEEDS))
    val_seeds = list(QUICK_VALIDATION_SEEDS if quick else VALIDATION_SEEDS)
    sims = hindsight_sims if hindsight_sims is not None else (QUICK_HINDSIGHT_SIMS if quick else HINDSIGHT_SIMS)
    if isinstance(sims, bool) or not isinstance(sims, int) or not 0 <= sims <= 100_000:
        raise ValueError(f"hindsight_sims: expected an integer in [0, 100000], got {sims!r}")
    route_sims = hindsight_sims if hindsight_sims is not None else (QUICK_ROUTE_HINDSIGHT_SIMS if quick
                                                                    else ROUTE_HINDSIGHT_SIMS)
    refs = baselines if baselines is not None else [b for b in available() if b != "static"]
    cache = _load_reuse(reuse, best_model)
    results: dict[str, Any] = {"protocol": {"train_seeds": f"{TRAIN_SEEDS[0]}-{TRAIN_SEEDS[1]}",
                                            "validation_seeds": val_seeds, "selection_rule": SELECTION_RULE,
                                            "agent_validation_seed": VALIDATION_SEED, "test_seeds": seeds,
                                            "quick": quick, "env": ENV_ID, "hindsight_sims": sims,
                                            "route_hindsight_sims": route_sims,
                                            "no_headroom_below": NO_HEADROOM, "best_model": best_model},
                               "tasks": {}}

    def skip(task: str, who: str, why: str) -> None:
        results.setdefault("skipped", {}).setdefault(task, {})[who] = why

    # 1. the static family on the validation seeds: each task's best static heuristic
    chooser = {n: by_name[n].trained_on or n for n in names}
    static = _choose_static([by_name[c] for c in sorted(set(chooser.values()))], static_family, quick, settings,
                            results, val_seeds, cache)
    # 2. every entrant and the hindsight search on the test seeds
    entrants: list[_Entrant] = []
    for name in names:
        chosen = static.get(chooser[name])
        n_sims = route_sims if by_name[name].routing else sims
        top = results["static_family"][chooser[name]]["top"] if n_sims and chosen is not None else None
        on = f"{chooser[name]} seeds {', '.join(map(str, val_seeds))}"
        entrants += _task_entrants(by_name[name], refs, chosen, on, policies, agents or [], best_model, n_sims, top,
                                   skip)
    cells: list[Cell] = []
    for e in entrants:
        for seed in seeds:
            e.cells.append(len(cells))
            cells.append(_cell(e, seed, quick, best_model, sims))
    outcomes = _run_stage(cells, settings, "benchmark", cache, "test")
    _retry_fcfs(entrants, outcomes, seeds, quick, best_model, settings, results)
    if cache is not None:
        results["reuse"] = {"from": cache.paths, "witnesses": cache.witnesses, "cells": cache.counts}
    for name in names:
        task = by_name[name]
        entries = _entries(name, [e for e in entrants if e.task.name == name], outcomes, skip)
        _hindsight_floor(task, entries)
        results["tasks"][name] = score_task(task, entries)
        # a trace task on a clone without the trace runs its synthetic stand-in: the leaderboard says so
        overrides = {**task.overrides, **(task.quick_overrides if quick else {})}
        spec = {k: v for k, v in get_scenario(task.scenario, overrides).items() if k != "cluster"}  # its requests
        results["tasks"][name]["workload_source"] = build_scenario(spec, seeds[0])[0].meta.get("workload_source")
        if progress:
            r = results["tasks"][name]
            progress(f"{name}{synthetic_note(r.get('workload_source'))} ({task.information}): hindsight {r['hindsight_mean']:.4g}, best static heuristic "
                     f"{r['best_static']} {r['best_static_mean']:.4g}, best baseline {r['best_baseline']} "
                     f"{r['best_baseline_mean']:.4g}, headroom {_pct(r['headroom'])}")
    results["wall_s"] = time.perf_counter() - t0
    write_outputs(results, Path(out))
    return results


SELECTION_RULE = ("the member with the lowest mean, over the validation workloads, of its metric divided by that "
                  "workload's best member's (higher-is-better metrics: the highest mean), among the members that "
                  "complete every request on every validation workload; ties by label")
"""How :func:`rank_family` picks the best static heuristic (said in ``results.json`` and the leaderboard)."""


def rank_family(values: dict[str, list[float]], completed: dict[str, list[bool]],
                lower_is_better: bool = True) -> list[tuple[str, float]]:
    """The members of a family ranked for the best static heuristic over several validation workloads.

    A member is eligible when it completes every request on every workload (``completed``) with a
    finite metric. On each workload ``j`` the eligible members' best value ``b_j`` is the reference,
    and a member's score is the mean over workloads of ``v_j / b_j``: the per-workload ratio to the
    family's best, which is how the leaderboard's paired differences (``(mine - theirs) / theirs``)
    compare entrants. Dividing by each workload's best keeps a heavy workload from outweighing the
    others, and a member that collapses on one workload pays its whole ratio there, however well it
    does on the rest (a single validation workload cannot show that). Lower is better: the lowest
    mean first (1.0 = the best on every workload); higher is better: the highest mean first. A
    ratio ``0 / 0`` counts 1; ``v / 0`` with ``v > 0`` counts infinite. Ties keep the label order,
    so the ranking is deterministic.

    >>> rank_family({"a": [10.0, 100.0], "b": [11.0, 12.0], "c": [9.0, 10.0]},  # doctest: +ELLIPSIS
    ...             {"a": [True, True], "b": [True, True], "c": [True, False]})
    [('b', 1.05), ('a', 4.666...)]

    :param values: the metric of each member (by label) on each validation workload, in one order.
    :param completed: whether each of those runs completed every request.
    :returns: ``(label, mean ratio)`` of the eligible members, the best first.
    """
    ok = sorted(m for m, v in values.items() if all(completed[m]) and v and all(np.isfinite(v)))
    if not ok:
        return []
    pick = min if lower_is_better else max
    best = [pick(values[m][j] for m in ok) for j in range(len(values[ok[0]]))]

    def ratio(v: float, b: float) -> float:
        return 1.0 if v == b else v / b if b else math.inf

    score = {m: float(np.mean([ratio(v, b) for v, b in zip(values[m], best, strict=True)])) for m in ok}
    sign = 1.0 if lower_is_better else -1.0
    return sorted(((m, score[m]) for m in ok), key=lambda x: (sign * x[1], x[0]))


def _choose_static(tasks: list[Task], family: Callable[[str], list[dict]], quick: bool, settings: Settings | None,
                   results: dict[str, Any], seeds: list[int], reuse: _Reuse | None = None) -> dict[str, dict]:
    """Each task's best static heuristic: the family member (routers for a routing task) ranked
    first by :func:`rank_family` on the validation workloads ``seeds``; every member's values are
    kept in ``results["static_family"]``, with ``top``, the hindsight search's starting candidates:
    the best ``HINDSIGHT_START`` members on the agents' validation workload :data:`VALIDATION_SEED`
    alone (a start for a search that runs on each test workload with everything known, not a choice
    of reference: it does not move with the selection rule, and the reference is floored by the
    chosen static heuristic's run on each test workload anyway, :func:`_hindsight_floor`)."""
    specs: dict[str, list] = {t.name: routers() if t.routing else _quick_family(family(t.information)) if quick
                              else family(t.information) for t in tasks}
    cells = [Cell(f"{t.name}: {_policy_label(s)} seed {seed}",
                  ("router" if t.routing else "policy",
                   (t, s, seed, {**t.overrides, **(t.quick_overrides if quick else {})})))
             for t in tasks for s in specs[t.name] for seed in seeds]
    outcomes = iter(_run_stage(cells, settings, "benchmark: static family on the validation seeds", reuse,
                               "validation"))
    chosen: dict[str, dict] = {}
    for t in tasks:
        by_label = {_policy_label(s): s for s in specs[t.name]}
        values: dict[str, list[float]] = {}
        completed: dict[str, list[bool]] = {}
        for label in by_label:
            got = [next(outcomes) for _ in seeds]
            values[label] = [float(o.value[0]) if o.ok else math.nan for o in got]
            completed[label] = [bool(o.ok and o.value[1]) for o in got]
        ranked = rank_family(values, completed, t.lower_is_better)
        j = seeds.index(VALIDATION_SEED) if VALIDATION_SEED in seeds else len(seeds) - 1
        start = rank_family({m: v[j:j + 1] for m, v in values.items()}, {m: c[j:j + 1] for m, c in completed.items()},
                            t.lower_is_better)[:HINDSIGHT_START]
        if ranked:
            chosen[t.name] = by_label[ranked[0][0]]
            results.setdefault("static_family", {})[t.name] = {
                "task": asdict(t), "validation_seeds": list(seeds), "rule": SELECTION_RULE, "chosen": ranked[0][0],
                "size": len(specs[t.name]), "top": [by_label[m] for m, _ in start], "top_on_seed": seeds[j],
                "scores": dict(ranked), "values": values, "completed": completed}
    return chosen


def _cell_key(args: tuple) -> str:
    """What a cell's result depends on, as a string: the task's scenario, metric and direction, the
    scenario overrides, the entrant (a policy or router by label, an agent by path and model, the
    hindsight search by its starting candidates and runs) and the seed. Two cells with the same key
    run the same simulation."""
    kind, rest = args
    task = rest[0]
    ident = _task_ident(asdict(task) if isinstance(task, Task) else task)
    if kind in ("policy", "router"):
        _, spec, seed, overrides = rest
        parts: list[Any] = [kind, _policy_label(spec), seed, overrides]
    elif kind == "agent":
        _, path, best, seed, overrides = rest
        parts = [kind, str(path), best, seed, overrides]
    else:
        _, seed, overrides, start, sims = rest
        parts = [kind, start, sims, seed, overrides]
    return json.dumps([*ident, *parts], sort_keys=True, default=str)


def _task_ident(task: dict[str, Any]) -> list[Any]:
    return [task["name"], task["scenario"], task["metric"], task["lower_is_better"], task.get("routing", False)]


def reusable_cells(results: dict[str, Any], best_model: bool | None = None) -> dict[str, tuple]:
    """The cell results a ``results.json`` holds, keyed by :func:`_cell_key`: every complete test-seed
    row of a policy, router or static heuristic, the hindsight search per test workload (by its
    starting candidates), agents and starts (when the results say which model ran) and the static
    family on the validation workloads. Keys are built from the task definitions stored in the
    results, so a task whose scenario, overrides or metric changed since matches nothing.
    Incomplete rows and FCFS runs retried with another overflow handler are left out (they run again).

    :param best_model: which model the agent rows ran (``--best`` or not) where the results do not
        say (results written before the protocol recorded it); ``None``: their agent rows are left out.
    """
    p = results["protocol"]
    best_model = p.get("best_model", best_model)
    quick = bool(p.get("quick"))
    cache: dict[str, tuple] = {}

    def over(t: dict[str, Any]) -> dict[str, Any]:
        return {**t["overrides"], **(t.get("quick_overrides", {}) if quick else {})}

    stored = {name: r["task"] for name, r in results.get("tasks", {}).items()}
    for name, fam in results.get("static_family", {}).items():
        t = fam.get("task") or stored.get(name)
        if t is None:
            continue
        kind = "router" if t.get("routing") else "policy"
        if "values" in fam:
            seeds, values, done = fam["validation_seeds"], fam["values"], fam["completed"]
        else:  # one validation seed: the scores of the members that completed every request
            seeds = [fam["validation_seed"]]
            values = {m: [v] for m, v in fam["scores"].items()}
            done = {m: [True] for m in values}
        for label, vs in values.items():
            for seed, v, c in zip(seeds, vs, done[label], strict=True):
                if np.isfinite(v):
                    cache[_cell_key((kind, (t, label, seed, over(t))))] = (v, c)
    seeds = p["test_seeds"]
    for name, r in results.get("tasks", {}).items():
        t = r["task"]
        kind = "router" if t.get("routing") else "policy"
        for row in r["rows"]:
            if len(row["values"]) != len(seeds):
                continue
            if row["kind"] in ("baseline", "static", "policy"):
                if not row["complete"] or (name in results.get("notes", {}) and row["name"] == t.get("zero", "fcfs")):
                    continue
                for seed, v in zip(seeds, row["values"], strict=True):
                    cache[_cell_key((kind, (t, row["name"], seed, over(t))))] = (v, True)
            elif row["kind"] == "reference":
                fam = results.get("static_family", {}).get(t.get("trained_on") or name)
                sims = p.get("route_hindsight_sims" if t.get("routing") else "hindsight_sims")
                search = row["params"].get("search", [])
                if fam is None or sims is None or len(search) != len(seeds):
                    continue
                for seed, found in zip(seeds, search, strict=True):
                    details = {k: found[k] for k in ("n_sims", "wall_time_s", "start_value", "spec")}
                    cache[_cell_key(("reference", (t, seed, over(t), fam["top"], row["params"].get("sims", sims))))] = (
                        found["value"], details)
            elif row["kind"] in ("agent", "start") and best_model is not None and row["complete"]:
                best = "start" if row["kind"] == "start" else best_model
                for seed, v in zip(seeds, row["values"], strict=True):
                    cache[_cell_key(("agent", (t, row["params"]["path"], best, seed, over(t))))] = (v, True, row["name"])
    return cache


@dataclass
class _Reuse:
    """Earlier results to take cells from (``--reuse``), and what was taken."""

    paths: list[str]
    cache: dict[str, tuple]
    witnessed: set[str] = field(default_factory=set)
    counts: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    witnesses: list[str] = field(default_factory=list)


def _run_stage(cells: list[Cell], settings: Settings | None, label: str, reuse: _Reuse | None,
               stage: str) -> list[Any]:
    """``run_cells`` over ``cells``, taking each cell that ``reuse`` holds from it instead of running
    it. Witnesses run anyway: for every task one of the cells taken (a policy's or router's, the
    cheapest kind), the first hindsight search taken and the first episode taken of each agent and
    each untrained start (an agent's model is the best or the final one). If one does not
    give exactly the stored result (a search's wall time aside) the code has changed since, and the
    benchmark stops with an error rather than mix the two. An agent's name is the witness's (how the
    run is described may have changed since; its figures may not)."""
    from llmsched_gym.parallel import Outcome

    if reuse is None or not reuse.cache:
        return run_cells(cells, _run_cell, settings, label=label)
    keys = [_cell_key(c.args) for c in cells]
    run = []
    for i, (c, k) in enumerate(zip(cells, keys, strict=True)):
        task = c.args[1][0].name
        got = reuse.counts.setdefault(stage, {}).setdefault(task, [0, 0])
        got[1] += 1
        if k not in reuse.cache:
            run.append(i)
            continue
        got[0] += 1
        who = (task if c.args[0] in ("policy", "router") else
               f"agent {c.args[1][1]} {c.args[1][2]}" if c.args[0] == "agent" else c.args[0])
        if who not in reuse.witnessed:
            reuse.witnessed.add(who)
            reuse.witnesses.append(c.name)
            run.append(i)
    outcomes: list[Any] = [Outcome(c.name, reuse.cache.get(k)) for c, k in zip(cells, keys, strict=True)]
    names: dict[tuple, str] = {}  # an agent's name as this code writes it (the witness's)
    for i, o in zip(run, run_cells([cells[i] for i in run], _run_cell, settings, label=label), strict=True):
        if keys[i] in reuse.cache:
            agent = cells[i].args[0] == "agent"
            new, old = (o.value[:2], reuse.cache[keys[i]][:2]) if agent and o.ok else (o.value, reuse.cache[keys[i]])
            if not o.ok:  # a witness that fails says nothing about the code: say what failed
                raise ValueError(f"reuse: the check run {cells[i].name} failed ({o.error}); fix that and run again")
            if _comparable(new) != _comparable(old):
                raise ValueError(f"reuse: {cells[i].name} gives {o.value} now but "
                                 f"{reuse.cache[keys[i]]} in {', '.join(reuse.paths)}: the code changed since; "
                                 "run without --reuse")
            if agent:
                names[cells[i].args[1][1:3]] = o.value[2]
        outcomes[i] = o
    for i, c in enumerate(cells):  # the witness's name, where only the naming changed since
        if c.args[0] == "agent" and i not in run and c.args[1][1:3] in names:
            outcomes[i] = Outcome(c.name, (*outcomes[i].value[:2], names[c.args[1][1:3]]))
    return outcomes


def _comparable(value: tuple) -> str:
    """A cell's result as stored in ``results.json`` (JSON types), without a search's wall time."""
    if len(value) == 2 and isinstance(value[1], dict):
        value = (value[0], {k: v for k, v in value[1].items() if k != "wall_time_s"})
    return json.dumps(value, sort_keys=True, default=float)


def _load_reuse(paths: list[str | Path] | None, best_model: bool) -> _Reuse | None:
    """The cells of the ``results.json`` files ``paths`` (a folder means its ``results.json``); two
    files that disagree on a cell are an error. A file that does not say which model its agents ran
    is taken to have run this run's (``best_model``): the agent's witness episode checks it."""
    if not paths:
        return None
    cache: dict[str, tuple] = {}
    names = []
    for path in paths:
        f = Path(path) / "results.json" if Path(path).is_dir() else Path(path)
        if not f.is_file():
            raise ValueError(f"reuse: {path}: no such results.json")
        try:
            cells = reusable_cells(json.loads(f.read_text()), best_model)
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"reuse: {f}: not a benchmark results.json ({type(err).__name__}: {err})") from None
        for k, v in cells.items():
            if k in cache and _comparable(cache[k]) != _comparable(v):
                raise ValueError(f"reuse: {f} and {', '.join(names)} disagree on the cell {k}")
            cache[k] = v
        names.append(str(f))
    return _Reuse(names, cache)


def _quick_family(specs: list[dict]) -> list[dict]:
    """``--quick``: the family's members at chunk sizes 0 and 256 and its largest ``max_num_seqs``."""
    top = max((s.get("max_num_seqs", 0) for s in specs), default=0)
    return [s for s in specs if s.get("chunk_size", 0) in (0, 256) and s.get("max_num_seqs", 0) == top]


def _retry_fcfs(entrants: list[_Entrant], outcomes: list, seeds: list[int], quick: bool, best_model: bool,
                settings: Settings | None, results: dict[str, Any]) -> None:
    """The score's zero point: FCFS overflows a scenario's forbid handler, so it runs again with
    vLLM's LIFO preemption instead (said in the results)."""
    retry = [e for e in entrants if e.kind == "baseline" and e.spec == "fcfs"
             and not all(outcomes[i].ok for i in e.cells)]
    if not retry:
        return
    again = [_cell(e, seed, quick, best_model, 0, {"engine.overflow": "preempt_lifo_recompute"})
             for e in retry for seed in seeds]
    redone = run_cells(again, _run_cell, settings, label="benchmark: fcfs again")
    for k, e in enumerate(retry):
        first = next(outcomes[i] for i in e.cells if not outcomes[i].ok)
        results.setdefault("notes", {})[e.task.name] = f"fcfs ran with engine.overflow=preempt_lifo_recompute ({first.error})"
        for j, i in enumerate(e.cells):
            outcomes[i] = redone[k * len(seeds) + j]


def _hindsight_floor(task: Task, entries: list[Entry]) -> None:
    """The hindsight reference of a workload is the best schedule known for it with everything
    known: the search's result, or a reference policy's run where that is better (any run is a
    feasible schedule). Agents and extra entrants are not counted, so the reference does not
    depend on who enters."""
    ref = next((e for e in entries if e.kind == "reference"), None)
    if ref is None:
        return
    sign = _sign(task)
    pool = [e for e in entries if e.kind in ("baseline", "static") and all(e.completed)]
    for j in range(len(ref.values)):
        found = [ref.values[j], *(e.values[j] for e in pool if np.isfinite(e.values[j]))]
        ref.values[j] = min(found, key=lambda v: sign * v if np.isfinite(v) else math.inf)


def _agent_scenario(path: str, best: bool) -> str | None:
    from agents.evaluate import cached_agent

    return cached_agent(path, best).scenario


def _cell(e: _Entrant, seed: int, quick: bool, best: bool, sims: int, extra: dict[str, Any] | None = None) -> Cell:
    overrides = {**e.task.overrides, **(e.task.quick_overrides if quick else {}), **(extra or {})}
    if e.kind == "agent":
        args: tuple = ("agent", (e.task, e.spec, best, seed, overrides))
    elif e.kind == "start":
        args = ("agent", (e.task, e.spec, "start", seed, overrides))
    elif e.kind == "reference":
        args = ("reference", (e.task, seed, overrides, e.spec, e.params.get("sims", sims)))
    elif e.task.routing:
        args = ("router", (e.task, e.spec, seed, overrides))
    else:
        args = ("policy", (e.task, e.spec, seed, overrides))
    return Cell(f"{e.task.name}: {e.label} seed {seed}", args)


def _run_cell(args: tuple) -> tuple:
    kind, rest = args
    if kind == "agent":
        return agent_cell(rest)
    if kind == "reference":
        return hindsight_cell(rest)
    if kind == "router":
        return router_cell(rest)
    return policy_cell(rest)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if np.isfinite(x) else "-"


def _paired_cell(row: dict[str, Any], key: str, ci: str, verdict: str) -> str:
    if not np.isfinite(row.get(key, math.nan)):
        return "-"
    half = row.get(ci, math.nan)
    return f"{100 * row[key]:+.1f}% ± {100 * half:.1f}% {row[verdict]}" if np.isfinite(half) else f"{100 * row[key]:+.1f}%"


ROUTING_NOTE = ("A routing task: the entrants are routers (each at its defaults) and routing agents "
                "(LLMSchedCluster-v0) in front of the scenario's replicas; the best static heuristic is the router "
                "chosen over the validation seeds (the same rule as the static family's); hindsight is, per test "
                "workload, the best router found by a search with the simulator (the best three routers on the "
                "agents' validation seed, then the cross-entropy method "
                "over llm-d's scorer weights and exact or stale load signals: llmsched_gym/route_hindsight.py), "
                "never worse than any router's run there; normalised 0 = round-robin.")


def _seeds(p: dict[str, Any]) -> str:
    seeds = p.get("validation_seeds", [p.get("validation_seed")])
    return ", ".join(map(str, seeds))


def _choice_lines(results: dict[str, Any], name: str) -> list[str]:
    """How the task's best static heuristic was chosen: the top of the ranking over the validation
    seeds, with the member that seed 99 alone would have chosen where it differs."""
    t = results["tasks"][name]["task"]
    fam = results.get("static_family", {}).get(t.get("trained_on") or name)
    if not fam or "values" not in fam:
        return []
    ranked = list(fam["scores"].items())[:3]
    j = fam["validation_seeds"].index(fam["top_on_seed"])
    alone = rank_family({m: v[j:j + 1] for m, v in fam["values"].items()},
                        {m: c[j:j + 1] for m, c in fam["completed"].items()}, t["lower_is_better"])
    where = f" on {t['trained_on']}'s" if t.get("trained_on") else " on"
    line = (f"Chosen{where} validation seeds {', '.join(map(str, fam['validation_seeds']))} (mean ratio to each "
            "seed's best member): " + "; ".join(f"{m} {v:.3f}" for m, v in ranked) + ".")
    if alone and alone[0][0] != fam["chosen"]:
        score = fam["scores"].get(alone[0][0])  # absent: it fails on another validation seed
        how = f"mean ratio {score:.3f}" if score is not None else "it does not complete every validation seed"
        line += f" Seed {fam['top_on_seed']} alone would choose {alone[0][0]} ({how})."
    counts = results.get("reuse", {}).get("cells", {})
    test = counts.get("test", {}).get(name)
    if test:
        line += f" Test-seed cells taken from an earlier run (same inputs): {test[0]} of {test[1]}."
    return [line, ""]


def _reuse_lines(results: dict[str, Any]) -> list[str]:
    reuse = results.get("reuse")
    if not reuse:
        return []
    n = sum(c[0] for stage in reuse["cells"].values() for c in stage.values())
    total = sum(c[1] for stage in reuse["cells"].values() for c in stage.values())
    return [f"Reused: {n} of {total} cells (simulations, searches, agent episodes) were taken from "
            f"{', '.join(reuse['from'])}, where their inputs (task, entrant, seed; the hindsight search's starting "
            f"candidates and runs) are the same; the rest ran now. Witnesses: {len(reuse['witnesses'])} taken cells "
            "(one per task, the first hindsight search, the first episode of each agent and of its start) ran "
            "again and gave exactly the stored results. Each task says how many of its test-seed cells were "
            "taken.", ""]


def summary_table(results: dict[str, Any]) -> list[str]:
    """One line per task: information, hindsight, best static heuristic, best baseline, headroom."""
    lines = ["| task | information | metric | hindsight | best static heuristic | best baseline | headroom |",
             "|---|---|---|---|---|---|---|"]
    for name, r in results["tasks"].items():
        t = r["task"]
        room = _pct(r["headroom"]) + (" (no headroom)" if r.get("no_headroom") else "")
        lines.append(f"| {name}{synthetic_note(r.get('workload_source'))} | {r['information']} | {t['label']} | "
                     f"{r['hindsight_mean']:.4g} | {r['best_static']} ({r['best_static_mean']:.4g}) | "
                     f"{r['best_baseline']} ({r['best_baseline_mean']:.4g}) | {room} |")
    return lines


def leaderboard(results: dict[str, Any]) -> str:
    """The markdown leaderboard: the tasks' references, then per task every entrant with its figures."""
    from llmsched_gym.env import CLUSTER_ENV_ID

    p = results["protocol"]
    routing = [r["task"].get("routing", False) for r in results["tasks"].values()]
    scheduling = not routing or not all(routing)  # the static family's text applies
    env = (p.get("env", "?") if not any(routing) else CLUSTER_ENV_ID if not scheduling
           else f"{p.get('env', '?')} (routing tasks: {CLUSTER_ENV_ID})")
    lines = ["# llmsched benchmark", "",
             f"Environment {env}. Test seeds {p['test_seeds']} (paired: every entrant runs the same "
             f"workloads), validation seeds {_seeds(p)} (agents pick their best model on seed "
             f"{p.get('agent_validation_seed', p.get('validation_seed'))}), training seeds {p['train_seeds']}"
             + (" (quick sizes)." if p["quick"] else "."),
             "Information: what every entrant (and the env's observation) knows of output lengths: `clairvoyant` "
             "(true lengths, an oracle), `predicted` (a predictor with a stated error), `blind` (none). "
             + ("Best static heuristic: the member of the static family (queue order x batch former x max_num_seqs) "
             f"chosen on the validation seeds: {p.get('selection_rule', 'the best on the validation seed')}. "
             "Hindsight: per test workload the best schedule found with everything known "
             f"(search with the simulator from the family's best three on seed "
             f"{p.get('agent_validation_seed', p.get('validation_seed'))}, {p.get('hindsight_sims', '?')} "
             "simulations; a reference, never an entrant; never worse than a reference policy's run there). "
             if scheduling else "Best static heuristic and hindsight of the routing tasks: see each task. ")
             + ("Routing tasks: their references are routers (see each task). " if scheduling and any(routing) else "")
             + "Headroom = (best static heuristic - hindsight) / best static heuristic; under "
             f"{100 * p.get('no_headroom_below', NO_HEADROOM):.0f}% a task has no headroom.", "",
             *summary_table(results), "",
             "Per task: mean ± 95% t-interval; paired = the per-seed relative difference, mean ± 95% t-interval, "
             "and the verdict (better / worse / tie when the interval includes 0). Normalised score: 0 = "
             + ("fcfs" if not any(routing) else "round-robin" if not scheduling else "fcfs (round-robin for routing)")
             + ", "
             "1 = the best baseline at its defaults. An agent's `learned` line compares it with its own untrained "
             "start. Incomplete runs are listed last and never chosen as references. `(= X)`: identical to X on "
             "every test seed.", "", *_reuse_lines(results)]
    notes = results.get("notes", {})
    for name, r in results["tasks"].items():
        t = r["task"]
        note = [f"Note: {notes[name]}.", ""] if name in notes else []
        tag = synthetic_note(r.get("workload_source"))
        lines += [f"## {name}{tag} ({t['label']}, {'lower' if t['lower_is_better'] else 'higher'} is better)", "",
                  f"Information: **{r['information']}**. {t.get('why', '')}".rstrip() + ".", "",
                  *([f"{ROUTING_NOTE} Router search: {p.get('route_hindsight_sims', '?')} simulations per test "
                     "workload after the starting routers.", ""] if t.get("routing") else []),
                  f"Hindsight {r['hindsight_mean']:.4g}; best static heuristic **{r['best_static']}** "
                  f"({r['best_static_mean']:.4g}); best baseline **{r['best_baseline']}** ({r['best_baseline_mean']:.4g}); "
                  f"{r.get('zero', 'fcfs')} {r['fcfs_mean']:.4g}; headroom {_pct(r['headroom'])}"
                  + (" (no headroom)." if r.get("no_headroom") else "."), "",
                  *_choice_lines(results, name), *note,
                  "| entrant | kind | mean ± 95% CI | vs best baseline | vs best static | normalised |",
                  "|---|---|---|---|---|---|"]
        learned = []
        for row in r["rows"]:
            ci = f" ± {row['ci95']:.3g}" if np.isfinite(row["ci95"]) else ""
            norm = f"{row['normalised'] + 0.0:.3f}" if np.isfinite(row.get("normalised", math.nan)) else "-"
            name_cell = row["name"] + ("" if row["complete"] else " (incomplete)")
            if "same_as" in row:
                name_cell += f" (= {row['same_as']})"
            lines.append(f"| {name_cell} | {row['kind']} | {row['mean']:.4g}{ci} | "
                         f"{_paired_cell(row, 'paired_rel_vs_best', 'paired_rel_ci95', 'verdict_vs_best')} | "
                         f"{_paired_cell(row, 'paired_rel_vs_static', 'paired_rel_static_ci95', 'verdict_vs_static')} "
                         f"| {norm} |")
            if "learned" in row:
                x = row["learned"]
                learned.append(f"* learned: {row['name']} vs its start: {100 * x['rel']:+.1f}% ± "
                               f"{100 * x['ci95']:.1f}% ({x['verdict']})")
        lines.append("")
        if learned:
            lines += [*learned, ""]
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
    colors = {"agent": "tab:orange", "start": "tab:red", "static": "tab:green", "reference": "tab:grey"}
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 4.0), squeeze=False)
    for ax, name in zip(axes[0], tasks, strict=True):
        rows = [r for r in results["tasks"][name]["rows"] if np.isfinite(r.get("normalised", math.nan))][:10]
        y = np.arange(len(rows))[::-1]  # positions, not the names: two rows may share a shortened name
        ax.barh(y, [r["normalised"] for r in rows], color=[colors.get(r["kind"], "tab:blue") for r in rows])
        ax.set_yticks(y, [_short(r["name"]) for r in rows])
        ax.axvline(1.0, color="k", lw=0.8, ls="--")
        ax.axvline(0.0, color="grey", lw=0.8)
        ax.set_title(f"{name} ({results['tasks'][name]['information']})", fontsize=10)
        ax.set_xlabel("normalised score (0 fcfs, 1 best baseline)")
        ax.tick_params(labelsize=8)
    fig.tight_layout()
    fig.savefig(out / "scores.png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def _short(label: str, width: int = 32) -> str:
    """``label`` in at most ``width`` characters, its middle cut (an ellipsis marks it) so that the
    start (what it is) and the end (an agent's checkpoint, "untrained start") both show: a static
    heuristic or an agent has a name too long for a bar chart's axis (the leaderboard has it whole)."""
    if len(label) <= width:
        return label
    head = (width - 1) // 2
    return label[:head] + "\u2026" + label[len(label) - (width - 1 - head):]
