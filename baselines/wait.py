"""Ao, Luo, Simchi-Levi and Wang 2025 ("Optimizing LLM Inference: Fluid-Guided Online Scheduling
with Memory Constraints", arXiv 2504.11320 v2): the FCFS baseline of section 3 and WAIT
(Algorithm 1, section 4).

``fcfs-greedy-lifo`` (paper section 3, Example 2, Prop. 3): every iteration prefills the waiting
prompts (queue order, as many as fit in the KV free now: our "mild memory admission
check") and decodes every running one; when the KV after the iteration would exceed C, the most
recently admitted running prompts are evicted (full restart, back to the queue) until it fits.
On Example 2 this replays the paper's cycle (3, 4, 3, ... completions per iteration).

``wait`` (Algorithm 1): type j has a per-stage threshold n_j. Type j joins a batch only when at
least n_j of its prompts wait for prefill; the batch then advances min(n_j, count) prompts of type
j at every stage (prefill and each decode stage), FIFO. Other types' prompts stay paused with
their KV. Resident memory is therefore at most M^pi = sum_j n_j (l'_j+1)(l_j+l'_j/2) and WAIT
never evicts when M^pi <= C.

Thresholds (``rule``, via :mod:`llmsched_gym.fluid`): ``fluid`` (default) n_j = ceil(c lambda_j),
with ``c`` seconds, or c = Delta T* (the equilibrium pi*, section 4.2) when ``c`` = 0; when that
breaks M^pi <= C or no equilibrium exists (C < M* or d1 A >= 1), c = C/A fills the memory and
n_j = max(1, floor(c lambda_j)) (Remark 1's overloaded regime). ``practical``: the companion
code's fluid-proportional reading of the paper's section 6.1 rule, n_j = max(1, floor(B lambda_j /
sum_j' lambda_j' (l'_j'+1))) with B = ``batch_size``; ``practical_literal``: the formula as printed,
n_j = max(1, floor(B rho_j / (l'_j+1))), rho_j = lambda_j / sum lambda; or explicit
``thresholds`` (one per type id).

Readings and departures:

* Types are the workload's ``type_id``; l_j and l'_j are the type's mean prompt and mean
  predicted output (fixed per type in the paper's workloads); lambda_j is the type's empirical
  rate (count / arrival span), i.e. the paper's known rates, unless ``rates`` are given.
* Eq. 1's d0, d1 come from the scenario's latency model (:func:`linear_coefficients`: exact for
  ``linear``, a chord over the memory-filling range otherwise; the paper gives no values).
* Paged KV (outside the paper): M^pi counts each prompt's partly filled last block at every
  stage (+ block_size - 1 tokens), so the fluid thresholds stay eviction-free.
* Cells are (type, tokens generated); the paper's stage is that + 1 when prefill emits no token.
* A step where no type meets its threshold idles until the next arrival. End of horizon (not
  in the paper): once no arrival is left, every type runs with min(n_j, count) per stage and no
  threshold, so the queue drains (the companion code drops it; that would bias the metrics).
* Memory guard (not in the paper; it never binds when M^pi <= C): a prompt is prefilled only if
  it fits in the KV left after the step's decodes. If that leaves nothing to run while paused
  prompts hold the memory, every type runs that step without thresholds (else the worker would
  deadlock). Decode overflow (lengths that differ from the type's, M^pi > C) goes to the
  engine's LIFO preemption in the scenario's mode (the paper: full restart).
* Switching policies (the env's ``meta`` mode): both policies read the queue and the running
  set from the engine; a running request another policy left mid-prefill is finished in the
  next step that runs (:func:`~baselines.base.finish_prefills`; WAIT's idle steps keep it
  resident like the paused ones).
* fcfs-greedy-lifo: the evicted prompts re-enter at the head of the queue (the engine's rule;
  the paper says "as new arrivals", which only matters when the queue does not fit at once).
  Under a persistent backlog the cycle settles at 3 completions per iteration with an even
  number of prompts in flight (25 % loss) and 2.5 with an odd one (37.5 %): the paper's
  "3-3.5 per iteration, 12-25 %" is its first iterations' average.
"""

from __future__ import annotations

import math

import numpy as np

from llmsched_gym.core.latency import LatencyModel, LinearKVLatency
from llmsched_gym.core.scheduler import BatchPlan, EngineView, Scheduler
from llmsched_gym.fluid import stage_memory, wait_thresholds_fluid, wait_thresholds_practical

from .base import PolicyError, configure, finish_prefills, register

PAPER_ENGINE = {"overflow": "preempt_lifo_recompute", "preempt_mode": "restart"}



def check_threshold_rule(policy: Scheduler, explicit_needs: str) -> None:
    """Shared by WAIT and Nested WAIT: explicit ``thresholds`` select the explicit rule; the rule
    must be one of ``policy.RULES`` and every threshold an integer >= 1."""
    if policy.thresholds:
        policy.rule = "explicit"
    if policy.rule not in policy.RULES:
        raise PolicyError(f"policy.rule: {policy.rule!r} is not one of {', '.join(policy.RULES)}")
    if policy.thresholds and min(int(x) for x in policy.thresholds) < 1:
        raise PolicyError(f"policy.thresholds: every threshold must be an integer >= 1, got {policy.thresholds!r}")
    if policy.rule == "explicit" and not policy.thresholds:
        raise PolicyError(f"policy.thresholds: the explicit rule needs {explicit_needs}")

@register("fcfs-greedy-lifo")
class FCFSGreedyLIFO(Scheduler):
    """Ao et al. 2025's FCFS: process everything at once, evict the newest running prompts on overflow."""

    engine_overrides = PAPER_ENGINE

    def __init__(self, **kwargs) -> None:
        configure(self, kwargs)

    def schedule(self, view: EngineView) -> BatchPlan:
        bs, led = view.block_size, view.ledger
        free = view.kv_free // bs
        cont, need = finish_prefills(view)  # only in the env's meta mode
        room = free - need
        admit: list[int] = []
        for rid in view.waiting:
            c = led.admission(rid, view.prefix_match(rid))
            if c > room:
                break
            room -= c
            need += c
            admit.append(rid)
        running = view.running
        grow = {r: led.decode(r) for r in running}
        need += sum(grow.values())
        preempt: list[int] = []
        n = len(running)
        while need > free and n:
            n -= 1
            victim = running[n]
            preempt.append(victim)
            free += led.held(victim)
            need -= grow[victim]
            if victim in cont:
                cont.remove(victim)
                need -= led.owed(victim)
        hold = not admit and not preempt and not cont
        return BatchPlan(prefill={r: BatchPlan.FULL for r in cont + admit}, preempt=preempt, hold=hold)


def type_stats(view: EngineView, rates: list) -> list[tuple[float, float, float]]:
    """``(lambda_j, l_j, l'_j)`` per type id 0..m-1: explicit ``rates`` or the empirical rate
    (count / arrival span), the mean prompt and the mean predicted output of the type."""
    wl = view.workload
    tid = wl.type_id
    m = int(tid.max()) + 1 if len(tid) else 1
    counts = np.bincount(tid, minlength=m).astype(float)
    seen = np.maximum(counts, 1.0)
    prompt = np.bincount(tid, weights=wl.prompt_tokens, minlength=m) / seen
    out = np.maximum(np.bincount(tid, weights=wl.predicted_output, minlength=m) / seen, 1.0)
    if rates:
        if len(rates) != m:
            raise PolicyError(f"policy.rates: expected {m} rates (one per type id), got {len(rates)}")
        lam = np.asarray(rates, dtype=float)
    else:
        span = float(wl.arrival_s[-1] - wl.arrival_s[0]) if len(tid) > 1 else 0.0
        lam = np.maximum(counts, 1e-9) / (span if span > 0 else 1.0)
    return list(zip(lam.tolist(), prompt.tolist(), out.tolist(), strict=True))


def linear_coefficients(latency: LatencyModel, capacity: int, request_kv: float) -> tuple[float, float]:
    """Eq. 1's ``(d0, d1)`` of the batch-time model: exact for ``linear``; otherwise the chord
    between a one-request batch and a decode batch filling ``capacity`` with requests of
    ``request_kv`` tokens (the operating range of memory-filling policies; our reading)."""
    if isinstance(latency, LinearKVLatency):
        return latency.d0, latency.d1
    b = int(min(max(capacity // max(request_kv, 1.0), 1), capacity - 1))
    t_small = float(latency.decode_times(1, np.array([1]))[0])
    t_full = float(latency.decode_times(b, np.array([capacity - b]))[0])
    d1 = max((t_full - t_small) / (capacity - 2), 0.0)
    return max(t_small - 2 * d1, 1e-12), d1


@register("wait")
class WAIT(Scheduler):
    """Algorithm 1: per-type, per-stage thresholds; a type advances only when its queue is full.

    :param rule: ``fluid`` | ``practical`` | ``practical_literal`` | ``explicit`` (module docstring).
    :param c: seconds, the fluid recipe's n_j = c lambda_j (0 = Delta T*, or C/A when overloaded).
    :param batch_size: B of the practical rules (the batch-size limit shared with vLLM/Sarathi).
    :param thresholds: explicit n_j per type id (implies ``rule=explicit``).
    :param rates: lambda_j per type id (default: the workload's empirical rates).
    """

    params = {"rule": "fluid", "c": 0.0, "batch_size": 256, "thresholds": [], "rates": []}
    engine_overrides = {"overflow": "preempt_lifo_recompute"}

    RULES = ("fluid", "practical", "practical_literal", "explicit")

    def __init__(self, **kwargs) -> None:
        configure(self, kwargs)
        check_threshold_rule(self, "one threshold per type id")
        if self.c < 0:
            raise PolicyError(f"policy.c: must be >= 0 seconds (0 = automatic), got {self.c}")
        if self.batch_size < 1:
            raise PolicyError(f"policy.batch_size: must be >= 1, got {self.batch_size}")
        if any(float(r) <= 0 for r in self.rates):
            raise PolicyError(f"policy.rates: must all be > 0, got {self.rates!r}")

    def needs(self) -> str:
        return "nothing" if self.rule == "explicit" else "predicted"  # the types' mean predicted output

    def reset(self, config, rng) -> None:
        super().reset(config, rng)
        self.n: list[int] | None = None

    def thresholds_for(self, view: EngineView) -> list[int]:
        """Per-type thresholds n_j under ``rule`` (section 4.2, via :mod:`llmsched_gym.fluid`),
        at least 1 each: a threshold of 0 (the fluid rule when the batch-time model has no
        per-token decode cost, c = 0) would never let its type run."""
        return [max(1, n) for n in self._thresholds(view)]

    def _thresholds(self, view: EngineView) -> list[int]:
        if self.rule == "explicit":
            m = int(view.workload.type_id.max()) + 1 if len(view.workload) else 1
            if len(self.thresholds) < m:
                raise PolicyError(f"policy.thresholds: expected {m} values (one per type id), got {len(self.thresholds)}")
            return [int(x) for x in self.thresholds]
        types = type_stats(view, self.rates)
        if self.rule != "fluid":
            literal = "paper_literal" if self.rule == "practical_literal" else "fluid_proportional"
            return wait_thresholds_practical(types, self.batch_size, rule=literal).n_int
        lam = np.array([t[0] for t in types])
        if self.c:
            return [math.ceil(self.c * x - 1e-9) for x in lam]
        stages = np.array([t[2] for t in types]) + 1
        a = stage_memory([t[1] for t in types], [t[2] for t in types])
        cap = view.kv_capacity
        d0, d1 = linear_coefficients(view.latency, cap, float(np.sum(lam * a) / np.sum(lam * stages)))
        # per-type memory of one prompt per stage, with each prompt's partly filled last block
        a_kv = a + (view.block_size - 1) * stages
        try:
            # the memory check counts the thresholds as they will run (at least 1 each)
            n = np.maximum(wait_thresholds_fluid(types, d0, d1, cap).n_int, 1)
            if float(np.dot(n, a_kv)) <= cap:
                return n.tolist()
        except ValueError:
            pass  # d1 A >= 1: no equilibrium
        # overloaded (C < M* or d1 A >= 1), Remark 1: c = C / A fills the memory
        c_max = cap / float(np.sum(lam * a_kv))
        return [math.floor(c_max * x) for x in lam]

    def schedule(self, view: EngineView) -> BatchPlan:
        n = self.n
        if n is None:
            n = self.n = self.thresholds_for(view)
        tid = view.workload.type_id
        queues: dict[int, list[int]] = {}
        for rid in view.waiting:
            queues.setdefault(int(tid[rid]), []).append(rid)
        every = set(queues) | {int(tid[r]) for r in view.running}
        if view.next_arrival_s == math.inf:
            ready = every
        else:
            ready = {j for j, q in queues.items() if len(q) >= n[j]}
            if not ready:
                return BatchPlan.wait()
        cont, blocks = finish_prefills(view)  # only in the env's meta mode
        admit, pause = self._select(view, ready, queues, blocks)
        if not admit and not cont and len(pause) == len(view.running) and view.running:
            admit, pause = self._select(view, every, queues)  # memory deadlock: see the docstring
        return unfinished_first(cont, admit, pause)

    def _select(self, view: EngineView, ready: set[int], queues: dict[int, list[int]],
                reserved: int = 0) -> tuple[list[int], set[int]]:
        """The prompts of ``ready`` types to prefill (those that fit in what ``reserved`` blocks
        leave) and the resident ones to pause."""
        n, tid, gen = self.n, view.workload.type_id, view.generated
        taken: dict[tuple[int, int], int] = {}
        pause = set()
        runs = []
        for rid in view.running:
            j = int(tid[rid])
            if j in ready:
                key = (j, int(gen[rid]))
                k = taken.get(key, 0)
                if k < n[j]:
                    taken[key] = k + 1
                    runs.append(rid)
                    continue
            pause.add(rid)
        candidates = [rid for j in sorted(ready) if j in queues for rid in queues[j][: n[j]]]
        return admit_fitting(view, candidates, runs, reserved), pause


def admit_fitting(view: EngineView, candidates: list[int], runs: list[int], reserved: int = 0) -> list[int]:
    """The head of ``candidates`` whose prefills fit in the KV left after this step's decodes of
    ``runs`` and ``reserved`` blocks (never binds when M^pi <= C; the guard of the WAIT
    docstrings)."""
    led = view.ledger
    free = view.kv_free // view.block_size - sum(led.decode(r) for r in runs) - reserved
    out = []
    for rid in candidates:
        need = led.admission(rid, view.prefix_match(rid))
        if need > free:
            break
        free -= need
        out.append(rid)
    return out


def unfinished_first(cont: list[int], admit: list[int], pause: set[int]) -> BatchPlan:
    """WAIT's step plan: prefill the unfinished prefills ``cont`` another policy left (the env's
    ``meta`` mode; never paused) and the admitted prompts; pause the rest of the resident set."""
    if cont:
        pause = pause.difference(cont)
    return BatchPlan(prefill={r: BatchPlan.FULL for r in cont + admit}, pause=pause,
                     hold=not admit and not pause and not cont)
