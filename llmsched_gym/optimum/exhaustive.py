"""Exact minimum TEL by exhaustive search (ours; checks the IP and Algorithm 1)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from llmsched_gym.optimum.instance import Instance, OptResult, total_latency

# Size limits (see solve_optimum's docstring for the justification).
EXHAUSTIVE_MAX_N = 8
EXHAUSTIVE_MAX_OUTPUT = 64

Running = tuple[tuple[int, int], ...]
"""(request, age) pairs of the running requests at a round (age 0 = starts now), sorted."""
Key = tuple[int, int, Running]
"""A search state: (round, or -1 once every request has arrived; waiting set as a bit mask; running)."""


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
    search = _Search(instance, max_states)
    t0 = min(search.a)
    key = (t0 if t0 < search.last_arrival else -1, (1 << instance.n) - 1, ())
    cost = search.value(*key)
    starts = search.schedule(t0, key)
    tel = total_latency(instance, starts)
    assert tel == cost + instance.total_output(), (tel, cost)
    info = {"states": len(search.memo)}
    return OptResult(tel, starts, "optimal", float(tel), "exhaustive", 0, time.perf_counter() - t_start, info)


class _Search:
    """The memoised search of one instance: :meth:`value` of a state, the best move of each state
    in :attr:`choice`, and the schedule those moves give (:meth:`schedule`)."""

    def __init__(self, instance: Instance, max_states: int) -> None:
        self.n = instance.n
        self.a = [int(x) for x in instance.arrival]
        self.s = [int(x) for x in instance.prompt]
        self.r = [int(x) for x in instance.resident_rounds]
        self.M = instance.M
        self.last_arrival = max(self.a)
        self.max_states = max_states
        self.memo: dict[Key, int] = {}
        self.choice: dict[Key, tuple] = {}

    def fits(self, running: Running) -> bool:
        """Memory stays within ``M`` at every future last-resident round of the running requests."""
        r, s = self.r, self.s
        for _j, age_j in running:
            rem = r[_j] - 1 - age_j  # rounds until j's last resident round
            mem = 0
            for k, age_k in running:
                if age_k + rem <= r[k] - 1:
                    mem += s[k] + age_k + rem
            if mem > self.M:
                return False
        return True

    def value(self, t_key: int, waiting: int, running: Running) -> int:
        """Min future waiting cost from round ``t`` (before admissions); best move in ``choice``."""
        key = (t_key, waiting, running)
        known = self.memo.get(key)
        if known is not None:
            return known
        if len(self.choice) > self.max_states:
            raise ValueError(f"max_states: solve_exhaustive explored more than {self.max_states} states")
        if waiting == 0:
            cost = 0
        else:
            t = t_key if t_key >= 0 else self.last_arrival
            cost, self.choice[key] = self._best_move(t, waiting, running)
        self.memo[key] = cost
        return cost

    def _best_move(self, t: int, waiting: int, running: Running) -> tuple[int, tuple]:
        """The cheapest set of arrived waiting requests to start at round ``t``: (cost, move), with
        move = (started requests, rounds to the next decision, the next state)."""
        arrived = [i for i in range(self.n) if waiting >> i & 1 and self.a[i] <= t]
        best_cost, best_move = -1, ()
        for chosen, run in self._startable(arrived, running):
            if not chosen and not running and t >= self.last_arrival:
                continue  # idling with an empty machine after the last arrival is dominated
            cost, move = self._after(t, waiting, chosen, run)
            if best_cost < 0 or cost < best_cost:
                best_cost, best_move = cost, move
        return best_cost, best_move

    def _startable(self, arrived: list[int], running: Running) -> Iterator[tuple[list[int], Running]]:
        """Every memory-feasible subset of ``arrived`` (with the running requests it joins), each
        request first taken then left out, depth first; a superset of an infeasible set is skipped."""
        stack: list[tuple[int, list[int], Running]] = [(0, [], running)]
        while stack:
            idx, chosen, run = stack.pop()
            if idx == len(arrived):
                yield chosen, run
                continue
            i = arrived[idx]
            trial = tuple(sorted(run + ((i, 0),)))
            stack.append((idx + 1, chosen, run))  # left out: explored after every set that takes i
            if self.fits(trial):
                stack.append((idx + 1, chosen + [i], trial))

    def _after(self, t: int, waiting: int, chosen: list[int], run: Running) -> tuple[int, tuple]:
        """Cost of starting ``chosen`` at round ``t``: one per waiting request per round until the next
        decision round (the next round, or the next arrival when the machine empties), plus its value."""
        n, a, r = self.n, self.a, self.r
        w = waiting
        for i in chosen:
            w &= ~(1 << i)
        n_wait = sum(1 for i in range(n) if w >> i & 1 and a[i] <= t)
        nxt = tuple(sorted((j, g + 1) for j, g in run if g + 1 <= r[j] - 1))
        t1 = t + 1
        if w and not nxt and not any(w >> i & 1 and a[i] <= t1 for i in range(n)):
            # machine empty, next request has not arrived yet: jump to its arrival
            t1 = min(a[i] for i in range(n) if w >> i & 1)
        key1 = (t1 if t1 < self.last_arrival else -1, w, nxt)
        return n_wait * (t1 - t) + self.value(*key1), (tuple(chosen), t1 - t, key1)

    def schedule(self, t0: int, key: Key) -> np.ndarray:
        """Start round of each request along the best moves from state ``key`` at round ``t0``."""
        starts = np.full(self.n, -1, dtype=np.int64)
        t = t0
        while key[1]:
            chosen, dt, key = self.choice[key]
            for i in chosen:
                starts[i] = t
            t += dt
        return starts
