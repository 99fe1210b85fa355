"""The env an agent plays, made with a scenario, its overrides and the env settings an agent was
trained with (what training, evaluation and RLlib's env creator all build): ``LLMSched-v1``, or
``LLMSchedCluster-v0`` (routing: the agent picks the replica of each request) for a scenario that
declares a cluster of several replicas (``cluster.n_replicas`` > 1, e.g. ``prefix-groups-8``)."""

from __future__ import annotations

from typing import Any

ENV_ID = "llmsched_gym:LLMSched-v1"
CLUSTER_ENV_ID = "llmsched_gym:LLMSchedCluster-v0"


def is_routing(scenario: str | dict, overrides: dict[str, Any] | None = None) -> bool:
    """Whether ``scenario`` (with ``overrides``) declares a cluster of more than one replica without
    disaggregated pools: its agents route (``LLMSchedCluster-v0``)."""
    from llmsched_gym.core.scenarios import resolve_scenario

    section = resolve_scenario(scenario, overrides).get("cluster") or {}
    n = section.get("n_replicas", 1)
    return isinstance(n, int) and n > 1 and not section.get("pools")


def make_env(scenario: str, env_kwargs: dict[str, Any], overrides: dict[str, Any] | None = None,
             max_episode_steps: int | None = None):
    """``gymnasium.make`` of the scenario's env (``LLMSched-v1``, or ``LLMSchedCluster-v0`` where
    :func:`is_routing`) with its ``--set`` overrides and the env settings;
    ``max_episode_steps=None`` keeps the env's own default."""
    import gymnasium as gym

    kw = dict(env_kwargs)
    if overrides:
        kw["overrides"] = {**kw.get("overrides", {}), **overrides}
    if max_episode_steps is not None:
        kw["max_episode_steps"] = max_episode_steps
    env_id = CLUSTER_ENV_ID if is_routing(scenario, kw.get("overrides")) else ENV_ID
    return gym.make(env_id, scenario=scenario, **kw)
