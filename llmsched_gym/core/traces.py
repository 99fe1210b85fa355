"""Trace loaders (Azure 2023, VTC arena, generic CSV/JSONL, ShareGPT) returning a ``Workload``.

Loaders are strict: a malformed row raises :class:`TraceError` with a one-line message naming the
file, the line and the field, e.g. ``trace.csv:17: output_tokens: expected an integer >= 1, got
'x'``; no row is ever dropped silently. A token count of 0 is an error too unless
``on_zero="clip"``, which sets it to 1 and counts it in ``workload.meta["clipped_zero"]``.
Blank lines are skipped. Arrival times are relative to the earliest row; rows out of time order
are sorted (stably) and ``meta["resorted"]`` is set, because a ``Workload`` is arrival-sorted.

Files are UTF-8 (a leading byte-order mark is accepted; an undecodable byte is an error naming the
line). Bounds, each an error naming file, line and field: token counts at most ``MAX_TOKENS``
(2**31 - 1), arrival times at most ``MAX_ARRIVAL_S`` (1e9 s, about 31 years; for timestamps,
after the earliest row), so that the simulation clock keeps sub-microsecond resolution, and ids
that fit in 64 bits.
A column (or JSON key) given twice is an error. Client ids and prefix groups are labels: they
are numbered densely (0, 1, ... in order of first appearance for prefix groups, in increasing order
for clients, the original client ids kept in ``meta["client_ids"]``), so memory depends on how
many distinct ids a trace has, not on their values.

Formats (``FORMATS``):

* ``azure``: ``TIMESTAMP,ContextTokens,GeneratedTokens`` (Splitwise / Azure LLM inference trace
  2023; timestamps such as ``2023-11-16 18:15:46.6805900``).
* ``vtc``: ``arrival_s,client,prompt_tokens,output_tokens`` (Sheng et al. 2024's arena trace; sets
  ``client``).
* ``csv`` / ``jsonl``: ``arrival_s, prompt_tokens, output_tokens`` and optionally ``client``,
  ``prefix_group`` and ``prefix_tokens`` (CSV columns in any order, or one JSON object per line).
  Rows with the same ``prefix_group`` label share a prefix segment (ids numbered from
  ``first_segment_id`` in order of first appearance) of ``prefix_tokens`` tokens, or, when that is
  absent or empty, of the group's shortest prompt. An empty group means no shared prefix.
* ``mooncake``: the Mooncake traces (Qin et al., FAST 2025): one JSON object a line with
  ``timestamp`` (ms), ``input_length``, ``output_length`` and ``hash_ids``, the prompt's
  512-token blocks (equal ids = equal prefix blocks); the blocks become prefix segments (see
  :func:`load_mooncake`).
* ``sharegpt``: a JSON list of ``{"conversations": [{"from": ..., "value": ...}, ...]}``; lengths
  only (see :func:`load_sharegpt`).

Traces are data the repository does not ship: :func:`llmsched_gym.data.resolve_data` locates them
(``llmsched data download`` fetches them) and :func:`synthetic_azure_conv` /
:func:`synthetic_vtc_arena` stand in for the two known traces when they are absent.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from llmsched_gym.core.request import MAX_ARRIVAL_S, MAX_TOKENS, Segments, Workload
from llmsched_gym.core.workload.arrivals import gamma, poisson
from llmsched_gym.core.workload.lengths import lognormal

FORMATS = ("azure", "vtc", "csv", "jsonl", "sharegpt", "mooncake")
DEFAULT_FILES = {"azure": "AzureLLMInferenceTrace_conv.csv", "vtc": "vtc_arena_real_trace.csv",
                 "mooncake": "mooncake_conversation_trace.jsonl"}
MOONCAKE_BLOCK = 512
"""Tokens per ``hash_ids`` entry of the Mooncake traces (the last block of a prompt may be partial)."""
AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
VTC_HEADER = ("arrival_s", "client", "prompt_tokens", "output_tokens")
GENERIC_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens", "client", "prefix_group", "prefix_tokens")
MAX_TRACE_BYTES = 4 * 2**30
"""Largest trace file read (4 GiB; the Azure conversation trace is 1 MB, a week of it about 1 GB)."""
# MAX_TOKENS: largest token count a trace may give; MAX_ARRIVAL_S: latest arrival, in seconds after
# its earliest row (the bounds of every workload, llmsched_gym.core.request)


class TraceError(ValueError):
    """A trace row is malformed; the message is ``file:line: field: what was expected, got what``."""


# ---------------------------------------------------------------------------------------------
# column parsing: fast path over whole columns, exact row-by-row message on failure


class _Table:
    """String columns of one file plus the line number of each row, for error messages."""

    def __init__(self, src: str, lines: Sequence[int | str], columns: dict[str, Sequence[str]]) -> None:
        self.src, self.lines, self.columns = src, lines, columns
        self.clipped: dict[str, int] = {}

    def fail(self, row: int, field: str, want: str, raw: object) -> TraceError:
        return TraceError(f"{self.src}:{self.lines[row]}: {field}: expected {want}, got {raw!r}")

    def ints(self, field: str, *, lo: int = 1, hi: int | None = MAX_TOKENS, on_zero: str = "error") -> np.ndarray:
        col = self.columns[field]
        want = f"an integer >= {lo}"
        too_big = f"an integer <= {hi}" if hi is not None else "an integer that fits in 64 bits"
        try:
            a = np.array([int(v) for v in col], dtype=np.int64)
        except (ValueError, TypeError, OverflowError):
            for i, v in enumerate(col):
                try:
                    int(v)
                except (ValueError, TypeError):
                    raise self.fail(i, field, want, v) from None
                if not -(2**63) <= int(v) < 2**63:
                    raise self.fail(i, field, too_big, v) from None
            raise
        big = np.flatnonzero(a > hi) if hi is not None else ()
        if len(big):
            raise self.fail(int(big[0]), field, too_big, col[big[0]])
        if len(a) and a.min() < lo:
            zero = a == 0
            if on_zero == "clip" and lo == 1 and zero.any():
                self.clipped[field] = int(zero.sum())
                a[zero] = 1
            bad = np.flatnonzero(a < lo)
            if len(bad):
                raise self.fail(int(bad[0]), field, want, col[bad[0]])
        return a

    def labels(self, field: str) -> tuple[np.ndarray, np.ndarray]:
        """Integer ids (>= 0) numbered densely in increasing order: ``(dense ids, original ids)``."""
        ids = self.ints(field, lo=0, hi=None)
        original, dense = np.unique(ids, return_inverse=True)
        return dense.astype(np.int64), original

    def floats(self, field: str) -> np.ndarray:
        col = self.columns[field]
        want = "a finite number >= 0"
        try:
            a = np.array([float(v) for v in col], dtype=np.float64)
        except (ValueError, TypeError):
            for i, v in enumerate(col):
                try:
                    float(v)
                except (ValueError, TypeError):
                    raise self.fail(i, field, want, v) from None
            raise
        bad = np.flatnonzero(~np.isfinite(a) | (a < 0))
        if len(bad):
            raise self.fail(int(bad[0]), field, want, col[bad[0]])
        late = np.flatnonzero(a > MAX_ARRIVAL_S)
        if len(late):
            raise self.fail(int(late[0]), field, f"a number <= {MAX_ARRIVAL_S:g} (seconds)", col[late[0]])
        return a

    def timestamps(self, field: str) -> np.ndarray:
        """Seconds since the earliest row of ISO 8601 timestamps, the one format read:
        ``YYYY-MM-DD HH:MM[:SS[.fraction]]`` (``T`` may replace the space; up to 9 fractional
        digits, as in ``2023-11-16 18:15:46.6805900``), optionally followed by a time-zone offset
        (``Z``, ``+HH:MM``, ``+HHMM``), which is converted to UTC. Either every row has an offset or
        none has (a file mixing them is an error: its clock would be ambiguous). Parsed by NumPy at
        nanosecond resolution (``datetime.strptime`` rejects 7 digits), without warnings."""
        import re

        col = self.columns[field]
        want = "a timestamp like '2023-11-16 18:15:46.6805900' (an optional offset: Z, +02:00)"
        rx = re.compile(r"\s*(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?)\s*(Z|[+-]\d{2}:?\d{2})?\s*")
        naive, offset_s = [], np.zeros(len(col), dtype=np.int64)
        with_zone = None
        for i, v in enumerate(col):
            m = rx.fullmatch(v)
            if m is None:
                raise self.fail(i, field, want, v)
            naive.append(m.group(1))
            zone = m.group(2)
            if with_zone is None:
                with_zone = zone is not None
            elif with_zone != (zone is not None):
                raise self.fail(i, field, "the same form as the first row (every row with a time-zone offset, or "
                                "none)", v)
            if zone and zone != "Z":
                hh, mm = int(zone[1:3]), int(zone[-2:])
                if hh > 23 or mm > 59:
                    raise self.fail(i, field, want, v)
                offset_s[i] = (1 if zone[0] == "+" else -1) * (hh * 3600 + mm * 60)
        try:
            a = np.array(naive, dtype="datetime64[ns]")
        except ValueError:
            for i, v in enumerate(naive):
                try:
                    np.datetime64(v, "ns")
                except ValueError:
                    raise self.fail(i, field, want, col[i]) from None
            raise
        col = naive
        bad = np.flatnonzero(np.isnat(a))
        if len(bad):
            raise self.fail(int(bad[0]), field, want, col[bad[0]])
        # nanoseconds in int64 end in 2262 and NumPy wraps silently: compare with a coarse parse
        wrapped = np.flatnonzero(a.astype("datetime64[s]") != np.array(col, dtype="datetime64[s]"))
        if len(wrapped):
            raise self.fail(int(wrapped[0]), field, "a timestamp between the years 1678 and 2261",
                            col[wrapped[0]])
        if offset_s.any():
            a = a - offset_s.astype("timedelta64[s]").astype("timedelta64[ns]")  # local time - offset = UTC
        rel = (a - a.min()).astype(np.int64) / 1e9
        late = np.flatnonzero(rel > MAX_ARRIVAL_S)
        if len(late):
            raise self.fail(int(late[0]), field, f"a time at most {MAX_ARRIVAL_S:g} s after the earliest row",
                            col[late[0]])
        return rel


def _read_text(path: Path) -> str:
    """The file as text: UTF-8, a leading byte-order mark dropped; an undecodable byte is a
    :class:`TraceError` naming the line."""
    import stat

    st = path.stat()
    if not stat.S_ISREG(st.st_mode):
        raise TraceError(f"{path.name}: file: not a regular file (a device or pipe is never read)")
    if st.st_size > MAX_TRACE_BYTES:
        raise TraceError(f"{path.name}: file: {st.st_size:,} bytes, more than the {MAX_TRACE_BYTES:,} a trace may have")
    with path.open("rb") as f:
        data = f.read(MAX_TRACE_BYTES + 1)
    if len(data) > MAX_TRACE_BYTES:
        raise TraceError(f"{path.name}: file: more than the {MAX_TRACE_BYTES:,} bytes a trace may have")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise TraceError(f"{path.name}:{line}: file: expected UTF-8 text, got byte 0x{data[e.start]:02x}") from None


def _read_csv(path: Path, expected: Sequence[str] | None = None) -> tuple[list[str], _Table]:
    """Header and string columns of a CSV file; every row must have the header's width."""
    src = path.name
    reader = csv.reader(io.StringIO(_read_text(path), newline=""))
    try:
        header = next(reader, None)
    except csv.Error as e:
        raise TraceError(f"{src}:1: header: not valid CSV ({e})") from None
    if header is None:
        raise TraceError(f"{src}:1: header: expected {','.join(expected or GENERIC_COLUMNS[:3])}, got an empty file")
    header = [h.strip() for h in header]
    twice = next((h for i, h in enumerate(header) if h in header[:i]), None)
    if twice is not None:
        raise TraceError(f"{src}:1: header: column {twice!r} appears twice")
    if expected is not None and tuple(header) != tuple(expected):
        raise TraceError(f"{src}:1: header: expected {','.join(expected)}, got {','.join(header)!r}")
    rows, lines = [], []
    try:
        for row in reader:
            if row:
                rows.append(row)
                lines.append(reader.line_num)
    except csv.Error as e:  # a field over the csv module's limit (128 kB), a NUL byte
        raise TraceError(f"{src}:{reader.line_num + 1}: row: not valid CSV ({e})") from None
    width = len(header)
    for i, row in enumerate(rows):
        if len(row) != width:
            raise TraceError(f"{src}:{lines[i]}: row: expected {width} fields ({','.join(header)}), got {len(row)}")
    if not rows:
        raise TraceError(f"{src}:2: row: expected at least one data row, got none")
    columns: dict[str, Sequence[str]] = dict(zip(header, zip(*rows, strict=True), strict=True))
    return header, _Table(src, lines, columns)


def _finish(table: _Table, arrival_s: np.ndarray, fmt: str, path: Path, **fields) -> Workload:
    meta: dict[str, object] = {"format": fmt, "source": str(path), "clipped_zero": table.clipped}
    if np.any(np.diff(arrival_s) < 0):
        order = np.argsort(arrival_s, kind="stable")
        arrival_s = arrival_s[order]
        fields = {k: [v[i] for i in order] if isinstance(v, list) else v[order] for k, v in fields.items()}
        meta["resorted"] = True
    return Workload(arrival_s, meta=meta, **fields)


# ---------------------------------------------------------------------------------------------
# loaders


def load_azure(path: str | os.PathLike, *, on_zero: str = "error") -> Workload:
    """Azure LLM inference trace 2023 (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    Timestamps carry 7 fractional digits, which ``datetime.strptime("%f")`` rejects; they are
    parsed field by field. ``arrival_s`` is relative to the first (earliest) row.
    """
    path = Path(path)
    _, t = _read_csv(path, AZURE_HEADER)
    return _finish(t, t.timestamps("TIMESTAMP"), "azure", path,
                   prompt_tokens=t.ints("ContextTokens", on_zero=on_zero),
                   output_tokens=t.ints("GeneratedTokens", on_zero=on_zero))


def load_vtc(path: str | os.PathLike, *, on_zero: str = "error") -> Workload:
    """Sheng et al. 2024's arena trace (``arrival_s,client,prompt_tokens,output_tokens``; 27 clients)."""
    path = Path(path)
    _, t = _read_csv(path, VTC_HEADER)
    client, ids = t.labels("client")
    wl = _finish(t, t.floats("arrival_s"), "vtc", path, client=client,
                 prompt_tokens=t.ints("prompt_tokens", on_zero=on_zero),
                 output_tokens=t.ints("output_tokens", on_zero=on_zero))
    wl.meta["client_ids"] = ids.tolist()
    return wl


def _generic(t: _Table, fmt: str, path: Path, on_zero: str, first_segment_id: int) -> Workload:
    for name in GENERIC_COLUMNS[:3]:
        if name not in t.columns:
            raise TraceError(f"{t.src}:1: {name}: required column is missing")
    n = len(t.lines)
    prompt = t.ints("prompt_tokens", on_zero=on_zero)
    fields: dict = {"prompt_tokens": prompt, "output_tokens": t.ints("output_tokens", on_zero=on_zero)}
    client_ids = None
    if "client" in t.columns:
        t.columns["client"] = [v if v != "" else "0" for v in t.columns["client"]]
        fields["client"], client_ids = t.labels("client")
    if "prefix_tokens" in t.columns and "prefix_group" not in t.columns:
        raise TraceError(f"{t.src}:1: prefix_tokens: needs a prefix_group column")
    if "prefix_group" in t.columns:
        groups = t.columns["prefix_group"]
        explicit = t.columns.get("prefix_tokens", [""] * n)
        ids: dict[str, int] = {}
        shortest: dict[str, int] = {}
        for g, p in zip(groups, prompt.tolist(), strict=True):
            if g != "":
                ids.setdefault(g, first_segment_id + len(ids))
                shortest[g] = min(shortest.get(g, p), p)
        prefix: list[Segments | None] = []
        for i, (g, k) in enumerate(zip(groups, explicit, strict=True)):
            if g == "":
                prefix.append(None)
                continue
            if k == "":
                size = shortest[g]
            else:
                try:
                    size = int(k)
                except ValueError:
                    raise t.fail(i, "prefix_tokens", "an integer >= 0", k) from None
                if not 0 <= size <= prompt[i]:
                    raise t.fail(i, "prefix_tokens", f"an integer in 0..prompt_tokens ({prompt[i]})", k)
            prefix.append(((ids[g], size),) if size else None)
        fields["prefix"] = prefix
    wl = _finish(t, t.floats("arrival_s"), fmt, path, **fields)
    if client_ids is not None:
        wl.meta["client_ids"] = client_ids.tolist()
    return wl


def load_csv(path: str | os.PathLike, *, on_zero: str = "error", first_segment_id: int = 0) -> Workload:
    """Generic CSV with a header naming some of ``GENERIC_COLUMNS`` (see the module docstring)."""
    path = Path(path)
    header, t = _read_csv(path)
    unknown = [h for h in header if h not in GENERIC_COLUMNS]
    if unknown:
        raise TraceError(f"{path.name}:1: header: unknown column {unknown[0]!r} (allowed: {', '.join(GENERIC_COLUMNS)})")
    return _generic(t, "csv", path, on_zero, first_segment_id)


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """``json.loads`` hook: a key given twice is an error (the JSON default keeps the last)."""
    out: dict[str, object] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _json_rows(path: Path, required: Sequence[str]) -> Iterator[tuple[int, dict]]:
    """The JSON objects of a JSON Lines file with their line numbers (blank lines skipped), each
    checked to be an object without duplicate keys that has every ``required`` key."""
    src = path.name
    for lineno, text in enumerate(_read_text(path).split("\n"), start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as e:
            raise TraceError(f"{src}:{lineno}: row: expected a JSON object, got invalid JSON ({e.msg})") from None
        except RecursionError:
            raise TraceError(f"{src}:{lineno}: row: JSON nested too deeply") from None
        except _DuplicateKey as e:
            raise TraceError(f"{src}:{lineno}: {e.args[0]}: key appears twice") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{src}:{lineno}: row: expected a JSON object, got {text.strip()[:40]!r}")
        for key in required:
            if key not in obj:
                raise TraceError(f"{src}:{lineno}: {key}: required key is missing")
        yield lineno, obj


def load_jsonl(path: str | os.PathLike, *, on_zero: str = "error", first_segment_id: int = 0) -> Workload:
    """Generic JSON Lines: one object per line with the keys of :func:`load_csv`'s columns."""
    path = Path(path)
    src = path.name
    lines: list[int] = []
    columns: dict[str, list[str]] = {name: [] for name in GENERIC_COLUMNS}
    for lineno, obj in _json_rows(path, ()):
        for key in obj:
            if key not in columns:
                raise TraceError(f"{src}:{lineno}: {key}: unknown key (allowed: {', '.join(GENERIC_COLUMNS)})")
        for key in GENERIC_COLUMNS[:3]:
            if key not in obj:
                raise TraceError(f"{src}:{lineno}: {key}: required key is missing")
        lines.append(lineno)
        for key, col in columns.items():
            v = obj.get(key, "")
            col.append(v if isinstance(v, str) else json.dumps(v))
    if not lines:
        raise TraceError(f"{src}:1: row: expected at least one JSON object, got none")
    used: dict[str, Sequence[str]] = {k: v for k, v in columns.items() if k in GENERIC_COLUMNS[:3] or any(x != "" for x in v)}
    return _generic(_Table(src, lines, used), "jsonl", path, on_zero, first_segment_id)


def load_mooncake(path: str | os.PathLike, *, on_zero: str = "error") -> Workload:
    """A Mooncake trace (Qin et al., "Mooncake: Trading More Storage for Less Computation", FAST
    2025; github.com/kvcache-ai/Mooncake, ``FAST25-release/traces``).

    Block ``j`` of ``hash_ids`` covers prompt tokens ``[512 j, 512 (j + 1))`` (the last one what is
    left of ``input_length``) and becomes the prefix segment ``(hash_id, tokens)``: two requests
    share their first ``k`` blocks exactly when their first ``k`` ids agree, which is what the
    trace's ids mean, so the replicas' prefix caches reuse exactly the blocks the trace repeats.
    A row whose ``hash_ids`` do not cover ``input_length`` in 512-token blocks is an error.
    """
    path = Path(path)
    src = path.name
    keys = ("timestamp", "input_length", "output_length", "hash_ids")
    lines: list[int] = []
    cols: dict[str, list[str]] = {k: [] for k in keys[:3]}
    prefix: list[Segments | None] = []
    for lineno, obj in _json_rows(path, keys):
        lines.append(lineno)
        for key in keys[:3]:
            v = obj[key]
            cols[key].append(v if isinstance(v, str) else json.dumps(v))
        ids = obj["hash_ids"]
        length = obj["input_length"]
        if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
            raise TraceError(f"{src}:{lineno}: hash_ids: expected a list of integers, got {json.dumps(ids)[:40]}")
        if isinstance(length, int) and length > 0 and len(ids) != -(-length // MOONCAKE_BLOCK):
            raise TraceError(f"{src}:{lineno}: hash_ids: expected {-(-length // MOONCAKE_BLOCK)} blocks of "
                             f"{MOONCAKE_BLOCK} tokens for input_length {length}, got {len(ids)}")
        prefix.append(tuple((h, min(MOONCAKE_BLOCK, length - MOONCAKE_BLOCK * j)) for j, h in enumerate(ids)) or None)
    if not lines:
        raise TraceError(f"{src}:1: row: expected at least one JSON object, got none")
    t = _Table(src, lines, cols)
    arrival = t.floats("timestamp") / 1000.0
    arrival = arrival - arrival.min()
    return _finish(t, arrival, "mooncake", path, prompt_tokens=t.ints("input_length", on_zero=on_zero),
                   output_tokens=t.ints("output_length", on_zero=on_zero), prefix=prefix)


def load_sharegpt(path: str | os.PathLike, arrivals: Callable[[int], np.ndarray] | np.ndarray, *,
                  n: int | None = None, on_zero: str = "error") -> Workload:
    """ShareGPT JSON (lengths only): the first human turn is the prompt, the reply after it the
    output, in ``ceil(characters / 4)`` tokens (a rough English-text rule of thumb; no tokenizer).

    Conversations without a leading human turn followed by a reply are skipped and counted in
    ``meta["skipped"]``; a structurally malformed entry raises :class:`TraceError` naming its index.

    :param arrivals: sorted arrival times (at least as many as requests), or a function
        ``k -> k sorted times``, e.g. ``lambda k: workload.poisson(5.0, n=k, rng=0)``.
    :param n: use only the first ``n`` usable conversations.
    """
    path = Path(path)
    src = path.name
    try:
        data = json.loads(_read_text(path))
    except json.JSONDecodeError as e:
        raise TraceError(f"{src}:{e.lineno}: file: expected JSON, got invalid JSON ({e.msg})") from None
    except RecursionError:
        raise TraceError(f"{src}:1: file: JSON nested too deeply") from None
    if not isinstance(data, list):
        raise TraceError(f"{src}:1: file: expected a JSON list of conversations, got {type(data).__name__}")
    prompts, outputs, entries, skipped = [], [], [], 0
    for i, entry in enumerate(data):
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list) or not all(
                isinstance(x, dict) and isinstance(x.get("from"), str) and isinstance(x.get("value"), str)
                for x in turns):
            raise TraceError(f"{src}:entry {i}: conversations: expected a list of {{from, value}} strings")
        if len(turns) < 2 or turns[0]["from"] not in ("human", "user") or turns[1]["from"] in ("human", "user"):
            skipped += 1
            continue
        prompts.append(str(math.ceil(len(turns[0]["value"]) / 4)))
        outputs.append(str(math.ceil(len(turns[1]["value"]) / 4)))
        entries.append(i)
        if n is not None and len(entries) == n:
            break
    if not entries:
        raise TraceError(f"{src}:entry 0: conversations: expected at least one human turn with a reply, got none")
    t = _Table(src, [f"entry {i}" for i in entries], {"prompt_tokens": prompts, "output_tokens": outputs})
    arr = np.asarray(arrivals(len(entries)) if callable(arrivals) else arrivals, dtype=np.float64)
    if len(arr) < len(entries):
        raise TraceError(f"{src}: arrivals: expected at least {len(entries)} times, got {len(arr)}")
    wl = _finish(t, arr[: len(entries)], "sharegpt", path, prompt_tokens=t.ints("prompt_tokens", on_zero=on_zero),
                 output_tokens=t.ints("output_tokens", on_zero=on_zero))
    wl.meta["skipped"] = skipped
    return wl


def load_trace(fmt: str, path: str | os.PathLike, *, on_zero: str = "error") -> Workload:
    """Dispatch on ``fmt`` in ``azure``, ``vtc``, ``csv``, ``jsonl`` (ShareGPT needs arrivals:
    call :func:`load_sharegpt`)."""
    loaders = {"azure": load_azure, "vtc": load_vtc, "csv": load_csv, "jsonl": load_jsonl, "mooncake": load_mooncake}
    if fmt not in loaders:
        raise TraceError(f"format: unknown value {fmt!r} (allowed: {', '.join(loaders)})")
    if on_zero not in ("error", "clip"):
        raise TraceError(f"on_zero: unknown value {on_zero!r} (allowed: error, clip)")
    # env resets rebuild the workload every episode: parse a file once (keyed by its stat) and
    # hand out copies, so callers may still modify what they get
    try:
        st = os.stat(path)
    except OSError:
        return loaders[fmt](path, on_zero=on_zero)
    key = (fmt, os.path.realpath(path), st.st_mtime_ns, st.st_size, on_zero)
    if key not in _PARSED:
        if len(_PARSED) >= 8:
            _PARSED.pop(next(iter(_PARSED)))
        _PARSED[key] = loaders[fmt](path, on_zero=on_zero)
    return _copy_parsed(_PARSED[key])


_PARSED: dict[tuple, Workload] = {}


def _copy_parsed(wl: Workload) -> Workload:
    """A deep copy of a parsed trace that shares its prefix segments: the loaders build them as
    tuples of ``(id, tokens)`` pairs, immutable, so the copy gets a new list of the same tuples
    instead of a walk through every pair (``copy.deepcopy`` spent 1.6 s of each routing-env reset on
    the Mooncake trace's 300,000 blocks)."""
    memo: dict[int, object] = {}
    if wl.prefix is not None:
        memo[id(wl.prefix)] = list(wl.prefix)
    return copy.deepcopy(wl, memo)


def read_column(path: str | os.PathLike, column: str) -> np.ndarray:
    """One integer column of a CSV file (e.g. ``ContextTokens`` of the Azure trace) as an array,
    for :func:`~llmsched_gym.core.workload.lengths.empirical`. ``path`` is resolved with
    :func:`llmsched_gym.data.resolve_data` (a path, or a known trace's name)."""
    from llmsched_gym import data

    found = data.resolve_data(path)
    if found is None:
        raise TraceError(f"{path}: not found locally; `llmsched data download {path}` fetches it")
    header, t = _read_csv(found)
    if column not in header:
        raise TraceError(f"{found.name}:1: {column}: no such column (have: {', '.join(header)})")
    return t.ints(column, lo=0)


# ---------------------------------------------------------------------------------------------
# statistics and the synthetic stand-in


def trace_stats(workload: Workload) -> dict:
    """Trace statistics: ``n``, ``duration_s``, ``rate`` (requests
    per second over the arrival span), ``input`` and ``output`` (``mean``, ``p50``, ``p90``,
    ``p99``, ``max`` in tokens) and ``interarrival_cv``."""
    t = workload.arrival_s
    span = float(t[-1] - t[0]) if len(t) > 1 else 0.0
    gaps = np.diff(t)

    def summary(a: np.ndarray) -> dict:
        p50, p90, p99 = np.percentile(a, [50, 90, 99])
        return {"mean": float(a.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99),
                "max": int(a.max())}

    return {
        "n": len(t),
        "duration_s": span,
        "rate": len(t) / span if span > 0 else math.inf,
        "input": summary(workload.prompt_tokens),
        "output": summary(workload.output_tokens),
        "interarrival_cv": float(gaps.std() / gaps.mean()) if len(gaps) and gaps.mean() > 0 else math.nan,
    }


# Quantiles of the Azure conv trace (aggregates measured on the public CSV), at these levels;
# sampling the piecewise-linear quantile function reproduces mean, p50, p90, p99 and max.
_AZURE_CONV_Q = (0, .01, .05, .1, .2, .3, .4, .5, .6, .7, .8, .9, .95, .98, .99, .995, .999, 1)
_AZURE_CONV_INPUT = (2, 29, 181, 207, 387, 403, 703, 1020, 1071, 1130, 1315, 2735, 4083, 4098, 4142, 4831,
                     6212, 14050)
_AZURE_CONV_OUTPUT = (7, 16, 41, 54, 77, 91, 103, 129, 177, 384, 400, 424, 451, 540, 601, 644, 954, 1000)


def synthetic_azure_conv(seed: int, n: int = 19366) -> Workload:
    """A stand-in for the Azure 2023 conversation trace when the file is absent.

    Gamma inter-arrivals (shape 0.87, i.e. CV 1.07) at 5.53 requests/s; input and output lengths
    drawn independently (the trace's correlation is -0.11) from piecewise-linear quantile fits,
    which match the real trace's statistics (input mean 1155, p50 1020, p90 2735, p99 4142, max
    14050; output 211 / 129 / 424 / 601 / 1000) within sampling noise.
    """
    rng = np.random.default_rng(seed)
    arrival = gamma(5.53, 1.0 / math.sqrt(0.87), n=n, rng=rng)
    q = np.array(_AZURE_CONV_Q)
    prompt = np.rint(np.interp(rng.random(n), q, _AZURE_CONV_INPUT)).astype(np.int64)
    output = np.rint(np.interp(rng.random(n), q, _AZURE_CONV_OUTPUT)).astype(np.int64)
    return Workload(arrival, prompt, output, meta={"format": "azure", "source": "synthetic", "seed": seed})


def synthetic_vtc_arena(seed: int, n: int = 1500) -> Workload:
    """A stand-in for Sheng et al. 2024's arena trace when the file is absent: 27 clients with Zipf-like
    shares (1/rank), Poisson arrivals at 2.5/s (1,500 requests over about 600 s), lognormal lengths
    with the trace's means (prompt 136, output 256 tokens; medians 70 and 200 are our choice)."""
    rng = np.random.default_rng(seed)
    arrival = poisson(2.5, n=n, rng=rng)
    share = 1.0 / np.arange(1, 28)
    client = rng.choice(27, size=n, p=share / share.sum())
    prompt = lognormal(136, 70, n, rng, max_tokens=2048)
    output = lognormal(256, 200, n, rng, max_tokens=1024)
    return Workload(arrival, prompt, output, client=client, client_weight=np.ones(27),
                    meta={"format": "vtc", "source": "synthetic", "seed": seed})


def synthetic_mooncake_conv(seed: int, n: int = 12031) -> Workload:
    """A stand-in for the Mooncake conversation trace when the file is absent: two-turn sessions
    (:func:`llmsched_gym.core.sessions.prefix_groups`) at 3.4 requests/s behind one shared
    512-token system block, questions of 7,570 tokens and answers of 343 on average (Gamma, CV 1).
    It matches the trace's mean input (12,035 tokens), mean output (343) and share of repeated
    prompt blocks (37%) to within a few percent; the 30 s between turns is our choice (the trace
    does not say)."""
    from llmsched_gym.core.sessions import prefix_groups

    wl = prefix_groups(n, 3.4, groups=1, system_tokens=MOONCAKE_BLOCK, question_tokens=7570, output_tokens=343,
                       turns=2, think_s=30.0, rng=np.random.default_rng([seed, 0x300C]), length_cv=1.0)
    wl.meta = {"format": "mooncake", "source": "synthetic", "seed": seed}
    return wl


SYNTHETIC = {"azure": synthetic_azure_conv, "vtc": synthetic_vtc_arena, "mooncake": synthetic_mooncake_conv}
"""Fallbacks for the shipped traces' formats, used when the file is absent and no path was given."""
