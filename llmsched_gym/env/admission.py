"""Admission rules of ``LLMSched-v0``: which waiting requests may still join the batch being formed.

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


class FutureProfile:
    """Predicted future KV of a set of resident requests, and the Eq. (1) test for candidates.

    :param capacity_tokens: the KV capacity ``M`` (tokens; whole blocks in paged mode).
    :param max_residents: an upper bound on the number of residents (the workload size).
    """

    __slots__ = ("capacity", "_desc", "_cs", "_table", "_buf", "peak")

    def __init__(self, capacity_tokens: int, max_residents: int) -> None:
        self.capacity = int(capacity_tokens)
        self._desc = np.arange(max_residents + 1, 0, -1, dtype=np.int64)
        # rows [o:] of this buffer are the table of n = max_residents - o residents: its third
        # column (residents at or after row k, + 1) is the same descending run for every n
        self._buf = np.empty((max_residents + 1, 3))
        self._buf[:, 2] = self._desc
        self.build(np.empty(0, np.int64), np.empty(0, np.int64))

    def build(self, c: np.ndarray, base: np.ndarray) -> None:
        """Residents with completion points ``c`` (iterations from now, >= 1, sorted ascending) and
        lines ``base``."""
        n = len(c)
        table = self._buf[len(self._buf) - n - 1:]
        table[0, 0] = -np.inf
        table[n, 1] = 0.0
        if n:
            suffix = base[::-1].cumsum()[::-1]
            table[:n, 1] = suffix
            # F at each point (exact at the first of equal points, lower at the others: harmless
            # for the maxima below, which the first of the group attains)
            f = suffix + c * self._desc[len(self._desc) - n:]
            self.peak = int(f.max())
            np.maximum.accumulate(f + c, out=table[1:, 0])
        else:
            self.peak = 0
        self._cs, self._table = c, table

    def room(self, c: np.ndarray, base: np.ndarray) -> np.ndarray:
        """Tokens to spare for each candidate ``(c[i], base[i])``: ``M`` minus the worst peak it
        would create up to its completion (the peaks before ``c``, a prefix maximum, and its own
        at ``c``). It fits iff ``room >= 0``; with ``x`` more tokens held throughout, iff
        ``room >= x``."""
        row = self._table[np.searchsorted(self._cs, c, side="left")]
        own = row[:, 1] + c * row[:, 2]
        return self.capacity - base - np.maximum(row[:, 0], own)

    def fits(self, c: np.ndarray, base: np.ndarray) -> np.ndarray:
        """Whether each candidate alone keeps every peak up to its completion within capacity."""
        return self.room(c, base) >= 0
