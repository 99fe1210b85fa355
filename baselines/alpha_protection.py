"""The alpha-protection benchmarks of Jaillet, Jiang, Podimata, Zhou, "Online Scheduling for LLM
Inference with KV Cache Constraints" (2025, arXiv 2502.07115 v1, section 7 "benchmark
algorithms"): vLLM-like FCFS admission under a KV "magic number".

Rule: running requests always continue; waiting requests are started in arrival order while the
current KV usage plus the new prompt stays within ``(1 - alpha) M``, stopping at the first that
does not fit (no look-ahead). On overflow, ``alpha-greedy`` clears every running request back to
the queue with its progress lost; ``alpha-beta`` clears each with probability ``beta``.

Readings and departures (where the paper leaves the rule open, our reading):

1. Usage is the resident KV now (``view.kv_used``) plus the prompts admitted so far this
   iteration; a request preempted earlier counts its whole re-prefill (``prefill_target``).
2. Overflow is detected after an iteration's growth: the engine runs the overflowing iteration,
   then clears (``engine_overrides`` sets ``overflow`` to ``clear_all`` / ``clear_bernoulli``).
3. One Bernoulli pass per iteration boundary; memory may stay above M for a few iterations, and
   nothing is admitted meanwhile (usage is above the threshold).
4. Cleared progress is counted in ``recomputed_tokens``.
5. The clear-all loop is caught by the engine's loop detector (``engine.stall_iterations``:
   no completion for that many iterations); the summary reports ``non_terminating`` and
   ``stop_reason``, not an identical-state test.

A running request whose prefill another policy left unfinished (the env's ``meta`` mode) is
finished first and counts in the usage (:func:`~baselines.base.finish_prefills`).

``alpha = 0`` (no protection) is accepted as a limiting case. If nothing runs and the head
request's prompt alone exceeds the threshold, it is started anyway (otherwise the run deadlocks).
"""

from __future__ import annotations

from typing import Any

from llmsched_gym.core.scheduler import BatchPlan, EngineView, Scheduler

from .base import PolicyError, configure, finish_prefills, register


@register("alpha-greedy")
class AlphaGreedy(Scheduler):
    """alpha-protection greedy: FCFS below ``(1 - alpha) M``, clear all on overflow.

    :param alpha: protected fraction of the KV capacity, in [0, 1).
    """

    params = {"alpha": 0.25}
    engine_overrides: dict[str, Any] = {"overflow": "clear_all"}
    alpha: float

    def __init__(self, **kwargs) -> None:
        configure(self, kwargs)
        if not 0.0 <= self.alpha < 1.0:
            raise PolicyError(f"policy.alpha: must be in [0, 1), got {self.alpha}")

    def schedule(self, view: EngineView) -> BatchPlan:
        limit = (1.0 - self.alpha) * view.kv_capacity
        bs = view.block_size
        cont, blocks = finish_prefills(view)  # only in the env's meta mode
        usage = view.kv_used + blocks * bs
        target = view.prefill_target
        admit: list[int] = []
        for rid in view.waiting:
            need = view.blocks_for(int(target[rid])) * bs
            if usage + need > limit:
                break
            usage += need
            admit.append(rid)
        if not admit and not view.running:
            admit.append(view.waiting[0])
        if admit or cont:
            return BatchPlan.admit(cont + admit)
        # usage only grows until a completion or a clear, so the head keeps failing
        return BatchPlan.decode_only(hold=True)


@register("alpha-beta")
class AlphaBeta(AlphaGreedy):
    """alpha-protection beta-clearing: as alpha-greedy, but an overflow clears each running
    request independently with probability ``beta`` (the engine's ``clear_bernoulli``).

    :param alpha: protected fraction of the KV capacity, in [0, 1).
    :param beta: clearing probability, in (0, 1].
    """

    params = {"alpha": 0.2, "beta": 0.1}
    beta: float

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        if not 0.0 < self.beta <= 1.0:
            raise PolicyError(f"policy.beta: must be in (0, 1], got {self.beta}")
        self.engine_overrides = {"overflow": "clear_bernoulli", "overflow_beta": self.beta}
