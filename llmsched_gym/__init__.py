"""llmsched-gym: a Gymnasium environment and simulator for LLM inference scheduling under
KV-cache memory limits.

>>> from llmsched_gym import simulate
>>> result = simulate(scenario="jaillet-low", policy="fcfs", seed=0)
>>> result.summary["e2e_s"]["mean"]

Heavy dependencies (torch, stable-baselines3, matplotlib) are imported only by the commands that
need them.
"""

from __future__ import annotations

from typing import Any

import llmsched_gym.backends.gpu  # noqa: F401  (registers the gpu:MODEL latency model; torch stays lazy)
import llmsched_gym.core.profile  # noqa: F401  (registers the vidur: and profile: latency models)
from llmsched_gym.env import register_envs

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """``simulate`` and ``SimResult`` are :mod:`llmsched_gym.sim`'s own (``help(simulate)`` shows
    their real signature and docstring), imported on first use so that ``import llmsched_gym``
    (and ``llmsched list``) does not load the engine."""
    if name in ("simulate", "SimResult"):
        from llmsched_gym import sim

        return getattr(sim, name)
    raise AttributeError(f"module 'llmsched_gym' has no attribute {name!r}")


def make_scenario(name: str, seed: int = 0, overrides: dict[str, Any] | None = None):
    """``(workload, engine_config, latency_model)`` of a named scenario."""
    from llmsched_gym.core.scenarios import build_scenario, get_scenario

    return build_scenario(get_scenario(name, overrides), seed)


# gymnasium.make("llmsched_gym:LLMSched-v1") imports this package, which registers the ids
register_envs()

__all__ = ["SimResult", "__version__", "make_scenario", "register_envs", "simulate"]
