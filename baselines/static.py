"""The static heuristic family: a queue order x a batch former x ``max_num_seqs``.

Every policy here forms its batch the way Sarathi-Serve (Agrawal et al. 2024, "Taming
Throughput-Latency Tradeoff in LLM Inference with Sarathi-Serve", section 4) and vLLM's v1
scheduler do (:class:`~llmsched_gym.core.batching.BatchBuilder`): running decodes first, then
unfinished prefills, then admissions from the waiting queue, head-of-line, each with a chunk of
what the token budget leaves. What changes is the order in which the waiting queue is read:

``order``
    * ``fcfs``: the engine's queue order (arrival; a preempted request re-enters at the head, as
      in vLLM). With ``chunk_size`` 512 and ``max_num_seqs`` 128 this is exactly ``sarathi``.
    * ``prompt``: shortest prompt first (known at arrival, needs no prediction).
    * ``output``: shortest predicted remaining output first (``view.predicted_output`` minus
      the tokens already generated, at least 1; only a preempted request has generated any).
    * ``total``: shortest predicted prompt + remaining output first.
    * ``las``: least attained service first, discretised as a multi-level feedback queue in which
      every request enters the top level (the classic approximation of LAS that FastServe starts
      from): level ``k`` once a request has generated ``quantum x (2^k - 1)`` output tokens.
      Preemptive like ``mlfq``.
    * ``mlfq``: FastServe's skip-join multi-level feedback queue (Wu et al. 2023, "Fast
      Distributed Inference Serving for Large Language Models", section 4.1). Level ``i`` has a
      quantum of ``quantum x 2^i`` iterations; a request joins the highest level whose quantum
      covers its first iteration (the prefill of its prompt, in units of one decode iteration at
      that context, from the scenario's batch-time model: skip-join), and drops one level each
      time it has used up the quantum of its level. Lower level first, ties by queue order; a
      waiting request that cannot be admitted preempts running requests at a strictly lower
      priority level, the lowest first.
    * ``lpm``: longest prefix match first (cached prompt tokens, ``view.prefix_match``), as
      SGLang's ``--schedule-policy lpm``, including its fallback to FCFS when more than 128
      requests wait (SGLang's source, ``schedule_policy.py``).

    Ties always keep the queue order (a stable sort). These are the orders that vLLM's
    ``--scheduling-policy priority`` serves when the client sets each request's ``priority`` to the
    key (vLLM admits by ``(priority, arrival_time)``), and, for ``fcfs`` and ``lpm``, SGLang's
    ``--schedule-policy fcfs`` and ``lpm`` (its ``lof``, longest output first, is the reverse of
    ``output``; its ``random`` is not a heuristic worth a reference).
``chunk_size``
    The iteration's token budget (decodes count one token each), as Sarathi-Serve's chunked
    prefill and vLLM's ``max_num_batched_tokens``; ``0`` is whole-prompt prefill (vLLM without
    chunking): decodes are never paused and an admitted request prefills its whole prompt.
``max_num_seqs``
    The cap on running requests (vLLM's ``--max-num-seqs``).
``quantum``
    ``las`` and ``mlfq``: the quantum of the top level, in decode iterations (output tokens); 1 by
    default, FastServe's choice of the shortest iteration for its top queue. Unused by the other
    orders.
``watermark``
    The fraction of KV blocks an admission must leave free (vLLM's 1 %).
``prompt_weight``
    ``output`` only: the key becomes predicted remaining output + ``prompt_weight`` x prompt
    length (0 by default: shortest predicted output alone; ``total`` is the weight 1). Under a
    tight KV cache a small weight orders better than either end: a long prompt holds its blocks
    from the first iteration. Not in :func:`static_family` (the benchmark's best static heuristic
    is chosen without it); the ``tune`` action mode of ``LLMSched-v1`` can set it per decision.

Memory: an admission must fit its whole prompt (Sarathi's rule, ``reserve=True``); when a
running decode lacks a block the victim is the running request with the worst key (vLLM's
priority scheduling preempts ``max(running, key=(priority, arrival_time))``), for ``fcfs`` and
``lpm`` the newest admitted one (vLLM's default); running requests decode and continue their
prefills best key first, so a budget that cannot serve them all pauses the worst. Nothing is
admitted on an iteration whose decodes preempted (Sarathi's and vLLM's rule). Preemption is the
engine's ``preempt_mode``: recompute, as vLLM forces it.

Departures:

* FastServe keeps a preempted job's KV cache and swaps it to host memory proactively; here a
  preempted request loses its KV and re-prefills prompt + generated tokens (vLLM's recompute);
  ``--set engine.preempt_mode=swap`` gives swapping instead. FastServe's starvation guard
  (promoting a job that waited too long to the top level) is left out, and its levels are
  unbounded.
* The preemptions of ``las`` and ``mlfq`` are chosen before the batch is formed, on an estimate of
  the free blocks (this iteration's decode blocks and a whole-prompt reservation); when the
  builder then refuses the admission after all, the victims were preempted for nothing.
* ``lpm`` leaves out SGLang's in-batch prefix deprioritisation (see ``sglang-lpm`` for it).
* Information: ``output`` and ``total`` read the predictor (``view.predicted_output``), never
  the true lengths; under a task without output-length information they are not applicable.
  The other orders read only what the engine knows at arrival or observes.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from llmsched_gym.core.batching import BatchBuilder
from llmsched_gym.core.scheduler import BatchPlan, EngineView

from .base import PolicyError, register
from .vllm import VLLMFamily

ORDERS = ("fcfs", "prompt", "output", "total", "las", "mlfq", "lpm")
"""The queue orders, in the order the docs list them."""
PREEMPTIVE = ("las", "mlfq")
"""Orders under which a waiting request may preempt running ones."""
NEEDS_PREDICTION = ("output", "total")
"""Orders that read the output-length predictor."""
LPM_FCFS_ABOVE = 128
"""SGLang's lpm falls back to FCFS when more requests than this wait."""


class OrderedBatcher(VLLMFamily):
    """Sarathi's batch former reading the waiting queue in the order of :meth:`keys`.

    Subclasses define :meth:`keys` (lower first) and may set :attr:`preemptive` and
    :meth:`outranks`. Shared by ``static`` and the hindsight reference's per-request priorities
    (:mod:`llmsched_gym.hindsight`), so that both form batches identically."""

    params: ClassVar[dict[str, Any]] = {"chunk_size": 512, "max_num_seqs": 128, "watermark": 0.01}
    zero_ok = ("chunk_size",)
    preemptive = False
    reorder_running = True
    """Decode, continue prefills and pick memory victims in key order (else admission order)."""
    fixed_waiting_keys = True
    """A waiting request's key does not change while it waits (the waiting order is then cached
    until the engine's queue changes)."""

    def reset(self, config, rng: np.random.Generator) -> None:
        super().reset(config, rng)
        self._wlist: list[int] | None = None
        self._wcache: tuple[list[int], np.ndarray | None] = ([], None)

    def waiting_order(self, view: EngineView) -> tuple[list[int], np.ndarray | None]:
        """The waiting queue best first and its keys (:meth:`ranked`), cached while it is unchanged."""
        waiting = view.waiting
        as_list = getattr(waiting, "as_list", None)
        if as_list is None or not self.fixed_waiting_keys:
            return self.ranked(view, waiting)
        lst = as_list()  # the engine builds a new list whenever the queue changes
        if lst is not getattr(self, "_wlist", None):
            self._wlist, self._wcache = lst, self.ranked(view, lst)
        return self._wcache

    def keys(self, view: EngineView, ids: np.ndarray) -> np.ndarray:
        """Sort keys of ``ids`` (lower is served first)."""
        raise NotImplementedError

    def outranks(self, waiting_key: float, running_key: float) -> bool:
        """Whether a waiting request with ``waiting_key`` may preempt a running one."""
        return waiting_key < running_key

    def ranked(self, view: EngineView, ids: list[int]) -> tuple[list[int], np.ndarray | None]:
        """``ids`` best first (stable) and their keys in that order (``None`` when not sorted)."""
        if len(ids) <= 1 and not self.preemptive:
            return ids, None
        arr = np.fromiter(ids, np.int64, len(ids))
        k = self.keys(view, arr)
        idx = np.argsort(k, kind="stable")
        return arr[idx].tolist(), k[idx]

    def schedule(self, view: EngineView) -> BatchPlan:
        budget = self.chunk_size or None
        waiting = view.waiting
        victims: list[int] = []
        order: list[int] = waiting
        if waiting:
            order, wkeys = self.waiting_order(view)
            if self.preemptive and view.running:
                victims = self._victims(view, order, wkeys)
        b = BatchBuilder(view, budget, reserve=True, max_num_seqs=self.max_num_seqs, watermark=self.watermark,
                         preempted=victims)
        if self.reorder_running and len(b.running) > 1:
            b.running, _ = self.ranked(view, b.running)
        b.decode_first(preempt=True)
        b.continue_prefills()
        if len(b.preempt) == len(victims):  # no decode had to preempt
            for rid in order:
                if not b.admit(rid):
                    break
        plan = b.plan()
        if self.preemptive and waiting:
            plan.hold = False  # attained service grows while decoding: the keys change
        return plan

    def _victims(self, view: EngineView, order: list[int], wkeys: np.ndarray) -> list[int]:
        """Running requests to preempt so that the best waiting requests fit (module docstring)."""
        running = view.running
        rarr = np.fromiter(running, np.int64, len(running))
        rkeys = self.keys(view, rarr)
        # worst first, newest first among equals
        worst = sorted(range(len(running)), key=lambda i: (-rkeys[i], -i))
        if not self.outranks(float(wkeys[0]), float(rkeys[worst[0]])):
            return []
        bs, led = view.block_size, view.ledger
        prefilled, target = view.prefilled, view.prefill_target
        dec = [r for r in running if prefilled[r] >= target[r]]
        free = view.kv_free // bs - sum(led.decode(r) for r in dec)
        free -= int(self.watermark * (view.kv_capacity // bs))
        seqs = len(running)
        budget = (self.chunk_size - len(dec)) if self.chunk_size else math.inf
        victims: list[int] = []
        j = 0
        for rid, kw in zip(order, wkeys.tolist(), strict=True):
            if budget <= 0:
                break
            need = view.blocks_for(int(target[rid]) + 1)
            while (seqs >= self.max_num_seqs or need > free) and j < len(worst):
                v = worst[j]
                if not self.outranks(kw, float(rkeys[v])):
                    break
                victim = running[v]
                victims.append(victim)
                free += led.held(victim)
                seqs -= 1
                budget += prefilled[victim] >= target[victim]
                j += 1
            if seqs >= self.max_num_seqs or need > free:
                break
            free -= need
            seqs += 1
            budget -= int(target[rid])
        return victims


@register("static")
class Static(OrderedBatcher):
    """A static heuristic: queue ``order`` through Sarathi's batch former (module docstring)."""

    params: ClassVar[dict[str, Any]] = {"order": "fcfs", "chunk_size": 512, "max_num_seqs": 128, "quantum": 1,
                                        "watermark": 0.01, "prompt_weight": 0.0}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self.order not in ORDERS:
            raise PolicyError(f"policy.order: unknown {self.order!r}; allowed: {', '.join(ORDERS)}")
        if not (math.isfinite(self.prompt_weight) and self.prompt_weight >= 0.0):
            raise PolicyError(f"policy.prompt_weight: must be a finite number >= 0, got {self.prompt_weight!r}")
        if self.prompt_weight and self.order != "output":
            raise PolicyError(f"policy.prompt_weight: only order 'output' reads it, got order {self.order!r}")
        self.preemptive = self.order in PREEMPTIVE
        self.reorder_running = self.order not in ("fcfs", "lpm")
        self.fixed_waiting_keys = self.order != "lpm"  # prefix matches change with the cache
        self.reads_prediction = self.order in NEEDS_PREDICTION
        self._entry: np.ndarray | None = None

    def needs(self) -> str:
        return "predicted" if self.reads_prediction else "nothing"

    @property
    def prompt_weight(self) -> float:
        """The ``output`` key's weight on the prompt length (module docstring)."""
        return self._prompt_weight

    @prompt_weight.setter
    def prompt_weight(self, value: float) -> None:
        self._prompt_weight = float(value)
        self._wlist = None  # the cached waiting order was sorted with the old keys

    def reset(self, config, rng: np.random.Generator) -> None:
        super().reset(config, rng)
        self._entry = None

    def ranked(self, view: EngineView, ids: list[int]) -> tuple[list[int], np.ndarray | None]:
        if self.order == "fcfs" or (self.order == "lpm" and len(ids) > LPM_FCFS_ABOVE):
            return ids, None
        return super().ranked(view, ids)

    def keys(self, view: EngineView, ids: np.ndarray) -> np.ndarray:
        order = self.order
        if order == "prompt":
            return view.prompt_tokens[ids]
        if order in ("output", "total"):
            rest = np.maximum(view.predicted_output[ids] - view.generated[ids], 1)
            if order == "total":
                return rest + view.prompt_tokens[ids]
            return rest + self._prompt_weight * view.prompt_tokens[ids] if self._prompt_weight else rest
        if order in PREEMPTIVE:
            return self.levels(view, ids)
        if order == "lpm":
            return -np.fromiter((view.prefix_match(int(r)) for r in ids), np.int64, len(ids))
        return np.arange(len(ids))  # fcfs: queue order

    def entry_levels(self, view: EngineView) -> np.ndarray:
        """Entry level of every request: under ``mlfq`` (skip-join) the highest level (lowest
        index ``i``) whose quantum ``quantum x 2^i`` covers the prompt's prefill time in decode
        iterations; under ``las`` 0."""
        if self._entry is None and self.order == "las":
            self._entry = np.zeros(len(view.prompt_tokens), np.int64)
        if self._entry is None:
            lat = view.latency
            prompts = view.prompt_tokens
            ratio = np.empty(len(prompts))
            cache: dict[int, float] = {}
            for i, p in enumerate(prompts.tolist()):
                if p not in cache:
                    cache[p] = lat.batch_time(p, 0, 1, 0, 0) / max(lat.batch_time(0, 0, 0, 1, p), 1e-12)
                ratio[i] = cache[p]
            self._entry = np.maximum(np.ceil(np.log2(np.maximum(ratio / self.quantum, 1e-12))), 0).astype(np.int64)
        return self._entry

    def levels(self, view: EngineView, ids: np.ndarray) -> np.ndarray:
        """The MLFQ level of ``ids`` now: the entry level ``e`` plus the quanta used up, i.e. the
        largest ``k`` with ``generated >= quantum x 2^e x (2^k - 1)``."""
        e = self.entry_levels(view)[ids]
        q = self.quantum * np.exp2(e)
        return e + np.floor(np.log2(view.generated[ids] / q + 1.0)).astype(np.int64)


def static_family(information: str = "clairvoyant") -> list[dict[str, Any]]:
    """The grid of static heuristics the benchmark searches on a task's validation seed.

    Every order the information model allows (``blind``: no ``output`` nor ``total``) x
    ``chunk_size`` in 0 (whole prefill), 128, 256, 512, 1024, 2048 x ``max_num_seqs`` in 64, 256.
    ``max_num_seqs`` 256 is vLLM's default on an 80 GB GPU (no binding cap on the scenarios'
    memory: KV fills first), 64 a cap that binds and keeps decodes fast under load; the grid stops
    at two values because the cap matters far less than the order and the budget on these tasks,
    and each value doubles the search: 7 orders x 6 budgets x 2 caps = 84 specs, measured at 47 s
    for a 1000-request azure-conv workload and 5 s for 500 jaillet-high requests (one process on a
    busy 2-core machine; overloaded variants with a small KV take 60-120 s)."""
    if information not in ("clairvoyant", "predicted", "blind"):
        raise PolicyError(f"information: unknown {information!r}; allowed: clairvoyant, predicted, blind")
    orders = [o for o in ORDERS if information != "blind" or o not in NEEDS_PREDICTION]
    return [{"name": "static", "order": o, "chunk_size": c, "max_num_seqs": m}
            for o in orders for c in (0, 128, 256, 512, 1024, 2048) for m in (64, 256)]
