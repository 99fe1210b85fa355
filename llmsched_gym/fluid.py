"""Fluid benchmark and WAIT / Nested WAIT threshold recipes (Ao, Luo, Simchi-Levi and
Wang 2025, sections 3-5; see docs/papers.md). Prompt type ``j`` has Poisson rate
``lambda_j``, prompt length ``l_j`` and output length ``l'_j``; one iteration takes
``d0 + d1 * (KV tokens in the batch)`` (paper Eq. 1). With ``a_j = (l'_j + 1)(l_j + l'_j / 2)``
and ``A = sum_j lambda_j a_j`` the fluid equilibrium (paper §3.2, Eqs. 8-10) is

* ``Throughput* = sum_j lambda_j l'_j`` (Prop. 2: an upper bound for any policy),
* ``M* = d0 A / (1 - d1 A)``, ``DeltaT* = d0 / (1 - d1 A)`` (requires ``d1 A < 1``, Prop. 1),
* per-type population ``n_j* = DeltaT* lambda_j (l'_j + 1)``, i.e. ``DeltaT* lambda_j`` per stage.

Items marked [derived] follow from the paper's formulas; [ours] / non-paper are our additions.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Literal

import numpy as np

TypeSpec = tuple[float, float, float]  # (lambda_j, l_j, l'_j)


def _parse_types(types: list[TypeSpec] | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    arr = np.asarray(types, dtype=float)
    if arr.ndim != 2 or arr.shape[1] != 3 or arr.shape[0] == 0:
        raise ValueError("types: expected a non-empty list of (lambda_j, l_j, l'_j) triples")
    lam, ell, lp = arr[:, 0], arr[:, 1], arr[:, 2]
    if np.any(lam <= 0):
        raise ValueError("types: every lambda_j must be > 0")
    if np.any(ell < 0) or np.any(lp < 1):
        raise ValueError("types: need l_j >= 0 and l'_j >= 1")
    return lam, ell, lp


def stage_memory(ell: np.ndarray | float, lp: np.ndarray | float) -> np.ndarray:
    """``a_j = (l'_j + 1)(l_j + l'_j / 2)``: KV summed over the ``l'_j + 1`` stages (paper Eq. 4)."""
    return (np.asarray(lp, dtype=float) + 1.0) * (np.asarray(ell, dtype=float) + np.asarray(lp, dtype=float) / 2.0)


@dataclass
class CapacityAware:
    """[derived; NOT in the paper]: capacity-aware fluid throughput (fractional knapsack).

    ``max sum_j x_j l'_j  s.t.  sum_j x_j a_j <= S_max = C / (d0 + d1 C),  0 <= x_j <= lambda_j``;
    a heuristic reference, not a proven upper bound for stochastic policies.
    """

    x: list[float]
    throughput: float
    S: float
    S_max: float
    delta_T: float
    memory: float
    non_paper: bool = True


@dataclass
class FluidBound:
    """Fluid equilibrium quantities (Ao et al. 2025, sections 3.1-3.2); ``inf`` where ``d1 A >= 1``."""

    throughput_star: float
    A: float
    a: list[float]
    stable: bool
    M_star: float
    delta_T_star: float
    n_star: list[float]
    per_stage: list[float]
    C: float | None = None
    memory_slack: float | None = None
    capacity_aware: CapacityAware | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def fluid_bound(types: list[TypeSpec] | np.ndarray, d0: float, d1: float, C: float | None = None) -> FluidBound:
    """Fluid benchmark of Ao et al. 2025 (section 3.2, Eqs. 8-10).

    :param types: ``[(lambda_j, l_j, l'_j), ...]``.
    :param d0: fixed iteration overhead; ``d1``: time per KV token in the batch (paper Eq. 1).
    :param C: KV capacity (tokens). When given and ``C < M*`` or ``d1 A >= 1``, our
        capacity-aware value is attached (marked non-paper); ``memory_slack = C / M*``.
    """
    lam, ell, lp = _parse_types(types)
    if d0 <= 0 or d1 < 0:
        raise ValueError("d0: need d0 > 0 and d1 >= 0")
    a = stage_memory(ell, lp)
    A = float(np.sum(lam * a))
    thr = float(np.sum(lam * lp))
    stable = d1 * A < 1.0
    notes: list[str] = []
    if stable:
        dT = d0 / (1.0 - d1 * A)
        M_star = d0 * A / (1.0 - d1 * A)
    else:
        dT = M_star = math.inf
        notes.append("d1*A >= 1: no fluid equilibrium; every policy has Omega(T) latency (Prop. 1)")
    per_stage = (dT * lam).tolist()
    n_star = (dT * lam * (lp + 1.0)).tolist()
    out = FluidBound(thr, A, a.tolist(), stable, M_star, dT, n_star, per_stage, C, None, None, notes)
    if C is not None:
        if C <= 0:
            raise ValueError("C: must be > 0")
        out.memory_slack = C / M_star if stable else 0.0
        if not stable or C < M_star:
            out.capacity_aware = capacity_aware_bound(types, d0, d1, C)
            notes.append("capacity_aware is our derived bound, not in the paper")
    return out


def capacity_aware_bound(types: list[TypeSpec] | np.ndarray, d0: float, d1: float, C: float) -> CapacityAware:
    """Our fractional knapsack, solved greedily in decreasing ``l'_j / a_j`` (non-paper)."""
    lam, ell, lp = _parse_types(types)
    a = stage_memory(ell, lp)
    S_max = C / (d0 + d1 * C)
    x = np.zeros_like(lam)
    room = S_max
    for j in np.argsort(-(lp / a), kind="stable"):
        take = min(lam[j], room / a[j])
        x[j] = take
        room -= take * a[j]
        if room <= 0:
            break
    S = float(np.sum(x * a))
    dT = d0 / (1.0 - d1 * S)
    return CapacityAware(x.tolist(), float(np.sum(x * lp)), S, S_max, dT, d0 * S / (1.0 - d1 * S))


# ----------------------------------------------------------------------------------------------
# WAIT thresholds (Ao et al. 2025, section 4.2)
# ----------------------------------------------------------------------------------------------


@dataclass
class WaitThresholds:
    """WAIT per-stage thresholds ``n_j`` with the Eq. 11 / memory checks (section 4.2).

    ``c_min = DeltaT*`` and ``c_max = C / A`` bound the one-parameter recipe ``n_j = c lambda_j``;
    ``n`` are the real-valued thresholds, ``n_int`` the rounded ones (``ceil``), and
    ``eq11_ok`` / ``memory_ok`` re-check ``DeltaT(n) <= n_j / lambda_j`` and ``M^pi <= C`` for
    ``n_int``.
    """

    rule: str
    c: float | None
    c_min: float | None
    c_max: float | None
    n: list[float]
    n_int: list[int]
    M_pi: float
    delta_T: float
    eq11_ok: bool | None
    memory_ok: bool | None

    def to_dict(self) -> dict:
        return asdict(self)


def _wait_result(rule: str, lam: np.ndarray, a: np.ndarray, n: np.ndarray, n_int: np.ndarray, d0: float | None,
                 d1: float | None, C: float | None, c: float | None, c_min: float | None,
                 c_max: float | None) -> WaitThresholds:
    M_pi = float(np.sum(n_int * a))  # Eq. 18: sum_j n_j (l'_j + 1)(l_j + l'_j/2)
    if d0 is not None and d1 is not None:
        dT = d0 + d1 * M_pi
        eq11 = bool(np.all(dT <= n_int / lam * (1 + 1e-12)))
    else:
        dT, eq11 = math.nan, None
    mem_ok = None if C is None else bool(M_pi <= C)
    return WaitThresholds(rule, c, c_min, c_max, n.tolist(), [int(v) for v in n_int], M_pi, dT, eq11, mem_ok)


def wait_thresholds_fluid(types: list[TypeSpec] | np.ndarray, d0: float, d1: float, C: float | None = None,
                          c: float | None = None) -> WaitThresholds:
    """Fluid recipe ``n_j = c lambda_j`` (section 4.2 [derived]).

    Eq. 11 holds iff ``c >= DeltaT* = d0 / (1 - d1 A)``; the WAIT peak memory ``M^pi = c A <= C``
    iff ``c <= C / A``; so a feasible ``c`` exists iff ``C >= M*``. ``c`` defaults to
    ``DeltaT*`` (the zero-drift equilibrium policy pi*); ``n_int = ceil(c lambda_j)``.
    """
    lam, ell, lp = _parse_types(types)
    a = stage_memory(ell, lp)
    A = float(np.sum(lam * a))
    if d1 * A >= 1:
        raise ValueError("d1: d1*A >= 1, no fluid equilibrium (Prop. 1), WAIT thresholds undefined")
    c_min = d0 / (1.0 - d1 * A)
    c_max = None if C is None else C / A
    cc = c_min if c is None else float(c)
    n = cc * lam
    n_int = np.ceil(n - 1e-9).astype(int)
    return _wait_result("fluid", lam, a, n, n_int, d0, d1, C, cc, c_min, c_max)


def wait_thresholds_practical(types: list[TypeSpec] | np.ndarray, B: float,
                              rule: Literal["fluid_proportional", "paper_literal"] = "fluid_proportional",
                              d0: float | None = None, d1: float | None = None,
                              C: float | None = None) -> WaitThresholds:
    """Batch-size-limit rule of Ao et al. 2025, section 6.1.

    ``"paper_literal"``: ``n_j = B rho_j / (l'_j + 1)`` with ``rho_j = lambda_j / sum lambda``.
    ``"fluid_proportional"`` (default; companion code, flagged [external]):
    ``n_j = B lambda_j / sum_j' lambda_j' (l'_j' + 1)`` so that ``sum_j n_j (l'_j + 1) = B``.
    ``n_int = int(max(n_j, 1))`` as in the companion code. Eq. 11 is checked when ``d0, d1`` given.
    """
    lam, ell, lp = _parse_types(types)
    a = stage_memory(ell, lp)
    if B <= 0:
        raise ValueError("B: batch-size limit must be > 0")
    if rule == "paper_literal":
        n = B * (lam / lam.sum()) / (lp + 1.0)
    elif rule == "fluid_proportional":
        n = B * lam / float(np.sum(lam * (lp + 1.0)))
    else:
        raise ValueError(f"rule: must be 'fluid_proportional' or 'paper_literal', got {rule!r}")
    n_int = np.maximum(n, 1.0).astype(int)
    return _wait_result(rule, lam, a, n, n_int, d0, d1, C, None, None, None)


# ----------------------------------------------------------------------------------------------
# Nested WAIT (Ao et al. 2025, section 5, Eqs. 12-14, 20)
# ----------------------------------------------------------------------------------------------


def theta_root(n_prev: float, n_k: float, p: float) -> float:
    """Exact ``theta_k`` of Eq. 20: positive root of ``e^{-theta n_k} (1 - p + p e^theta)^{n_{k-1}} = 1``.

    ``p`` uses appendix indexing (``Lambda_k / Lambda_{k-1}``). A root exists iff
    ``n_{k-1} > n_k > n_{k-1} p`` and ``0 < p < 1``; returns ``0.0`` at zero drift
    (``n_k = n_{k-1} p``, the paper's experimental setting) and raises otherwise.
    """
    if not 0 < p < 1:
        raise ValueError(f"p: survival fraction must be in (0, 1), got {p}")
    drift = n_k - n_prev * p
    if abs(drift) <= 1e-12 * max(n_prev, 1.0):
        return 0.0
    if not (n_prev > n_k and drift > 0):
        raise ValueError(f"n: Eq. 20 needs n_(k-1) > n_k > n_(k-1) p (got {n_prev}, {n_k}, p={p})")

    def g(th: float) -> float:
        return -th * n_k + n_prev * (math.log1p(p * math.expm1(th)))

    hi = 1.0
    while g(hi) <= 0:
        hi *= 2.0
        if hi > 1e6:
            raise ValueError("n: Eq. 20 root not bracketed")
    from scipy.optimize import brentq  # scipy costs ~0.3 s to import; only Nested WAIT needs it

    return float(brentq(g, 1e-300 if g(1e-12) < 0 else 1e-12, hi, xtol=1e-14, rtol=1e-12))


@dataclass
class NestedWaitPlan:
    """Nested WAIT thresholds and memory (section 5).

    ``n`` real thresholds ``n_k = c Lambda_k gamma^{k-1}``; ``p`` main-text survival fractions
    ``p_k = Lambda_{k+1} / Lambda_k`` (k = 1..m-1); ``theta`` Eq. 20 roots for k = 2..m
    (``0`` at zero drift, buffer then ``inf``); ``M_pi`` Eq. 13 (``mpi_formula``);
    ``buffer`` the Eq. 14 sum over k >= 2; ``memory_requirement = M_pi + buffer``.
    """

    c: float
    c_min: float
    gamma: float
    Lambda: list[float]
    n: list[float]
    p: list[float]
    eq12_ok: bool
    M_pi: float
    delta_T: float
    theta: list[float]
    log_term: float
    buffer: float
    memory_requirement: float
    mpi_formula: str
    fits_C: bool | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def nested_mpi(n: np.ndarray, ell: float, lps: np.ndarray,
               formula: Literal["paper_eq13", "exact_stage_sum"] = "paper_eq13") -> float:
    """Eq. 13 ``M^pi = sum_k n_k (ell + L'_k / 2) Delta l'_k`` or the exact stage sum (section 5).

    ``exact_stage_sum``: ``sum_k n_k Delta l'_k (ell + (l'_{k-1} + 1 + l'_k) / 2)`` (stage 0 ignored).
    """
    lps = np.asarray(lps, dtype=float)
    prev = np.concatenate([[0.0], lps[:-1]])
    dl = lps - prev
    if formula == "paper_eq13":
        per = ell + np.cumsum(lps) / 2.0
    elif formula == "exact_stage_sum":
        per = ell + (prev + 1.0 + lps) / 2.0
    else:
        raise ValueError(f"formula: must be 'paper_eq13' or 'exact_stage_sum', got {formula!r}")
    return float(np.sum(np.asarray(n, dtype=float) * per * dl))


def nested_wait_thresholds(lambdas: list[float] | np.ndarray, ell: float, lps: list[float] | np.ndarray,
                           d0: float, d1: float, *, gamma: float = 1.0, c: float | None = None,
                           slack: float = 0.1, delta: float = 0.01, n_batches: float = 1e5,
                           zeta: float = 1.0, log_rule: Literal["theorem", "proof"] = "proof",
                           mpi_formula: Literal["paper_eq13", "exact_stage_sum"] = "paper_eq13",
                           C: float | None = None) -> NestedWaitPlan:
    """Nested WAIT recipe [derived from section 5]: ``n_k = c Lambda_k gamma^{k-1}``.

    ``Lambda_k = sum_{j>=k} lambda_j`` (types sorted by ``l'``); ``1 <= gamma < min_k 1/p_k``
    (``gamma = 1`` is the paper's experimental zero-drift choice: Eq. 12's second condition then
    holds only with equality, ``theta_k = 0`` and the Eq. 14 buffer is infinite). Eq. 12a,
    ``d0 + d1 c mu(gamma) < c`` with ``M^pi = c mu(gamma)``, gives ``c_min = d0 / (1 - d1 mu)``;
    the default ``c = (1 + slack) c_min`` ([ours]). Eq. 14 buffer:
    ``sum_{k>=2} (ell + l'_{k-1}) (n_k + ln(.) / theta_k)`` with ``ln(m zeta B / delta)``
    (``log_rule="theorem"``) or ``ln((m-1) B / delta)`` (``"proof"``, the one derived), where
    ``B = n_batches`` is the number of iterations in the horizon.
    """
    lam = np.asarray(lambdas, dtype=float)
    lps_a = np.asarray(lps, dtype=float)
    m = lam.size
    if m == 0 or lps_a.size != m:
        raise ValueError("lps: need one output length per arrival rate")
    if np.any(lam <= 0):
        raise ValueError("lambdas: every rate must be > 0")
    if np.any(np.diff(lps_a) <= 0) or lps_a[0] < 1:
        raise ValueError("lps: output lengths must be strictly increasing and >= 1")
    Lam = np.cumsum(lam[::-1])[::-1]
    p = Lam[1:] / Lam[:-1]
    if gamma < 1 or (m > 1 and gamma * p.max() >= 1):
        raise ValueError(f"gamma: need 1 <= gamma < min 1/p_k = {1 / p.max() if m > 1 else math.inf:.6g}")
    base = Lam * gamma ** np.arange(m)
    mu = nested_mpi(base, ell, lps_a, mpi_formula)
    if d1 * mu >= 1:
        raise ValueError("d1: d1*mu(gamma) >= 1, Eq. 12a cannot hold")
    c_min = d0 / (1.0 - d1 * mu)
    cc = (1.0 + slack) * c_min if c is None else float(c)
    n = cc * base
    M_pi = cc * mu
    dT = d0 + d1 * M_pi
    eq12 = bool(dT < n[0] / lam.sum() and np.all(n[1:] / n[:-1] > p * (1 + 1e-12)))
    if log_rule == "theorem":
        log_term = math.log(m * zeta * n_batches / delta)
    elif log_rule == "proof":
        log_term = math.log(max(m - 1, 1) * n_batches / delta)
    else:
        raise ValueError(f"log_rule: must be 'theorem' or 'proof', got {log_rule!r}")
    theta: list[float] = []
    buf = 0.0
    for k in range(1, m):  # 0-based k -> segment k+1 (>= 2)
        th = theta_root(n[k - 1], n[k], Lam[k] / Lam[k - 1])
        theta.append(th)
        buf += (ell + lps_a[k - 1]) * (n[k] + (log_term / th if th > 0 else math.inf))
    buf = float(buf)
    req = M_pi + buf
    return NestedWaitPlan(cc, c_min, float(gamma), Lam.tolist(), n.tolist(), p.tolist(), eq12, M_pi, dT,
                          theta, log_term, buf, req, mpi_formula, None if C is None else bool(req <= C))


__all__ = [
    "FluidBound", "CapacityAware", "WaitThresholds", "NestedWaitPlan", "fluid_bound", "capacity_aware_bound",
    "stage_memory", "wait_thresholds_fluid", "wait_thresholds_practical", "theta_root", "nested_mpi",
    "nested_wait_thresholds",
]
