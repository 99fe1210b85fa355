"""Admission rules of ``LLMSched-v1``: which waiting requests may still join the batch being formed.

* ``current``: the request's prefill (prompt, or prompt + generated after a recompute preemption,
  plus the first token when prefill emits one) fits in the KV that is free now, after this
  iteration's decode growth and what the batch being formed already reserves. Memory is counted in
  whole blocks, so a batch of admissible requests never overflows in the iteration it starts.
* ``future``: Jaillet et al. 2025's Eq. (1) (MC-SF, section 4) with predicted output lengths and
  time in iterations: admitting the request keeps the predicted KV of every resident request at or
  below the capacity at every completion point up to its own (the paper checks ``t'`` in
  ``[t, t_max(U)]``), the candidate's own completion included (erratum E10). A running request that
  outlived its prediction is taken to finish in the next iteration; in paged mode each request is
  charged ``block_size - 1`` more tokens (its partly filled last block), so the test stays
  sufficient. Same readings as ``baselines/mcsf.py``, so the env under this rule admits exactly
  what MC-SF may admit.
* ``none``: anything in the queue; an overflow is left to the engine's overflow handler.

:class:`FutureProfile` evaluates Eq. (1) for many candidates at once. A resident request ``x``
(running, or already chosen for this batch) is a line: ``tau`` iterations from now it holds
``base_x + tau`` tokens, until its predicted completion ``c_x`` (inclusive, the paper's
convention A). Memory only drops at completions, so the peaks are at the points ``c_x``; with
``F(tau) = sum_{c_x >= tau} (base_x + tau)``, a candidate ``(c, b)`` fits iff
``max_{c_x < c} F(c_x) + c_x + b <= M`` (the existing peaks it overlaps) and ``F(c) + c + b <= M``
(its own peak). Both come from a prefix maximum and suffix sums over the sorted ``c_x``: one
``searchsorted`` for all K candidates, O((R + K) log R) with numpy for R residents.
"""

from __future__ import annotations

import numpy as np

ADMISSION_RULES = ("current", "future", "none")
_NO_PEAK = -(1 << 62)
"""The prefix maximum before the first resident (below any peak: a line's peak is at least 1)."""


class FutureProfile:
    """Predicted future KV of a set of resident requests, and the Eq. (1) test for candidates.

    :param capacity_tokens: the KV capacity ``M`` (tokens; whole blocks in paged mode).
    :param max_residents: an upper bound on the number of residents (the workload size).
    """

    __slots__ = ("capacity", "_desc", "_cs", "_suffix", "_prefix_max", "peak", "_suffix_buf", "_prefix_buf")

    def __init__(self, capacity_tokens: int, max_residents: int) -> None:
        self.capacity = int(capacity_tokens)
        self._desc = np.arange(max_residents + 1, 0, -1, dtype=np.int64)
        # the two tables live in buffers for the most residents (each build writes a prefix)
        self._suffix_buf = np.zeros(max_residents + 2, np.int64)
        self._prefix_buf = np.empty(max_residents + 2, np.int64)
        self._prefix_buf[0] = _NO_PEAK
        self.build(np.empty(0, np.int64), np.empty(0, np.int64))

    def build(self, c: np.ndarray, base: np.ndarray) -> None:
        """Residents with completion points ``c`` (iterations from now, >= 1, sorted ascending) and
        lines ``base``.

        Two flat tables indexed by ``k``, the first resident completing at or after a candidate's
        point: ``_suffix[k]``, the residents' bases from ``k`` on, and ``_prefix_max[k]``, the
        highest peak ``F(c_x) + c_x`` among the residents before ``k`` (``_NO_PEAK``: none). Integers
        throughout: numpy's casting paths cost more than the arithmetic on arrays this small."""
        n = len(c)
        if n + 2 > len(self._suffix_buf):  # more residents than announced: fresh tables
            suffix, prefix_max = np.zeros(n + 1, np.int64), np.empty(n + 1, np.int64)
            prefix_max[0] = _NO_PEAK
        else:
            suffix, prefix_max = self._suffix_buf[: n + 1], self._prefix_buf[: n + 1]
            suffix[n] = 0
        if n:
            np.add.accumulate(base[::-1], out=suffix[n - 1::-1])
            # F at each point (exact at the first of equal points, lower at the others: harmless
            # for the maxima below, which the first of the group attains)
            f = c * self._desc[len(self._desc) - n:]
            f += suffix[:n]
            self.peak = int(f[f.argmax()])  # (the maximum; cheaper than a reduction on arrays this small)
            f += c
            np.maximum.accumulate(f, out=prefix_max[1:])
        else:
            self.peak = 0
        self._cs, self._suffix, self._prefix_max = c, suffix, prefix_max

    def room(self, c: np.ndarray, base: np.ndarray) -> np.ndarray:
        """Tokens to spare for each candidate ``(c[i], base[i])``: ``M`` minus the worst peak it
        would create up to its completion (the peaks before ``c``, a prefix maximum, and its own
        at ``c``: the residents from ``k`` on and itself, ``n + 1 - k`` lines). It fits iff
        ``room >= 0``; with ``x`` more tokens held throughout, iff ``room >= x``."""
        return self.room_left(c, self.capacity - base)

    def room_left(self, c: np.ndarray, spare: np.ndarray) -> np.ndarray:
        """:meth:`room` given each candidate's ``spare = M - base`` (a fresh array)."""
        cs = self._cs
        k = cs.searchsorted(c)
        worst = len(cs) + 1 - k
        worst *= c
        worst += self._suffix[k]  # its own peak
        np.maximum(worst, self._prefix_max[k], out=worst)
        return np.subtract(spare, worst, out=worst)

    def fits(self, c: np.ndarray, base: np.ndarray) -> np.ndarray:
        """Whether each candidate alone keeps every peak up to its completion within capacity."""
        return self.room(c, base) >= 0
