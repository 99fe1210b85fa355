"""Load-blind routers: random and round-robin (Vidur's ``random`` and ``round_robin`` global
schedulers; Agrawal et al. 2024, "Vidur: A Large-Scale Simulation Framework for LLM Inference",
MLSys 2024, section 4; also LLMServingSim's and SGLang's router's ``random`` / ``round_robin``)."""

from __future__ import annotations

import numpy as np

from llmsched_gym.core.cluster import ClusterView, Router


class RandomRouter(Router):
    """Each request to a replica drawn uniformly at random (the router's own seeded stream)."""

    name = "random"
    reads_load = False

    def route(self, rid: int, view: ClusterView) -> int:
        return int(self.rng.integers(self.n_replicas))


class RoundRobin(Router):
    """Request ``k`` (in arrival order) to replica ``k mod N``, as Vidur's ``RoundRobinGlobalScheduler``."""

    name = "round-robin"
    reads_load = False

    def reset(self, n_replicas: int, rng: np.random.Generator) -> None:
        super().reset(n_replicas, rng)
        self._next = 0

    def route(self, rid: int, view: ClusterView) -> int:
        r = self._next
        self._next = (r + 1) % self.n_replicas
        return r
