"""Sarathi(-Serve) as Vidur implements it: the decode-first engine baseline of seed 003 (Ao et
al., section 6; digest 3.6; Agrawal et al. 2023, "piggybacking decodes with chunked prefills").

Each step has a token budget ``chunk_size`` (512). First every running request whose prefill is
complete decodes one token (admission order, each costing 1 token of the budget); a decode that
lacks a block preempts the newest running request (recompute, back to the head of the queue).
Then running requests with an unfinished prefill get their next chunk (what the budget has left),
and finally waiting requests are admitted head first while ``max_num_seqs``, the budget and the
admission test (free blocks - the whole prompt's blocks >= the 1 % watermark) allow, each with a
chunk of what the budget leaves. Mixed prefill/decode batches are the norm. Nothing is admitted
on a step that preempted (the victim heads the queue and would not fit). ``max_num_seqs``
defaults to Vidur's ``batch_size_cap`` (128).

Departures: Vidur allocates a request's prompt blocks at admission; the engine grows KV chunk by
chunk, so the policy keeps the remaining prompt blocks of unfinished prefills reserved instead
(the same admission decisions). Decodes allocate a block only when their last block is full.
"""

from __future__ import annotations

from llmsched_gym.core.scheduler import BatchPlan, EngineView, Scheduler

from .base import configure, register
from .vllm import VLLM_ENGINE, check_positive, check_watermark, chunk_blocks, decode_blocks, preempt_newest


@register("sarathi")
class Sarathi(Scheduler):
    params = {"chunk_size": 512, "max_num_seqs": 128, "watermark": 0.01}
    engine_overrides = VLLM_ENGINE

    def __init__(self, **kwargs) -> None:
        configure(self, kwargs)
        check_positive(self, "chunk_size", "max_num_seqs")
        check_watermark(self)

    def schedule(self, view: EngineView) -> BatchPlan:
        bs = view.block_size
        prefilled, target, kvt = view.prefilled, view.prefill_target, view.kv_tokens
        running = view.running
        n = len(running)
        # blocks still owed to unfinished prefills (Vidur allocated them at admission)
        reserved = {
            r: chunk_blocks(view, r, int(kvt[r]), int(target[r] - prefilled[r]))
            for r in running if prefilled[r] < target[r]
        }
        free = view.kv_free // bs - sum(reserved.values())
        budget = self.chunk_size
        preempt: list[int] = []
        i = 0
        while i < n and budget > 0:
            rid = running[i]
            if rid in reserved:
                i += 1
                continue
            need = decode_blocks(view, rid)
            n, free = preempt_newest(view, running, n, rid, need, free, preempt, reserved)
            if preempt and preempt[-1] == rid:
                break
            free -= need
            budget -= 1
            i += 1
        pause = {r for r in running[i:n] if r not in reserved}
        prefill: dict[int, int] = {}
        for rid in running[:n]:
            if budget <= 0:
                break
            if rid in reserved:
                c = min(int(target[rid] - prefilled[rid]), budget)
                prefill[rid] = c
                budget -= c
        if not preempt:
            watermark = int(self.watermark * (view.kv_capacity // bs))
            seqs = n
            for rid in view.waiting:
                if budget <= 0 or seqs >= self.max_num_seqs:
                    break
                hit = view.prefix_match(rid)
                left = int(target[rid]) - hit
                need = chunk_blocks(view, rid, hit, left) + hit // bs
                if free - need < watermark:
                    break
                free -= need
                c = min(left, budget)
                prefill[rid] = c
                budget -= c
                seqs += 1
        hold = not prefill and not preempt and not pause and not reserved
        return BatchPlan(prefill=prefill, preempt=preempt, pause=pause, hold=hold)
