"""Test routers shared by the cluster tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmsched_gym.core.cluster import Router


class Scripted(Router):
    """Routes request ``rid`` to ``plan(rid)`` and appends ``record(rid, view)`` to :attr:`seen` at
    each arrival, so a test can assert exactly what the cluster showed its router."""

    name = "scripted"

    def __init__(self, plan: Callable[[int], int], record: Callable[[int, Any], Any]) -> None:
        super().__init__()
        self.plan, self.record = plan, record

    def reset(self, n_replicas, rng) -> None:
        super().reset(n_replicas, rng)
        self.seen: list[Any] = []

    def route(self, rid, view):
        self.seen.append(self.record(rid, view))
        return self.plan(rid)
