"""FCFS: first come, first served admission while the request fits (reference policy).

Running requests always continue; waiting requests are admitted in queue (arrival) order while
their prompt plus one generated token fits in the free KV right now; admission stops at the first
request that does not fit (strict head-of-line). With ``admission="reserve"`` a request is admitted
only if every running and admitted request can finish without overflow (its full output is
reserved), so nothing is ever evicted; if nothing runs and the head's reservation exceeds the whole
capacity (a predicted output longer than the true one), the head is started anyway (waiting would
deadlock; any request that arrived fits, larger ones are rejected at arrival). A running request whose prefill another policy left unfinished
(the env's ``meta`` mode) is finished first (:func:`~baselines.base.finish_prefills`).

This is the plain engine exercise policy, not a paper's algorithm; the papers' FCFS variants
(Ao et al. 2025's FCFS-greedy-LIFO, vLLM) are separate baselines.
"""

from __future__ import annotations

from llmsched_gym.core.scheduler import BatchPlan, EngineView, Scheduler

from .base import PolicyError, configure, finish_prefills, register


@register("fcfs")
class FCFS(Scheduler):
    params = {"admission": "fit", "max_batch": 0}

    def __init__(self, **kwargs) -> None:
        configure(self, kwargs)
        if self.admission not in ("fit", "reserve"):
            raise PolicyError(f"policy.admission: {self.admission!r} is not one of fit, reserve")

    def needs(self) -> str:
        return "predicted" if self.admission == "reserve" else "nothing"

    def schedule(self, view: EngineView) -> BatchPlan:
        bs = view.block_size
        cont, blocks = finish_prefills(view)  # only in the env's meta mode
        free = view.kv_free - blocks * bs
        prompt = view.prompt_tokens
        admit: list[int] = []
        n_run = len(view.running)
        if self.admission == "reserve":
            # tokens still to be written by running requests before they finish
            out = view.predicted_output
            gen = view.generated
            free -= sum(
                -(-(int(view.kv_tokens[r]) + int(out[r] - gen[r])) // bs) * bs - -(-int(view.kv_tokens[r]) // bs) * bs
                for r in view.running
            )
        for rid in view.waiting:
            if self.max_batch and n_run + len(admit) >= self.max_batch:
                break
            extra = int(view.predicted_output[rid]) if self.admission == "reserve" else 1
            need = -(-(int(prompt[rid]) + extra) // bs) * bs
            if need > free:
                break
            free -= need
            admit.append(rid)
        if not (admit or cont or view.running) and view.waiting:
            # the head's reservation exceeds the whole capacity (a predicted output longer than the
            # true one): start it anyway, it fits (larger requests are rejected at arrival)
            admit.append(view.waiting[0])
        return BatchPlan.admit(cont + admit, hold=not (cont or admit))
