"""Sarathi(-Serve) as Vidur implements it: the decode-first engine baseline of Ao et al.
2025 (section 6; Agrawal et al. 2023, "piggybacking decodes with chunked prefills").

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
(the same admission decisions). The batch is formed by the shared
:class:`~llmsched_gym.core.batching.BatchBuilder` (``reserve=True``), which the env's actions use too. Decodes allocate a block only when their last block is full.
"""

from __future__ import annotations

from llmsched_gym.core.batching import BatchBuilder
from llmsched_gym.core.scheduler import BatchPlan, EngineView

from .base import register
from .vllm import VLLMFamily


@register("sarathi")
class Sarathi(VLLMFamily):
    params = {"chunk_size": 512, "max_num_seqs": 128, "watermark": 0.01}

    def schedule(self, view: EngineView) -> BatchPlan:
        b = BatchBuilder(view, self.chunk_size, reserve=True, max_num_seqs=self.max_num_seqs,
                         watermark=self.watermark)
        b.decode_first(preempt=True)
        b.continue_prefills()
        if not b.preempt:
            self.admit_head_of_line(view.waiting, b.admit)
        return b.plan()
