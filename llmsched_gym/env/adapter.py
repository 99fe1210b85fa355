"""The env as the engine's Scheduler (:class:`AgentScheduler`).

The env drives its engine itself (:class:`~llmsched_gym.env.driver.Driver`), so the engine's
scheduler forms no plan; it receives the engine's hooks and passes them on: to the reward tracker
(finishes, rejections), to the env's per-request tables (a preempted request's prompt and remaining
output change) and to the delegate, the policy whose state must follow the episode (the attached
expert, ``meta``'s Switch or ``tune``'s base policy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from llmsched_gym.core.scheduler import BatchPlan, EngineView, Scheduler
from llmsched_gym.env.reward import RewardTracker


class AgentScheduler(Scheduler):
    """The env's engine scheduler: hooks to ``tracker``, ``refresh`` and :attr:`delegate`.

    :param tracker: the reward tracker (``on_finish``, ``on_reject``).
    :param refresh: called with a preempted request's id (the decision point's and the
        observation's tables).
    """

    name = "agent"

    def __init__(self, tracker: RewardTracker, refresh: Callable[[int], None]) -> None:
        self.tracker = tracker
        self.refresh = refresh
        self.delegate: Scheduler | None = None
        self.engine_overrides: dict[str, Any] = {}

    def attach(self, delegate: Scheduler | None, scenario_overflow: str) -> None:
        """Pass the hooks on to ``delegate`` (``None``: none) and apply its ``engine_overrides``
        from the next episode on; an agent's batch must always run, so an overflow handler
        ``forbid`` (the delegate's, else ``scenario_overflow``) becomes vLLM's LIFO preemption."""
        self.delegate = delegate
        forced = dict(getattr(delegate, "engine_overrides", {}) or {})
        if forced.get("overflow", scenario_overflow) == "forbid":
            forced["overflow"] = "preempt_lifo_recompute"
        self.engine_overrides = forced

    def wants(self, hook: str) -> bool:  # type: ignore[override]
        if hook in ("on_finish", "on_preempt"):
            return True
        d = self.delegate
        return d is not None and d.wants(hook)

    def reset(self, config, rng: np.random.Generator) -> None:
        super().reset(config, rng)
        if self.delegate is not None:
            # the delegate gets the policy stream simulate() would give it
            self.delegate.reset(config, rng)

    def schedule(self, view: EngineView) -> BatchPlan:
        raise RuntimeError("the LLMSched-v1 adapter is driven by env.step(), not engine.run()")

    def on_arrival(self, req_id: int, view: EngineView) -> bool:
        ok = self.delegate.on_arrival(req_id, view)
        if not ok:
            self.tracker.on_reject(req_id)
        return ok

    def on_tokens(self, req_ids: np.ndarray, n: int, view: EngineView) -> None:
        self.delegate.on_tokens(req_ids, n, view)

    def on_prefill(self, req_id: int, n_tokens: int, view: EngineView) -> None:
        self.delegate.on_prefill(req_id, n_tokens, view)

    def on_preempt(self, req_id: int, view: EngineView) -> None:
        self.refresh(req_id)
        d = self.delegate
        if d is not None and d.wants("on_preempt"):
            d.on_preempt(req_id, view)

    def on_finish(self, req_id: int, view: EngineView) -> None:
        self.tracker.on_finish(req_id, view.now)
        d = self.delegate
        if d is not None and d.wants("on_finish"):
            d.on_finish(req_id, view)

    def reject_reason(self, req_id: int) -> str:
        d = self.delegate
        return d.reject_reason(req_id) if d is not None else super().reject_reason(req_id)


__all__ = ["AgentScheduler"]
