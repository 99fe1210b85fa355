"""Echo and its cumulative baselines (Wang et al. 2025, "Echo: Efficient Co-Scheduling of
Hybrid Online-Offline Tasks for Large Language Model Serving", arXiv 2504.03651).

Online requests (``task_class`` 0, TTFT/TPOT SLOs) share one GPU with an offline pool (class 1).
Every policy keeps the previous batch, admits online requests FCFS (preempting offline work, in
recompute mode, when memory is short) and then adds offline work. The four names are the paper's
cumulative build-up (section 7.1):

* ``echo-bs``: vLLM priority scheduling. Offline requests in submission order while memory and
  the step budgets allow; no time check; LRU prefix cache.
* ``echo-bs-e``: + the estimator. Offline work may not make the estimated iteration time exceed
  the batch SLO ``min_r (TTFT + i TPOT - waited_r)`` over online members (section 5.1); the
  inherited batch is repaired by preempting the newest offline request first.
* ``echo-bs-e-s``: + Echo's KV-cache-aware scheduler (section 4.1): greedy
  moves (add a candidate or preempt an offline member) that raise ``(Benefit - Punishment) /
  Time`` (Eq. 4), candidates from length buckets of radix trees over prompt prefixes (section 6).
* ``echo``: + the task-aware KV manager (section 4.2): idle cached blocks are evicted by priority
  (active offline = its reference count rc > finished online 0.5 > finished offline 0; running
  blocks are never idle, i.e. infinite; LRU among equals), and offline admissions keep the active
  KV under ``N_KV - max(0, mu + 2 sigma - U_on)`` from the online-memory predictor (section 5.3).

Departures and readings (ours where the paper is silent):

* The SLO gate applies to offline work only: online requests are admitted FCFS whenever memory
  allows (the paper's "online requests are always scheduled FCFS"); gating them on time as well
  could stall a late request forever (a literal reading of section 4.1 would stop the loop there).
* Benefit counts 1 per token, prefix-cache hits included (the scores only; reported throughput
  never counts hits). Punishment is the recompute cost Eq. 2 measures: the tokens a preempted
  request loses (its KV minus the shared head blocks the cache keeps) plus the needed blocks
  (rc > 0) that an admission would evict (the first ones in LRU order, or past the rc = 0 blocks
  under the task-aware order). The engine caches only shared prompt heads, so a victim's own
  tokens are always lost.
* At most ``max_prefills`` prefills per batch (default 1 for the Echo scheduler, section 5.2's
  "one by one"; online admissions are not limited by it). Prefill chunking (``chunk_size``) is
  off by default (the paper does not say whether it was on).
* ``deadline="paper"`` is the paper's per-token deadline ``arrival + TTFT + i TPOT`` (token index
  from 0); ``"separate"`` uses ``first token + i TPOT`` after the first token, which is what the
  summary's "mean TPOT <= SLO" attainment measures.
* Removing offline work from the batch for time defers an unfinished prefill chunk (keeping its
  KV) before preempting a decode; the paper only preempts.
* Greedy moves: preemption moves are tried only before the first addition of an iteration. With
  Eq. 7's ``gamma max(L)`` term, "admit a cheap cached prefill, then preempt the longest running
  request" raises Eq. 4 every iteration and the batch never grows (measured: ~1 preemption per
  iteration); preemptions for online memory and SLOs are unaffected.
* Candidates (section 6): length buckets of ``2^k * bucket_base`` tokens, each a radix tree over
  the prompt-prefix segments, realised as FIFO groups per segment chain visited in key order
  (the tree's DFS); the first ``candidates`` requests are taken from the groups with the longest
  cached prefix first.
* If neither the threshold nor the scores let any work run, one offline request runs anyway
  (the paper's reserve is meant for online bursts, not to idle the GPU).
* The predictor samples the online KV demand (running online KV + waiting online prompts) every
  iteration, averages it per second and keeps ``window_s`` seconds (the paper: one hour of a real
  day; scale it down with time-compressed scenarios).
* Switching policies (the env's ``meta`` mode): the queues drop what another policy admitted
  (``_sync``); running requests are read from the engine at every decision, so another policy's
  unfinished prefills continue as the policy's own do. ``echo``'s task-aware eviction order,
  installed on the engine's prefix cache at the first arrival, stays in force while another
  candidate decides; ``deadline="separate"`` dates a first token produced under another policy
  at Echo's next decision.
* Block accounting is exact (forced ``overflow=forbid``): the policy preempts, never the engine.
  When online decodes alone do not fit, the newest online request is preempted (vLLM's rule).

Engine contact: the policy reads the engine's :class:`~llmsched_gym.core.kv.KVCache` through
``view.kv`` for exact cache-hit accounting
(``match_detail``), the LRU eviction order (``next_evictions``) and, for ``echo``, to install the
task-aware order (``set_eviction_priority`` / ``reprioritize``, LRU otherwise unchanged).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from llmsched_gym.core.engine import REJECTED, WAITING
from llmsched_gym.core.request import ONLINE, Workload
from llmsched_gym.core.scheduler import BatchPlan, EngineView, Scheduler

from .base import PolicyError, configure, register
from .echo_estimators import BatchTimeEstimator, ExactEstimator, OnlineKVPredictor

if TYPE_CHECKING:
    from llmsched_gym.core.engine import EngineConfig
    from llmsched_gym.core.kv import KVCache

INF = math.inf
DEC, CHUNK, NEW = 0, 1, 2


@dataclass(slots=True)
class _Member:
    """One request's step in the batch being built."""

    kind: int  # DEC (inherited decode), CHUNK (inherited unfinished prefill), NEW (admission)
    online: bool
    grow: int  # blocks this step adds to the used count (allocation + idle cache hits taken)
    idle_hits: int  # of ``grow``: cached idle blocks that become used (no eviction needed)
    benefit: int  # tokens advanced (cache hits included for admissions)
    computed: int  # prefill tokens computed (0 for a decode)
    ctx: int  # decode: context before the step; prefill: context after the chunk
    freed: int  # blocks released if this member is preempted (lower bound)
    loss: int  # tokens to recompute if preempted
    deadline: float  # latest end time of this step (inf for offline or no SLO)


class _Batch:
    """The batch under construction, with the aggregates the scores and checks need."""

    def __init__(self, used: int) -> None:
        self.m: dict[int, _Member] = {}
        self.n_dec = 0
        self.sum_ctx = 0
        self._top: tuple[int, int] | None = (0, 0)  # the two longest decode contexts
        self.pre: dict[int, tuple[int, int]] = {}
        self.mem = used  # projected used blocks after the iteration
        self.idle_taken = 0
        self.benefit = 0
        self.loss = 0
        self.preempt: list[int] = []
        self.deadline = INF

    def add(self, rid: int, x: _Member) -> None:
        self.m[rid] = x
        if x.kind == DEC:
            self.n_dec += 1
            self.sum_ctx += x.ctx
            if self._top is not None and x.ctx > self._top[1]:
                a, b = self._top
                self._top = (x.ctx, a) if x.ctx > a else (a, x.ctx)
        else:
            self.pre[rid] = (x.computed, x.ctx)
        self.mem += x.grow
        self.idle_taken += x.idle_hits
        self.benefit += x.benefit
        if x.deadline < self.deadline:
            self.deadline = x.deadline

    def remove(self, rid: int, preempt: bool) -> _Member:
        """Drop ``rid``'s step; ``preempt`` also evicts an inherited member (recompute)."""
        x = self.m.pop(rid)
        if x.kind == DEC:
            self.n_dec -= 1
            self.sum_ctx -= x.ctx
            if self._top is not None and x.ctx >= self._top[1]:
                self._top = None
        else:
            del self.pre[rid]
        self.mem -= x.grow
        self.idle_taken -= x.idle_hits
        self.benefit -= x.benefit
        if preempt and x.kind != NEW:
            self.mem -= x.freed
            self.loss += x.loss
            self.preempt.append(rid)
        if x.deadline == self.deadline:
            self.deadline = min((y.deadline for y in self.m.values() if y.online), default=INF)
        return x

    @property
    def top(self) -> tuple[int, int]:
        """The longest and second longest decode contexts (0 when absent)."""
        if self._top is None:
            a = b = 0
            for x in self.m.values():
                if x.kind == DEC and x.ctx > b:
                    a, b = (x.ctx, a) if x.ctx > a else (a, x.ctx)
            self._top = (a, b)
        return self._top


class EchoFamily(Scheduler):
    """Shared machinery of the four Echo policies; subclasses set the three axes."""

    receives = False  # per-request state starts at on_arrival: no decode replica of a disaggregated cluster

    use_estimator: ClassVar[bool] = True
    greedy: ClassVar[bool] = False
    task_aware: ClassVar[bool] = False
    engine_overrides: ClassVar[dict[str, Any]] = {"overflow": "forbid", "preempt_mode": "recompute"}
    params: ClassVar[dict[str, Any]] = {
        "max_prefills": 0, "max_batched_tokens": 8192, "max_num_seqs": 256, "chunk_size": 0,
    }

    def __init__(self, **kwargs: Any) -> None:
        configure(self, kwargs)
        for name in ("max_prefills", "max_batched_tokens", "chunk_size"):
            if getattr(self, name) < 0:
                raise PolicyError(f"policy.{name}: must be >= 0 (0 = unlimited/off), got {getattr(self, name)}")
        if self.max_num_seqs < 1:
            raise PolicyError(f"policy.max_num_seqs: must be >= 1, got {self.max_num_seqs}")
        if self.use_estimator:
            if self.estimator not in ("paper", "exact"):
                raise PolicyError(f"policy.estimator: {self.estimator!r} is not one of paper, exact")
            if self.deadline not in ("paper", "separate"):
                raise PolicyError(f"policy.deadline: {self.deadline!r} is not one of paper, separate")
        if self.greedy:
            if self.candidates < 1:
                raise PolicyError(f"policy.candidates: must be >= 1, got {self.candidates}")
            if self.max_moves < 0:
                raise PolicyError(f"policy.max_moves: must be >= 0 (0 = until no move helps), got {self.max_moves}")
            if self.bucket_base < 1:
                raise PolicyError(f"policy.bucket_base: must be >= 1, got {self.bucket_base}")
        if self.task_aware:
            if self.window_s <= 0:
                raise PolicyError(f"policy.window_s: must be > 0, got {self.window_s}")
            if self.k_sigma < 0:
                raise PolicyError(f"policy.k_sigma: must be >= 0, got {self.k_sigma}")

    # ---- run state ------------------------------------------------------------------------
    def reset(self, config: EngineConfig, rng: np.random.Generator) -> None:
        super().reset(config, rng)
        self._ready = False
        self._online: deque[int] = deque()
        self._fcfs: deque[int] = deque()  # offline pool, submission order (FCFS variants)
        self._groups: dict[tuple, deque[int]] = {}  # offline pool, (segments, bucket) -> FIFO
        self._where: dict[int, tuple] = {}  # pooled request -> its group key
        self._keys: list[tuple] = []  # group keys in radix-tree DFS order
        self._n_pool = 0
        self._count: dict[tuple, int] = {}  # unfinished offline requests per prefix chain
        self._chains: dict[tuple, list[int]] = {}  # prefix chain -> block hashes
        self._owners: dict[int, list[tuple]] = {}  # block hash -> chains containing it
        self._online_done: set[int] = set()
        self._first_token: dict[int, float] = {}
        self._evict_needed: list[int] = [0]

    def _setup(self, view: EngineView) -> None:
        self._ready = True
        self._kv: KVCache = view.kv
        self._rebind(view.workload)
        if self.use_estimator:
            if self.estimator == "exact":
                self._est: BatchTimeEstimator | ExactEstimator = ExactEstimator(view.latency)
            else:
                self._est = BatchTimeEstimator.fit(view.latency)
        if self.task_aware:
            self._pred = OnlineKVPredictor(self.window_s, self.k_sigma)
            self._kv.set_eviction_priority(self._priority)

    def _rebind(self, wl: Workload) -> None:
        """The per-request rows this policy reads: the workload's, once at the start of a one-engine
        run; again whenever a request beyond them arrives at a replica of a cluster, whose workload
        grows as requests are routed to it (:meth:`Engine.extend`)."""
        self._cls = wl.task_class
        self._ttft = wl.ttft_slo_s
        self._tpot = wl.tpot_slo_s
        self._prefix = wl.prefix
        self._prompt = wl.prompt_tokens

    # ---- hooks ----------------------------------------------------------------------------
    def on_arrival(self, req_id: int, view: EngineView) -> bool:
        if not self._ready:
            self._setup(view)
        elif req_id >= len(self._cls):
            self._rebind(view.workload)
        if self._cls[req_id] == ONLINE:
            self._online.append(req_id)
        else:
            if self.greedy:
                chain = self._chain(req_id)
                if chain:
                    self._count[chain] = self._count.get(chain, 0) + 1
                    if chain not in self._chains:
                        hashes = self._kv.block_hashes(req_id)
                        self._chains[chain] = hashes
                        for h in hashes:
                            self._owners.setdefault(h, []).append(chain)
                    if self.task_aware and self._kv.idle_blocks:
                        self._kv.reprioritize(self._chains[chain])
            self._pool_add(req_id, view, front=False)
        return True

    def on_preempt(self, req_id: int, view: EngineView) -> None:
        if self._cls[req_id] == ONLINE:
            self._online.appendleft(req_id)
        else:
            self._pool_add(req_id, view, front=True)

    def on_finish(self, req_id: int, view: EngineView) -> None:
        self._first_token.pop(req_id, None)
        if not self.greedy:
            return
        if self._cls[req_id] == ONLINE:
            if self.task_aware and self._prefix is not None and self._prefix[req_id]:
                hashes = self._kv.block_hashes(req_id)
                self._online_done.update(hashes)
                self._kv.reprioritize(hashes)
            return
        chain = self._chain(req_id)
        if chain:
            self._count[chain] -= 1
            if self.task_aware:
                self._kv.reprioritize(self._chains[chain])

    # ---- offline pool ---------------------------------------------------------------------
    def _chain(self, rid: int) -> tuple:
        segs = self._prefix[rid] if self._prefix is not None else None
        return tuple(segs) if segs else ()

    def _pool_add(self, rid: int, view: EngineView, front: bool) -> None:
        self._n_pool += 1
        if not self.greedy:
            (self._fcfs.appendleft if front else self._fcfs.append)(rid)
            return
        n = int(view.prefill_target[rid])
        bucket = 0 if n < self.bucket_base else int(math.log2(n / self.bucket_base)) + 1
        key = (self._chain(rid), bucket)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = deque()
            bisect.insort(self._keys, key)
        (group.appendleft if front else group.append)(rid)
        self._where[rid] = key

    def _pool_take(self, rid: int) -> None:
        self._n_pool -= 1
        if not self.greedy:
            self._fcfs.remove(rid)
            return
        group = self._groups[self._where.pop(rid)]
        if group[0] == rid:
            group.popleft()
        else:
            group.remove(rid)

    def _priority(self, h: int) -> float:
        """Task-aware eviction priority of an idle cached block (section 4.2)."""
        rc = 0
        for chain in self._owners.get(h, ()):
            rc += self._count[chain]
        if rc:
            return float(rc)
        return 0.5 if h in self._online_done else 0.0

    # ---- members --------------------------------------------------------------------------
    def _deadline(self, rid: int, now: float) -> float:
        """Latest end of this step for online ``rid`` (token index = tokens generated so far)."""
        i = int(self._gen[rid])
        if i == 0:
            return self._arr[rid] + self._ttft[rid]
        if self.deadline == "separate":
            return self._first_token.setdefault(rid, now) + i * self._tpot[rid]
        return self._arr[rid] + self._ttft[rid] + i * self._tpot[rid]

    def _prefill_member(self, rid: int, kind: int, online: bool, now: float, room: int = 0) -> _Member:
        """A prefill step of ``rid``: its next chunk (at most ``room`` tokens when chunking and
        ``room > 0``), or its whole uncached prompt."""
        bs = self._bs
        hits = idle = 0
        if kind == NEW:
            m, idle = self._match(rid)
            hits = m * bs
            start = hits
        else:
            start = int(self._prefilled[rid])
        remaining = int(self._target[rid]) - start
        c = remaining
        if self.chunk_size:
            c = min(c, self.chunk_size, room) if room > 0 else min(c, self.chunk_size)
        last = c == remaining
        k0 = start if kind == NEW else int(self._kvt[rid])
        end = k0 + c + (1 if last and self._emits else 0)
        grow = -(-end // bs) - -(-k0 // bs) + idle
        held = -(-k0 // bs) - int(self._shared[rid]) if kind != NEW else 0
        loss = k0 - int(self._shared[rid]) * bs if kind != NEW else 0
        dl = self._deadline(rid, now) if online and self.use_estimator else INF
        return _Member(kind, online, grow, idle, c + (hits if self._count_hits else 0), c, start + c,
                       held, loss, dl)

    def _match(self, rid: int) -> tuple[int, int]:
        """``KVCache.match_detail``, shared within one decision by requests of one prefix chain."""
        chain = self._chain(rid)
        hit = self._mcache.get(chain) if chain else None
        limit = (int(self._prompt[rid]) - 1) // self._bs
        if hit is None or hit[0] > limit:
            hit = self._kv.match_detail(rid)
            if chain and hit[0] < limit:
                self._mcache[chain] = hit
        return hit

    def _decode_member(self, rid: int, online: bool, now: float) -> _Member:
        k0 = int(self._kvt[rid])
        bs = self._bs
        grow = 1 if k0 % bs == 0 else 0
        shared = int(self._shared[rid])
        dl = self._deadline(rid, now) if online and self.use_estimator else INF
        return _Member(DEC, online, grow, 0, 1, 0, k0, -(-k0 // bs) - shared, k0 - shared * bs, dl)

    # ---- estimates ------------------------------------------------------------------------
    def _time(self, b: _Batch, extra: tuple[int, int] | None = None, drop: int | None = None) -> float:
        """Estimated time of ``b``, plus the prefill ``extra`` or minus the member ``drop``."""
        pre = list(b.pre.values())
        top, second = b.top
        n, s = b.n_dec, b.sum_ctx
        if extra is not None:
            pre.append(extra)
        if drop is not None:
            x = b.m[drop]
            if x.kind == DEC:
                n -= 1
                s -= x.ctx
                if x.ctx == top:
                    top = second
            else:
                pre.remove((x.computed, x.ctx))
        return self._est.batch(pre, n, s, top)

    def _evict_punishment(self, k: int) -> int:
        """Tokens of still-needed cached blocks among the next ``k`` evictions."""
        if k <= 0:
            return 0
        if self.task_aware:
            return max(0, k - self._idle_low) * self._bs
        needed = self._evict_needed
        if len(needed) <= k:
            got = self._kv.next_evictions(max(2 * k, 64))
            needed = self._evict_needed = [0]
            for h in got:
                needed.append(needed[-1] + (1 if self._needed(h) else 0))
            if len(needed) <= k:
                return needed[-1] * self._bs
        return needed[k] * self._bs

    def _needed(self, h: int) -> bool:
        return any(self._count[c] for c in self._owners.get(h, ()))

    def _score(self, b: _Batch, t: float, benefit: int, loss: int, mem: int, idle_taken: int) -> float:
        if t <= 0:
            return 0.0
        k = mem + self._idle - idle_taken - self._cap
        return (benefit - loss - self._evict_punishment(k)) / t

    # ---- the policy -----------------------------------------------------------------------
    def _sync(self, view: EngineView) -> None:
        """Make the online queue and the offline pool exactly the waiting requests (the env's
        ``meta`` mode switches policies): requests another policy admitted go, as do those the
        active policy rejected (an offline one no longer counts for its prefix chain), and of a
        request that came back preempted only its new entry stays (the one at the front, or in
        the group it was last added to). Every arrival and preemption is queued here, so equal
        counts mean nothing to drop, as in every single-policy run."""
        if len(self._online) + self._n_pool == len(view.waiting):
            return
        state = view.state
        seen: set[int] = set()

        def fresh(r: int) -> bool:
            if state[r] != WAITING or r in seen:
                return False
            seen.add(r)
            return True

        self._online = deque(r for r in self._online if fresh(r))
        if not self.greedy:
            self._fcfs = deque(r for r in self._fcfs if fresh(r))
            self._n_pool = len(self._fcfs)
            return
        where = self._where
        for key, group in self._groups.items():
            if group:
                self._groups[key] = deque(r for r in group if where.get(r) == key and fresh(r))
        for r in where:
            if r not in seen and state[r] == REJECTED:
                chain = self._chain(r)
                if chain:
                    self._count[chain] -= 1
                    if self.task_aware:
                        self._kv.reprioritize(self._chains[chain])
        self._where = {r: k for r, k in where.items() if r in seen}
        self._n_pool = len(self._where)

    def schedule(self, view: EngineView) -> BatchPlan:
        """One step in the order of Wang et al. 2025, section 4.1: the inherited batch, its memory, the
        online requests (FCFS), the SLO gate, then the offline work."""
        if not self._ready:
            self._setup(view)
        self._sync(view)
        now = view.now
        self._read_state(view)
        running = view.running
        b, u_on = self._inherited(running, now)
        self._fit_inherited(b, running)
        admit, n_seqs, tokens, u_on = self._admit_online(b, running, now, u_on)
        if self.task_aware:
            # online KV demand: held by running online requests plus the prompts still waiting
            self._pred.observe(now, u_on * self._bs + sum(int(self._target[r]) for r in self._online))
        if self.use_estimator:
            self._slo_gate(b, running, now)
        if not self._online and self._n_pool:
            self._admit_offline(b, now, u_on, n_seqs, tokens, admit)
        return self._plan(b, admit)

    def _read_state(self, view: EngineView) -> None:
        """The engine state this step reads, and the per-step caches."""
        kv = self._kv
        self._bs = kv.block_size
        self._cap = kv.capacity_blocks
        self._idle = kv.idle_blocks
        self._kvt, self._gen = view.kv_tokens, view.generated
        self._prefilled, self._target = view.prefilled, view.prefill_target
        self._arr = view.arrival_s
        self._shared = kv.shared
        self._emits = view.prefill_emits_token
        self._count_hits = getattr(self, "benefit_cached", True)
        self._evict_needed = [0]
        self._mcache: dict[tuple, tuple[int, int]] = {}
        if self.task_aware:
            self._idle_low = kv.idle_below(1.0)

    def _inherited(self, running: list[int], now: float) -> tuple[_Batch, int]:
        """The running requests' batch: every decode, then the unfinished prefills within the token
        budget the decodes leave (vLLM); and the blocks held by running online requests."""
        cls, bs = self._cls, self._bs
        b = _Batch(self._kv.used_blocks)
        u_on = 0
        chunked = []
        for r in running:
            online = cls[r] == ONLINE
            if online:
                u_on += -(-int(self._kvt[r]) // bs)
            if self._prefilled[r] < self._target[r]:
                chunked.append((r, online))
            else:
                b.add(r, self._decode_member(r, online, now))
        budget = self.max_batched_tokens - b.n_dec if self.max_batched_tokens else 0
        for r, online in chunked:
            if self.max_batched_tokens and budget <= 0:
                break
            x = self._prefill_member(r, CHUNK, online, now, budget)
            b.add(r, x)
            budget -= x.computed
        return b, u_on

    def _fit_inherited(self, b: _Batch, running: list[int]) -> None:
        """Step 1: the inherited batch's memory (decode growth): offline victims, then the newest online."""
        while b.mem > self._cap:
            v = self._victim(b, running, memory=True)
            if v is None:
                v = next(r for r in reversed(running) if r in b.m)
            b.remove(v, preempt=True)

    def _admit_online(self, b: _Batch, running: list[int], now: float,
                      u_on: int) -> tuple[dict[int, int], int, int, int]:
        """Step 2: online requests, strictly FCFS; offline work gives way for memory. Returns the
        admissions, the sequences and tokens of the batch, and the online blocks."""
        cap = self._cap
        n_seqs = len(running) - len(b.preempt)
        tokens = sum(n for n, _ in b.pre.values()) + b.n_dec
        admit: dict[int, int] = {}
        while self._online and n_seqs < self.max_num_seqs:
            r = self._online[0]
            x = self._prefill_member(r, NEW, True, now, self._room(tokens))
            if b.pre and self.max_batched_tokens and tokens + x.computed > self.max_batched_tokens:
                break
            while b.mem + x.grow > cap:
                v = self._victim(b, running, memory=True)
                if v is None:
                    break
                b.remove(v, preempt=True)
                n_seqs -= 1
            if b.mem + x.grow > cap:
                break
            self._online.popleft()
            b.add(r, x)
            admit[r] = self._chunk(x)
            n_seqs += 1
            tokens += x.computed
            u_on += x.grow
        return admit, n_seqs, tokens, u_on

    def _slo_gate(self, b: _Batch, running: list[int], now: float) -> None:
        """Step 3: offline work may not push the batch past its deadline."""
        while b.deadline < INF and self._time(b) > b.deadline - now:
            v = self._victim(b, running, memory=False)
            if v is None:
                break
            b.remove(v, preempt=b.m[v].kind == DEC)

    def _admit_offline(self, b: _Batch, now: float, u_on: int, n_seqs: int, tokens: int,
                       admit: dict[int, int]) -> None:
        """Step 4: offline work, once every online request is in, below the reserve the online
        demand predictor keeps (task-aware)."""
        cap = limit = self._cap
        if self.task_aware:
            limit = cap - max(0, -(-int(self._pred.prediction) // self._bs) - u_on)
        if self.greedy:
            self._greedy(b, now, limit, n_seqs, tokens, admit)
        else:
            self._fcfs_fill(b, now, limit, n_seqs, tokens, admit)
        if not b.m:
            # never idle the GPU over the reserve or a negative score: run one request
            r = self._fcfs[0] if not self.greedy else self._candidates()[0]
            x = self._prefill_member(r, NEW, False, now)
            if b.mem + x.grow <= cap:
                self._pool_take(r)
                b.add(r, x)
                admit[r] = self._chunk(x)

    def _plan(self, b: _Batch, admit: dict[int, int]) -> BatchPlan:
        """The step's plan: the admissions, the continued chunks, the preemptions."""
        plan = BatchPlan(prefill=admit, preempt=b.preempt)
        for r, x in b.m.items():
            if x.kind == CHUNK:
                admit[r] = self._chunk(x)
        if not admit and not b.preempt:
            plan.hold = self._can_hold(b)
        return plan

    def _room(self, tokens: int) -> int:
        """Prefill tokens the step budget leaves (0 = no limit)."""
        return max(1, self.max_batched_tokens - tokens) if self.max_batched_tokens else 0

    def _chunk(self, x: _Member) -> int:
        """The plan's chunk for a prefill member (0 = the whole remaining prompt)."""
        return x.computed if self.chunk_size else 0

    def _can_hold(self, b: _Batch) -> bool:
        """Whether the same decode-only plan would come back absent any event."""
        if not self.use_estimator:
            return True
        return not self._online and not self._n_pool and b.deadline == INF

    # ---- victims ----------------------------------------------------------------------------
    def _victim(self, b: _Batch, running: list[int], memory: bool) -> int | None:
        """The offline member to drop: the newest one (vLLM priority preemption), or for the Echo
        scheduler the one whose removal leaves the best score. For time, unfinished chunks are
        deferred before decodes are preempted."""
        offline = [r for r, x in b.m.items() if not x.online and (memory or x.kind != NEW)]
        if not offline:
            return None
        if not memory:
            chunks = [r for r in offline if b.m[r].kind != DEC]
            if chunks:
                offline = chunks
        if not self.greedy:
            order = {r: i for i, r in enumerate(running)}
            return max(offline, key=lambda r: order.get(r, len(running)))
        best, best_s = None, -INF
        for r in offline:
            x = b.m[r]
            gone = x.freed if memory and x.kind != NEW else 0
            loss = x.loss if memory or x.kind == DEC else 0
            s = self._score(b, self._time(b, drop=r), b.benefit - x.benefit, b.loss + loss,
                            b.mem - x.grow - gone, b.idle_taken - x.idle_hits)
            if s > best_s:
                best, best_s = r, s
        return best

    # ---- offline admission ------------------------------------------------------------------
    def _fits(self, b: _Batch, x: _Member, now: float, limit: int, n_seqs: int, tokens: int) -> float | None:
        """The estimated time of ``b`` plus the admission ``x`` if it passes the memory (and
        threshold), step-budget and SLO checks, else None (0.0 without an estimator)."""
        if n_seqs >= self.max_num_seqs or b.mem + x.grow > limit:
            return None
        if self.max_prefills and len(b.pre) >= self.max_prefills:
            return None
        if b.pre and self.max_batched_tokens and tokens + x.computed > self.max_batched_tokens:
            return None
        if not self.use_estimator:
            return 0.0
        t = self._time(b, extra=(x.computed, x.ctx))
        return t if t <= b.deadline - now else None

    def _fcfs_fill(self, b: _Batch, now: float, limit: int, n_seqs: int, tokens: int,
                   admit: dict[int, int]) -> None:
        """FCFS offline admission with head-of-line blocking (BS, BS+E)."""
        pool = self._fcfs
        while pool:
            r = pool[0]
            x = self._prefill_member(r, NEW, False, now, self._room(tokens))
            if self._fits(b, x, now, limit, n_seqs, tokens) is None:
                return
            pool.popleft()
            self._n_pool -= 1
            b.add(r, x)
            admit[r] = self._chunk(x)
            n_seqs += 1
            tokens += x.computed

    def _candidates(self) -> list[int]:
        """The first ``candidates`` pooled requests in radix-tree DFS order, starting from the
        groups with the longest cached prefix (section 6)."""
        heads = []
        for i, key in enumerate(self._keys):
            g = self._groups[key]
            if g:
                heads.append((-self._match(g[0])[0] if key[0] else 0, i, g))
        heads.sort(key=lambda h: h[:2])
        out: list[int] = []
        for _, _, g in heads:
            out.extend(islice(g, self.candidates - len(out)))
            if len(out) >= self.candidates:
                break
        return out

    def _greedy(self, b: _Batch, now: float, limit: int, n_seqs: int, tokens: int,
                admit: dict[int, int]) -> None:
        """Echo's greedy moves on Eq. 4 (section 4.1)."""
        moves = 0
        added = False
        cands: list[int] | None = None
        members: dict[int, _Member] = {}
        while not self.max_moves or moves < self.max_moves:
            t = self._time(b)
            best_s = self._score(b, t, b.benefit, b.loss, b.mem, b.idle_taken)
            best: tuple[int, int] | None = None
            if (n_seqs < self.max_num_seqs and (not self.max_prefills or len(b.pre) < self.max_prefills)):
                if cands is None:
                    cands = self._candidates()
                for r in cands:
                    x = members.get(r)
                    if x is None:
                        x = members[r] = self._prefill_member(r, NEW, False, now, self._room(tokens))
                    tx = self._fits(b, x, now, limit, n_seqs, tokens)
                    if tx is None:
                        continue
                    s = self._score(b, tx, b.benefit + x.benefit, b.loss, b.mem + x.grow,
                                    b.idle_taken + x.idle_hits)
                    if s > best_s:
                        best, best_s = (NEW, r), s
            # preemptions only improve the inherited batch: an admission is never paid for by
            # preempting running work (Eq. 7's max(L) would trade a long request for a cheap hit)
            if not added and best_s >= 0:
                k0 = b.mem + self._idle - b.idle_taken - self._cap
                base = b.benefit - 1 - b.loss - self._evict_punishment(k0)
                for r, x in b.m.items():
                    if x.online or x.kind != DEC:
                        continue
                    # upper bound of the numerator: evictions avoided are worth at most bs each
                    if base - x.loss + self._bs * (x.grow + x.freed) <= 0:
                        continue
                    s = self._score(b, self._time(b, drop=r), b.benefit - 1, b.loss + x.loss,
                                    b.mem - x.grow - x.freed, b.idle_taken)
                    if s > best_s:
                        best, best_s = (DEC, r), s
            if best is None:
                return
            kind, r = best
            if kind == NEW:
                x = members.pop(r)
                cands.remove(r)  # type: ignore[union-attr]
                self._pool_take(r)
                b.add(r, x)
                admit[r] = self._chunk(x)
                n_seqs += 1
                tokens += x.computed
                added = True
            else:
                b.remove(r, preempt=True)
                n_seqs -= 1
            moves += 1


@register("echo-bs")
class EchoBS(EchoFamily):
    """BS: vLLM 0.6.3 with priority scheduling (online first, offline FCFS; no time check)."""

    use_estimator = False
    params = dict(EchoFamily.params)


_ESTIMATOR_PARAMS: dict[str, Any] = {"estimator": "paper", "deadline": "separate"}
_SCHEDULER_PARAMS: dict[str, Any] = {"max_prefills": 1, "benefit_cached": True, "max_moves": 0,
                                     "candidates": 32, "bucket_base": 256}


@register("echo-bs-e")
class EchoBSE(EchoFamily):
    """BS+E: BS whose offline admissions must keep the estimated time within the batch SLO."""

    params = {**EchoFamily.params, **_ESTIMATOR_PARAMS}


@register("echo-bs-e-s")
class EchoBSES(EchoFamily):
    """BS+E+S: Echo's KV-cache-aware greedy scheduler over an LRU prefix cache, no threshold."""

    greedy = True
    params = {**EchoFamily.params, **_ESTIMATOR_PARAMS, **_SCHEDULER_PARAMS}


@register("echo")
class Echo(EchoFamily):
    """Echo: the greedy scheduler plus the task-aware KV manager and the active-KV threshold."""

    greedy = True
    task_aware = True
    params = {**EchoFamily.params, **_ESTIMATOR_PARAMS, **_SCHEDULER_PARAMS, "window_s": 3600.0,
              "k_sigma": 2.0}
