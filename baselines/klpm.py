"""Dexter et al. 2025 ("LLM Query Scheduling with Prefix Reuse and Latency Constraints",
arXiv 2502.04677 v1): longest-prefix-match scheduling and k-LPM.

Rules (sections 2 and 4): ``lpm`` admits the waiting request with the most cached prompt tokens
(``view.prefix_match``), ties uniformly at random (footnote 4). ``k-lpm`` cycles one
oldest-first pick and ``k - 1`` longest-prefix picks (Algorithm 1's pseudocode), so ``k = 1`` is
FCFS and ``k -> infinity`` is LPM. ``sglang-lpm`` is SGLang v0.4's policy that LPM extends
(SGLang's source): a stable sort by matched tokens, requests whose own match is at most 32 tokens but that
share at least 32 tokens with an earlier such waiting request go last (in-batch prefix
deprioritisation), and plain FCFS when more than ``fcfs_above`` (128) requests wait.

Batched use (§2.1): each iteration the policy builds its pick order over the waiting queue and
admits along it while requests fit, stopping at the first that does not (head-of-line, as the
project's ``fcfs``); memory is checked exactly like ``fcfs`` (``memory="reserve"``: running
requests' remaining predicted output is reserved and a request needs its prompt plus predicted
output; ``"fit"``: prompt plus one token fits now). If nothing runs and the first pick's
reservation exceeds the whole capacity (a predicted output longer than the true one), it is started
anyway (waiting would deadlock; any request that arrived fits, larger ones are rejected at arrival). ``max_batch`` caps the running set and
``max_prefill_tokens`` the prompt tokens admitted per iteration (0: no cap).

Departures from the paper, with reasons:

* The cache is the engine's prefix cache (LRU, block-granular; ``klpm-toy`` sizes it to hold one
  prompt, which is Definition 2's last-prompt cache), not an ideal radix tree; matches are whole
  blocks and cached blocks are counted against memory as if newly allocated (conservative).
* Within one iteration matches are those of the cache before the iteration: the engine computes a
  shared prefix twice when two requests that share it are admitted together, so in-batch sharing
  is not credited in the pick order either.
* Oldest first means the head of the engine's queue (arrival order; a preempted request re-enters
  at the head, as in vLLM), which equals ``argmin t`` when nothing is preempted.
* The k-LPM step counter runs across iterations and is consumed only by admitted picks; it does not
  reset when the queue empties unless ``reset_on_empty`` (the paper leaves both open).
* Switching policies (the env's ``meta`` mode): the pick order is always built over the engine's
  queue; a running request another policy left mid-prefill is finished first
  (:func:`~baselines.base.finish_prefills`); the k-LPM step counter only counts this policy's picks.
* ``hit_metric="ratio"`` ranks by matched / prompt tokens (the paper's "hit rate" may mean either;
  SGLang and our default use absolute tokens). ``ties="stable"`` breaks ties by queue order.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from llmsched_gym.core.scheduler import BatchPlan, EngineView, Scheduler

from .base import PolicyError, configure, finish_prefills, register

COMMON = {"memory": "reserve", "max_batch": 0, "max_prefill_tokens": 0}


def _check(ok: bool, param: str, allowed: str, value: Any) -> None:
    if not ok:
        raise PolicyError(f"policy.{param}: must be {allowed}, got {value!r}")


class _PrefixAware(Scheduler):
    """Admission along a policy-defined pick order with ``fcfs``'s memory accounting."""

    params = COMMON

    def __init__(self, **kwargs: Any) -> None:
        configure(self, kwargs)
        _check(self.memory in ("reserve", "fit"), "memory", "one of reserve, fit", self.memory)
        _check(self.max_batch >= 0, "max_batch", "an int >= 0 (0 = no cap)", self.max_batch)
        _check(self.max_prefill_tokens >= 0, "max_prefill_tokens", "an int >= 0 (0 = no cap)",
               self.max_prefill_tokens)

    def needs(self) -> str:
        return "predicted" if self.memory == "reserve" else "nothing"

    def reset(self, config, rng: np.random.Generator) -> None:
        super().reset(config, rng)
        self._prefix: list | None = None
        self._by_need: list[tuple[int, int]] = []  # (need, request) heap, pruned lazily

    # ---- memory, as fcfs: whole blocks, optionally reserving the predicted output ----------
    def _need(self, view: EngineView, rid: int) -> int:
        extra = int(view.predicted_output[rid]) if self.memory == "reserve" else 1
        bs = view.block_size
        return -(-(int(view.prompt_tokens[rid]) + extra) // bs) * bs

    def _free(self, view: EngineView) -> int:
        free = view.kv_free
        run = view.running
        if self.memory == "reserve" and run:
            bs = view.block_size
            kv = view.kv_tokens[run]
            rest = view.predicted_output[run] - view.generated[run]
            free -= int(((-(-(kv + rest) // bs)) - (-(-kv // bs))).sum()) * bs
        return free

    def _track(self, rid: int, view: EngineView) -> None:
        heapq.heappush(self._by_need, (self._need(view, rid), rid))

    def on_arrival(self, req_id: int, view: EngineView) -> bool:
        self._track(req_id, view)
        return True

    def on_preempt(self, req_id: int, view: EngineView) -> None:
        self._track(req_id, view)

    def _min_need(self, view: EngineView) -> float:
        """The smallest need among the waiting requests; entries of requests no longer waiting
        (admitted here or, in the env's ``meta`` mode, by another policy) are dropped."""
        h, state = self._by_need, view.state
        while h and state[h[0][1]] != 1:
            heapq.heappop(h)
        return h[0][0] if h else math.inf

    def _matches(self, view: EngineView, ids: list[int]) -> np.ndarray:
        if self._prefix is None:
            wl = view.workload
            self._prefix = wl.prefix if (view.config.prefix_cache and wl.has_prefix) else []
        prefix = self._prefix
        if not prefix:
            return np.zeros(len(ids))
        m = np.fromiter((view.prefix_match(r) if prefix[r] else 0 for r in ids), dtype=np.float64, count=len(ids))
        if getattr(self, "hit_metric", "absolute") == "ratio":
            m = m / view.prompt_tokens[ids]
        return m

    def _tie_keys(self, n: int) -> np.ndarray:
        """Secondary sort keys among equal matches: queue position or uniform random."""
        if getattr(self, "ties", "stable") == "random":
            return self.rng.random(n)
        return np.arange(n, dtype=np.float64)

    def _order(self, view: EngineView, waiting: list[int]) -> Iterable[int]:
        """Positions (into ``waiting``) in pick order, consumed lazily; ``_consumed(k)`` is then
        told how many were taken."""
        raise NotImplementedError

    def _consumed(self, k: int, queue_empty: bool) -> None:
        """``k`` picks of the last order were admitted."""

    def schedule(self, view: EngineView) -> BatchPlan:
        waiting = view.waiting
        cont, blocks = finish_prefills(view)  # only in the env's meta mode
        if not waiting:
            return BatchPlan.admit(cont) if cont else BatchPlan.decode_only(hold=True)
        free = self._free(view) - blocks * view.block_size
        room = self.max_batch - len(view.running) if self.max_batch else len(waiting)
        idle = not (cont or view.running)
        if room <= 0 or (self._min_need(view) > free and not idle):
            # nothing can start before a completion or an arrival, whatever the order
            return BatchPlan.admit(cont) if cont else BatchPlan.decode_only(hold=True)
        prompt = view.prompt_tokens
        admit: list[int] = []
        tokens = 0
        first = -1
        for pos in self._order(view, waiting):
            if len(admit) >= room:
                break
            rid = waiting[pos]
            first = rid if first < 0 else first
            p = int(prompt[rid])
            if self.max_prefill_tokens and admit and tokens + p > self.max_prefill_tokens:
                break
            need = self._need(view, rid)
            if need > free:
                break
            free -= need
            tokens += p
            admit.append(rid)
        if idle and not admit:  # the first pick's reservation exceeds the capacity: start it anyway
            admit.append(first)
        self._consumed(len(admit), len(admit) == len(waiting))
        # something fits but the order's head does not: matches may change (LRU evictions), so
        # the policy must look again next iteration
        return BatchPlan.admit(cont + admit, hold=False) if admit or cont else BatchPlan.decode_only(hold=False)


@register("lpm")
class LPM(_PrefixAware):
    """Longest prefix match, ties at random (Dexter et al. 2025)."""

    params = {**COMMON, "ties": "random", "hit_metric": "absolute"}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        _check(self.ties in ("random", "stable"), "ties", "one of random, stable", self.ties)
        _check(self.hit_metric in ("absolute", "ratio"), "hit_metric", "one of absolute, ratio", self.hit_metric)

    def _order(self, view: EngineView, waiting: list[int]) -> list[int]:
        m = self._matches(view, waiting)
        return np.lexsort((self._tie_keys(len(waiting)), -m)).tolist()


@register("k-lpm")
class KLPM(LPM):
    """k-LPM (Dexter et al. 2025, section 4, Algorithm 1): one oldest-first pick, then ``k - 1`` longest-prefix picks."""

    params = {**LPM.params, "k": 2, "reset_on_empty": False}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        _check(self.k >= 1, "k", "an int >= 1 (1 = FCFS; lpm is k = infinity)", self.k)

    def reset(self, config, rng: np.random.Generator) -> None:
        super().reset(config, rng)
        self.step = 0

    def _order(self, view: EngineView, waiting: list[int]) -> Iterator[int]:
        n, k = len(waiting), self.k
        if k == 1:
            yield from range(n)
            return
        lpm: Iterator[int] | None = None  # computed at the first LPM slot only
        taken = bytearray(n)
        oldest = 0
        for slot in range(self.step, self.step + n):
            if slot % k == 0:
                while taken[oldest]:
                    oldest += 1
                pos = oldest
            else:
                if lpm is None:
                    lpm = iter(LPM._order(self, view, waiting))
                pos = next(p for p in lpm if not taken[p])
            taken[pos] = 1
            yield pos

    def _consumed(self, k: int, queue_empty: bool) -> None:
        self.step = 0 if (queue_empty and self.reset_on_empty) else self.step + k


@register("sglang-lpm")
class SGLangLPM(_PrefixAware):
    """SGLang v0.4's LPM (the policy Dexter et al. 2025 extend): stable sort by matched tokens with in-batch prefix
    deprioritisation, FCFS above ``fcfs_above`` waiting requests."""

    params = {**COMMON, "fcfs_above": 128, "in_batch_threshold": 32}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        _check(self.fcfs_above >= 0, "fcfs_above", "an int >= 0 (0 = never fall back)", self.fcfs_above)
        _check(self.in_batch_threshold >= 0, "in_batch_threshold", "an int >= 0 (0 = off)", self.in_batch_threshold)

    def _order(self, view: EngineView, waiting: list[int]) -> list[int]:
        n = len(waiting)
        if self.fcfs_above and n > self.fcfs_above:
            return list(range(n))
        m = self._matches(view, waiting)
        key = -m
        th = self.in_batch_threshold
        prefix = view.workload.prefix
        if th and prefix is not None:
            seen: set[tuple] = set()
            for pos, rid in enumerate(waiting):
                if m[pos] > th:
                    continue
                sig = _head_signature(prefix[rid], th)
                if sig is None:
                    continue
                if sig in seen:
                    key[pos] = np.inf
                else:
                    seen.add(sig)
        return np.argsort(key, kind="stable").tolist()


def _head_signature(segs, n_tokens: int) -> tuple | None:
    """The segments covering a prompt's first ``n_tokens`` tokens (None if its shareable head is
    shorter): two prompts share at least ``n_tokens`` tokens exactly when these are equal."""
    if not segs:
        return None
    out, acc = [], 0
    for seg_id, k in segs:
        take = min(k, n_tokens - acc)
        out.append((seg_id, take))
        acc += take
        if acc >= n_tokens:
            return tuple(out)
    return None
