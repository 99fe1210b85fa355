"""``simulate_cluster()``: run a scenario on N replicas behind a router (the cluster level,
:mod:`llmsched_gym.core.cluster`), the way :func:`llmsched_gym.sim.simulate` runs it on one.

>>> r = simulate_cluster("mooncake-conv", router="llm-d", n_replicas=8, seed=0,
...                      overrides={"workload.n_requests": 2000})
>>> r.summary["ttft_s"]["p90"], r.summary["cluster"]["prefix_hit_rate"]

Every replica runs the scenario's engine settings, batch-time model and the given replica policy
(its own instance); ``replica_overrides`` changes single replicas (``{2: {"latency":
"roofline:llama-3.1-8b/a100"}}``: a slower GPU for replica 2), so replicas may differ.

A scenario may declare its cluster (``llmsched_gym/scenarios/mooncake-conv-8.yml``)::

    cluster:
      n_replicas: 8
      router: llm-d                  # or NAME:key=value,..., e.g. llm-d:prefix=approximate
      router_params: {w_queue: 2.0}  # over the router's defaults
      refresh_s: 0.1                 # load-signal snapshots (0: exact at every arrival)
      replicas:                      # per replica index: what differs there
        7: {latency: "roofline:llama-3.1-8b/a100", engine: {kv_capacity_tokens: 200000}}
      migration: {interval_s: 0.05, threshold: 1000}   # Llumnix's live migration (default: none)

the arguments of :func:`simulate_cluster` override it.

Disaggregated serving (:mod:`llmsched_gym.core.disagg`): ``pools`` splits the replicas into a
prefill pool and a decode pool (and optionally a mixed pool), each with its own size, batch-time
model, engine settings, policy and router; ``transfer`` sets the link the KV crosses and
``decider`` which requests are disaggregated:

>>> r = simulate_cluster("azure-conv", pools={"prefill": {"n": 2}, "decode": {"n": 2, "policy": "vllm-v1"}},
...                      transfer={"bandwidth_gb_s": 50.0}, decider={"kind": "prompt_len", "min": 128})
>>> r.summary["pools"]["transfer"]["count"], r.requests["decode_replica"]
"""

from __future__ import annotations

import copy
import inspect
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, ParamSpec, TypeVar

import numpy as np

from llmsched_gym.config import ConfigError, check_cluster, explicit_engine_keys, merge_engine_overrides
from llmsched_gym.core.cluster import DEFAULT_REFRESH_S, Cluster, Replica, Router
from llmsched_gym.core.disagg import ROLES, DisaggCluster, PairRouter, transfer_model_of
from llmsched_gym.core.engine import EngineConfig
from llmsched_gym.core.information import information_of
from llmsched_gym.core.latency import make_latency
from llmsched_gym.core.metrics import add_slo
from llmsched_gym.core.request import Workload
from llmsched_gym.core.scenarios import build_scenario, resolve_scenario
from llmsched_gym.sim import make_policy


@dataclass
class ClusterResult:
    """What a cluster run produced: the summary (with its ``cluster`` part), the per-request
    table (with each request's ``replica``; with pools its ``prefill_replica``,
    ``decode_replica``, transfer times and waits), the iteration log (with ``replica``) and the
    cluster (a :class:`DisaggCluster` with pools)."""

    summary: dict[str, Any]
    requests: dict[str, np.ndarray]
    iterations: dict[str, np.ndarray]
    cluster: Cluster | DisaggCluster = field(repr=False)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _parameters_of(build: Callable[_P, Any]) -> Callable[[Callable[..., _R]], Callable[_P, _R]]:
    """Gives the decorated pass-through function ``build``'s parameters (its signature and
    annotations, for ``help()``, documentation and type checkers), keeping its own return type:
    one parameter list for :func:`make_cluster` and :func:`simulate_cluster`."""

    def use(run: Callable[..., _R]) -> Callable[_P, _R]:
        ret = run.__annotations__["return"]
        run.__signature__ = inspect.signature(build).replace(return_annotation=ret)
        run.__annotations__ = {**build.__annotations__, "return": ret}
        return run

    return use


def make_cluster(scenario: str | dict = "mooncake-conv", policy: str | dict | None = None,
                 router: str | Router | None = None, n_replicas: int | None = None, seed: int = 0,
                 overrides: dict[str, Any] | None = None, router_params: dict[str, Any] | None = None,
                 refresh_s: float | None = None,
                 replica_overrides: dict[int, dict[str, Any]] | None = None,
                 workload: Workload | None = None, pools: dict[str, dict[str, Any]] | None = None,
                 transfer: dict[str, Any] | None = None,
                 decider: str | dict[str, Any] = "always",
                 migration: dict[str, Any] | None = None) -> tuple[Cluster | DisaggCluster, dict[str, Any]]:
    """A ready-to-run :class:`Cluster` and the checked scenario; a :class:`DisaggCluster` with
    ``pools``. The parameters are :func:`simulate_cluster`'s (documented there), which builds on this."""
    spec = resolve_scenario(scenario, overrides)
    section = spec.get("cluster") or {}
    if pools is None and section.get("pools"):  # the scenario's pools; the arguments win
        pools = section["pools"]
        transfer = section.get("transfer") if transfer is None else transfer
        decider = section.get("decider", "always") if decider == "always" else decider
        router = section.get("router") if router is None else router
    elif pools is None and ("transfer" in section or "decider" in section):
        raise ConfigError("cluster.transfer: transfer and decider apply to pools; set cluster.pools as well")
    if pools is None and (transfer is not None or decider != "always"):
        raise ConfigError("cluster.transfer: transfer and decider apply to pools; give pools= as well")
    if pools is not None and migration is not None:
        raise ConfigError("cluster.migration: live migration runs between the replicas of one pool; "
                          "it is not available with pools")
    if pools is None:
        c = cluster_settings(spec, router, n_replicas, router_params, refresh_s, replica_overrides, migration)
        n_replicas = c["n_replicas"]
        migration = c["migration"]
    elif n_replicas is not None and (isinstance(n_replicas, bool) or not isinstance(n_replicas, int)):
        raise ConfigError(f"cluster.n_replicas: expected an integer in 1..4096, got {n_replicas!r}")
    pol = spec.get("policy", "fcfs") if policy is None else policy
    engine_spec = {k: v for k, v in spec.items() if k != "cluster"}
    if workload is None:
        workload, config, latency = build_scenario(engine_spec, seed, checked=True)
    else:  # the scenario's engine and batch-time model only (its own requests are not built)
        config = EngineConfig(**spec.get("engine", {}))
        config.validate()
        latency = make_latency(spec.get("latency", "unit"))
    from baselines import check_applicable

    if pools is not None:
        return _disagg(workload, config, latency, pol, router, n_replicas or 1, seed, overrides, router_params,
                       replica_overrides, pools, transfer, decider), spec
    rt = c["router"] if isinstance(c["router"], Router) else build_router(c["router"], c["router_params"])
    extra = c["replicas"]
    replicas = []
    for r in range(n_replicas):
        over = extra.get(r, {})
        sched = make_policy(over.get("policy", pol))
        check_applicable(sched, information_of(workload))
        cfg = EngineConfig(**{**asdict(config), **over.get("engine", {})})
        if sched.engine_overrides:
            cfg = EngineConfig(**merge_engine_overrides(asdict(cfg), sched.engine_overrides,
                                                        explicit_engine_keys(overrides) | set(over.get("engine", {}))))
        lat = make_latency(over["latency"]) if "latency" in over else copy.deepcopy(latency)
        replicas.append(Replica(cfg, lat, sched))
    return Cluster(workload, replicas, rt, seed=seed, refresh_s=c["refresh_s"], migration=migration), spec


def build_router(spec: str, params: dict[str, Any] | None = None, field: str = "cluster.router") -> Router:
    """The router of ``spec`` (``NAME`` or ``NAME:key=value,...``, :data:`baselines.routers.ROUTERS`)
    with ``params`` over the spec's; every error is one line naming ``field``
    (``cluster.router.w_queue: expected a number, got 'heavy'``)."""
    from baselines import parse_spec
    from baselines.routers import make_router

    parsed = parse_spec(spec, field)
    name, own = (parsed, {}) if isinstance(parsed, str) else (parsed["name"], {
        k: v for k, v in parsed.items() if k != "name"})
    try:
        return make_router(name, **{**own, **(params or {})})
    except ConfigError as e:  # router: / router.KEY: -> the caller's field
        text = str(e)
        raise ConfigError(field + text[len("router"):] if text.startswith("router") else text) from None


def cluster_settings(spec: dict[str, Any], router: str | Router | None = None, n_replicas: int | None = None,
                     router_params: dict[str, Any] | None = None, refresh_s: float | None = None,
                     replica_overrides: dict[int, dict[str, Any]] | None = None,
                     migration: dict[str, Any] | None = None) -> dict[str, Any]:
    """The cluster a run builds: each argument given here, else the scenario's ``cluster:`` section
    (checked by :func:`llmsched_gym.config.check_cluster`), else the default (1 replica,
    round-robin, :data:`~llmsched_gym.core.cluster.DEFAULT_REFRESH_S`). A router given as
    ``NAME:key=value,...`` carries its parameters; ``router_params`` are added to them (a router
    given here replaces the scenario's along with its parameters).

    :returns: ``n_replicas``, ``router`` (a name or a :class:`Router`), ``router_params``,
        ``refresh_s``, ``replicas`` (index -> overrides) and ``migration`` (``None``: none), checked.
    """
    section = dict(spec.get("cluster") or {})
    if n_replicas is not None:
        section["n_replicas"] = n_replicas
    if router is not None and not isinstance(router, Router):
        section["router"] = router
        section.pop("router_params", None)
    if router_params is not None:
        section["router_params"] = {**section.get("router_params", {}), **router_params}
    if refresh_s is not None:
        section["refresh_s"] = refresh_s
    if replica_overrides is not None:
        section["replicas"] = {**section.get("replicas", {}), **replica_overrides}
    if isinstance(migration, dict):
        section["migration"] = migration
    c = check_cluster(section)
    name, params = "round-robin", {}
    if isinstance(router, Router):
        name = router
    elif "router" in c:
        from baselines import parse_spec

        parsed = parse_spec(c["router"], "cluster.router")
        name, params = (parsed, {}) if isinstance(parsed, str) else (parsed["name"], {
            k: v for k, v in parsed.items() if k != "name"})
    return {"n_replicas": c.get("n_replicas", 1), "router": name,
            "router_params": {**params, **c.get("router_params", {})},
            "refresh_s": c.get("refresh_s", DEFAULT_REFRESH_S), "replicas": c.get("replicas", {}),
            "migration": c.get("migration") if migration is None or isinstance(migration, dict) else migration}


_POOL_KEYS = ("n", "latency", "engine", "policy", "router", "model", "tp")


def _disagg(workload, config, latency, pol, router, n_replicas, seed, overrides, router_params,
            replica_overrides, pools, transfer, decider) -> DisaggCluster:
    """The disaggregated cluster of ``pools`` (see :func:`simulate_cluster`)."""
    from baselines import check_applicable
    from baselines.route_pair import make_pair_router
    from llmsched_gym.core.models import get_model

    if replica_overrides:
        raise ConfigError("cluster.replica_overrides: with pools, set latency, engine and policy per pool")
    if not isinstance(pools, dict) or not pools:
        raise ConfigError(f"pools: expected a mapping of prefill, decode (and mixed) pools, got {pools!r}")
    for role, p in pools.items():
        if role not in ROLES:
            raise ConfigError(f"pools.{role}: unknown pool (allowed: {', '.join(ROLES)})")
        if not isinstance(p, dict):
            raise ConfigError(f"pools.{role}: expected a mapping of pool settings, got {p!r}")
        unknown = sorted(set(p) - set(_POOL_KEYS))
        if unknown:
            raise ConfigError(f"pools.{role}.{unknown[0]}: unknown setting (allowed: {', '.join(_POOL_KEYS)})")
        n = p.get("n", 1)
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 4096:
            raise ConfigError(f"pools.{role}.n: expected an integer in 0..4096, got {n!r}")
        for key in ("model", "tp"):
            if key in p and not isinstance(p[key], str if key == "model" else int):
                raise ConfigError(f"pools.{role}.{key}: expected {'a model name' if key == 'model' else 'an integer'}, "
                                  f"got {p[key]!r}")
    roles = [role for role in ROLES for _ in range(pools.get(role, {}).get("n", 1) if role in pools else 0)]
    if n_replicas not in (1, len(roles)):
        raise ConfigError(f"cluster.n_replicas: {n_replicas} differs from the pools' {len(roles)} replicas; "
                          "give the sizes through pools.*.n")
    if not any(x in ("decode", "mixed") for x in roles):
        raise ConfigError("pools.decode.n: expected at least one decode (or mixed) replica")
    dec = decider if isinstance(decider, str) else dict(decider)
    if dec != "never" and not any(x in ("prefill", "mixed") for x in roles):
        raise ConfigError("pools.prefill.n: expected at least one prefill (or mixed) replica unless decider is 'never'")
    replicas, models = [], []
    for role in roles:
        p = pools[role]
        sched = make_policy(p.get("policy", pol))
        check_applicable(sched, information_of(workload))
        cfg = EngineConfig(**{**asdict(config), **p.get("engine", {})})
        if sched.engine_overrides:
            cfg = EngineConfig(**merge_engine_overrides(asdict(cfg), sched.engine_overrides,
                                                        explicit_engine_keys(overrides)))
        lat = make_latency(p["latency"]) if "latency" in p else copy.deepcopy(latency)
        rep = Replica(cfg, lat, sched)
        replicas.append(rep)
        model, tp = transfer_model_of(rep)
        models.append((get_model(p["model"]) if "model" in p else model, p.get("tp", tp)))
    from baselines.route_pair import PAIR_ROUTERS

    if isinstance(router, PairRouter):
        rt = router
    elif isinstance(router, str) and router in PAIR_ROUTERS:
        rt = make_pair_router(router, dec, router_params)
    else:
        names = dict(router) if isinstance(router, dict) else {"prefill": router, "decode": router}
        unknown = sorted(set(names) - {"prefill", "decode"})
        if unknown:
            raise ConfigError(f"router.{unknown[0]}: unknown pool (allowed: prefill, decode)")
        field = {k: "router" if not isinstance(router, dict) else f"router.{k}" for k in names}
        for role in ("prefill", "decode"):
            if "router" in pools.get(role, {}):
                names[role], field[role] = pools[role]["router"], f"pools.{role}.router"
        built = {k: v if isinstance(v, Router) else build_router("round-robin" if v is None else v, router_params,
                                                                  field[k]) for k, v in names.items()}
        rt = make_pair_router(built, dec)
    return DisaggCluster(workload, replicas, roles, rt, transfer, seed, models)


@_parameters_of(make_cluster)
def simulate_cluster(*args: Any, **kwargs: Any) -> ClusterResult:
    """Run ``scenario`` on ``n_replicas`` replicas of ``policy`` behind ``router``.

    Every cluster setting left ``None`` comes from the scenario's ``cluster:`` section (see
    :func:`cluster_settings`), else its default.

    :param scenario: as :func:`llmsched_gym.sim.simulate` (name, ``.yml`` file, trace or dict).
    :param policy: the replica scheduler (default: the scenario's).
    :param router: a router name (:data:`baselines.routers.ROUTERS`), ``NAME:key=value,...`` or a
        :class:`Router` (default: the scenario's, else round-robin).
    :param n_replicas: N (1 runs the plain engine's exact result; default: the scenario's, else 1).
    :param seed: seeds the workload, the engines, the policies and the router.
    :param overrides: dotted scenario overrides (``{"workload.n_requests": 2000}``,
        ``{"cluster.refresh_s": 0}``).
    :param router_params: the router's keyword parameters (over those of its spec).
    :param refresh_s: load-signal refresh interval (0 = exact at every arrival; default: the
        scenario's, else 0.1 s).
    :param replica_overrides: per replica index, ``policy``, ``latency`` and ``engine`` fields that
        replace the scenario's for that replica (over the scenario's ``cluster.replicas``).
    :param workload: requests to run instead of the scenario's (e.g. from
        :func:`llmsched_gym.core.sessions.prefix_groups`), on the scenario's engine settings.
    :param pools: disaggregated serving (:mod:`llmsched_gym.core.disagg`): ``{"prefill": {...},
        "decode": {...}, "mixed": {...}}``, each pool with ``n`` (replicas, default 1) and any of
        ``latency``, ``engine`` (field overrides), ``policy``, ``router`` (that pool's router,
        else ``router``), ``model`` and ``tp`` (what its KV transfers are sized with; default the
        latency model's). ``n_replicas`` is then the pools' total (or left at 1); routing uses
        exact load signals (``refresh_s`` is not used).
    :param transfer: the KV link, :class:`~llmsched_gym.core.transfer.TransferConfig`'s fields
        ``bandwidth_gb_s``, ``base_s``, ``shared_link`` (or ``link``: a name of
        :data:`~llmsched_gym.core.transfer.LINKS`), and ``first_token``: where a disaggregated
        request's first token counts, ``"prefill"`` (DistServe's, the default) or ``"transfer"``
        (:data:`~llmsched_gym.core.disagg.FIRST_TOKEN`).
    :param decider: which requests are disaggregated (:class:`~llmsched_gym.core.disagg.Decider`):
        ``"always"``, ``"never"``, ``{"kind": "prompt_len", "min": M}``, ``{"kind": "prefix_hit",
        "min_uncached": M}``.
    :param migration: Llumnix's live migration between replicas (:class:`~llmsched_gym.core.cluster.Migration`
        settings: ``interval_s``, ``threshold``, ``bandwidth_gb_s``, ``base_s``, ``tp``); ``None``: none
        (not with ``pools``).

    With pools, ``router`` is a router name for both pools, ``{"prefill": name, "decode": name}``,
    a pair router's name (:data:`baselines.route_pair.PAIR_ROUTERS`: ``splitwise-mixed``) or a
    :class:`~llmsched_gym.core.disagg.PairRouter`.
    """
    t0 = time.perf_counter()
    cluster, spec = make_cluster(*args, **kwargs)
    cluster.run()
    wall = time.perf_counter() - t0
    summary = cluster.summary(spec.get("name", "custom"), cluster.engines[0].scheduler.name, wall)
    requests = cluster.request_table()
    add_slo(summary, requests, spec.get("slo"))  # the scenario's slo section, when it has one
    return ClusterResult(summary, requests, cluster.iteration_log(), cluster)


def load_overrides(spec: dict[str, Any], load: float) -> dict[str, Any]:
    """Dotted overrides that run the checked scenario ``spec`` at ``load`` times its arrival rate:
    ``workload.arrival.rate`` (or ``mean_rate``) times ``load``, or for a trace without an
    ``arrival`` its ``time_scale`` divided by ``load``. ``load = 1`` changes nothing.

    :raises ConfigError: a scenario with neither (``loads: ...``), or a load that is not a number > 0.
    """
    if isinstance(load, bool) or not isinstance(load, int | float) or not (load > 0 and np.isfinite(load)):
        raise ConfigError(f"loads: expected numbers > 0 (arrival-rate multipliers), got {load!r}")
    if load == 1:
        return {}
    wl = spec.get("workload", {})
    arrival = wl.get("arrival")
    for key in ("rate", "mean_rate"):
        if isinstance(arrival, dict) and key in arrival:
            return {f"workload.arrival.{key}": float(arrival[key]) * load}
    trace = wl.get("trace")
    if isinstance(trace, dict):
        return {"workload.trace.time_scale": float(trace.get("time_scale", 1.0)) / load}
    raise ConfigError(f"loads: scenario {spec.get('name')!r} has no workload.arrival.rate or trace to scale")


CELL_METRICS = ("serving.request_throughput", "serving.output_throughput", "serving.mean_ttft_ms",
                "serving.p90_ttft_ms", "serving.p99_ttft_ms", "serving.mean_tpot_ms", "serving.p99_tpot_ms",
                "serving.mean_e2el_ms", "serving.p99_e2el_ms", "cluster.prefix_hit_rate", "cluster.load_imbalance",
                "cluster.busy_imbalance")
"""The figures a sweep cell keeps (dotted paths into the cluster summary; ``vllm bench serve``'s
names and units)."""


def cluster_cell(args: tuple) -> dict[str, Any]:
    """One cell of a cluster sweep (``llmsched cluster compare|sweep``, any backend):
    ``(scenario, policy, router, n_replicas, refresh_s, load, seed, overrides)`` -> a row with
    the cell's settings, :data:`CELL_METRICS`, the request counts and the wall time."""
    from llmsched_gym.core.metrics import metric_value

    scenario, policy, router, n, refresh_s, load, seed, overrides = args
    spec = resolve_scenario(scenario, overrides)
    over = {**(overrides or {}), **load_overrides(spec, load)}
    r = simulate_cluster(scenario, policy, router, n, seed, over, refresh_s=refresh_s)
    s = r.summary
    return {"router": router if isinstance(router, str) else r.cluster.router.name,
            "n_replicas": s["cluster"]["n_replicas"], "load": load, "seed": seed,
            **{m: metric_value(s, m) for m in CELL_METRICS},
            "n_arrived": s["n_arrived"], "n_completed": s["n_completed"], "n_rejected": s["n_rejected"],
            "wall_time_s": s["wall_time_s"]}
