"""The Gymnasium environment ``LLMSched-v1`` (see :class:`~llmsched_gym.env.llmsched_env.LLMSchedEnv`).

``import llmsched_gym`` calls :func:`register_envs`, so
``gymnasium.make("llmsched_gym:LLMSched-v1", scenario=..., action_mode=..., reward=...)`` works, and
``gymnasium.make_vec("llmsched_gym:LLMSched-v1", num_envs=N, vectorization_mode="vector_entry_point", ...)``
returns the native vector env (:mod:`llmsched_gym.env.vector`: N simulations in one process). This
module imports only gymnasium's registry; the env itself loads on ``make``.

``LLMSched-v0`` is retired (the class docstring's version history says what changed): only v1 is
registered, so ``gymnasium.make("LLMSched-v0")`` raises Gymnasium's one-line ``DeprecatedEnv``
error, "Environment version v0 for `LLMSched` is deprecated. Please use `LLMSched-v1` instead."
"""

from __future__ import annotations

ENV_VERSION = 1
"""The env's version (Gymnasium's ``-vN`` suffix); summaries and ``info`` name it."""
ENV_ID = f"LLMSched-v{ENV_VERSION}"
GPU_ENV_ID = f"LLMSchedGPU-v{ENV_VERSION}"
ENTRY_POINT = "llmsched_gym.env.llmsched_env:LLMSchedEnv"
VECTOR_ENTRY_POINT = "llmsched_gym.env.vector:LLMSchedVectorEnv"
CLUSTER_ENV_ID = "LLMSchedCluster-v0"
CLUSTER_ENTRY_POINT = "llmsched_gym.env.cluster_env:LLMSchedClusterEnv"
MAX_EPISODE_STEPS = 1_000_000
"""The registered step limit: a safety net far above any scenario's episode (the engine's own
horizon, iteration cap and loop detector end episodes first); ``max_episode_steps=`` overrides it."""


def register_envs() -> None:
    """Register ``LLMSched-v1`` and the GPU-timed ``LLMSchedGPU-v1`` (idempotent).

    ``LLMSchedGPU-v1`` times every batch on the local GPU (``latency="gpu:llama-3-8b"``, needs torch),
    so it is registered ``nondeterministic``. Without gymnasium installed nothing is registered.
    """
    try:
        from gymnasium.envs.registration import register, registry
    except ImportError:  # the GPU device image runs the simulator without gymnasium
        return
    if ENV_ID not in registry:
        register(id=ENV_ID, entry_point=ENTRY_POINT, vector_entry_point=VECTOR_ENTRY_POINT,
                 max_episode_steps=MAX_EPISODE_STEPS)
    if GPU_ENV_ID not in registry:
        register(id=GPU_ENV_ID, entry_point=ENTRY_POINT, nondeterministic=True, max_episode_steps=MAX_EPISODE_STEPS,
                 kwargs={"latency": "gpu:llama-3-8b"})
    if CLUSTER_ENV_ID not in registry:  # routing as an RL task (llmsched_gym.env.cluster_env)
        register(id=CLUSTER_ENV_ID, entry_point=CLUSTER_ENTRY_POINT, max_episode_steps=MAX_EPISODE_STEPS)


__all__ = ["CLUSTER_ENV_ID", "ENV_ID", "ENV_VERSION", "GPU_ENV_ID", "register_envs"]
