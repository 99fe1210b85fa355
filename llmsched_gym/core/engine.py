"""The iteration-level engine: one GPU worker serving a workload, driven by a Scheduler.

One loop, used by every baseline and by the Gymnasium env::

    engine = Engine(workload, config, latency, scheduler, seed)
    while engine.poll():                  # arrivals, idle jumps, termination
        plan = scheduler.schedule(engine.view)
        engine.execute(plan)              # validate, overflow handling, time, progress

Semantics of one iteration (``execute``):

1. Preemptions in the plan are applied (``config.preempt_mode``: ``recompute`` keeps the
   generated tokens and re-prefills prompt + generated; ``restart`` loses all progress; ``swap``
   moves the KV to host memory and pays the transfer both ways).
2. The batch is the plan's prefill chunks plus one decode token for every running request whose
   prefill is complete (unless paused or ``decode=False``).
3. KV after the iteration must fit. Otherwise the overflow handler runs: ``forbid`` refuses the
   plan (``PlanError`` naming the request and the shortfall); ``preempt_lifo_recompute`` and
   ``swap`` evict the newest running requests before the iteration (vLLM); ``clear_all`` and
   ``clear_bernoulli`` (Jaillet et al. 2025) run the overflowing iteration and then clear all running requests,
   or each with probability ``overflow_beta``, back to the queue with their progress lost.
4. The clock advances by the latency model's batch time (times ``1 + noise`` when
   ``latency_noise_cv > 0``; the noise is indexed by iteration number).
5. Prefill chunks progress; the final chunk produces the first output token when
   ``prefill_emits_token`` (real engines) and none otherwise (the theory papers); each decode
   produces one token; a request completes when its output length is reached and frees its KV.

A request whose prompt plus output cannot fit in the KV capacity even alone is rejected at
arrival with the reason (never lost, never an abort).

A request holds ``kv_tokens = prefilled + tokens decoded since its (re)start`` tokens of KV,
rounded up to blocks in paged mode. Requests keep their original arrival time through
preemptions, so latency keeps counting.

Fast-forward: when the plan is decode-only and ``hold`` is set, the engine runs the following
decode iterations as one vectorised step, up to the next arrival, completion, memory event or
horizon. Every quantity (clock, KV, records, log) equals the step-by-step run bit for bit.
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import asdict, astuple, dataclass, fields, replace
from typing import Any

import numpy as np

from llmsched_gym.config import ConfigError, check_engine
from llmsched_gym.core.buffers import resized
from llmsched_gym.core.iteration_log import LOG_COLUMNS, IterationLog
from llmsched_gym.core.kv import KVCache
from llmsched_gym.core.latency.base import LatencyModel
from llmsched_gym.core.ledger import Ledger
from llmsched_gym.core.queue import WaitingQueue
from llmsched_gym.core.request import Workload
from llmsched_gym.core.scheduler import BatchPlan, EngineView, PlanError, Scheduler

PENDING, WAITING, RUNNING, DONE, REJECTED = 0, 1, 2, 3, 4
MIGRATED = 5
"""State of a request that left this engine by live migration (it finishes on another replica)."""

_FEW = 16
"""Up to this many requests added at once (:meth:`Engine.extend`) are read and written as scalars,
one by one; more as array slices (the same values: NumPy's overhead pays only for many)."""

__all__ = ["LOG_COLUMNS", "ConfigError", "Counters", "Engine", "EngineConfig"]



@dataclass
class EngineConfig:
    """Engine settings; every field can be overridden with ``--set engine.FIELD=value``.

    :param kv_capacity_tokens: KV capacity in tokens (whole blocks are used).
    :param block_size: 1 = token-level KV (the papers); 16 = paged blocks (vLLM).
    :param prefill_emits_token: the last prefill chunk produces output token 1 (real engines).
    :param overflow: ``forbid | clear_all | clear_bernoulli | preempt_lifo_recompute | swap``.
    :param overflow_beta: clearing probability of ``clear_bernoulli`` (Jaillet et al. 2025's beta).
    :param preempt_mode: what a preemption (scheduler-requested or by ``preempt_lifo_recompute``)
        does: ``recompute`` (vLLM: re-prefill prompt + generated), ``restart`` (Ao et al. 2025's full
        restart), ``swap``.
    :param swap_gb_s: host<->GPU bandwidth for ``swap`` (GB/s, PCIe 4 x16 ~ 25).
    :param kv_bytes_per_token: bytes of KV per token (for swap transfer times).
    :param prefix_cache: share full prompt blocks between requests with common prefixes.
    :param prefix_cap_prompt_minus_one: a hit covers at most ``prompt - 1`` tokens (vLLM).
    :param horizon_s: stop at this time (requests still in the system are reported unfinished).
    :param max_iterations: stop after this many iterations.
    :param stall_iterations: loop detector: stop and flag ``non_terminating`` when this many
        iterations pass without a completion while work exists (0 = automatic).
    :param latency_noise_cv: multiplicative batch-time noise (normal, clipped at -0.9).
    :param fast_forward: allow vectorised decode runs (results are identical either way).
    """

    kv_capacity_tokens: int = 118_784
    block_size: int = 1
    prefill_emits_token: bool = True
    overflow: str = "forbid"
    overflow_beta: float = 0.5
    preempt_mode: str = "recompute"
    swap_gb_s: float = 25.0
    kv_bytes_per_token: int = 524_288
    prefix_cache: bool = True
    prefix_cap_prompt_minus_one: bool = True
    horizon_s: float | None = None
    max_iterations: int | None = None
    stall_iterations: int = 0
    latency_noise_cv: float = 0.0
    fast_forward: bool = True

    def validate(self) -> None:
        """Check every field against :data:`llmsched_gym.config.ENGINE` (types, ranges, choices, a
        capacity of at least one block) and store it in its canonical type; raises ConfigError
        naming ``engine.FIELD``. A config made by :meth:`checked` is not checked again (unless a
        field changed since)."""
        if self.__dict__.get("_checked") == astuple(self):
            return
        for key, value in check_engine(asdict(self)).items():
            setattr(self, key, value)

    @classmethod
    def checked(cls, section: dict[str, Any]) -> EngineConfig:
        """The config of a scenario's engine section that :func:`llmsched_gym.config.check_scenario`
        has checked: only the capacity, whose default the section may leave, is checked against
        the block size here; the engine does not check the config again."""
        config = cls(**section)
        check_engine({"kv_capacity_tokens": config.kv_capacity_tokens, "block_size": config.block_size})
        config.__dict__["_checked"] = astuple(config)
        return config

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]



@dataclass(slots=True)
class Counters:
    """Running totals of a run. :meth:`snapshot` copies them; the env's reward is the difference
    of two snapshots (see :mod:`llmsched_gym.env.reward`). The engine exposes each one as a
    read-only attribute too (``engine.total_decoded``)."""

    n_iterations: int = 0
    n_completed: int = 0
    n_rejected: int = 0
    n_preempt_events: int = 0
    n_overflow_events: int = 0
    n_clears: int = 0
    total_decoded: int = 0
    discarded_tokens: int = 0
    recomputed_tokens_total: int = 0
    total_prefill_tokens: int = 0
    kv_time_integral: float = 0.0
    kv_peak_blocks: int = 0
    busy_time: float = 0.0
    last_completion_iter: int = 0

    def snapshot(self) -> Counters:
        return replace(self)


class _DecodeSet:
    """The running requests whose prefill is complete (they decode when nothing is paused), in
    running order, with running totals so that a decode iteration needs no per-element work.

    Members advance in lockstep: ``step`` counts the decode iterations they ran together.
    ``members`` maps each to the step at which it produces its last token, and ``due`` is a
    heap of those (entries of requests that left are skipped when they surface), so completions
    are found without scanning. ``ctx`` is the sum of their KV tokens. In paged mode, a member
    holding ``k`` tokens needs a new block at step ``s`` exactly when ``s = step - k`` (mod
    ``block_size``), so ``cnt[s % block_size]`` is the number of blocks step ``s`` allocates.
    ``fresh`` holds members that have not produced a token yet.
    """

    __slots__ = ("members", "_ids", "due", "ctx", "cnt", "step", "fresh", "last_stamp")

    def __init__(self, block_size: int) -> None:
        self.members: dict[int, int] = {}
        self._ids: np.ndarray | None = None
        self.due: list[tuple[int, int]] = []
        self.ctx = 0
        self.cnt = [0] * block_size if block_size > 1 else None
        self.step = 0
        self.fresh: set[int] = set()
        self.last_stamp = -1

    @classmethod
    def of(cls, engine: Engine, running: np.ndarray) -> _DecodeSet:
        """The decode set of ``running`` (ids in running order), built with a few array operations."""
        ds = cls(engine.kv.block_size)
        ids = running
        if engine.n_in_prefill:
            ids = ids[engine._prefilled[ids] >= engine._prefill_target[ids]]
        if not len(ids):
            return ds
        kv, gen = engine._kv_tokens[ids], engine._generated[ids]
        ids_l, fin_l = ids.tolist(), (engine._output[ids] - gen).tolist()
        ds.members = dict(zip(ids_l, fin_l, strict=True))
        ds.due = list(zip(fin_l, ids_l, strict=True))
        heapq.heapify(ds.due)
        ds._ids = ids
        ds.ctx = int(kv.sum())
        if ds.cnt is not None:
            ds.cnt = np.bincount(-kv % len(ds.cnt), minlength=len(ds.cnt)).tolist()
        fresh = gen == 0
        if fresh.any():
            ds.fresh = set(ids[fresh].tolist())
        ds.last_stamp = int(engine._stamp[ids[-1]])
        return ds

    @property
    def ids(self) -> np.ndarray:
        if self._ids is None:
            self._ids = np.fromiter(self.members, dtype=np.int64, count=len(self.members))
        return self._ids

    def join(self, rid: int, kv: int, left: int, fresh: bool, stamp: int, stamps: np.ndarray) -> None:
        fin = self.step + left
        self.members[rid] = fin
        if stamp < self.last_stamp:  # keep running (admission) order
            self.members = {r: self.members[r] for r in sorted(self.members, key=stamps.__getitem__)}
        else:
            self.last_stamp = stamp
        heapq.heappush(self.due, (fin, rid))
        self._ids = None
        self.ctx += kv
        if self.cnt is not None:
            self.cnt[(self.step - kv) % len(self.cnt)] += 1
        if fresh:
            self.fresh.add(rid)

    def leave(self, rid: int, kv: int) -> None:
        del self.members[rid]
        self._ids = None
        self.ctx -= kv
        if self.cnt is not None:
            self.cnt[(self.step - kv) % len(self.cnt)] -= 1
        self.fresh.discard(rid)

    @property
    def min_left(self) -> int:
        """Decode steps until the first member completes (``1 << 62`` when empty)."""
        due, members = self.due, self.members
        while due and members.get(due[0][1]) != due[0][0]:
            heapq.heappop(due)
        return due[0][0] - self.step if due else 1 << 62

    def finished(self, stamps: np.ndarray) -> list[int]:
        """Members that produced their last token, in running order (they stay members until
        the engine completes them)."""
        out = []
        due, members = self.due, self.members
        while due and due[0][0] <= self.step:
            fin, rid = heapq.heappop(due)
            if members.get(rid) == fin:
                members[rid] = -1  # a stale duplicate entry (left and rejoined) cannot match again
                out.append(rid)
        if len(out) > 1:
            out.sort(key=stamps.__getitem__)
        return out

    def new_blocks(self, k: int) -> int:
        """Blocks the next ``k`` lockstep steps allocate (paged mode)."""
        cnt, bs = self.cnt, len(self.cnt)
        full, part = divmod(k, bs)
        total = full * sum(cnt)
        for s in range(self.step, self.step + part):
            total += cnt[s % bs]
        return total

    def advance(self, k: int) -> None:
        """Every member decoded ``k`` tokens."""
        self.ctx += k * len(self.members)
        self.step += k
        self.fresh.clear()


class _Deferred:
    """A fast-forwarded decode run not yet applied (:meth:`Engine.pending_to`): ``t`` the clock at
    each of its boundaries (``t[0]`` its start), ``used`` the KV blocks in use after each step
    (``used0`` before), the log rows (``rows``, each holding its step's duration; or columns
    ``cols`` with the durations in ``d``); the stepped engine would stand at boundary ``cut``; the
    run ends at boundary ``end``. A run of scalar steps is computed only as far as it is read
    (``more``: what its next steps need; ``None`` once ``end`` is the run's end), so that the steps
    past an arrival that cuts it are never computed; ``acc`` holds the engine's KV time integral,
    busy time and KV peak after its computed steps (summed as it computes them: the engine's
    counters cannot change while a run is pending), so that committing the whole computed run
    needs no second pass over its steps."""

    __slots__ = ("ds", "used0", "t", "d", "used", "rows", "cols", "cut", "end", "more", "acc")

    def __init__(self, ds: _DecodeSet, used0: int, t: list[float], d: list[float] | None, used: list[int],
                 rows: list[tuple] | None, cols: dict[str, Any] | None, more: list | None = None) -> None:
        self.ds, self.used0, self.t, self.d, self.used, self.rows, self.cols = ds, used0, t, d, used, rows, cols
        self.cut = 0
        self.end = len(used)
        self.more = more
        self.acc: tuple[float, float, int] | None = None


class Engine:
    """One worker, iteration by iteration. See the module docstring for the semantics.

    :param workload: the requests (arrival-sorted arrays).
    :param config: engine settings.
    :param latency: the batch-time model.
    :param scheduler: the policy (only its hooks are called by the engine; ``run`` also calls
        ``schedule``).
    :param seed: seeds the engine's own randomness (Bernoulli clearing, batch-time noise) and the
        scheduler's ``rng`` (independent streams).
    :param log_batches: also record each iteration's composition (request ids and token counts),
        for the GPU backend's replay.

    State: per-request arrays indexed by request id (``state``, ``prefilled``,
    ``prefill_target``, ``generated``, ``kv_tokens``, ``swapped`` and the records
    ``first_scheduled_s``, ``first_token_s``, ``completion_s``, ``preemptions``,
    ``recomputed_tokens``, ``cached_tokens``), the ``waiting`` queue and ``running`` list, the
    KV cache ``kv``, and the run's :class:`Counters` in ``counters``.
    """

    # the attributes as slots (others go to ``__dict__``): a cluster's replica is touched once per
    # routing point, out of the CPU caches, and a slot costs one memory line where an entry of a
    # 72-key instance dict costs two
    __slots__ = ("_arrival", "_cached_tokens", "_cap", "_completion_s", "_composition", "_cut", "_ds",
                 "_first_scheduled_s", "_first_token_s", "_generated", "_hook_arrival", "_hook_finish",
                 "_hook_preempt", "_hook_prefill", "_hook_tokens", "_incoming", "_iter_cached", "_kv_tokens",
                 "_max_len", "_n_admitted", "_noise", "_output", "_oversize", "_preemptions", "_prefill_target",
                 "_prefilled", "_prompt", "_prompt_cum", "_recomputed_tokens", "_stamp", "_state", "_swapped",
                 "batches", "cached_tokens", "clock", "completion_s", "config", "counters", "defer_ff", "done",
                 "first_scheduled_s", "first_token_s", "generated", "kv", "kv_tokens", "latency", "ledger", "log",
                 "log_batches", "more_from", "n", "n_in_prefill", "next_idx", "non_terminating", "pending",
                 "preemptions", "prefill_target", "prefilled", "recomputed_tokens", "reject_reason", "rng",
                 "running", "scheduler", "seed", "stall_iterations", "state", "stop_reason", "swapped", "view",
                 "waiting", "waiting_tokens", "workload", "__dict__", "__weakref__")

    def __init__(
        self,
        workload: Workload,
        config: EngineConfig,
        latency: LatencyModel,
        scheduler: Scheduler,
        seed: int = 0,
        log_batches: bool = False,
    ) -> None:
        config.validate()
        self.workload = workload
        self.config = config
        self.latency = latency
        self.scheduler = scheduler
        self.seed = seed
        self.log_batches = log_batches
        n = len(workload)
        self.n = n
        self.kv = KVCache(
            config.kv_capacity_tokens, config.block_size, workload, config.prefix_cache,
            config.prefix_cap_prompt_minus_one,
        )
        self._oversize = self._oversize_requests(workload.prompt_tokens, workload.output_tokens)
        engine_ss, policy_ss = np.random.SeedSequence(seed).spawn(2)
        self.rng = np.random.default_rng(engine_ss)
        self._noise: np.ndarray | None = None
        self.view = EngineView(self)
        scheduler.reset(config, np.random.default_rng(policy_ss))
        self._hook_arrival = scheduler.wants("on_arrival")
        self._hook_tokens = scheduler.wants("on_tokens")
        self._hook_prefill = scheduler.wants("on_prefill")
        self._hook_preempt = scheduler.wants("on_preempt")
        self._hook_finish = scheduler.wants("on_finish")
        self._composition = bool(getattr(latency, "needs_composition", False))
        self._init_requests(workload)
        self.ledger = Ledger.of(self)
        self.counters = Counters()
        self.clock = 0.0
        self.next_idx = 0
        self.waiting = WaitingQueue()
        self.running: list[int] = []
        self.n_in_prefill = 0
        self.waiting_tokens = 0  # prompt tokens the waiting requests still have to prefill
        self._iter_cached = 0  # prefix-cache hit tokens of this iteration's admissions
        self._ds: _DecodeSet | None = None
        self._n_admitted = 0  # admission stamps: running is sorted by them
        self.non_terminating = False
        self.stop_reason = ""
        self.done = False
        self.more_from: float | None = None  # see extend()
        self._incoming: dict[int, tuple] = {}  # see migrate_in()
        self.defer_ff = False  # see pending_to()
        self.pending: _Deferred | None = None
        self._cap = 0  # rows of the buffers once requests come at run time (see _regrow())
        self._cut: dict[str, np.ndarray] = {}  # views cut by _GrowingEngine's properties
        self._max_len = (int(workload.prompt_tokens.max()), int(workload.output_tokens.max())) if n else (0, 0)
        self.stall_iterations = self._stall_limit()
        self.log = IterationLog(self.kv.capacity_tokens)
        self.batches: list[dict] = []

    def _init_requests(self, wl: Workload) -> None:
        n = len(wl)
        self._arrival = wl.arrival_s.tolist()
        self._prompt = wl.prompt_tokens
        self._output = wl.output_tokens
        self._prompt_cum = np.concatenate(([0], np.cumsum(wl.prompt_tokens)))
        for buf, public, fill, dtype in self._GROWN:
            a = wl.prompt_tokens.copy() if fill is None else np.full(n, fill, dtype=dtype)
            setattr(self, buf, a)
            if public is not None:
                setattr(self, public, a)
        self.reject_reason: dict[int, str] = {}

    def _oversize_requests(self, prompt: np.ndarray, output: np.ndarray, first: int = 0) -> frozenset[int]:
        """Requests ``first, first + 1, ...`` (lengths ``prompt`` and ``output``) that cannot fit in
        the KV capacity even alone (more blocks than it has: more tokens than its whole blocks
        hold): they are rejected at arrival (:meth:`_oversize_reason`), so a run with a small
        capacity serves the rest."""
        return frozenset((np.flatnonzero(prompt + output > self.kv.capacity_tokens) + first).tolist())

    def _stall_limit(self) -> int:
        """The loop detector's limit (``config.stall_iterations``; 0: four times the longest
        prompt plus the longest output so far, at least 20,000)."""
        s = self.config.stall_iterations
        return s if s > 0 else max(20_000, 4 * sum(self._max_len))

    def _oversize_reason(self, i: int) -> str:
        bs = self.config.block_size
        need = -(-int(self._prompt[i] + self._output[i]) // bs)
        unit = "tokens" if bs == 1 else f"blocks of {bs}"
        return (f"needs {need} {unit} of KV (prompt {int(self._prompt[i])} + output {int(self._output[i])} tokens), "
                f"more than the capacity of {self.kv.capacity_blocks}")

    @property
    def next_arrival_s(self) -> float:
        if self.next_idx < self.n:
            return self._arrival[self.next_idx]
        return math.inf if self.more_from is None else self.more_from

    # ---- run-time arrivals (the cluster level) ------------------------------------------------
    # (buffer, public name, initial value (None: the prompt's length), dtype): the engine's
    # per-request arrays, read and written by request id through the buffers. The public names are
    # the same arrays, or, once requests come at run time, views of the buffers' first ``n`` rows
    # (see _GrowingEngine).
    _GROWN = (("_state", "state", 0, np.int8), ("_prefilled", "prefilled", 0, np.int64),
              ("_prefill_target", "prefill_target", None, np.int64), ("_generated", "generated", 0, np.int64),
              ("_kv_tokens", "kv_tokens", 0, np.int64), ("_swapped", "swapped", False, bool),
              ("_stamp", None, 0, np.int64), ("_first_scheduled_s", "first_scheduled_s", math.nan, np.float64),
              ("_first_token_s", "first_token_s", math.nan, np.float64),
              ("_completion_s", "completion_s", math.nan, np.float64), ("_preemptions", "preemptions", 0, np.int64),
              ("_recomputed_tokens", "recomputed_tokens", 0, np.int64), ("_cached_tokens", "cached_tokens", 0, np.int64))

    def extend(self, workload: Workload) -> None:
        """Requests placed on this engine at run time (a cluster's router, :mod:`llmsched_gym.core.cluster`).

        ``workload`` is the current workload with rows appended (arrivals not earlier than the
        last one), a new object or the engine's own grown in place; the new requests get the next
        ids. Per-request buffers grow by doubling, so a request costs O(1) amortised; the engine
        becomes a :class:`_GrowingEngine`, whose public per-request arrays are views of the
        buffers cut when next read. While ``more_from`` is a time (not ``None``), more requests
        may still come, none arriving before it: :meth:`poll` then pauses (returns False without
        finishing) when there is nothing to do, and ``next_arrival_s`` is at most ``more_from``.
        An engine given its whole workload this way runs exactly as one constructed with it.

        A workload grown in place may offer ``buffers``: per field, an array whose first ``n``
        rows are the field's and which has rows to spare (a cluster replica's,
        :class:`~llmsched_gym.core.cluster._Rows`; at least ``arrival_s``, ``prompt_tokens`` and
        ``output_tokens`` filled). The engine then reads the new rows there and keeps those
        arrays as its per-request prompt and output lengths (every reader indexes them by request
        id), so adding a request cuts no view of the workload. One request, the usual case at run
        time, is added with scalars: the same values as the many-request path's slices.
        """
        old, n = self.n, len(workload)
        bufs = getattr(workload, "buffers", None)
        arr = workload.arrival_s if bufs is None else bufs["arrival_s"]  # a replica's: read by id, no view cut
        p = self.pending
        if p is not None and n > old:  # the pending run ends at the first boundary at or after the arrival
            a = float(arr[old])
            if p.more is not None:
                if p.t[-1] < a:
                    self._defer_steps(p, a)
                p.more = None
            j = bisect.bisect_left(p.t, a, 1, p.end + 1)
            p.end = min(p.end, max(p.cut, j))
            if p.end == p.cut:  # the stepped engine stands there: apply it before the new rows
                self.commit_pending()
        same = workload is self.workload  # grown in place (a cluster's replica): the view still reads it
        self.workload, self.n = workload, n
        if not same and self.view is not None:
            self.view.rebind()
        if n == old:
            return
        if bufs is None:
            p, o = workload.prompt_tokens, workload.output_tokens
        else:  # grown in place: read by id from its buffers, no views cut (see the docstring)
            p, o = bufs["prompt_tokens"], bufs["output_tokens"]
        regrown = n + 1 > self._cap
        if regrown:
            if old == 0:  # the first requests: arrays of their length, as if constructed with them
                self._init_requests(workload)
            else:
                self._regrow(max(n + 1, 2 * self._cap, 64))
        if p is not self._prompt:
            self._prompt, self._output = p, o
            self.ledger.prompt = p
        self._cut.clear()  # the public views are short now: cut again when next read
        cum, target = self._prompt_cum, self._prefill_target
        if old:  # (the first requests' arrivals: _init_requests read them)
            if n - old == 1:
                self._arrival.append(float(arr[old]))
            else:
                self._arrival.extend(arr[old:n].tolist())
        if n - old <= _FEW:  # a few requests, the usual case at run time: scalars
            fit, (mp, mo), total = self.kv.capacity_tokens, self._max_len, int(cum[old])
            for i in range(old, n):
                pi, oi = int(p[i]), int(o[i])
                target[i] = pi
                total += pi
                cum[i + 1] = total
                if pi + oi > fit:  # more blocks than the capacity
                    self._oversize = self._oversize | {i}
                if pi > mp or oi > mo:
                    mp, mo = max(mp, pi), max(mo, oi)
            if (mp, mo) != self._max_len:
                self._max_len = (mp, mo)
                self.stall_iterations = self._stall_limit()
        else:
            new_p, new_o = p[old:n], o[old:n]
            target[old:n] = new_p
            cum[old + 1:n + 1] = cum[old] + np.cumsum(new_p)
            big = self._oversize_requests(new_p, new_o, old)
            if big:
                self._oversize = self._oversize | big
            self._max_len = (max(self._max_len[0], int(new_p.max())), max(self._max_len[1], int(new_o.max())))
            self.stall_iterations = self._stall_limit()
        self.kv.extend(workload, p, n)
        if regrown:
            self.ledger = Ledger.of(self)  # it holds the buffers

    def receive(self, workload: Workload, generated: int = 1) -> int:
        """Disaggregated serving's hand-off (:mod:`llmsched_gym.core.disagg`): the last row of
        ``workload`` (appended as :meth:`extend` takes rows; its arrival is now) arrives with its
        prompt's KV computed on another replica and ``generated`` output tokens produced there.
        It joins the running set decoding, holding ``prompt + generated`` tokens of KV whose
        blocks the caller reserved in ``kv.used_blocks`` (when the transfer started). Call it at
        an iteration boundary or while paused; an idle engine's clock moves to the arrival. The
        scheduler's ``on_arrival`` is not called (the request never waits). Returns its id."""
        self.clock = max(self.clock, float(workload.arrival_s[-1]))
        self._arrivals()
        self.extend(workload)
        rid = self.n - 1
        self.next_idx = rid + 1
        prompt = int(self._prompt[rid])
        self._state[rid] = RUNNING
        self.running.append(rid)
        self._stamp[rid] = self._n_admitted
        self._n_admitted += 1
        self._prefilled[rid] = prompt
        self._generated[rid] = generated
        self._kv_tokens[rid] = prompt + generated
        self._first_scheduled_s[rid] = self.clock
        self._ds = None
        return rid

    # ---- live migration (the cluster level) -----------------------------------------------------
    _MOVED = ("prefilled", "prefill_target", "generated", "kv_tokens", "first_scheduled_s", "first_token_s",
              "preemptions", "recomputed_tokens", "cached_tokens")

    def migrate_out(self, rid: int) -> tuple:
        """Live migration's source side (:mod:`llmsched_gym.core.cluster`): running request ``rid``,
        decoding (prefill complete, not swapped), leaves this engine now, at an iteration boundary.
        Its KV is freed here (its prefix-cache blocks stay cached), its state becomes ``MIGRATED``
        and the scheduler hears ``on_finish`` (the request is gone from its running set). Returns
        what :meth:`migrate_in` needs on the destination (its progress and records)."""
        moved = tuple(getattr(self, "_" + name)[rid].item() for name in self._MOVED)
        self.running.remove(rid)
        self._free(rid)
        self._kv_tokens[rid] = 0
        self._state[rid] = MIGRATED
        if self.kv.enabled:
            self.kv.forget(rid)
        if self._hook_finish:
            self.scheduler.on_finish(rid, self.view)
        return moved

    def migrate_in(self, rid: int, moved: tuple) -> None:
        """Live migration's destination side: local request ``rid`` (a row already added by
        :meth:`extend`, its arrival the end of the KV transfer) arrives running with the progress
        and records ``moved`` (from :meth:`migrate_out`), holding ``kv_tokens`` of KV whose blocks
        the caller reserved in ``kv.used_blocks`` when the transfer started. It never waits, so the
        scheduler's ``on_arrival`` is not called."""
        if rid < self.next_idx:
            raise ValueError(f"migrate_in({rid}): the request has arrived already")
        self._incoming[rid] = moved

    def _join_migrated(self, rid: int, moved: tuple) -> None:
        for name, value in zip(self._MOVED, moved, strict=True):
            getattr(self, "_" + name)[rid] = value
        self._state[rid] = RUNNING
        self.running.append(rid)
        self._stamp[rid] = self._n_admitted
        self._n_admitted += 1
        self._ds = None

    def _regrow(self, cap: int) -> None:
        """Per-request buffers of ``cap`` rows (doubling, so a request costs O(1) amortised): the
        current rows, then each array's initial value (rows past ``n`` are never written, so a
        request added later needs no fill). The first turns the engine into a
        :class:`_GrowingEngine`."""
        for name, public, fill, _ in self._GROWN:
            setattr(self, name, resized(getattr(self, name), cap, 0 if fill is None else fill))
            if public is not None and type(self) is Engine:
                setattr(self, public, None)  # the property of _GrowingEngine reads the buffer
        if type(self) is Engine:
            self.__class__ = _GrowingEngine
        self._prompt_cum = resized(self._prompt_cum, cap)
        self._cap = cap

    def _noise_slice(self, it: int, k: int) -> np.ndarray:
        need = it + k
        if self._noise is None or len(self._noise) < need:
            size = max(need, 2 * (0 if self._noise is None else len(self._noise)), 1 << 14)
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, 7919]))
            eps = rng.standard_normal(size) * self.config.latency_noise_cv
            self._noise = 1.0 + np.maximum(eps, -0.9)
        return self._noise[it:need]

    # ---- the loop ---------------------------------------------------------------------------
    def poll(self) -> bool:
        """Admit arrivals up to now, skip idle gaps, and tell whether a decision is needed."""
        if self.done:
            return False
        if self.pending is not None:
            self.commit_pending()
        while True:
            self._arrivals()
            if self._should_stop():
                self._finish()
                return False
            if self.waiting or self.running:
                return True
            if self.next_idx >= self.n:
                if self.more_from is not None:  # more requests may be placed here: pause
                    return False
                self.stop_reason = "all requests finished"
                self._finish()
                return False
            t_next = self._arrival[self.next_idx]
            h = self.config.horizon_s
            if h is not None and t_next > h:
                self.clock = h
                self.stop_reason = "horizon"
                self._finish()
                return False
            self.clock = t_next

    def _arrivals(self) -> None:
        i0 = self.next_idx
        j = bisect.bisect_right(self._arrival, self.clock, lo=i0)
        if j == i0:
            return
        if not self._hook_arrival and not self._oversize and not self._incoming:
            self._state[i0:j] = WAITING
            self.waiting.extend(range(i0, j))
            self.waiting_tokens += int(self._prompt_cum[j] - self._prompt_cum[i0])
            self.next_idx = j
            return
        sched, view, hook, oversize = self.scheduler, self.view, self._hook_arrival, self._oversize
        for i in range(i0, j):
            self.next_idx = i + 1
            if i in self._incoming:
                self._join_migrated(i, self._incoming.pop(i))
            elif i not in oversize and (not hook or sched.on_arrival(i, view)):
                self._state[i] = WAITING
                self.waiting.append(i)
                self.waiting_tokens += int(self._prompt[i])
            else:
                self._state[i] = REJECTED
                self.counters.n_rejected += 1
                self.reject_reason[i] = self._oversize_reason(i) if i in oversize else sched.reject_reason(i)

    def _should_stop(self) -> bool:
        cfg, c = self.config, self.counters
        if cfg.horizon_s is not None and self.clock >= cfg.horizon_s:
            self.stop_reason = "horizon"
            return True
        if cfg.max_iterations is not None and c.n_iterations >= cfg.max_iterations:
            self.stop_reason = "max_iterations"
            return True
        if c.n_iterations - c.last_completion_iter >= self.stall_iterations:
            self.non_terminating = True
            self.stop_reason = f"no completion for {self.stall_iterations} iterations (loop detector)"
            return True
        return False

    def _finish(self) -> None:
        self.done = True
        self.log.flush()

    def run(self) -> None:
        """Run to the end with the engine's own scheduler."""
        sched, view = self.scheduler, self.view
        while self.poll():
            self.execute(sched.schedule(view))

    # ---- one iteration ------------------------------------------------------------------------
    def execute(self, plan: BatchPlan) -> None:
        """Run one iteration (or a fast-forwarded decode run) according to ``plan``."""
        swap_s, n_preempted = self._apply_preemptions(plan.preempt)
        if plan.idle:
            self._idle(plan)
            return
        prefill, admitted = self._check_prefill(plan.prefill)
        ds = self._decode_set()
        # requests admitted now prefill first, so the decode set is fixed before admission
        dec = (ds.ids if not plan.pause else self._unpaused(ds, plan.pause)) if plan.decode else _EMPTY
        if admitted:
            s, resumed = self._admit(admitted)
            swap_s += s
            if resumed:  # swapped-in requests resume decoding; their chunk entry is dropped
                prefill, dec = self._resume_swapped(prefill, dec, plan.decode)
        lockstep = dec is ds.ids or not len(dec)
        if (plan.hold and lockstep and len(dec) and not prefill and not n_preempted and not swap_s
                and self.config.fast_forward and not self._composition and self._fast_forward(ds)):
            return
        chunks, grow = self._growth(prefill, ds if lockstep else None, dec)
        clear = False
        if self.kv.used_blocks + grow > self.kv.capacity_blocks:
            chunks, dec, grow, s, n_p, clear = self._overflow(chunks, dec, grow)
            swap_s += s
            n_preempted += n_p
            if lockstep and len(dec):  # the victims left the decode set too
                dec = ds.ids
        if self.kv.enabled:
            self.kv.make_room(grow)
        dec_ctx = ds.ctx if lockstep and len(dec) else (int(self._kv_tokens[dec].sum()) if len(dec) else 0)
        t_start, duration, p_tokens, p_ctx = self._time(chunks, dec, dec_ctx, swap_s)
        finished = self._progress(chunks, dec, ds if lockstep else None, grow, t_start + duration)
        self._account(t_start, duration, p_tokens, p_ctx + dec_ctx, len(dec), n_preempted)
        if finished:
            self._complete(finished, self.clock)
        if clear and self.kv.used_blocks > self.kv.capacity_blocks:
            self._clear(self.config.overflow)

    def _apply_preemptions(self, preempt: list[int]) -> tuple[float, int]:
        """Step 1: the plan's preemptions (validated first); returns swap-out seconds and count."""
        if not preempt:
            return 0.0, 0
        for rid in preempt:
            if self._state[rid] != RUNNING:
                raise PlanError(f"preempt: request {rid} is not running")
        swap_s = 0.0
        for rid in preempt:
            swap_s += self._preempt(rid, self.config.preempt_mode, requeue=True)
        return swap_s, len(preempt)

    def _idle(self, plan: BatchPlan) -> None:
        if plan.prefill:
            raise PlanError("idle: a plan cannot both idle and prefill")
        t_next = self.next_arrival_s
        if t_next == math.inf:
            raise PlanError("idle: no future arrival to wait for (the run would stall)")
        self.clock = max(self.clock, t_next)

    def _check_prefill(self, plan_prefill: dict[int, int]) -> tuple[list[tuple[int, int]], list[int]]:
        """Step 2: the prefill set (waiting requests to admit, unfinished prefills to continue)."""
        prefill: list[tuple[int, int]] = []
        admitted: list[int] = []
        state, prefilled, target, n = self._state, self._prefilled, self._prefill_target, self.n
        for rid, chunk in plan_prefill.items():
            st = state[rid] if 0 <= rid < n else -1
            if st == WAITING:
                admitted.append(rid)
            elif st != RUNNING or prefilled[rid] >= target[rid]:
                raise PlanError(f"prefill: request {rid} is neither waiting nor in an unfinished prefill")
            if chunk < 0:
                raise PlanError(f"prefill: request {rid} has a negative chunk {chunk}")
            prefill.append((rid, int(chunk)))
        return prefill, admitted

    def decode_blocks(self) -> int:
        """KV blocks one decode step of every running request allocates (``ledger.decodes(running)``),
        read in O(1) from the decode set's lockstep counts when it is current and holds every
        running request (none in prefill), instead of from every request's KV."""
        ds = self._ds
        if ds is not None and len(ds.members) == len(self.running):
            return len(ds.members) if ds.cnt is None else ds.new_blocks(1)
        return self.ledger.decodes(self.running)

    def _decode_set(self) -> _DecodeSet:
        ds = self._ds
        if ds is None:
            ds = self._ds = _DecodeSet.of(self, np.array(self.running, dtype=np.int64))
        return ds

    def _unpaused(self, ds: _DecodeSet, pause) -> np.ndarray:
        return np.array([r for r in ds.members if r not in pause], dtype=np.int64)

    def _resume_swapped(self, prefill, dec, decode: bool):
        pre, tgt = self._prefilled, self._prefill_target
        resumed = [r for r, _ in prefill if pre[r] >= tgt[r]]
        prefill = [(r, c) for r, c in prefill if pre[r] < tgt[r]]
        if decode and resumed:
            dec = np.concatenate([dec, np.array(resumed, dtype=np.int64)])
        return prefill, dec

    def _growth(self, prefill, ds: _DecodeSet | None, dec: np.ndarray) -> tuple[list[tuple[int, int, bool]], int]:
        """Step 3: the chunks ``(rid, tokens, last)`` and the blocks this iteration allocates."""
        if ds is not None:
            return self.ledger.iteration(prefill, dec, ds.cnt, ds.step)
        return self.ledger.iteration(prefill, dec)

    def _overflow(self, chunks, dec, grow: int):
        """Step 4: the iteration does not fit; the configured handler decides. The last value
        says whether to clear after the iteration (``clear_all``, ``clear_bernoulli``)."""
        mode = self.config.overflow
        if mode == "forbid":
            raise PlanError(self.ledger.refusal(chunks, dec, grow))
        if mode in ("preempt_lifo_recompute", "swap"):
            return (*self._make_room(chunks, dec, mode), False)
        self.counters.n_overflow_events += 1
        return chunks, dec, grow, 0.0, 0, True

    def _time(self, chunks, dec: np.ndarray, dec_ctx: int, swap_s: float) -> tuple[float, float, int, int]:
        """Step 5: the batch time; the clock advances. Returns start, duration, prefill tokens
        and prefill context."""
        p_tokens = p_ctx = 0
        pre = self._prefilled
        for rid, c, _ in chunks:
            p_tokens += c
            p_ctx += int(pre[rid]) + c
        kvt = self._kv_tokens
        if self._composition:
            comp_p = [(rid, c, int(pre[rid])) for rid, c, _ in chunks]
            comp_d = list(zip(dec.tolist(), kvt[dec].tolist(), strict=True))
            duration = self.latency.time_batch(comp_p, comp_d)  # type: ignore[attr-defined]
        else:
            duration = self.latency.batch_time(p_tokens, p_ctx, len(chunks), len(dec), dec_ctx)
        if self.config.latency_noise_cv > 0:
            duration *= float(self._noise_slice(self.counters.n_iterations, 1)[0])
        duration += swap_s
        if self.log_batches:
            self.batches.append({
                "prefill": [[rid, c, int(pre[rid])] for rid, c, _ in chunks],
                "decode": [[int(r), int(kvt[r])] for r in dec],
            })
        t_start = self.clock
        self.clock = t_start + duration
        self.counters.busy_time += duration
        return t_start, duration, p_tokens, p_ctx

    def _progress(self, chunks, dec: np.ndarray, ds: _DecodeSet | None, grow: int, t_end: float) -> list[int]:
        """Step 6: chunks and decodes progress; returns the requests that completed."""
        kv, kvt, pre, gen, out = self.kv, self._kv_tokens, self._prefilled, self._generated, self._output
        emits, counters = self.config.prefill_emits_token, self.counters
        kv.used_blocks += grow
        finished: list[int] = []
        joined: list[int] = []
        for rid, c, last in chunks:
            pre[rid] += c
            kvt[rid] += c
            counters.total_prefill_tokens += c
            if self._hook_prefill:
                self.scheduler.on_prefill(rid, c, self.view)
            if last:
                self.n_in_prefill -= 1
                if kv.enabled:
                    kv.publish_prefix(rid, int(pre[rid]))
                if emits:
                    kvt[rid] += 1
                    self._emit_one(rid, t_end)
                (finished if gen[rid] >= out[rid] else joined).append(rid)
        if len(dec):
            kvt[dec] += 1
            if ds is not None:
                finished += self._decode_lockstep(ds, t_end)
            else:
                self._emit(dec, t_end)
                done = gen[dec] >= out[dec]
                if done.any():
                    finished += dec[done].tolist()
                self._ds = None  # some decoders skipped the iteration
        if joined and self._ds is not None:
            ds, stamp = self._ds, self._stamp
            for rid in joined:
                g = int(gen[rid])
                ds.join(rid, int(kvt[rid]), int(out[rid]) - g, g == 0, int(stamp[rid]), stamp)
        return finished

    def _decode_lockstep(self, ds: _DecodeSet, t_end: float) -> list[int]:
        """Every member of the decode set produced a token (KV already grown)."""
        ids = ds.ids
        if ds.fresh:
            ft = self._first_token_s
            for rid in ds.fresh:
                if math.isnan(ft[rid]):
                    ft[rid] = t_end
        self._generated[ids] += 1
        self.counters.total_decoded += len(ids)
        ds.advance(1)
        if self._hook_tokens:
            self.scheduler.on_tokens(ids, 1, self.view)
        return ds.finished(self._stamp)

    def _account(self, t_start: float, duration: float, p_tokens: int, ctx: int, n_dec: int,
                 n_preempted: int) -> None:
        """Step 7: KV statistics and the iteration log."""
        c, used = self.counters, self.kv.used_blocks
        if used > c.kv_peak_blocks:
            c.kv_peak_blocks = used
        c.kv_time_integral += used * duration
        cached, self._iter_cached = self._iter_cached, 0
        self.log.add((t_start, duration, p_tokens, cached, n_dec, ctx, used * self.kv.block_size,
                      len(self.waiting), len(self.running), n_preempted))
        c.n_iterations += 1

    # ---- request transitions ------------------------------------------------------------------
    def _admit(self, ids: list[int]) -> tuple[float, bool]:
        """Move ``ids`` from the queue to the running set; returns swap-in seconds and whether a
        swapped-in request resumes decoding (then the decode set is rebuilt; a swap-in can cost
        0 s, so the seconds do not tell)."""
        kv, now, waiting, running = self.kv, self.clock, self.waiting, self.running
        pre, tgt, kvt = self._prefilled, self._prefill_target, self._kv_tokens
        state, stamps, first, swapped = self._state, self._stamp, self._first_scheduled_s, self._swapped
        swap_s, resumed = 0.0, False
        for rid in ids:
            waiting.remove(rid)
            state[rid] = RUNNING
            running.append(rid)
            stamps[rid] = self._n_admitted
            self._n_admitted += 1
            self.waiting_tokens -= int(tgt[rid] - pre[rid])
            if math.isnan(first[rid]):
                first[rid] = now
            if swapped[rid]:
                swapped[rid] = False
                blocks = kv.blocks(int(kvt[rid]))
                if kv.enabled:
                    kv.make_room(blocks)
                kv.used_blocks += blocks
                swap_s += self._swap_seconds(int(kvt[rid]))
                if pre[rid] < tgt[rid]:  # swapped out mid-prefill: its prefill goes on
                    self.n_in_prefill += 1
                else:  # it resumes decoding
                    self._ds = None
                    resumed = True
                continue
            self.n_in_prefill += 1
            if kv.enabled:
                hit = kv.acquire_prefix(rid)
                if hit:
                    pre[rid] = hit
                    kvt[rid] = hit
                    self._cached_tokens[rid] += hit
                    self._iter_cached += hit
                    if hit >= tgt[rid]:
                        self._ds = None
        return swap_s, resumed

    def _swap_seconds(self, tokens: int) -> float:
        return tokens * self.config.kv_bytes_per_token / (self.config.swap_gb_s * 1e9)

    def _free(self, rid: int) -> int:
        """Release ``rid``'s KV and, if it was decoding, take it out of the decode set; returns
        the KV tokens it held."""
        kv, k, ds = self.kv, int(self._kv_tokens[rid]), self._ds
        if ds is not None and rid in ds.members:
            ds.leave(rid, k)
        kv.used_blocks -= kv.blocks(k) - int(kv.shared[rid])  # its blocks, less shared ones
        if kv.enabled:
            kv.release_prefix(rid)
        if self._composition:
            self.latency.release(rid)  # type: ignore[attr-defined]
        return k

    def _preempt(self, rid: int, mode: str, requeue: bool = False) -> float:
        """Evict a running request back to the queue (its head with ``requeue``, else the caller
        requeues it, after the policy's ``on_preempt`` hook); returns swap-out seconds."""
        run = self.running
        if run and run[-1] == rid:
            run.pop()
        else:
            run.remove(rid)
        pre, tgt = int(self._prefilled[rid]), int(self._prefill_target[rid])
        if pre < tgt:
            self.n_in_prefill -= 1
        self._preemptions[rid] += 1
        c = self.counters
        c.n_preempt_events += 1
        swap_s = 0.0
        k = self._free(rid)
        if mode == "swap":
            swap_s = self._swap_seconds(k)
            self._swapped[rid] = True
        else:
            self._recomputed_tokens[rid] += k
            c.recomputed_tokens_total += k
            gen = int(self._generated[rid])
            if mode == "restart":
                c.discarded_tokens += gen
                self._generated[rid] = 0
                gen = 0
            tgt = int(self._prompt[rid]) + gen
            pre = 0
            self._prefill_target[rid] = tgt
            self._prefilled[rid] = 0
            self._kv_tokens[rid] = 0
        self._state[rid] = WAITING
        self.waiting_tokens += tgt - pre
        if requeue:
            self.waiting.push_front([rid])
        if self._hook_preempt:
            self.scheduler.on_preempt(rid, self.view)
        return swap_s

    def _make_room(self, chunks, dec, mode):
        """vLLM: preempt the newest running requests until the iteration fits (the ledger picks them)."""
        victims, n_dec_gone, total = self.ledger.victims(chunks, dec, self.running)
        preempt_mode = "swap" if mode == "swap" else self.config.preempt_mode
        swap_s = 0.0
        for victim in victims:
            swap_s += self._preempt(victim, preempt_mode)
        if victims:
            gone = set(victims)
            self.waiting.push_front(victims[::-1])
            chunks = [x for x in chunks if x[0] not in gone]
            if n_dec_gone:
                dec = dec[: len(dec) - n_dec_gone]
        return chunks, dec, total, swap_s, len(victims)

    def _clear(self, mode: str) -> None:
        """Jaillet et al. 2025's clearing: running requests go back to the queue, progress lost."""
        if mode == "clear_all":
            victims = list(self.running)
        else:
            draws = self.rng.random(len(self.running))
            victims = [r for r, u in zip(self.running, draws, strict=True) if u < self.config.overflow_beta]
        self.counters.n_clears += 1
        for rid in reversed(victims):
            self._preempt(rid, "restart")
        # cleared requests re-enter at the head, in arrival order
        self.waiting.push_front(sorted(victims))

    def _emit_one(self, rid: int, t: float) -> None:
        """The final prefill chunk of ``rid`` produced its first output token."""
        if self._generated[rid] == 0 and math.isnan(self._first_token_s[rid]):
            self._first_token_s[rid] = t
        self._generated[rid] += 1
        self.counters.total_decoded += 1
        if self._hook_tokens:
            self.scheduler.on_tokens(np.array([rid]), 1, self.view)

    def _emit(self, ids: np.ndarray, t: float) -> None:
        gen = self._generated
        first = ids[gen[ids] == 0]
        if len(first):
            ft = self._first_token_s[first]
            self._first_token_s[first] = np.where(np.isnan(ft), t, ft)
        gen[ids] += 1
        self.counters.total_decoded += len(ids)
        if self._hook_tokens:
            self.scheduler.on_tokens(ids, 1, self.view)

    def _complete(self, ids: list[int], t: float) -> None:
        state, completion, kvt = self._state, self._completion_s, self._kv_tokens
        for rid in ids:
            state[rid] = DONE
            completion[rid] = t
            self._free(rid)
            kvt[rid] = 0
        if len(ids) <= 4:  # a few: C-level removals beat rebuilding the list
            run = self.running
            for rid in ids:
                run.remove(rid)
        else:
            done = set(ids)
            self.running = [r for r in self.running if r not in done]
        c = self.counters
        c.n_completed += len(ids)
        c.last_completion_iter = c.n_iterations
        if self._hook_finish:
            for rid in ids:
                self.scheduler.on_finish(rid, self.view)
        if self.kv.enabled:  # their block-hash lists are not needed any more (memory)
            forget = self.kv.forget
            for rid in ids:
                forget(rid)

    # ---- fast-forward -------------------------------------------------------------------------
    def _fast_forward(self, ds: _DecodeSet) -> bool:
        """Run ``k >= 2`` identical decode iterations at once; False if fewer than 2 are safe.

        The run ends with the first completion, before the KV would overflow, and at the first
        boundary at or after the next arrival or the horizon. Scalars decide first (the decode set's running totals and one batch time);
        short runs are then computed step by step with scalars, long ones as arrays."""
        k = self._ff_bound(ds)
        if k < 2:
            return False
        defer = self.defer_ff and self.more_from is not None
        limit = self._ff_limit(defer)
        d0 = self.latency.batch_time(0, 0, 0, len(ds.members), ds.ctx)
        if self.config.latency_noise_cv > 0:
            d0 *= float(self._noise_slice(self.counters.n_iterations, 1)[0])
        if self.clock + d0 >= limit:
            return False
        if k > 64 and limit - self.clock > 64 * d0:
            return self._ff_arrays(ds, k, limit, defer)
        return self._ff_scalars(ds, k, limit, defer)

    def _ff_limit(self, defer: bool = False) -> float:
        """The next arrival or the horizon; with ``defer``, the next arrival of the requests placed
        here so far (``more_from`` is where the cluster's routing point is, not an arrival)."""
        t = self.next_arrival_s if not defer else self._arrival[self.next_idx] if self.next_idx < self.n else math.inf
        h = self.config.horizon_s
        return t if h is None else min(t, h)

    def _ff_bound(self, ds: _DecodeSet) -> int:
        """Decode steps safe by scalars alone: up to the first completion (included), the
        iteration and stall limits and, in token mode, the free KV (0 when fewer than 2)."""
        c, cfg, kv = self.counters, self.config, self.kv
        k = min(ds.min_left, self.stall_iterations - (c.n_iterations - c.last_completion_iter))
        if cfg.max_iterations is not None:
            k = min(k, cfg.max_iterations - c.n_iterations)
        if k < 2:
            return 0
        free = kv.capacity_blocks - kv.used_blocks
        if kv.block_size == 1:
            k = min(k, free // len(ds.members))
        elif ds.new_blocks(2) > free:
            return 0
        return k if k >= 2 else 0

    def _ff_scalars(self, ds: _DecodeSet, k: int, limit: float, defer: bool = False) -> bool:
        """Up to ``k`` steps, each computed as the step-by-step path computes it (kept in
        :attr:`pending` with ``defer``)."""
        kv, c = self.kv, self.counters
        bs, cap, used, b = kv.block_size, kv.capacity_blocks, kv.used_blocks, len(ds.members)
        noise = self._noise_slice(c.n_iterations, k).tolist() if self.config.latency_noise_cv > 0 else None
        if defer:
            return self._defer_scalars(ds, k, limit, noise)
        batch_time = self.latency.batch_time
        cnt, step, ctx, t = ds.cnt, ds.step, ds.ctx, self.clock
        nw, nr = len(self.waiting), len(self.running)
        rows = []
        kti, busy, peak = c.kv_time_integral, c.busy_time, c.kv_peak_blocks
        for j in range(k):
            g = b if cnt is None else cnt[(step + j) % bs]
            if used + g > cap:
                break
            used += g
            d = batch_time(0, 0, 0, b, ctx)
            if noise is not None:
                d *= noise[j]
            rows.append((t, d, 0, 0, b, ctx, used * bs, nw, nr, 0))
            t = t + d
            kti += used * d
            busy += d
            if used > peak:
                peak = used
            ctx += b
            if t >= limit:
                break
        n = len(rows)
        if n < 2:
            return False
        if kv.enabled:
            kv.make_room(used - kv.used_blocks)
        kv.used_blocks = used
        c.kv_time_integral, c.busy_time, c.kv_peak_blocks = kti, busy, peak
        self.log.add_rows(rows)
        self._ff_commit(ds, n, t, rows[1][0])
        return True

    def _defer_scalars(self, ds: _DecodeSet, k: int, limit: float, noise: list[float] | None) -> bool:
        """:meth:`_ff_scalars` with ``defer``: the run's steps up to the routing point (at least 2)
        are computed now, the rest when read (:meth:`_defer_steps`); a run that ends before the
        routing point is applied at once, as a stepped engine runs it."""
        kv, c = self.kv, self.counters
        p = _Deferred(ds, kv.used_blocks, [self.clock], None, [], [], None,
                      [0, k, limit, noise, ds.ctx, self.clock, kv.used_blocks, len(self.waiting), len(self.running),
                       c.kv_time_integral, c.busy_time, c.kv_peak_blocks])
        self._defer_steps(p, self.more_from)
        if p.end < 2:
            return False
        if p.t[-1] >= self.more_from:  # it crosses the routing point (else it is what a stepped run does)
            self.pending = p
            return True
        p.more = None
        self.pending = p
        self.commit_pending()
        return True

    def _defer_steps(self, p: _Deferred, until: float) -> None:
        """Compute the pending run's next steps, as :meth:`_ff_scalars` does, until its clock reaches
        ``until`` (and it has at least 2 steps) or the run ends (``p.more`` is then ``None``)."""
        more = p.more
        j, k, limit, noise, ctx, t, used, nw, nr, kti, busy, peak = more
        kv, ds = self.kv, p.ds
        bs, cap, b, cnt, step = kv.block_size, kv.capacity_blocks, len(ds.members), ds.cnt, ds.step
        batch_time = self.latency.batch_time
        ts, us, rows = p.t, p.used, p.rows
        add_t, add_u, add_row = ts.append, us.append, rows.append
        ended = True
        while j < k:
            g = b if cnt is None else cnt[(step + j) % bs]
            if used + g > cap:
                break
            used += g
            d = batch_time(0, 0, 0, b, ctx)
            if noise is not None:
                d *= noise[j]
            add_row((t, d, 0, 0, b, ctx, used * bs, nw, nr, 0))
            t = t + d
            add_t(t)
            add_u(used)
            kti += used * d  # the engine's sums, in the order _ff_scalars adds them
            busy += d
            if used > peak:
                peak = used
            ctx += b
            j += 1
            if t >= limit:
                break
            if t >= until and j >= 2:
                ended = j == k
                break
        p.end = j
        p.acc = (kti, busy, peak)
        if ended:
            p.more = None
        else:
            more[0], more[4], more[5], more[6], more[9], more[10], more[11] = j, ctx, t, used, kti, busy, peak

    def _ff_arrays(self, ds: _DecodeSet, k: int, limit: float, defer: bool = False) -> bool:
        """Up to ``k`` steps as array operations (long runs; kept in :attr:`pending` with ``defer``)."""
        kv, cfg, c = self.kv, self.config, self.counters
        b, bs = len(ds.members), kv.block_size
        steps = np.arange(k, dtype=np.int64)
        ctx = ds.ctx + steps * b
        d = self.latency.decode_times(b, ctx)
        if cfg.latency_noise_cv > 0:
            d = d * self._noise_slice(c.n_iterations, k)
        if bs == 1:
            grow = (steps + 1) * b
        else:
            grow = np.cumsum(np.asarray(ds.cnt, dtype=np.int64)[(ds.step + steps) % bs])
            fits = kv.used_blocks + grow <= kv.capacity_blocks
            if not fits.all():
                k = int(np.argmin(fits))
        clocks = np.cumsum(np.concatenate(([self.clock], d[:k])))
        if limit < math.inf:  # stop at the first boundary at or after the next arrival / horizon
            k = min(k, int(np.searchsorted(clocks[1:], limit, side="left")) + 1)
        if k < 2:
            return False
        d, used_after = d[:k], kv.used_blocks + grow[:k]
        if defer and clocks[k] >= self.more_from:
            cols = {"t_start": clocks[:k], "duration": d, "n_prefill_tokens": 0, "n_cached_prefix_tokens": 0,
                    "n_decode": b, "sum_context_tokens": ctx[:k], "kv_used": used_after * bs,
                    "n_waiting": len(self.waiting), "n_running": len(self.running), "n_preempted": 0}
            self.pending = _Deferred(ds, kv.used_blocks, clocks[:k + 1].tolist(), d.tolist(), used_after.tolist(),
                                     None, cols)
            return True
        if kv.enabled:
            kv.make_room(int(grow[k - 1]))
        kv.used_blocks = int(used_after[-1])
        c.kv_peak_blocks = max(c.kv_peak_blocks, int(used_after.max()))
        # sequential sums, bit for bit the step-by-step ones
        kti, busy = c.kv_time_integral, c.busy_time
        for u, x in zip(used_after.tolist(), d.tolist(), strict=True):
            kti += u * x
            busy += x
        c.kv_time_integral, c.busy_time = kti, busy
        self.log.add_segment({
            "t_start": clocks[:k], "duration": d, "n_prefill_tokens": 0, "n_cached_prefix_tokens": 0,
            "n_decode": b, "sum_context_tokens": ctx[:k], "kv_used": used_after * bs,
            "n_waiting": len(self.waiting), "n_running": len(self.running), "n_preempted": 0,
        })
        self._ff_commit(ds, k, float(clocks[k]), float(clocks[1]))
        return True

    # ---- deferred fast-forward (the cluster level) ---------------------------------------------
    # A cluster stops every replica at each routing point to read its load signals. With
    # ``defer_ff`` (set by the cluster while ``more_from`` is a time) a fast-forwarded decode run is
    # computed up to its own end (the first completion, memory or stall limit, the next arrival
    # placed here, the horizon) and kept in ``pending`` instead of being cut at the routing point:
    # ``pending_to`` then moves a cut through it where the step-by-step cluster would have stopped
    # (O(log k), the engine state untouched) and tells the signals the stopped engine would show;
    # the run's rows are committed when the engine must act (the run ends before the routing point,
    # or a placed request arrives). A run committed at once equals the same run committed in pieces
    # bit for bit (the fast-forward is exact at any split), so results are those of the stepped run.
    def pending_to(self, limit: float) -> tuple[int, int, int, int] | None:
        """Bring the pending run to the routing point ``limit``: as the stepped engine, which runs
        to its first iteration boundary at or after ``limit``. Returns the load signals ``(waiting,
        running, kv used tokens, waiting tokens)`` the stepped engine shows there (the state at the
        start of its last iteration, a fast-forwarded piece counting as one, or its state when it
        stopped exactly at ``limit``), or ``None`` when the run ends before ``limit``: it is then
        committed, and the engine goes on as usual from its end."""
        p = self.pending
        if p.more is not None and p.t[-1] < limit:
            self._defer_steps(p, limit)
        t, i = p.t, p.cut
        if t[p.end] < limit:
            self.commit_pending()
            return None
        kv = self.kv
        sig = (len(self.waiting), len(self.running), (p.used[i - 1] if i else p.used0) * kv.block_size,
               self.waiting_tokens)
        if t[i] < limit:
            j = bisect.bisect_left(t, limit, i + 1, p.end + 1)
            if (j == p.end and p.more is None) or t[j] == limit:  # the stepped engine has ended the run,
                p.end = j                                            # or stopped on the point
                p.more = None
                self.commit_pending()
                if t[j] == limit:
                    return len(self.waiting), len(self.running), kv.used_tokens, self.waiting_tokens
                return sig
            p.cut = j
            if kv.enabled:  # the prefix cache evicts as the stepped engine did up to the cut
                kv.make_room(p.used[j - 1] - kv.used_blocks)
        return sig

    def commit_pending(self) -> None:
        """Apply the pending run's steps (up to its end) to the engine, as the fast-forward does."""
        p = self.pending
        if p.more is not None:  # the engine goes on from the run's end, as the whole run is applied
            self._defer_steps(p, math.inf)
        self.pending = None
        m, kv, c, rows = p.end, self.kv, self.counters, p.rows
        last = p.used[m - 1]
        if rows is not None and m == len(rows):  # every computed step: their sums are kept
            c.kv_time_integral, c.busy_time, peak = p.acc
            self.log.add_rows(rows)
        else:
            kti, busy = c.kv_time_integral, c.busy_time
            used = p.used[:m]
            d = p.d[:m] if rows is None else [r[1] for r in rows[:m]]
            for u, x in zip(used, d, strict=True):  # sequential sums, bit for bit the step-by-step ones
                kti += u * x
                busy += x
            c.kv_time_integral, c.busy_time = kti, busy
            peak = max(used)
            if rows is not None:
                self.log.add_rows(rows[:m])
            else:
                self.log.add_segment({k: v[:m] if isinstance(v, np.ndarray) else v for k, v in p.cols.items()})
        if peak > c.kv_peak_blocks:
            c.kv_peak_blocks = peak
        if kv.enabled:
            kv.make_room(last - kv.used_blocks)
        kv.used_blocks = last
        self._ff_commit(p.ds, m, p.t[m], p.t[1])

    def _ff_commit(self, ds: _DecodeSet, k: int, t_end: float, t_first: float) -> None:
        """The decode set produced ``k`` tokens each, the first at ``t_first``; the clock is ``t_end``."""
        c, dec, b = self.counters, ds.ids, len(ds.members)
        if ds.fresh:
            ft = self._first_token_s
            for rid in ds.fresh:
                if math.isnan(ft[rid]):
                    ft[rid] = t_first
        self._generated[dec] += k
        self._kv_tokens[dec] += k
        c.total_decoded += b * k
        self.clock = t_end
        if self.log_batches:
            k0 = (self._kv_tokens[dec] - k).tolist()
            ids = dec.tolist()
            for s in range(k):
                self.batches.append({"prefill": [], "decode": [[r, x + s] for r, x in zip(ids, k0, strict=True)]})
        c.n_iterations += k
        ds.advance(k)
        if self._hook_tokens:
            self.scheduler.on_tokens(dec, k, self.view)
        finished = ds.finished(self._stamp)
        if finished:
            self._complete(finished, t_end)

    # ---- results --------------------------------------------------------------------------
    def iteration_log(self) -> dict[str, np.ndarray]:
        """The iteration log (one row per engine iteration) as columns."""
        return self.log.columns()

    def close(self) -> None:
        """Detach the view: it references the engine, a cycle that only Python's cyclic garbage
        collector frees, late, holding a whole episode's memory. The engine can no longer run
        (its records, arrays and log stay readable)."""
        self.view = None  # type: ignore[assignment]
        self.done = True

    def snapshot(self) -> dict[str, Any]:
        """Small state summary (for debugging and the env's info)."""
        return {
            "clock": self.clock, "iteration": self.n_iterations, "waiting": len(self.waiting),
            "running": len(self.running), "kv_used": self.kv.used_tokens, "kv_capacity": self.kv.capacity_tokens,
        }


class _GrowingEngine(Engine):
    """An engine that was given requests at run time (:meth:`Engine.extend`): its per-request
    arrays are buffers with rows to spare, and each public array (``state``, ``prefilled``, ...,
    ``cached_tokens``) is a view of its buffer's first ``n`` rows, cut when first read after
    requests were added. The engine itself reads and writes the buffers by request id, so a
    request routed to it re-slices only the arrays read since the previous one (a cluster adds
    them one or a few at a time). :meth:`Engine._regrow` turns an engine into this class."""

    __slots__ = ()  # the layout of Engine (an engine changes class)

    def __getstate__(self) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        d, slots = super().__getstate__()  # (__dict__, slots)
        slots = {k: v for k, v in slots.items() if k not in _VIEWS}  # the properties read the buffers
        slots["_cut"] = {}  # a pickled view would not share its buffer's memory any more
        return d, slots


def _view_property(public: str, buf: str) -> property:
    def get(self: Engine) -> np.ndarray:
        v = self._cut.get(public)
        if v is None:
            v = self._cut[public] = getattr(self, buf)[:self.n]
        return v
    return property(get, doc=f"Per request: a view of the first ``n`` rows of ``{buf}``.")


for _buf, _public, _, _ in Engine._GROWN:
    if _public is not None:
        setattr(_GrowingEngine, _public, _view_property(_public, _buf))
_VIEWS = frozenset(public for _, public, _, _ in Engine._GROWN if public is not None)

_EMPTY = np.empty(0, dtype=np.int64)


def _counter_property(name: str) -> property:
    return property(lambda self: getattr(self.counters, name), doc=f"``counters.{name}`` (read-only).")


for _f in fields(Counters):
    setattr(Engine, _f.name, _counter_property(_f.name))
