"""The engine driver of ``LLMSched-v1``: what an action mode may do to the episode.

An action mode (:mod:`llmsched_gym.env.modes`) turns an action into a batch with a few operations,
and these are all it can reach besides the decision point:

* :meth:`Driver.launch` runs the batch being formed (the decision point's chosen requests and
  preemptions) with a token budget, then simulates to the next decision;
* :meth:`Driver.run_plan` runs a policy's plan (``meta``, ``tune``), then simulates to the next
  decision;
* :meth:`Driver.default_plan` is the plan of a boundary where nothing is decided;
* :meth:`Driver.invalid` counts an invalid action (or raises, with ``invalid_action="raise"``);
* :meth:`Driver.form` is the batch a budget would form, without running it (the expert
  translation compares it with a policy's plan);
* :attr:`Driver.view` is the engine's read-only :class:`~llmsched_gym.core.scheduler.EngineView`.

The driver owns the episode's engine: :meth:`Driver.advance` simulates the boundaries where the
mode does not decide (asking the mode's ``decides`` and ``between``, given to :meth:`start`) and
keeps what the observation reads about the last batches
(:class:`~llmsched_gym.env.observation.Recent`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from llmsched_gym.core.batching import BatchBuilder, budget_plan
from llmsched_gym.core.engine import RUNNING, WAITING, Engine
from llmsched_gym.core.scheduler import BatchPlan, EngineView
from llmsched_gym.env.actions import InvalidActionError
from llmsched_gym.env.decision import DecisionPoint
from llmsched_gym.env.observation import Recent


class Driver:
    """Runs one episode's engine for the env and its action mode (see the module docstring).

    :param dp: the env's decision point (the batch being formed).
    :param raise_invalid: :meth:`invalid` raises :class:`InvalidActionError` instead of counting.
    :param record: keep ``(clock, KV used / capacity, queue length)`` of every decision in
        :attr:`history` (the ``rgb_array`` rendering).
    """

    def __init__(self, dp: DecisionPoint, raise_invalid: bool = False, record: bool = False) -> None:
        self.dp = dp
        self.raise_invalid = raise_invalid
        self.record = record
        self.engine: Engine | None = None
        self.view: EngineView | None = None
        self.recent = Recent()
        self.n_invalid = 0
        self.ended = True
        self.history: list[tuple[float, float, int]] = []

    def start(self, engine: Engine, budget: int | None, decides: Callable[[], bool],
              between: Callable[[], BatchPlan]) -> None:
        """Take a fresh engine (the last one is closed by its owner); ``budget`` is the launch
        budget until the first launch, ``decides`` and ``between`` the mode's rule for the
        boundaries. :meth:`advance` then simulates to the first decision."""
        self.engine, self.view = engine, engine.view
        self._decides, self._between = decides, between
        self.dp.setup(engine)
        self.recent = Recent(admit_s=engine.clock, budget=budget)
        self.n_invalid = 0
        self.history = []
        self.ended = False

    # ------------------------------------------------------------------------------------------
    # the operations of the action modes
    def launch(self, budget: int | None) -> None:
        """Run the batch formed so far with token ``budget``, then advance to the next decision."""
        e, dp = self.engine, self.dp
        self.recent.budget = budget
        plan = self.form(budget, dp.sel)
        if not plan.prefill and len(e.running) == len(dp.victims):
            # nothing would run: wait for the next arrival, or start the head of the queue
            if e.next_idx < e.n:
                plan = BatchPlan(preempt=plan.preempt, idle=True)
            elif dp.slots:
                dp.sel = [dp.slots[0]]
                plan = self.form(budget, dp.sel)
            else:
                dp.victims = []
                plan = self.form(budget, [])
        self.run_plan(plan)

    def run_plan(self, plan: BatchPlan) -> None:
        """Execute a plan of this boundary and advance to the next decision."""
        state = self.engine.state
        for r in plan.prefill:
            if state[r] == WAITING:  # the plan admits a request
                self.recent.admit_s = self.engine.clock
                break
        self.execute(plan)
        self.advance()

    def default_plan(self) -> BatchPlan:
        """A boundary without a decision: decode with the last budget, wait, or start the head."""
        e = self.engine
        if e.running:
            b = self.recent.budget
            if b is not None and len(e.running) > b:
                return self.form(b, [])
            return BatchPlan(hold=self.dp.admission != "future" or not e.waiting)
        if e.next_idx < e.n:
            return BatchPlan(idle=True)
        return BatchPlan.admit([self.dp.slots[0]])

    def invalid(self, message: str) -> None:
        """An invalid action: counted (the caller then launches), or raised under ``raise``."""
        if self.raise_invalid:
            raise InvalidActionError(message)
        self.n_invalid += 1

    def form(self, budget: int | None, admit: list[int]) -> BatchPlan:
        """The batch launching now with ``budget`` and the admissions ``admit`` would run (dry):
        what :class:`~llmsched_gym.core.batching.BatchBuilder` forms by the budget alone
        (``memory=False``: the engine's LIFO preemption handles an overflow).

        When the budget reaches every decode (most launches) the builder's phases reduce to
        :func:`~llmsched_gym.core.batching.budget_plan` over the decision point's cached batch
        shape and unfinished prefills (the same plan, without building a builder)."""
        dp = self.dp
        if budget is None and not dp.victims and not self.engine.n_in_prefill:  # whole prompts, nothing else
            return BatchPlan(prefill=dict.fromkeys(admit, BatchPlan.FULL))
        n_dec = dp.batch_shape()[0]
        if budget is not None and budget < n_dec:  # decodes pause: the builder's own phases
            b = BatchBuilder(self.view, budget, reserve=False, preempted=dp.victims, memory=False,
                             unfinished=dp.unfinished_prefills() if self.engine.n_in_prefill else ([], []))
            b.decode_first(preempt=False)
            b.continue_prefills()
            for rid in admit:
                if not b.admit(rid):
                    break
            plan = b.plan()
            plan.hold = False
            return plan
        return budget_plan(self.view, budget, admit, n_dec, dp.unfinished_prefills(), dp.victims)

    # ------------------------------------------------------------------------------------------
    # the loop between decisions
    def advance(self) -> None:
        """Simulate until the mode has something to decide (``decides()``; the other boundaries
        run ``between()``'s plan), or the episode ends (:attr:`ended`)."""
        e, dp, decides, between = self.engine, self.dp, self._decides, self._between
        while e.poll():
            dp.begin()
            if decides():
                if self.record:
                    self.history.append((e.clock, e.kv.used_blocks / dp.cap_blocks, len(e.waiting)))
                return
            self.execute(between())
        self.ended = True
        dp.begin()

    def execute(self, plan: BatchPlan) -> None:
        """Run ``plan`` on the engine (one iteration, or a fast-forwarded decode run) and note
        what it did in :attr:`recent`."""
        e, recent, c = self.engine, self.recent, self.engine.counters
        t0, it0, pf0, dec0 = e.clock, c.n_iterations, c.total_prefill_tokens, c.total_decoded
        e.execute(plan)
        its = c.n_iterations - it0
        if its:
            recent.iter_s = (e.clock - t0) / its
            recent.prefill_tokens = c.total_prefill_tokens - pf0
            recent.decode_tokens = (c.total_decoded - dec0) // its
        if plan.pause or e.n_in_prefill or recent.stalled:
            self._track_stalls(plan, t0)

    def _track_stalls(self, plan: BatchPlan, t0: float) -> None:
        """Running requests that got neither a token nor a chunk since when (the ``stall`` feature)."""
        e = self.engine
        st = self.recent.stalled
        if st:
            state, prefilled, target = e.state, e.prefilled, e.prefill_target
            for r in list(st):
                if state[r] != RUNNING or (r not in plan.pause and (r in plan.prefill or prefilled[r] >= target[r])):
                    del st[r]
        for r in plan.pause:
            if e.state[r] == RUNNING:
                st.setdefault(r, t0)
        n_mid = e.n_in_prefill
        if n_mid:
            # the unfinished prefills that got no chunk; none when every one of them (there are
            # n_in_prefill) is in the plan (usually: its few prefill entries are read one by one)
            state, prefilled, target = e.state, e.prefilled, e.prefill_target
            for r in plan.prefill:
                if state[r] == RUNNING and prefilled[r] < target[r]:
                    n_mid -= 1
            if n_mid:
                run = np.fromiter(e.running, np.int64, len(e.running))
                for r in run[prefilled[run] < target[run]].tolist():
                    if r not in plan.prefill:
                        st.setdefault(r, t0)


__all__ = ["Driver"]
