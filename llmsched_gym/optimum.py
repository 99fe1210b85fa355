"""Hindsight-optimal references for round-mode, non-preemptive scheduling under a KV budget.

Jaillet, Jiang, Podimata and Zhou 2025, "Online Scheduling for LLM Inference with KV Cache
Constraints" (arXiv 2502.07115; see docs/papers.md). Everything here is a pure function of an
:class:`Instance`; nothing depends on the simulator engine.

Model (Jaillet et al. 2025, section 3): unit-time rounds; request ``i`` arrives at round ``a_i``, starts (prompt round)
at ``p_i >= a_i`` and then runs contiguously, never paused or preempted. Its KV footprint in round
``p_i + k`` is ``s_i + k``:

* **convention A** (Eq. (1) literally, the default): ``k = 0..o_i``, peak ``s_i + o_i``;
* **convention B** (the App. B.1 IP literally): ``k = 0..o_i - 1``, peak ``s_i + o_i - 1``.

Under both, the completion time is ``c_i = p_i + o_i`` and the objective is the total end-to-end
latency ``TEL = sum_i (p_i + o_i - a_i)`` (Jaillet et al. 2025, section 3; AEL = TEL / n).

Solvers: :func:`solve_ip` (our linearisation of the time-indexed IP of Appendix B.1, HiGHS via
``scipy.optimize.milp``), :func:`solve_exhaustive` (exact DP over (round, waiting set, running
profile)), and :func:`solve_optimum` which picks one. :func:`algorithm1_schedule` reproduces the
paper's Algorithm 1 / 2 start rounds from Eq. (1) (sections 4 and 5.1), which is *not* optimal
(we found counter-examples by exhaustive search; regression instances in the tests). Adversarial
instance families of Thm 6.2 / 6.4 (section 6) are at the end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cache
from typing import Literal

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp

Convention = Literal["A", "B"]

# Size limits (see solve_optimum's docstring for the justification).
EXHAUSTIVE_MAX_N = 8
EXHAUSTIVE_MAX_OUTPUT = 64
IP_MAX_N = 60
IP_MAX_VARS = 20_000


# ----------------------------------------------------------------------------------------------
# Instance, profiles, feasibility
# ----------------------------------------------------------------------------------------------


def _int_array(name: str, values: object, n: int | None = None) -> np.ndarray:
    arr = np.atleast_1d(np.asarray(values))
    if arr.ndim != 1:
        raise ValueError(f"{name}: must be a 1-D sequence of integers")
    if arr.size and not np.all(np.equal(np.mod(arr, 1), 0)):
        raise ValueError(f"{name}: must hold integers, got {arr.tolist()}")
    arr = arr.astype(np.int64)
    if n is not None and arr.size == 1 and n > 1:
        arr = np.full(n, int(arr[0]), dtype=np.int64)
    if n is not None and arr.size != n:
        raise ValueError(f"{name}: length {arr.size} does not match the {n} outputs")
    return arr


@dataclass(frozen=True, eq=False)
class Instance:
    """A static round-mode instance (Jaillet et al. 2025, section 3).

    :param arrival: arrival round ``a_i`` of each request (integers >= 0); a scalar is broadcast.
    :param prompt: prompt size ``s_i`` in tokens (integers >= 1); a scalar is broadcast (the
        paper's common ``s``).
    :param output: output length ``o_i`` (integers >= 1); defines ``n``.
    :param M: KV capacity in tokens (integer >= 1). Every request must fit alone: its peak
        (``s_i + o_i`` under A, ``s_i + o_i - 1`` under B) must be ``<= M``.
    :param convention: ``"A"`` (Eq. (1), default) or ``"B"`` (App. B.1 IP); see the module docstring.
    """

    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    M: int
    convention: Convention = "A"

    def __post_init__(self) -> None:
        output = _int_array("output", self.output)
        n = output.size
        if n == 0:
            raise ValueError("output: an instance needs at least one request")
        if np.any(output < 1):
            raise ValueError(f"output: every o_i must be >= 1, got {output.tolist()}")
        prompt = _int_array("prompt", self.prompt, n)
        if np.any(prompt < 1):
            raise ValueError(f"prompt: every s_i must be >= 1, got {prompt.tolist()}")
        arrival = _int_array("arrival", self.arrival, n)
        if np.any(arrival < 0):
            raise ValueError(f"arrival: every a_i must be >= 0, got {arrival.tolist()}")
        if isinstance(self.M, bool) or not float(self.M).is_integer() or int(self.M) < 1:
            raise ValueError(f"M: must be an integer >= 1, got {self.M!r}")
        if self.convention not in ("A", "B"):
            raise ValueError(f"convention: must be 'A' or 'B', got {self.convention!r}")
        peak = prompt + output - (0 if self.convention == "A" else 1)
        if np.any(peak > int(self.M)):
            i = int(np.argmax(peak > int(self.M)))
            raise ValueError(f"M: request {i} alone needs {int(peak[i])} > M={int(self.M)} tokens")
        for name, arr in (("arrival", arrival), ("prompt", prompt), ("output", output)):
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        object.__setattr__(self, "M", int(self.M))

    @classmethod
    def semi_online(cls, output: object, s: int, M: int, convention: Convention = "A") -> Instance:
        """All requests arrive at round 0 with a common prompt size ``s`` (the semi-online model of section 4)."""
        out = _int_array("output", output)
        return cls(arrival=np.zeros(out.size, dtype=np.int64), prompt=s, output=out, M=M,
                   convention=convention)

    @property
    def n(self) -> int:
        return int(self.output.size)

    @property
    def delta(self) -> int:
        """``Δ`` of the linearised IP: 1 under convention A, 0 under B (extra resident round)."""
        return 1 if self.convention == "A" else 0

    @property
    def resident_rounds(self) -> np.ndarray:
        """Rounds each request holds KV once started: ``o_i + Δ``."""
        return self.output + self.delta

    def total_output(self) -> int:
        """Trivial lower bound ``TEL >= sum_i o_i``."""
        return int(self.output.sum())


def _check_starts(instance: Instance, starts: object) -> np.ndarray:
    p = np.asarray(starts)
    if p.shape != (instance.n,):
        raise ValueError(f"starts: expected {instance.n} start rounds, got shape {p.shape}")
    if p.size and not np.all(np.equal(np.mod(p, 1), 0)):
        raise ValueError("starts: must hold integers")
    return p.astype(np.int64)


def memory_profile(instance: Instance, starts: object) -> np.ndarray:
    """Resident KV tokens in each round ``0..T`` (``T`` = last occupied round), as in section 3.

    Request ``i`` started at ``p_i`` contributes ``s_i + k`` in round ``p_i + k`` for
    ``k = 0..o_i`` (convention A) or ``k = 0..o_i - 1`` (convention B).
    """
    p = _check_starts(instance, starts)
    if np.any(p < 0):
        raise ValueError("starts: rounds must be >= 0")
    r = instance.resident_rounds
    T = int((p + r - 1).max())
    prof = np.zeros(T + 1, dtype=np.int64)
    for pi, si, ri in zip(p.tolist(), instance.prompt.tolist(), r.tolist(), strict=True):
        prof[pi:pi + ri] += si + np.arange(ri)
    return prof


def is_feasible(instance: Instance, starts: object) -> bool:
    """True iff every ``p_i >= a_i`` and the memory profile never exceeds ``M`` (section 3)."""
    p = _check_starts(instance, starts)
    if np.any(p < instance.arrival):
        return False
    return bool(memory_profile(instance, p).max() <= instance.M)


def total_latency(instance: Instance, starts: object) -> int:
    """``TEL = sum_i (p_i + o_i - a_i)`` (section 3); does not check feasibility."""
    p = _check_starts(instance, starts)
    return int((p + instance.output - instance.arrival).sum())


# ----------------------------------------------------------------------------------------------
# Algorithm 1 / 2 (Eq. (1) admission), used as reference and as the IP's incumbent
# ----------------------------------------------------------------------------------------------


def _fits(instance: Instance, active: list[tuple[int, int]], t: int) -> bool:
    """Eq. (1) at the completion points: ``active`` = (request, start) pairs resident at ``t``.

    Memory is increasing between the last resident rounds of the active requests, so checking
    each such round (a local peak; section 4, Eq. (1), including the candidates' own completion points, which the text omits)
    is equivalent to the dense check over every future round.
    """
    s, r = instance.prompt, instance.resident_rounds
    ends = {p + int(r[j]) - 1 for j, p in active}
    for tau in ends:
        if tau < t:
            continue
        mem = 0
        for j, p in active:
            if p <= tau <= p + int(r[j]) - 1:
                mem += int(s[j]) + tau - p
        if mem > instance.M:
            return False
    return True


def algorithm1_schedule(instance: Instance, on_fail: Literal["break", "skip"] = "break",
                        order: Literal["shortest", "fcfs"] = "shortest") -> np.ndarray:
    """Start rounds chosen by the paper's Algorithm 1 (Algorithm 2 when arrivals differ).

    Jaillet et al. 2025, sections 4 and 5.1: each round, running requests continue; waiting (arrived, unstarted)
    requests are tried in ascending ``o_i`` (ties: earlier arrival, then smaller index) and
    admitted while Eq. (1) holds at every completion point; the paper stops at the first failure
    (``on_fail="break"``); ``"skip"`` is our variant, not the paper's. ``order="fcfs"`` tries
    requests by arrival instead (a feasible FCFS schedule, used only as an IP incumbent).
    This computes the rule on a static instance directly; it is not the simulator.
    """
    a, o = instance.arrival, instance.output
    r = instance.resident_rounds
    key = (lambda i: (int(a[i]), i)) if order == "fcfs" else (lambda i: (int(o[i]), int(a[i]), i))
    starts = np.full(instance.n, -1, dtype=np.int64)
    pending = sorted(range(instance.n), key=lambda i: (int(a[i]), i))
    running: list[tuple[int, int]] = []
    t = int(a.min())
    while pending or running:
        running = [(j, p) for j, p in running if p + int(r[j]) - 1 >= t]
        waiting = sorted((i for i in pending if a[i] <= t), key=key)
        if not running and not waiting:
            if not pending:
                break
            t = int(min(a[i] for i in pending))
            continue
        for i in waiting:
            if _fits(instance, running + [(i, t)], t):
                running.append((i, t))
                starts[i] = t
                pending.remove(i)
            elif on_fail == "break":
                break
        t += 1
    return starts


def _greedy_incumbent(instance: Instance) -> np.ndarray:
    """Best (lowest TEL) of a few feasible greedy schedules (Alg 1 break/skip, FCFS)."""
    cands = [algorithm1_schedule(instance, "break"), algorithm1_schedule(instance, "skip"),
             algorithm1_schedule(instance, "skip", order="fcfs")]
    return min(cands, key=lambda p: total_latency(instance, p))


# ----------------------------------------------------------------------------------------------
# Integer program (our linearisation of Jaillet et al. 2025, Appendix B.1)
# ----------------------------------------------------------------------------------------------


@dataclass
class OptResult:
    """Result of an optimum computation.

    :param tel: TEL of ``starts`` (``None`` when no feasible schedule was found).
    :param starts: start round of each request (instance order), or ``None``.
    :param status: ``"optimal"`` (proven global optimum), ``"optimal_in_horizon"`` (optimal among
        schedules completing by the given horizon), ``"time_limit"`` (best found, not proven),
        ``"infeasible"`` (nothing completes by the horizon).
    :param lower_bound: a valid lower bound on the global optimum TEL (equals ``tel`` when
        ``status == "optimal"``; at least ``sum o_i``).
    :param method: ``"ip"`` or ``"exhaustive"``.
    :param n_vars: binary variables of the last IP solved (0 for exhaustive).
    :param wall_s: wall-clock seconds spent.
    """

    tel: int | None
    starts: np.ndarray | None
    status: str
    lower_bound: float
    method: str = "ip"
    n_vars: int = 0
    wall_s: float = 0.0
    info: dict = field(default_factory=dict)

    @property
    def ael(self) -> float | None:
        return None if self.tel is None or self.starts is None else self.tel / len(self.starts)


def _windows(instance: Instance, slack: int, horizon: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Allowed start rounds ``[lo_i, hi_i]`` per request.

    ``slack`` bounds each request's waiting time: if some schedule has TEL ``U`` then in any
    schedule with TEL ``<= U`` each request waits at most ``U - sum_j o_j`` rounds (every other
    request has latency ``>= o_j``). ``horizon`` (optional) caps completions: ``p_i + o_i <= H``.
    """
    lo = instance.arrival.astype(np.int64)
    hi = lo + max(int(slack), 0)
    if horizon is not None:
        hi = np.minimum(hi, int(horizon) - instance.output)
    return lo, hi


def _build_ip(instance: Instance, lo: np.ndarray, hi: np.ndarray):
    """Time-indexed IP (linearised Appendix B.1): x_{i,t}=1 iff i starts at t; rows = rounds."""
    counts = np.maximum(hi - lo + 1, 0)
    n_vars = int(counts.sum())
    var_req = np.repeat(np.arange(instance.n), counts)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    var_t = lo[var_req] + (np.arange(n_vars) - offsets[var_req])
    t0 = int(lo.min())
    r = instance.resident_rounds
    # memory rows: for var (i,k), rows tau = k + d (d = 0..r_i-1), coefficient s_i + d
    rep = r[var_req]
    col = np.repeat(np.arange(n_vars), rep)
    d = np.arange(int(rep.sum())) - np.repeat(np.cumsum(rep) - rep, rep)
    row = np.repeat(var_t, rep) + d - t0
    coef = np.repeat(instance.prompt[var_req], rep) + d
    n_rows = int(row.max()) + 1 if n_vars else 0
    A_mem = sparse.csr_matrix((coef.astype(float), (row, col)), shape=(n_rows, n_vars))
    A_eq = sparse.csr_matrix((np.ones(n_vars), (var_req, np.arange(n_vars))), shape=(instance.n, n_vars))
    cost = var_t.astype(float)
    # Symmetry breaking: identical requests (same a, s, o, window) start in index order,
    # sum_{t<=tau} x_{j,t} <= sum_{t<=tau} x_{i,t} for consecutive i < j of a class.
    rows, cols, vals = [], [], []
    n_sym = 0
    groups: dict[tuple[int, ...], list[int]] = {}
    for i in range(instance.n):
        k = (int(instance.arrival[i]), int(instance.prompt[i]), int(instance.output[i]), int(lo[i]), int(hi[i]))
        groups.setdefault(k, []).append(i)
    for members in groups.values():
        for i, j in zip(members[:-1], members[1:], strict=True):
            for q in range(int(counts[i]) - 1):  # prefixes ending at lo+q
                for b, sign in ((offsets[j], 1.0), (offsets[i], -1.0)):
                    idx = np.arange(b, b + q + 1)
                    rows.append(np.full(idx.size, n_sym))
                    cols.append(idx)
                    vals.append(np.full(idx.size, sign))
                n_sym += 1
    A_sym = None
    if n_sym:
        A_sym = sparse.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                                  shape=(n_sym, n_vars))
    return cost, A_mem, A_eq, A_sym, var_req, var_t


def _check_ip_size(instance: Instance, n_vars: int) -> None:
    if instance.n > IP_MAX_N:
        raise ValueError(f"n: solve_ip is limited to n <= {IP_MAX_N} requests (got {instance.n})")
    if n_vars > IP_MAX_VARS:
        raise ValueError(f"n_vars: solve_ip is limited to {IP_MAX_VARS} binary variables (needs {n_vars})")


def _run_milp(instance: Instance, lo: np.ndarray, hi: np.ndarray, time_limit_s: float,
              relax: bool = False):
    cost, A_mem, A_eq, A_sym, var_req, var_t = _build_ip(instance, lo, hi)
    n_vars = cost.size
    cons = [LinearConstraint(A_eq, 1.0, 1.0)]
    if A_sym is not None:
        cons.append(LinearConstraint(A_sym, -np.inf, 0.0))
    if A_mem.shape[0]:
        cons.append(LinearConstraint(A_mem, -np.inf, float(instance.M)))
    res = milp(cost, integrality=np.zeros(n_vars) if relax else np.ones(n_vars),
               bounds=Bounds(0.0, 1.0), constraints=cons,
               options={"time_limit": float(time_limit_s), "mip_rel_gap": 1e-9, "disp": False})
    const = float(instance.output.sum() - instance.arrival.sum())
    return res, var_req, var_t, const, n_vars


def lp_bound(instance: Instance, time_limit_s: float = 60.0) -> float:
    """LP-relaxation lower bound on the global optimum TEL (linearised Appendix B.1 IP).

    Uses the lossless start windows (waiting time ``<=`` greedy TEL ``- sum o``), so the bound
    is valid for the unrestricted problem; returns ``max(LP, sum o_i)``.
    """
    inc = _greedy_incumbent(instance)
    slack = total_latency(instance, inc) - instance.total_output()
    lo, hi = _windows(instance, slack, None)
    res, *_rest, const, n_vars = _run_milp(instance, lo, hi, time_limit_s, relax=True)
    if n_vars > 20 * IP_MAX_VARS:
        raise ValueError(f"n_vars: lp_bound is limited to {20 * IP_MAX_VARS} variables (needs {n_vars})")
    if res.status != 0 or res.fun is None:
        return float(instance.total_output())
    return max(float(res.fun) + const, float(instance.total_output()))


def solve_ip(instance: Instance, horizon: int | None = None, time_limit_s: float = 60.0) -> OptResult:
    """Minimum-TEL non-preemptive schedule by the linearised IP of Jaillet et al. 2025, Appendix B.1 (HiGHS).

    ``x_{i,t} = 1`` iff request ``i`` starts at ``t``; one start per request; for every round
    ``tau``: ``sum_{i,k: 0 <= tau-k <= o_i - 1 + Δ} (s_i + tau - k) x_{i,k} <= M``.

    Start windows. A feasible greedy schedule (best of Alg 1 break/skip and FCFS) gives an upper
    bound ``U``; in any schedule at least as good, request ``i`` waits at most ``W = U - sum o``
    rounds, so ``p_i in [a_i, a_i + W]`` loses no optimum.
    With ``horizon=None`` (default) the IP is first solved with completions capped at the greedy
    makespan (small model); the optimum ``U*`` found then tightens ``W``; if the cap could
    have cut off a better schedule (some ``a_i + W > makespan - o_i``) the IP is re-solved on the
    lossless windows. Status ``"optimal"`` is therefore a proven global optimum. With an explicit
    ``horizon`` the completions are capped at it and status is ``"optimal_in_horizon"`` unless
    the cap is provably not binding.

    Limits: ``n <= 60`` and at most 20,000 binary variables (each request's window length summed);
    beyond them a one-line ``ValueError`` names the limit. ``time_limit_s`` is passed to HiGHS per
    solve; on timeout the incumbent is returned with ``status="time_limit"``.
    """
    t_start = time.perf_counter()
    if instance.n > IP_MAX_N:
        raise ValueError(f"n: solve_ip is limited to n <= {IP_MAX_N} requests (got {instance.n})")
    inc = _greedy_incumbent(instance)
    inc_tel = total_latency(instance, inc)
    sum_o = instance.total_output()
    makespan = int((inc + instance.output).max())
    cap = makespan if horizon is None else int(horizon)
    lo, hi = _windows(instance, inc_tel - sum_o, cap)
    _check_ip_size(instance, int(np.maximum(hi - lo + 1, 0).sum()))

    def solve(lo: np.ndarray, hi: np.ndarray) -> tuple[int | None, np.ndarray | None, str, float, int]:
        if np.any(hi < lo):
            return None, None, "infeasible", float(sum_o), int(np.maximum(hi - lo + 1, 0).sum())
        res, var_req, var_t, const, n_vars = _run_milp(instance, lo, hi, time_limit_s)
        bound = getattr(res, "mip_dual_bound", None)
        bound = float(sum_o) if bound is None or not np.isfinite(bound) else float(bound) + const
        if res.x is None:
            status = "infeasible" if res.status == 2 else "time_limit"
            return None, None, status, max(bound, float(sum_o)), n_vars
        starts = np.zeros(instance.n, dtype=np.int64)
        chosen = res.x > 0.5
        starts[var_req[chosen]] = var_t[chosen]
        tel = total_latency(instance, starts)
        status = "optimal" if res.status == 0 else "time_limit"
        return tel, starts, status, max(bound, float(sum_o)), n_vars

    tel, starts, status, bound, n_vars = solve(lo, hi)
    info = {"greedy_tel": inc_tel, "completion_cap": cap, "solves": 1}
    pass1_lossless = not bool(np.any(hi < lo + (inc_tel - sum_o)))
    if status == "optimal":
        # Is the completion cap provably not binding?  Tighten W with the optimum found.
        lo2, hi2 = _windows(instance, tel - sum_o, None)
        if not np.any(hi2 > cap - instance.output):
            bound = float(tel)
        elif horizon is None and int((hi2 - lo2 + 1).sum()) <= IP_MAX_VARS:
            tel1, starts1 = tel, starts
            tel, starts, status, bound, n_vars = solve(lo2, hi2)  # lossless windows
            info["solves"] = 2
            if tel is None or tel1 < tel:  # pass 1's schedule is feasible too
                tel, starts = tel1, starts1
            if status == "optimal":
                bound = float(tel)
        else:
            status, bound = "optimal_in_horizon", float(sum_o)
    elif status == "time_limit" and not pass1_lossless:
        bound = float(sum_o)  # the dual bound only holds for the capped problem
    if horizon is None and (tel is None or inc_tel < tel):  # never worse than the greedy incumbent
        tel, starts = inc_tel, inc
    return OptResult(tel, starts, status, float(max(bound, sum_o)), "ip", n_vars,
                     time.perf_counter() - t_start, info)


# ----------------------------------------------------------------------------------------------
# Exhaustive DP (ours; checks the IP and Algorithm 1)
# ----------------------------------------------------------------------------------------------


def solve_exhaustive(instance: Instance, max_states: int = 1_000_000) -> OptResult:
    """Exact minimum TEL by memoised search over (round, waiting set, running profile).

    Each round, any memory-feasible subset of the arrived waiting requests may start
    (including none); running requests continue. TEL is accumulated as ``sum o_i`` plus one per
    waiting request per round, so once every request has arrived the value depends only on
    (waiting set, running ages) and the round is dropped from the key. Subsets are enumerated
    with memory pruning (a superset of an infeasible set is infeasible). Starting nothing while
    nothing runs and everything has arrived is dominated and skipped.

    Limits: ``n <= 8`` and ``max o_i <= 64``, and at most ``max_states`` memoised states
    (pure Python: about 3 s for n = 8, o_i <= 6 (~1e5 states); n = 8, o_i <= 10 takes ~15 s);
    beyond them a one-line ``ValueError`` names the limit.
    """
    if instance.n > EXHAUSTIVE_MAX_N:
        raise ValueError(f"n: solve_exhaustive is limited to n <= {EXHAUSTIVE_MAX_N} (got {instance.n})")
    if int(instance.output.max()) > EXHAUSTIVE_MAX_OUTPUT:
        raise ValueError(f"output: solve_exhaustive is limited to o_i <= {EXHAUSTIVE_MAX_OUTPUT}")
    t_start = time.perf_counter()
    n = instance.n
    a = [int(x) for x in instance.arrival]
    s = [int(x) for x in instance.prompt]
    r = [int(x) for x in instance.resident_rounds]
    M = instance.M
    last_arrival = max(a)
    full = (1 << n) - 1

    def fits(running: tuple[tuple[int, int], ...]) -> bool:
        # running: (request, age) pairs at the current round (age 0 = starts now)
        for _j, age_j in running:
            rem = r[_j] - 1 - age_j  # rounds until j's last resident round
            mem = 0
            for k, age_k in running:
                if age_k + rem <= r[k] - 1:
                    mem += s[k] + age_k + rem
            if mem > M:
                return False
        return True

    choice: dict[tuple, tuple] = {}

    @cache
    def value(t_key: int, waiting: int, running: tuple[tuple[int, int], ...]) -> int:
        """Min future waiting cost from round ``t`` (before admissions); best move in ``choice``."""
        if len(choice) > max_states:
            raise ValueError(f"max_states: solve_exhaustive explored more than {max_states} states")
        t = t_key if t_key >= 0 else last_arrival
        if waiting == 0:
            return 0
        arrived = [i for i in range(n) if waiting >> i & 1 and a[i] <= t]
        best_cost = -1
        best_move: tuple = ()

        def recurse(idx: int, chosen: list[int], run: tuple[tuple[int, int], ...]) -> None:
            nonlocal best_cost, best_move
            if idx == len(arrived):
                if not chosen and not running and t >= last_arrival:
                    return  # idling with an empty machine after the last arrival is dominated
                w = waiting
                for i in chosen:
                    w &= ~(1 << i)
                n_wait = sum(1 for i in range(n) if w >> i & 1 and a[i] <= t)
                nxt = tuple(sorted((j, g + 1) for j, g in run if g + 1 <= r[j] - 1))
                t1 = t + 1
                if w and not nxt and not any(w >> i & 1 and a[i] <= t1 for i in range(n)):
                    # machine empty, next request has not arrived yet: jump to its arrival
                    t1 = min(a[i] for i in range(n) if w >> i & 1)
                key1 = (t1 if t1 < last_arrival else -1, w, nxt)
                cost = n_wait * (t1 - t) + value(*key1)
                if best_cost < 0 or cost < best_cost:
                    best_cost, best_move = cost, (tuple(chosen), t1 - t, key1)
                return
            i = arrived[idx]
            trial = tuple(sorted(run + ((i, 0),)))
            if fits(trial):
                recurse(idx + 1, chosen + [i], trial)
            recurse(idx + 1, chosen, run)

        recurse(0, [], running)
        choice[(t_key, waiting, running)] = best_move
        return best_cost

    t0 = min(a)
    key = (t0 if t0 < last_arrival else -1, full, ())
    try:
        cost = value(*key)
    finally:
        n_states = value.cache_info().currsize
        value.cache_clear()
    starts = np.full(n, -1, dtype=np.int64)
    t = t0
    while key[1]:
        chosen, dt, key = choice[key]
        for i in chosen:
            starts[i] = t
        t += dt
    tel = total_latency(instance, starts)
    assert tel == cost + instance.total_output(), (tel, cost)
    info = {"states": n_states}
    return OptResult(tel, starts, "optimal", float(tel), "exhaustive", 0, time.perf_counter() - t_start, info)


def solve_optimum(instance: Instance, method: Literal["auto", "ip", "exhaustive"] = "auto",
                  time_limit_s: float = 60.0) -> OptResult:
    """Hindsight-optimal (non-preemptive) schedule (Jaillet et al. 2025, Appendix B.1).

    ``method="exhaustive"``: :func:`solve_exhaustive`, limited to ``n <= 8`` and ``o_i <= 64``
    (the state space is exponential in ``n``; with these limits a search finishes in well under a
    second to a few seconds in pure Python). ``method="ip"``: :func:`solve_ip`, limited to
    ``n <= 60`` and 20,000 binary start variables (HiGHS proves optimality of such time-indexed
    models in seconds; the memory-row matrix then has at most ~20,000 x (max o + 1) nonzeros).
    ``"auto"`` uses the IP (milliseconds on tiny instances) and falls back to the exhaustive
    search only when the IP's size limit is exceeded and ``n <= 8``. Exceeding a limit raises a
    one-line ``ValueError``.
    """
    if method == "exhaustive":
        return solve_exhaustive(instance)
    if method == "ip":
        return solve_ip(instance, time_limit_s=time_limit_s)
    if method != "auto":
        raise ValueError(f"method: must be 'auto', 'ip' or 'exhaustive', got {method!r}")
    try:
        return solve_ip(instance, time_limit_s=time_limit_s)
    except ValueError:
        if instance.n <= EXHAUSTIVE_MAX_N:
            return solve_exhaustive(instance)
        raise


# ----------------------------------------------------------------------------------------------
# Regret / ratio helpers (Jaillet et al. 2025, section 3)
# ----------------------------------------------------------------------------------------------


def regret(ael_policy: float, opt_tel: float, n: int) -> float:
    """Per-instance regret ``AEL(policy) - OPT̄`` with ``OPT̄ = opt_tel / n`` (Def. 5.1)."""
    if n < 1:
        raise ValueError(f"n: must be >= 1, got {n}")
    return float(ael_policy) - float(opt_tel) / n


def ratio_to_opt(tel_policy: float, opt_tel: float) -> float:
    """Competitive-ratio sample ``TEL(policy) / OPT`` (= AEL / OPT̄; Def. 6.1, erratum E2)."""
    if opt_tel <= 0:
        raise ValueError(f"opt_tel: must be > 0, got {opt_tel}")
    return float(tel_policy) / float(opt_tel)


# ----------------------------------------------------------------------------------------------
# Adversarial instances (Jaillet et al. 2025, section 6, Thm 6.2 / 6.4)
# ----------------------------------------------------------------------------------------------


def _eps_m(M: int, eps: float) -> int:
    if not 0 < eps < 0.5:
        raise ValueError(f"eps: must be in (0, 0.5), got {eps}")
    em = eps * M
    if abs(em - round(em)) > 1e-9 or round(em) < 1:
        raise ValueError(f"eps: eps*M must be a positive integer (M={M}, eps={eps})")
    return int(round(em))


def adversarial_deterministic(M: int, eps: float, t_long_start: int = 0,
                              convention: Convention = "A") -> Instance:
    """Thm 6.2 instance (Jaillet et al. 2025, section 6) against an algorithm that starts the long job at ``t'``.

    ``s = eps*M`` for every request; request 0 arrives at 0 with ``o = (1 - eps) M`` (so
    ``s + o = M``); ``eps*M`` short requests with ``o = 1`` arrive at ``t' + (1 - 2 eps) M``.
    Under convention A none of the shorts fits while the long job runs past that round.
    """
    em = _eps_m(M, eps)
    t_short = int(t_long_start) + M - 2 * em
    n_short = em
    arrival = np.array([0] + [t_short] * n_short)
    output = np.array([M - em] + [1] * n_short)
    return Instance(arrival=arrival, prompt=em, output=output, M=M, convention=convention)


def adversarial_bounds(M: int, eps: float) -> dict[str, float]:
    """The paper's Thm 6.2 bounds, copied from section 6 (asymptotic in ``M``).

    ``A1`` (online continues the long job): ``TEL >= (eps^3/2 + eps^2) M^2 + (1 - eps/2) M``;
    ``A2`` (online interrupts/delays it): ``TEL >= eps^2 M^2 / 2 + (2 - eps/2) M``;
    ``A3`` (offline waits for the shorts): ``OPT <= (eps^3/2) M^2 + (2 - 3 eps/2) M``.
    """
    e = float(eps)
    return {
        "A1": (e**3 / 2 + e**2) * M**2 + (1 - e / 2) * M,
        "A2": e**2 * M**2 / 2 + (2 - e / 2) * M,
        "A3": (e**3 / 2) * M**2 + (2 - 3 * e / 2) * M,
    }


def adversarial_ratio_lower_bound(M: int, eps: float) -> float:
    """``min(A1, A2) / A3``: Thm 6.2's competitive-ratio lower bound, ``-> 1/eps`` as ``M -> inf``."""
    b = adversarial_bounds(M, eps)
    return min(b["A1"], b["A2"]) / b["A3"]


def adversarial_wait_schedule(instance: Instance) -> np.ndarray:
    """Start rounds of Thm 6.2's offline strategy A3 on an :func:`adversarial_deterministic`
    instance: hold the long request (request 0) until the shorts arrive, serve them first
    (Algorithm 1 order: shortest first while Eq. (1) holds), then the long one. The schedule is
    feasible, so its TEL is an upper bound on OPT and ``TEL(policy) / TEL(A3)`` a lower bound on
    the policy's ratio to the optimum on that instance."""
    t_short = int(instance.arrival[1:].min())
    held = Instance(arrival=np.r_[t_short, instance.arrival[1:]], prompt=instance.prompt,
                    output=instance.output, M=instance.M, convention=instance.convention)
    return algorithm1_schedule(held)


def adversarial_yao(M: int, eps: float, c: int, convention: Convention = "A") -> list[tuple[float, Instance]]:
    """Thm 6.4 (Yao) distribution (Jaillet et al. 2025, section 6): ``[(probability, instance), ...]``.

    A long request (``s + o = M``, ``s = eps M``) at round 0; instance ``I_k`` adds ``eps M``
    unit-output shorts at round ``k M`` for ``k in {1 - 2 eps, 1 - eps, ..., c + 1 - 2 eps}``.
    The paper gives each ``I_k`` probability ``eps / c``; that sums to ``1 + eps/c`` over the
    ``c/eps + 1`` values, so here the probabilities are normalised uniformly ([ours]).
    """
    em = _eps_m(M, eps)
    if int(c) != c or c < 1:
        raise ValueError(f"c: must be an integer >= 1, got {c}")
    # k M = M - 2 em + j em for j = 0 .. c M / em
    if (c * M) % em:
        raise ValueError(f"c: c*M must be a multiple of eps*M (c={c}, M={M}, eps*M={em})")
    ks = [M - 2 * em + j * em for j in range(c * M // em + 1)]
    prob = 1.0 / len(ks)
    out = []
    for t_short in ks:
        arrival = np.array([0] + [t_short] * em)
        output = np.array([M - em] + [1] * em)
        out.append((prob, Instance(arrival=arrival, prompt=em, output=output, M=M, convention=convention)))
    return out


__all__ = [
    "Instance", "OptResult", "memory_profile", "is_feasible", "total_latency", "algorithm1_schedule",
    "solve_ip", "lp_bound", "solve_exhaustive", "solve_optimum", "regret", "ratio_to_opt",
    "adversarial_deterministic", "adversarial_bounds", "adversarial_ratio_lower_bound", "adversarial_yao",
    "adversarial_wait_schedule",
    "EXHAUSTIVE_MAX_N", "EXHAUSTIVE_MAX_OUTPUT", "IP_MAX_N", "IP_MAX_VARS",
]
