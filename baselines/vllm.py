"""vLLM's two schedulers, as the engine baselines of Ao et al. 2025 (section 6).

``vllm-v1`` (vLLM >= 0.8, ``vllm/v1/core/sched/scheduler.py``): one token budget per step
(``max_num_batched_tokens``) shared by prefill and decode. Running requests are served first, in
admission order: a decode takes 1 token, an unfinished prefill its next chunk (at most
``long_prefill_token_threshold`` tokens when that is > 0, and at most what the budget has left).
When a running request cannot get its blocks, the newest running request is preempted (KV freed,
recompute on resume: it re-prefills prompt + generated tokens) and goes to the head of the
queue; a request that has to preempt itself stops the scan. Then, only if nothing was preempted
this step, waiting requests are admitted head first (strict head-of-line) while the budget,
``max_num_seqs`` and the free blocks above the watermark allow; the prefill chunk of a new request
is what the budget leaves. Prefix-cache hits are capped at prompt - 1 by the engine.

``vllm-v0`` (vLLM's original scheduler as Vidur implements it, the simulator the paper used):
prefill-only batches first. Waiting requests are admitted head first while the admission test
(free blocks - prompt blocks >= the 1 % watermark), ``max_num_seqs`` and the padded token limit
(``len(batch) x longest prompt <= max_num_batched_tokens``) hold; if at least one was admitted
the step is a prefill-only batch. Otherwise every running request decodes, preempting the newest
running request (recompute) while a decode lacks a block.

Defaults: v1 ``max_num_batched_tokens`` 8192 and ``max_num_seqs`` 256 (vLLM's for an OpenAI
server on an 80 GB GPU), ``long_prefill_token_threshold`` 0 (off); v0 4096 padded tokens (Vidur's
``max_tokens_in_batch``) and 256 sequences; ``watermark`` 0.01 for both.

Departures:

* Block accounting follows the engine (a decode needs a new block only when its last block is
  full; the final prefill chunk also stores token 1 when prefill emits it), where vLLM v0
  reserves one slot per sequence.
* The watermark (vLLM v0's, default 1 % of the blocks) also guards v1 admissions, as the issue
  asks; set ``watermark=0`` for vLLM v1's exact rule.
* v0 finishes a running request another policy left mid-prefill (the env's ``meta`` mode) in
  its next prefill batch, ahead of the queue (:func:`~baselines.base.finish_prefills`).
* v0: a prompt longer than ``max_num_batched_tokens`` is admitted alone (vLLM ignores it with an
  error; dropping requests would break the conservation invariant).
* The view does not say which prefix blocks are shared: an admitted request is charged its hit
  blocks too (they may be idle cache blocks it re-references) and a preempted one is credited
  all its blocks. When the second estimate is off, the engine's ``preempt_lifo_recompute``
  handler evicts the newest requests, vLLM's own rule. The policies force that handler,
  recompute preemption and the prompt - 1 cap on prefix hits (``engine_overrides``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import ClassVar

from llmsched_gym.core.batching import BatchBuilder
from llmsched_gym.core.ledger import preempt_newest
from llmsched_gym.core.scheduler import BatchPlan, EngineView, Scheduler

from .base import PolicyError, configure, finish_prefills, register

VLLM_ENGINE = {"overflow": "preempt_lifo_recompute", "preempt_mode": "recompute", "prefix_cap_prompt_minus_one": True}


_DECODES_AT_ONCE = 8
"""Running requests from which vLLM v1 counts an all-decode batch's blocks at once
(:meth:`~llmsched_gym.core.scheduler.EngineView.decode_blocks`: the engine's lockstep counts, or one
array operation) instead of scanning them request by request (the same plan). Fewer are scanned: the
array operation's fixed cost, about 2 us, is then most of the scan's (about half a microsecond a
request)."""


class VLLMFamily(Scheduler):
    """What vllm-v1, vllm-v0 and sarathi share: one constructor (every integer parameter must be
    >= 1, those in ``zero_ok`` >= 0, ``watermark`` in [0, 1)), vLLM's engine semantics
    (``engine_overrides``: LIFO preemption with recompute, prefix hits capped at prompt - 1) and
    one admission loop, :meth:`admit_head_of_line`."""

    engine_overrides = VLLM_ENGINE
    zero_ok: ClassVar[tuple[str, ...]] = ()
    """Integer parameters for which 0 is allowed (it switches the feature off)."""

    def __init__(self, **kwargs) -> None:
        configure(self, kwargs)
        for name, default in self.params.items():
            v = getattr(self, name)
            if name == "watermark":
                if not 0.0 <= v < 1.0:
                    raise PolicyError(f"policy.watermark: must be in [0, 1), got {v}")
            elif isinstance(default, int) and (v < 0 or (v == 0 and name not in self.zero_ok)):
                raise PolicyError(f"policy.{name}: must be {'>= 0' if name in self.zero_ok else '>= 1'}, got {v}")

    @staticmethod
    def admit_head_of_line(waiting: Iterable[int], admit: Callable[[int], bool]) -> None:
        """Waiting requests in queue order while ``admit(rid)`` takes them: strict head-of-line,
        the first request refused ends the admissions of the step."""
        for rid in waiting:
            if not admit(rid):
                return


@register("vllm-v1")
class VLLMV1(VLLMFamily):
    """vLLM v1: unified token budget, running first, chunked prefill, LIFO preemption."""

    params = {"max_num_batched_tokens": 8192, "max_num_seqs": 256, "long_prefill_token_threshold": 0,
              "watermark": 0.01}
    zero_ok = ("long_prefill_token_threshold",)

    def schedule(self, view: EngineView) -> BatchPlan:
        b = BatchBuilder(view, self.max_num_batched_tokens, reserve=False, max_num_seqs=self.max_num_seqs,
                         watermark=self.watermark)
        thr = self.long_prefill_token_threshold
        prefilled, target = view.prefilled, view.prefill_target
        running, led = b.running, b.ledger
        n, free, budget = b.n, b.free, b.budget
        # running requests in admission order: a decode or the next chunk of an unfinished prefill
        # (with a threshold several prefills can be unfinished, interleaved with decodes)
        i = 0
        if n >= _DECODES_AT_ONCE and not view.n_in_prefill and n <= budget:
            # every running request decodes and the budget reaches the last: the scan preempts
            # none exactly when all their blocks fit, so count them at once
            need = view.decode_blocks() if running is view.running else led.decodes(running)
            if need <= free:
                i, free, budget = n, free - need, budget - n
        while i < n and budget > 0:
            rid = running[i]
            left = int(target[rid] - prefilled[rid])
            if left > 0:
                c = min(left, thr, budget) if thr else min(left, budget)
                need = led.chunk(rid, int(view.kv_tokens[rid]), c)
            else:
                c = 1
                need = led.decode(rid)
            n, free = preempt_newest(led, running, n, rid, need, free, b.preempt)
            if b.preempt and b.preempt[-1] == rid:
                break
            free -= need
            budget -= c
            if left > 0:
                b.prefill[rid] = c
            i += 1
        # requests the scan did not reach (budget spent) skip this step with their KV kept
        b.pause = {r for r in running[i:n] if prefilled[r] >= target[r]}
        b.n = b.seqs = n
        b.free, b.budget = free, budget
        if not b.preempt:
            self.admit_head_of_line(view.waiting, lambda rid: b.admit(rid, chunk_cap=thr))
        return b.plan()


@register("vllm-v0")
class VLLMV0(VLLMFamily):
    """vLLM v0 (Vidur): prefill-only batches first, decodes only when no prefill is scheduled."""

    params = {"max_num_batched_tokens": 4096, "max_num_seqs": 256, "watermark": 0.01}

    def schedule(self, view: EngineView) -> BatchPlan:
        bs, led = view.block_size, view.ledger
        cont, blocks = finish_prefills(view)  # only in the env's meta mode
        free = view.kv_free // bs - blocks
        watermark = int(self.watermark * (view.kv_capacity // bs))
        target = view.prefill_target
        seqs = len(view.running)
        prefill: dict[int, int] = dict.fromkeys(cont, BatchPlan.FULL)
        longest = max((int(target[r] - view.prefilled[r]) for r in cont), default=0)

        def admit(rid: int) -> bool:
            """Within ``max_num_seqs``, the padded token limit and the watermark."""
            nonlocal free, seqs, longest
            if seqs >= self.max_num_seqs:
                return False
            t = int(target[rid])
            longest = max(longest, t)
            if prefill and (len(prefill) + 1) * longest > self.max_num_batched_tokens:
                return False
            hit = view.prefix_match(rid)
            need = led.admission(rid, hit)
            if free - need < watermark:
                return False
            free -= need
            prefill[rid] = BatchPlan.FULL
            seqs += 1
            return True

        self.admit_head_of_line(view.waiting, admit)
        if prefill:
            return BatchPlan(prefill=prefill, decode=False)
        running = view.running
        n = len(running)
        preempt: list[int] = []
        i = 0
        while i < n:
            rid = running[i]
            need = led.decode(rid)
            n, free = preempt_newest(led, running, n, rid, need, free, preempt)
            if preempt and preempt[-1] == rid:
                break
            free -= need
            i += 1
        return BatchPlan(preempt=preempt, hold=not preempt)
