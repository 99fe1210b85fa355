"""Run a paper's reproduction (:func:`run_paper`, ``llmsched reproduce PAPER``) and the hindsight
optimum of a scenario's workload (:func:`optimum_for_scenario`, ``llmsched optimum``).

``run_paper`` runs ``llmsched_gym/reproduce/PAPER.py``'s ``run`` and writes
``runs/reproduce/PAPER/report.md`` with plots. ``optimum_for_scenario`` builds a round-mode
instance from a scenario's workload (arrival round ``floor(arrival_s / round_s)``, true output
lengths, ``M = engine.kv_capacity_tokens``) and solves the hindsight optimum of Jaillet et al. 2025
(Appendix B.1), optionally next to a policy's run.
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Any

from llmsched_gym.config import ConfigError
from llmsched_gym.parallel import Settings, configured
from llmsched_gym.reproduce import PAPERS
from llmsched_gym.reproduce.report import policy_vs_optimum, write_report


def run_paper(paper: str, quick: bool, out: str | Path | None = None, settings: Settings | None = None) -> Path:
    """Run one paper's reproduction and write its report; returns the report path. ``settings``
    (jobs, backend) run its sweeps in parallel where the paper's module has them as one
    (:func:`llmsched_gym.reproduce.jaillet.run_many`); the report is the same."""
    if paper not in PAPERS:
        raise ConfigError(f"reproduce: unknown paper {paper!r}; allowed: {', '.join(PAPERS)}")
    t0 = time.perf_counter()
    with configured(settings or Settings()):
        report = importlib.import_module(f"llmsched_gym.reproduce.{paper}").run(quick)
    elapsed = time.perf_counter() - t0
    path = write_report(report, Path(out) if out else Path("runs/reproduce") / paper, elapsed, quick)
    # the report's title names the paper and, when a trace was missing, its synthetic stand-in
    print(f"{paper} ({report.title}): {sum(r.verdict == 'reproduced' for r in report.rows)}/{len(report.rows)} "
          "rows reproduced; "
          f"took {elapsed:.1f} s; report: {path}")
    return path


def optimum_for_scenario(scenario: str, sets: dict[str, Any], method: str = "auto", seed: int = 0,
                         round_s: float = 1.0, policy: str | None = None) -> dict[str, Any]:
    """The hindsight optimum of ``scenario``'s workload as a round-mode instance (and, with
    ``policy``, that policy's round-mode TEL, regret and ratio)."""
    from llmsched_gym.core.scenarios import build_scenario, get_scenario
    from llmsched_gym.optimum import solve_optimum
    from llmsched_gym.reproduce.report import instance_from_workload

    spec = get_scenario(scenario, {k: v for k, v in sets.items() if not k.startswith("policy.")})
    workload, config, _ = build_scenario(spec, seed)
    inst = instance_from_workload(workload, config.kv_capacity_tokens, round_s)
    opt = solve_optimum(inst, method=method)  # type: ignore[arg-type]
    out: dict[str, Any] = {"n": inst.n, "M": inst.M, "method": opt.method, "status": opt.status, "tel": opt.tel,
                           "ael": opt.ael, "lower_bound": opt.lower_bound, "wall_s": opt.wall_s,
                           "starts": None if opt.starts is None else [int(s) for s in opt.starts]}
    if policy is not None:
        s = policy_vs_optimum(inst, policy, method)
        out.update({k: s[k] for k in ("regret", "ratio_to_opt") if k in s})
        out["policy"] = policy
    return out


