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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents.agent import Agent, load_agent, make_env, run_episode
from agents.report import (
    RunRecord,
    aggregate,
    print_table,
    record_from_result,
    run_baselines,
    scenario_spec,
    write_report,
)


def run_agent(agent: Agent, scenario: str, seeds: list[int], loads: list[float], overrides: dict[str, Any] | None,
              progress: Callable[[str], None] | None = None) -> list[RunRecord]:
    """The agent on every (load, seed), deterministic actions with masks."""
    env_kwargs = {k: v for k, v in agent.env_kwargs.items() if k not in ("overrides", "n_requests", "horizon_s")}
    records = []
    for load in loads:
        env = make_env(scenario_spec(scenario, overrides, load), env_kwargs)
        t0 = time.perf_counter()
        for seed in seeds:
            summary, requests, iterations = run_episode(agent, env, seed)
            summary["policy"] = agent.name
            records.append(record_from_result(agent.name, seed, load, summary, requests, iterations))
        env.close()
        if progress:
            progress(f"{agent.name} x{len(seeds)} seeds at load {load:g} ({time.perf_counter() - t0:.1f}s)")
    return records


def compare(scenario: str, seeds: list[int], loads: list[float], policies: list[str], models: list[str],
            overrides: dict[str, Any] | None, policy_params: dict[str, Any] | None, out: str | Path,
            plots: bool = True, best: bool = False, quiet: bool = False) -> dict[str, Any]:
    """Run baselines ``policies`` and the agents in ``models`` and write the report into ``out``."""
    import torch

    # one observation at a time: extra threads only add synchronisation (badly so on a busy machine)
    torch.set_num_threads(1)
    say = None if quiet else (lambda m: print(f"  {m}", flush=True))
    t0 = time.perf_counter()
    agents = [load_agent(m, best=best) for m in models]
    names = [a.name for a in agents]
    if len(set(names)) != len(names):  # same algorithm, start and length: tell them apart by folder
        for a, m in zip(agents, models, strict=True):
            a.name = f"{a.name} [{Path(m).name}]"
        names = [a.name for a in agents]
    if len(set(names)) != len(names):
        raise ValueError(f"model: two agents share a name ({names}); give their run folders distinct names")
    records: list[RunRecord] = []
    for agent in agents:
        records += run_agent(agent, scenario, seeds, loads, overrides, say)
    base, skipped = run_baselines(scenario, policies, seeds, loads, overrides, policy_params, say)
    records += base
    meta = {"scenario": scenario, "seeds": seeds, "loads": loads, "overrides": overrides or {},
            "policy_params": policy_params or {}, "models": [str(m) for m in models],
            "agent_env_kwargs": {a.name: a.env_kwargs for a in agents}}
    results = write_report(records, out, meta, skipped, names, plots)
    if not quiet:
        print_table(aggregate(records), names, title=scenario)
        for k, v in skipped.items():
            print(f"  skipped {k}: {v}")
        print(f"report: {Path(out) / 'report.md'} ({time.perf_counter() - t0:.1f}s)")
    return results
