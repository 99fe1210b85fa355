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

import numpy as np

from llmsched_gym.core.ledger import preempt_newest
from llmsched_gym.core.scheduler import BatchPlan, EngineView

UNLIMITED = math.inf


def budget_plan(view: EngineView, budget: int | None, admit: list[int], n_decode: int,
                unfinished: tuple[list[int], list[int]], preempted: list[int]) -> BatchPlan:
    """What :class:`BatchBuilder` forms by the token budget alone (``reserve=False``,
    ``memory=False``: ``decode_first(preempt=False)``, ``continue_prefills()``, then ``admit`` in
    order until one does not fit), in closed form, for a budget that reaches every decode
    (``budget is None or budget >= n_decode``): the decodes, then the unfinished prefills in
    admission order, then the admissions, each with a chunk of what the budget leaves.

    The env forms a batch at every launch; this is the builder's own rule without building one
    (tests/test_batching.py checks that both give the same plan on random states).

    :param n_decode: the running requests (less ``preempted``) past their prefill.
    :param unfinished: the surviving running requests with an unfinished prefill, in admission
        order, and the prompt tokens each still owes.
    """
    if budget is not None and budget < n_decode:
        raise ValueError(f"budget_plan: budget {budget} does not reach the {n_decode} decodes (use BatchBuilder)")
    left = math.inf if budget is None else budget - n_decode
    prefill: dict[int, int] = {}
    for rid, owed in zip(*unfinished, strict=True):
        if left <= 0:
            break
        c = owed if owed <= left else left
        prefill[rid] = c
        left -= c
    if budget is None:
        prefill.update(dict.fromkeys(admit, BatchPlan.FULL))
    elif left > 0:
        target, match = view.prefill_target, view.kv.match_tokens
        for rid in admit:
            c = int(target[rid]) - match(rid)
            if c >= left:
                prefill[rid] = left
                break
            prefill[rid] = c
            left -= c
    return BatchPlan(prefill=prefill, preempt=list(preempted))


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
    :param unfinished: the running requests (less ``preempted``) with an unfinished prefill, in
        running order, and the prompt tokens each still owes, when the caller has them at hand
        (the env's decision point does); the builder finds them itself otherwise.
    :param memory: count free blocks. ``False``: the batch is formed by the budget alone, nothing
        is checked or counted (``admit`` never refuses for memory; the engine's overflow handler
        decides), as the env forms the agent's batch.

    ``free`` is the number of free blocks the batch has left; it goes negative when the caller
    admits without checking (the engine's overflow handler then decides).
    """

    __slots__ = ("view", "ledger", "budget", "reserve", "max_num_seqs", "watermark", "running", "n",
                 "reserved", "_free", "prefill", "preempt", "pause", "seqs", "_gone", "_unfinished_now",
                 "memory")

    def __init__(self, view: EngineView, budget: float | None = None, reserve: bool = True,
                 max_num_seqs: int | None = None, watermark: float = 0.0,
                 preempted: list[int] | tuple[int, ...] = (),
                 unfinished: tuple[list[int], list[int]] | None = None, memory: bool = True) -> None:
        self.view = view
        self.memory = memory
        self._unfinished_now = unfinished
        self.ledger = led = view.ledger
        self.budget = UNLIMITED if budget is None else budget
        self.reserve = reserve
        self.max_num_seqs = max_num_seqs
        self.watermark = watermark
        self._gone = preempted
        if preempted:
            gone = set(preempted)
            self.running = running = [r for r in view.running if r not in gone]
        else:
            self.running = running = view.running
        self.n = self.seqs = len(running)
        self.reserved: dict[int, int] = {}
        if reserve and view.n_in_prefill:
            kvt = view.kv_tokens
            for rid, left in self._unfinished(running):
                self.reserved[rid] = led.chunk(rid, int(kvt[rid]), left)
        self._free: int | None = None  # computed when first read (a batch formed unchecked never reads it)
        self.prefill: dict[int, int] = {}
        self.preempt: list[int] = list(preempted)
        self.pause: set[int] = set()

    @property
    def free(self) -> int:
        """Free blocks the batch has left (module docstring)."""
        if self._free is None:
            led = self.ledger
            free = self.view.kv_free // led.bs - sum(self.reserved.values())
            for r in self._gone:
                free += led.held(r)
            self._free = free
        return self._free

    @free.setter
    def free(self, value: int) -> None:
        self._free = value

    @property
    def watermark_blocks(self) -> int:
        """Blocks an admission must leave free (``watermark`` of the capacity)."""
        return int(self.watermark * (self.view.kv_capacity // self.ledger.bs))

    def _unfinished(self, run: list[int]) -> list[tuple[int, int]] | zip:
        """The requests of ``run`` with an unfinished prefill, in order, and the tokens each owes."""
        if self._unfinished_now is not None and run is self.running and self.n == len(run):
            return zip(*self._unfinished_now, strict=True)
        view = self.view
        ids = np.fromiter(run, np.int64, len(run))
        owed = view.prefill_target[ids] - view.prefilled[ids]
        mid = owed > 0
        return list(zip(ids[mid].tolist(), owed[mid].tolist(), strict=True))

    # ------------------------------------------------------------------------------------------
    def decode_first(self, preempt: bool = True) -> None:
        """Phase 1: decodes in admission order while the budget lasts; the rest are paused.

        With ``preempt`` a decode that lacks a block preempts the newest running request (vLLM's
        rule, the request itself last), as Sarathi does; without it nothing is preempted and
        ``free`` is left as it is (the caller admits without checking)."""
        view, running = self.view, self.running
        if not preempt:  # only the budget matters: the first decodes run, the others pause
            if self.budget == UNLIMITED:
                return
            n_mid = view.n_in_prefill  # unfinished prefills, of which the preempted ones leave
            if n_mid and self._gone:
                prefilled, target = view.prefilled, view.prefill_target
                n_mid -= sum(1 for r in self._gone if prefilled[r] < target[r])
            n_dec = len(running) - n_mid
            if self.budget >= n_dec:
                self.budget -= n_dec
                return
            if n_mid:
                prefilled, target = view.prefilled, view.prefill_target
                dec = [r for r in running if prefilled[r] >= target[r]]
            else:
                dec = running
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
        if view.n_in_prefill == 0 or self.budget <= 0:
            return
        kvt = view.kv_tokens
        run = self.running if self.n == len(self.running) else self.running[: self.n]
        for rid, left in self._unfinished(run):
            c = left if left <= self.budget else int(self.budget)
            self.prefill[rid] = c
            self.budget -= c
            if not self.reserve and self.memory:
                self.free -= self.ledger.chunk(rid, int(kvt[rid]), c)
            if self.budget <= 0:
                break

    def admit(self, rid: int, check: bool = True, chunk_cap: int = 0) -> bool:
        """Phase 3: admit waiting request ``rid`` with a chunk of what the budget leaves.

        Returns False (and admits nothing) when the budget is spent, ``max_num_seqs`` is reached,
        or, with ``check``, the blocks it needs would cut into the watermark (without ``check``
        ``free`` is left as it is: the caller checked memory its own way). ``chunk_cap`` > 0 caps
        the chunk (vLLM's ``long_prefill_token_threshold``)."""
        if self.budget <= 0 or (self.max_num_seqs is not None and self.seqs >= self.max_num_seqs):
            return False
        if self.budget == UNLIMITED and not (check and self.memory):  # the whole prompt, nothing counted
            self.prefill[rid] = BatchPlan.FULL
            self.seqs += 1
            return True
        led = self.ledger
        hit = led.kv.match_tokens(rid)
        left = int(led.target[rid]) - hit
        c = left if left <= self.budget else int(self.budget)
        if chunk_cap and c > chunk_cap:
            c = chunk_cap
        if check and self.memory:
            need = led.admission(rid, hit, None if self.reserve else c)
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
