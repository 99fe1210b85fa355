"""``Switch``: several policies behind one Scheduler, the active one forming the plans.

The env's ``meta`` action mode is a Switch whose ``active`` candidate the agent picks at every
decision. Every candidate sees the engine hooks (accepted arrivals, tokens, prefill chunks,
preemptions, completions), so a stateful policy (VTC's counters, k-LPM's need heap, Echo's pools,
MC-SF's queue) keeps a picture of the engine while another candidate forms the batches; what the
hooks do not say (which requests another candidate admitted, left mid-prefill or, for RPM, which
arrivals it refused were accepted anyway) each policy reads from the view at its next decision
(``view.state``, ``view.n_in_prefill``; see the "switching policies" notes of the baselines).

A Switch whose ``active`` stays at ``i`` runs exactly as ``candidates[i]`` alone (``simulate()``,
summary for summary) when the merged ``engine_overrides`` give the engine ``candidates[i]``'s
settings (always true for ``[p, fcfs]``, fcfs forcing nothing) and no other candidate acts on the
engine: Echo (``echo``, task-aware) installs its KV eviction order on the engine's prefix cache
at the first arrival, whichever candidate is active.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from llmsched_gym.core.information import NEEDS
from llmsched_gym.core.scheduler import BatchPlan, EngineView, Scheduler

_HOOKS = ("on_arrival", "on_tokens", "on_prefill", "on_preempt", "on_finish")


class Switch(Scheduler):
    """Run ``candidates[active]``'s plans; forward every hook to every candidate that wants it.

    * ``reset``: each candidate gets an identical copy (``copy.deepcopy``) of the policy stream,
      so a Switch whose ``active`` stays at ``i`` runs as ``candidates[i]`` alone (module
      docstring).
    * ``on_arrival``: the active candidate decides; the request is rejected iff it rejects it
      (``reject_reason`` is its). The other candidates are told of an accepted request only (in
      list order); a rejected one never enters the engine's queue, and telling them would leave
      phantom state (a VTC counter lift, a place in RPM's window, an Echo prefix-chain count).
      What another candidate answers is ignored (RPM adopts a request it refused at its next
      decision).
    * every other hook goes to every candidate that overrides it (:meth:`wants` is true for a
      hook when some candidate wants it).
    * ``engine_overrides``: the union of the candidates'; on a conflicting key the first candidate
      that sets it wins (an explicit ``--set engine.X`` still wins over both in ``make_engine``).
    * ``active``: the index of the candidate whose plan :meth:`schedule` returns; set it between
      decisions (``reset`` leaves it alone).

    :param candidates: the policies (Scheduler instances, distinct objects).
    """

    name = "switch"

    def __init__(self, candidates: list[Scheduler]) -> None:
        if not candidates:
            raise ValueError("candidates: a Switch needs at least one policy")
        if len({id(c) for c in candidates}) != len(candidates):
            raise ValueError("candidates: the same policy object is listed twice (each candidate keeps its own state)")
        self.candidates = list(candidates)
        self.active = 0
        merged: dict[str, Any] = {}
        for c in self.candidates:
            for k, v in (getattr(c, "engine_overrides", {}) or {}).items():
                merged.setdefault(k, v)
        self.engine_overrides = merged
        self._hooked = {h: [c for c in self.candidates if c.wants(h)] for h in _HOOKS}
        self._rejected_by: dict[int, Scheduler] = {}

    def needs(self) -> str:
        """The most that any candidate reads about output lengths (every candidate follows the
        hooks, so each must be applicable to the task)."""
        return max((c.needs() for c in self.candidates), key=NEEDS.index)

    def wants(self, hook: str) -> bool:  # type: ignore[override]
        """Whether some candidate overrides ``hook`` (an instance method: the engine asks the
        instance; :meth:`Scheduler.wants` is a classmethod on the class attributes)."""
        return bool(self._hooked.get(hook))

    def reset(self, config, rng: np.random.Generator) -> None:
        super().reset(config, rng)
        for c in self.candidates:
            c.reset(config, copy.deepcopy(rng))
        self._rejected_by = {}

    def schedule(self, view: EngineView) -> BatchPlan:
        return self.candidates[self.active].schedule(view)

    def on_arrival(self, req_id: int, view: EngineView) -> bool:
        active = self.candidates[self.active]
        if not active.on_arrival(req_id, view):
            self._rejected_by[req_id] = active
            return False
        for c in self._hooked["on_arrival"]:
            if c is not active:
                c.on_arrival(req_id, view)
        return True

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
