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
(we found counter-examples by exhaustive search; regression instances in the tests). The adversarial
instance families of Thm 6.2 / 6.4 (section 6) are with the reproductions
(:mod:`llmsched_gym.reproduce.adversarial`).

Modules: :mod:`~llmsched_gym.optimum.instance` (the instance, feasibility, Algorithm 1, the result
type, regret and ratio), :mod:`~llmsched_gym.optimum.ip` (the integer program),
:mod:`~llmsched_gym.optimum.exhaustive` (the exact search); this package re-exports their public
names and picks a solver (:func:`solve_optimum`).
"""

from __future__ import annotations

from typing import Literal

from llmsched_gym.optimum.exhaustive import EXHAUSTIVE_MAX_N, EXHAUSTIVE_MAX_OUTPUT, solve_exhaustive
from llmsched_gym.optimum.instance import (
    Convention,
    Instance,
    OptResult,
    algorithm1_schedule,
    is_feasible,
    memory_profile,
    ratio_to_opt,
    regret,
    total_latency,
)
from llmsched_gym.optimum.ip import IP_MAX_N, IP_MAX_VARS, lp_bound, solve_ip


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


__all__ = [
    "Convention", "Instance", "OptResult", "memory_profile", "is_feasible", "total_latency", "algorithm1_schedule",
    "solve_ip", "lp_bound", "solve_exhaustive", "solve_optimum", "regret", "ratio_to_opt",
    "EXHAUSTIVE_MAX_N", "EXHAUSTIVE_MAX_OUTPUT", "IP_MAX_N", "IP_MAX_VARS",
]
