"""``llmsched evaluate`` / ``llmsched compare``: agents and baselines on the same seeded workloads.

Every policy runs on the scenario with the user's ``--set`` overrides, at every load level
(``workload.arrival.rate`` scaled) and every seed; agents play the env with their action masks
passed at every prediction, baselines run through ``simulate()`` (the numbers of ``llmsched run``).
Training-time episode settings (the short ``workload.n_requests`` of the hyperparameter file) do
not carry over: an agent is evaluated on the scenario as given here.

Note: the env runs a ``forbid`` scenario with ``preempt_lifo_recompute`` (an agent's batch must
run); under ``admission=future`` with oracle lengths the agent never overflows, so the engine
semantics match the baselines'.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from agents.agent import Agent, load_agent, run_episode
from agents.envs import make_env
from agents.report import (
    RunRecord,
    aggregate,
    print_table,
    record_from_result,
    run_baselines,
    scenario_spec,
    write_report,
)
from llmsched_gym.parallel import Cell, Settings, run_cells

_LOADED: dict[tuple, Agent] = {}
"""Agents loaded in this process, by (path, best, trust_model, model files' mtimes): a worker loads
each once."""

_MODEL_FILES = ("*.json", "*.safetensors", "*.zip", "*.pkl", "rl_module/*.pkl")


def _model_stamp(path: str, best: bool, trust_model: bool = False) -> tuple:
    p = Path(path)
    files = [p] if p.is_file() else [f for pattern in _MODEL_FILES for f in sorted(p.glob(pattern))]
    return (str(path), best, trust_model, tuple(f.stat().st_mtime_ns for f in files))


def cached_agent(path: str, best: bool = False, trust_model: bool = False) -> Agent:
    """:func:`~agents.agent.load_agent`, once per process for each version of the model files (a
    sweep's worker plays many cells of the same agent)."""
    import torch

    # one observation at a time: extra threads only add synchronisation (badly so on a busy machine)
    torch.set_num_threads(1)
    stamp = _model_stamp(path, best, trust_model)
    if stamp not in _LOADED:
        _LOADED[stamp] = load_agent(path, best=best, trust_model=trust_model)
    return _LOADED[stamp]


def agent_cell(args: tuple) -> RunRecord:
    """One sweep cell: ``(path, best, trust_model, name, scenario, overrides, load, seed)`` -> the
    agent's record on that workload (deterministic actions with masks)."""
    path, best, trust_model, name, scenario, overrides, load, seed = args
    agent = cached_agent(path, best, trust_model)
    env_kwargs = {k: v for k, v in agent.env_kwargs.items() if k not in ("overrides", "n_requests", "horizon_s")}
    env = make_env(scenario_spec(scenario, overrides, load), env_kwargs)
    try:
        summary, requests, iterations = run_episode(agent, env, seed)
    finally:
        env.close()
    summary["policy"] = name
    return record_from_result(name, seed, load, summary, requests, iterations)


def compare(scenario: str, seeds: list[int], loads: list[float], policies: list[str], models: list[str],
            overrides: dict[str, Any] | None, policy_params: dict[str, Any] | None, out: str | Path,
            plots: bool = True, best: bool = False, quiet: bool = False,
            settings: Settings | None = None, trust_model: bool = False) -> dict[str, Any]:
    """Run baselines ``policies`` and the agents in ``models`` and write the report into ``out``
    (``trust_model``: also load SB3 zips, see :func:`~agents.agent.load_agent`).

    Every (agent or baseline, load, seed) is one cell of a sweep run with ``settings`` (jobs,
    backend; :mod:`llmsched_gym.parallel`); the records are in the serial order whatever the
    settings. An agent with a failing cell is skipped, with the cell named.
    """
    t0 = time.perf_counter()
    settings = replace(settings or Settings(), progress=not quiet)
    agents = [load_agent(m, best=best, trust_model=trust_model) for m in models]
    names = [a.name for a in agents]
    if len(set(names)) != len(names):  # same algorithm, start and length: tell them apart by folder
        for a, m in zip(agents, models, strict=True):
            a.name = f"{a.name} [{Path(m).name}]"
        names = [a.name for a in agents]
    if len(set(names)) != len(names):
        raise ValueError(f"model: two agents share a name ({names}); give their run folders distinct names")
    # the serial path plays the agents loaded here
    _LOADED.update({_model_stamp(str(m), best, trust_model): a for m, a in zip(models, agents, strict=True)})
    cells = [Cell(f"{a.name} seed {seed} load {load:g}", (str(m), best, trust_model, a.name, scenario, overrides, load, seed))
             for a, m in zip(agents, models, strict=True) for load in loads for seed in seeds]
    outcomes = run_cells(cells, agent_cell, settings, label="agents")
    skipped: dict[str, str] = {}
    for cell, o in zip(cells, outcomes, strict=True):
        if not o.ok:
            skipped.setdefault(cell.args[2], f"{o.error} (cell {cell.name})")
    records = [o.value for c, o in zip(cells, outcomes, strict=True) if o.ok and c.args[2] not in skipped]
    base, base_skipped = run_baselines(scenario, policies, seeds, loads, overrides, policy_params, settings)
    records += base
    skipped.update(base_skipped)
    meta = {"scenario": scenario, "seeds": seeds, "loads": loads, "overrides": overrides or {},
            "policy_params": policy_params or {}, "models": [str(m) for m in models],
            "agent_env_kwargs": {a.name: a.env_kwargs for a in agents}}
    results = write_report(records, out, meta, skipped, names, plots)
    if not quiet:
        from llmsched_gym.data import synthetic_note

        print_table(aggregate(records), names,
                    title=scenario + (synthetic_note(records[0].summary.get("workload_source")) if records else ""))
        for k, v in skipped.items():
            print(f"  skipped {k}: {v}")
        print(f"report: {Path(out) / 'report.md'} ({time.perf_counter() - t0:.1f}s)")
    return results
