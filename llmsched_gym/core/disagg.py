"""Disaggregated serving: a prefill pool and a decode pool, with the KV moved between them.

A request is prefilled on a replica of the prefill pool, its KV is transferred, and it is decoded
on a replica of the decode pool (DistServe, Zhong et al., OSDI 2024, sections 2-4; Splitwise,
Patel et al., ISCA 2024, sections 4-5; llm-d and NVIDIA Dynamo ship it). Each replica is the
plain :class:`~llmsched_gym.core.engine.Engine` with its own latency model (GPU, tensor
parallelism), engine settings and scheduler; pools may differ in all of them.

Roles (``roles[r]``): ``prefill`` replicas only prefill; ``decode`` replicas decode, and prefill
locally the requests the decider keeps whole (llm-d's decode pods do); ``mixed`` replicas do
both (Splitwise's mixed pool): a request may be prefilled on one and decoded on another, or run
whole on one.

What happens to a request (all times exact; the replicas and the transfers are simulated
together in time order, each replica iteration by iteration):

1. **Arrival**: the pair router (:class:`PairRouter` interface, e.g. ``baselines.route_pair``)
   picks the decode replica ``d``, the decider says whether to disaggregate, and if so the router
   picks the prefill replica ``p`` (``p == d``: the request runs whole on ``d``, no transfer).
   Routers see exact load signals (the replicas as they stand at the arrival).
2. **Prefill** on ``p``: the request is a row with one output token, so it leaves ``p``'s running
   set when its prefill emits the first token. **TTFT ends here** (DistServe's convention: the
   prefill instance returns the first token), so TTFT does not depend on the transfer; the
   transfer shows in TPOT and end-to-end latency. A request with one output token is done.
   With ``transfer={"first_token": "transfer"}`` the first token counts when the KV reaches
   the decode replica instead (:data:`FIRST_TOKEN`).
3. **Room on d**: the transfer starts when ``d`` has free KV blocks for ``prompt + 1`` tokens
   (the prompt's KV and the first token's slot), at ``d``'s first iteration boundary at or after
   the prefill's end (vLLM's scheduler allocates the blocks of a remote-KV request at a step);
   otherwise the request waits, first come first served per decode replica, the time counted
   (``room_wait_s``). The blocks are reserved on ``d`` from the start.
4. **Transfer** of the prompt's KV (:mod:`llmsched_gym.core.transfer`: ``base_s + bytes /
   bandwidth``, bytes from the prefill replica's model and both tensor-parallel degrees). The
   prefill replica keeps the request's private KV blocks from the prefill's end to the
   transfer's end (its prefix-cache blocks stay in its cache), so during the transfer the KV is
   held on both sides.
5. **Decode** on ``d``: at the transfer's end the request joins ``d``'s running set
   (:meth:`Engine.receive`) with its prompt's KV and the first token, and decodes the rest under
   ``d``'s scheduler (which may preempt it like any request). The scheduler's ``on_arrival``
   hook is not called for it (it never waits; a preempted one comes back through
   ``on_preempt``), so policies whose arrival hook only queues waiting requests (sjf, lpm,
   mcsf, k-lpm) decode it as any running request.

Results: :meth:`DisaggCluster.summary` has the engine's summary keys for the whole system (TTFT
from the prefill, completion from the decode), ``cluster`` (per replica) and ``pools`` (per
pool metrics, transfers, waits for decode room); :meth:`DisaggCluster.request_table` gives each
request's ``prefill_replica``, ``decode_replica``, ``disaggregated``, ``prefill_end_s``,
``transfer_start_s``, ``transfer_end_s`` and ``room_wait_s`` beside the usual columns.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Generator, Mapping, Sequence
from typing import Any

import numpy as np

from llmsched_gym.config import ConfigError
from llmsched_gym.core.cluster import (
    REPLICA_KEYS,
    ClusterView,
    Replica,
    merge_totals,
    merged_iteration_log,
    prefix_hasher,
)
from llmsched_gym.core.cluster import _Rows as _ClusterRows  # a replica's rows, grown in place
from llmsched_gym.core.engine import DONE, REJECTED, RUNNING, Engine
from llmsched_gym.core.kv import KVCache
from llmsched_gym.core.metrics import summarize
from llmsched_gym.core.records import request_table
from llmsched_gym.core.request import Workload
from llmsched_gym.core.transfer import Model, TransferConfig, TransferModel

ROLES = ("prefill", "decode", "mixed")
"""What a replica of a disaggregated cluster does (see the module docstring)."""

FIRST_TOKEN = ("prefill", "transfer")
"""Where a disaggregated request's first token counts (``transfer={"first_token": ...}``):
``prefill``, when the prefill emits it (DistServe's convention, the default); ``transfer``, when
the KV reaches the decode replica (the client streams every token from the decode replica, as
behind vLLM's and llm-d's P/D proxies; TTFT then includes the transfer and the wait for room)."""


# ---- the decider -------------------------------------------------------------------------------
class Decider:
    """Whether to disaggregate a request (prefill on another replica) or run it whole on its
    decode replica.

    * ``"always"``: always disaggregate (DistServe, Splitwise's pools).
    * ``"never"``: never (every request runs whole on its decode replica).
    * ``{"kind": "prompt_len", "min": M}``: disaggregate prompts of at least ``M`` tokens; short
      prompts prefill locally, where the transfer would cost more than it saves.
    * ``{"kind": "prefix_hit", "min_uncached": M}``: disaggregate when at least ``M`` prompt
      tokens are missing from the decode replica's prefix cache (llm-d's P/D threshold: a decode
      pod prefills locally what it mostly has cached).
    """

    KINDS = ("always", "never", "prompt_len", "prefix_hit")

    def __init__(self, spec: str | Mapping[str, Any] = "always") -> None:
        if isinstance(spec, str):
            spec = {"kind": spec}
        if not isinstance(spec, Mapping):
            raise ConfigError(f"decider: expected one of {', '.join(self.KINDS)} or a mapping with 'kind', got {spec!r}")
        kind = spec.get("kind")
        if kind not in self.KINDS:
            raise ConfigError(f"decider.kind: unknown {kind!r}; allowed: {', '.join(self.KINDS)}")
        key = {"prompt_len": "min", "prefix_hit": "min_uncached"}.get(kind)
        allowed = {"kind"} | ({key} if key else set())
        unknown = sorted(set(spec) - allowed)
        if unknown:
            raise ConfigError(f"decider.{unknown[0]}: unknown setting for {kind!r} (allowed: {', '.join(sorted(allowed))})")
        self.kind, self.threshold = kind, 0
        if key:
            v = spec.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"decider.{key}: expected an integer >= 0, got {v!r}")
            self.threshold = v
        self.spec = dict(spec)

    def __call__(self, rid: int, d: int, view: ClusterView) -> bool:
        """True: disaggregate request ``rid`` whose decode replica is ``d`` (an index of ``view``)."""
        if self.kind == "always":
            return True
        if self.kind == "never":
            return False
        prompt = int(view.prompt_tokens[rid])
        if self.kind == "prompt_len":
            return prompt >= self.threshold
        return prompt - int(view.prefix_hit(rid)[d]) >= self.threshold

    def __repr__(self) -> str:
        return f"Decider({self.spec!r})"


class PairRouter:
    """Interface of the routers of a disaggregated cluster (implementations:
    ``baselines.route_pair``). ``reset`` is called once per run with the sizes of the two
    candidate sets (prefill-capable: ``prefill`` and ``mixed`` replicas; decode-capable:
    ``decode`` and ``mixed``); ``route`` returns ``(p, d)``, indices into the two views, with
    ``p = None`` when the request runs whole on ``d``. Each view's ``roles`` lists its replicas'
    roles."""

    name = "pair"

    def reset(self, n_prefill: int, n_decode: int, rng: np.random.Generator) -> None:
        raise NotImplementedError

    def route(self, rid: int, prefill_view: ClusterView, decode_view: ClusterView) -> tuple[int | None, int]:
        raise NotImplementedError


# ---- rows a replica serves ---------------------------------------------------------------------
class _Rows(_ClusterRows):
    """A replica's requests as a :class:`Workload` grown in place (rows copied from the global
    one, with some fields replaced: a prefill row has one output token; a decode row arrives at
    the transfer's end)."""

    def add_one(self, g: int, **over: Any) -> Workload:
        """Append global request ``g`` with the fields ``over`` replaced; returns the workload."""
        arrival = over.pop("arrival_s", None)
        wl = self.append(g, arrival)
        for f, v in over.items():
            if f in self.filled:
                self.fill(f)  # the row's copy first, so that a later fill does not undo the change
            self.bufs[f][self.n - 1] = v
        return wl


class _PoolCluster:
    """What a :class:`ClusterView` reads of a cluster, for a subset of the replicas."""

    def __init__(self, owner: DisaggCluster, idx: list[int]) -> None:
        self.engines = [owner.engines[r] for r in idx]
        self.replicas = [owner.replicas[r] for r in idx]
        self.workload, self.has_prefix, self.hasher = owner.workload, owner.workload.has_prefix, owner.hasher


def transfer_model_of(replica: Replica) -> tuple[Model, int]:
    """The model whose KV a replica ships and its tensor-parallel degree: the latency model's
    (``roofline:``, ``calibrated:``, ``vidur:`` name them) or else the engine's
    ``kv_bytes_per_token`` at TP 1."""
    lat = replica.latency
    model, gpu = getattr(lat, "model", None), getattr(lat, "gpu", None)
    tp = int(getattr(gpu, "count", 1) or 1)
    if model is not None and hasattr(model, "kv_bytes_per_token"):
        return model, tp
    return int(replica.config.kv_bytes_per_token), tp


class DisaggCluster:
    """Replicas in roles behind a pair router, with KV transfers (see the module docstring).

    :param workload: the requests (global ids = rows).
    :param replicas: one :class:`Replica` per replica.
    :param roles: each replica's role (:data:`ROLES`).
    :param router: the pair router (:class:`PairRouter`).
    :param transfer: the link (:class:`~llmsched_gym.core.transfer.TransferConfig` or its dict).
    :param seed: seeds the engines (replica ``r`` as :class:`~llmsched_gym.core.cluster.Cluster`
        seeds it) and the router.
    :param transfer_models: per replica, the model and TP its KV is sized with (default:
        :func:`transfer_model_of`).
    """

    def __init__(self, workload: Workload, replicas: Sequence[Replica], roles: Sequence[str], router: PairRouter,
                 transfer: TransferConfig | Mapping[str, Any] | None = None, seed: int = 0,
                 transfer_models: Sequence[tuple[Model, int]] | None = None) -> None:
        if len(roles) != len(replicas):
            raise ConfigError(f"pools: {len(roles)} roles for {len(replicas)} replicas")
        for r, role in enumerate(roles):
            if role not in ROLES:
                raise ConfigError(f"pools: replica {r} has role {role!r}; allowed: {', '.join(ROLES)}")
        self.prefill_idx = [r for r, x in enumerate(roles) if x in ("prefill", "mixed")]
        self._decodes = [x != "prefill" for x in roles]
        self.decode_idx = [r for r, x in enumerate(roles) if x in ("decode", "mixed")]
        if not self.decode_idx:
            raise ConfigError("pools.decode.n: a disaggregated cluster needs at least one decode (or mixed) replica")
        for r, rep in enumerate(replicas):
            if not rep.scheduler.grows:
                raise ConfigError(f"pools.{roles[r]}.policy: {rep.scheduler.name!r} keeps per-request arrays sized "
                                  "when it starts; pick another policy (fcfs, vllm-v1, sarathi, sjf, ...)")
            if roles[r] != "prefill" and not rep.scheduler.receives:
                raise ConfigError(f"pools.{roles[r]}.policy: {rep.scheduler.name!r} keeps per-request arrays set up "
                                  "when a request arrives, and a decode replica receives its requests running; pick "
                                  "another policy for this pool (fcfs, vllm-v1, sarathi, sjf, ...)")
        self.workload, self.replicas, self.roles = workload, list(replicas), list(roles)
        self.router, self.seed = router, seed
        spec = dict(transfer) if isinstance(transfer, Mapping) else transfer
        self.first_token = spec.pop("first_token", "prefill") if isinstance(spec, dict) else "prefill"
        if self.first_token not in FIRST_TOKEN:
            raise ConfigError(f"transfer.first_token: unknown {self.first_token!r}; allowed: {', '.join(FIRST_TOKEN)}")
        self.link = TransferModel(spec)
        self.models = list(transfer_models) if transfer_models is not None else [transfer_model_of(x) for x in replicas]
        self._rows = [_Rows(workload) for _ in replicas]
        # replica r seeded as a Cluster seeds it (replica 0 as the plain engine)
        seeds = [seed if i == 0 else int(np.random.SeedSequence([seed, i]).generate_state(1)[0])
                 for i in range(len(replicas))]
        self.engines = [Engine(self._rows[i].workload, x.config, x.latency, x.scheduler, seed=seeds[i])
                        for i, x in enumerate(replicas)]
        self._hashers: dict[int, KVCache] = {}
        self.pview = ClusterView(_PoolCluster(self, self.prefill_idx))
        self.dview = ClusterView(_PoolCluster(self, self.decode_idx))
        self.pview.roles = [self.roles[r] for r in self.prefill_idx]  # what a pair router may read of a replica
        self.dview.roles = [self.roles[r] for r in self.decode_idx]
        self.view = ClusterView(_PoolCluster(self, list(range(len(replicas)))))
        """Every replica's signals (what the routing env observes)."""
        router.reset(len(self.prefill_idx), len(self.decode_idx),
                     np.random.default_rng(np.random.SeedSequence([seed, 0x0A7E])))
        n = len(workload)
        self.prefill_replica = np.full(n, -1, dtype=np.int64)
        self.decode_replica = np.full(n, -1, dtype=np.int64)
        self.disaggregated = np.zeros(n, dtype=bool)
        self.prefill_end_s = np.full(n, np.nan)
        self.transfer_start_s = np.full(n, np.nan)
        self.transfer_end_s = np.full(n, np.nan)
        self._local_p = np.full(n, -1, dtype=np.int64)  # the request's row on its prefill (or only) replica
        self._local_d = np.full(n, -1, dtype=np.int64)  # its row on the decode replica (disaggregated only)
        self._hold = np.zeros(n, dtype=np.int64)        # blocks held on the prefill replica during the transfer
        self._open = [[] for _ in replicas]              # per replica: its prefill rows not yet finished
        self._counted = [0] * len(replicas)               # completions + rejections seen per replica
        self._waitq: list[deque[int]] = [deque() for _ in replicas]
        self._bound = np.zeros(len(replicas), dtype=np.int64)  # routed as decode replica, not yet received
        self._events: list[tuple[float, int, int, int]] = []   # (time, kind, seq, request): 0 end, 1 prefill done
        self._seq = 0
        self.stop_reason = ""
        self.done = False

    @property
    def bound(self) -> np.ndarray:
        """Per replica: requests routed to it as decode replica and not there yet (prefilling,
        waiting for room or in transfer)."""
        return self._bound

    def hasher(self, block_size: int) -> KVCache:
        """A prefix-hash index of the global workload (its hashes only)."""
        return prefix_hasher(self._hashers, self.workload, block_size)

    # ---- the loop --------------------------------------------------------------------------------
    def run(self) -> None:
        """Route every arrival with the pair router and run everything to the end."""
        steps, route = self.decisions(), self.router.route
        pi, di = self.prefill_idx, self.decode_idx
        try:
            rid = next(steps)
            while True:
                p, d = route(rid, self.pview, self.dview)
                dd = di[_checked(d, len(di), self.router, rid)]
                pp = dd if p is None else pi[_checked(p, len(pi), self.router, rid)]
                rid = steps.send((pp, dd))
        except StopIteration:
            pass

    def decisions(self) -> Generator[int, tuple[int, int], None]:
        """The run as a generator: it yields each arriving request's global id (the views are
        then current) and takes ``(p, d)`` back, replica indices (``p == d``: run whole on ``d``;
        ``d`` must be decode-capable, ``p`` prefill-capable or ``d``)."""
        wl, engines = self.workload, self.engines
        arrival = wl.arrival_s.tolist()
        horizon = min((e.config.horizon_s for e in engines if e.config.horizon_s is not None), default=math.inf)
        n, i = len(wl), 0
        busy = {r: e.clock for r, e in enumerate(engines)}  # engines with work -> clock
        self._busy = busy
        for r in range(len(engines)):
            self._poll(r, 0.0)
        while True:
            t_arr = arrival[i] if i < n and arrival[i] <= horizon else math.inf
            t_ev = min(t_arr, self._events[0][0] if self._events else math.inf)
            if busy:  # the earliest replica; at a tie one with prefills under way first (see _step)
                r, c = min(busy.items(), key=lambda x: (x[1], not self._open[x[0]], x[0]))
                if c < t_ev:
                    self._step(r, t_ev)
                    continue
            if t_ev == math.inf:
                break
            self.link.forget(t_ev)
            if self._events and self._events[0][0] <= t_arr:
                t, kind, _, g = heapq.heappop(self._events)
                if kind == 0:
                    self._deliver(g, t)
                else:
                    self._waitq[int(self.decode_replica[g])].append(g)
                    self._try_start(int(self.decode_replica[g]), t)
                continue
            self._signals(t_arr)
            pair = yield i
            self._place(i, pair, t_arr)
            i += 1
        if any(q and not engines[r].done for r, q in enumerate(self._waitq)):
            self.stop_reason = "requests wait for decode room that no replica can free (deadlock)"
        for r, e in enumerate(engines):
            e.more_from = None
            while e.poll():
                e.execute(e.scheduler.schedule(e.view))
            self._collect(r)
        self.done = True

    def _poll(self, r: int, limit: float) -> None:
        """Refresh whether replica ``r`` has work (and its clock), and collect its finished prefills."""
        e = self.engines[r]
        e.more_from = limit
        if e.poll():
            self._busy[r] = e.clock
        else:
            self._busy.pop(r, None)
        self._collect(r)

    def _step(self, r: int, t_ev: float) -> None:
        """One iteration of replica ``r`` (a fast-forwarded decode run stops at the first boundary
        at or after the next event or the next clock of another busy replica)."""
        e, busy = self.engines[r], self._busy
        # A fast-forwarded decode run stops at the first boundary at or after ``limit``: the next
        # event and, on a decode-capable replica, the clock of every other replica with prefills
        # under way (the earliest its next prefill can end and ask for room here; such a replica
        # at this clock was stepped first). Nothing else reaches a replica between events.
        limit = t_ev
        if self._decodes[r]:
            limit = min([t_ev] + [c for q, c in busy.items() if q != r and self._open[q] and c > e.clock])
        e.more_from = limit
        e.execute(e.scheduler.schedule(e.view))
        self._poll(r, limit)
        if self._waitq[r]:
            self._try_start(r, e.clock)

    def _collect(self, r: int) -> None:
        """Prefill rows of replica ``r`` that finished since the last look: hold their KV and
        queue their transfer (or finish them: one output token, or rejected)."""
        e = self.engines[r]
        seen = e.counters.n_completed + e.counters.n_rejected
        if seen == self._counted[r] or not self._open[r]:
            self._counted[r] = seen
            return
        self._counted[r] = seen
        open_ = np.asarray(self._open[r], dtype=np.int64)
        st = e.state[open_]
        ended = (st == DONE) | (st == REJECTED)
        if not ended.any():
            return
        self._open[r] = open_[~ended].tolist()
        gids = self._rows[r].gids
        for loc in open_[ended].tolist():
            g = int(gids[loc])
            if e.state[loc] == REJECTED:
                self._bound[int(self.decode_replica[g])] -= 1
                continue
            t = float(e.completion_s[loc])
            self.prefill_end_s[g] = t
            if int(self.workload.output_tokens[g]) <= 1:
                self._bound[int(self.decode_replica[g])] -= 1
                continue
            kv = e.kv
            prompt = int(self.workload.prompt_tokens[g])
            hold = max(kv.blocks(prompt) - (kv.match_blocks(loc) if kv.enabled else 0), 0)
            if kv.enabled:
                kv.make_room(hold)
            kv.used_blocks += hold
            self._hold[g] = hold
            heapq.heappush(self._events, (t, 1, self._seq, g))
            self._seq += 1

    def _try_start(self, d: int, now: float) -> None:
        """Start the transfers waiting for room on decode replica ``d``, first come first served,
        at ``d``'s boundary at or after ``now``."""
        e, q = self.engines[d], self._waitq[d]
        if e.done:
            return
        t = max(now, e.clock)
        kv = e.kv
        while q:
            g = q[0]
            prompt = int(self.workload.prompt_tokens[g])
            need = kv.blocks(prompt + 1)
            if kv.capacity_blocks - kv.used_blocks < need:
                return
            q.popleft()
            if kv.enabled:
                kv.make_room(need)
            kv.used_blocks += need
            p = int(self.prefill_replica[g])
            (mp, tp_p), (_, tp_d) = self.models[p], self.models[d]
            end = self.link.start(t, prompt, mp, tp_p, tp_d)
            self.transfer_start_s[g], self.transfer_end_s[g] = t, end
            heapq.heappush(self._events, (end, 0, self._seq, g))
            self._seq += 1

    def _deliver(self, g: int, t: float) -> None:
        """The transfer of request ``g`` ended at ``t``: the prefill replica frees its blocks, the
        decode replica takes the request."""
        p, d = int(self.prefill_replica[g]), int(self.decode_replica[g])
        ep, ed = self.engines[p], self.engines[d]
        ep.kv.used_blocks -= int(self._hold[g])
        self._hold[g] = 0
        if p in self._busy or not ep.done:
            self._poll(p, t)
        self._bound[d] -= 1
        if ed.done:  # stopped (horizon): the request stays unfinished
            return
        loc = ed.receive(self._rows[d].add_one(g, arrival_s=t), generated=1)
        self._local_d[g] = loc
        self._poll(d, t)
        if self._waitq[d]:
            self._try_start(d, ed.clock)

    def _place(self, g: int, pair: Any, t: float) -> None:
        """Request ``g`` goes to the pair ``(p, d)`` (validated)."""
        if not (isinstance(pair, tuple | list) and len(pair) == 2):
            raise ConfigError(f"router {getattr(self.router, 'name', '?')!r}: expected a pair (p, d) for request {g}, "
                              f"got {pair!r}")
        p, d = (int(x) for x in pair)
        if d not in self.decode_idx:
            raise ConfigError(f"pair ({p}, {d}) for request {g}: replica {d} does not decode "
                              f"(decode-capable: {self.decode_idx})")
        if p != d and p not in self.prefill_idx:
            raise ConfigError(f"pair ({p}, {d}) for request {g}: replica {p} does not prefill "
                              f"(prefill-capable: {self.prefill_idx}, or p == d to run whole on d)")
        kv, wl = self.engines[d].kv, self.workload
        if p != d and kv.blocks(int(wl.prompt_tokens[g]) + int(wl.output_tokens[g])) > kv.capacity_blocks:
            p = d  # d can never hold it: d's engine rejects it at arrival, with the reason, as a colocated one
        self.prefill_replica[g], self.decode_replica[g] = p, d
        split = p != d
        self.disaggregated[g] = split
        if split:
            loc = self._rows[p].add_one(g, output_tokens=1, predicted_output=1)
            self.engines[p].extend(loc)
            self._open[p].append(self.engines[p].n - 1)
            self._bound[d] += 1
        else:
            self.engines[p].extend(self._rows[p].add_one(g))
        self._local_p[g] = self.engines[p].n - 1
        for view, idx in ((self.pview, self.prefill_idx), (self.dview, self.decode_idx)):
            view.routed[:] = [self._rows[r].n for r in idx]
        self.view.routed[:] = [rows.n for rows in self._rows]
        self._poll(p, t)

    def _signals(self, t: float) -> None:
        """Load signals of both views at routing time ``t`` (exact: each replica as it stands)."""
        every = range(len(self.engines))
        for view, idx in ((self.pview, self.prefill_idx), (self.dview, self.decode_idx), (self.view, every)):
            view.now = t
            for j, r in enumerate(idx):
                e = self.engines[r]
                pending = e.n - e.next_idx
                view.waiting[j] = len(e.waiting) + pending + int(self._bound[r])
                view.running[j] = len(e.running)
                view.kv_used[j] = e.kv.used_tokens
                view.waiting_tokens[j] = e.waiting_tokens + int(e._prompt_cum[e.n] - e._prompt_cum[e.next_idx])
            view.outstanding[:] = view.waiting + view.running

    # ---- results ----------------------------------------------------------------------------
    def records(self) -> _Records:
        """The per-request records of the whole system in global id order (for :func:`summarize`)."""
        return _Records(self)

    def summary(self, scenario: str = "", policy: str = "", wall_time_s: float = 0.0) -> dict[str, Any]:
        """The system's summary (engine keys), ``cluster`` (per replica) and ``pools``."""
        s = summarize(self.records(), scenario, policy, wall_time_s)
        per = [summarize(e, scenario, policy) for e in self.engines]
        routed = np.array([rows.n for rows in self._rows], dtype=float)
        busy = np.array([e.busy_time for e in self.engines])
        s["cluster"] = {
            "n_replicas": len(self.engines),
            "router": getattr(self.router, "name", type(self.router).__name__),
            "refresh_s": 0.0,
            "routed": [int(x) for x in routed],
            "load_imbalance": float(routed.max() / routed.mean()) if routed.sum() else 1.0,
            "busy_imbalance": float(busy.max() / busy.mean()) if busy.sum() else 1.0,
            "prefix_hit_rate": s.get("prefix_hit_rate", 0.0),
            "prefix_hit_tokens": int(sum(p.get("prefix_hit_tokens", 0) for p in per)),
            # not a replica's `serving` set: a prefill replica's rows are one-token prefills and a
            # decode replica's start at the hand-off, so their TTFT/TPOT are not the requests'
            "replicas": [{"role": self.roles[r], **{k: p[k] for k in REPLICA_KEYS if k in p and k != "serving"}}
                         for r, p in enumerate(per)],
        }
        s["pools"] = self._pools(per)
        if self.stop_reason:
            s["stop_reason"] = "; ".join(x for x in (s.get("stop_reason", ""), self.stop_reason) if x)
        return s

    def _pools(self, per: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for role in ROLES:
            idx = [r for r, x in enumerate(self.roles) if x == role]
            if not idx:
                continue
            rows = [per[r] for r in idx]
            out[role] = {
                "n": len(idx),
                "replicas": idx,
                "latency": [str(getattr(self.engines[r].latency, "name", "")) for r in idx],
                "policy": [self.engines[r].scheduler.name for r in idx],
                "requests": int(sum(self._rows[r].n for r in idx)),
                "busy_frac": float(np.mean([p["busy_frac"] for p in rows])),
                "kv_peak_frac": float(max(p["kv_peak_frac"] for p in rows)),
                "preemptions": int(sum(p["preemptions"] for p in rows)),
            }
        moved = np.isfinite(self.transfer_end_s)
        dur = (self.transfer_end_s - self.transfer_start_s)[moved]
        wait = (self.transfer_start_s - self.prefill_end_s)[moved]
        c = self.link.config
        out["transfer"] = {
            "count": int(moved.sum()),
            "bytes": int(self.link.total_bytes),
            "time_s": float(dur.sum()),
            "mean_s": float(dur.mean()) if len(dur) else 0.0,
            "max_s": float(dur.max()) if len(dur) else 0.0,
            "peak_concurrent": int(self.link.peak_concurrent),
            "bandwidth_gb_s": c.bandwidth_gb_s, "base_s": c.base_s, "shared_link": c.shared_link,
            "first_token": self.first_token,
        }
        out["decode_room_wait"] = {
            "count": int((wait > 0).sum()),
            "total_s": float(wait.sum()),
            "mean_s": float(wait.mean()) if len(wait) else 0.0,
            "max_s": float(wait.max()) if len(wait) else 0.0,
        }
        routed = self.decode_replica >= 0
        out["disaggregated"] = int((self.disaggregated & routed).sum())
        out["local"] = int((~self.disaggregated & routed).sum())
        return out

    def request_table(self) -> dict[str, np.ndarray]:
        """Per-request records (global ids) with each request's pair, transfer times and waits."""
        t = request_table(self.records())
        ids = t["id"]
        t["prefill_replica"] = self.prefill_replica[ids]
        t["decode_replica"] = self.decode_replica[ids]
        t["disaggregated"] = self.disaggregated[ids]
        t["prefill_end_s"] = self.prefill_end_s[ids]
        t["transfer_start_s"] = self.transfer_start_s[ids]
        t["transfer_end_s"] = self.transfer_end_s[ids]
        t["room_wait_s"] = self.transfer_start_s[ids] - self.prefill_end_s[ids]
        return t

    def iteration_log(self) -> dict[str, np.ndarray]:
        """Every replica's iteration log, ordered by start time, with a ``replica`` column."""
        return merged_iteration_log(self.engines)


def _checked(x: Any, n: int, router: Any, rid: int) -> int:
    if not (isinstance(x, int | np.integer) and not isinstance(x, bool) and 0 <= x < n):
        raise ConfigError(f"router {getattr(router, 'name', '?')!r}: route({rid}) returned {x!r}, not an index in 0..{n - 1}")
    return int(x)


class _Log:
    def __init__(self, c: DisaggCluster) -> None:
        self._c = c

    def columns(self) -> dict[str, np.ndarray]:
        return self._c.iteration_log()


class _Records:
    """The system's per-request records as one engine's (global ids), for :func:`summarize` and
    :func:`request_table`: arrival-side records (first scheduling, first token, prefill) from the
    prefill replica, completion and generated tokens from the decode replica once the request
    reached it; a request between the two (waiting for room or in transfer) is running."""

    def __init__(self, c: DisaggCluster) -> None:
        engines, n = c.engines, len(c.workload)
        self.workload, self.seed, self.latency = c.workload, c.seed, engines[0].latency
        self.state = np.zeros(n, dtype=np.int8)
        self.first_scheduled_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.completion_s = np.full(n, np.nan)
        for name in ("prefilled", "generated", "preemptions", "recomputed_tokens", "cached_tokens"):
            setattr(self, name, np.zeros(n, dtype=np.int64))
        self.reject_reason: dict[int, str] = {}
        rows = [(r, e, c._rows[r].gids[:c._rows[r].n]) for r, e in enumerate(engines)]
        rows = [(e, gids, np.arange(len(gids)), (c.prefill_replica[gids] == r) & (c._local_p[gids] == np.arange(len(gids))))
                for r, e, gids in rows if len(gids)]
        out = c.workload.output_tokens
        for e, gids, loc, first in rows:  # prefill (or whole) rows first
            g1, l1 = gids[first], loc[first]
            self.state[g1] = e.state[l1]
            for name in ("first_scheduled_s", "first_token_s", "completion_s", "prefilled", "generated"):
                getattr(self, name)[g1] = getattr(e, name)[l1]
            split = c.disaggregated[g1] & (out[g1] > 1) & (e.state[l1] == DONE)
            self.completion_s[g1[split]] = np.nan
            self.state[g1[split]] = RUNNING  # between the pools until the decode replica has it
            if c.first_token == "transfer":  # delivered with the hand-off (nan until it happens)
                self.first_token_s[g1[split]] = c.transfer_end_s[g1[split]]
            for name in ("preemptions", "recomputed_tokens", "cached_tokens"):
                np.add.at(getattr(self, name), gids, getattr(e, name)[loc])
            for i, why in e.reject_reason.items():
                self.reject_reason[int(gids[i])] = why
        for e, gids, loc, first in rows:  # then the decode rows
            second = ~first
            g2, l2 = gids[second], loc[second]
            self.state[g2] = e.state[l2]
            self.completion_s[g2] = e.completion_s[l2]
            self.generated[g2] = e.generated[l2]
        merge_totals(self, engines)
        self.log = _Log(c)
        self.engine = self

    @property
    def requests(self) -> dict[str, np.ndarray]:
        return request_table(self)

    def request_seconds(self, t: float) -> float:
        """Request-seconds spent in the system up to ``t`` by the requests arrived by then
        (``t = inf``: every request to its end, an unfinished one to the last replica clock)."""
        arr = self.workload.arrival_s
        if math.isinf(t):
            end = np.where(np.isfinite(self.completion_s), self.completion_s, self.clock)
            end = np.where(self.state == REJECTED, arr, end)
            return float((end - arr)[self.state != 0].sum())
        came = arr <= t
        end = np.where(np.isfinite(self.completion_s) & (self.completion_s <= t), self.completion_s, t)
        end = np.where(self.state == REJECTED, arr, end)
        return float((end - arr)[came].sum())


__all__ = ["FIRST_TOKEN", "ROLES", "Decider", "DisaggCluster", "PairRouter", "transfer_model_of"]
