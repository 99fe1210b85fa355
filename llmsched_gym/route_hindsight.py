"""The hindsight reference of a routing task: the best router found for one workload with the
simulator in the loop, everything known.

A routing task (``llmsched benchmark``, ``routing=True``) asks which replica of a cluster serves
each request. Its hindsight reference is, per test workload, the best result of a search over a
family of routers, each run on that very workload (same scenario, same seed: what the entrants
see), so that the choice of router is made *after* seeing how every candidate did on it:

1. **Start**: the starting routers (by default every router of :data:`baselines.routers.ROUTERS`
   at its defaults) run once each; the best is the *start*. The result is never worse than it.
2. **Search** (the cross-entropy method: Rubinstein and Kroese 2004, "The Cross-Entropy Method",
   chapter 4) over llm-d's scorer pipeline (:class:`baselines.route_llmd.LLMD`, precise prefix
   scoring): the weights of its four scorers, ``w_prefix`` (the share of the prompt the replica's
   prefix cache holds), ``w_queue`` (queued requests), ``w_kv`` (free KV) and ``w_active``
   (requests in flight), each in ``[0, WEIGHT_MAX]``, and the load-signal refresh interval
   (:data:`REFRESHES`: exact signals at every arrival, or the scenario's snapshots; a reference
   may read exact load, no deployed router does). The first population is centred on llm-d's
   defaults (2, 1, 1, 0); each later one on the elite of the one before.

Every candidate runs :func:`~llmsched_gym.cluster_sim.simulate_cluster`; a run that rejects or
leaves a request unserved never counts (the benchmark's rule). The search is deterministic: the
same arguments and ``rng`` give the same result (the routers' own tie-breaking draws are seeded by
the workload's seed).

It is a reference, not an entrant: it picks its router per workload after the fact. Budget: a run
is one cluster simulation (about 1 s for 1,500 prefix-groups-8 requests, 2-3 s for 1,000
mooncake-conv-8 requests, on one core of a busy machine); ``sims`` counts the search's runs,
after the starting routers.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from llmsched_gym.config import ConfigError
from llmsched_gym.core.metrics import metric_value
from llmsched_gym.hindsight import HindsightResult, served

WEIGHTS = ("w_prefix", "w_queue", "w_kv", "w_active")
"""llm-d's scorer weights the search moves (:class:`baselines.route_llmd.LLMD`)."""
WEIGHT_MAX = 4.0
"""Each weight lies in ``[0, WEIGHT_MAX]``."""
REFRESHES = (0.0, None)
"""Load-signal refresh intervals the search tries: exact (0) or the scenario's (``None``)."""
DEFAULT_ROUTE_SIMS = 40
"""Search runs after the starting routers."""
POPULATION = 8
"""Candidates per cross-entropy generation (fewer when the budget is smaller)."""


def _label(spec: dict[str, Any]) -> str:
    extra = ",".join(f"{k}={v}" for k, v in spec.items() if k != "name")
    return f"{spec['name']}:{extra}" if extra else spec["name"]


class _RouteRunner:
    """Runs routers on one workload (a scenario, its overrides, a seed) and scores them."""

    def __init__(self, scenario: str | dict, overrides: dict[str, Any], seed: int, metric: str,
                 lower_is_better: bool) -> None:
        self.scenario, self.overrides, self.seed, self.metric = scenario, dict(overrides), seed, metric
        self.sign = 1.0 if lower_is_better else -1.0
        self.n_sims = 0

    def run(self, spec: dict[str, Any]) -> tuple[float, float]:
        """``(cost, value)`` of the router ``spec`` (``{"name": ..., **params}``, and optionally
        ``refresh_s``); cost is the value signed so that lower is better, ``inf`` for a run that
        does not count."""
        from llmsched_gym.cluster_sim import simulate_cluster

        params = {k: v for k, v in spec.items() if k not in ("name", "refresh_s")}
        s = simulate_cluster(self.scenario, router=spec["name"], seed=self.seed, overrides=self.overrides,
                             router_params=params or None, refresh_s=spec.get("refresh_s")).summary
        self.n_sims += 1
        value = metric_value(s, self.metric)
        cost = self.sign * value if served(s) and math.isfinite(value) else math.inf
        return cost, value


def route_hindsight(scenario: str | dict, overrides: dict[str, Any] | None = None, seed: int = 0,
                    metric: str = "serving.mean_e2el_ms", lower_is_better: bool = True, *,
                    start: list[str | dict[str, Any]] | None = None, sims: int = DEFAULT_ROUTE_SIMS,
                    rng: int = 0) -> HindsightResult:
    """Search the best router of one workload with everything known (module docstring).

    :param scenario: a scenario that declares its cluster (``mooncake-conv-8``, ``prefix-groups-8``).
    :param overrides: dotted overrides (the task's size).
    :param seed: the workload's seed (the same workload the entrants run).
    :param metric: dotted path into the cluster summary, e.g. ``serving.p90_ttft_ms``.
    :param lower_is_better: the metric's direction.
    :param start: starting routers (names or ``{"name": ..., **params}``); default: every router
        at its defaults.
    :param sims: search runs after the starting routers (0: the best start only).
    :param rng: seeds the search (same arguments and ``rng``: the same result).
    :returns: a :class:`~llmsched_gym.hindsight.HindsightResult` whose ``spec`` is the best router
        (``{"name": "llm-d", "prefix": "precise", "w_prefix": ..., "refresh_s": ...}`` when the
        search found it) and ``value`` never worse than the best start's.
    """
    from baselines.routers import ROUTERS

    if isinstance(sims, bool) or not isinstance(sims, int) or sims < 0:
        raise ConfigError(f"sims: expected an integer >= 0, got {sims!r}")
    t0 = time.perf_counter()
    runner = _RouteRunner(scenario, overrides or {}, seed, metric, lower_is_better)
    starts = [{"name": s} if isinstance(s, str) else dict(s) for s in (start if start is not None else list(ROUTERS))]
    if not starts:
        raise ConfigError("start: needs at least one router")
    for s in starts:
        if s.get("name") not in ROUTERS:
            raise ConfigError(f"start: unknown router {s.get('name')!r}; allowed: {', '.join(ROUTERS)}")
    trace: list[float] = []
    best = {"cost": math.inf, "value": math.nan, "spec": starts[0]}

    def note(cost: float, value: float, spec: dict[str, Any]) -> None:
        if cost < best["cost"]:
            best.update(cost=cost, value=value, spec=dict(spec))
        trace.append(runner.sign * best["cost"])

    for s in starts:
        note(*runner.run(s), s)
    s_value, s_spec = best["value"], dict(best["spec"])
    _cross_entropy(runner, sims, np.random.default_rng(rng), note)
    return HindsightResult(value=best["value"], start_value=s_value, start_spec=s_spec, spec=best["spec"],
                           priority=None, n_sims=runner.n_sims, wall_s=time.perf_counter() - t0,
                           lower_is_better=lower_is_better, trace=trace)


def _cross_entropy(runner: _RouteRunner, sims: int, gen: np.random.Generator, note: Any) -> None:
    """The search of step 2: generations of ``POPULATION`` llm-d weight vectors (and refresh
    intervals) drawn around the elite of the one before, until ``sims`` runs are spent."""
    from baselines.route_llmd import LLMD

    mu = np.array([float(LLMD.params[w]) for w in WEIGHTS])
    sd = np.full(len(WEIGHTS), 1.0)
    p_refresh = np.full(len(REFRESHES), 1.0 / len(REFRESHES))
    left = sims
    while left > 0:
        pop = min(POPULATION, left)
        samples = []
        for _ in range(pop):
            w = np.clip(gen.normal(mu, sd), 0.0, WEIGHT_MAX)
            k = int(gen.choice(len(REFRESHES), p=p_refresh))
            spec: dict[str, Any] = {"name": "llm-d", "prefix": "precise",
                                    **{n: round(float(x), 3) for n, x in zip(WEIGHTS, w, strict=True)}}
            if REFRESHES[k] is not None:
                spec["refresh_s"] = REFRESHES[k]
            cost, value = runner.run(spec)
            note(cost, value, spec)
            samples.append((cost, w, k))
        left -= pop
        samples.sort(key=lambda x: x[0])
        elite = [x for x in samples[: max(2, pop // 4)] if math.isfinite(x[0])]
        if not elite:
            continue
        x = np.array([e[1] for e in elite])
        mu = 0.3 * mu + 0.7 * x.mean(axis=0)
        sd = np.maximum(0.3 * sd + 0.7 * x.std(axis=0), 0.1)
        p_refresh = 0.5 * p_refresh + 0.5 * np.bincount([e[2] for e in elite], minlength=len(REFRESHES)) / len(elite)


__all__ = ["DEFAULT_ROUTE_SIMS", "POPULATION", "REFRESHES", "WEIGHTS", "WEIGHT_MAX", "route_hindsight"]
