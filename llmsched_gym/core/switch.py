"""``Switch``: several policies behind one Scheduler, the active one forming the plans.

The env's ``meta`` action mode is a Switch whose ``active`` candidate the agent picks at every
decision. Every candidate sees every engine hook (arrivals, tokens, prefill chunks, preemptions,
completions), so a stateful policy (VTC's counters, k-LPM's prefix tree, Echo's pools, MC-SF's
queue) keeps an exact picture of the engine while another candidate forms the batches.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from llmsched_gym.core.scheduler import BatchPlan, EngineView, Scheduler

_HOOKS = ("on_arrival", "on_tokens", "on_prefill", "on_preempt", "on_finish")


class Switch(Scheduler):
    """Run ``candidates[active]``'s plans; forward every hook to every candidate that wants it.

    * ``reset``: each candidate gets an identical copy of the policy stream, so a Switch whose
      ``active`` stays at ``i`` runs exactly as ``candidates[i]`` alone (``simulate()``).
    * ``on_arrival``: every candidate is told; the request is rejected iff the active candidate
      rejects it (``reject_reason`` is that candidate's).
    * ``engine_overrides``: the union of the candidates'; on a conflicting key the first candidate
      that sets it wins.

    :param candidates: the policies (Scheduler instances).
    """

    name = "switch"

    def __init__(self, candidates: list[Scheduler]) -> None:
        if not candidates:
            raise ValueError("candidates: a Switch needs at least one policy")
        self.candidates = list(candidates)
        self.active = 0
        merged: dict[str, Any] = {}
        for c in self.candidates:
            for k, v in (getattr(c, "engine_overrides", {}) or {}).items():
                merged.setdefault(k, v)
        self.engine_overrides = merged
        self._hooked = {h: [c for c in self.candidates if type(c).wants(h)] for h in _HOOKS}
        self._rejected_by: dict[int, Scheduler] = {}

    def wants(self, hook: str) -> bool:  # type: ignore[override]
        return hook == "on_arrival" or bool(self._hooked.get(hook))

    def reset(self, config, rng: np.random.Generator) -> None:
        super().reset(config, rng)
        for c in self.candidates:
            c.reset(config, copy.deepcopy(rng))
        self._rejected_by = {}

    def schedule(self, view: EngineView) -> BatchPlan:
        return self.candidates[self.active].schedule(view)

    def on_arrival(self, req_id: int, view: EngineView) -> bool:
        ok = True
        active = self.candidates[self.active]
        for c in self._hooked["on_arrival"]:
            if not c.on_arrival(req_id, view) and c is active:
                ok = False
        if not ok:
            self._rejected_by[req_id] = active
        return ok

    def on_tokens(self, req_ids: np.ndarray, n: int, view: EngineView) -> None:
        for c in self._hooked["on_tokens"]:
            c.on_tokens(req_ids, n, view)

    def on_prefill(self, req_id: int, n_tokens: int, view: EngineView) -> None:
        for c in self._hooked["on_prefill"]:
            c.on_prefill(req_id, n_tokens, view)

    def on_preempt(self, req_id: int, view: EngineView) -> None:
        for c in self._hooked["on_preempt"]:
            c.on_preempt(req_id, view)

    def on_finish(self, req_id: int, view: EngineView) -> None:
        for c in self._hooked["on_finish"]:
            c.on_finish(req_id, view)

    def reject_reason(self, req_id: int) -> str:
        c = self._rejected_by.get(req_id)
        return c.reject_reason(req_id) if c is not None else super().reject_reason(req_id)
