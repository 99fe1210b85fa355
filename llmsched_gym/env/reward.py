"""Reward of ``LLMSched-v1``: a weighted sum of components measured between two agent decisions.

=============  ===================================================================================
component      raw value of one step (the weight multiplies it; ``info["reward_components"]``)
=============  ===================================================================================
``latency``    minus the request-seconds spent in the system since the previous step: the integral
               of (arrived, not yet completed or rejected requests) over time. It sums exactly to
               minus the summary's ``total_latency_s`` when every request completes (Jaillet et al.
               2025, Eq. (6): the latency added per round is the number of requests in the system).
``throughput`` output tokens generated (re-generated ones after a restart included).
``eviction``   minus the tokens whose KV was thrown away by preemptions and clears (recomputed).
``slo``        minus the requests that missed their SLO, each counted once: when its TTFT deadline
               passes without a first token in time, or at completion when the mean TPOT is over.
               The weight is a number, or ``{"online": w, "offline": w}`` per task class.
``fairness``   minus the per-tick service difference of Sheng et al. 2024 (section 4.2) now, times
               the time since the previous step: with ``s_j`` client ``j``'s service rate over the
               trailing ``FAIRNESS_WINDOW_S`` seconds and ``r_j`` the cost rate of the requests it
               sent in that window (rejected ones excluded), ``D = sum_j min(max_i s_i - s_j,
               |r_j - s_j|)``; service = prompt tokens when prefilled + 2 x output tokens as they
               are generated, both divided by the client's weight. An episode's components sum to
               minus the time integral of ``D`` (right-endpoint rule at the agent's steps), whose
               peak over ticks is the ``vtc-arena`` task's metric (``fairness.tick_diff.max``).
``ttft_tail``  minus the seconds, since the previous step, that requests spent waiting for their
               first token beyond ``threshold_s`` after their arrival (a request that is rejected
               stops counting then). An episode's components sum to minus
               ``sum_i max(0, TTFT_i - threshold_s)``: the hinge term of Rockafellar and Uryasev's
               conditional value at risk (2000, "Optimization of conditional value-at-risk",
               Journal of Risk 2(3), Theorem 1), ``CVaR_a = min_c c + E[max(0, X - c)] / (1 - a)``,
               whose minimising ``c`` is the ``a``-quantile: with ``threshold_s`` near the target
               percentile of TTFT (P99: the 99th) the return rewards shortening the tail beyond
               it, not the mean. Unlike ``slo``'s count, a request late by 60 s costs 60 times one
               late by 1 s, and the cost accrues while it waits (a dense signal). The weight is a
               number (``threshold_s`` 0: minus the sum of every TTFT) or ``{"weight": w,
               "threshold_s": c}``; the component is in ``info["reward_components"]`` only when
               its weight is given.
=============  ===================================================================================

Sums telescope: the latency, throughput, eviction and SLO components of a whole episode add up to
the run's totals, whatever the number of iterations simulated between decisions.

The fairness component of earlier v1 releases was minus the growth of the maximum service difference
between clients. That sum telescopes to minus the *final* difference, which the workload alone
fixes when every request completes (each client's total service is then its requests' cost): two
schedules of the same workload, however unfair on the way, earned the same fairness return.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from llmsched_gym.config import ConfigError
from llmsched_gym.core.metrics import client_service

if TYPE_CHECKING:
    from llmsched_gym.core.engine import Engine

REWARD_COMPONENTS = ("latency", "throughput", "eviction", "slo", "fairness", "ttft_tail")
CLASS_NAMES = ("online", "offline")
FAIRNESS_WINDOW_S = 60.0
"""The trailing window of the fairness component's rates: Sheng et al. 2024's artifact's ``w``."""
_REJECTED = 4


def parse_weights(reward: str | dict | None) -> dict[str, float | dict[str, float]]:
    """Validate ``reward=`` (a component name, or a dict of weights); one-line ValueError otherwise.

    ``ttft_tail`` comes back as ``{"weight": w, "threshold_s": c}`` whichever way it was given."""
    if reward is None:
        return {"latency": 1.0}
    if isinstance(reward, str):
        reward = {reward: 1.0}
    if not isinstance(reward, dict):
        raise ConfigError(f"reward: expected a dict of weights or a component name, got {reward!r}")
    out: dict[str, float | dict[str, float]] = {}
    for key, w in reward.items():
        if key not in REWARD_COMPONENTS:
            raise ConfigError(f"reward.{key}: unknown component; allowed: {', '.join(REWARD_COMPONENTS)}")
        if key == "ttft_tail" and isinstance(w, dict):
            bad = set(w) - {"weight", "threshold_s"}
            if bad:
                raise ConfigError(f"reward.ttft_tail.{sorted(bad)[0]}: unknown key; allowed: weight, threshold_s")
            thr = _finite(w.get("threshold_s", 0.0), "reward.ttft_tail.threshold_s")
            if thr < 0:
                raise ConfigError(f"reward.ttft_tail.threshold_s: must be >= 0, got {w['threshold_s']!r}")
            out[key] = {"weight": _finite(w.get("weight", 1.0), "reward.ttft_tail.weight"), "threshold_s": thr}
        elif key == "slo" and isinstance(w, dict):
            bad = set(w) - set(CLASS_NAMES)
            if bad:
                raise ConfigError(f"reward.slo.{sorted(bad)[0]}: unknown class; allowed: online, offline")
            out[key] = {c: _finite(w.get(c, 0.0), f"reward.slo.{c}") for c in CLASS_NAMES}
        elif key == "ttft_tail":
            out[key] = {"weight": _finite(w, "reward.ttft_tail"), "threshold_s": 0.0}
        else:
            out[key] = _finite(w, f"reward.{key}")
    return out


def _finite(value, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: expected a number, got {value!r}") from None
    if not np.isfinite(v):
        raise ConfigError(f"{name}: must be finite, got {value!r}")
    return v


@dataclass(slots=True)
class _Totals:
    """The episode's running totals that the components difference: the two engine counters the
    components read (copied as plain integers: a whole ``Counters.snapshot()`` per step costs more
    than the rest of the reward) plus the tracker's own (the latency cost, SLO misses per class)."""

    decoded: int
    recomputed: int
    cost: float = 0.0
    viol_online: int = 0
    viol_offline: int = 0


class RewardTracker:
    """Running totals of one episode; :meth:`collect` returns the step's reward and components,
    each the difference of two snapshots of the totals (the previous step's and this one's)."""

    def __init__(self, weights: dict[str, float | dict[str, float]]) -> None:
        self.weights = weights
        slo_w = weights.get("slo", 0.0)
        self._slo_w = slo_w if isinstance(slo_w, dict) else {c: float(slo_w) for c in CLASS_NAMES}
        self._scalar_w = [(k, float(w)) for k, w in weights.items() if k != "slo" and not isinstance(w, dict)]
        tail = weights.get("ttft_tail")
        self.has_tail = isinstance(tail, dict)
        if self.has_tail:
            self._tail_w, self._tail_thr = float(tail["weight"]), float(tail["threshold_s"])

    def reset(self, engine: Engine) -> None:
        wl = engine.workload
        self.engine = engine
        self._cum_arrival = np.concatenate(([0.0], np.cumsum(wl.arrival_s))).tolist()
        self._sum_done = 0.0  # completion (or rejection) times of the requests that left
        self._n_done = 0
        self._viol = [0, 0]
        self._prev = _Totals(engine.counters.total_decoded, engine.counters.recomputed_tokens_total)
        self._t_prev = float(engine.clock)
        self.has_slo = wl.has_slo
        self.multi_client = wl.n_clients > 1
        if self.multi_client:
            self._fair = _TickDifference(engine)
        if self.has_tail:
            self._tail_start = wl.arrival_s + self._tail_thr  # when a request starts to cost (sorted)
            self._tail_stop = np.full(len(wl.arrival_s), np.nan)  # rejection times
            self._tail_prev = 0.0
        if self.has_slo:
            has = np.isfinite(wl.ttft_slo_s)
            ids = np.nonzero(has)[0]
            deadline = wl.arrival_s[ids] + wl.ttft_slo_s[ids]
            order = np.argsort(deadline, kind="stable")
            self._dl_ids = ids[order]
            self._dl = deadline[order].tolist()
            self._dl_next = 0

    # engine events (forwarded by the env's scheduler adapter)
    def on_finish(self, rid: int, t: float) -> None:
        self._sum_done += t
        self._n_done += 1
        if self.has_slo:
            e, wl = self.engine, self.engine.workload
            ft = e.first_token_s[rid]
            ttft_ok = (ft - wl.arrival_s[rid]) <= wl.ttft_slo_s[rid]
            out = int(wl.output_tokens[rid])
            tpot = (e.completion_s[rid] - ft) / (out - 1) if out > 1 else 0.0
            # a late first token was already counted when its deadline passed
            if ttft_ok and tpot > wl.tpot_slo_s[rid]:
                self._viol[int(wl.task_class[rid])] += 1

    def on_reject(self, rid: int) -> None:
        self._sum_done += float(self.engine.workload.arrival_s[rid])
        self._n_done += 1
        if self.has_tail:
            self._tail_stop[rid] = float(self.engine.clock)

    def _tail_total(self, t: float) -> float:
        """``sum_i max(0, min(end_i, t) - arrival_i - threshold_s)`` over the requests whose
        threshold passed by ``t``; ``end_i``: the first token, the rejection, or ``t``."""
        j = int(np.searchsorted(self._tail_start, t, side="right"))
        if j == 0:
            return 0.0
        end = self.engine.first_token_s[:j]
        end = np.where(np.isnan(end), self._tail_stop[:j], end)
        end = np.where(np.isnan(end), t, np.minimum(end, t))
        return float(np.maximum(end - self._tail_start[:j], 0.0).sum())

    def _totals(self) -> _Totals:
        e = self.engine
        n_arr = e.next_idx
        cost = (n_arr - self._n_done) * e.clock - self._cum_arrival[n_arr] + self._sum_done
        if self.has_slo:
            self._ttft_deadlines(e.clock)
        c = e.counters
        return _Totals(c.total_decoded, c.recomputed_tokens_total, cost, self._viol[0], self._viol[1])

    def collect(self) -> tuple[float, dict[str, float]]:
        now, prev = self._totals(), self._prev
        self._prev = now
        t = float(self.engine.clock)
        fair = -self._fair.at(t) * (t - self._t_prev) if self.multi_client and t > self._t_prev else 0.0
        self._t_prev = t
        d_on, d_off = now.viol_online - prev.viol_online, now.viol_offline - prev.viol_offline
        comps = {
            "latency": prev.cost - now.cost,
            "throughput": float(now.decoded - prev.decoded),
            "eviction": float(prev.recomputed - now.recomputed),
            "slo": 0.0,
            "fairness": fair,
        }
        reward = 0.0
        for k, w in self._scalar_w:
            reward += w * comps[k]
        if self.has_slo:
            comps["slo"] = -float(d_on + d_off)
            comps["slo_online"] = -float(d_on)
            comps["slo_offline"] = -float(d_off)
            reward -= self._slo_w["online"] * d_on + self._slo_w["offline"] * d_off
        if self.has_tail:
            total = self._tail_total(t)
            comps["ttft_tail"] = self._tail_prev - total
            self._tail_prev = total
            reward += self._tail_w * comps["ttft_tail"]
        return reward, comps

    def _ttft_deadlines(self, t: float) -> None:
        """Judge the TTFT of every request whose deadline has passed (once per request)."""
        j = bisect.bisect_right(self._dl, t, lo=self._dl_next)
        if j == self._dl_next:
            return
        e, wl = self.engine, self.engine.workload
        ids = self._dl_ids[self._dl_next:j]
        self._dl_next = j
        ok = (e.first_token_s[ids] - wl.arrival_s[ids]) <= wl.ttft_slo_s[ids]
        late = ids[~ok]
        if len(late):
            counts = np.bincount(wl.task_class[late], minlength=2)
            self._viol[0] += int(counts[0])
            self._viol[1] += int(counts[1])


class _TickDifference:
    """Sheng et al. 2024's per-tick service difference at the current time, over the trailing window
    (the ``fairness`` component's ``D``): snapshots of every client's cumulative service at the
    agent's steps, interpolated at ``t - FAIRNESS_WINDOW_S``, and the cost of the requests sent in
    the window."""

    def __init__(self, engine: Engine) -> None:
        wl = engine.workload
        self.engine = engine
        self.weight = np.asarray(wl.client_weight, dtype=float)
        self.n = wl.n_clients
        self.arrival = wl.arrival_s
        self.cost = wl.prompt_tokens + 2.0 * wl.output_tokens  # h(n_p, n_q) = n_p + 2 n_q (section 3.1)
        self.times: list[float] = [min(0.0, float(engine.clock))]
        self.service: list[np.ndarray] = [np.zeros(self.n)]

    def _service_at(self, t: float) -> np.ndarray:
        """Cumulative service at ``t`` (linear between snapshots; the first one before them all)."""
        j = bisect.bisect_right(self.times, t)
        if j == 0:
            return self.service[0]
        if j == len(self.times):
            return self.service[-1]
        t0, t1 = self.times[j - 1], self.times[j]
        a = (t - t0) / (t1 - t0) if t1 > t0 else 1.0
        return self.service[j - 1] + a * (self.service[j] - self.service[j - 1])

    def at(self, t: float) -> float:
        """``D`` at time ``t`` (the engine's clock now), recording this step's snapshot."""
        e, w = self.engine, FAIRNESS_WINDOW_S
        now = client_service(e) / self.weight
        start = t - w
        old = self._service_at(start)
        self.times.append(t)
        self.service.append(now)
        # drop snapshots no later window can need (the one just before this window's start stays)
        k = bisect.bisect_right(self.times, start) - 1
        if k > 0:
            del self.times[:k], self.service[:k]
        s = (now - old) / w
        i0, i1 = np.searchsorted(self.arrival, (start, t), side="left")
        i1 = min(int(i1), e.next_idx)
        sent = slice(int(i0), i1)
        keep = e.state[sent] != _REJECTED
        r = np.bincount(e.workload.client[sent][keep], weights=self.cost[sent][keep], minlength=self.n) / self.weight / w
        return float(np.minimum(s.max() - s, np.abs(r - s)).sum())
