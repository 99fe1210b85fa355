"""The env an agent plays: ``LLMSched-v1`` made with a scenario, its overrides and the env settings
an agent was trained with (what training, evaluation and RLlib's env creator all build)."""

from __future__ import annotations

from typing import Any

ENV_ID = "llmsched_gym:LLMSched-v1"


def make_env(scenario: str, env_kwargs: dict[str, Any], overrides: dict[str, Any] | None = None,
             max_episode_steps: int | None = None):
    """``gymnasium.make`` of ``LLMSched-v1`` with the scenario, its ``--set`` overrides and the
    env settings; ``max_episode_steps=None`` keeps the env's own default."""
    import gymnasium as gym

    kw = dict(env_kwargs)
    if overrides:
        kw["overrides"] = {**kw.get("overrides", {}), **overrides}
    if max_episode_steps is not None:
        kw["max_episode_steps"] = max_episode_steps
    return gym.make(ENV_ID, scenario=scenario, **kw)
