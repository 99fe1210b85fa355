"""The iteration log: one row per engine iteration (:data:`LOG_COLUMNS`), kept in compact columnar
chunks. The engine writes it; :mod:`llmsched_gym.core.metrics` and the CLI read it."""

from __future__ import annotations

from itertools import repeat
from typing import Any

import numpy as np

LOG_COLUMNS = (
    "t_start", "duration", "n_prefill_tokens", "n_cached_prefix_tokens", "n_decode",
    "sum_context_tokens", "kv_used", "kv_capacity", "n_waiting", "n_running", "n_preempted",
)
"""Columns of the iteration log, one row per iteration."""

_STORED = {"t_start": np.float64, "duration": np.float64, "n_prefill_tokens": np.int64,
           "n_cached_prefix_tokens": np.int64, "n_decode": np.int32, "sum_context_tokens": np.int64,
           "kv_used": np.int64, "n_waiting": np.int32, "n_running": np.int32, "n_preempted": np.int32}
"""Stored dtypes: the counts that are at most the number of requests take 4 bytes; the constant
``kv_capacity`` is not stored at all."""


class IterationLog:
    """The iteration log, kept compact: columnar NumPy chunks of ``chunk`` rows (56 bytes a row).

    Chunks are small (4,096 rows: 32 KB a column, under glibc's 128 KB mmap threshold) so that an
    env resetting thousands of episodes reuses heap blocks; with 64k-row chunks glibc's dynamic
    mmap threshold let RSS creep up by about 15% over 1.5M env steps.

    A single iteration is added as a row (:meth:`add`, buffered as a tuple); a fast-forwarded
    decode run as one segment of equal-length arrays (:meth:`add_segment`). :meth:`columns`
    returns every column as one array (``int64`` / ``float64``), the log's public form.
    """

    def __init__(self, kv_capacity: int, chunk: int = 1 << 12) -> None:
        self.kv_capacity = kv_capacity
        self.chunk = chunk
        self.rows: list[tuple] = []  # pending single rows, in _STORED column order
        self._full: list[dict[str, np.ndarray]] = []
        self._cur = self._new_chunk()
        self._n = 0  # rows used in _cur

    def _new_chunk(self) -> dict[str, np.ndarray]:
        return {c: np.empty(self.chunk, dtype=t) for c, t in _STORED.items()}

    def __len__(self) -> int:
        return sum(len(p["t_start"]) for p in self._full) + self._n + len(self.rows)

    def add(self, row: tuple) -> None:
        """One iteration: the values of the stored columns, in order."""
        self.rows.append(row)
        if len(self.rows) >= 1024:
            self.flush()

    def add_rows(self, rows: list[tuple]) -> None:
        """Several iterations, each a row as in :meth:`add`."""
        self.rows.extend(rows)
        if len(self.rows) >= 1024:
            self.flush()

    def flush(self) -> None:
        """Move the buffered rows into the column chunks."""
        if self.rows:
            cols = list(zip(*self.rows, strict=True))
            self.rows = []
            self._write({c: np.asarray(v, dtype=_STORED[c]) for c, v in zip(_STORED, cols, strict=True)})

    def add_segment(self, cols: dict[str, np.ndarray | int]) -> None:
        """Several iterations at once: arrays of one length, or scalars repeated over it (in
        :data:`_STORED` order). Short segments join the row buffer (cheaper than array writes)."""
        k = next(len(v) for v in cols.values() if isinstance(v, np.ndarray))
        if k <= 64:
            self.rows.extend(zip(*(v.tolist() if isinstance(v, np.ndarray) else repeat(v, k)
                                   for v in cols.values()), strict=True))
            if len(self.rows) >= 1024:
                self.flush()
            return
        self.flush()
        self._write(cols)

    def _write(self, cols: dict[str, Any]) -> None:
        k = next(len(v) for v in cols.values() if isinstance(v, np.ndarray))
        done = 0
        while done < k:
            take = min(k - done, self.chunk - self._n)
            cur, i = self._cur, self._n
            for c, v in cols.items():
                cur[c][i:i + take] = v[done:done + take] if isinstance(v, np.ndarray) else v
            self._n += take
            done += take
            if self._n == self.chunk:
                self._full.append(self._cur)
                self._cur, self._n = self._new_chunk(), 0

    def columns(self) -> dict[str, np.ndarray]:
        """Every column as one array, in :data:`LOG_COLUMNS` order. The log then keeps these
        arrays as its storage; the chunks are freed column by column as they are merged, so the
        rows are never held twice."""
        self.flush()
        parts = [*self._full, {c: a[: self._n] for c, a in self._cur.items()}]
        self._full, self._cur, self._n = [], {}, 0
        merged = {}
        for c, t in _STORED.items():
            merged[c] = np.concatenate([p.pop(c) for p in parts]).astype(
                np.float64 if t is np.float64 else np.int64, copy=False)
        self._full, self._cur = [merged], self._new_chunk()
        n = len(merged["t_start"])
        return {c: merged[c] if c in merged else np.full(n, self.kv_capacity, dtype=np.int64) for c in LOG_COLUMNS}
