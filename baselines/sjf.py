"""Shortest-job-first schedulers on predicted output lengths (engine baselines of the issue).

``sjf``: waiting requests are admitted in increasing order of predicted output length
(``view.predicted_output``; ``oracle=True`` reads the true one). ``srpt``: in increasing order of
predicted remaining output (predicted length - tokens already generated, at least 1, which only
differs from ``sjf`` for requests preempted with recompute), and with ``preemptive=True`` a
waiting request that fails the admission test evicts the fewest running requests whose
predicted remaining is longer than its own (longest first) that make it pass. Running requests
otherwise continue. Admission stops at the first request that fails the test:

* ``admission="peak"``: Jaillet et al. 2025's future-memory test (Eq. 1, checked at every
  completion point, O(M) per candidate); ``sjf`` with it is MC-SF's admission rule, so it reuses
  MC-SF's :class:`~baselines.mcsf.CompletionProfile` and its readings (paged charge, outgrown
  predictions, recompute re-entry);
* ``admission="fit"``: the prompt plus its first token fits in the KV left after this
  iteration's decodes; a later overflow goes to the engine's handler.

Switching policies (the env's ``meta`` mode): as MC-SF, the queue drops what another policy
admitted and a running request left mid-prefill is finished (never evicted for an admission).

These are the classic size-based baselines, not a paper's algorithm. ``max_num_seqs`` (0 = no
limit) caps the running set. With nothing running, the head of the queue is started even if it
fails the test (else the worker would wait forever).
"""

from __future__ import annotations

import bisect

from llmsched_gym.core.scheduler import BatchPlan, EngineView

from .base import PolicyError, configure, finish_prefills, register
from .mcsf import MCSF


@register("sjf")
class SJF(MCSF):
    """Shortest predicted job first, non-preemptive."""

    params = {"admission": "peak", "max_num_seqs": 0, "oracle": False}
    preemptive = False

    def __init__(self, **kwargs) -> None:
        configure(self, kwargs)
        if self.admission not in ("peak", "fit"):
            raise PolicyError(f"policy.admission: {self.admission!r} is not one of peak, fit")
        if self.max_num_seqs < 0:
            raise PolicyError(f"policy.max_num_seqs: must be >= 0 (0 = no limit), got {self.max_num_seqs}")
        self._queue: list[tuple[int, int]] = []

    def _enqueue(self, key: int, rid: int) -> None:
        bisect.insort(self._queue, (key, rid))  # SJF walks its queue in order

    def remaining(self, view: EngineView, rid: int) -> int:
        return max(int(self._lengths(view)[rid]) - int(view.generated[rid]), 1)

    @staticmethod
    def free_after_decodes(view: EngineView) -> int:
        """Free KV once this iteration's decodes have taken their new blocks."""
        bs = view.block_size
        kvt = view.kv_tokens
        return view.kv_free - bs * sum(1 for r in view.running if int(kvt[r]) % bs == 0)

    def schedule(self, view: EngineView) -> BatchPlan:
        queue = self.sync(view)
        cont, blocks = finish_prefills(view)  # only in the env's meta mode
        if not queue:
            return BatchPlan.admit(cont) if cont else BatchPlan.decode_only(hold=True)
        peak = self.admission == "peak"
        bs = view.block_size
        prof = self.profile(view) if peak else None
        free = 0 if peak else self.free_after_decodes(view) - blocks * bs
        seqs = len(view.running)
        admit: list[int] = []
        preempt: list[int] = []
        for _, rid in queue:
            if self.max_num_seqs and seqs >= self.max_num_seqs:
                break
            base, last = self.candidate(view, rid)
            need = view.blocks_for(int(view.prefill_target[rid]) + 1) * bs
            ok = prof.fits(base, last) if prof is not None else need <= free
            if not ok and self.preemptive and not admit:
                preempt = self._make_room(view, rid, need, blocks * bs)
                if preempt:
                    gone = set(preempt)
                    if prof is not None:
                        prof = self.profile_of(view, [r for r in view.running if r not in gone])
                    free += sum(view.blocks_for(int(view.kv_tokens[r])) * bs for r in preempt)
                    seqs -= len(preempt)
                    ok = True
            if not ok:
                break
            admit.append(rid)
            if prof is not None:
                prof.add(base, last)
            free -= need
            seqs += 1
            if preempt:
                break
        if not admit and not view.running:
            admit.append(queue[0][1])
        del queue[: len(admit)]
        # under "peak" a later start lowers the candidate's memory at the running requests'
        # completion points, so the test may pass without any engine event: hold only under "fit"
        hold = not admit and not preempt and not peak
        return BatchPlan(prefill={r: BatchPlan.FULL for r in cont + admit}, preempt=preempt, hold=hold)

    def _make_room(self, view: EngineView, rid: int, need: int, reserved: int = 0) -> list[int]:
        """The fewest running requests with a longer predicted remaining than ``rid``'s (longest
        first) whose eviction lets ``rid`` pass the admission test; empty if none suffice.
        ``reserved``: tokens already taken by the unfinished prefills finished this iteration."""
        mine = self.remaining(view, rid)
        running = view.running
        if view.n_in_prefill:  # another policy's unfinished prefill is finished, not evicted
            running = [r for r in running if view.prefilled[r] >= view.prefill_target[r]]
        longer = sorted((r for r in running if self.remaining(view, r) > mine),
                        key=lambda r: (-self.remaining(view, r), -r))
        if not longer:
            return []
        base, last = self.candidate(view, rid)
        bs = view.block_size
        free = self.free_after_decodes(view) - reserved

        def passes(k: int) -> bool:
            if self.admission == "peak":
                gone = set(longer[:k])
                return self.profile_of(view, [r for r in view.running if r not in gone]).fits(base, last)
            return need <= free + sum(view.blocks_for(int(view.kv_tokens[v])) * bs for v in longer[:k])

        if not passes(len(longer)):
            return []
        lo, hi = 1, len(longer)
        while lo < hi:  # evicting more only lowers the memory: bisect the count
            mid = (lo + hi) // 2
            if passes(mid):
                hi = mid
            else:
                lo = mid + 1
        return longer[:lo]


@register("srpt")
class SRPT(SJF):
    """Shortest predicted remaining output first; preemptive by default."""

    params = {"admission": "peak", "max_num_seqs": 0, "oracle": False, "preemptive": True}

    def on_preempt(self, req_id: int, view: EngineView) -> None:
        bisect.insort(self._queue, (self.remaining(view, req_id), req_id))
