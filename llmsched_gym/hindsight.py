"""The hindsight reference: how good a schedule of one workload can be when everything is known.

A benchmark task's *headroom* is how far the best static heuristic is from the best schedule
anyone could have run on the same workload. Computing the true optimum is out of reach for a
thousand requests on a batching engine with a KV budget (the exact optimum exists only for small
cuts of the round model, :mod:`llmsched_gym.optimum`), so :func:`hindsight` searches for a good
schedule with the simulator in the loop, knowing the whole workload and the true output
lengths:

1. **Start**: every starting candidate (by default the whole static family of
   :func:`baselines.static.static_family`) runs with true output lengths (the predictor set to
   ``oracle``); the best is the *start*.
2. **Parametric search** (the cross-entropy method: Rubinstein and Kroese 2004, "The
   Cross-Entropy Method", chapter 4): per-request priorities ``(1 - beta) x rank(log(output +
   a x prompt)) + beta x rank(arrival) + gamma x [no SLO]``, from shortest true work first
   (``beta = 0``) to FCFS (``beta = 1``), requests without an SLO pushed back by ``gamma`` (when
   the workload has SLOs), with the token budget, ``max_num_seqs`` and the levels mode (below)
   drawn from their grids.
3. **Local search** on the per-request priority vector of the best schedule so far: requests
   that hurt the metric most (:func:`blame`: the longest waits for a mean, the tail for a
   percentile, the near misses for an SLO metric) move just ahead of a request admitted during
   their wait; requests admitted while others waited (long outputs first, or SLO requests that
   missed by far) move just behind one of those; one to sixteen requests per move; or the budget
   or the cap moves to a neighbour in its grid, or the levels mode or their quantum changes. A
   move is kept when the metric improves. (Before the cross-entropy method, the budgets and caps
   next to the start's are tried, up to 8 runs.)

Every candidate runs on the real engine (same scenario, same seed: the same workload the
entrants see) with :class:`PriorityOrder`, Sarathi's batch former reading the waiting queue in
the order of a given priority vector (the ``static`` policy's code: a priority vector equal to an
order's keys reproduces that static policy exactly), either alone (non-preemptive) or below the
levels of least attained service or FastServe's skip-join MLFQ (preemptive across levels, as the
``las`` and ``mlfq`` orders), so that the search covers the preemptive heuristics that win on
tail-latency metrics. A run that rejects a request or leaves one unfinished before the scenario's horizon
never counts (the benchmark's rule). The result is the best of all
runs, so its value is never worse than any starting candidate's on that seed.

It is a reference, not an entrant: it reads the true lengths and the future arrivals.

Budget: a run is one simulation of the workload (0.3-0.5 s for 1000 azure-conv requests, 0.05 s
for 500 jaillet-high requests, 1-3 s for overloaded variants that preempt a lot, on one core of a
busy machine). The default, the 84-spec static family as the start and ``sims=120`` search runs,
takes about 80-130 s on azure-conv; with the best five static specs as ``start`` the search alone
measured 83 s there (6 s on jaillet-high, 50-220 s on the overloaded variants). Pass the best few
static specs as ``start`` to spend the time on the search.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from baselines.static import Static, static_family
from llmsched_gym.config import ConfigError, explicit_engine_keys, merge_engine_overrides
from llmsched_gym.core.engine import Engine, EngineConfig
from llmsched_gym.core.metrics import summarize
from llmsched_gym.core.scenarios import build_scenario, resolve_scenario
from llmsched_gym.core.scheduler import EngineView

CHUNKS = (0, 128, 256, 512, 1024, 2048)
"""Token budgets the search moves between (0: whole prefill)."""
SEQS = (16, 32, 64, 128, 256)
"""``max_num_seqs`` values the search moves between."""
QUANTA = (1, 2, 4, 8, 16)
"""The levels' quanta the search moves between."""
DEFAULT_SIMS = 120
"""Search runs after the starting candidates (parametric and local search together)."""
TRUE_LENGTHS = {"workload.predictor": {"type": "oracle"}}
"""The override that gives every candidate the true output lengths."""


class PriorityOrder(Static):
    """Sarathi's batch former admitting waiting requests by a fixed per-request priority (lower
    first; ties by queue order); running requests decode, and a memory victim is chosen, in the
    same order. Built directly by :func:`hindsight` (not in the policy catalogue).

    :param priority: one number per request of the workload.
    :param chunk_size: the token budget per iteration (0: whole-prompt prefill).
    :param max_num_seqs: the cap on running requests.
    :param levels: ``"none"``: the priority alone, non-preemptive; ``"las"`` or ``"mlfq"``: the
        ``static`` order's level first (least attained service, or FastServe's skip-join levels)
        and the priority only among requests of one level, preemptive across levels as that order
        (so that the search can start from, and improve on, those orders).
    :param quantum: the levels' quantum (as ``static``'s).
    """

    name = "hindsight-priority"
    LEVELS = ("none", "las", "mlfq")

    def __init__(self, priority: np.ndarray, chunk_size: int = 512, max_num_seqs: int = 128, levels: str = "none",
                 quantum: int = 1, watermark: float = 0.01) -> None:
        if levels not in self.LEVELS:
            raise ConfigError(f"levels: unknown {levels!r}; allowed: {', '.join(self.LEVELS)}")
        super().__init__(order="prompt" if levels == "none" else levels, chunk_size=chunk_size,
                         max_num_seqs=max_num_seqs, quantum=quantum, watermark=watermark)
        self.levels_mode = levels
        self.priority = np.asarray(priority, dtype=np.float64)
        # within a level: the priority's dense rank (equal priorities stay equal, so the queue
        # order breaks the tie as in ``static``), scaled below 1 so that the level dominates
        self._within = None
        if levels != "none":
            dense = np.unique(self.priority, return_inverse=True)[1].astype(np.float64).reshape(-1)
            self._within = dense / max(float(dense.max(initial=0.0)), 1.0) * 0.5

    def needs(self) -> str:
        return "true"

    def keys(self, view: EngineView, ids: np.ndarray) -> np.ndarray:
        if self._within is None:
            return self.priority[ids]
        return self.levels(view, ids) + self._within[ids]

    def outranks(self, waiting_key: float, running_key: float) -> bool:
        return math.floor(waiting_key) < math.floor(running_key)  # a strictly higher level


@dataclass
class HindsightResult:
    """What :func:`hindsight` found.

    :ivar value: the best metric value found (never worse than ``start_value``).
    :ivar start_value: the best starting candidate's value.
    :ivar start_spec: that candidate's policy spec.
    :ivar spec: the best schedule's spec: a starting candidate's, or ``{"name":
        "hindsight-priority", "chunk_size", "max_num_seqs", "levels"(, "quantum")}`` with
        ``priority`` (rebuild it with ``PriorityOrder(priority, **spec without name)``).
    :ivar priority: the best per-request priority vector (``None`` when a starting candidate won).
    :ivar n_sims: engine runs, starting candidates included.
    :ivar wall_s: seconds the search took.
    :ivar trace: the best value after each run (for plots of the search).
    """

    value: float
    start_value: float
    start_spec: dict[str, Any]
    spec: dict[str, Any]
    priority: np.ndarray | None
    n_sims: int
    wall_s: float
    lower_is_better: bool = True
    trace: list[float] = field(default_factory=list, repr=False)

    @property
    def headroom(self) -> float:
        """``(start - hindsight) / start`` in the metric's better direction (0 when nothing better
        was found; ``nan`` when the start is 0 or not finite)."""
        s, v = self.start_value, self.value
        if not (math.isfinite(s) and math.isfinite(v)) or s == 0:
            return math.nan
        return (s - v) / abs(s) if self.lower_is_better else (v - s) / abs(s)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the priority vector as a list)."""
        d = asdict(self)
        d["priority"] = None if self.priority is None else self.priority.tolist()
        d["headroom"] = self.headroom
        return d


def _metric(summary: dict[str, Any], path: str) -> float:
    node: Any = summary
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(f"metric: {path!r} is not in the run summary (missing {part!r})")
        node = node[part]
    return float(node)


def served(s: dict[str, Any]) -> bool:
    """The benchmark's rule for a run that counts: every arrived request served and none
    rejected, or the scenario's horizon reached without a stall."""
    return (s["n_completed"] == s["n_arrived"] and s["n_rejected"] == 0) or (
        s["stop_reason"] == "horizon" and not s["non_terminating"])


class _Runner:
    """Runs schedulers on one fixed workload (built once) and scores them."""

    def __init__(self, scenario: str | dict, overrides: dict[str, Any], seed: int, metric: str,
                 lower_is_better: bool) -> None:
        spec = resolve_scenario(scenario, overrides)
        self.name = spec.get("name", "custom")
        self.workload, config, self.latency = build_scenario(spec, seed)
        self.explicit = explicit_engine_keys(overrides)
        self.config = config
        self._configs: dict[tuple, EngineConfig] = {}
        self.seed, self.metric, self.sign = seed, metric, 1.0 if lower_is_better else -1.0
        self.n_sims = 0

    def run(self, scheduler) -> tuple[float, float, Engine]:
        """``(cost, value, engine)``: cost is the value signed so that lower is better, ``inf``
        for a run that does not count (:func:`served`)."""
        ov = scheduler.engine_overrides
        key = tuple(sorted(ov.items()))
        if key not in self._configs:
            fields = merge_engine_overrides(asdict(self.config), ov, self.explicit) if ov else asdict(self.config)
            self._configs[key] = EngineConfig(**fields)
        engine = Engine(self.workload, self._configs[key], self.latency, scheduler, seed=self.seed)
        engine.run()
        self.n_sims += 1
        summary = summarize(engine, self.name, scheduler.name)
        value = _metric(summary, self.metric)
        done = served(summary)
        cost = self.sign * value if done and math.isfinite(value) else math.inf
        return cost, value, engine


def _rank(x: np.ndarray) -> np.ndarray:
    """Ranks of ``x`` scaled to [0, 1] (ties by index)."""
    n = len(x)
    r = np.empty(n)
    r[np.argsort(x, kind="stable")] = np.arange(n)
    return r / max(n - 1, 1)


def _point_of(spec: dict[str, Any], runner: _Runner, engine: Engine) -> tuple:
    """A search point that plays ``spec``: ``(priority, chunk_size, max_num_seqs, levels, quantum)``.
    The priority is the order's keys for ``static`` ``prompt``/``output``/``total``, equal for
    ``fcfs``, ``las`` and ``mlfq`` (the queue order breaks ties, the latter two as levels): the
    same schedule as the static policy (for ``output`` and ``total`` as long as nothing is
    preempted: the static orders key a preempted request by its remaining output); else the ranks
    of the admission times its run produced."""
    wl = runner.workload
    order = spec.get("order", "fcfs") if spec.get("name") == "static" else None
    chunk, seqs = int(spec.get("chunk_size", 512)), int(spec.get("max_num_seqs", 128))
    levels, quantum = ("none", 1) if order not in ("las", "mlfq") else (order, int(spec.get("quantum", 1)))
    if order in ("fcfs", "las", "mlfq"):
        p = np.zeros(len(wl))
    elif order == "prompt":
        p = wl.prompt_tokens.astype(np.float64)
    elif order == "output":
        p = wl.output_tokens.astype(np.float64)
    elif order == "total":
        p = (wl.prompt_tokens + wl.output_tokens).astype(np.float64)
    else:
        first = np.asarray(engine.first_scheduled_s, dtype=np.float64).copy()
        ok = np.isfinite(first)
        first[~ok] = (first[ok].max() + 1.0) if ok.any() else 0.0
        p = _rank(first)
    return p, chunk, seqs, levels, quantum


def _near(grid: tuple[int, ...], value: int) -> int:
    """Index of the grid value nearest ``value`` (on a log scale, 0 apart)."""
    if value == 0:
        return 0 if grid[0] == 0 else int(np.argmin(grid))
    return int(np.argmin([abs(math.log(g / value)) if g else math.inf for g in grid]))


class _Search:
    """The state of one hindsight search: the runs left, the best schedule found, the current point
    (priorities, budget, cap, levels mode, quantum) and its engine, and the best-so-far trace."""

    def __init__(self, runner: _Runner, sims: int, rng: int) -> None:
        self.runner, self.left, self.gen = runner, sims, np.random.default_rng(rng)
        self.trace: list[float] = []
        self.best_cost = math.inf
        self.best: dict[str, Any] = {}
        self.cur: tuple = ()
        self.cur_cost, self.cur_engine = math.inf, None

    def note(self, cost: float) -> None:
        self.best_cost = min(self.best_cost, cost)
        self.trace.append(self.runner.sign * self.best_cost)

    def try_point(self, pt: tuple) -> tuple[float, Engine]:
        """Run the priority schedule ``pt`` (one run of the budget); keep it if it is the best."""
        self.left -= 1
        p, chunk, seqs, levels, quantum = pt
        cost, value, engine = self.runner.run(PriorityOrder(p, chunk, seqs, levels, quantum))
        self.note(cost)
        if cost < self.best["cost"]:
            spec = {"name": PriorityOrder.name, "chunk_size": chunk, "max_num_seqs": seqs, "levels": levels}
            if levels != "none":
                spec["quantum"] = quantum
            self.best.update(cost=cost, value=value, priority=p.copy(), spec=spec)
        return cost, engine

    def move_to(self, cost: float, pt: tuple, engine: Engine) -> bool:
        """Make ``pt`` the current point if it is better; whether it was."""
        if cost < self.cur_cost:
            self.cur_cost, self.cur, self.cur_engine = cost, pt, engine
            return True
        return False

    def starts(self, starts: list[dict[str, Any]]) -> tuple[float, dict[str, Any]]:
        """1. Run the starting candidates (not counted in the budget); the best becomes the current
        point. Returns the best start's ``(value, spec)``."""
        from llmsched_gym.sim import make_policy

        s_cost, s_value, s_spec, s_engine = math.inf, math.nan, starts[0], None
        for spec in starts:
            cost, value, engine = self.runner.run(make_policy(dict(spec)))
            self.note(cost)
            if s_engine is None or cost < s_cost:
                s_cost, s_value, s_spec, s_engine = cost, value, spec, engine
        self.best = {"cost": s_cost, "value": s_value, "spec": dict(s_spec), "priority": None}
        self.cur = _point_of(s_spec, self.runner, s_engine)
        self.cur_engine = s_engine
        return s_value, s_spec

    def around_start(self, sims: int) -> None:
        """The best start replayed as a priority vector (the same schedule for most orders), then the
        budget and the cap next to the start's (up to 8 runs, while more than half the budget is left)."""
        if self.left > 0:
            self.cur_cost, self.cur_engine = self.try_point(self.cur)
        p0, c0, s0, l0, q0 = self.cur
        ci, si = _near(CHUNKS, c0), _near(SEQS, s0)
        for dc, ds in ((0, -1), (0, 1), (-1, 0), (1, 0), (-1, -1), (1, 1), (-1, 1), (1, -1)):
            if self.left <= sims // 2:
                break
            if 0 <= ci + dc < len(CHUNKS) and 0 <= si + ds < len(SEQS):
                pt = (p0, CHUNKS[ci + dc], SEQS[si + ds], l0, q0)
                if pt[1:3] != (c0, s0):
                    self._try_move(pt)

    def _try_move(self, pt: tuple) -> None:
        cost, engine = self.try_point(pt)
        self.move_to(cost, pt, engine)

    def cross_entropy(self) -> None:
        """2. Parametric search on half the runs left: the cross-entropy method over (log10 a, beta,
        gamma, budget, cap, levels), priorities ``(1 - beta) rank(log(output + a prompt)) + beta
        rank(arrival) + gamma [no SLO]``."""
        wl, gen, cur = self.runner.workload, self.gen, self.cur
        out = wl.output_tokens.astype(np.float64)
        prompt = wl.prompt_tokens.astype(np.float64)
        arrival_rank = _rank(wl.arrival_s)
        no_slo = (~np.isfinite(wl.ttft_slo_s)).astype(np.float64) if wl.has_slo else np.zeros(len(wl))
        n_cem = self.left // 2
        if n_cem < 8:
            return
        pop = max(6, min(12, n_cem // 4))
        mu, sd = np.array([-2.0, 0.2, 0.5]), np.array([1.5, 0.3, 0.7])
        probs = []
        for grid, v in ((CHUNKS, cur[1]), (SEQS, cur[2]), (PriorityOrder.LEVELS, cur[3])):
            pr = np.full(len(grid), 1.0)
            pr[grid.index(v) if isinstance(v, str) else _near(grid, v)] += 2.0
            probs.append(pr / pr.sum())
        stop = self.left - n_cem
        while self.left - pop >= stop:
            samples = []
            for _ in range(pop):
                la, beta, gamma = gen.normal(mu, sd)
                beta, gamma = float(np.clip(beta, 0.0, 1.0)), float(np.clip(gamma, 0.0, 2.0))
                idx = [int(gen.choice(len(pr), p=pr)) for pr in probs]
                p = (1 - beta) * _rank(np.log(out + 10.0 ** la * prompt)) + beta * arrival_rank + gamma * no_slo
                pt = (p, CHUNKS[idx[0]], SEQS[idx[1]], PriorityOrder.LEVELS[idx[2]], self.cur[4])
                cost, engine = self.try_point(pt)
                samples.append((cost, (la, beta, gamma), idx, pt, engine))
            samples.sort(key=lambda x: x[0])
            elite = samples[: max(2, pop // 4)]
            if elite[0][0] < self.cur_cost:
                self.cur_cost, _, _, self.cur, self.cur_engine = elite[0]
            x = np.array([e[1] for e in elite])
            mu = 0.3 * mu + 0.7 * x.mean(axis=0)
            sd = np.maximum(0.3 * sd + 0.7 * x.std(axis=0), [0.1, 0.03, 0.05])
            probs = [0.5 * pr + 0.5 * np.bincount([e[2][k] for e in elite], minlength=len(pr)) / len(elite)
                     for k, pr in enumerate(probs)]

    def local_search(self, metric: str) -> None:
        """3. Local search, on the runs left, on the per-request priorities of the current schedule
        (requests moved by :func:`blame`) and, now and then, on a knob."""
        gen = self.gen
        weights = None
        while self.left > 0:
            p, chunk, seqs, levels, quantum = self.cur
            u = gen.random()
            if u < 0.15:  # a knob moves to a neighbour
                v = gen.random()
                if v < 0.4:
                    chunk = CHUNKS[int(np.clip(_near(CHUNKS, chunk) + gen.choice([-1, 1]), 0, len(CHUNKS) - 1))]
                elif v < 0.8:
                    seqs = SEQS[int(np.clip(_near(SEQS, seqs) + gen.choice([-1, 1]), 0, len(SEQS) - 1))]
                elif v < 0.9 or levels == "none":
                    levels = PriorityOrder.LEVELS[int(gen.integers(len(PriorityOrder.LEVELS)))]
                else:
                    quantum = QUANTA[int(np.clip(_near(QUANTA, quantum) + gen.choice([-1, 1]), 0, len(QUANTA) - 1))]
            else:
                if weights is None:
                    weights = blame(self.cur_engine, metric)
                p = _move(p, self.cur_engine, weights, gen, promote=u < 0.6)
            if p is None or (chunk, seqs, levels, quantum) == self.cur[1:5] and np.array_equal(p, self.cur[0]):
                self.left -= 1  # a move that changes nothing still spends a run of the budget
                continue
            pt = (p, chunk, seqs, levels, quantum)
            cost, engine = self.try_point(pt)
            if self.move_to(cost, pt, engine):
                weights = None


def hindsight(scenario: str | dict, overrides: dict[str, Any] | None = None, seed: int = 0,
              metric: str = "serving.mean_e2el_ms", lower_is_better: bool = True, *,
              start: list[dict[str, Any]] | None = None, sims: int = DEFAULT_SIMS, rng: int = 0) -> HindsightResult:
    """Search the best schedule of one workload with everything known (module docstring).

    :param scenario: a scenario name or dict (as :func:`llmsched_gym.sim.simulate`).
    :param overrides: dotted overrides (the task's size and load); the predictor is set to ``oracle``.
    :param seed: the workload's seed (the same workload the entrants run).
    :param metric: dotted path into the run summary, e.g. ``serving.mean_e2el_ms``.
    :param lower_is_better: the metric's direction.
    :param start: starting policy specs (``{"name": ..., **params}``, any registered policy);
        default: the whole static family with true lengths.
    :param sims: search runs after the starting candidates (0: the best start only).
    :param rng: seeds the search (same arguments and ``rng``: the same result).
    :returns: a :class:`HindsightResult`; its ``value`` is never worse than the best start's.
    """
    if sims < 0:
        raise ConfigError(f"sims: must be >= 0, got {sims}")
    t0 = time.perf_counter()
    runner = _Runner(scenario, {**(overrides or {}), **TRUE_LENGTHS}, seed, metric, lower_is_better)
    starts = list(start) if start is not None else static_family("clairvoyant")
    if not starts:
        raise ConfigError("start: needs at least one policy spec")
    search = _Search(runner, sims, rng)
    s_value, s_spec = search.starts(starts)
    search.around_start(sims)
    search.cross_entropy()
    search.local_search(metric)
    best = search.best
    return HindsightResult(value=best["value"], start_value=s_value, start_spec=dict(s_spec), spec=best["spec"],
                           priority=best["priority"], n_sims=runner.n_sims, wall_s=time.perf_counter() - t0,
                           lower_is_better=lower_is_better, trace=search.trace)


def blame(engine: Engine, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Per request, how much moving it ahead (``promote``) or behind (``demote``) may help the
    metric, from the run's outcome (weights >= 0, not normalised).

    The request's own quantity is its TTFT when the metric names ``ttft``, its queueing delay for
    ``queue``, else its end-to-end latency. Mean-type metrics promote in proportion to it; tail
    metrics (``p90``, ``p99``, ``max``) promote only the requests at or above that quantile; SLO
    metrics (``slo``, ``goodput``) promote the requests that missed their SLO, the nearest misses
    most, and demote those that missed it by more than their SLO (hopeless ones). Other demotions
    fall on requests admitted while others waited, in proportion to their output length."""
    wl = engine.workload
    arrival = wl.arrival_s
    first = np.asarray(engine.first_scheduled_s, dtype=np.float64)
    first = np.where(np.isfinite(first), first, arrival)
    ttft = np.where(np.isfinite(engine.first_token_s), engine.first_token_s - arrival, 0.0)
    e2e = np.where(np.isfinite(engine.completion_s), engine.completion_s - arrival, 0.0)
    m = metric.lower()
    x = ttft if "ttft" in m else (first - arrival) if "queue" in m else e2e
    # demote: requests admitted while others waited, longer outputs first
    sorted_arrival, sorted_first = np.sort(arrival), np.sort(first)
    waiting_then = (np.searchsorted(sorted_arrival, first, side="right")
                    - np.searchsorted(sorted_first, first, side="right"))
    demote = np.where(waiting_then > 0, wl.output_tokens, 0).astype(np.float64)
    if "slo" in m or "goodput" in m:
        slo = wl.ttft_slo_s
        has = np.isfinite(slo)
        miss = has & (ttft > slo)
        over = np.where(miss, ttft - slo, 0.0)
        promote = np.where(miss & (over <= slo), 1.0 / (1.0 + over / np.where(has, slo, 1.0)), 0.0)
        hopeless = miss & (over > slo)
        if hopeless.any():
            demote = np.where(hopeless, 1.0, 0.0) * max(float(demote.max()), 1.0) + demote * ~has
        if promote.any():
            return promote, demote
    q = 0.99 if "p99" in m else 0.9 if "p90" in m else 0.5 if ("p50" in m or "median" in m) else None
    if "max" in m:
        q = 1.0
    if q is not None and len(x):
        cut = np.quantile(x, q)
        promote = np.where(x >= cut, x, 0.0)
        # the whole tail: the requests just below the quantile may take its place
        promote += np.where((x >= np.quantile(x, max(q - 0.02, 0.0))) & (x < cut), 0.5 * x, 0.0)
    else:
        promote = first - arrival
    return np.maximum(promote, 0.0), demote


def _move(p: np.ndarray, engine: Engine, weights: tuple[np.ndarray, np.ndarray], gen: np.random.Generator,
          promote: bool) -> np.ndarray | None:
    """Move 1-16 requests in the priority order, chosen by :func:`blame`'s weights.

    ``promote``: the request goes just ahead of a request admitted during its wait; otherwise it
    goes just behind a request that was waiting when it was admitted and now has a higher priority."""
    arrival = engine.workload.arrival_s
    first = np.asarray(engine.first_scheduled_s, dtype=np.float64)
    first = np.where(np.isfinite(first), first, arrival)
    weight = weights[0] if promote else weights[1]
    cand = np.flatnonzero(weight > 0)
    if len(cand) == 0:
        return None
    k = int(gen.choice([1, 1, 2, 4, 8, 16]))
    movers = gen.choice(cand, size=min(k, len(cand)), replace=False, p=weight[cand] / weight[cand].sum())
    p = p.copy()
    for i in movers:
        if promote:
            # requests admitted while i waited, ahead of it (the ones it competed with)
            during = np.flatnonzero((first >= arrival[i]) & (first < first[i]) & (p <= p[i]))
            if len(during):
                j = int(gen.choice(during))
                p[i] = p[j] - 1e-9 * (1 + abs(p[j]))
        else:
            rivals = np.flatnonzero((arrival <= first[i]) & (first > first[i]) & (p >= p[i]))
            if len(rivals):
                j = int(gen.choice(rivals))
                p[i] = p[j] + 1e-9 * (1 + abs(p[j]))
    return p


__all__ = ["CHUNKS", "DEFAULT_SIMS", "QUANTA", "SEQS", "HindsightResult", "PriorityOrder", "blame", "hindsight"]
