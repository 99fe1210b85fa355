"""MC-SF (Algorithm 2) and Algorithm 1 of Jaillet, Jiang, Podimata, Zhou, "Online Scheduling for
LLM Inference with KV Cache Constraints" (arXiv 2502.07115 v1; Section 4, Algorithm 1, and
Section 5, Algorithm 2, named MC-SF in later revisions).

Rule: running requests always continue (never paused or preempted). Waiting requests, in
ascending (predicted) output length, are started while the future-memory test Eq. (1) holds at
every completion point of the running and admitted requests, the candidate's own included;
admission stops at the first failure. ``semi-online`` (Algorithm 1) is the same rule, meant
for instances whose requests all arrive at t = 0.

Readings and departures (ours where the paper leaves the rule open):

* Time counts iterations, not seconds: the test bounds memory whatever a batch lasts (paper
  Section 7). The memory trajectory is the engine's: with ``prefill_emits_token = False`` (the
  jaillet scenarios) a request started in iteration ``t`` holds ``s + k`` tokens in iteration
  ``t + k``, ``k = 0..o`` (convention A); with ``True`` it holds ``s + 1 + k``, ``k = 0..o-1``.
* Per-request prompt sizes ``s_i`` (the paper's experiments) in place of the theory's common ``s``;
  the paper's ``break`` is kept (``on_fail="break"``) although with unequal ``s_i`` a later
  candidate may still fit; ``on_fail="skip"`` tries every candidate (O(queue) per iteration).
  Ties in length: earlier arrival, then smaller id (unspecified in the paper).
* Lengths are ``predicted_output`` (the true ones under the default oracle predictor);
  ``oracle=True`` reads the true lengths. A running request that outlives its prediction is
  assumed to finish in the next iteration. With noisy predictions the test can be wrong and an
  iteration can overflow; the engine's handler then applies (the paper, Section 8.1, only says the
  worker stops). Recommended: ``--set engine.overflow=preempt_lifo_recompute``; under the
  scenarios' default ``forbid`` a plan that would overflow drops its newest admissions, then
  preempts the newest running requests (:func:`~baselines.base.fit_plan`).
* A request preempted with recompute re-enters with its prompt plus generated tokens to
  re-prefill and its predicted remaining output; the queue order stays the paper's ``o_i``.
* Paged KV (``block_size > 1``, outside the paper): each request is charged ``block_size - 1``
  extra tokens for its partly filled last block, so the test stays a sufficient condition.
* Switching policies (the env's ``meta`` mode): the queue drops what another policy admitted
  (:meth:`MCSF.sync`), and a running request another policy left mid-prefill is finished
  (:func:`~baselines.base.finish_prefills`) and counted in the test as a candidate started now.
* If nothing runs and the first candidate fails (only when its predicted peak, or its paged
  charge, exceeds M alone), it is started anyway, otherwise the worker would wait forever.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

import numpy as np

from llmsched_gym.core.information import CLAIRVOYANT
from llmsched_gym.core.scheduler import BatchPlan, EngineView, Scheduler

from .base import PolicyError, configure, finish_prefills, register

if TYPE_CHECKING:
    from llmsched_gym.core.engine import EngineConfig


class CompletionProfile:
    """Eq. (1) evaluated at completion points, built incrementally (section 4).

    An item occupies ``base + j`` tokens after iteration ``now + j`` for ``j = 0..last`` and is
    freed after iteration ``now + last``. Total memory only grows between two completion points
    and drops just after one, so it peaks at the points ``last`` of the items: checking those
    (O(items) per candidate) is the same as checking every future iteration.
    """

    def __init__(self, bases: np.ndarray, lasts: np.ndarray, capacity: int) -> None:
        self.capacity = capacity
        self.bases = np.asarray(bases, dtype=np.int64)
        self.lasts = np.asarray(lasts, dtype=np.int64)
        order = np.argsort(self.lasts, kind="stable")
        b_sorted, l_sorted = self.bases[order], self.lasts[order]
        self.points = np.unique(l_sorted)
        first = np.searchsorted(l_sorted, self.points, side="left")
        tail_bases = np.concatenate((np.cumsum(b_sorted[::-1])[::-1], [0]))
        self.memory = tail_bases[first] + (len(l_sorted) - first) * self.points

    def _own_point(self, base: int, last: int) -> int:
        alive = self.lasts >= last
        return int(self.bases[alive].sum()) + (int(np.count_nonzero(alive)) + 1) * last + base

    def fits(self, base: int, last: int) -> bool:
        """Whether adding an item ``(base, last)`` keeps every completion point within capacity.

        Points after ``last`` are unchanged (Eq. (1) stops at the latest admitted completion)."""
        j = int(np.searchsorted(self.points, last, side="right"))
        pts = self.points[:j]
        if j and int((self.memory[:j] + base + pts).max()) > self.capacity:
            return False
        if j and self.points[j - 1] == last:
            return True
        return self._own_point(base, last) <= self.capacity

    def add(self, base: int, last: int) -> None:
        j = int(np.searchsorted(self.points, last, side="right"))
        new_point = not (j and self.points[j - 1] == last)
        own = self._own_point(base, last) if new_point else 0
        self.memory[:j] += base + self.points[:j]
        if new_point:
            self.points = np.insert(self.points, j, last)
            self.memory = np.insert(self.memory, j, own)
        self.bases = np.append(self.bases, base)
        self.lasts = np.append(self.lasts, last)


@register("mcsf")
class MCSF(Scheduler):
    """Algorithm 2 (MC-SF): shortest predicted output first under the Eq. (1) future-memory test.

    :param on_fail: ``break`` (the paper: stop at the first candidate that does not fit) or
        ``skip`` (try the remaining candidates too).
    :param oracle: use the true output lengths instead of ``predicted_output``.
    """

    params = {"on_fail": "break", "oracle": False}
    on_fail: str
    oracle: bool

    def __init__(self, **kwargs) -> None:
        configure(self, kwargs)
        if self.on_fail not in ("break", "skip"):
            raise PolicyError(f"policy.on_fail: {self.on_fail!r} is not one of break, skip")
        self._queue: list[tuple[int, int]] = []

    def reset(self, config: EngineConfig, rng: np.random.Generator) -> None:
        super().reset(config, rng)
        self._queue = []
        self._emits = 1 if config.prefill_emits_token else 0
        self._pad = config.block_size - 1

    def needs(self) -> str:
        return "true" if self.oracle else "predicted"

    def _lengths(self, view: EngineView) -> np.ndarray:
        return view.workload.output_tokens if self.oracle else view.predicted_output

    def _enqueue(self, key: int, rid: int) -> None:
        """The queue is a heap of ``(length, id)``: O(log n) per arrival and admission, where a
        sorted list costs O(n) per insertion (quadratic in an overloaded run)."""
        heapq.heappush(self._queue, (key, rid))

    def on_arrival(self, req_id: int, view: EngineView) -> bool:
        self._enqueue(int(self._lengths(view)[req_id]), req_id)
        return True

    def on_preempt(self, req_id: int, view: EngineView) -> None:
        self._enqueue(int(self._lengths(view)[req_id]), req_id)

    def profile(self, view: EngineView) -> CompletionProfile:
        """The running requests' future memory (each decodes one token per iteration)."""
        return self.profile_of(view, view.running)

    def profile_of(self, view: EngineView, run: list[int]) -> CompletionProfile:
        """The future memory of the running requests ``run``. One whose prefill another policy
        left unfinished (the env's ``meta`` mode) is counted as a candidate started now."""
        ids = np.asarray(run, dtype=np.int64)
        remaining = np.maximum(self._lengths(view)[ids] - view.generated[ids], 1)
        bases, lasts = view.kv_tokens[ids] + 1 + self._pad, remaining - 1
        if view.n_in_prefill:
            mid = view.prefilled[ids] < view.prefill_target[ids]
            bases[mid] = view.prefill_target[ids][mid] + self._emits + self._pad
            lasts[mid] = remaining[mid] - self._emits
        return CompletionProfile(bases, lasts, view.kv_capacity)

    def candidate(self, view: EngineView, rid: int) -> tuple[int, int]:
        """``(base, last)`` of ``rid`` if started now: its (re-)prefill, then one token per iteration."""
        remaining = max(int(self._lengths(view)[rid]) - int(view.generated[rid]), 1)
        if view.prefilled[rid] >= view.prefill_target[rid] and view.kv_tokens[rid]:
            # swapped out with its KV intact: it resumes decoding
            return int(view.kv_tokens[rid]) + 1 + self._pad, remaining - 1
        base = int(view.prefill_target[rid]) + self._emits + self._pad
        return base, remaining - self._emits

    def sync(self, view: EngineView) -> list[tuple[int, int]]:
        """The queue made exactly the waiting requests (the env's ``meta`` mode switches
        policies): entries another policy admitted go, and of a request it admitted that came
        back preempted only the first entry stays (the smaller key: its remaining output). The
        queue holds every waiting request (every arrival and preemption is queued), so equal
        lengths mean nothing to drop, as in every single-policy run."""
        if len(self._queue) != len(view.waiting):
            state = view.state
            seen: set[int] = set()
            self._queue = [q for q in self._queue if state[q[1]] == 1 and not (q[1] in seen or seen.add(q[1]))]
            heapq.heapify(self._queue)  # a sorted list (SJF's queue) stays as it is
        return self._queue

    def schedule(self, view: EngineView) -> BatchPlan:
        queue = self.sync(view)
        cont = finish_prefills(view)[0]  # only in the env's meta mode (profile() counts them)
        if not queue:
            return BatchPlan.admit(cont) if cont else BatchPlan.decode_only(hold=True)
        prof = self.profile(view)
        admit = self._admit_break(view, prof, queue) if self.on_fail == "break" else self._admit_skip(view, prof)
        if not admit and not view.running:
            admit.append(heapq.heappop(self._queue)[1])
        if not admit:
            return BatchPlan.admit(cont) if cont else BatchPlan.decode_only(hold=self._blocked(view, prof))
        return BatchPlan.admit(cont + admit)

    def _admit_break(self, view: EngineView, prof: CompletionProfile, queue: list[tuple[int, int]]) -> list[int]:
        """Shortest first while the test passes (the paper's rule): pop the heap's head."""
        admit: list[int] = []
        while queue:
            base, last = self.candidate(view, queue[0][1])
            if not prof.fits(base, last):
                break
            prof.add(base, last)
            admit.append(heapq.heappop(queue)[1])
        return admit

    def _admit_skip(self, view: EngineView, prof: CompletionProfile) -> list[int]:
        """Every candidate in order, each started if it passes (O(queue) per iteration)."""
        admit: list[int] = []
        for _, rid in sorted(self._queue):
            base, last = self.candidate(view, rid)
            if prof.fits(base, last):
                prof.add(base, last)
                admit.append(rid)
        if admit:
            taken = set(admit)
            self._queue = [q for q in self._queue if q[1] not in taken]
            heapq.heapify(self._queue)
        return admit

    def _blocked(self, view: EngineView, prof: CompletionProfile) -> bool:
        """``hold``: whether the queue's head fails the test at every boundary before the first
        running request completes, so the engine may fast-forward to that completion.

        Started ``d`` iterations later, the head ``(s, o)`` holds ``s + p - d`` tokens at a
        running completion point ``p`` (iterations from now) and is checked there while
        ``d <= p <= d + o``; the running requests' memory at ``p``, ``m(p)``, does not change
        before the first of them completes, after ``K`` iterations (``K - 1`` is the first
        point). So a point ``p`` in ``[K - 1, o]`` with ``m(p) + s + p - (K - 1) > M`` fails it
        at every ``d < K``. The engine stops at the first true completion, which must not come
        after the predicted one (a request outliving its prediction changes the test)."""
        if self.on_fail != "break" or view.n_in_prefill or not len(prof.points):
            return False
        s, o = self.candidate(view, self._queue[0][1])
        k1 = int(prof.points[0])  # K - 1
        j = int(np.searchsorted(prof.points, o, side="right"))
        if j == 0 or int((prof.memory[:j] + prof.points[:j]).max()) + s - k1 <= prof.capacity:
            return False
        if view.information != CLAIRVOYANT:
            return False  # which request completes first is unknown: no fast-forward past k1
        ids = np.asarray(view.running, dtype=np.int64)
        true_left = view.workload.output_tokens[ids] - view.generated[ids]
        return int(true_left.min()) - 1 <= k1


@register("semi-online")
class SemiOnline(MCSF):
    """Algorithm 1 (Section 4): the semi-online model, every request present at t = 0, sorted
    once by output length; the same rule as MC-SF, which the paper defines as Algorithm 1 applied
    to what has arrived so far. On a workload with later arrivals it therefore runs Algorithm 2."""
