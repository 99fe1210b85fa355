"""Optional real-GPU backend: a random-weight Llama executor with a paged KV cache.

Importing this package is cheap: torch is imported only when an executor is built. Entry points:

* :class:`~llmsched_gym.backends.gpu.backend.GPULatency` -- online latency model for the engine;
* :func:`~llmsched_gym.backends.gpu.backend.replay` -- re-execute an iteration log;
* :func:`~llmsched_gym.backends.gpu.backend.calibrate` -- profile grids into ``profile.csv``.

See README.md in this folder.
"""

from __future__ import annotations

from llmsched_gym.backends.gpu.config import PRESETS, LlamaConfig, get_config
from llmsched_gym.core.latency import LatencyModel, register_latency


def _gpu_latency(model: str) -> LatencyModel | None:
    if not model:  # a bare 'gpu' names no model
        return None
    # imports torch; nondeterministic, never fast-forwarded
    from llmsched_gym.backends.gpu.backend import GPULatency

    return GPULatency(model)


register_latency("gpu", _gpu_latency, "time each batch on the local GPU with a random-weight MODEL (needs torch)")

__all__ = ["PRESETS", "LlamaConfig", "get_config"]
