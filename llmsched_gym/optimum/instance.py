"""A static round-mode instance (Jaillet et al. 2025, section 3), its memory profile and feasibility,
the paper's Algorithm 1 / 2 start rounds, the result type of the solvers, and regret and ratio."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

Convention = Literal["A", "B"]


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
