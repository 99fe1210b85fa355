"""``simulate()``: run one policy on one scenario and get the summary, records and log."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from llmsched_gym.config import explicit_engine_keys, merge_engine_overrides
from llmsched_gym.core.engine import Engine, EngineConfig
from llmsched_gym.core.information import information_of
from llmsched_gym.core.metrics import add_slo, summarize
from llmsched_gym.core.records import request_table
from llmsched_gym.core.scenarios import build_scenario, resolve_scenario
from llmsched_gym.core.scheduler import Scheduler


@dataclass
class SimResult:
    """What a run produced.

    :ivar summary: the summary dict (see README, "The summary JSON").
    :ivar requests: per-request table (column name -> array), every arrived request.
    :ivar iterations: the iteration log (column name -> array), one row per iteration.
    :ivar engine: the finished engine (for custom metrics).
    :ivar setup_s: seconds spent building the engine (workload, latency model).
    :ivar scenario: the scenario as checked and run (overrides applied).
    """

    summary: dict[str, Any]
    requests: dict[str, np.ndarray]
    iterations: dict[str, np.ndarray]
    engine: Engine = field(repr=False)
    setup_s: float = 0.0
    scenario: dict[str, Any] = field(default_factory=dict, repr=False)


def make_policy(policy: str | Scheduler | dict, params: dict[str, Any] | None = None) -> Scheduler:
    """A Scheduler from a registered name (``params`` as keyword arguments), a dict with a
    ``name`` key plus parameters, or an instance (returned as is)."""
    if isinstance(policy, Scheduler):
        return policy
    from baselines import make_policy as _make

    params = dict(params or {})
    if isinstance(policy, dict):
        policy = dict(policy)
        name = policy.pop("name")
        params = {**policy, **params}
    else:
        name = policy
    return _make(name, **params)


def make_engine(
    scenario: str | dict = "azure-conv",
    policy: str | Scheduler | dict | None = None,
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
    policy_params: dict[str, Any] | None = None,
    log_batches: bool = False,
) -> tuple[Engine, dict[str, Any]]:
    """Build a ready-to-run engine for ``scenario`` and ``policy`` (see :func:`simulate`); also
    returns the checked scenario."""
    spec = resolve_scenario(scenario, overrides)  # the one check of the scenario
    default = spec.get("policy", "fcfs")
    # --set policy.X=... turns the scenario's policy into a dict; X applies to whichever policy runs
    set_params = {k: v for k, v in default.items() if k != "name"} if isinstance(default, dict) else {}
    if policy is None or isinstance(policy, Scheduler):
        pol = default if policy is None else policy
    elif isinstance(policy, dict):
        pol = {**set_params, **policy}
    else:
        pol = {"name": policy, **set_params}
    scheduler = make_policy(pol, policy_params)
    engine = scenario_engine(spec, scheduler, seed, explicit_engine_keys(overrides), log_batches)
    return engine, spec


def scenario_engine(spec: dict[str, Any], scheduler: Scheduler, seed: int, explicit: set[str] | None = None,
                    log_batches: bool = False) -> Engine:
    """An engine for a scenario ``spec`` already checked (by
    :func:`~llmsched_gym.core.scenarios.resolve_scenario`; it is not checked again) running
    ``scheduler`` with ``seed``. The scheduler's ``engine_overrides`` apply except to the engine
    fields named in ``explicit`` (those the user set, which win)."""
    workload, config, latency = build_scenario(spec, seed, checked=True)
    from baselines import check_applicable

    check_applicable(scheduler, information_of(workload))  # NotApplicable: one line naming what it lacks
    if scheduler.engine_overrides:  # a new config: the engine checks the policy's fields
        config = EngineConfig(**merge_engine_overrides(asdict(config), scheduler.engine_overrides, explicit or ()))
    return Engine(workload, config, latency, scheduler, seed=seed, log_batches=log_batches)


def simulate(
    scenario: str | dict = "azure-conv",
    policy: str | Scheduler | dict | None = None,
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
    policy_params: dict[str, Any] | None = None,
    log_batches: bool = False,
) -> SimResult:
    """Run ``policy`` on ``scenario`` with ``seed`` and return a :class:`SimResult`.

    >>> r = simulate("jaillet-low", "sarathi", seed=0, overrides={"workload.n_requests": 200},
    ...              policy_params={"chunk_size": 256})
    >>> r.summary["serving"]["mean_e2el_ms"]      # the summary JSON of `llmsched run --json`
    >>> r.requests["ttft_s"][:5]                   # per-request table; r.iterations: the iteration log

    :param scenario: a scenario name (``llmsched list``), a ``.yml`` scenario file,
        ``trace:FORMAT:PATH``, or a scenario dict.
    :param policy: a registered policy name, ``{"name": ..., **params}``, or a Scheduler instance;
        defaults to the scenario's policy.
    :param seed: seeds the workload, the engine and the policy.
    :param overrides: dotted ``--set`` overrides, e.g. ``{"engine.kv_capacity_tokens": 20000}``.
    :param policy_params: keyword parameters of the policy.
    :param log_batches: keep each iteration's batch composition (``result.engine.batches``).
    """
    t0 = time.perf_counter()
    engine, spec = make_engine(scenario, policy, seed, overrides, policy_params, log_batches)
    setup = time.perf_counter() - t0
    engine.run()
    wall = time.perf_counter() - t0
    summary = summarize(engine, spec.get("name", "custom"), engine.scheduler.name, wall)
    requests = request_table(engine)
    add_slo(summary, requests, spec.get("slo"))  # the scenario's slo section, when it has one
    return SimResult(summary, requests, engine.iteration_log(), engine, setup, spec)


def what_runs(scenario: str | dict, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The scenario's ``workload_source`` and batch-time model as a run of it would use them on
    this machine (the real trace or its synthetic stand-in; a Vidur profile or its calibrated
    stand-in), and the title text saying so."""
    from llmsched_gym.data import synthetic_note

    engine, spec = make_engine(scenario, seed=0, overrides={**(overrides or {}), "workload.n_requests": 1})
    name = spec.get("name", "custom")
    source = engine.workload.meta.get("workload_source", {"kind": "generator", "name": name, "sha256": None})
    latency = str(getattr(engine.latency, "name", type(engine.latency).__name__))
    engine.close()
    return {"workload_source": source, "latency_model": latency, "title": f"{name}{synthetic_note(source)}, {latency}"}
