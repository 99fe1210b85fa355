"""The cluster level: N replicas of the engine behind a router that places each arrival.

Each replica is an :class:`~llmsched_gym.core.engine.Engine` with its own KV and prefix cache,
latency model (GPU, model and tensor parallelism may differ between replicas) and replica
scheduler. A :class:`Router` sees every replica through a :class:`ClusterView` and picks one for
each arriving request; the replica's engine receives it at run time (:meth:`Engine.extend`), with
ids of its own (``local id -> global id`` in :attr:`Cluster.ids`), so a replica's memory is
proportional to what it serves.

What the router sees (the load signals):

* ``refresh_s = 0`` (exact): every arrival is routed at its arrival time with each replica as it
  stood at its last iteration boundary before then (no look-ahead: a replica in the middle of an
  iteration shows the state in which it started it; a fast-forwarded decode run counts as one
  iteration).
* ``refresh_s > 0`` (stale, the default 0.1 s as vLLM's metrics and BLIS's snapshots): the
  signals are a snapshot taken at the start of each ``refresh_s`` window, plus the router's own
  record of what it placed since (``waiting``, ``outstanding`` and ``waiting_tokens`` count the
  requests routed since the snapshot). All arrivals of a window are routed at its start, so each
  replica then runs through the window knowing its arrivals and fast-forwards as one engine does.

A replica learns of a request only when it is routed; an idle plan (``BatchPlan.wait``) waits at
most until the next routing point, where the replica is asked again. A fast-forwarded decode run
is not cut at routing points: it runs to its own end (a completion, a memory limit, the next
arrival routed to the replica) and a routing point only reads, in O(log k), the signals the
replica would show there (:meth:`Engine.pending_to`); its rows are applied when the replica next
has to act, with the results of a run stepped to every routing point (``Cluster.defer_runs``).

With one replica the router has no choice: the whole workload goes to it at once and the run
equals the plain engine's bit for bit (``tests/test_cluster.py`` checks every golden scenario). A load-blind router (random,
round-robin: ``Router.reads_load = False``) needs no signals, so :meth:`Cluster.run` routes all
its requests at once and runs each replica alone, at a plain engine's cost per request.

Live migration (``migration=``, :class:`Migration`: Llumnix, Sun et al., OSDI 2024) moves
decoding requests from the least free replicas to the freest ones every ``interval_s``, the KV
transfer time charged.

Results: :meth:`Cluster.summary` has the engine's summary keys for the cluster as a whole (as if
one server answered every request; ``busy_frac`` and the KV fractions are the replicas' mean)
plus ``cluster``: per-replica summaries, the requests each replica received, the prefix hit rate
and the load imbalance (max over mean of the requests routed, and of the busy time).
:meth:`Cluster.iteration_log` is every replica's log with a ``replica`` column.
"""

from __future__ import annotations

import bisect
import gc
import math
from collections.abc import Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np

from llmsched_gym.config import ConfigError
from llmsched_gym.core.buffers import resized
from llmsched_gym.core.engine import _FEW, MIGRATED, Engine, EngineConfig
from llmsched_gym.core.information import CLAIRVOYANT, GuardedWorkload, information_of
from llmsched_gym.core.kv import KVCache
from llmsched_gym.core.latency import LatencyModel
from llmsched_gym.core.metrics import summarize
from llmsched_gym.core.records import request_table
from llmsched_gym.core.request import Workload
from llmsched_gym.core.scheduler import Scheduler
from llmsched_gym.core.transfer import GB

GC_THRESHOLD0 = 1_000_000
"""The youngest generation's collection threshold during :meth:`Cluster.run` (Python's default: 700):
a bound on the cyclic garbage a run can hold (the simulator makes none), not a schedule of work."""


@contextmanager
def few_collections() -> Iterator[None]:
    """Within: the cyclic garbage collector's youngest generation collects every
    :data:`GC_THRESHOLD0` net allocations at the least (restored after; see :meth:`Cluster.run`)."""
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], GC_THRESHOLD0), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)

DEFAULT_REFRESH_S = 0.1
"""Load-signal refresh interval of the stale mode (vLLM publishes its metrics every 100 ms; BLIS
refreshes its router's snapshots at the same rate)."""


class Router:
    """Base class of every router (the cluster-level policy).

    Subclasses set ``name`` and ``params`` (keyword parameters with their defaults) and implement
    :meth:`route`. A router may keep state of its own (a round-robin counter, an approximate
    prefix tree built from its routing history); :meth:`reset` starts it afresh, with its own
    seeded ``rng``.
    """

    name: ClassVar[str] = "router"
    params: ClassVar[dict[str, Any]] = {}
    reads_load: ClassVar[bool] = True
    """False for a load-blind router (its choice never depends on the view: random, round-robin):
    :meth:`Cluster.run` then routes every request at once and runs each replica alone to its end,
    which gives the same result as routing window by window, at a plain engine's cost."""

    def __init__(self, **params: Any) -> None:
        unknown = set(params) - set(self.params)
        if unknown:
            raise ConfigError(f"router.{sorted(unknown)[0]}: unknown parameter of {self.name!r} "
                              f"(allowed: {', '.join(self.params) or 'none'})")
        for key, default in self.params.items():
            setattr(self, key, params.get(key, default))

    def reset(self, n_replicas: int, rng: np.random.Generator) -> None:
        """Called once before a run."""
        self.n_replicas = n_replicas
        self.rng = rng

    def route(self, rid: int, view: ClusterView) -> int:
        """The replica (0 .. N-1) that serves request ``rid`` (a global id)."""
        raise NotImplementedError


@dataclass
class Replica:
    """One replica: engine settings, batch-time model and replica scheduler."""

    config: EngineConfig
    latency: LatencyModel
    scheduler: Scheduler


class ClusterView:
    """What a router reads: per-replica load signals (NumPy arrays indexed by replica) and
    per-request queries.

    ========================  ==============================================================
    ``now``                   the routing time (s)
    ``n_replicas``            N
    ``waiting``               requests queued at each replica (snapshot + routed since)
    ``running``               requests in each replica's running set (snapshot)
    ``outstanding``           ``waiting + running``: routed and not finished
    ``waiting_tokens``        prompt tokens queued at each replica, to prefill
    ``kv_used``               KV tokens in use (snapshot; prefix-cache blocks held by running
                              requests count, idle cached blocks do not)
    ``kv_capacity``           KV capacity in tokens
    ``routed``                requests routed to each replica so far
    ``workload``              the cluster's workload (global ids); ``output_tokens`` is hidden
                              by the information model as in :class:`EngineView`
    ``prompt_tokens``         prompt length per request (global ids)
    ========================  ==============================================================

    ``prefix_hit(rid)`` gives, per replica, the prompt tokens of ``rid`` found in its prefix
    cache now (what the replica's KV events would tell llm-d's precise scorer);
    ``block_hashes(rid)`` the request's chained prompt-block hashes (the keys of an approximate
    prefix index); ``can_take(rid)`` the replicas whose KV can hold the request at all.
    """

    def __init__(self, cluster: Cluster) -> None:
        self._c = cluster
        n = len(cluster.replicas)
        self.n_replicas = n
        self.now = 0.0
        self.waiting = np.zeros(n, dtype=np.int64)
        self.running = np.zeros(n, dtype=np.int64)
        self.outstanding = np.zeros(n, dtype=np.int64)
        self.waiting_tokens = np.zeros(n, dtype=np.int64)
        self.kv_used = np.zeros(n, dtype=np.int64)
        self.kv_capacity = np.array([e.kv.capacity_tokens for e in cluster.engines], dtype=np.int64)
        self.routed = np.zeros(n, dtype=np.int64)
        self.block_size = np.array([e.kv.block_size for e in cluster.engines], dtype=np.int64)
        # can_take_all's bound (capacities are whole blocks; a pool of no replicas takes nothing)
        self._fit_min = int(self.kv_capacity.min()) if n else -1
        wl = cluster.workload
        info = information_of(wl)
        self.workload = wl if info == CLAIRVOYANT else GuardedWorkload(wl, info)
        self.prompt_tokens = cluster.workload.prompt_tokens

    @property
    def predicted_output(self) -> np.ndarray:
        return self.workload.predicted_output

    def block_hashes(self, rid: int, block_size: int | None = None) -> list[int]:
        """Chained hashes of ``rid``'s full shareable prompt blocks (blocks of ``block_size``,
        default replica 0's), as the replicas' prefix caches key them. A key names the prompt up
        to its block's end whatever the block size, so blocks of a multiple of replica 0's size
        are every k-th of its keys (an approximate index of 64-token blocks over 16-token replicas
        hashes nothing again)."""
        base = int(self.block_size[0])
        size = base if block_size is None else block_size
        if size % base:
            return self._c.hasher(size).block_hashes(rid)
        k = size // base
        hashes = self._c.hasher(base).block_hashes(rid)
        return hashes if k == 1 else hashes[k - 1::k]

    def prefix_hit(self, rid: int) -> np.ndarray:
        """Per replica: prompt tokens of ``rid`` its prefix cache holds now (0 without prefixes)."""
        out = np.zeros(self.n_replicas, dtype=np.int64)
        if not self._c.has_prefix:
            return out
        cap = int(self.prompt_tokens[rid]) - 1
        engines = self._c.engines
        index = self._c.prefix_roots() if isinstance(self._c, Cluster) else None
        if index is not None:  # only the replicas holding the prompt's first block can hit it
            bs = int(self.block_size[0])
            hashes = self.block_hashes(rid, bs)
            for r in mask_bits(index.roots.get(hashes[0], 0) if hashes else 0):
                kv = engines[r].kv
                m = kv.match_hashes(hashes) * bs
                out[r] = min(m, cap) if kv.cap_prompt_minus_one else m
            return out
        for r, e in enumerate(engines):
            kv = e.kv
            if kv.enabled:
                m = kv.match_hashes(self.block_hashes(rid, kv.block_size)) * kv.block_size
                out[r] = min(m, cap) if kv.cap_prompt_minus_one else m
        return out

    def freeness(self) -> np.ndarray:
        """Per replica, Llumnix's freeness ``(M - sum V) / B`` (Sun et al., OSDI 2024, section 4.4):
        KV capacity less the KV in use and the prompt tokens queued, per running request (at least
        one), in tokens: roughly the decode steps the replica's batch can still take."""
        return (self.kv_capacity - self.kv_used - self.waiting_tokens) / np.maximum(self.running, 1)

    def can_take(self, rid: int) -> np.ndarray:
        """Per replica: its KV capacity holds ``rid``'s prompt and output (else it would reject it)."""
        wl = self._c.workload
        need = -(-(int(wl.prompt_tokens[rid]) + int(wl.output_tokens[rid])) // self.block_size)
        return need * self.block_size <= self.kv_capacity

    def can_take_all(self, rid: int) -> bool:
        """``can_take(rid).all()`` without the per-replica arrays: ``rid``'s prompt and output fit
        the smallest capacity (rounded down to whole blocks)."""
        wl = self._c.workload
        return int(wl.prompt_tokens[rid]) + int(wl.output_tokens[rid]) <= self._fit_min


def mask_bits(mask: int) -> Iterator[int]:
    """The replicas of a bit mask (bit ``r`` for replica ``r``), lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


class _Watch:
    """One replica's hook into :class:`_PrefixRoots` (its bit)."""

    __slots__ = ("roots", "bit", "keep")

    def __init__(self, roots: dict[int, int], bit: int) -> None:
        self.roots, self.bit, self.keep = roots, bit, ~bit

    def rooted(self, hsh: int) -> None:
        """A chain's first block entered the replica's cache."""
        roots = self.roots
        roots[hsh] = roots.get(hsh, 0) | self.bit

    def unrooted(self, hsh: int) -> None:
        """A chain's first block left the replica's cache."""
        roots = self.roots
        v = roots[hsh] & self.keep
        if v:
            roots[hsh] = v
        else:
            del roots[hsh]


class _PrefixRoots:
    """Which replica caches which chain's first block: ``roots[hash]`` has bit ``r`` set when
    replica ``r``'s prefix cache holds that block, kept current by each cache's ``watch`` hook.

    A replica hits none of a prompt unless it holds the prompt's first block, so
    :meth:`ClusterView.prefix_hit` asks only those replicas' caches (each O(runs on the prompt's
    chain)); under prefix-aware routing that is about one replica a request at 8 or 64 replicas.
    The index changes only when a chain's first block is cached or evicted; an index of every
    cached block would change with every block (on the Mooncake trace about 600 a request each
    way)."""

    def __init__(self, engines: Sequence[Engine]) -> None:
        self.roots: dict[int, int] = {}
        for r, e in enumerate(engines):
            w = e.kv.watch = _Watch(self.roots, 1 << r)
            for h in e.kv.cached_roots():
                w.rooted(h)


_ROW_FIELDS = ("arrival_s", "prompt_tokens", "output_tokens", "predicted_output", "client", "task_class",
               "type_id", "ttft_slo_s", "tpot_slo_s")
# copied when a row is added (the engine reads them at once, from the buffers: ``Engine.extend``); the
# others are copied when first read (many runs never read them)
_COPIED = ("arrival_s", "prompt_tokens", "output_tokens")


class _ReplicaWorkload(Workload):
    """A replica's :class:`Workload`, grown in place by :class:`_Rows` (built without
    ``__init__``: the global rows were validated). Each array is a view of the first ``n`` rows
    of a :class:`_Rows` buffer, cut when first read after rows were added, so a routed request
    re-slices only the fields read since the previous one. ``buffers`` (the buffers by field)
    lets the engine read a new row's arrival, prompt and output without cutting a view
    (:meth:`Engine.extend`)."""

    def __len__(self) -> int:
        return self._rows.n

    def with_(self, **changes: Any) -> Workload:
        """A plain :class:`Workload` of these rows with ``changes`` (its fields cannot be set)."""
        kw = {f.name: getattr(self, f.name) for f in fields(Workload)}
        kw.update(changes)
        return Workload(**kw)


def _cut_property(name: str) -> property:
    def get(w: _ReplicaWorkload) -> np.ndarray:
        rows = w._rows
        v = rows.cut.get(name)
        if v is None:
            if name in rows.filled:
                rows.fill(name)
            v = rows.cut[name] = rows.bufs[name][:rows.n]
        return v
    return property(get, doc=f"``{name}`` of the replica's requests.")


for _f in _ROW_FIELDS:
    setattr(_ReplicaWorkload, _f, _cut_property(_f))


class _Rows:
    """A replica's requests: growable copies of the global workload's rows (doubling buffers), seen
    through one :class:`_ReplicaWorkload` (:attr:`workload`) whose arrays are views of the
    buffers' first :attr:`n` rows."""

    __slots__ = ("n", "gids", "bufs", "prefix", "wl", "filled", "cut", "workload", "_arrival", "_prompt", "_output",
                 "_g_arrival", "_g_prompt", "_g_output", "_g_prefix")

    def __init__(self, wl: Workload) -> None:
        self.n = 0
        self.gids = np.zeros(64, dtype=np.int64)
        self.bufs = {f: np.zeros(64, dtype=getattr(wl, f).dtype) for f in _COPIED}  # the others at their first fill
        self.prefix: list | None = [] if wl.prefix is not None else None
        self.wl = wl
        # the global columns of _COPIED, and their buffers (set by _grow): what append touches
        self._g_arrival, self._g_prompt, self._g_output = wl.arrival_s, wl.prompt_tokens, wl.output_tokens
        self._g_prefix = wl.prefix
        self._arrival, self._prompt, self._output = self.bufs["arrival_s"], self.bufs["prompt_tokens"], self.bufs["output_tokens"]
        self.filled = {f: 0 for f in _ROW_FIELDS if f not in _COPIED}  # rows copied so far
        self.cut: dict[str, np.ndarray] = {}  # the workload's views cut since rows were last added
        w = self.workload = object.__new__(_ReplicaWorkload)
        w._rows = self
        w.prefix = self.prefix
        w.client_weight = wl.client_weight
        w.meta = wl.meta
        w.buffers = self.bufs

    def add(self, gids: list[int], arrivals: list[float] | None = None) -> Workload:
        """Append the rows of global ids ``gids`` (with ``arrivals`` instead of theirs: migrated
        requests arrive when their KV transfer ends); returns :attr:`workload`."""
        k = len(gids)
        if k <= _FEW:  # a few rows: one by one, with scalars (the same buffer values)
            for j, g in enumerate(gids):
                self.append(g, None if arrivals is None else arrivals[j])
            return self.workload
        n0 = self.n
        n = n0 + k
        if n > len(self.gids):
            self._grow(n)
        idx = np.asarray(gids, dtype=np.int64)
        self.gids[n0:n] = idx
        self._arrival[n0:n] = self._g_arrival[idx] if arrivals is None else arrivals
        self._prompt[n0:n] = self._g_prompt[idx]
        self._output[n0:n] = self._g_output[idx]
        if self.prefix is not None:
            p = self._g_prefix
            self.prefix.extend(p[g] for g in gids)
        self.n = n
        self.cut.clear()  # the views are short now: cut again when next read
        return self.workload

    def append(self, g: int, arrival: float | None = None) -> Workload:
        """``add([g], [arrival])``: one row, the usual case of a routed request, with scalars
        (the same buffer values, no index arrays)."""
        n0 = self.n
        if n0 == len(self.gids):
            self._grow(n0 + 1)
        self.gids[n0] = g
        self._arrival[n0] = self._g_arrival[g] if arrival is None else arrival
        self._prompt[n0] = self._g_prompt[g]
        self._output[n0] = self._g_output[g]
        if self.prefix is not None:
            self.prefix.append(self._g_prefix[g])
        self.n = n0 + 1
        if self.cut:
            self.cut.clear()  # the views are short now: cut again when next read
        return self.workload

    def _grow(self, n: int) -> None:
        """Buffers of at least ``n`` rows (doubling: a row costs O(1) amortised)."""
        cap = max(n, 2 * len(self.gids))
        self.gids = resized(self.gids, cap)
        b = self.bufs = self.workload.buffers = {f: resized(b, cap) for f, b in self.bufs.items()}
        self._arrival, self._prompt, self._output = b["arrival_s"], b["prompt_tokens"], b["output_tokens"]

    def fill(self, name: str) -> None:
        """Copy field ``name``'s rows added since it was last filled (a field not in ``_COPIED``;
        its buffer is made at the first fill, so that a run which never reads it never grows it)."""
        k, n = self.filled[name], self.n
        if name not in self.bufs:
            self.bufs[name] = np.zeros(len(self.gids), dtype=getattr(self.wl, name).dtype)
        if k + 1 == n:  # one row (read after every routed request): a scalar
            self.bufs[name][k] = getattr(self.wl, name)[self.gids[k]]
            self.filled[name] = n
        elif k < n:
            self.bufs[name][k:n] = getattr(self.wl, name)[self.gids[k:n]]
            self.filled[name] = n


@dataclass(frozen=True)
class Migration:
    """Live migration of running requests between replicas (Sun et al., "Llumnix: Dynamic
    Scheduling for Large Language Model Serving", OSDI 2024, sections 4.4 and 4.5).

    Every ``interval_s`` of simulated time (Llumnix's ``--polling-interval``, 0.05 s) the replicas
    are sorted by freeness ``F = (M - sum V) / B`` (:class:`ClusterView.freeness`: KV capacity
    less the KV in use and the prompt tokens queued, per running request) and paired, the least
    free with the freest, the second least free with the second freest, and so on; a pair whose
    freeness gap exceeds ``threshold`` (tokens per running request) migrates one request from the
    less free replica: its decoding request holding the least KV (Llumnix's default request
    policy prefers short sequences: the least to copy) that the destination can hold now, unless
    the move would leave the destination less free than the source (the request would come back).

    The KV transfer (:mod:`llmsched_gym.core.transfer`: ``base_s`` plus the request's KV bytes,
    ``kv_bytes_per_token`` of the source's engine settings, over ``bandwidth_gb_s`` on
    ``min(tp, kv heads)`` links) is charged in the simple, single-stage form: the request leaves
    the source at its iteration boundary (its KV freed there), makes no progress during the
    transfer, holds its KV blocks on the destination from the start of the transfer, and joins
    the destination's running set, decoding, when the transfer ends. Llumnix overlaps the copy
    with decoding on the source (multi-stage migration: only the last stage, a few blocks, stops
    the request), so its requests lose less time than ours and the source keeps the KV until the
    last stage; both are departures of this model.
    """

    interval_s: float = 0.05
    threshold: float = 1000.0
    bandwidth_gb_s: float = 25.0
    base_s: float = 5e-5
    tp: int = 1

    @classmethod
    def of(cls, spec: Migration | dict[str, Any] | None) -> Migration | None:
        """From ``{"interval_s": .., "threshold": .., "bandwidth_gb_s": .., "base_s": .., "tp": ..}``
        (``None``: no migration); one-line errors name ``cluster.migration.<field>``."""
        if spec is None or isinstance(spec, Migration):
            return spec
        if not isinstance(spec, dict):
            raise ConfigError(f"cluster.migration: expected a mapping of migration settings, got {spec!r}")
        allowed = [f for f in cls.__dataclass_fields__]
        unknown = sorted(set(spec) - set(allowed))
        if unknown:
            raise ConfigError(f"cluster.migration.{unknown[0]}: unknown setting (allowed: {', '.join(allowed)})")
        for key, ok, want in (("interval_s", lambda v: v > 0, " > 0"), ("threshold", lambda v: True, ""),
                              ("bandwidth_gb_s", lambda v: v > 0, " > 0"), ("base_s", lambda v: v >= 0, " >= 0")):
            v = spec.get(key, getattr(cls, key))
            if not (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and ok(v)):
                raise ConfigError(f"cluster.migration.{key}: expected a finite number{want}, got {v!r}")
        tp = spec.get("tp", 1)
        if not (isinstance(tp, int) and not isinstance(tp, bool) and tp >= 1):
            raise ConfigError(f"cluster.migration.tp: expected an integer >= 1, got {tp!r}")
        return cls(**{k: (int(v) if k == "tp" else float(v)) for k, v in spec.items()})

    def transfer_s(self, tokens: int, kv_bytes_per_token: int) -> float:
        """Seconds to copy ``tokens`` tokens of KV."""
        # core/transfer.py's model with the bytes per token of the engine settings: tp links in parallel
        return self.base_s + int(tokens) * int(kv_bytes_per_token) / self.tp / (self.bandwidth_gb_s * GB)


class Cluster:
    """N replicas behind a router (see the module docstring).

    :param workload: the requests (global ids = rows).
    :param replicas: one :class:`Replica` per replica (settings may differ between replicas).
    :param router: the routing policy.
    :param seed: seeds replica 0's engine as :class:`Engine` would (so one replica is the plain
        engine), the other replicas' engines from ``(seed, r)``, and the router's ``rng``.
    :param refresh_s: load-signal refresh interval (0 = exact, at every arrival).
    :param migration: live migration between replicas (:class:`Migration` or its settings as a
        dict; ``None``: none).
    """

    def __init__(self, workload: Workload, replicas: Sequence[Replica], router: Router, seed: int = 0,
                 refresh_s: float = DEFAULT_REFRESH_S, migration: Migration | dict[str, Any] | None = None) -> None:
        if not replicas:
            raise ConfigError("cluster.replicas: expected at least one replica, got none")
        if not (isinstance(refresh_s, int | float) and math.isfinite(refresh_s) and refresh_s >= 0):
            raise ConfigError(f"cluster.refresh_s: expected a number of seconds >= 0, got {refresh_s!r}")
        if len(replicas) > 1:
            for r, rep in enumerate(replicas):
                if not rep.scheduler.grows:
                    raise ConfigError(f"cluster.replicas[{r}].policy: {rep.scheduler.name!r} keeps per-request arrays "
                                      "sized when it starts, so it cannot serve a replica whose requests arrive at "
                                      "run time; pick another policy (fcfs, vllm-v1, sarathi, sjf, lpm, ...)")
        self.workload = workload
        self.replicas = list(replicas)
        self.router = router
        self.seed = seed
        self.refresh_s = float(refresh_s)
        self.has_prefix = workload.has_prefix
        self._rows = [_Rows(workload) for _ in self.replicas]
        self.engines = [Engine(rows.workload, r.config, r.latency, r.scheduler, seed=_replica_seed(seed, i))
                        for i, (r, rows) in enumerate(zip(self.replicas, self._rows, strict=True))]
        self.placement = np.full(len(workload), -1, dtype=np.int64)
        """The replica each request was routed to (-1: not routed: it arrives after the horizon)."""
        self._hashers: dict[int, KVCache] = {}
        if len(self.engines) > 1 and self.has_prefix:
            for e in self.engines:  # one cache of prompt-head hashes: the replicas' dicts share their int keys
                e.kv.share_head_hashes(self.hasher(e.kv.block_size))
        self._roots: _PrefixRoots | None = None
        self._handover: dict[int, list[int]] = {}  # global id -> block hashes the router computed
        self.view = ClusterView(self)
        router.reset(len(self.replicas), np.random.default_rng(np.random.SeedSequence([seed, 0x0A7E])))
        self.migration = Migration.of(migration)
        self.migrations = np.zeros(len(workload), dtype=np.int64)
        """Times each request was migrated."""
        self.migration_log: list[tuple[float, int, int, int, float]] = []
        """Every migration: (start s, global id, source, destination, transfer s)."""
        self._inflight: list[tuple[float, int, int, tuple]] = []  # (arrival at dst, gid, dst, moved)
        self.defer_runs = True
        """Decode runs cross routing points uncut (:meth:`Engine.pending_to`; without migration).
        ``False`` steps every replica to each routing point: the same results, bit for bit, at
        more cost (the reference the tests compare with)."""
        self.done = False

    @property
    def ids(self) -> list[np.ndarray]:
        """Per replica: the global id of each of its local ids."""
        return [rows.gids[:rows.n] for rows in self._rows]

    def hasher(self, block_size: int) -> KVCache:
        """A prefix-hash index of the global workload (no memory accounting: its hashes only)."""
        return prefix_hasher(self._hashers, self.workload, block_size)

    def prefix_roots(self) -> _PrefixRoots | None:
        """Which replicas' prefix caches hold each chain's first block (built at the first call,
        then kept by the caches' ``watch`` hooks); ``None`` when the replicas' block sizes differ
        (a prompt's blocks, and so its first block's hash, depend on the block size)."""
        h = self._roots
        if h is None and len({e.kv.block_size for e in self.engines}) == 1:
            h = self._roots = _PrefixRoots(self.engines)
        return h

    # ---- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        """Route every arrival with the router and run every replica to the end.

        Python's cyclic garbage collector runs its youngest generation every 1,000,000 net
        allocations instead of 700 meanwhile (restored after). A run creates no reference cycles
        (a collection after a run with the collector off finds nothing, 16 replicas, lor, llm-d,
        sglang-cache-aware, llumnix), so collections during it only re-traverse live objects:
        every 50,000 they cost about 7 us a request at 64 replicas x 300 requests and 12 at
        64 x 1,000 (measured with ``gc.callbacks``), every 1,000,000 none but the one after the
        run; peak memory was the same (64 x 1,000: 228 MB). The default 700 cost a fifth of the
        CPU time (about 390 vs 310 us a request at 64 x 1,000, an older engine)."""
        with few_collections():
            if not getattr(self.router, "reads_load", True) and len(self.engines) > 1 and self.migration is None:
                self._run_blind()
                return
            steps, route, view = self.decisions(), self.router.route, self.view
            try:
                rid = next(steps)
                while True:
                    rid = steps.send(route(rid, view))
            except StopIteration:
                pass

    def _run_blind(self) -> None:
        """A load-blind router's run: every request (up to the horizon) routed in arrival order,
        each replica given its requests at once and run alone (no window stepping)."""
        wl, engines, view, route = self.workload, self.engines, self.view, self.router.route
        horizon = min((e.config.horizon_s for e in engines if e.config.horizon_s is not None), default=math.inf)
        arrival = wl.arrival_s
        n = int(np.searchsorted(arrival, horizon, side="right"))
        batches: list[list[int]] = [[] for _ in engines]
        for rid in range(n):
            view.now = float(arrival[rid])
            batches[self._place(rid, route(rid, view))].append(rid)
        for r, (e, b) in enumerate(zip(engines, batches, strict=True)):
            if b:
                self._give(r, b)
            e.more_from = None
            e.run()
        self.done = True

    def _place(self, rid: int, r: Any) -> int:
        """Record that ``rid`` goes to replica ``r`` (checked) in the placement and the view."""
        view = self.view
        n_rep = view.n_replicas
        if not ((type(r) is int or (isinstance(r, int | np.integer) and not isinstance(r, bool))) and 0 <= r < n_rep):
            raise ConfigError(f"router {self.router.name!r}: route({rid}) returned {r!r}, "
                              f"not a replica in 0..{n_rep - 1}")
        r = int(r)
        self.placement[rid] = r
        view.waiting[r] += 1
        view.outstanding[r] += 1
        view.routed[r] += 1
        view.waiting_tokens[r] += int(self.workload.prompt_tokens[rid])
        for bs, h in self._hashers.items():  # the router has read its hashes: memory follows the live requests
            hashes = h.forget(rid)
            if hashes is not None and bs == self.engines[r].kv.block_size:
                self._handover[rid] = hashes  # the replica's cache will not compute them again
        return r

    def decisions(self) -> Generator[int, int, None]:
        """The run as a generator: it yields the global id of each request to route (the view is
        then current) and takes the chosen replica back through ``send``; it returns when every
        replica has finished. :meth:`run` drives it with the router; the routing env drives it
        with an agent. With one replica nothing is yielded (there is no choice)."""
        wl, engines = self.workload, self.engines
        n = len(wl)
        if len(engines) == 1:  # no choice to make: the whole workload at once, as the plain engine
            if n:
                self.placement[:] = 0
                self.view.routed[0] = n
                engines[0].extend(self._rows[0].add(list(range(n))))
            engines[0].run()
            self.done = True
            return
        arrival = wl.arrival_s.tolist()
        horizon = min((e.config.horizon_s for e in engines if e.config.horizon_s is not None), default=math.inf)
        view, n_rep, mig = self.view, len(engines), self.migration
        if mig is None and self.defer_runs:  # decode runs cross routing points uncut (migration reads the engines)
            for e in engines:
                e.defer_ff = True
        n_routed = bisect.bisect_right(arrival, horizon)
        due = mig.interval_s if mig is not None else math.inf  # the next migration round
        i = 0
        start, j = self._window(arrival, 0, n_routed)
        given: list[list[int]] | None = None  # routed, handed over when each replica is next visited
        while True:
            busy = mig is not None and self._busy(horizon)
            if start == math.inf and not busy:
                break
            tick = self._grid(due) if busy else start if mig is not None else math.inf
            at_tick = tick <= start
            stop = tick if at_tick else start
            if at_tick:
                due = stop + mig.interval_s
            self._advance(stop, given)
            given = None
            view.now = stop
            if at_tick:
                self._migrate(stop)
            batches: list[list[int]] = [[] for _ in range(n_rep)]
            if stop == start:
                for rid in range(i, j):
                    r = yield rid
                    batches[self._place(rid, r)].append(rid)
                i = j
                start, j = self._window(arrival, i, n_routed)
            if mig is not None:
                self._extend(batches, min(start, self._grid(due)))
            else:
                given = batches
        for r, e in enumerate(engines):
            if given and given[r]:
                self._give(r, given[r])
            e.more_from = None
            e.defer_ff = False
            e.run()
        self.done = True

    def _window(self, arrival: list[float], i: int, n: int) -> tuple[float, int]:
        """The next routing point at or after request ``i`` and the end (exclusive) of its requests:
        the start of the ``refresh_s`` window holding ``arrival[i]`` (robust to rounding), or the
        arrival itself in exact mode; ``(inf, i)`` when no request is left to route."""
        if i >= n:
            return math.inf, i
        t = arrival[i]
        if self.refresh_s > 0:
            dt = self.refresh_s
            k = math.floor(t / dt)
            if k * dt > t:
                k -= 1
            if (k + 1) * dt <= t:
                k += 1
            return k * dt, min(max(bisect.bisect_left(arrival, (k + 1) * dt, lo=i), i + 1), n)
        return t, min(bisect.bisect_right(arrival, t, lo=i), n)

    def _grid(self, t: float) -> float:
        """``t``, or in the stale mode the first window start at or after it (migration rounds
        happen at routing points, so that every replica's requests stay in arrival order)."""
        if self.refresh_s <= 0 or t == math.inf:
            return t
        dt = self.refresh_s
        k = math.ceil(t / dt)
        if (k - 1) * dt >= t:
            k -= 1
        if k * dt < t:
            k += 1
        return k * dt

    def _busy(self, horizon: float) -> bool:
        """Some replica still has work (migration goes on until none has) or a transfer is in flight."""
        return bool(self._inflight) or any(
            not e.done and (e.waiting or e.running or e.next_idx < e.n) and e.clock < horizon for e in self.engines)

    def _extend(self, batches: list[list[int]], until: float) -> None:
        """Give each replica the requests routed to it now and the migrated requests whose transfer
        ends before ``until`` (the next stop), in arrival order."""
        engines = self.engines
        arrive: list[list[tuple[float, int, int, tuple | None]]] | None = None
        if self._inflight:
            due = [x for x in self._inflight if x[0] < until]
            if due:
                self._inflight = [x for x in self._inflight if x[0] >= until]
                arrive = [[] for _ in engines]
                for t, g, d, moved in due:
                    arrive[d].append((t, 1, g, moved))
        for r, b in enumerate(batches):
            if arrive is None or not arrive[r]:
                if b:
                    self._give(r, b)
                continue
            arr = self.workload.arrival_s
            items = sorted([(float(arr[g]), 0, g, None) for g in b] + arrive[r], key=lambda x: (x[0], x[1]))
            n0 = engines[r].n
            self._give(r, [x[2] for x in items], [x[0] for x in items])
            for k, (_, _, _, moved) in enumerate(items):
                if moved is not None:
                    engines[r].migrate_in(n0 + k, moved)

    def _give(self, r: int, gids: list[int], arrivals: list[float] | None = None) -> None:
        """Append requests ``gids`` (global ids, in arrival order) to replica ``r``'s engine, with the
        block hashes the router computed for them."""
        e = self.engines[r]
        n0 = e.n
        e.extend(self._rows[r].add(gids, arrivals))
        hand = self._handover
        if hand:
            for k, g in enumerate(gids):
                hashes = hand.pop(g, None)
                if hashes is not None:
                    e.kv.adopt_hashes(n0 + k, hashes)

    def _migrate(self, now: float) -> None:
        """One migration round (see :class:`Migration`): pair the replicas by freeness and move one
        decoding request per pair whose gap exceeds the threshold."""
        mig, view, engines = self.migration, self.view, self.engines
        free = view.freeness()
        order = np.argsort(free, kind="stable")
        for a in range(len(engines) // 2):
            s, d = int(order[a]), int(order[-1 - a])
            if free[d] - free[s] <= mig.threshold:
                break
            src, dst = engines[s], engines[d]
            if _stopped(src, now) or _stopped(dst, now):  # nothing moves in or out of a stopped replica
                continue
            dkv = dst.kv
            best = None
            for rid in src.running:
                if (src.prefilled[rid] < src.prefill_target[rid] or src.swapped[rid]
                        or src.generated[rid] + 1 > src._output[rid]):
                    continue
                k = int(src.kv_tokens[rid])
                if best is None or k < best[1]:
                    best = (rid, k)
            if best is None:
                continue
            rid, k = best
            g = int(self._rows[s].gids[rid])
            need = dkv.blocks(k)
            whole = dkv.blocks(int(self.workload.prompt_tokens[g]) + int(self.workload.output_tokens[g]))
            if whole > dkv.capacity_blocks or dkv.used_blocks + need > dkv.capacity_blocks:
                continue
            # the move must not swap the pair's order (else the request would come back next round)
            after_s = (view.kv_capacity[s] - view.kv_used[s] + src.kv.blocks(k) * src.kv.block_size
                       - view.waiting_tokens[s]) / max(int(view.running[s]) - 1, 1)
            after_d = (view.kv_capacity[d] - view.kv_used[d] - need * dkv.block_size
                       - view.waiting_tokens[d]) / (int(view.running[d]) + 1)
            if after_d < after_s:
                continue
            dkv.make_room(need)
            dkv.used_blocks += need  # the destination holds the KV from the start of the transfer
            used_before = src.kv.used_tokens
            moved = src.migrate_out(rid)
            t0 = max(now, src.clock)
            dur = mig.transfer_s(k, src.config.kv_bytes_per_token)
            self._inflight.append((t0 + dur, g, d, moved))
            self.placement[g] = d
            self.migrations[g] += 1
            self.migration_log.append((t0, g, s, d, dur))
            view.running[s] -= 1
            view.outstanding[s] -= 1
            view.kv_used[s] -= used_before - src.kv.used_tokens
            view.kv_used[d] += need * dkv.block_size

    def _advance(self, limit: float, given: list[list[int]] | None = None) -> None:
        """Run every replica up to its first iteration boundary at or after ``limit`` (or until it
        pauses without work), then read the load signals the router will see. ``given``: the
        requests routed to each replica at the last routing point, handed over first (one visit
        of each replica per routing point)."""
        view, give = self.view, self._give
        waiting, running, kv_used, waiting_tokens = [], [], [], []
        for r, e in enumerate(self.engines):
            if given and given[r]:
                give(r, given[r])
            e.more_from = limit
            # a deferred decode run (Engine.pending_to) that goes past the point needs no stepping
            sig = e.pending_to(limit) if e.pending is not None else None
            if sig is None:
                sched, ev = e.scheduler, e.view
                while e.clock < limit and e.poll():
                    sig = (len(e.waiting), len(e.running), e.kv.used_tokens, e.waiting_tokens)
                    e.execute(sched.schedule(ev))
                    if e.pending is not None:
                        s = e.pending_to(limit)
                        if s is not None:
                            sig = s
                            break
                else:
                    if sig is None or e.clock <= limit:  # at a boundary (or paused): the state as it is
                        sig = (len(e.waiting), len(e.running), e.kv.used_tokens, e.waiting_tokens)
            pending = e.n - e.next_idx  # routed here, not yet arrived in the engine
            queued = int(e._prompt_cum[e.n] - e._prompt_cum[e.next_idx]) if pending else 0
            incoming = e._incoming
            if incoming:  # migrated requests on their way arrive running, not queued
                pending -= len(incoming)
                queued -= sum(int(e._prompt[x]) for x in incoming)
            waiting.append(sig[0] + pending)
            running.append(sig[1] + len(incoming) if incoming else sig[1])
            kv_used.append(sig[2])
            waiting_tokens.append(sig[3] + queued)
        view.waiting[:] = waiting
        view.running[:] = running
        view.kv_used[:] = kv_used
        view.waiting_tokens[:] = waiting_tokens
        np.add(view.waiting, view.running, out=view.outstanding)

    # ---- results --------------------------------------------------------------------------
    def records(self) -> _Merged:
        """The replicas' per-request records in global id order (what :func:`summarize` reads)."""
        return _Merged(self)

    def summary(self, scenario: str = "", policy: str = "", wall_time_s: float = 0.0) -> dict[str, Any]:
        """The cluster summary (see the module docstring); one replica: the engine's summary plus
        ``cluster``."""
        engines = self.engines
        if len(engines) == 1:
            s = summarize(engines[0], scenario, policy, wall_time_s)
        else:
            s = summarize(self.records(), scenario, policy, wall_time_s)
        per = [summarize(e, scenario, policy) for e in engines]
        routed = self.view.routed.astype(float)
        busy = np.array([e.busy_time for e in engines])
        hit = sum(p.get("prefix_hit_tokens", 0) for p in per)
        s["cluster"] = {
            "n_replicas": len(engines),
            "router": self.router.name,
            "refresh_s": self.refresh_s,
            "routed": [int(x) for x in routed],
            "load_imbalance": float(routed.max() / routed.mean()) if routed.sum() else 1.0,
            "busy_imbalance": float(busy.max() / busy.mean()) if busy.sum() else 1.0,
            "prefix_hit_rate": s.get("prefix_hit_rate", 0.0),
            "prefix_hit_tokens": int(hit),
            "replicas": [{k: p[k] for k in REPLICA_KEYS if k in p} for p in per],
        }
        if self.migration is not None:
            log = self.migration_log
            n_rep = len(engines)
            out = np.bincount([x[2] for x in log], minlength=n_rep) if log else np.zeros(n_rep, dtype=np.int64)
            into = np.bincount([x[3] for x in log], minlength=n_rep) if log else np.zeros(n_rep, dtype=np.int64)
            for rep, a, b in zip(s["cluster"]["replicas"], out, into, strict=True):
                rep["migrated_out"], rep["migrated_in"] = int(a), int(b)
            s["cluster"]["migration"] = {
                **{k: getattr(self.migration, k) for k in self.migration.__dataclass_fields__},
                "migrations": len(log),
                "migrated_requests": int(np.count_nonzero(self.migrations)),
                "transfer_s_total": float(sum(x[4] for x in log)),
                "transfer_s_mean": float(np.mean([x[4] for x in log])) if log else 0.0,
            }
        return s

    def request_table(self) -> dict[str, np.ndarray]:
        """Per-request records of every arrived request (global ids), with its (last) ``replica``
        and the times it was ``migrations``."""
        t = request_table(self.engines[0] if len(self.engines) == 1 else self.records())
        t["replica"] = self.placement[t["id"]]
        t["migrations"] = self.migrations[t["id"]]
        return t

    def iteration_log(self) -> dict[str, np.ndarray]:
        """Every replica's iteration log, ordered by start time, with a ``replica`` column."""
        return merged_iteration_log(self.engines)


#: The per-replica part of a cluster's summary (``summary["cluster"]["replicas"]``).
REPLICA_KEYS = ("n_arrived", "n_completed", "n_rejected", "n_unfinished", "iterations", "busy_frac",
                 "kv_peak_frac", "kv_mean_frac", "preemptions", "prefix_hit_rate", "ttft_s", "e2e_s",
                 "throughput_tokens_per_s", "stop_reason", "serving")


def merged_iteration_log(engines: Sequence[Engine]) -> dict[str, np.ndarray]:
    """The engines' iteration logs as one, ordered by start time (stable: a replica's rows keep
    their order, ties go to the lower replica), with a ``replica`` column (the engine's index)."""
    logs = [e.iteration_log() for e in engines]
    cols = {k: np.concatenate([lg[k] for lg in logs]) for k in logs[0]}
    cols["replica"] = np.concatenate([np.full(len(lg["t_start"]), r, dtype=np.int64) for r, lg in enumerate(logs)])
    order = np.argsort(cols["t_start"], kind="stable")
    return {k: v[order] for k, v in cols.items()}


def _stopped(e: Engine, now: float) -> bool:
    """The engine has stopped, or will at its horizon, by ``now``."""
    h = e.config.horizon_s
    return e.done or (h is not None and now >= h)


def _replica_seed(seed: int, r: int) -> int:
    return seed if r == 0 else int(np.random.SeedSequence([seed, r]).generate_state(1)[0])


_PER_REQUEST = ("state", "completion_s", "first_token_s", "first_scheduled_s", "prefilled", "generated",
                "preemptions", "recomputed_tokens", "cached_tokens")
#: Engine counters a cluster's summary adds over its replicas.
SUMMED_COUNTERS = ("n_iterations", "total_decoded", "n_preempt_events", "n_overflow_events", "n_clears",
           "discarded_tokens", "total_prefill_tokens")


def prefix_hasher(cache: dict[int, KVCache], workload: Workload, block_size: int) -> KVCache:
    """The prefix-hash index of ``workload`` at ``block_size`` (no memory accounting: its hashes
    only), built once per block size into ``cache``."""
    h = cache.get(block_size)
    if h is None:
        h = cache[block_size] = KVCache(block_size, block_size, workload, True, False)
    return h


def merge_totals(merged: Any, engines: Sequence[Engine]) -> None:
    """Set on ``merged`` (records read as one engine's by :func:`summarize`) the replicas' totals:
    the summed counters, the last clock, the KV (peak and time integral in replica 0's blocks over
    the total capacity: the mean replica), the mean busy time and the stop reasons."""
    for name in SUMMED_COUNTERS:
        setattr(merged, name, sum(getattr(e, name) for e in engines))
    merged.clock = max(e.clock for e in engines)
    merged.kv = MergedKV(engines)
    bs = merged.kv.block_size
    merged.kv_peak_blocks = sum(e.kv_peak_blocks * e.kv.block_size for e in engines) / bs
    merged.kv_time_integral = sum(e.kv_time_integral * e.kv.block_size for e in engines) / bs
    merged.busy_time = sum(e.busy_time for e in engines) / len(engines)
    merged.non_terminating = any(e.non_terminating for e in engines)
    merged.stop_reason = "; ".join(sorted({e.stop_reason for e in engines}))


class MergedKV:
    """The replicas' KV caches as one, for :func:`summarize`: total capacity and evictions."""

    def __init__(self, engines: list[Engine]) -> None:
        self.block_size = engines[0].kv.block_size
        self.capacity_tokens = sum(e.kv.capacity_tokens for e in engines)
        self.evicted_blocks = sum(e.kv.evicted_blocks for e in engines)


class _MergedLog:
    def __init__(self, cluster: Cluster) -> None:
        self._c = cluster

    def columns(self) -> _LazyColumns:
        return _LazyColumns(self._c)


class _LazyColumns(dict):
    """:meth:`Cluster.iteration_log`'s columns built when first read (the summary reads two), in
    the same order, so that a long run's summary does not hold every column of every replica."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__()
        self._engines = cluster.engines
        start = np.concatenate([e.iteration_log()["t_start"] for e in self._engines])
        self._order = np.argsort(start, kind="stable")

    def __missing__(self, key: str) -> np.ndarray:
        col = np.concatenate([e.iteration_log()[key] for e in self._engines])[self._order]
        self[key] = col
        return col


class _Merged:
    """The replicas' records as one engine's (global ids), for :func:`summarize` and
    :func:`request_table`. KV and busy figures: totals over the replicas, so that ``busy_frac``
    and the KV fractions are the replicas' means (the block size is replica 0's)."""

    def __init__(self, c: Cluster) -> None:
        engines = c.engines
        n = len(c.workload)
        self.workload = c.workload
        self.seed = c.seed
        self.latency = engines[0].latency
        for name in _PER_REQUEST:
            a = getattr(engines[0], name)
            out = np.zeros(n, dtype=a.dtype) if a.dtype != np.float64 else np.full(n, np.nan)
            for e, ids in zip(engines, c.ids, strict=True):
                keep = e.state != MIGRATED  # a migrated request's record is its last replica's
                out[ids[keep]] = getattr(e, name)[keep]
            setattr(self, name, out)
        merge_totals(self, engines)
        self.log = _MergedLog(c)
        self.reject_reason = {int(ids[i]): why for e, ids in zip(engines, c.ids, strict=True)
                              for i, why in e.reject_reason.items()}
        self.engine = self  # read as a finished run (the fairness report)

    @property
    def requests(self) -> dict[str, np.ndarray]:
        return request_table(self)


__all__ = ["DEFAULT_REFRESH_S", "Cluster", "ClusterView", "Migration", "Replica", "Router"]
