"""The one Scheduler interface shared by every baseline and by the Gymnasium env.

At every iteration boundary the engine hands the scheduler a read-only :class:`EngineView` and
gets back a :class:`BatchPlan`:

* ``prefill``: ``{request_id: n_tokens}``: prompt tokens to process this iteration. A waiting
  request listed here is admitted (it joins the running set); a running request whose prefill is
  still incomplete continues it (chunked prefill). Use ``BatchPlan.FULL`` (0) for "the whole
  remaining prompt".
* ``preempt``: running requests to evict before the iteration (KV freed, back to the queue).
* ``decode``: whether running requests that finished prefill decode one token (default ``True``);
  ``pause`` lists running requests that keep their KV but skip this iteration.
* ``idle``: run nothing; the clock jumps to the next arrival.
* ``hold``: the scheduler promises that, with no new arrival, no completion and no memory event,
  it would return this same decode-only plan again; the engine may then fast-forward many decode
  iterations in one vectorised step (the result is identical to the step-by-step run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from llmsched_gym.core.information import (
    BLIND,
    CLAIRVOYANT,
    GuardedWorkload,
    InformationError,
    hidden_message,
    information_of,
)

if TYPE_CHECKING:
    from llmsched_gym.core.engine import Engine, EngineConfig
    from llmsched_gym.core.kv import KVCache
    from llmsched_gym.core.latency.base import LatencyModel
    from llmsched_gym.core.ledger import Ledger
    from llmsched_gym.core.request import Workload


class PlanError(ValueError):
    """A scheduler returned an invalid or infeasible plan (the message names the request)."""


@dataclass(slots=True)
class BatchPlan:
    prefill: dict[int, int] = field(default_factory=dict)
    preempt: list[int] = field(default_factory=list)
    decode: bool = True
    pause: frozenset[int] | set[int] = frozenset()
    idle: bool = False
    hold: bool = False

    FULL: ClassVar[int] = 0

    @classmethod
    def admit(cls, ids, hold: bool = False) -> BatchPlan:
        """Admit ``ids`` with their whole prompt; every running request decodes."""
        return cls(prefill={int(i): 0 for i in ids}, hold=hold)

    @classmethod
    def decode_only(cls, hold: bool = True) -> BatchPlan:
        return cls(hold=hold)

    @classmethod
    def wait(cls) -> BatchPlan:
        """Idle until the next arrival: nothing decodes, requests in the running set stay resident
        (paused, as WAIT holds them); invalid when no arrival is left."""
        return cls(idle=True)


class EngineView:
    """Read-only window on the engine state, built once per engine and cheap to read.

    Per-request arrays are indexed by request id and cover the whole workload; only ids in
    ``waiting`` and ``running`` are live. Do not mutate anything reached through the view.

    It holds what the policies read (every entry below is read by at least one of ``baselines/``)
    and is how the env's policy-side code reads the engine too: the batch a launch forms
    (:meth:`~llmsched_gym.env.driver.Driver.form`), the expert translation
    (:mod:`~llmsched_gym.env.experts`) and the action modes. The parts of the env that own and
    drive the engine (its driver's loop, the decision point, the observation builder) read the
    engine itself: its counters, block-level KV and, under ``blind``, the workload the view guards.

    ========================  =========================================================
    ``now``                   clock (seconds; rounds in round mode)
    ``iteration``             number of iterations executed so far
    ``waiting``               list of waiting ids, in queue order (arrival order; a
                              preempted request re-enters at the head, as in vLLM)
    ``running``               list of running ids, in admission order (newest last)
    ``state``                 per request: 0 pending, 1 waiting, 2 running, 3 done,
                              4 rejected
    ``n_in_prefill``          running requests whose prefill is unfinished (chunked)
    ``information``           the task's information model (``clairvoyant``,
                              ``predicted`` or ``blind``, see
                              :mod:`llmsched_gym.core.information`)
    ``workload``              the :class:`Workload`; under ``predicted`` and ``blind`` a
                              :class:`~llmsched_gym.core.information.GuardedWorkload`
                              whose ``output_tokens`` raises ``InformationError``
    ``prompt_tokens``         prompt length per request
    ``predicted_output``      the output length a policy may use (the true one when
                              clairvoyant); raises ``InformationError`` under ``blind``
    ``arrival_s``             arrival time per request
    ``prefilled``             prompt (or recompute) tokens whose KV is computed
    ``prefill_target``        tokens to prefill at (re)admission (prompt, or prompt +
                              generated after a recompute preemption)
    ``generated``             output tokens produced so far
    ``kv_tokens``             KV tokens held per request (prefilled + decoded since)
    ``swapped``               per request: its KV is swapped out to host memory (it
                              resumes from it when admitted again)
    ``kv_used`` / ``kv_free`` KV in tokens (paged mode: blocks x block size)
    ``kv_capacity``           capacity in tokens
    ``block_size``            1 in token mode
    ``prefix_match(i)``       cached prompt tokens request ``i`` would reuse now
    ``kv``                    the engine's :class:`~llmsched_gym.core.kv.KVCache` (block
                              hashes, LRU order, ``match_detail``); cache-aware policies
                              read it, and ``set_eviction_priority`` is its one write
    ``ledger``                the engine's :class:`~llmsched_gym.core.ledger.Ledger`: the
                              blocks a decode, chunk, admission or plan needs
    ``decode_blocks()``       blocks one decode step of every running request allocates
                              (``ledger.decodes(running)``, in O(1) when none is in prefill)
    ``next_arrival_s``        time of the next not-yet-arrived request (``inf`` if none)
    ``latency``               the batch-time model (for policies that estimate time)
    ``config``                the :class:`EngineConfig`
    ========================  =========================================================
    """

    __slots__ = ("_e", "_wl", "information")

    def __init__(self, engine: Engine) -> None:
        self._e = engine
        self.rebind()

    def rebind(self) -> None:
        """Follow the engine's workload after it grew (:meth:`Engine.extend`)."""
        wl = self._e.workload
        self.information = information_of(wl)
        self._wl = wl if self.information == CLAIRVOYANT else GuardedWorkload(wl, self.information)

    @property
    def kv(self) -> KVCache:
        return self._e.kv

    def decode_blocks(self) -> int:
        """KV blocks one decode step of every running request allocates (as
        ``ledger.decodes(running)``; O(1) when none of them is in prefill)."""
        return self._e.decode_blocks()

    @property
    def ledger(self) -> Ledger:
        """The engine's memory ledger: how many KV blocks a decode, a chunk, an admission or a whole
        plan needs, counted as the engine counts them (:mod:`llmsched_gym.core.ledger`)."""
        return self._e.ledger

    # clock and sets
    @property
    def now(self) -> float:
        return self._e.clock

    @property
    def iteration(self) -> int:
        return self._e.n_iterations

    @property
    def waiting(self) -> list[int]:
        return self._e.waiting

    @property
    def state(self) -> np.ndarray:
        """Per-request state: 0 pending, 1 waiting, 2 running, 3 done, 4 rejected (int8)."""
        return self._e.state

    @property
    def n_in_prefill(self) -> int:
        return self._e.n_in_prefill

    @property
    def running(self) -> list[int]:
        return self._e.running

    # workload
    @property
    def workload(self) -> Workload:
        return self._wl  # type: ignore[return-value]  # a GuardedWorkload reads like one

    @property
    def prompt_tokens(self) -> np.ndarray:
        return self._e.workload.prompt_tokens

    @property
    def predicted_output(self) -> np.ndarray:
        if self.information == BLIND:
            raise InformationError(hidden_message("predicted_output", BLIND))
        return self._e.workload.predicted_output

    @property
    def arrival_s(self) -> np.ndarray:
        return self._e.workload.arrival_s

    # progress
    @property
    def prefilled(self) -> np.ndarray:
        return self._e.prefilled

    @property
    def prefill_target(self) -> np.ndarray:
        return self._e.prefill_target

    @property
    def generated(self) -> np.ndarray:
        return self._e.generated

    @property
    def kv_tokens(self) -> np.ndarray:
        return self._e.kv_tokens

    @property
    def swapped(self) -> np.ndarray:
        return self._e.swapped

    # memory
    @property
    def kv_capacity(self) -> int:
        return self._e.kv.capacity_tokens

    @property
    def kv_used(self) -> int:
        return self._e.kv.used_tokens

    @property
    def kv_free(self) -> int:
        return self._e.kv.capacity_tokens - self._e.kv.used_tokens

    @property
    def block_size(self) -> int:
        return self._e.kv.block_size

    def blocks_for(self, n_tokens: int) -> int:
        """Blocks needed to hold ``n_tokens`` tokens (== tokens in token mode)."""
        bs = self._e.kv.block_size
        return -(-int(n_tokens) // bs)

    def prefix_match(self, req_id: int) -> int:
        return self._e.kv.match_tokens(req_id)

    @property
    def next_arrival_s(self) -> float:
        return self._e.next_arrival_s

    @property
    def latency(self) -> LatencyModel:
        return self._e.latency

    @property
    def config(self) -> EngineConfig:
        return self._e.config

    @property
    def prefill_emits_token(self) -> bool:
        return self._e.config.prefill_emits_token


class Scheduler:
    """Base class of every policy (baselines and the env's agent adapter).

    Subclasses set ``name`` and implement :meth:`schedule`; the hooks are optional. Parameters
    come from the constructor's keyword arguments (``--set policy.NAME=value`` on the CLI);
    ``params`` lists the accepted ones with their defaults, so unknown names are rejected.

    ``engine_overrides`` holds engine fields the policy needs (vLLM's LIFO preemption with
    recompute, Jaillet et al. 2025's clear-all on overflow): they replace the scenario's, except the fields
    the user sets explicitly with ``--set engine.X``
    (:func:`llmsched_gym.config.merge_engine_overrides`). An instance may set its own.
    """

    name: ClassVar[str] = "base"
    params: ClassVar[dict[str, Any]] = {}
    engine_overrides: dict[str, Any] = {}
    grows: ClassVar[bool] = True
    """False for a policy that keeps per-request arrays sized when it starts: it cannot serve a
    replica of a cluster, whose requests arrive at run time (:meth:`Engine.extend`)."""
    receives: ClassVar[bool] = True
    """False for a policy whose per-request state starts in :meth:`on_arrival`: it cannot decode
    the requests a decode replica of a disaggregated cluster receives running
    (:meth:`Engine.receive`, which calls no arrival hook)."""

    def reset(self, config: EngineConfig, rng: np.random.Generator) -> None:
        """Called once before a run; ``rng`` is the policy's own seeded stream."""
        self.rng = rng

    def needs(self) -> str:
        """What the policy reads about output lengths, with its parameters: ``"nothing"``,
        ``"predicted"`` (``view.predicted_output``) or ``"true"`` (``view.workload.output_tokens``).
        A task whose information model does not provide it cannot run the policy (see
        :mod:`llmsched_gym.core.information`); the default, ``"nothing"``, suits a policy that
        reads neither."""
        return "nothing"

    def schedule(self, view: EngineView) -> BatchPlan:
        raise NotImplementedError

    def on_arrival(self, req_id: int, view: EngineView) -> bool:
        """Return False to reject the request (it is reported, never lost)."""
        return True

    def on_tokens(self, req_ids: np.ndarray, n: int, view: EngineView) -> None:
        """``req_ids`` each produced ``n`` output tokens (``n > 1`` after a fast-forward)."""

    def on_prefill(self, req_id: int, n_tokens: int, view: EngineView) -> None:
        """``n_tokens`` prompt tokens of ``req_id`` were processed."""

    def on_preempt(self, req_id: int, view: EngineView) -> None:
        """``req_id`` lost its KV and went back to the queue."""

    def on_finish(self, req_id: int, view: EngineView) -> None:
        """``req_id`` completed."""

    # how rejections are explained in the per-request table
    def reject_reason(self, req_id: int) -> str:
        return f"rejected by {self.name}"

    # hook flags, so the engine skips calling empty hooks in the hot loop
    @classmethod
    def wants(cls, hook: str) -> bool:
        return getattr(cls, hook) is not getattr(Scheduler, hook)
