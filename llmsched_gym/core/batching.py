"""How an iteration's batch is formed on a vLLM-style engine: one module for the engine policies
(``baselines/sarathi.py``, ``baselines/vllm.py``) and for the Gymnasium env's action modes.

A batch is built in three phases, the way Sarathi-Serve (Agrawal et al., 2024, section 4) and
vLLM's v1 scheduler form it:

1. **decodes first**: every running request whose prefill is complete decodes one token, in
   admission order, each costing one token of the iteration's budget; those the budget does not
   reach are paused (they keep their KV and skip the iteration);
2. **unfinished prefills continue**: running requests with a partly computed prompt get their
   next chunk, ``min(remaining prompt, budget left)``;
3. **admissions**: waiting requests join, each with a chunk of what the budget leaves,
   ``min(prompt - cached prefix, budget left)``; ``max_num_seqs`` caps the running set and the
   block watermark keeps a margin of free blocks.

An unlimited budget (``None``) is whole-prompt prefill: decodes are never paused and every
admitted request prefills its whole prompt in the iteration it is admitted.

Memory is counted by the engine's :class:`~llmsched_gym.core.ledger.Ledger`, as the engine
counts it: a decode needs a new block only when its last block is full, and the final prefill
chunk also stores output token 1 when prefill emits it. With ``reserve=True`` (Sarathi as Vidur
implements it) the blocks still owed to unfinished prefills stay reserved and an admission must
fit its whole prompt; with ``reserve=False`` (vLLM v1) only the chunk of this iteration is
checked.
"""

from __future__ import annotations

import math

from llmsched_gym.core.ledger import preempt_newest
from llmsched_gym.core.scheduler import BatchPlan, EngineView

UNLIMITED = math.inf


class BatchBuilder:
    """One iteration's batch, formed phase by phase (see the module docstring).

    :param view: the engine view at this boundary.
    :param budget: the iteration's token budget (decodes count 1 each); ``None`` or ``inf`` for
        unlimited (whole-prompt prefill).
    :param reserve: keep the blocks still owed to unfinished prefills reserved and check whole
        prompts at admission (Sarathi/Vidur); otherwise check only this iteration's chunk (vLLM v1).
    :param max_num_seqs: cap on running requests (``None``: no cap).
    :param watermark: fraction of the KV blocks an admission must leave free.
    :param preempted: running requests already chosen for preemption (their blocks count as free).

    ``free`` is the number of free blocks the batch has left; it goes negative when the caller
    admits without checking (the engine's overflow handler then decides).
    """

    __slots__ = ("view", "ledger", "budget", "reserve", "max_num_seqs", "watermark_blocks", "running", "n",
                 "reserved", "free", "prefill", "preempt", "pause", "seqs", "_gone")

    def __init__(self, view: EngineView, budget: float | None = None, reserve: bool = True,
                 max_num_seqs: int | None = None, watermark: float = 0.0,
                 preempted: list[int] | tuple[int, ...] = ()) -> None:
        self.view = view
        self.ledger = led = view.ledger
        self.budget = UNLIMITED if budget is None else budget
        self.reserve = reserve
        self.max_num_seqs = max_num_seqs
        bs = view.block_size
        self.watermark_blocks = int(watermark * (view.kv_capacity // bs))
        self._gone = set(preempted)
        running = [r for r in view.running if r not in self._gone] if preempted else view.running
        self.running = running
        self.n = len(running)
        prefilled, target, kvt = view.prefilled, view.prefill_target, view.kv_tokens
        self.reserved: dict[int, int] = {}
        if reserve:
            for r in running:
                if prefilled[r] < target[r]:
                    self.reserved[r] = led.chunk(r, int(kvt[r]), int(target[r] - prefilled[r]))
        free = view.kv_free // bs - sum(self.reserved.values())
        for r in preempted:
            free += led.held(r)
        self.free = free
        self.prefill: dict[int, int] = {}
        self.preempt: list[int] = list(preempted)
        self.pause: set[int] = set()
        self.seqs = self.n

    # ------------------------------------------------------------------------------------------
    def decode_first(self, preempt: bool = True) -> None:
        """Phase 1: decodes in admission order while the budget lasts; the rest are paused.

        With ``preempt`` a decode that lacks a block preempts the newest running request (vLLM's
        rule, the request itself last), as Sarathi does; without it nothing is preempted and
        ``free`` is left as it is (the caller admits without checking)."""
        view, running = self.view, self.running
        if not preempt:  # only the budget matters: the first decodes run, the others pause
            if view.n_in_prefill == 0:
                dec = running
            else:
                prefilled, target = view.prefilled, view.prefill_target
                dec = [r for r in running if prefilled[r] >= target[r]]
            if self.budget >= len(dec):
                self.budget -= len(dec)
            else:
                k = int(self.budget)
                self.pause = set(dec[k:])
                self.budget = 0
            return
        prefilled, target = view.prefilled, view.prefill_target
        n, free, budget = self.n, self.free, self.budget
        led = self.ledger
        mid = self.reserved if self.reserve else None
        i = 0
        while i < n and budget > 0:
            rid = running[i]
            if (rid in mid) if mid is not None else prefilled[rid] < target[rid]:
                i += 1
                continue
            need = led.decode(rid)
            if preempt and need > free:
                n, free = preempt_newest(led, running, n, rid, need, free, self.preempt, self.reserved)
                if self.preempt[-1] == rid:
                    break
            free -= need
            budget -= 1
            i += 1
        self.pause = {r for r in running[i:n] if prefilled[r] >= target[r]}
        self.n, self.free, self.budget, self.seqs = n, free, budget, n

    def continue_prefills(self) -> None:
        """Phase 2: unfinished prefills get their next chunk, in admission order."""
        view = self.view
        if view.n_in_prefill == 0:
            return
        prefilled, target, kvt = view.prefilled, view.prefill_target, view.kv_tokens
        for rid in self.running[: self.n]:
            if self.budget <= 0:
                break
            left = int(target[rid] - prefilled[rid])
            if left > 0:
                c = left if left <= self.budget else int(self.budget)
                self.prefill[rid] = c
                self.budget -= c
                if not self.reserve:
                    self.free -= self.ledger.chunk(rid, int(kvt[rid]), c)

    def admit(self, rid: int, check: bool = True, chunk_cap: int = 0) -> bool:
        """Phase 3: admit waiting request ``rid`` with a chunk of what the budget leaves.

        Returns False (and admits nothing) when the budget is spent, ``max_num_seqs`` is reached,
        or, with ``check``, the blocks it needs would cut into the watermark (without ``check``
        ``free`` is left as it is: the caller checked memory its own way). ``chunk_cap`` > 0 caps
        the chunk (vLLM's ``long_prefill_token_threshold``)."""
        if self.budget <= 0 or (self.max_num_seqs is not None and self.seqs >= self.max_num_seqs):
            return False
        view = self.view
        hit = view.prefix_match(rid)
        left = int(view.prefill_target[rid]) - hit
        c = left if left <= self.budget else int(self.budget)
        if chunk_cap and c > chunk_cap:
            c = chunk_cap
        if check:
            need = self.ledger.admission(rid, hit, None if self.reserve else c)
            if self.free - need < self.watermark_blocks:
                return False
            self.free -= need
        self.prefill[rid] = BatchPlan.FULL if self.budget == UNLIMITED else c
        self.budget -= c
        self.seqs += 1
        return True

    def plan(self) -> BatchPlan:
        """The batch as a :class:`BatchPlan` (``hold`` when it is decode-only)."""
        hold = not self.prefill and not self.preempt and not self.pause and not self.reserved
        return BatchPlan(prefill=self.prefill, preempt=self.preempt, pause=self.pause, hold=hold)
