"""``table:PATH``: interpolation in a measured profile, the CSV the GPU backend writes
(:data:`PROFILE_COLUMNS`)."""

from __future__ import annotations

import csv
import math
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from llmsched_gym.core.latency.base import LatencyModel, register_latency

PROFILE_COLUMNS = ("prefill_tokens", "prefill_ctx_tokens", "n_prefill", "n_decode", "decode_ctx_tokens", "time_s")
"""The profile CSV header the GPU backend writes: the ``batch_time`` inputs, then seconds."""

ProfileRow = tuple[int, int, int, int, int, float]


class Curve:
    """Piecewise-linear ``y(x)`` through sorted points, linear extrapolation past both ends.

    Segment ``k`` is anchored at point ``k`` (the last point extends the last slope), so the
    value at a measured ``x`` is exactly the measured ``y``. ``at`` and ``at_array`` perform
    the same operations, so they agree bit for bit.
    """

    def __init__(self, points: Mapping[float, list[float]]) -> None:
        self.xs = sorted(points)
        self.ys = [math.fsum(points[x]) / len(points[x]) for x in self.xs]
        self.slopes = [(y1 - y0) / (x1 - x0) for (x0, x1), (y0, y1) in zip(pairwise(self.xs), pairwise(self.ys), strict=True)]
        self.slopes.append(self.slopes[-1] if self.slopes else 0.0)
        self._xs_a, self._ys_a, self._slopes_a = (np.array(v, dtype=np.float64) for v in (self.xs, self.ys, self.slopes))

    def at(self, x: float) -> float:
        k = bisect_right(self.xs, x) - 1
        if k < 0:
            k = 0
        return self.ys[k] + self.slopes[k] * (x - self.xs[k])

    def at_array(self, x: np.ndarray) -> np.ndarray:
        k = np.maximum(np.searchsorted(self._xs_a, x, side="right") - 1, 0)
        return self._ys_a[k] + self._slopes_a[k] * (x - self._xs_a[k])


class TableLatency(LatencyModel):
    """Interpolation in a measured profile (the rows the GPU backend times).

    * **Prefill** rows (``n_decode == 0``, ``prefill_tokens > 0``) give a curve of time vs
      ``prefill_tokens``: duplicates averaged, piecewise-linear between points, linear
      extrapolation past the ends. Context, ``n_prefill`` and cached prefix are not inputs.
    * **Decode** rows (``prefill_tokens == 0``, ``n_decode > 0``) give a grid keyed by
      ``(n_decode, ctx_per_seq = decode_ctx_tokens / n_decode)``. Each measured ``n_decode``
      is a grid line with its own curve over ``ctx_per_seq``; a query interpolates on the two
      nearest lines and then linearly between them in ``n_decode``. On a complete grid this is
      bilinear interpolation; on scattered points each line uses the points it has. Past the
      edges both steps extrapolate linearly; the result is clamped at >= 0.
    * A **mixed** batch costs ``t_decode + t_prefill - t_base``, ``t_base`` being the smallest
      measured time in the table (the fixed cost both parts include), and at least the larger
      part.

    Rows of other shapes (measured mixed batches) are kept for :meth:`to_csv` but unused. At
    a measured point the prediction equals the (averaged) measurement exactly.
    """

    def __init__(self, rows: Sequence[ProfileRow], source: str = "<rows>") -> None:
        self.rows = list(rows)
        self.name = f"table:{source}"
        prefill: dict[float, list[float]] = {}
        decode: dict[int, dict[float, list[float]]] = {}
        for p, _pc, _np, nd, dc, t in self.rows:
            if nd == 0 and p > 0:
                prefill.setdefault(float(p), []).append(t)
            elif p == 0 and nd > 0:
                decode.setdefault(nd, {}).setdefault(dc / nd, []).append(t)
        if not prefill or not decode:
            raise ValueError(
                f"latency: profile {source} needs prefill-only rows (n_decode=0) and decode-only rows "
                f"(prefill_tokens=0); it has {sum(map(len, prefill.values()))} and "
                f"{sum(len(v) for line in decode.values() for v in line.values())}"
            )
        self.t_base = min(r[5] for r in self.rows)
        self._prefill = Curve(prefill)
        self._n_lines = [float(n) for n in sorted(decode)]
        self._lines = [Curve(decode[n]) for n in sorted(decode)]

    @classmethod
    def from_rows(cls, rows: Iterable[Sequence[float] | Mapping[str, float]], source: str = "<rows>") -> TableLatency:
        """Build from rows: 6-sequences in :data:`PROFILE_COLUMNS` order, or mappings with those keys."""
        parsed = []
        for i, row in enumerate(rows):
            if isinstance(row, Mapping):
                missing = [c for c in PROFILE_COLUMNS if c not in row]
                if missing:
                    raise ValueError(f"{source}: row {i}: missing column {missing[0]!r}")
                row = [row[c] for c in PROFILE_COLUMNS]
            parsed.append(_parse_row(list(row), f"{source}: row {i}"))
        return cls(parsed, source)

    @classmethod
    def from_csv(cls, path: str | Path) -> TableLatency:
        """Read a profile CSV with header :data:`PROFILE_COLUMNS` (extra columns are ignored)."""
        import io

        from llmsched_gym.config import read_text_bounded

        path = Path(path)
        # a regular file of bounded size (a device such as /dev/zero is never read)
        with io.StringIO(read_text_bounded(path, "latency", 256 * 2**20), newline="") as f:
            reader = csv.reader(f)
            header = [h.strip() for h in next(reader, [])]
            missing = [c for c in PROFILE_COLUMNS if c not in header]
            if missing:
                raise ValueError(f"{path}:1: missing column {missing[0]!r}; header must be {','.join(PROFILE_COLUMNS)}")
            idx = [header.index(c) for c in PROFILE_COLUMNS]
            rows = []
            for line_no, fields in enumerate(reader, start=2):
                if not fields:
                    continue
                if len(fields) != len(header):
                    raise ValueError(f"{path}:{line_no}: expected {len(header)} fields, got {len(fields)}")
                rows.append(_parse_row([fields[i] for i in idx], f"{path}:{line_no}"))
        return cls(rows, str(path))

    def to_csv(self, path: str | Path) -> None:
        """Write the rows back in the profile format (floats written with full precision)."""
        with Path(path).open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(PROFILE_COLUMNS)
            for *ints, t in self.rows:
                writer.writerow([*ints, repr(t)])

    def _line_weights(self, n_decode: int) -> tuple[int, int, float]:
        """The grid line to anchor on, the other line, and the weight of the other."""
        ns = self._n_lines
        k = bisect_right(ns, n_decode) - 1
        if k < 0:
            k = 0
        if len(ns) == 1:
            return k, k, 0.0
        o = k + 1 if k + 1 < len(ns) else k - 1
        return k, o, (n_decode - ns[k]) / (ns[o] - ns[k])

    def _decode(self, n_decode: int, decode_ctx_tokens: int) -> float:
        k, o, w = self._line_weights(n_decode)
        c = decode_ctx_tokens / n_decode
        ta = self._lines[k].at(c)
        t = ta + (self._lines[o].at(c) - ta) * w
        return t if t > 0.0 else 0.0

    def batch_time(
        self, prefill_tokens: int, prefill_ctx_tokens: int, n_prefill: int, n_decode: int, decode_ctx_tokens: int
    ) -> float:
        if prefill_tokens <= 0:
            return self._decode(n_decode, decode_ctx_tokens) if n_decode > 0 else 0.0
        t_pre = self._prefill.at(prefill_tokens)
        if t_pre < 0.0:
            t_pre = 0.0
        if n_decode <= 0:
            return t_pre
        t_dec = self._decode(n_decode, decode_ctx_tokens)
        t = t_dec + t_pre - self.t_base
        floor = t_dec if t_dec > t_pre else t_pre
        return t if t > floor else floor

    def decode_times(self, n_decode: int, decode_ctx_tokens: np.ndarray) -> np.ndarray:
        ctx = np.asarray(decode_ctx_tokens, dtype=np.float64)
        if n_decode <= 0:
            return np.zeros(len(ctx))
        k, o, w = self._line_weights(n_decode)
        c = ctx / n_decode
        ta = self._lines[k].at_array(c)
        t = ta + (self._lines[o].at_array(c) - ta) * w
        return np.where(t > 0.0, t, 0.0)


def _parse_row(fields: list[Any], where: str) -> ProfileRow:
    """Validate one profile row; errors name ``where`` (file:line or row) and the column."""
    if len(fields) != len(PROFILE_COLUMNS):
        raise ValueError(f"{where}: expected {len(PROFILE_COLUMNS)} fields, got {len(fields)}")
    ints = []
    for col, v in zip(PROFILE_COLUMNS[:5], fields[:5], strict=True):
        try:
            x = float(v)
        except (TypeError, ValueError):
            x = math.nan
        if not (math.isfinite(x) and x >= 0 and x == int(x)):
            raise ValueError(f"{where}: column {col!r}: expected a non-negative integer, got {v!r}")
        ints.append(int(x))
    try:
        t = float(fields[5])
    except (TypeError, ValueError):
        t = math.nan
    if not (math.isfinite(t) and t >= 0):
        raise ValueError(f"{where}: column 'time_s': expected a non-negative number of seconds, got {fields[5]!r}")
    p, pc, n_pre, nd, dc = ints
    if p == 0 and nd == 0:
        raise ValueError(f"{where}: column 'n_decode': an empty batch (prefill_tokens=0 and n_decode=0)")
    return p, pc, n_pre, nd, dc, t



def _table_dict(args: dict[str, Any]) -> TableLatency | None:
    return TableLatency.from_csv(args["path"]) if set(args) == {"path"} else None


register_latency("table", lambda rest: TableLatency.from_csv(rest) if rest else None, "",
                 listing={"table:PATH": "interpolate a measured profile CSV (" + ",".join(PROFILE_COLUMNS) + ")"},
                 from_dict=_table_dict)
