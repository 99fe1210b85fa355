"""Sheng et al. 2024 ("Fairness in Serving Large Language Models"): the Virtual
Token Counter family and its baselines, all on one admission loop.

Rule (VTC, Algorithm 2, §4.1): each client has a counter of the weighted service it received;
every admission takes the oldest waiting request of the waiting client with the lowest counter,
charging ``h(n_p, 0)`` at admission and ``h(n_p, n_q) - h(n_p, n_q - 1)`` per output token
(``h = w_p n_p + w_q n_q`` with 1 and 2 by default, Algorithm 4 for a general ``h``); a client
that joins the waiting set is lifted to the lowest counter of the waiting clients.

=================  ==========================================================================
``vtc``            Algorithm 2 / 4 (``cost``: linear, profiled, profiled-artifact or a callable)
``vtc-weighted``   §4.3: every charge divided by the client's weight (workload or ``weights``)
``vtc-predict``    Algorithm 3: the predicted output is charged at admission, tokens beyond it
                   per step, the over-prediction refunded at finish; ``predictor``: ``last5``
                   (mean of the client's last five outputs, the paper), ``ema5`` (the
                   artifact), ``noisy`` (predicted length x U(1 - noise, 1 + noise): the
                   true length, as App. B.3, on a clairvoyant scenario), ``workload`` (the
                   scenario's ``predicted_output``)
``vtc-oracle``     Algorithm 3 with the true output length
``lcf``            least counter first: VTC without the lift (§5.1)
``rpm``            requests-per-minute limit per client, FCFS otherwise (§5.1); ``limit = 0``
                   is no limit, i.e. the paper's FCFS on this admission loop
``drr``            Appendix C.2's adapted deficit round robin with quantum ``quantum``
=================  ==========================================================================

State for observers (e.g. a learned policy): ``counter`` (per client, cost units divided by the
weight), ``n_lifts`` and ``waiting_clients``; DRR adds ``credit``.

Admission loop (LightLLM/S-LoRA, Algorithm 1 of section 2.1): when nothing runs, admit at once; otherwise
every ``admit_every`` decode iterations (K = 10), and at every iteration after an attempt that
admitted nothing. A minibatch takes requests in the policy's order until one does not fit
(no skipping), the running set reaches ``max_running`` or its input tokens would exceed
``batch_max_tokens`` (-1: LightLLM's ``max(M // 6, 3072)``; 0: no cap). ``memory="reserve"`` is
LightLLM's reservation: admit only if ``max_k (left_(k) k + sum_{m<=k} s_(m)) <= M`` over the
running requests and the minibatch sorted by remaining output ``left`` (``s``: KV now), so the
KV never overflows (nothing is evicted; run with ``overflow=forbid`` to check); ``"sum"`` reserves
every running request's whole prompt + output at once (``sum <= M``), the reading under which
Lemma 4.3's proof ("a client decodes at most M tokens after its last selection") holds; ``"fit"``
only needs the prompt plus one token to fit now (the engine's overflow handler then evicts).

Departures from the paper, with reasons:

* The reservation uses ``predicted_output`` as ``max_new_tokens`` (the paper's runs set it to
  the true length, which the scenarios' default oracle predictor reproduces), ``<= M`` instead of
  ``< M`` (our KV count is exact: the prefill writes prompt + first token), and whole blocks in
  paged mode (one block of slack per request). When nothing runs, the first pick is admitted
  whatever the check says (work conservation; the engine checked it fits alone).
* Lemma 4.3's bound ``U = max(w_p L_input, w_q M)`` assumes a client decodes at most ``M`` tokens
  after its last selection. Under the peak check (``reserve``, LightLLM's) requests that finish at
  staggered times can decode more than ``M`` in total while another client's request waits for
  room, so the counter spread can exceed ``U`` slightly (a constructed case in
  ``tests/test_baselines_vtc.py`` reaches 225 > U = 222); under ``memory="sum"`` it cannot.
* Ties in the lowest counter go to the lowest client id (the paper leaves them open).
* Every output token is charged, the prefill's first token included (the paper; the artifact
  skips that token and charges an extra step at finishes). Counters are never reset.
* The lift when the waiting queue is empty uses the counter of the last client that left it
  (the paper; ``lift_when_idle=False`` is the artifact, which does not lift then). A preempted
  request re-entering the queue is not an arrival and causes no lift.
* The paper has no preemption; under ``memory="fit"`` a re-admitted request is charged again for
  its re-prefilled tokens (``w_p`` each) only with ``charge_recompute=True``, and tokens generated
  again after a ``restart`` preemption are not charged twice.
* ``vtc-predict``'s ``last5`` predicts 0 before a client's first completion (as the artifact's
  EMA starts); ``noisy`` draws from the policy's own seeded stream.
* RPM rejects (the artifact's sliding 60 s window over accepted requests; ``window="fixed"`` is
  the paper's per-minute window) instead of blocking; rejected requests are reported with
  ``reject_reason`` and count in ``n_rejected``.
* Switching policies (the env's ``meta`` mode): a request another policy admitted leaves the
  queues at the next decision or arrival and is charged as if admitted here (its prompt, and for
  the predicting variants the predicted rest of its output; the tokens it produced were charged
  as they came); RPM serves the requests it refused but the active policy accepted; a running
  request left mid-prefill is finished first (:func:`~baselines.base.finish_prefills`).
* DRR's refill visits every client in round-robin order (an idle client stops at a positive
  balance, which is what makes it mirror the lift); rounds in which nobody can be served are
  skipped in one arithmetic step instead of simulated.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections import deque
from typing import Any

import numpy as np

from llmsched_gym.core.engine import DONE, REJECTED, WAITING
from llmsched_gym.core.fairness import COST_NAMES, make_cost
from llmsched_gym.core.scheduler import BatchPlan, EngineView, Scheduler

from .base import PolicyError, configure, finish_prefills, register

ADMISSION_PARAMS: dict[str, Any] = {
    "admit_every": 10, "memory": "reserve", "batch_max_tokens": -1, "max_running": 1000,
}
COUNTER_PARAMS: dict[str, Any] = {
    **ADMISSION_PARAMS, "w_p": 1.0, "w_q": 2.0, "cost": "linear", "charge_recompute": False,
}


def _check(ok: bool, param: str, allowed: str, value: Any) -> None:
    if not ok:
        raise PolicyError(f"policy.{param}: must be {allowed}, got {value!r}")


class _Reservation:
    """LightLLM's peak-KV check over the running requests plus an accepted minibatch (tokens)."""

    def __init__(self, view: EngineView, pred: np.ndarray) -> None:
        kv, gen, target, done = view.kv_tokens, view.generated, view.prefill_target, view.prefilled
        entries = sorted(
            ((max(int(pred[r] - gen[r]), 0), int(kv[r] + target[r] - done[r])) for r in view.running),
            reverse=True,
        )
        self.neg_left = [-e[0] for e in entries]
        self.s = [e[1] for e in entries]
        self.slack = view.block_size - 1
        self.cap = view.kv_capacity
        # the admission iteration writes the prompt plus (real engines) the first token; modelled
        # as s = prompt at step 0 growing one token per step like a running request
        self.shift = 0 if view.prefill_emits_token else 1

    def _entry(self, prompt: int, out: int) -> tuple[int, int]:
        return out + self.shift, prompt - self.shift

    def fits(self, prompt: int, out: int) -> bool:
        left, s = self._entry(prompt, out)
        i = bisect_right(self.neg_left, -left)
        lefts = self.neg_left[:i] + [-left] + self.neg_left[i:]
        ss = self.s[:i] + [s] + self.s[i:]
        need, acc = 0, 0
        for k, (nl, sk) in enumerate(zip(lefts, ss, strict=True), start=1):
            acc += sk
            need = max(need, acc - nl * k)
        return need + len(ss) * self.slack <= self.cap

    def add(self, prompt: int, out: int) -> None:
        left, s = self._entry(prompt, out)
        i = bisect_right(self.neg_left, -left)
        self.neg_left.insert(i, -left)
        self.s.insert(i, s)


class _SumReservation:
    """The reading under which Lemma 4.3's proof holds: every running request holds its whole
    prompt + output (predicted) at once, ``sum <= M``, so a client decodes at most ``M`` tokens
    after its last selection. Stricter than the peak check (fewer requests run together)."""

    def __init__(self, view: EngineView, pred: np.ndarray) -> None:
        bs = view.block_size
        self.bs = bs
        self.used = sum(-(-(int(view.prompt_tokens[r]) + max(int(pred[r]), int(view.generated[r]) + 1)) // bs) * bs
                        for r in view.running)
        self.cap = view.kv_capacity

    def _need(self, prompt: int, out: int) -> int:
        return -(-(prompt + out) // self.bs) * self.bs

    def fits(self, prompt: int, out: int) -> bool:
        return self.used + self._need(prompt, out) <= self.cap

    def add(self, prompt: int, out: int) -> None:
        self.used += self._need(prompt, out)


class _FreeNow:
    """Optimistic check: the prompt plus one token fits in the free KV right now."""

    def __init__(self, view: EngineView) -> None:
        self.free = view.kv_free
        self.bs = view.block_size

    def _need(self, prompt: int) -> int:
        return -(-(prompt + 1) // self.bs) * self.bs

    def fits(self, prompt: int, out: int) -> bool:
        return self._need(prompt) <= self.free

    def add(self, prompt: int, out: int) -> None:
        self.free -= self._need(prompt)


class _FairAdmission(Scheduler):
    """Per-client FIFO queues and the LightLLM admission loop; subclasses choose the client."""

    receives = False  # per-request state starts at on_arrival: no decode replica of a disaggregated cluster

    params = ADMISSION_PARAMS

    def __init__(self, **kwargs: Any) -> None:
        configure(self, kwargs)
        _check(self.admit_every >= 0, "admit_every", "an int >= 0 (decode iterations between admissions)",
               self.admit_every)
        _check(self.memory in ("reserve", "sum", "fit"), "memory", "one of reserve, sum, fit", self.memory)
        _check(self.batch_max_tokens >= -1, "batch_max_tokens", "an int >= -1 (-1 auto, 0 no cap)",
               self.batch_max_tokens)
        _check(self.max_running >= 0, "max_running", "an int >= 0 (0 = no cap)", self.max_running)

    def needs(self) -> str:
        return "nothing" if self.memory == "fit" else "predicted"

    def reset(self, config, rng: np.random.Generator) -> None:
        super().reset(config, rng)
        self._ready = False

    def _setup(self, view: EngineView) -> None:
        wl = view.workload
        self.n_clients = wl.n_clients
        self._client = wl.client
        self._queue: list[list[int]] = [[] for _ in range(self.n_clients)]
        self._active: set[int] = set()
        self._n_queued = 0
        self._last_left = -1
        self._admit_iter = -(1 << 62)
        cap = self.batch_max_tokens
        self._batch_cap = max(view.kv_capacity // 6, 3072) if cap == -1 else cap
        self._ready = True

    def _arrived(self, req_id: int, view: EngineView) -> None:
        """Set up at the first arrival; then follow a workload that grows while the run goes on
        (a replica of a cluster learns of its requests when they are routed to it,
        :meth:`Engine.extend`): a request beyond the rows known so far refreshes the per-request
        references and lengthens this policy's own arrays (:meth:`_grow`). A one-engine run
        knows every request from the start and never grows."""
        if not self._ready:
            self._setup(view)
        elif req_id >= len(self._client):
            self._grow(view)

    def _grow(self, view: EngineView) -> None:
        self._client = view.workload.client

    @property
    def waiting_clients(self) -> set[int]:
        """Clients with a request in the waiting queue (the paper's "i in Q"); read only."""
        return self._active

    # ---- queue bookkeeping ----------------------------------------------------------------
    def _enqueue(self, rid: int) -> None:
        c = int(self._client[rid])
        heapq.heappush(self._queue[c], rid)
        self._active.add(c)
        self._n_queued += 1

    def _sync(self, view: EngineView) -> None:
        """Make the queues exactly the waiting requests (the env's ``meta`` mode switches
        policies): a request another policy admitted leaves its queue and is charged as if
        admitted here, one the active policy rejected leaves uncharged, and of a request that
        came back preempted one entry stays. The queues hold every waiting request (every
        arrival and preemption is queued; RPM first adopts the ones it refused but the active
        policy accepted), so an equal count means nothing to drop, as in every single-policy run.
        A client whose queue empties leaves the waiting set (``_last_left``: the one with the
        highest counter among them, for the idle lift)."""
        if self._n_queued == len(view.waiting):
            return
        state = view.state
        seen: set[int] = set()
        left = []
        for c in sorted(self._active):
            keep = []
            for r in self._queue[c]:
                if r in seen:
                    continue
                seen.add(r)
                st = state[r]
                if st == WAITING:
                    keep.append(r)
                elif st != REJECTED:
                    self._on_admit(r, c, view)
            heapq.heapify(keep)
            self._queue[c] = keep
            if not keep:
                self._active.discard(c)
                left.append(c)
        self._n_queued = sum(len(self._queue[c]) for c in self._active)
        if left:
            self._last_left = max(left, key=self._left_rank)

    def _left_rank(self, c: int) -> float:
        return 0.0

    def on_arrival(self, req_id: int, view: EngineView) -> bool:
        self._arrived(req_id, view)
        self._enqueue(req_id)
        return True

    def on_preempt(self, req_id: int, view: EngineView) -> None:
        self._enqueue(req_id)

    # ---- policy-specific parts -------------------------------------------------------------
    def _select(self) -> int:
        """The client whose oldest waiting request is admitted next (-1: none)."""
        return min(self._active, key=lambda c: self._queue[c][0], default=-1)

    def _on_admit(self, rid: int, client: int, view: EngineView) -> None:
        """Charge an admission (counter policies)."""

    # ---- the loop --------------------------------------------------------------------------
    def _memory(self, view: EngineView) -> _Reservation | _SumReservation | _FreeNow:
        if self.memory == "reserve":
            return _Reservation(view, view.predicted_output)
        return _SumReservation(view, view.predicted_output) if self.memory == "sum" else _FreeNow(view)

    def schedule(self, view: EngineView) -> BatchPlan:
        if self._ready:
            self._sync(view)
        cont, blocks = finish_prefills(view)  # only in the env's meta mode
        if not self._active:
            return BatchPlan.admit(cont) if cont else BatchPlan.decode_only(hold=True)
        n_run = len(view.running)
        if n_run and view.iteration - self._admit_iter <= self.admit_every:
            return BatchPlan.admit(cont) if cont else BatchPlan.decode_only(hold=False)
        mem = self._memory(view)
        if blocks and isinstance(mem, _FreeNow):
            mem.free -= blocks * view.block_size  # the reservations count unfinished prefills
        prompt, pred = view.prompt_tokens, view.predicted_output
        admitted: list[int] = []
        batch_tokens = 0
        while not (self.max_running and n_run + len(admitted) >= self.max_running):
            c = self._select()
            if c < 0:
                break
            rid = self._queue[c][0]
            p, o = int(prompt[rid]), int(pred[rid])
            first = not admitted
            if not first and self._batch_cap and batch_tokens + p > self._batch_cap:
                break
            if not mem.fits(p, o) and not (first and n_run == 0):
                break
            mem.add(p, o)
            heapq.heappop(self._queue[c])
            self._n_queued -= 1
            if not self._queue[c]:
                self._active.discard(c)
                self._last_left = c
            batch_tokens += p
            admitted.append(rid)
            self._on_admit(rid, c, view)
        if admitted:
            self._admit_iter = view.iteration
            return BatchPlan.admit(cont + admitted)
        return BatchPlan.admit(cont) if cont else BatchPlan.decode_only(hold=self._blocked(view, mem))

    def _blocked(self, view: EngineView, mem: _Reservation | _FreeNow) -> bool:
        """Whether only a completion or an arrival can change this failed attempt's outcome: the
        running set is full, or (``fit``: free KV only shrinks) no waiting client's oldest request
        fits. A reservation's peak can fall as running requests progress, so it never holds."""
        if self.max_running and len(view.running) >= self.max_running:
            return True
        if isinstance(mem, _Reservation):
            return False
        prompt, pred = view.prompt_tokens, view.predicted_output
        return not any(mem.fits(int(prompt[r]), int(pred[r])) for r in (self._queue[c][0] for c in self._active))


class _CounterPolicy(_FairAdmission):
    """Per-client virtual counters charged with ``h`` (VTC, LCF, DRR)."""

    params = COUNTER_PARAMS
    use_weights = False

    def __init__(self, **kwargs: Any) -> None:
        cost = kwargs.get("cost")
        custom = cost if callable(cost) else None
        if custom is not None:
            kwargs = {**kwargs, "cost": "custom"}
        super().__init__(**kwargs)
        _check(self.w_p >= 0, "w_p", "a number >= 0", self.w_p)
        _check(self.w_q > 0, "w_q", "a number > 0", self.w_q)
        if custom is None:
            _check(self.cost in COST_NAMES, "cost", f"one of {', '.join(COST_NAMES)} or a callable h(n_p, n_q)",
                   self.cost)
            self.h = make_cost(self.cost, self.w_p, self.w_q)
        else:
            self.h = custom
        self._linear = self.cost == "linear"

    def _weights(self, view: EngineView) -> np.ndarray:
        return np.ones(view.workload.n_clients)

    def _setup(self, view: EngineView) -> None:
        super()._setup(view)
        n = len(view.workload)
        self.counter = np.zeros(self.n_clients)
        self.n_lifts = 0
        self._w = self._weights(view)
        self._n_p = view.prompt_tokens
        self._cq = np.zeros(n)  # output tokens charged so far (or predicted up front)
        self._charged = np.zeros(n, dtype=bool)

    def _grow(self, view: EngineView) -> None:
        super()._grow(view)
        self._n_p = view.prompt_tokens
        n = len(view.workload)
        if n > len(self._cq):  # doubling: O(1) amortised per request
            cap = max(n, 2 * len(self._cq))
            self._cq = np.concatenate([self._cq, np.zeros(cap - len(self._cq))])
            self._charged = np.concatenate([self._charged, np.zeros(cap - len(self._charged), dtype=bool)])

    def _predict(self, rid: int, view: EngineView) -> int:
        """Output tokens charged at admission (0: plain VTC charges output as it is generated)."""
        return 0

    def on_arrival(self, req_id: int, view: EngineView) -> bool:
        if self._ready and self._n_queued != len(view.waiting):
            self._sync(view)
        self._arrived(req_id, view)  # the env's meta mode: whether the client waits, and the lift target
        c = int(self._client[req_id])
        if not self._queue[c]:
            self._lift(c)
        self._enqueue(req_id)
        return True

    def _left_rank(self, c: int) -> float:
        return float(self.counter[c])

    def _lift(self, c: int) -> None:
        """Counter lift of a client joining the waiting set (VTC only)."""

    def _on_admit(self, rid: int, client: int, view: EngineView) -> None:
        if self._charged[rid]:
            if self.charge_recompute:
                self.counter[client] += self.w_p * float(view.prefill_target[rid]) / self._w[client]
            return
        self._charged[rid] = True
        cq = self._cq[rid]
        if not cq:
            pred = self._predict(rid, view)
            self._cq[rid] = pred
            self.counter[client] += float(self.h(self._n_p[rid], pred)) / self._w[client]
            return
        # admitted by another policy (the env's meta mode): its ``cq`` output tokens are charged
        # already (h(n_p, cq) - h(n_p, 0)); charge the rest of h(n_p, max(cq, prediction)), no
        # prediction once it is done
        p = self._n_p[rid]
        new = cq if view.state[rid] == DONE else max(cq, self._predict(rid, view))
        self._cq[rid] = new
        self.counter[client] += float(self.h(p, new) - self.h(p, cq) + self.h(p, 0)) / self._w[client]

    def on_tokens(self, req_ids: np.ndarray, n: int, view: EngineView) -> None:
        g = view.generated[req_ids]
        cq = self._cq[req_ids]
        new = np.maximum(cq, g)
        if self._linear:
            delta = self.w_q * (new - cq)
        else:
            p = self._n_p[req_ids]
            delta = self.h(p, new) - self.h(p, cq)
        self._cq[req_ids] = new
        c = self._client[req_ids]
        self.counter += np.bincount(c, weights=delta / self._w[c], minlength=self.n_clients)

    def on_finish(self, req_id: int, view: EngineView) -> None:
        g = int(view.generated[req_id])
        cq = self._cq[req_id]
        if g < cq:
            c = int(self._client[req_id])
            p = self._n_p[req_id]
            self.counter[c] += float(self.h(p, g) - self.h(p, cq)) / self._w[c]
            self._cq[req_id] = g

    def _select(self) -> int:
        # lowest counter; ties to the lowest client id
        counter = self.counter
        return min(self._active, key=lambda c: (counter[c], c), default=-1)


@register("lcf")
class LCF(_CounterPolicy):
    """Least counter first: VTC's counters and order without the lift (Sheng et al. 2024, section 5.1)."""


@register("vtc")
class VTC(_CounterPolicy):
    """Virtual Token Counter (Sheng et al. 2024, Algorithm 2 / 4); see the module docstring."""

    params = {**COUNTER_PARAMS, "lift_when_idle": True}

    def _lift(self, c: int) -> None:
        if self._active:
            target = min(self.counter[i] for i in self._active)
        elif self.lift_when_idle and self._last_left >= 0:
            target = self.counter[self._last_left]
        else:
            return
        if self.counter[c] < target:
            self.counter[c] = target
            self.n_lifts += 1


@register("vtc-weighted")
class WeightedVTC(VTC):
    """Weighted VTC (Sheng et al. 2024, section 4.3): charges divided by the client's weight (``weights`` overrides
    the workload's ``client_weight``)."""

    params = {**VTC.params, "weights": None}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self.weights is not None:
            w = self.weights
            ok = isinstance(w, list | tuple) and all(isinstance(x, int | float) and x > 0 for x in w)
            _check(ok, "weights", "a list of numbers > 0 (one per client)", w)

    def _weights(self, view: EngineView) -> np.ndarray:
        n = view.workload.n_clients
        if self.weights is None:
            return np.asarray(view.workload.client_weight, dtype=float)
        if len(self.weights) < n:
            raise PolicyError(f"policy.weights: need {n} weights (one per client), got {len(self.weights)}")
        return np.asarray(self.weights[:n], dtype=float)


PREDICTORS = ("last5", "ema5", "noisy", "workload")


@register("vtc-predict")
class PredictVTC(VTC):
    """VTC with length prediction (Sheng et al. 2024, Algorithm 3, section 4.4); see the module docstring."""

    params = {**VTC.params, "predictor": "last5", "noise": 0.5}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        _check(self.predictor in PREDICTORS, "predictor", f"one of {', '.join(PREDICTORS)}", self.predictor)
        _check(0.0 <= self.noise <= 1.0, "noise", "in [0, 1]", self.noise)

    def needs(self) -> str:
        return "predicted" if self.predictor in ("noisy", "workload") else super().needs()

    def _setup(self, view: EngineView) -> None:
        super()._setup(view)
        self._history: list[deque[int]] = [deque(maxlen=5) for _ in range(self.n_clients)]
        self._ema = np.zeros(self.n_clients)

    def _predict(self, rid: int, view: EngineView) -> int:
        kind = self.predictor
        if kind == "last5":
            h = self._history[int(self._client[rid])]
            return round(sum(h) / len(h)) if h else 0
        if kind == "ema5":
            return round(self._ema[int(self._client[rid])])
        if kind == "noisy":  # the paper's noise on the true length: on the prediction (the true one when clairvoyant)
            base = int(view.predicted_output[rid])
            return max(1, round(base * self.rng.uniform(1.0 - self.noise, 1.0 + self.noise)))
        return int(view.predicted_output[rid])

    def on_finish(self, req_id: int, view: EngineView) -> None:
        super().on_finish(req_id, view)
        c = int(self._client[req_id])
        out = int(view.generated[req_id])
        h = self._history[c]
        self._ema[c] = out if not h else (4 * self._ema[c] + out) / 5
        h.append(out)


@register("vtc-oracle")
class OracleVTC(VTC):
    """VTC charged with the true output length at admission (Sheng et al. 2024, section 4.4, VTC(oracle))."""

    def needs(self) -> str:
        return "true"

    def _predict(self, rid: int, view: EngineView) -> int:
        return int(view.workload.output_tokens[rid])


@register("rpm")
class RPM(_FairAdmission):
    """Per-client requests-per-minute limit in front of FCFS (Sheng et al. 2024, section 5.1); rejected requests are
    reported (``reject_reason``), never lost."""

    params = {**ADMISSION_PARAMS, "limit": 5, "window_s": 60.0, "window": "sliding"}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        _check(self.limit >= 0, "limit", "an int >= 0 (0 = no limit)", self.limit)
        _check(self.window_s > 0, "window_s", "a number > 0", self.window_s)
        _check(self.window in ("sliding", "fixed"), "window", "one of sliding, fixed", self.window)

    def _setup(self, view: EngineView) -> None:
        super()._setup(view)
        self._accepted: list[deque[float]] = [deque() for _ in range(self.n_clients)]
        self._refused: list[int] = []

    def on_arrival(self, req_id: int, view: EngineView) -> bool:
        self._arrived(req_id, view)
        if self.limit:
            t = float(view.arrival_s[req_id])
            acc = self._accepted[int(self._client[req_id])]
            start = t - self.window_s if self.window == "sliding" else math.floor(t / self.window_s) * self.window_s
            while acc and acc[0] < start:
                acc.popleft()
            if len(acc) >= self.limit:
                self._refused.append(req_id)
                return False
            acc.append(t)
        self._enqueue(req_id)
        return True

    def _sync(self, view: EngineView) -> None:
        """First adopt the requests this policy refused but the active one accepted (the env's
        ``meta`` mode): they wait in the engine's queue and are served FCFS like the others
        (without counting in the window). A single-policy run refuses only rejected ones."""
        if self._refused:
            state = view.state
            for r in self._refused:
                if state[r] == WAITING:
                    self._enqueue(r)
            self._refused.clear()
        super()._sync(view)

    def reject_reason(self, req_id: int) -> str:
        c = int(self._client[req_id])
        return f"rpm: client {c} already had {self.limit} requests accepted in the {self.window} {self.window_s:g} s window"


@register("drr")
class DRR(_CounterPolicy):
    """Adapted deficit round robin (Sheng et al. 2024, Appendix C.2): client i's balance is its credit minus
    its counter; a visit refills ``quantum`` when the balance is <= 0 and, if it is then positive,
    admits the client's requests until it is not."""

    params = {**COUNTER_PARAMS, "quantum": 512.0}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        _check(self.quantum > 0, "quantum", "a number > 0 (cost units)", self.quantum)

    def _setup(self, view: EngineView) -> None:
        super()._setup(view)
        self.credit = np.zeros(self.n_clients)
        self._rr = 0
        self._visiting = False

    def _select(self) -> int:
        if not self._active:
            return -1
        n, q = self.n_clients, self.quantum
        idle_visits = 0
        while True:
            i = self._rr
            if not self._visiting:
                if self.credit[i] - self.counter[i] <= 0:
                    self.credit[i] += q
                self._visiting = True
            if self._queue[i] and self.credit[i] > self.counter[i]:
                return i
            self._rr = (i + 1) % n
            self._visiting = False
            idle_visits += 1
            if idle_visits >= n:
                # a whole round served nobody: skip the rounds until a waiting client turns positive
                bal = self.credit - self.counter
                waiting = np.fromiter(self._active, dtype=np.int64)
                rounds = int(np.min(np.floor(-bal[waiting] / q))) if len(waiting) else 0
                if rounds > 0:
                    owed = bal <= 0
                    self.credit[owed] += q * np.minimum(rounds, np.floor(-bal[owed] / q) + 1)
                idle_visits = 0
