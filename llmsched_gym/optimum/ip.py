"""The integer program: our linearisation of the time-indexed IP of Jaillet et al. 2025, Appendix B.1,
solved by HiGHS through ``scipy.optimize.milp``."""

from __future__ import annotations

import time

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp

from llmsched_gym.optimum.instance import Instance, OptResult, algorithm1_schedule, total_latency

# Size limits (see solve_optimum's docstring for the justification).
IP_MAX_N = 60
IP_MAX_VARS = 20_000


def _greedy_incumbent(instance: Instance) -> np.ndarray:
    """Best (lowest TEL) of a few feasible greedy schedules (Alg 1 break/skip, FCFS)."""
    cands = [algorithm1_schedule(instance, "break"), algorithm1_schedule(instance, "skip"),
             algorithm1_schedule(instance, "skip", order="fcfs")]
    return min(cands, key=lambda p: total_latency(instance, p))


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

