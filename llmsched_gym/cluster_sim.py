"""``simulate_cluster()``: run a scenario on N replicas behind a router (the cluster level,
:mod:`llmsched_gym.core.cluster`), the way :func:`llmsched_gym.sim.simulate` runs it on one.

>>> r = simulate_cluster("mooncake-conv", router="llm-d", n_replicas=8, seed=0,
...                      overrides={"workload.n_requests": 2000})
>>> r.summary["ttft_s"]["p90"], r.summary["cluster"]["prefix_hit_rate"]

Every replica runs the scenario's engine settings, batch-time model and the given replica policy
(its own instance); ``replica_overrides`` changes single replicas (``{2: {"latency":
"roofline:llama-3.1-8b/a100"}}``: a slower GPU for replica 2), so replicas may differ.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from llmsched_gym.config import ConfigError, explicit_engine_keys, merge_engine_overrides
from llmsched_gym.core.cluster import DEFAULT_REFRESH_S, Cluster, Replica, Router
from llmsched_gym.core.engine import EngineConfig
from llmsched_gym.core.information import information_of
from llmsched_gym.core.latency import make_latency
from llmsched_gym.core.request import Workload
from llmsched_gym.core.scenarios import build_scenario, resolve_scenario
from llmsched_gym.sim import make_policy


@dataclass
class ClusterResult:
    """What a cluster run produced: the summary (with its ``cluster`` part), the per-request
    table (with each request's ``replica``), the iteration log (with ``replica``) and the cluster."""

    summary: dict[str, Any]
    requests: dict[str, np.ndarray]
    iterations: dict[str, np.ndarray]
    cluster: Cluster = field(repr=False)


def make_cluster(scenario: str | dict = "mooncake-conv", policy: str | dict | None = None,
                 router: str | Router = "round-robin", n_replicas: int = 1, seed: int = 0,
                 overrides: dict[str, Any] | None = None, router_params: dict[str, Any] | None = None,
                 refresh_s: float = DEFAULT_REFRESH_S,
                 replica_overrides: dict[int, dict[str, Any]] | None = None,
                 workload: Workload | None = None) -> tuple[Cluster, dict[str, Any]]:
    """A ready-to-run :class:`Cluster` (see :func:`simulate_cluster`)."""
    if not isinstance(n_replicas, int) or isinstance(n_replicas, bool) or not 1 <= n_replicas <= 4096:
        raise ConfigError(f"cluster.n_replicas: expected an integer in 1..4096, got {n_replicas!r}")
    spec = resolve_scenario(scenario, overrides)
    pol = spec.get("policy", "fcfs") if policy is None else policy
    if workload is None:
        workload, config, latency = build_scenario(spec, seed)
    else:  # the scenario's engine and batch-time model only (its own requests are not built)
        config = EngineConfig(**spec.get("engine", {}))
        config.validate()
        latency = make_latency(spec.get("latency", "unit"))
    from baselines import check_applicable
    from baselines.routers import make_router

    rt = router if isinstance(router, Router) else make_router(router, **(router_params or {}))
    extra = replica_overrides or {}
    for r in extra:
        if not (isinstance(r, int) and 0 <= r < n_replicas):
            raise ConfigError(f"cluster.replica_overrides: replica {r!r} is not in 0..{n_replicas - 1}")
    replicas = []
    for r in range(n_replicas):
        over = extra.get(r, {})
        unknown = set(over) - {"policy", "latency", "engine"}
        if unknown:
            raise ConfigError(f"cluster.replica_overrides[{r}].{sorted(unknown)[0]}: unknown key "
                              "(allowed: policy, latency, engine)")
        sched = make_policy(over.get("policy", pol))
        check_applicable(sched, information_of(workload))
        cfg = EngineConfig(**{**asdict(config), **over.get("engine", {})})
        if sched.engine_overrides:
            cfg = EngineConfig(**merge_engine_overrides(asdict(cfg), sched.engine_overrides,
                                                        explicit_engine_keys(overrides)))
        lat = make_latency(over["latency"]) if "latency" in over else copy.deepcopy(latency)
        replicas.append(Replica(cfg, lat, sched))
    return Cluster(workload, replicas, rt, seed=seed, refresh_s=refresh_s), spec


def simulate_cluster(scenario: str | dict = "mooncake-conv", policy: str | dict | None = None,
                     router: str | Router = "round-robin", n_replicas: int = 1, seed: int = 0,
                     overrides: dict[str, Any] | None = None, router_params: dict[str, Any] | None = None,
                     refresh_s: float = DEFAULT_REFRESH_S,
                     replica_overrides: dict[int, dict[str, Any]] | None = None,
                     workload: Workload | None = None) -> ClusterResult:
    """Run ``scenario`` on ``n_replicas`` replicas of ``policy`` behind ``router``.

    :param scenario: as :func:`llmsched_gym.sim.simulate` (name, ``.yml`` file, trace or dict).
    :param policy: the replica scheduler (default: the scenario's).
    :param router: a router name (:data:`baselines.routers.ROUTERS`) or a :class:`Router`.
    :param n_replicas: N (1 runs the plain engine's exact result).
    :param seed: seeds the workload, the engines, the policies and the router.
    :param overrides: dotted scenario overrides (``{"workload.n_requests": 2000}``).
    :param router_params: the router's keyword parameters.
    :param refresh_s: load-signal refresh interval (0 = exact at every arrival).
    :param replica_overrides: per replica index, ``policy``, ``latency`` and ``engine`` fields that
        replace the scenario's for that replica.
    :param workload: requests to run instead of the scenario's (e.g. from
        :func:`llmsched_gym.core.sessions.prefix_groups`), on the scenario's engine settings.
    """
    t0 = time.perf_counter()
    cluster, spec = make_cluster(scenario, policy, router, n_replicas, seed, overrides, router_params, refresh_s,
                                 replica_overrides, workload)
    cluster.run()
    wall = time.perf_counter() - t0
    summary = cluster.summary(spec.get("name", "custom"), cluster.engines[0].scheduler.name, wall)
    return ClusterResult(summary, cluster.request_table(), cluster.iteration_log(), cluster)
