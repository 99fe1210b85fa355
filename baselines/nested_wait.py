"""Nested WAIT: Ao et al. 2025 (arXiv 2504.11320 v2), Algorithm 2 (section 5) and the
L-segment design of section 7.2.

Output lengths are unknown; segments are cut at the sorted output lengths b_1 < ... < b_m. A
request belongs to segment k while it has generated g tokens with b_{k-1} <= g < b_k (b_0 = 0);
waiting requests are segment 1's entry queue, and segment k's entry is the cell g = b_{k-1}.
Each step finds the largest K such that every segment k <= K has at least n_k requests at its
entry; if K = 0 nothing runs (the worker idles until the next arrival). Otherwise segments
1..K advance min(n_k, count) requests at every stage (cell of equal g, FIFO), the rest pause
with their KV. Requests classify themselves: those that finish exit, the others move on.

Segments (``boundaries``, else ``width``, else the workload's type lengths): explicit upper
bounds; or ``width``-token segments (section 6.2's ceil(stage/50)); or, by default, the distinct
output lengths of the workload's types (a single-type workload gets ``width`` 50). ``segments``
= L > 0 groups the boundaries into L consecutive groups, each ending at its largest length
(section 7.2).

Thresholds (``rule``): ``ratio`` (default) is section 6.2's "proportional to the arrival rate of
each segment", n_k ∝ Lambda_k gamma^(k-1) (Lambda_k = rate of requests that reach segment k),
scaled as the companion code does, n_k = ceil(B w_k / sum_k S_k w_k) with S_k the stages of
segment k, so a full batch holds about ``batch_size`` = B requests (B = 0: the largest scale
whose M^pi fits in C, rounded down; the default 256 is vLLM's ``max_num_seqs``); gamma = 1 is
the paper's experiments (n_(k+1)/n_k = p_k exactly), gamma > 1 the strict drift of Eq. 12. ``fluid``:
our fluid recipe (:func:`llmsched_gym.fluid.nested_wait_thresholds`), n_k = c Lambda_k
gamma^(k-1) with c = (1 + ``slack``) times the smallest c meeting Eq. 12a, rounded up.
``explicit``: ``thresholds``. After setup ``n`` holds the thresholds and ``memory_requirement``
their M^pi plus the safety buffer of Eq. 14 (theta_k the positive root of Eq. 20, the proof's log
term ln((m-1) B_it / delta) with B_it = the number of requests, a bound on the batches; infinite
when some theta_k is 0, as at gamma = 1) to compare with C.

Readings and departures:

* Segment membership by tokens generated (our reading of section 5.1). Under the paper's convention (prefill
  emits no token) segment 1 is the prefill plus the decodes of tokens 1..b_1; when prefill
  emits token 1 it is the prefill plus tokens 2..b_1.
* Lambda_k, the prefill length l and the total rate come from the workload's predicted output
  lengths, prompts and arrival span (the paper's known rates and length distribution).
* A request that outlives b_m stays in the last segment. Without explicit ``boundaries``, a
  boundary at which no request of the workload ends is dropped (it would only add a
  synchronisation point; the fluid recipe needs every segment's rate > 0).
* End of horizon (we do not follow the companion code's dropping): once no arrival
  is left, every segment runs with min(n_k, count) per stage and no threshold, so all drain.
* Eq. 1's d0, d1 (``fluid`` rule) come from :func:`baselines.wait.linear_coefficients`; M^pi
  adds each request's partly filled last block in paged mode.
* Memory guard (not in the paper; it never binds within M^pi + buffer <= C): a prompt enters
  segment 1 only if it fits in the KV left after the step's decodes; if that leaves nothing to
  run while paused requests hold the memory, every segment runs that step without thresholds
  (else the worker deadlocks). Decode overflow (the stochastic entry backlogs) goes to the
  engine's LIFO preemption in the scenario's preemption mode (the paper: full restart).
* Switching policies (the env's ``meta`` mode): the policy reads everything from the engine; a
  running request another policy left mid-prefill is finished in the next step that runs
  (:func:`~baselines.base.finish_prefills`).
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from llmsched_gym.core.scheduler import BatchPlan, EngineView, Scheduler
from llmsched_gym.fluid import nested_mpi, nested_wait_thresholds, theta_root

from .base import PolicyError, configure, finish_prefills, register
from .wait import admit_fitting, check_threshold_rule, linear_coefficients, unfinished_first


def segment_boundaries(lengths: list[int], segments: int) -> list[int]:
    """Sorted distinct ``lengths``, grouped into ``segments`` consecutive groups (section 7.2);
    each group ends at its largest length."""
    b = sorted(set(int(x) for x in lengths))
    if segments and segments < len(b):
        b = [int(g[-1]) for g in np.array_split(np.array(b), segments)]
    return b


@register("nested-wait")
class NestedWAIT(Scheduler):
    """Algorithm 2: nested segment thresholds, on-the-fly classification by tokens generated.

    :param rule: ``ratio`` | ``fluid`` | ``explicit`` (module docstring).
    :param batch_size: B of the ratio rule (0 = fill the KV with M^pi).
    :param gamma: n_(k+1)/n_k = gamma p_k (1 = the paper's experiments; > 1 the strict Eq. 12).
    :param slack: the fluid rule's c = (1 + slack) c_min.
    :param delta: overflow probability of the Eq. 14 buffer.
    :param thresholds: explicit n_k per segment (implies ``rule=explicit``).
    :param boundaries: explicit segment upper bounds (tokens generated).
    :param width: fixed segment width in tokens (0 = automatic).
    :param segments: L, the number of segment groups of section 7.2 (0 = one per boundary).
    """

    params = {"rule": "ratio", "batch_size": 256, "gamma": 1.0, "slack": 0.1, "delta": 0.01,
              "thresholds": [], "boundaries": [], "width": 0, "segments": 0}
    engine_overrides = {"overflow": "preempt_lifo_recompute"}

    RULES = ("ratio", "fluid", "explicit")

    def __init__(self, **kwargs) -> None:
        configure(self, kwargs)
        check_threshold_rule(self, "one threshold per segment")
        b = [int(x) for x in self.boundaries]
        if b and (b[0] < 1 or any(y <= x for x, y in zip(b, b[1:], strict=False))):
            raise PolicyError(f"policy.boundaries: must be increasing integers >= 1, got {self.boundaries!r}")
        if self.batch_size < 0:
            raise PolicyError(f"policy.batch_size: must be >= 0 (0 = fill the KV), got {self.batch_size}")
        for name in ("width", "segments"):
            if getattr(self, name) < 0:
                raise PolicyError(f"policy.{name}: must be >= 0 (0 = automatic), got {getattr(self, name)}")
        if self.gamma < 1:
            raise PolicyError(f"policy.gamma: must be >= 1 (n_(k+1)/n_k = gamma p_k), got {self.gamma}")
        if not 0 < self.delta < 1:
            raise PolicyError(f"policy.delta: must be in (0, 1), got {self.delta}")
        if self.slack < 0:
            raise PolicyError(f"policy.slack: must be >= 0, got {self.slack}")

    def needs(self) -> str:
        return "predicted"  # the segments' tail rates come from the predicted output lengths

    def reset(self, config, rng) -> None:
        super().reset(config, rng)
        self.n: list[int] = []
        self.bounds: list[int] = []
        self.memory_requirement = math.nan

    # ---- setup: segments, rates, thresholds -------------------------------------------------
    def setup(self, view: EngineView) -> None:
        wl = view.workload
        pred = wl.predicted_output
        if self.boundaries:
            bounds = [int(x) for x in self.boundaries]
        elif self.width or len(set(wl.type_id.tolist())) <= 1:
            w = self.width or 50
            top = int(pred.max()) if len(pred) else w
            bounds = list(range(w, top + w, w))
        else:
            bounds = [int(np.round(pred[wl.type_id == j].mean())) for j in np.unique(wl.type_id)]
        bounds = segment_boundaries(bounds, 0)
        if not self.boundaries:
            # a segment nobody ends in only adds a synchronisation point: merge it into the next
            ends = np.searchsorted(bounds, np.minimum(pred, bounds[-1]), side="left")
            used = set(np.unique(ends).tolist()) | {len(bounds) - 1}
            bounds = [b for k, b in enumerate(bounds) if k in used]
        self.bounds = segment_boundaries(bounds, self.segments)
        m = len(self.bounds)
        span = float(wl.arrival_s[-1] - wl.arrival_s[0]) if len(wl) > 1 else 0.0
        total = len(wl) / span if span > 0 else float(len(wl))
        lows = [0] + self.bounds[:-1]
        self.tail_rates = [total * float(np.mean(pred > lo)) for lo in lows]
        self.prefill = float(wl.prompt_tokens.mean()) if len(wl) else 1.0
        emits = self._emits = view.prefill_emits_token
        self._block_size = view.block_size
        self.stages = [b - lo + (0 if (k or emits) else 1) for k, (lo, b) in enumerate(zip(lows, self.bounds, strict=True))]
        weights = [lam * self.gamma**k for k, lam in enumerate(self.tail_rates)]
        if self.rule == "explicit":
            if len(self.thresholds) != m:
                raise PolicyError(f"policy.thresholds: expected {m} values (one per segment, boundaries "
                                  f"{self.bounds}), got {len(self.thresholds)}")
            self.n = [int(x) for x in self.thresholds]
        elif self.rule == "ratio" and self.batch_size:
            scale = self.batch_size / sum(s * w for s, w in zip(self.stages, weights, strict=True))
            self.n = [max(1, math.ceil(scale * w)) for w in weights]
        elif self.rule == "ratio":
            scale = view.kv_capacity / self.m_pi(weights)
            self.n = [max(1, math.floor(scale * w)) for w in weights]
        else:
            seg_rates = [a - b for a, b in zip(self.tail_rates, self.tail_rates[1:] + [0.0], strict=True)]
            request_kv = self.prefill + float(np.mean(np.minimum(pred, self.bounds[-1]))) / 2
            d0, d1 = linear_coefficients(view.latency, view.kv_capacity, request_kv)
            try:
                plan = nested_wait_thresholds(seg_rates, self.prefill, self.bounds, d0, d1, gamma=self.gamma,
                                              slack=self.slack, delta=self.delta, n_batches=len(wl),
                                              mpi_formula="exact_stage_sum", C=view.kv_capacity)
            except ValueError as e:
                raise PolicyError(f"policy.rule: the fluid recipe does not apply here ({e}); use rule=ratio") from None
            self.n = [max(1, math.ceil(x - 1e-9)) for x in plan.n]
        self.memory_requirement = self.m_pi(self.n) + self.buffer(self.n, len(wl))
        self._min_after = np.minimum.accumulate(self.n[::-1])[::-1].tolist()

    def m_pi(self, n: list[int] | list[float]) -> float:
        """Peak KV of a full batch, n_k requests at every stage of every segment (exact stage
        sum, plus the prefill stage when prefill emits no token, plus each request's partly
        filled last block in paged mode)."""
        nk = np.asarray(n, dtype=float)
        prefill_stage = 0.0 if self._emits else nk[0] * self.prefill
        blocks = (self._block_size - 1) * float(np.dot(nk, self.stages))
        return nested_mpi(nk, self.prefill, self.bounds, "exact_stage_sum") + prefill_stage + blocks

    def buffer(self, n: list[int], n_batches: int) -> float:
        """Eq. 14's safety buffer: entry backlogs of segments k >= 2 plus the high-probability
        headroom ln((m-1) B / delta) / theta_k (theta_k from Eq. 20), each request holding
        l + b_(k-1) tokens; infinite when some theta_k is 0 (no drift)."""
        m = len(n)
        log_term = math.log(max(m - 1, 1) * max(n_batches, 1) / self.delta)
        total = 0.0
        for k in range(1, m):
            p = self.tail_rates[k] / self.tail_rates[k - 1] if self.tail_rates[k - 1] > 0 else 0.0
            try:
                theta = theta_root(n[k - 1], n[k], p)
            except ValueError:
                theta = 0.0
            if theta == 0.0:
                return math.inf
            total += (self.prefill + self.bounds[k - 1]) * (n[k] + log_term / theta)
        return total

    # ---- the per-iteration rule -------------------------------------------------------------
    def schedule(self, view: EngineView) -> BatchPlan:
        if not self.n:
            self.setup(view)
        n, bounds = self.n, self.bounds
        last = len(bounds) - 1
        gen = view.generated
        cells: dict[int, list[int]] = {}
        for rid in view.running:
            cells.setdefault(int(gen[rid]), []).append(rid)
        waiting = view.waiting
        drain = view.next_arrival_s == math.inf
        if drain:
            depth = len(bounds)
        elif len(waiting) < n[0]:
            return BatchPlan.wait()
        else:
            depth = 1
            while depth <= last and len(cells.get(bounds[depth - 1], ())) >= n[depth]:
                depth += 1
        cont, blocks = finish_prefills(view)  # only in the env's meta mode
        admit, pause = self._select(view, depth, cells, blocks)
        if not admit and not cont and len(pause) == len(view.running) and view.running:
            admit, pause = self._select(view, len(bounds), cells)  # memory deadlock: see the docstring
        if cont:
            return unfinished_first(cont, admit, pause)
        # the same decode-only plan comes back only while draining (entry cells empty as requests
        # advance, which changes the depth otherwise) and no cell outgrows a later threshold
        hold = drain and not admit and not pause and all(
            len(ids) <= self._min_after[min(bisect.bisect_right(bounds, g), last)] for g, ids in cells.items())
        return BatchPlan(prefill={r: BatchPlan.FULL for r in admit}, pause=pause, hold=hold)

    def _select(self, view: EngineView, depth: int, cells: dict[int, list[int]],
                reserved: int = 0) -> tuple[list[int], set[int]]:
        """Segments ``1..depth`` advance up to n_k per stage; returns the prompts to prefill (those
        that fit in what ``reserved`` blocks leave) and the resident requests to pause."""
        n, bounds = self.n, self.bounds
        last = len(bounds) - 1
        pause: set[int] = set()
        runs: list[int] = []
        for g, ids in cells.items():
            k = min(bisect.bisect_right(bounds, g), last)
            if k >= depth:
                pause.update(ids)
            else:
                runs.extend(ids[: n[k]])
                pause.update(ids[n[k]:])
        return admit_fitting(view, view.waiting[: n[0]], runs, reserved), pause
