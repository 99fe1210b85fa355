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

A request holds ``kv_tokens = prefilled + tokens decoded since its (re)start`` tokens of KV,
rounded up to blocks in paged mode. Requests keep their original arrival time through
preemptions, so latency keeps counting.

Fast-forward: when the plan is decode-only and ``hold`` is set, the engine runs the following
decode iterations as one vectorised step, up to the next arrival, completion, memory event or
horizon. Every quantity (clock, KV, records, log) equals the step-by-step run bit for bit.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from llmsched_gym.config import ConfigError, check_engine
from llmsched_gym.core.kv import KVCache
from llmsched_gym.core.latency import LatencyModel
from llmsched_gym.core.request import Workload
from llmsched_gym.core.scheduler import BatchPlan, EngineView, PlanError, Scheduler

PENDING, WAITING, RUNNING, DONE, REJECTED = 0, 1, 2, 3, 4

LOG_COLUMNS = (
    "t_start", "duration", "n_prefill_tokens", "n_cached_prefix_tokens", "n_decode",
    "sum_context_tokens", "kv_used", "kv_capacity", "n_waiting", "n_running", "n_preempted",
)


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
        """Check every field against :data:`llmsched_gym.config.ENGINE` (types, ranges, choices) and
        store it in its canonical type; raises ConfigError naming ``engine.FIELD``."""
        for key, value in check_engine(asdict(self)).items():
            setattr(self, key, value)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


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
    """

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
        self._check_capacity()
        ss = np.random.SeedSequence(seed)
        engine_ss, policy_ss = ss.spawn(2)
        self.rng = np.random.default_rng(engine_ss)
        self._noise_block = 1 << 14
        self._noise: np.ndarray | None = None
        self.view = EngineView(self)
        scheduler.reset(config, np.random.default_rng(policy_ss))
        self._hook_arrival = scheduler.wants("on_arrival")
        self._hook_tokens = scheduler.wants("on_tokens")
        self._hook_prefill = scheduler.wants("on_prefill")
        self._hook_preempt = scheduler.wants("on_preempt")
        self._hook_finish = scheduler.wants("on_finish")
        self._composition = bool(getattr(latency, "needs_composition", False))

        self._arrival = workload.arrival_s.tolist()
        self._prompt = workload.prompt_tokens
        self._output = workload.output_tokens
        self.clock = 0.0
        self.next_idx = 0
        self.n_iterations = 0
        self.waiting: list[int] = []
        self.running: list[int] = []
        self.state = np.zeros(n, dtype=np.int8)
        self.prefilled = np.zeros(n, dtype=np.int64)
        self.prefill_target = workload.prompt_tokens.copy()
        self.generated = np.zeros(n, dtype=np.int64)
        self.kv_tokens = np.zeros(n, dtype=np.int64)
        self.swapped = np.zeros(n, dtype=bool)
        # per-request records
        self.first_scheduled_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.completion_s = np.full(n, np.nan)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.recomputed_tokens = np.zeros(n, dtype=np.int64)
        self.cached_tokens = np.zeros(n, dtype=np.int64)
        self.reject_reason: dict[int, str] = {}
        # running counters
        self.n_in_prefill = 0
        self.waiting_tokens = 0  # prompt tokens the waiting requests still have to prefill
        self._prompt_cum = np.concatenate(([0], np.cumsum(workload.prompt_tokens))).tolist()
        self._iter_cached = 0
        self._dec_cache: np.ndarray | None = None
        self.n_completed = 0
        self.n_rejected = 0
        self.n_preempt_events = 0
        self.n_overflow_events = 0
        self.n_clears = 0
        self.total_decoded = 0
        self.discarded_tokens = 0
        self.total_prefill_tokens = 0
        self.kv_time_integral = 0.0
        self.kv_peak_blocks = 0
        self.busy_time = 0.0
        self.last_completion_iter = 0
        self.non_terminating = False
        self.stop_reason = ""
        self.done = False
        stall = config.stall_iterations
        if stall <= 0 and n:
            stall = max(20_000, 4 * int(self._prompt.max() + self._output.max()))
        self.stall_iterations = stall
        self._log: dict[str, list] = {c: [] for c in LOG_COLUMNS}
        self._log_arrays: list[dict[str, np.ndarray]] = []
        self.batches: list[dict] = []

    # ------------------------------------------------------------------------------------
    def _check_capacity(self) -> None:
        wl, bs = self.workload, self.config.block_size
        if not len(wl):
            return
        need_tok = wl.prompt_tokens + wl.output_tokens
        need_blocks = -(-need_tok // bs)
        i = int(np.argmax(need_blocks))
        if need_blocks[i] > self.kv.capacity_blocks:
            raise ConfigError(
                f"engine.kv_capacity_tokens: {self.config.kv_capacity_tokens} is smaller than request {i} "
                f"(prompt {int(wl.prompt_tokens[i])} + output {int(wl.output_tokens[i])} tokens"
                + (f", {int(need_blocks[i])} blocks of {bs}" if bs > 1 else "") + ")"
            )

    @property
    def next_arrival_s(self) -> float:
        return self._arrival[self.next_idx] if self.next_idx < self.n else math.inf

    def _noise_at(self, it: int) -> float:
        return float(self._noise_slice(it, 1)[0])

    def _noise_slice(self, it: int, k: int) -> np.ndarray:
        need = it + k
        if self._noise is None or len(self._noise) < need:
            size = max(need, 2 * (0 if self._noise is None else len(self._noise)), self._noise_block)
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, 7919]))
            eps = rng.standard_normal(size) * self.config.latency_noise_cv
            self._noise = 1.0 + np.maximum(eps, -0.9)
        return self._noise[it:need]

    # ------------------------------------------------------------------------------------
    def poll(self) -> bool:
        """Admit arrivals up to now, skip idle gaps, and tell whether a decision is needed."""
        if self.done:
            return False
        while True:
            self._arrivals()
            if self._should_stop():
                self._finish()
                return False
            if self.waiting or self.running:
                return True
            if self.next_idx >= self.n:
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
        j = bisect.bisect_right(self._arrival, self.clock, lo=self.next_idx)
        if j == self.next_idx:
            return
        if self._hook_arrival:
            sched, view = self.scheduler, self.view
            for i in range(self.next_idx, j):
                self.next_idx = i + 1
                if sched.on_arrival(i, view):
                    self.state[i] = WAITING
                    self.waiting.append(i)
                    self.waiting_tokens += int(self._prompt[i])
                else:
                    self.state[i] = REJECTED
                    self.n_rejected += 1
                    self.reject_reason[i] = sched.reject_reason(i)
        else:
            self.state[self.next_idx:j] = WAITING
            self.waiting.extend(range(self.next_idx, j))
            self.waiting_tokens += self._prompt_cum[j] - self._prompt_cum[self.next_idx]
            self.next_idx = j

    def _should_stop(self) -> bool:
        cfg = self.config
        if cfg.horizon_s is not None and self.clock >= cfg.horizon_s:
            self.stop_reason = "horizon"
            return True
        if cfg.max_iterations is not None and self.n_iterations >= cfg.max_iterations:
            self.stop_reason = "max_iterations"
            return True
        if self.n_iterations - self.last_completion_iter >= self.stall_iterations:
            self.non_terminating = True
            self.stop_reason = f"no completion for {self.stall_iterations} iterations (loop detector)"
            return True
        return False

    def _finish(self) -> None:
        self.done = True
        if self._log[LOG_COLUMNS[0]]:
            self._flush_log()

    def run(self) -> None:
        """Run to the end with the engine's own scheduler."""
        sched, view = self.scheduler, self.view
        while self.poll():
            self.execute(sched.schedule(view))

    # ------------------------------------------------------------------------------------
    def _decode_ids(self, pause) -> np.ndarray:
        if pause:
            return np.array(
                [r for r in self.running if r not in pause and self.prefilled[r] >= self.prefill_target[r]],
                dtype=np.int64,
            )
        if self._dec_cache is None:
            if self.n_in_prefill:
                ids = [r for r in self.running if self.prefilled[r] >= self.prefill_target[r]]
            else:
                ids = self.running
            self._dec_cache = np.array(ids, dtype=np.int64)
        return self._dec_cache

    def execute(self, plan: BatchPlan) -> None:
        """Run one iteration (or a fast-forwarded decode run) according to ``plan``."""
        cfg, kv = self.config, self.kv
        swap_s = 0.0
        n_preempted = 0
        if plan.preempt:
            for rid in plan.preempt:
                if self.state[rid] != RUNNING:
                    raise PlanError(f"preempt: request {rid} is not running")
            for rid in plan.preempt:
                swap_s += self._preempt(rid, cfg.preempt_mode)
                n_preempted += 1
        if plan.idle:
            if plan.prefill:
                raise PlanError("idle: a plan cannot both idle and prefill")
            t_next = self.next_arrival_s
            if t_next == math.inf:
                raise PlanError("idle: no future arrival to wait for (the run would stall)")
            self.clock = max(self.clock, t_next)
            return

        # --- prefill set ----------------------------------------------------------------
        prefill: list[tuple[int, int]] = []
        admitted: list[int] = []
        state, prefilled, target = self.state, self.prefilled, self.prefill_target
        for rid, chunk in plan.prefill.items():
            st = state[rid] if 0 <= rid < self.n else -1
            if st == WAITING:
                admitted.append(rid)
            elif st != RUNNING or prefilled[rid] >= target[rid]:
                raise PlanError(f"prefill: request {rid} is neither waiting nor in an unfinished prefill")
            if chunk < 0:
                raise PlanError(f"prefill: request {rid} has a negative chunk {chunk}")
            prefill.append((rid, int(chunk)))
        # requests admitted now prefill first, so the decode set is fixed before admission
        dec = self._decode_ids(plan.pause) if plan.decode else np.empty(0, dtype=np.int64)
        if admitted:
            swap_s += self._admit(admitted)
            # swapped-in requests resume decoding; their chunk entry is dropped
            if swap_s:
                resumed = [r for r, _ in prefill if prefilled[r] >= target[r]]
                prefill = [(r, c) for r, c in prefill if prefilled[r] < target[r]]
                if plan.decode and resumed:
                    dec = np.concatenate([dec, np.array(resumed, dtype=np.int64)])
        if (
            plan.hold and not prefill and not n_preempted and not plan.pause and plan.decode
            and len(dec) and cfg.fast_forward and not self._composition and not swap_s
        ):
            if self._fast_forward(dec):
                return

        # --- memory: growth of this iteration --------------------------------------------
        emits = cfg.prefill_emits_token
        bs = kv.block_size
        kvt = self.kv_tokens
        chunks: list[tuple[int, int, bool]] = []
        grow_blocks = 0
        for rid, chunk in prefill:
            remaining = int(target[rid] - prefilled[rid])
            c = remaining if chunk == 0 or chunk > remaining else chunk
            last = c == remaining
            g = c + (1 if (last and emits) else 0)
            k0 = int(kvt[rid])
            grow_blocks += -(-(k0 + g) // bs) - -(-k0 // bs)
            chunks.append((rid, c, last))
        if len(dec):
            if bs == 1:
                grow_blocks += len(dec)
            else:
                k0 = kvt[dec]
                grow_blocks += int(np.count_nonzero(k0 % bs == 0))
        overflow = kv.used_blocks + grow_blocks > kv.capacity_blocks
        if overflow:
            mode = cfg.overflow
            if mode == "forbid":
                self._refuse(chunks, dec, grow_blocks)
            elif mode in ("preempt_lifo_recompute", "swap"):
                chunks, dec, grow_blocks, s, n_p = self._make_room(chunks, dec, mode)
                swap_s += s
                n_preempted += n_p
                overflow = False
            else:
                self.n_overflow_events += 1
        if kv.enabled:
            kv.make_room(grow_blocks)

        # --- time -------------------------------------------------------------------------
        n_dec = len(dec)
        dec_ctx = int(kvt[dec].sum()) if n_dec else 0
        p_tokens = 0
        p_ctx = 0
        cached_now = self._iter_cached
        self._iter_cached = 0
        for rid, c, _ in chunks:
            p_tokens += c
            p_ctx += int(prefilled[rid]) + c
        if self._composition:
            comp_p = [(rid, c, int(prefilled[rid])) for rid, c, _ in chunks]
            comp_d = list(zip(dec.tolist(), kvt[dec].tolist(), strict=True))
            duration = self.latency.time_batch(comp_p, comp_d)  # type: ignore[attr-defined]
        else:
            duration = self.latency.batch_time(p_tokens, p_ctx, len(chunks), n_dec, dec_ctx)
        if cfg.latency_noise_cv > 0:
            duration *= self._noise_at(self.n_iterations)
        duration += swap_s
        if self.log_batches:
            self.batches.append({
                "prefill": [[rid, c, int(prefilled[rid])] for rid, c, _ in chunks],
                "decode": [[int(r), int(kvt[r])] for r in dec],
            })
        t_start = self.clock
        self.clock = t_end = t_start + duration
        self.busy_time += duration

        # --- progress ---------------------------------------------------------------------
        kv.used_blocks += grow_blocks
        finished: list[int] = []
        for rid, c, last in chunks:
            prefilled[rid] += c
            kvt[rid] += c
            self.total_prefill_tokens += c
            if self._hook_prefill:
                self.scheduler.on_prefill(rid, c, self.view)
            if last:
                self.n_in_prefill -= 1
                self._dec_cache = None
                if kv.enabled:
                    kv.publish_prefix(rid, int(prefilled[rid]))
                if emits:
                    kvt[rid] += 1
                    self._emit(np.array([rid]), t_end)
                    if self.generated[rid] >= self._output[rid]:
                        finished.append(rid)
        if n_dec:
            kvt[dec] += 1
            self._emit(dec, t_end)
            done_mask = self.generated[dec] >= self._output[dec]
            if done_mask.any():
                finished.extend(dec[done_mask].tolist())
        used = kv.used_blocks
        if used > self.kv_peak_blocks:
            self.kv_peak_blocks = used
        self.kv_time_integral += used * duration
        self._log_row(t_start, duration, p_tokens, cached_now, n_dec, p_ctx + dec_ctx, used * bs,
                      kv.capacity_tokens, len(self.waiting), len(self.running), n_preempted)
        self.n_iterations += 1
        if finished:
            self._complete(finished, t_end)
        if overflow and kv.used_blocks > kv.capacity_blocks:
            self._clear(cfg.overflow)

    # ------------------------------------------------------------------------------------
    def _admit(self, ids: list[int]) -> float:
        """Move ``ids`` from the queue to the running set; returns swap-in seconds."""
        kv, now = self.kv, self.clock
        swap_s = 0.0
        w = self.waiting
        k = len(ids)
        if w[:k] == ids:
            del w[:k]
        elif k <= 16:  # a few picks from a long queue (Echo's offline pool): C-level search each
            for rid in ids:
                w.remove(rid)
        else:
            id_set = set(ids)
            self.waiting = [r for r in w if r not in id_set]
        for rid in ids:
            self.state[rid] = RUNNING
            self.running.append(rid)
            self.waiting_tokens -= int(self.prefill_target[rid] - self.prefilled[rid])
            if math.isnan(self.first_scheduled_s[rid]):
                self.first_scheduled_s[rid] = now
            if self.swapped[rid]:
                self.swapped[rid] = False
                blocks = kv.blocks(int(self.kv_tokens[rid]))
                if kv.enabled:
                    kv.make_room(blocks)
                kv.used_blocks += blocks
                swap_s += self._swap_seconds(int(self.kv_tokens[rid]))
                continue
            self.n_in_prefill += 1
            if kv.enabled:
                hit = kv.acquire_prefix(rid)
                if hit:
                    self.prefilled[rid] = hit
                    self.kv_tokens[rid] = hit
                    self.cached_tokens[rid] += hit
                    self._iter_cached += hit
        self._dec_cache = None
        return swap_s

    def _swap_seconds(self, tokens: int) -> float:
        return tokens * self.config.kv_bytes_per_token / (self.config.swap_gb_s * 1e9)

    def _free(self, rid: int) -> None:
        kv = self.kv
        kv.used_blocks -= kv.blocks(int(self.kv_tokens[rid])) - int(kv.shared[rid])
        if kv.enabled:
            kv.release_prefix(rid)
        if self._composition:
            self.latency.release(rid)  # type: ignore[attr-defined]

    def _preempt(self, rid: int, mode: str, requeue: bool = True) -> float:
        """Evict a running request back to the queue (its head unless ``requeue`` is False, when
        the caller requeues it); returns swap-out seconds."""
        run = self.running
        if run and run[-1] == rid:
            run.pop()
        else:
            run.remove(rid)
        if self.prefilled[rid] < self.prefill_target[rid]:
            self.n_in_prefill -= 1
        self._dec_cache = None
        self.preemptions[rid] += 1
        self.n_preempt_events += 1
        swap_s = 0.0
        self._free(rid)
        if mode == "swap":
            swap_s = self._swap_seconds(int(self.kv_tokens[rid]))
            self.swapped[rid] = True
        else:
            self.recomputed_tokens[rid] += int(self.kv_tokens[rid])
            if mode == "restart":
                self.discarded_tokens += int(self.generated[rid])
                self.generated[rid] = 0
                self.prefill_target[rid] = self._prompt[rid]
            else:
                self.prefill_target[rid] = self._prompt[rid] + self.generated[rid]
            self.prefilled[rid] = 0
            self.kv_tokens[rid] = 0
        self.state[rid] = WAITING
        self.waiting_tokens += int(self.prefill_target[rid] - self.prefilled[rid])
        if requeue:
            self.waiting.insert(0, rid)
        if self._hook_preempt:
            self.scheduler.on_preempt(rid, self.view)
        return swap_s

    def _make_room(self, chunks, dec, mode):
        """vLLM: preempt the newest running requests until the iteration fits."""
        kv, bs, kvt = self.kv, self.kv.block_size, self.kv_tokens
        emits = self.config.prefill_emits_token
        growth: dict[int, int] = {}  # prefill chunks' blocks
        for rid, c, last in chunks:
            k0 = int(kvt[rid])
            growth[rid] = -(-(k0 + c + (1 if last and emits else 0)) // bs) - -(-k0 // bs)
        total = sum(growth.values())
        if len(dec):
            total += len(dec) if bs == 1 else int(np.count_nonzero(kvt[dec] % bs == 0))
        preempt_mode = "swap" if mode == "swap" else self.config.preempt_mode
        swap_s = 0.0
        victims: list[int] = []
        dec_set: set[int] | None = None
        n_dec_gone = 0
        while kv.used_blocks + total > kv.capacity_blocks:
            if not self.running:
                raise PlanError("overflow: nothing left to preempt")
            victim = self.running[-1]
            g = growth.pop(victim, 0)
            if len(dec):
                if dec_set is None:
                    dec_set = set(dec.tolist())
                if victim in dec_set:  # its decode's block, counted before the preemption zeroes its KV
                    g += 1 if bs == 1 or kvt[victim] % bs == 0 else 0
                    n_dec_gone += 1
            total -= g
            swap_s += self._preempt(victim, preempt_mode, requeue=False)
            victims.append(victim)
        if victims:
            gone = set(victims)
            self.waiting[:0] = victims[::-1]
            chunks = [x for x in chunks if x[0] not in gone]
            # decodes run in running order and the victims are the newest: they end ``dec``
            if n_dec_gone:
                dec = dec[: len(dec) - n_dec_gone]
        return chunks, dec, total, swap_s, len(victims)

    def _refuse(self, chunks, dec, grow_blocks: int) -> None:
        kv = self.kv
        short = kv.used_blocks + grow_blocks - kv.capacity_blocks
        unit = "tokens" if kv.block_size == 1 else f"blocks of {kv.block_size}"
        who = f"request {chunks[-1][0]} (prefill {chunks[-1][1]} tokens)" if chunks else f"{len(dec)} decodes"
        raise PlanError(
            f"overflow: the plan needs {short} more {unit} than the KV capacity "
            f"({kv.capacity_blocks} {unit}, {kv.used_blocks} used); last admitted: {who}"
        )

    def _clear(self, mode: str) -> None:
        """Jaillet et al. 2025's clearing: running requests go back to the queue, progress lost."""
        if mode == "clear_all":
            victims = list(self.running)
        else:
            draws = self.rng.random(len(self.running))
            victims = [r for r, u in zip(self.running, draws, strict=True) if u < self.config.overflow_beta]
        self.n_clears += 1
        for rid in reversed(victims):
            self._preempt(rid, "restart", requeue=False)
        # cleared requests re-enter at the head, in arrival order
        self.waiting[:0] = sorted(victims)

    def _emit(self, ids: np.ndarray, t: float) -> None:
        gen = self.generated
        first = ids[gen[ids] == 0]
        if len(first):
            ft = self.first_token_s[first]
            self.first_token_s[first] = np.where(np.isnan(ft), t, ft)
        gen[ids] += 1
        self.total_decoded += len(ids)
        if self._hook_tokens:
            self.scheduler.on_tokens(ids, 1, self.view)

    def _complete(self, ids: list[int], t: float) -> None:
        for rid in ids:
            self.state[rid] = DONE
            self.completion_s[rid] = t
            self._free(rid)
            self.kv_tokens[rid] = 0
        if len(ids) <= 4:  # a few: C-level removals beat rebuilding the list
            run = self.running
            for rid in ids:
                run.remove(rid)
        else:
            done = set(ids)
            self.running = [r for r in self.running if r not in done]
        self._dec_cache = None
        self.n_completed += len(ids)
        self.last_completion_iter = self.n_iterations
        if self._hook_finish:
            for rid in ids:
                self.scheduler.on_finish(rid, self.view)

    # ------------------------------------------------------------------------------------
    def _fast_forward(self, dec: np.ndarray) -> bool:
        """Run k >= 2 identical decode iterations at once; False if fewer than 2 are safe."""
        kv, cfg = self.kv, self.config
        bs = kv.block_size
        gen, out, kvt = self.generated, self._output, self.kv_tokens
        b = len(dec)
        k_max = int((out[dec] - gen[dec]).min())
        if cfg.max_iterations is not None:
            k_max = min(k_max, cfg.max_iterations - self.n_iterations)
        k_max = min(k_max, self.stall_iterations - (self.n_iterations - self.last_completion_iter))
        if k_max < 2:
            return False
        k0 = kvt[dec]
        free = kv.capacity_blocks - kv.used_blocks
        if bs == 1:
            k_max = min(k_max, free // b)
        if k_max < 2:
            return False
        steps = np.arange(k_max, dtype=np.int64)
        ctx0 = int(k0.sum())
        ctx = ctx0 + steps * b
        d = self.latency.decode_times(b, ctx)
        if cfg.latency_noise_cv > 0:
            d = d * self._noise_slice(self.n_iterations, k_max)
        if bs == 1:
            grow = (steps + 1) * b
        else:
            blocks0 = -(-k0 // bs)
            after = -(-(k0[:, None] + steps[None, :] + 1) // bs)
            grow = (after - blocks0[:, None]).sum(axis=0)
            fits = kv.used_blocks + grow <= kv.capacity_blocks
            if not fits.all():
                k_fit = int(np.argmin(fits))
                if k_fit < 2:
                    return False
                k_max = k_fit
        clocks = np.cumsum(np.concatenate(([self.clock], d[:k_max])))
        limit = self.next_arrival_s
        if cfg.horizon_s is not None:
            limit = min(limit, cfg.horizon_s)
        if limit < math.inf:
            # stop at the first boundary at or after the next arrival / horizon
            j = int(np.searchsorted(clocks[1:], limit, side="left"))
            k_max = min(k_max, j + 1)
        k = k_max
        if k < 2:
            return False
        d = d[:k]
        used_after = kv.used_blocks + grow[:k]
        t_end = float(clocks[k])
        first = dec[gen[dec] == 0]
        if len(first):
            ft = self.first_token_s[first]
            self.first_token_s[first] = np.where(np.isnan(ft), clocks[1], ft)
        gen[dec] += k
        kvt[dec] += k
        self.total_decoded += b * k
        if kv.enabled:
            kv.make_room(int(grow[k - 1]))
        kv.used_blocks = int(used_after[-1])
        peak = int(used_after.max())
        if peak > self.kv_peak_blocks:
            self.kv_peak_blocks = peak
        self.kv_time_integral = float(np.cumsum(np.concatenate(([self.kv_time_integral], used_after * d)))[-1])
        self.busy_time = float(np.cumsum(np.concatenate(([self.busy_time], d)))[-1])
        self.clock = t_end
        self._flush_log()
        self._log_arrays.append({
            "t_start": clocks[:k], "duration": d, "n_prefill_tokens": np.zeros(k, np.int64),
            "n_cached_prefix_tokens": np.zeros(k, np.int64), "n_decode": np.full(k, b, np.int64),
            "sum_context_tokens": ctx[:k], "kv_used": used_after * bs,
            "kv_capacity": np.full(k, kv.capacity_tokens, np.int64),
            "n_waiting": np.full(k, len(self.waiting), np.int64), "n_running": np.full(k, len(self.running), np.int64),
            "n_preempted": np.zeros(k, np.int64),
        })
        if self.log_batches:
            ids = dec.tolist()
            for s in range(k):
                self.batches.append({"prefill": [], "decode": [[r, int(c) + s] for r, c in zip(ids, k0.tolist(), strict=True)]})
        self.n_iterations += k
        if self._hook_tokens:
            self.scheduler.on_tokens(dec, k, self.view)
        finished = dec[gen[dec] >= out[dec]]
        if len(finished):
            self._complete(finished.tolist(), t_end)
        return True

    # ------------------------------------------------------------------------------------
    def _log_row(self, *row) -> None:
        log = self._log
        for c, v in zip(LOG_COLUMNS, row, strict=True):
            log[c].append(v)
        if len(log["t_start"]) >= 4096:
            self._flush_log()

    def _flush_log(self) -> None:
        log = self._log
        if log["t_start"]:
            self._log_arrays.append({c: np.asarray(v) for c, v in log.items()})
            self._log = {c: [] for c in LOG_COLUMNS}

    def iteration_log(self) -> dict[str, np.ndarray]:
        """The iteration log (one row per engine iteration) as columns."""
        self._flush_log()
        if not self._log_arrays:
            return {c: np.empty(0) for c in LOG_COLUMNS}
        return {c: np.concatenate([a[c] for a in self._log_arrays]) for c in LOG_COLUMNS}

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
