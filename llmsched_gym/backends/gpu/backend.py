"""Real-GPU timing for the simulator: online latency, log replay, and calibration.

* :class:`GPULatency` plugs the executor into the engine as a latency model (online mode): every
  iteration's batch really runs, so the run is nondeterministic and never fast-forwarded.
* :func:`replay` re-executes an engine iteration log (``llmsched run --log-iterations``) batch by
  batch and reports how far batch-time models are from the measured times, per iteration and
  end to end, with a noise band from measuring twice.
* :func:`calibrate` profiles prefill-only and decode-only grids into ``profile.csv`` (the table
  model's input), fits an affine model, and scores both on held-out mixed batches.
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from llmsched_gym.backends.gpu.config import LlamaConfig, get_config
from llmsched_gym.backends.gpu.executor import DecodeEntry, LlamaExecutor, PrefillEntry
from llmsched_gym.config import ConfigError
from llmsched_gym.core.latency import PROFILE_COLUMNS, LatencyModel, TableLatency

CPU_MODELS = ("tiny",)
"""Presets that run on the CPU without asking (a toy shape for tests); any other needs a GPU, or
``device="cpu"`` given explicitly and the memory for its float32 weights."""


class NoGPUError(ConfigError):
    """The backend was asked for a GPU the machine does not have (one line: what to do instead)."""


def _torch():
    try:
        import torch
    except ImportError:
        raise ConfigError("gpu backend: needs PyTorch (pip install torch, or the project's rl extra)") from None
    return torch


def default_device() -> str:
    """``"cuda"`` when torch sees a GPU, else ``"cpu"``."""
    return "cuda" if _torch().cuda.is_available() else "cpu"


def _free_memory_bytes() -> int | None:
    """Free physical memory (Linux and macOS ``sysconf``), or ``None`` where it cannot be read."""
    import os

    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def resolve_device(config: LlamaConfig, device: str | None) -> str:
    """The device to run ``config`` on, refusing in one line what would fail or crawl.

    ``None``: CUDA when torch sees a GPU; without one only the :data:`CPU_MODELS` run (on the CPU),
    any other model raises :class:`NoGPUError` rather than building a full-size float32 model on
    the CPU. ``"cuda"`` without a GPU raises too. An explicit ``"cpu"`` runs any model whose
    float32 weights fit in the free memory.
    """
    torch = _torch()
    has_gpu = torch.cuda.is_available()
    advice = ("run it on a machine with a CUDA GPU, or use the tiny model, which runs on the CPU for tests "
              "(gpu:tiny, --model tiny)")
    if device is None:
        if has_gpu:
            return "cuda"
        if config.name in CPU_MODELS:
            return "cpu"
        raise NoGPUError(f"gpu:{config.name}: no CUDA GPU found (torch.cuda.is_available() is False); {advice}")
    if device.startswith("cuda") and not has_gpu:
        raise NoGPUError(f"device {device!r}: no CUDA GPU found (torch.cuda.is_available() is False); {advice}")
    if device == "cpu" and config.name not in CPU_MODELS:
        need, free = 4 * config.n_params(), _free_memory_bytes()
        if free is not None and need > free:
            raise NoGPUError(f"device 'cpu': {config.name} needs about {need / 2**30:.0f} GiB for its float32 "
                             f"weights, {free / 2**30:.0f} GiB are free; {advice}")
    return device


def make_executor(model: str | LlamaConfig, device: str | None = None, **executor_kwargs) -> LlamaExecutor:
    """An executor for a preset name or config on :func:`resolve_device`'s device (``None``: the
    GPU; without one only the tiny model, on the CPU)."""
    config = get_config(model) if isinstance(model, str) else model
    return LlamaExecutor(config, device=resolve_device(config, device), **executor_kwargs)


class GPULatency(LatencyModel):
    """Batch time measured by running the batch on the device (online mode).

    The engine sees ``needs_composition = True`` and calls :meth:`time_batch` with the batch's
    exact composition and :meth:`release` when a request's KV is freed.

    :param model: preset name (see ``config.PRESETS``) or a :class:`LlamaConfig`.
    :param device: ``"cuda"``, ``"cpu"`` or ``None`` (the GPU; see :func:`resolve_device`).
    :param executor_kwargs: passed to :class:`LlamaExecutor` (``num_blocks``, ``block_size``...).
    """

    name = "gpu"
    needs_composition = True

    def __init__(self, model: str | LlamaConfig = "llama-2-7b", device: str | None = None, **executor_kwargs):
        self.executor = make_executor(model, device, **executor_kwargs)

    def time_batch(self, prefill: list[PrefillEntry], decode: list[DecodeEntry]) -> float:
        """Seconds the batch took: ``prefill`` holds ``(rid, n_new, ctx_before)``, ``decode``
        holds ``(rid, ctx_before)``."""
        return self.executor.execute(prefill, decode)

    def release(self, request_id: int) -> None:
        """Free the request's KV blocks (completion or preemption)."""
        self.executor.release(request_id)

    def batch_time(self, prefill_tokens, prefill_ctx_tokens, n_prefill, n_decode, decode_ctx_tokens) -> float:
        raise NotImplementedError("GPULatency times real batches: call time_batch with the batch composition")

    def decode_times(self, n_decode: int, decode_ctx_tokens: np.ndarray) -> np.ndarray:
        raise NotImplementedError("GPULatency is never fast-forwarded: call time_batch per iteration")


class FusedAffineLatency(LatencyModel):
    """``t = c0 + c_prefill * prefill_tokens + c_decode * n_decode + c_ctx * decode_ctx_tokens``,
    the form :func:`calibrate` fits (Sheng et al. 2024's and Vidur's style of linear batch model).

    One affine cost for the whole batch, prefill and decode fused in one forward pass as this
    executor runs them (one intercept); core's
    :class:`~llmsched_gym.core.latency.AffineLatency` instead adds separate prefill and decode
    costs, each with its own intercept. Keyed ``affine`` in ``calibration.json`` and replay output."""

    name = "affine"
    FEATURES = ("intercept_s", "per_prefill_token_s", "per_decode_seq_s", "per_decode_ctx_token_s")

    def __init__(
        self,
        intercept_s: float,
        per_prefill_token_s: float,
        per_decode_seq_s: float,
        per_decode_ctx_token_s: float,
    ) -> None:
        self.c = (intercept_s, per_prefill_token_s, per_decode_seq_s, per_decode_ctx_token_s)

    @classmethod
    def from_json(cls, path: str | Path) -> FusedAffineLatency:
        """Load the ``affine`` coefficients of a ``calibration.json``."""
        return cls(**json.loads(Path(path).read_text())["affine"])

    def coefficients(self) -> dict[str, float]:
        """Coefficients by name (seconds)."""
        return dict(zip(self.FEATURES, self.c, strict=True))

    def batch_time(self, prefill_tokens, prefill_ctx_tokens, n_prefill, n_decode, decode_ctx_tokens) -> float:
        c0, cp, cd, cc = self.c
        return c0 + cp * prefill_tokens + cd * n_decode + cc * decode_ctx_tokens

    def decode_times(self, n_decode: int, decode_ctx_tokens: np.ndarray) -> np.ndarray:
        # same operation order as batch_time with prefill_tokens = 0, so results agree bit for bit
        c0, _, cd, cc = self.c
        return c0 + cd * n_decode + cc * np.asarray(decode_ctx_tokens, dtype=np.float64)


def aggregates(prefill: list[PrefillEntry], decode: list[DecodeEntry]) -> tuple[int, int, int, int, int]:
    """The :meth:`LatencyModel.batch_time` arguments of a batch composition."""
    return (
        sum(n for _, n, _ in prefill),
        sum(ctx + n for _, n, ctx in prefill),
        len(prefill),
        len(decode),
        sum(ctx for _, ctx in decode),
    )


def hbm_bound_decode_s(
    config: LlamaConfig, batch: int, ctx: int, bandwidth: float, dtype_bytes: int = 2
) -> float:
    """Lower bound on one decode step: weights plus the batch's K/V read once at ``bandwidth``
    bytes/s (``ctx`` tokens of context per sequence)."""
    kv = batch * ctx * config.kv_bytes_per_token(dtype_bytes)
    return (config.decode_weight_bytes(dtype_bytes) + kv) / bandwidth


def measure_copy_bandwidth(device: str, n_bytes: int = 2**30, repeats: int = 10) -> float:
    """Device-memory bandwidth (bytes read + written per second) of a large tensor copy."""
    import torch

    src = torch.empty(n_bytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    if device.startswith("cuda"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            dst.copy_(src)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
    else:
        t0 = time.perf_counter()
        for _ in range(repeats):
            dst.copy_(src)
        seconds = time.perf_counter() - t0
    return 2 * src.numel() * src.element_size() * repeats / seconds


def error_stats(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    """Per-iteration error of ``predicted`` against ``measured`` (seconds): MAPE, P50/P90 of the
    absolute error, bias (mean signed error, absolute and relative) and the makespan error."""
    err = predicted - measured
    rel = err / measured
    return {
        "mape": float(np.mean(np.abs(rel))),
        "p50_abs_err_s": float(np.percentile(np.abs(err), 50)),
        "p90_abs_err_s": float(np.percentile(np.abs(err), 90)),
        "bias_s": float(np.mean(err)),
        "bias_rel": float(np.mean(rel)),
        "makespan_s": float(predicted.sum()),
        "makespan_rel_err": float(predicted.sum() / measured.sum() - 1.0),
    }


def _named(models: list[LatencyModel]) -> dict[str, LatencyModel]:
    named: dict[str, LatencyModel] = {}
    for m in models:
        key = getattr(m, "name", type(m).__name__)
        named[key if key not in named else f"{key}_{len(named)}"] = m
    return named


# ---------------------------------------------------------------------------------------------- replay
def read_iteration_log(log_path: str | Path) -> tuple[list[dict[str, float]], list[dict[str, list]]]:
    """The iteration log's CSV rows and its ``.batches.jsonl`` compositions (same length)."""
    log_path = Path(log_path)
    with log_path.open(newline="") as f:
        rows = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    batches_path = log_path.with_suffix(".batches.jsonl")
    if not batches_path.is_file():
        raise ValueError(f"replay: {batches_path}: no such file; write it with "
                         f"`llmsched run --log-iterations {log_path} --log-batches`")
    with batches_path.open() as f:
        batches = [json.loads(line) for line in f if line.strip()]
    if len(rows) != len(batches):
        raise ValueError(
            f"replay: {log_path} has {len(rows)} rows but {batches_path} has {len(batches)} batches"
        )
    return rows, batches


def release_schedule(batches: list[dict[str, list]]) -> list[list[int]]:
    """Request ids whose KV the replay frees after each iteration.

    The log does not record frees: a request is freed after its last appearance, and after the
    appearance preceding a prefill that starts below its KV length (preempted, then recomputed).
    """
    length: dict[int, int] = {}
    last_seen: dict[int, int] = {}
    releases: list[list[int]] = [[] for _ in batches]
    for i, batch in enumerate(batches):
        for rid, n, ctx in batch["prefill"]:
            if rid in length and ctx < length[rid]:
                releases[last_seen[rid]].append(rid)
            length[rid], last_seen[rid] = ctx + n, i
        for rid, ctx in batch["decode"]:
            length[rid], last_seen[rid] = ctx + 1, i
    for rid, i in last_seen.items():
        releases[i].append(rid)
    return releases


def _measure_log(
    executor: LlamaExecutor, batches: list[dict[str, list]], releases: list[list[int]]
) -> np.ndarray:
    times = np.empty(len(batches))
    for i, batch in enumerate(batches):
        times[i] = executor.execute([tuple(p) for p in batch["prefill"]], [tuple(d) for d in batch["decode"]])
        for rid in releases[i]:
            executor.release(rid)
    return times


def _retimed_spans(
    rows: list[dict[str, float]], batches: list[dict[str, list]], durations: np.ndarray
) -> dict:
    """Iteration end times and per-request spans (first start to last end) when the logged
    schedule is kept but each iteration takes ``durations`` (idle gaps are kept too)."""
    t_start = np.array([r["t_start"] for r in rows])
    logged = np.array([r["duration"] for r in rows])
    gaps = np.maximum(0.0, np.diff(t_start) - logged[:-1])
    starts = t_start[0] + np.concatenate(([0.0], np.cumsum(durations[:-1] + gaps)))
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, batch in enumerate(batches):
        for entry in batch["prefill"] + batch["decode"]:
            first.setdefault(entry[0], i)
            last[entry[0]] = i
    spans = np.array([starts[last[r]] + durations[last[r]] - starts[first[r]] for r in first])
    return {"end_s": float(starts[-1] + durations[-1] - starts[0]), "spans": spans}


def replay(
    log_path: str | Path,
    model: str | LlamaConfig,
    device: str | None = None,
    out_dir: str | Path = "runs/gpu/replay",
    models: list[LatencyModel] | None = None,
    twice: bool = True,
    executor_kwargs: dict | None = None,
    warmup: bool = True,
) -> dict:
    """Re-execute every batch of an iteration log and compare batch-time models with it.

    :param log_path: the ``--log-iterations`` CSV; its ``.batches.jsonl`` side file gives each
        iteration's exact composition.
    :param model: preset name or config to run.
    :param device: ``"cuda"``, ``"cpu"`` or ``None`` (auto).
    :param out_dir: where ``replay.json`` (summary) and ``replay.csv`` (per iteration) go.
    :param models: latency models to score; the log's own ``duration`` column is always scored
        as ``log``. Their inputs come from the composition (exact aggregates).
    :param twice: measure the whole log twice; the per-iteration relative difference between the
        passes is the noise band, and the errors use the mean of the passes.
    :param executor_kwargs: passed to :class:`LlamaExecutor`.
    :param warmup: run the whole log once, unmeasured, before the measured passes. The first
        execution of each batch shape pays for memory allocation and kernel selection: on an H100
        (Llama-2-7B, 823 iterations) the first pass took 3.4x the second at the median.
    :returns: the summary written to ``replay.json``.
    """
    t0 = time.perf_counter()
    rows, batches = read_iteration_log(log_path)
    executor = make_executor(model, device, **(executor_kwargs or {}))
    releases = release_schedule(batches)
    if warmup:
        _measure_log(executor, batches, releases)
    passes = [_measure_log(executor, batches, releases) for _ in range(2 if twice else 1)]
    measured = np.mean(passes, axis=0)
    busy = measured > 0
    aggs = [aggregates(b["prefill"], b["decode"]) for b in batches]
    mismatches = sum(
        1 for a, r in zip(aggs, rows, strict=True) if a[0] != r["n_prefill_tokens"] or a[3] != r["n_decode"]
    )
    predicted = {"log": np.array([r["duration"] for r in rows])}
    for name, m in _named(models or []).items():
        predicted[name] = np.array([m.batch_time(*a) for a in aggs])
    summary: dict = {
        "log": str(log_path),
        "model": executor.config.name,
        "device": str(executor.device),
        "dtype": str(executor.dtype).removeprefix("torch."),
        "iterations": len(rows),
        "warmup_pass": warmup,
        "composition_mismatches": mismatches,
        "measured_makespan_s": float(measured.sum()),
        "models": {},
    }
    meas_spans = _retimed_spans(rows, batches, measured)
    for name, pred in predicted.items():
        summary["models"][name] = _replay_errors(rows, batches, pred, measured, busy, meas_spans)
    if twice:
        a, b = passes
        rel = np.abs(a[busy] - b[busy]) / ((a[busy] + b[busy]) / 2)
        summary["noise_band"] = {"p50": float(np.percentile(rel, 50)), "p90": float(np.percentile(rel, 90))}
    summary["wall_time_s"] = time.perf_counter() - t0

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "replay.json").write_text(json.dumps(summary, indent=2))
    _write_replay_csv(out / "replay.csv", aggs, passes, predicted)
    return summary


def _replay_errors(rows: list[dict[str, float]], batches: list[dict[str, list]], pred: np.ndarray,
                   measured: np.ndarray, busy: np.ndarray, meas_spans: dict) -> dict:
    """One model's errors on a replay: per busy iteration (:func:`error_stats`) and end to end (the
    logged schedule retimed with its predictions against the measured times: the end of the run and
    each request's span)."""
    stats = error_stats(pred[busy], measured[busy])
    pred_spans = _retimed_spans(rows, batches, pred)
    span_rel = pred_spans["spans"] / meas_spans["spans"] - 1.0
    stats["end_to_end"] = {
        "end_s": pred_spans["end_s"],
        "measured_end_s": meas_spans["end_s"],
        "end_rel_err": pred_spans["end_s"] / meas_spans["end_s"] - 1.0,
        "request_span_rel_err_p50": float(np.percentile(np.abs(span_rel), 50)),
        "request_span_rel_err_p90": float(np.percentile(np.abs(span_rel), 90)),
    }
    return stats


def _write_replay_csv(path: Path, aggs: list[tuple], passes: list[np.ndarray], predicted: dict[str, np.ndarray]
                      ) -> None:
    """``replay.csv``: per iteration, its batch shape, each measured pass and each model's prediction."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "iteration",
                *PROFILE_COLUMNS[:5],
                *(f"measured_{k}_s" for k in range(len(passes))),
                *(f"pred_{n}_s" for n in predicted),
            ]
        )
        for i, a in enumerate(aggs):
            w.writerow([i, *a, *(p[i] for p in passes), *(p[i] for p in predicted.values())])


# ---------------------------------------------------------------------------------------------- calibration
@dataclass(frozen=True)
class CalibrationGrid:
    """What :func:`calibrate` measures.

    :param prefill_tokens: single-request prefill sizes (prefill-only rows).
    :param n_decode: decode batch sizes (decode-only rows, crossed with ``ctx_per_seq``).
    :param ctx_per_seq: context per decoding sequence.
    :param n_mixed: random mixed batches held out to score the fitted models.
    :param repeats: timings per point (the median is kept).
    :param seed: seeds the mixed batches.
    """

    prefill_tokens: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
    n_decode: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    ctx_per_seq: tuple[int, ...] = (64, 256, 512, 1024, 2048, 4096)
    n_mixed: int = 40
    repeats: int = 3
    seed: int = 0


QUICK_GRID = CalibrationGrid(
    prefill_tokens=(16, 64, 256, 1024), n_decode=(1, 8, 32), ctx_per_seq=(64, 512), n_mixed=8, repeats=2
)


def _blocks_for(executor: LlamaExecutor, n_seqs: int, tokens_per_seq: int) -> int:
    return n_seqs * -(-tokens_per_seq // executor.block_size)


def _time_batch(
    executor: LlamaExecutor, prefill: list[PrefillEntry], decode: list[DecodeEntry], repeats: int
) -> float:
    """Median time of the batch over fresh requests (KV released after each repeat)."""
    times = []
    for _ in range(repeats):
        times.append(executor.execute(prefill, decode))
        for rid, *_ in prefill + decode:
            executor.release(rid)
    return float(np.median(times))


def _write_rows(path: Path, rows: list[tuple]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(PROFILE_COLUMNS)
        w.writerows(rows)


def fit_fused_affine(rows: list[tuple]) -> FusedAffineLatency:
    """Least-squares fit of :class:`FusedAffineLatency` to profile rows, on relative error (each row
    weighted by 1 / time) so that small batches count as much as large ones, as MAPE does."""
    data = np.array(rows, dtype=np.float64)
    x = np.column_stack([np.ones(len(data)), data[:, 0], data[:, 3], data[:, 4]])
    t = data[:, 5]
    coef, *_ = np.linalg.lstsq(x / t[:, None], np.ones(len(t)), rcond=None)
    return FusedAffineLatency(*(float(c) for c in coef))


def load_table(profile_path: Path) -> tuple[LatencyModel | None, str | None]:
    """The table model of ``profile.csv`` (:data:`~llmsched_gym.core.latency.PROFILE_COLUMNS`), and
    None where ``calibration.json`` says why a table model is missing (it never is now)."""
    return TableLatency.from_csv(profile_path), None


def calibrate(
    model: str | LlamaConfig,
    device: str | None = None,
    out_dir: str | Path = "runs/gpu/calibrate",
    grid: CalibrationGrid = CalibrationGrid(),
    executor_kwargs: dict | None = None,
) -> dict:
    """Profile the grid, fit the affine model and score it and the table model on held-out
    mixed batches.

    Writes ``profile.csv`` (prefill-only and decode-only rows, the table model's input),
    ``heldout.csv`` (the mixed batches, same header) and ``calibration.json`` (the returned
    summary: affine coefficients, held-out MAPE, decode time against the HBM bound, points
    skipped because their KV did not fit).
    """
    t0 = time.perf_counter()
    executor = make_executor(model, device, **(executor_kwargs or {}))
    cfg = executor.config
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rid = iter(range(10**9))
    profile, skipped = _profile_rows(executor, grid, rid)
    profile_path = out / "profile.csv"
    _write_rows(profile_path, profile)
    heldout = _heldout_rows(executor, grid, rid)
    _write_rows(out / "heldout.csv", heldout)

    affine = fit_fused_affine(profile)
    table, table_skipped = load_table(profile_path)
    held = np.array(heldout, dtype=np.float64)

    def mape(m: LatencyModel) -> float:
        pred = np.array([m.batch_time(*(int(v) for v in row[:5])) for row in held])
        return float(np.mean(np.abs(pred / held[:, 5] - 1.0)))

    # several times the last-level cache on either device, without taking much of the CPU's memory
    bandwidth = measure_copy_bandwidth(str(executor.device), 2**30 if executor.is_cuda else 2**27)
    summary = {
        "model": cfg.name,
        "device": str(executor.device),
        "dtype": str(executor.dtype).removeprefix("torch."),
        "block_size": executor.block_size,
        "kv_capacity_blocks": executor.kv_capacity_blocks(),
        "kv_capacity_tokens": executor.kv_capacity_blocks() * executor.block_size,
        "grid": asdict(grid),
        "profile_rows": len(profile),
        "heldout_rows": len(heldout),
        "skipped": skipped,
        "affine": affine.coefficients(),
        "heldout_mape": {"affine": mape(affine), "table": None if table is None else mape(table)},
        "table_skipped": table_skipped,
        "copy_bandwidth_bytes_per_s": bandwidth,
        "decode_vs_hbm_bound": _decode_vs_hbm(cfg, profile, bandwidth, executor.dtype.itemsize),
        "wall_time_s": time.perf_counter() - t0,
    }
    (out / "calibration.json").write_text(json.dumps(summary, indent=2))
    return summary


def _profile_rows(executor: LlamaExecutor, grid: CalibrationGrid, rid: Iterator[int]) -> tuple[list[tuple], list[str]]:
    """Time the grid's single-request prefills and its decode batches (the ``profile.csv`` rows), and
    name the points skipped because their KV (or prefill tokens) did not fit."""
    profile: list[tuple] = []
    skipped: list[str] = []
    for n in grid.prefill_tokens:
        if n > executor.max_batch_tokens or _blocks_for(executor, 1, n) > executor.num_blocks:
            skipped.append(f"prefill {n}")
            continue
        profile.append((n, n, 1, 0, 0, _time_batch(executor, [(next(rid), n, 0)], [], grid.repeats)))
    for n_dec in grid.n_decode:
        for ctx in grid.ctx_per_seq:
            if _blocks_for(executor, n_dec, ctx + 1) > executor.num_blocks:
                skipped.append(f"decode {n_dec}x{ctx}")
                continue
            decode = [(next(rid), ctx) for _ in range(n_dec)]
            profile.append((0, 0, 0, n_dec, n_dec * ctx, _time_batch(executor, [], decode, grid.repeats)))
    return profile, skipped


def _heldout_rows(executor: LlamaExecutor, grid: CalibrationGrid, rid: Iterator[int]) -> list[tuple]:
    """Time ``grid.n_mixed`` seeded mixed batches (prefills and decodes together) that fit, the held-out
    rows the fitted models are scored on (at most 100 draws per batch kept)."""
    rng = np.random.default_rng(grid.seed)
    heldout: list[tuple] = []
    for _ in range(100 * grid.n_mixed):
        if len(heldout) == grid.n_mixed:
            break
        prefill = [
            (next(rid), int(rng.integers(min(grid.prefill_tokens), max(grid.prefill_tokens) // 2 + 1)), 0)
            for _ in range(int(rng.integers(1, 3)))
        ]
        ctxs = rng.integers(
            min(grid.ctx_per_seq), max(grid.ctx_per_seq) + 1, size=int(rng.choice(grid.n_decode))
        )
        decode = [(next(rid), int(c)) for c in ctxs]
        need = sum(_blocks_for(executor, 1, n) for _, n, _ in prefill) + sum(
            _blocks_for(executor, 1, c + 1) for _, c in decode
        )
        if need > executor.num_blocks or sum(n for _, n, _ in prefill) > executor.max_batch_tokens:
            continue
        heldout.append((*aggregates(prefill, decode), _time_batch(executor, prefill, decode, grid.repeats)))
    return heldout


def _decode_vs_hbm(cfg: LlamaConfig, profile: list[tuple], bandwidth: float, dtype_bytes: int) -> list[dict]:
    """Each measured decode batch's time against the time to stream its weights and KV at the
    measured copy bandwidth (:func:`hbm_bound_decode_s`)."""
    rows = []
    for _, _, _, n_dec, ctx_sum, t in profile:
        if n_dec:
            bound = hbm_bound_decode_s(cfg, n_dec, ctx_sum // n_dec, bandwidth, dtype_bytes)
            rows.append({"n_decode": n_dec, "ctx_per_seq": ctx_sum // n_dec, "time_s": t, "hbm_bound_s": bound,
                         "time_over_bound": t / bound})
    return rows
