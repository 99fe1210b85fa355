"""Observation layout of ``LLMSched-v1``: feature tables (name, bounds, meaning) and the spaces.

Under the ``blind`` information model the features that depend on output lengths are replaced
by what a server knows without a predictor (see the tables: ``blind:``), so that nothing in the
observation depends on an output length before the request completes.

Every feature is a float32 inside finite documented bounds; values are clipped into them. Token
counts use ``log1p(x) / log1p(M)`` (``M`` = KV capacity in tokens, so 1 means "as large as the
whole cache"), durations ``log1p(t / u) / log1p(TIME_RANGE)`` with ``u`` the scenario's
time unit (the batch time of a one-token decode, or of a one-token prefill when decodes are free;
1 in round mode). The tables below are the source of the env's docstring table.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from gymnasium import spaces

from llmsched_gym.core.information import BLIND

if TYPE_CHECKING:
    from llmsched_gym.core.engine import Engine

TIME_RANGE = 1e6
"""Durations saturate at a million time units."""

REMAINING_BIN_EDGES = (2, 8, 32, 128, 512, 2048, 8192)
"""Histogram bins of predicted remaining output tokens: [1,2), [2,8), ..., [8192, inf)."""

# (name, low, high, meaning)
QUEUE_FEATURES: tuple[tuple[str, float, float, str], ...] = (
    ("present", 0.0, 1.0, "1 if a request occupies the slot (all other features are 0 when not)"),
    ("prompt", 0.0, 1.0, "tokens to prefill (prompt, + generated after a recompute preemption), log-scaled"),
    ("predicted_output", 0.0, 1.0, "predicted output tokens still to generate, log-scaled (blind: tokens generated "
     "so far, non-zero after a recompute preemption)"),
    ("uncertainty", 0.0, 1.0, "relative spread of the predictor (0 oracle, x for noisy(x), min(sigma, 1) for "
     "lognormal, bucket width; blind: 1)"),
    ("age", 0.0, 1.0, "time since arrival, log-scaled"),
    ("prefix_hit", 0.0, 1.0, "fraction of the prompt the prefix cache would serve now"),
    ("service_deficit", 0.0, 1.0, "(max client service - this client's) / (max + 1), weighted service"),
    ("task_class", 0.0, 1.0, "0 online, 1 offline"),
    ("slo_slack", -1.0, 1.0, "(TTFT deadline - now) / TTFT SLO, clipped; 1 without a TTFT SLO"),
    ("fits_now", 0.0, 1.0, "1 if it passes the 'current' admission rule given the batch so far"),
    ("fits_future", 0.0, 1.0, "1 if it passes the 'future' (MC-SF Eq. (1)) rule given the batch so far "
     "(chosen requests counted at their peak unless admission='future'; blind: 0)"),
    ("prefilled", 0.0, 1.0, "fraction of the prompt whose KV is already computed (a swapped-out request keeps it)"),
)

RUNNING_FEATURES: tuple[tuple[str, float, float, str], ...] = (
    ("count", 0.0, 1.0, "running requests + requests chosen for this batch, log1p(n) / log1p(M)"),
    ("kv_used", 0.0, 2.0, "(KV used + KV reserved by the batch being formed) / capacity"),
    *(
        (f"remaining_hist_{i}", 0.0, 1.0,
         f"fraction of them with predicted remaining output in [{lo}, {hi}) (blind: tokens generated so far, "
         f"in [{0 if lo == 1 else lo}, {hi}))")
        for i, (lo, hi) in enumerate(zip((1, *REMAINING_BIN_EDGES), (*REMAINING_BIN_EDGES, "inf"), strict=True))
    ),
    ("future_peak", 0.0, 2.0, "predicted future KV peak of the running requests alone (Eq. (1)) / capacity "
     "(blind: 0)"),
    ("selected", 0.0, 1.0, "requests chosen for this batch so far (select mode), log1p(n) / log1p(M)"),
    ("prefilling", 0.0, 1.0, "running requests with an unfinished (chunked) prefill, log1p(n) / log1p(M)"),
    ("prefill_owed", 0.0, 2.0, "prompt tokens those still have to prefill, log-scaled"),
    ("preempting", 0.0, 1.0, "running requests chosen for preemption in the batch being formed, log1p(n) / log1p(M)"),
    ("batch_tokens", 0.0, 2.0, "tokens the batch being formed computes with an unlimited budget (decodes + prompt "
     "tokens owed by unfinished prefills + the chosen requests' prompts), log-scaled"),
)

GLOBAL_FEATURES: tuple[tuple[str, float, float, str], ...] = (
    ("kv_used", 0.0, 2.0, "KV used / capacity (above 1 only after an overflow a clear handler left)"),
    ("queue_len", 0.0, 1.0, "waiting requests not chosen yet, log1p(n) / log1p(N requests)"),
    ("arrival_rate", 0.0, 1.0, "arrivals in the last RATE_WINDOW time units, log1p(n) / log1p(N requests)"),
    ("since_batch", 0.0, 1.0, "time since the last batch that admitted a request, log-scaled"),
    ("last_iteration", 0.0, 1.0, "duration of the last iteration, log-scaled"),
    ("arrived", 0.0, 1.0, "fraction of the episode's requests that have arrived"),
    ("last_prefill_tokens", 0.0, 2.0, "prompt tokens the last iteration prefilled, log-scaled"),
    ("last_decode_tokens", 0.0, 2.0, "requests the last iteration decoded, log-scaled"),
    ("budget", 0.0, 2.0, "token budget of the last batch, log-scaled; 2 when unlimited"),
    ("backlog", 0.0, 2.0, "prompt tokens the waiting requests still have to prefill, log-scaled (> 1: more than the cache)"),
    ("stall", 0.0, 1.0, "time since the running request that waited longest last got a token or a chunk, log-scaled"),
)

BUDGET_FEATURE = ("batch_time", 0.0, 1.0, "predicted duration of the next batch if it launches with this budget, "
                  "log-scaled (select mode; one per launch action)")

RATE_WINDOW = 100.0
"""Window of the arrival-rate feature, in time units."""


def _box(table, n: int = 1) -> spaces.Box:
    low = np.tile(np.array([f[1] for f in table], dtype=np.float32), n)
    high = np.tile(np.array([f[2] for f in table], dtype=np.float32), n)
    return spaces.Box(low, high, dtype=np.float32)


def observation_space(k: int, flat: bool, n_budgets: int = 0) -> spaces.Space:
    """``Dict(queue=Box(K*F), running=Box(R), globals=Box(G)[, budgets=Box(B)])``, or their
    concatenation when ``flat``; ``budgets`` only in ``select`` mode (``n_budgets`` > 0)."""
    parts = {"queue": _box(QUEUE_FEATURES, k), "running": _box(RUNNING_FEATURES), "globals": _box(GLOBAL_FEATURES)}
    if n_budgets:
        parts["budgets"] = _box((BUDGET_FEATURE,), n_budgets)
    if flat:
        low = np.concatenate([p.low for p in parts.values()])
        high = np.concatenate([p.high for p in parts.values()])
        return spaces.Box(low, high, dtype=np.float32)
    return spaces.Dict(parts)


def token_scale(capacity_tokens: int) -> np.ndarray:
    """Lookup table ``log1p(x) / log1p(M)`` for ``x = 0..M`` (float32)."""
    return (np.log1p(np.arange(capacity_tokens + 1, dtype=np.float64)) / math.log1p(capacity_tokens)).astype(np.float32)


def predictor_spread(spec: dict | None, predicted: np.ndarray) -> np.ndarray:
    """The ``uncertainty`` feature of every request, from the workload's ``predictor`` spec."""
    n = len(predicted)
    if not spec:
        return np.zeros(n, np.float32)
    kind = spec.get("type", "oracle") if isinstance(spec, dict) else str(spec)
    if kind == "none":
        return np.ones(n, np.float32)
    if kind == "lognormal":
        return np.full(n, min(float(spec.get("sigma", 0.0)), 1.0), np.float32)
    if kind == "noisy":
        return np.full(n, min(float(spec.get("x", 0.0)), 1.0), np.float32)
    if kind == "bucketed":
        edges = np.asarray(spec.get("edges", ()), dtype=np.float64)
        lower = np.concatenate(([0.0], edges))
        i = np.minimum(np.searchsorted(edges, predicted, side="left"), len(edges) - 1)
        width = edges[i] - lower[i]
        return np.clip(width / np.maximum(edges[i], 1.0), 0.0, 1.0).astype(np.float32)
    return np.zeros(n, np.float32)


def feature_table(table, index: str = "i") -> str:
    """A feature table as reStructuredText (the env's docstring tables are made from these)."""
    w = max(len(f[0]) for f in table) + 2
    m = max(len(f[3]) for f in table)
    rule = f"===  {'=' * w}  ===========  {'=' * m}"
    lines = [rule, f"{index:<3}  {'name':<{w}}  {'range':<11}  meaning", rule]
    for i, (name, lo, hi, meaning) in enumerate(table):
        rng = f"[{lo:g}, {hi:g}]"
        lines.append(f"{i:<3}  {name:<{w}}  {rng:<11}  {meaning}")
    lines.append(rule)
    return "\n".join(lines)


Q = {name: i for i, (name, *_rest) in enumerate(QUEUE_FEATURES)}
R = {name: i for i, (name, *_rest) in enumerate(RUNNING_FEATURES)}
G = {name: i for i, (name, *_rest) in enumerate(GLOBAL_FEATURES)}
_HIST = slice(R["remaining_hist_0"], R["remaining_hist_0"] + len(REMAINING_BIN_EDGES) + 1)
_N_BINS = len(REMAINING_BIN_EDGES) + 1


def generated_hist(generated: np.ndarray) -> np.ndarray:
    """Counts of ``generated`` (tokens generated so far) in the histogram bins [0, 2), [2, 8), ...:
    the ``remaining_hist_*`` features under ``blind``."""
    return np.bincount(np.searchsorted(REMAINING_BIN_EDGES, generated, side="right"), minlength=_N_BINS)
_FITS_NOW, _FITS_FUTURE = Q["fits_now"], Q["fits_future"]


@dataclass(slots=True)
class Recent:
    """What the last batches did, kept by the env's driver (the ``since_batch``, ``last_iteration``,
    ``last_prefill_tokens``, ``last_decode_tokens``, ``budget`` and ``stall`` features read it).

    :ivar admit_s: clock of the last batch that admitted a request.
    :ivar iter_s: duration of one iteration of the last plan run.
    :ivar prefill_tokens: prompt tokens the last plan prefilled.
    :ivar decode_tokens: requests one iteration of the last plan decoded.
    :ivar budget: token budget of the last launch (``None``: unlimited).
    :ivar stalled: running requests that got neither a token nor a chunk, and since when.
    """

    admit_s: float = 0.0
    iter_s: float = 0.0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    budget: int | None = None
    stalled: dict[int, float] = field(default_factory=dict)


class ObservationBuilder:
    """Writes the observation of a decision point, feature by feature (names from the tables).

    The observation is one float32 vector (the flat layout: queue, running, globals, budgets;
    the Dict parts are views of it), copied each step from a per-boundary base that holds what
    stays constant while a batch forms (the running requests, the globals, the budgets' batch
    times); the step then writes the queue rows and what the batch being formed changes.
    Queue rows that do not change while a batch forms (prompt, predicted output, uncertainty,
    task class) are computed once per episode; the boundary-dependent ones (age, prefix hit,
    service deficit, SLO slack, prefilled) once per boundary for the requests the slots may show.
    """

    def __init__(self, k: int, flat: bool, budgets: tuple[int | None, ...] | None) -> None:
        self.K = k
        self.flat = flat
        self.budgets = budgets
        self.space = observation_space(k, flat, len(budgets) if budgets else 0)
        # where each part and each named feature sits in the vector
        self.nq = nq = k * len(QUEUE_FEATURES)
        self.g0 = g0 = nq + len(RUNNING_FEATURES)
        self.b0 = b0 = g0 + len(GLOBAL_FEATURES)
        self.size = b0 + (len(budgets) if budgets else 0)
        self.parts = [("queue", slice(0, nq)), ("running", slice(nq, g0)), ("globals", slice(g0, b0))]
        if budgets:
            self.parts.append(("budgets", slice(b0, self.size)))
        self.at = {**{f"running.{n}": nq + i for n, i in R.items()}, **{f"globals.{n}": g0 + i for n, i in G.items()}}
        self.hist = slice(nq + _HIST.start, nq + _HIST.stop)
        at = self.at
        self.i_count, self.i_kv_used = at["running.count"], at["running.kv_used"]
        self.i_selected, self.i_batch_tokens = at["running.selected"], at["running.batch_tokens"]
        self.i_queue_len, self.i_backlog = at["globals.queue_len"], at["globals.backlog"]
        self._out: np.ndarray | None = None  # the last ``out`` of observe() and its queue view
        self._out_q: np.ndarray | None = None

    def setup(self, e: Engine, dp: Any, information: str, predictor: Any = None) -> None:
        """Per-episode tables of engine ``e`` (fresh) and decision point ``dp`` (the env's
        :class:`~llmsched_gym.env.decision.DecisionPoint`, set up on ``e``),
        under the task's ``information`` model and the workload's ``predictor`` spec (the
        ``uncertainty`` feature)."""
        wl = e.workload
        self.e, self.dp = e, dp
        self.blind = information == BLIND
        cap = dp.cap_tokens
        self.n = max(len(wl), 1)
        lat = e.latency
        self.timed = timed = not getattr(lat, "needs_composition", False)
        unit = lat.batch_time(0, 0, 0, 1, 1) if timed else 0.0
        if not unit > 0 and timed:
            unit = lat.batch_time(1, 1, 1, 0, 0)
        self.unit = unit if unit > 0 else 1.0
        self.inv_unit = 1.0 / self.unit
        self.inv_log_time = 1.0 / math.log1p(TIME_RANGE)
        self.inv_log_cap = 1.0 / math.log1p(cap)
        self.inv_log_n = 1.0 / math.log1p(self.n)
        self.rate_window = RATE_WINDOW * self.unit
        self.tbl = token_scale(cap)
        self.arrival_list = wl.arrival_s.tolist()
        self.arrival_u = wl.arrival_s * self.inv_unit
        self.prompt = wl.prompt_tokens
        self.prefix = e.kv.enabled
        self.swap = e.config.preempt_mode == "swap" or e.config.overflow == "swap"
        self.multi_client = wl.n_clients > 1
        has_ttft = np.isfinite(wl.ttft_slo_s)
        self.has_ttft = bool(has_ttft.any())
        if self.has_ttft:
            slo = np.where(has_ttft, wl.ttft_slo_s, 1.0)
            self.ttft_mask = has_ttft
            self.deadline = wl.arrival_s + slo
            self.inv_slo = np.where(has_ttft, 1.0 / slo, 0.0)
        st = np.zeros((len(wl) + 1, len(QUEUE_FEATURES)), np.float32)  # + the all-zero padding row
        st[:-1, Q["present"]] = 1.0
        st[:-1, Q["prompt"]] = self.tbl[np.minimum(wl.prompt_tokens, cap)]
        # blind: tokens generated so far (0 at the start; refresh() after a recompute preemption)
        st[:-1, Q["predicted_output"]] = 0.0 if self.blind else self.tbl[np.minimum(wl.predicted_output, cap)]
        st[:-1, Q["uncertainty"]] = predictor_spread(predictor, wl.predicted_output)
        st[:-1, Q["task_class"]] = wl.task_class
        st[:-1, Q["slo_slack"]] = 1.0
        self.rows = st
        self.age_col = st[:, Q["age"]]  # (a column view: 1-D indexing is cheaper)
        self.key = None
        self.base = np.zeros(self.size, np.float32)
        big = np.iinfo(np.int64).max // 4  # the unlimited budget
        if self.budgets:
            self.budget_list = [big if b is None else b for b in self.budgets]
            self.slots_of: dict[tuple, tuple] = {}  # value_slots by budget order
            self.sorted_of: dict[int, tuple] = {}  # sorted_budgets by the number of decodes

    def refresh(self, rid: int) -> None:
        """A preempted request's prompt (+ generated tokens) and remaining output changed."""
        cap = self.dp.cap_tokens
        row = self.rows[rid]
        row[Q["prompt"]] = self.tbl[min(int(self.dp.target[rid]), cap)]
        if self.blind:
            row[Q["predicted_output"]] = self.tbl[min(int(self.dp.gen[rid]), cap)]
        else:
            row[Q["predicted_output"]] = self.tbl[min(max(int(self.dp.pred[rid] - self.dp.gen[rid]), 0), cap)]

    def log_tokens(self, x: float) -> float:
        """``log1p(x) / log1p(M)``, clipped at 2."""
        return min(math.log1p(x) * self.inv_log_cap, 2.0)

    def log_time(self, t: float) -> float:
        return min(math.log1p(max(t, 0.0) * self.inv_unit) * self.inv_log_time, 1.0)

    # ------------------------------------------------------------------------------------------
    def observe(self, last: Recent, out: np.ndarray | None = None) -> np.ndarray | dict[str, np.ndarray]:
        """The observation now (a fresh array, or a dict of views of one): the decision point's
        slots and batch being formed, the engine, and ``last``, what the last batches did.
        ``out``: a float32 vector of the flat layout to write instead (the vector env's row of its
        batch array), returned as it is."""
        e, dp = self.e, self.dp
        n = len(dp.slots)
        if n and dp.row_upto < self.K + len(dp.sel):  # (window()'s test, without the call)
            new, dp.row_upto = dp.window(dp.row_upto)
            self._fill_rows(new, e.clock)
        key = (dp.bid, len(dp.victims))
        if key != self.key:  # a new boundary or a preemption
            self.key = key
            self._boundary(last)
        if self.budgets and self.timed:
            self._batch_times()
        if out is None:
            buf = self.base.copy()
            q = buf[: self.nq].reshape(self.K, -1)
        else:
            buf = out
            buf[:] = self.base
            if out is not self._out:  # (the vector env gives each env the same row every step)
                self._out, self._out_q = out, out[: self.nq].reshape(self.K, -1)
            q = self._out_q
        if n:  # (no slot: the base's queue part is all zeros already)
            self.rows.take(dp.ids_pad, axis=0, out=q, mode="clip")
            q[:n, _FITS_NOW] = dp.fits_now
            ff = dp.fits_future
            if ff is None and not self.blind:
                # not the admission rule: the chosen requests count at their peak throughout
                ff = dp.fits_future = dp.rooms(dp.ids) >= dp.sel_peaks
            if ff is not None:
                q[:n, _FITS_FUTURE] = ff
        n_sel = len(dp.sel)
        if n_sel:  # the running part with the batch being formed
            n_res = dp.n_run + n_sel
            buf[self.i_count] = math.log1p(n_res) * self.inv_log_cap
            buf[self.i_kv_used] = min(max(e.kv.used_blocks - dp.released + dp.sel_blocks, 0) / dp.cap_blocks, 2.0)
            if self.blind:
                buf[self.hist] = (self.run_hist + generated_hist(dp.gen[dp.sel])) * (1.0 / n_res)
            else:
                buf[self.hist] = (dp.run_hist + dp.sel_hist) * (1.0 / n_res)
            buf[self.i_selected] = math.log1p(n_sel) * self.inv_log_cap
            buf[self.i_batch_tokens] = self.log_tokens(self.run_tokens + dp.sel_tokens)
        buf[self.i_queue_len] = math.log1p(dp.n_waiting - n_sel) * self.inv_log_n
        buf[self.i_backlog] = self.log_tokens(max(e.waiting_tokens - dp.sel_tokens, 0))
        if self.flat or out is not None:
            return buf
        return {name: buf[part] for name, part in self.parts}

    def _boundary(self, last: Recent) -> None:
        """The base of this boundary: the running requests (less those chosen for preemption),
        the globals; the budgets' batch times start over. The running and the globals parts are
        written as one block (``queue_len``, ``backlog`` and ``selected`` are the step's, in
        :meth:`observe`)."""
        e, dp = self.e, self.dp
        base = self.base  # (its queue part stays all zeros; the budgets' are rewritten every step)
        cap, inv_log_cap, inv_unit, inv_log_time = dp.cap_blocks, self.inv_log_cap, self.inv_unit, self.inv_log_time
        log1p = math.log1p
        # running requests
        if self.blind:  # what they generated so far (attained service) instead of predictions
            dp.batch_shape()
            self.run_hist = generated_hist(dp.gen[dp.run_list]) if dp.n_run else 0
        else:
            dp.residents()
        n_run = dp.n_run
        n_dec, dec_ctx, mid, owed, mid_ctx = self.shape = dp.batch_shape()
        self.run_tokens = n_dec + owed
        if n_run:
            hist = ((self.run_hist if self.blind else dp.run_hist) * (1.0 / n_run)).tolist()
            peak = 0.0 if self.blind else min(dp.fp_run.peak / dp.cap_tokens, 2.0)
            running = [log1p(n_run) * inv_log_cap, min(max(e.kv.used_blocks - dp.released, 0) / cap, 2.0),
                       *hist, peak]
        else:
            running = [0.0] * (2 + _N_BINS + 1)
        running += [0.0,  # selected
                    log1p(mid) * inv_log_cap if mid else 0.0,
                    min(log1p(owed) * inv_log_cap, 2.0) if mid else 0.0,
                    log1p(len(dp.victims)) * inv_log_cap if dp.victims else 0.0,
                    min(log1p(self.run_tokens) * inv_log_cap, 2.0)]
        # globals
        now = e.clock
        recent = e.next_idx - bisect.bisect_left(self.arrival_list, now - self.rate_window, 0, e.next_idx)
        b = last.budget
        stalled = last.stalled
        base[self.nq:self.b0] = running + [
            min(e.kv.used_blocks / cap, 2.0),
            0.0,  # queue_len
            log1p(recent) * self.inv_log_n,
            min(log1p(max(now - last.admit_s, 0.0) * inv_unit) * inv_log_time, 1.0),  # since_batch
            min(log1p(max(last.iter_s, 0.0) * inv_unit) * inv_log_time, 1.0),  # last_iteration
            e.next_idx / self.n,
            min(log1p(last.prefill_tokens) * inv_log_cap, 2.0),
            min(log1p(last.decode_tokens) * inv_log_cap, 2.0),
            2.0 if b is None else min(log1p(b) * inv_log_cap, 2.0),
            0.0,  # backlog
            self.log_time(now - min(stalled.values())) if stalled else 0.0,
        ]
        # budgets: sorted by the prefill room they leave after the decodes
        if self.budgets and self.timed:
            self.bt_want = -1
            self.bt_filled = 0
            self.bt_last = 0.0  # the largest filled budget's time
            self.bt_room, self.bt_d, self.bt_at = self.sorted_budgets(n_dec)

    def _batch_times(self) -> None:
        """Predicted duration of the next batch for each launch budget (the latency model's
        estimate: decodes first, then unfinished prefills and the chosen requests' prompts, each
        chunk that the budget reaches counted once), written into the base.

        Within a boundary the prefill tokens wanted only grow, so a budget, once filled, keeps its
        value; every budget not filled yet is larger than the decodes and prefills everything
        wanted, so they share one value: one latency-model call per step.

        A larger budget's batch contains a smaller one's, so its value is at least the smaller
        one's: the latency models see only sums (the batch's mean chunk and context), and adding a
        short prompt can lower their attention estimate by a few percent; the running maximum
        keeps the values in budget order."""
        dp = self.dp
        n_dec, dec_ctx, mid, owed, mid_ctx = self.shape
        want = owed + dp.sel_tokens
        if want == self.bt_want:
            return
        self.bt_want = want
        lat, chunks, base = self.e.latency, mid + len(dp.sel), self.base
        rooms, k, (where, rest) = self.bt_room, self.bt_filled, self.bt_at
        last = self.bt_last
        while k < len(rooms) and rooms[k] <= want:  # newly filled: p = its room, for good
            p, d = rooms[k], self.bt_d[k]
            t = lat.batch_time(p, p + mid_ctx, chunks if p else 0, d, int(dec_ctx * d / n_dec) if n_dec else 0)
            last = t if t > last else last
            base[where[k]] = min(math.log1p(last * self.inv_unit) * self.inv_log_time, 1.0)
            k += 1
        self.bt_filled, self.bt_last = k, last
        if k < len(rooms):  # the others: everything wanted, every decode
            t = lat.batch_time(want, want + mid_ctx, chunks if want else 0, n_dec, dec_ctx)
            t = t if t > last else last
            base[rest[k]] = min(math.log1p(t * self.inv_unit) * self.inv_log_time, 1.0)

    def value_slots(self, order: list[int]) -> tuple[list[int], list]:
        """Where the budgets' values go, in ``order`` (budget indices): each one's position in
        the vector, and for each ``k`` an index of the positions of ``order[k:]`` (the budgets not
        filled yet), a slice when they are contiguous (the default budgets: the largest ones)."""
        where = [self.b0 + j for j in order]
        rest = []
        for k in range(len(where) + 1):
            tail = where[k:]
            contiguous = tail and max(tail) - min(tail) == len(tail) - 1
            rest.append(slice(min(tail), max(tail) + 1) if contiguous else np.array(tail, np.int64))
        return where, rest

    def sorted_budgets(self, n_dec: int):
        """Budgets sorted by the prefill room they leave after ``n_dec`` decodes (a budget below
        the decodes pauses some: it decodes ``min(budget, n_dec)`` and leaves no room), the
        decodes each one runs, and where each one's value goes; cached by ``n_dec``."""
        got = self.sorted_of.get(n_dec)
        if got is None:
            d = [min(b, n_dec) for b in self.budget_list]
            room = [b - x for b, x in zip(self.budget_list, d, strict=True)]
            order = sorted(range(len(room)), key=room.__getitem__)
            key = tuple(order)
            if key not in self.slots_of:
                self.slots_of[key] = self.value_slots(order)
            got = self.sorted_of[n_dec] = [room[j] for j in order], [d[j] for j in order], self.slots_of[key]
        return got

    def _fill_rows(self, ids: np.ndarray, now: float) -> None:
        """The boundary-dependent queue features of requests ``ids`` (constant while a batch forms)."""
        e, rows, dp = self.e, self.rows, self.dp
        age = self.arrival_u[ids]
        np.subtract(now * self.inv_unit, age, out=age)
        np.log1p(age, out=age)
        age *= self.inv_log_time
        self.age_col[ids] = np.minimum(age, 1.0, out=age)
        if self.prefix:
            rows[ids, Q["prefix_hit"]] = [e.kv.match_tokens(r) / self.prompt[r] for r in ids.tolist()]
        if self.multi_client:
            rows[ids, Q["service_deficit"]] = self._deficit(ids)
        if self.has_ttft:
            slack = np.clip((self.deadline[ids] - now) * self.inv_slo[ids], -1.0, 1.0)
            rows[ids, Q["slo_slack"]] = np.where(self.ttft_mask[ids], slack, 1.0)
        if self.swap:  # only a swapped-out request waits with computed KV
            pf = dp.prefilled[ids]
            rows[ids, Q["prefilled"]] = np.minimum(pf / np.maximum(dp.target[ids], 1), 1.0)

    def _deficit(self, ids: np.ndarray) -> np.ndarray:
        from llmsched_gym.core.metrics import client_service

        e = self.e
        wl = e.workload
        sv = client_service(e) / wl.client_weight
        active = np.bincount(wl.client[: e.next_idx], minlength=wl.n_clients) > 0
        top = float(sv[active].max()) if active.any() else 0.0
        return np.clip((top - sv[wl.client[ids]]) / (top + 1.0), 0.0, 1.0)
