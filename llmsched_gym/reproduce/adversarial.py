"""Adversarial instances of Jaillet et al. 2025, section 6 (Thm 6.2's deterministic family, its
bounds and offline strategy A3, and Thm 6.4's Yao distribution), used by the reproduction of that
paper (``llmsched reproduce jaillet``)."""

from __future__ import annotations

import numpy as np

from llmsched_gym.optimum.instance import Convention, Instance, algorithm1_schedule


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
    "adversarial_bounds", "adversarial_deterministic", "adversarial_ratio_lower_bound", "adversarial_wait_schedule",
    "adversarial_yao",
]
