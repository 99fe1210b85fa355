"""Batch times grounded in measured GPU operator profiles (Vidur's ``mlp.csv`` format).

Vidur (Agrawal et al. 2024, section 4) times every non-attention operator of one transformer
layer on a real GPU, for batches of 1 to several thousand tokens and tensor-parallel degrees
1 to 8, and publishes the medians (``data/profiling/compute/GPU/ORG/MODEL/mlp.csv`` in its
repository, MIT licence). An iteration's *linear part* (projections, MLP, norms, rotary, residual
adds) is the layer's operator sum times the number of layers, plus the embedding once; it
depends only on the tokens computed in the iteration.

:class:`ProfileLatency` (spec ``profile:PATH_OR_DIR`` or ``vidur:GPU/MODEL``) is one iteration as

    linear(prefill_tokens + n_decode)            interpolated in the measurements (made
                                                 non-decreasing: :func:`monotone`)
  + max(attention FLOPs / (peak x mfu),          prefill pairs and decode context, as the roofline
        KV bytes / (HBM x mbu))                  counts them
  + 2 x layers x all-reduce(tokens x hidden)     tensor parallel only (NVLink ring)
  + overhead_s                                   0 by default (the profile is GPU time only)

The profiles do not measure attention (Vidur's ``attention.csv`` is too large to ship); its
efficiencies come from the same profile: ``mfu`` is the one :func:`fit_roofline` fits to the
linear part (the fraction of peak the large matrix multiplications reach, 0.65-0.76), ``mbu``
the fraction of HBM bandwidth the projections reach streaming their weights at one token
(0.6-0.87): the GPU's demonstrated compute and bandwidth, applied to attention's FLOPs and KV.

:func:`fit_roofline` also gives the ``calibrated:MODEL/GPU`` presets (:class:`CalibratedLatency
<llmsched_gym.core.latency.CalibratedLatency>`): ``mfu``, ``mbu``, ``overhead_s`` minimising the
mean absolute percentage error of the roofline's linear part against a profile. They are this
model's offline stand-in: the same sum, with the fitted roofline as the linear part.

Named profiles (``vidur:a100/llama-2-7b``) are the ones ``llmsched data`` knows; ``llmsched data
download vidur:a100/llama-2-7b`` fetches one from Vidur's repository into the user cache, and
:func:`find_profile` looks there and in ``../shared/profiles`` (:func:`llmsched_gym.data.resolve_data`).
"""

from __future__ import annotations

import csv
import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from llmsched_gym.core.latency.base import LatencyModel, by_name, register_latency
from llmsched_gym.core.latency.calibrated import calibrated_fallback
from llmsched_gym.core.latency.roofline import SummedLatency
from llmsched_gym.core.latency.table import Curve
from llmsched_gym.core.models import GPUS, MODELS, GPUSpec, ModelSpec, get_gpu, get_model

VIDUR_LAYER_OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
"""Per-layer operators of Vidur's ``mlp.csv`` (``time_stats.OP.median``, milliseconds)."""

VIDUR_PROJECTIONS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
"""The layer's matrix multiplications (their weights are the bytes a one-token batch streams)."""

VIDUR_GPUS: dict[str, str] = {"a100": "A100-80GB", "h100": "H100-SXM", "a40": "A40"}
"""Vidur's GPU folder names -> our :data:`~llmsched_gym.core.models.GPUS` names."""

FIT_MAX_TOKENS = 8192
"""Fits and errors use the measured points with at most this many tokens."""


class ProfileError(ValueError):
    """A profile that cannot be found or read; the message names the file or the field."""


@dataclass(frozen=True)
class LinearProfile:
    """The measured linear part of one iteration for one GPU, model and tensor-parallel degree.

    :param source: where it was read (a path).
    :param gpu: the GPU (one device; ``tp`` says how many share the work).
    :param model: the model, identified from the profile's shape columns.
    :param tp: tensor-parallel degree (each GPU computes 1/tp of every operator).
    :param tokens: tokens in the batch, ascending, distinct.
    :param seconds: per iteration: layers x the layer's operator medians + the embedding
        (repeated measurements of a point averaged).
    :param stream_mbu: the fraction of HBM bandwidth the layer's four projections reach at the
        smallest batch (their weight bytes / their measured time): what a streaming read such
        as decode attention's KV read achieves on this GPU.
    """

    source: str
    gpu: GPUSpec
    model: ModelSpec
    tp: int
    tokens: np.ndarray
    seconds: np.ndarray
    stream_mbu: float

    @property
    def label(self) -> str:
        return f"{self.model.name} / {self.gpu.name}" + (f" TP {self.tp}" if self.tp > 1 else "")


def _model_from_shape(row: Mapping[str, str], hint: str) -> ModelSpec:
    """The known model with this shape; ties (Llama-3-8B and 3.1-8B) go to the name in ``hint``."""
    try:
        shape = tuple(int(float(row[k])) for k in ("n_embd", "n_head", "n_kv_head", "n_expanded_embd"))
    except (KeyError, ValueError) as e:
        raise ProfileError(f"profile: shape column {e} missing or not a number") from None
    matches = [m for m in MODELS.values() if (m.hidden, m.heads, m.kv_heads, m.ffn) == shape]
    if not matches:
        raise ProfileError(f"profile: no known model has (n_embd, n_head, n_kv_head, n_expanded_embd) = {shape}; "
                           f"pass model=NAME (one of {', '.join(m.name for m in MODELS.values())})")
    hint = hint.lower().replace("meta-", "")
    return next((m for m in matches if m.name.lower() in hint), matches[0])


def _gpu_from_path(path: Path) -> GPUSpec | None:
    """The GPU named by a folder of ``path`` (Vidur's ``a100``, ``h100``, ``a40`` or one of ours)."""
    for part in reversed(path.parts):
        try:
            return get_gpu(VIDUR_GPUS.get(part.lower(), part))
        except ValueError:
            continue
    return None


MAX_PROFILE_BYTES = 256 * 2**20
"""Largest profile CSV read (256 MiB; Vidur's published ``mlp.csv`` files are under 1 MB)."""


@functools.lru_cache(maxsize=32)
def read_vidur_mlp(path: str | Path, model: str | None = None, gpu: str | None = None) -> dict[int, LinearProfile]:
    """Read a Vidur ``mlp.csv`` (or a folder holding one) into one :class:`LinearProfile` per TP degree.

    :param path: the CSV, or its folder.
    :param model: model name; default: the known model whose shape matches the shape columns.
    :param gpu: GPU name; default: the Vidur folder name in the path (``a100``, ``h100``, ``a40``).
    :raises ProfileError: missing file, column or GPU, or a bad number (file and line named).

    Cached by arguments (scenarios build their model on every run); treat the result as read-only.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "mlp.csv"
    if not path.is_file():
        raise ProfileError(f"profile: {path}: file not found")
    size = path.stat().st_size
    if size > MAX_PROFILE_BYTES:
        raise ProfileError(f"profile: {path}: {size:,} bytes, more than the {MAX_PROFILE_BYTES:,} a profile may have "
                           "(Vidur's mlp.csv files are under 1 MB)")
    points: dict[int, dict[float, list[float]]] = {}
    proj: dict[int, tuple[float, float]] = {}  # tp -> (tokens, projection seconds) at the smallest batch
    spec: ModelSpec | None = get_model(model) if model else None
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        need = [f"time_stats.{op}.median" for op in ("emb", *VIDUR_LAYER_OPS)]
        need += ["num_tokens", "num_tensor_parallel_workers"]
        missing = [c for c in need if c not in (reader.fieldnames or [])]
        if missing:
            raise ProfileError(f"profile: {path}:1: missing column {missing[0]!r} (not a Vidur mlp.csv)")
        gpu_spec = get_gpu(gpu) if gpu else _gpu_from_path(path)
        if gpu_spec is None:
            raise ProfileError(f"profile: {path}: cannot tell the GPU from the path; pass gpu=NAME "
                               f"(one of {', '.join(g.name for g in GPUS.values())})")
        for line, row in enumerate(reader, start=2):
            if spec is None:
                spec = _model_from_shape(row, str(path))
            try:
                layer_ms = math.fsum(float(row[f"time_stats.{op}.median"]) for op in VIDUR_LAYER_OPS)
                total_s = (spec.layers * layer_ms + float(row["time_stats.emb.median"])) * 1e-3
                n, tp = float(row["num_tokens"]), int(float(row["num_tensor_parallel_workers"]))
            except ValueError as e:
                raise ProfileError(f"profile: {path}:{line}: {e}") from None
            if not (math.isfinite(total_s) and total_s > 0 and n >= 1 and tp >= 1):
                raise ProfileError(f"profile: {path}:{line}: expected positive times, num_tokens >= 1 and "
                                   f"num_tensor_parallel_workers >= 1")
            points.setdefault(tp, {}).setdefault(n, []).append(total_s)
            proj_s = math.fsum(float(row[f"time_stats.{op}.median"]) for op in VIDUR_PROJECTIONS) * 1e-3
            if n < proj.get(tp, (math.inf, 0.0))[0] or (n == proj[tp][0] and proj_s < proj[tp][1]):
                proj[tp] = (n, proj_s)
    if spec is None:
        raise ProfileError(f"profile: {path}: no rows")
    m = spec
    proj_bytes = (m.hidden * (m.heads + 2 * m.kv_heads) * m.head_dim + m.heads * m.head_dim * m.hidden
                  + 3 * m.hidden * m.ffn) * m.dtype_bytes  # QKV, output, gate + up, down (gated MLP)
    out = {}
    for tp, pts in sorted(points.items()):
        xs = sorted(pts)
        mbu = min(1.0, proj_bytes / tp / proj[tp][1] / gpu_spec.hbm_bytes_s)
        out[tp] = LinearProfile(str(path), gpu_spec, spec, tp, np.array(xs),
                                np.array([math.fsum(pts[x]) / len(pts[x]) for x in xs]), mbu)
    return out


# --------------------------------------------------------------------------------------------
# Finding named profiles


def vidur_names() -> list[str]:
    """The Vidur profiles ``llmsched data`` knows (``vidur:a100/llama-2-7b``, ...)."""
    from llmsched_gym import data

    return [name for name in data.DATASETS if name.startswith("vidur:")]


def find_profile(name: str) -> Path | None:
    """The folder holding ``mlp.csv`` for ``vidur:GPU/MODEL``, or None when no copy is found.

    Looked up by :func:`llmsched_gym.data.resolve_data`: the user cache (``$LLMSCHED_DATA``,
    filled by ``llmsched data download vidur:GPU/MODEL``), then ``../shared/profiles``.

    :raises ProfileError: an unknown name (the message lists the known ones).
    """
    from llmsched_gym import data

    key = "vidur:" + name.strip().lower().removeprefix("vidur:")
    if key not in vidur_names():
        raise ProfileError(f"latency: unknown profile {key!r}; allowed: {', '.join(vidur_names())}")
    path = data.resolve_data(key)
    return None if path is None else path.parent


# --------------------------------------------------------------------------------------------
# Fitting the roofline to a profile


@dataclass(frozen=True)
class RooflineFit:
    """Roofline efficiencies fitted to a measured linear part, with the fit's error.

    :param mfu: fraction of peak FLOP/s (2 x params FLOPs per token).
    :param mbu: fraction of HBM bandwidth (the weights read once per iteration).
    :param overhead_s: fixed seconds per iteration.
    :param mape: mean absolute percentage error over the fitted points (a fraction).
    :param worst: largest absolute percentage error, and where (tokens).
    """

    mfu: float
    mbu: float
    overhead_s: float
    mape: float
    worst: float
    worst_tokens: int


def roofline_linear(model: ModelSpec, gpu: GPUSpec, mfu: float, mbu: float, overhead_s: float,
                    tokens: np.ndarray) -> np.ndarray:
    """The roofline's time for ``tokens`` decode requests at context 0 (its linear part).

    Same arithmetic as :meth:`RooflineLatency.batch_time(0, 0, 0, n, 0)
    <llmsched_gym.core.latency.RooflineLatency.batch_time>`.
    """
    flops_s, bytes_s = gpu.peak_flops * mfu, gpu.hbm_bytes_s * mbu
    n = np.asarray(tokens, dtype=np.float64)
    compute = 2.0 * model.params / flops_s * n + 4.0 * model.layers * model.heads * model.head_dim / flops_s * n
    memory = model.weight_bytes / bytes_s + model.kv_bytes_per_token / bytes_s * n
    return np.where(compute > memory, compute, memory) + overhead_s


def fit_roofline(profile: LinearProfile, max_tokens: int = FIT_MAX_TOKENS) -> RooflineFit:
    """``mfu``, ``mbu`` (both in (0, 1]) and ``overhead_s`` (>= 0) minimising the MAPE of the
    roofline's linear part against ``profile`` over its points up to ``max_tokens`` tokens.

    A least-squares start on the relative error, then Nelder-Mead on the MAPE itself; both
    deterministic. The GPU is ``profile.gpu`` with ``count = profile.tp``.
    """
    from scipy.optimize import least_squares, minimize  # used here only; slow to import

    keep = profile.tokens <= max_tokens
    n, y = profile.tokens[keep], profile.seconds[keep]
    gpu = replace(profile.gpu, count=profile.tp)

    def pred(p: np.ndarray) -> np.ndarray:
        return roofline_linear(profile.model, gpu, p[0], p[1], p[2], n)

    lo, hi = [0.01, 0.01, 0.0], [1.0, 1.0, float(y.max())]
    start = least_squares(lambda p: pred(p) / y - 1.0, [0.5, 0.8, 0.5 * float(y.min())], bounds=(lo, hi)).x
    res = minimize(lambda p: float(np.mean(np.abs(pred(p) / y - 1.0))), start, method="Nelder-Mead",
                   bounds=list(zip(lo, hi, strict=True)),
                   options={"maxiter": 4000, "xatol": 1e-9, "fatol": 1e-12})
    mfu, mbu, overhead = (float(v) for v in res.x)
    err = np.abs(pred(res.x) / y - 1.0)
    k = int(np.argmax(err))
    return RooflineFit(mfu, mbu, overhead, float(err.mean()), float(err[k]), int(n[k]))


def monotone(seconds: np.ndarray) -> np.ndarray:
    """The non-decreasing sequence closest to ``seconds`` in squared relative error (isotonic
    regression by pool-adjacent-violators, weights ``1 / seconds**2``).

    Measured linear parts dip in places (another kernel wins: 48 tokens can time faster than 40);
    a batch-time model that falls when a batch grows would reward padding batches, so the profile
    model interpolates this fit instead (0.3 to 1.5% MAPE from the raw points of Vidur's profiles).
    """
    blocks: list[list[float]] = []  # [weighted mean, weight, count]
    for y in map(float, seconds):
        blocks.append([y, 1.0 / (y * y), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (a, wa, ca), (b, wb, cb) = blocks[-2], blocks[-1]
            blocks[-2:] = [[(a * wa + b * wb) / (wa + wb), wa + wb, ca + cb]]
    return np.repeat([b[0] for b in blocks], [b[2] for b in blocks])


def loo_errors(profile: LinearProfile, max_tokens: int = FIT_MAX_TOKENS) -> np.ndarray:
    """Leave-one-out relative error of the profile model's linear part: each interior measured
    point predicted by interpolating the model's curve (:func:`monotone`) between its two
    neighbours, against the raw measurement (the error between measured batch sizes)."""
    n, y, m = profile.tokens, profile.seconds, monotone(profile.seconds)
    keep = np.nonzero(n <= max_tokens)[0]
    keep = keep[(keep > 0) & (keep < len(n) - 1)]
    pred = m[keep - 1] + (m[keep + 1] - m[keep - 1]) * (n[keep] - n[keep - 1]) / (n[keep + 1] - n[keep - 1])
    return pred / y[keep] - 1.0


_MFU_CACHE: dict[tuple[str, int], float] = {}


def _fitted_mfu(profile: LinearProfile) -> float:
    key = (profile.source, profile.tp)
    if key not in _MFU_CACHE:
        _MFU_CACHE[key] = fit_roofline(profile).mfu
    return _MFU_CACHE[key]


# --------------------------------------------------------------------------------------------
# The latency model


class ProfileLatency(SummedLatency):
    """One iteration from a measured linear part plus modelled attention and all-reduce.

    See the module docstring for the formula (the arithmetic is :class:`SummedLatency`'s, shared
    with ``calibrated:MODEL/GPU``). ``decode_times`` equals ``batch_time`` bit for bit.

    :param profile: the measured linear part (one TP degree).
    :param name: the spec that rebuilds this model (``vidur:a100/llama-2-7b,tp=2``).
    :param mfu: attention compute efficiency; default: the ``mfu`` of :func:`fit_roofline` on
        the profile (what its matrix multiplications reach at large batches).
    :param mbu: KV read/write efficiency; default: ``profile.stream_mbu`` (what its projections
        reach streaming their weights at one token).
    :param overhead_s: seconds added per iteration (CPU scheduling, sampling), 0 by default.
    """

    def __init__(self, profile: LinearProfile, name: str, mfu: float | None = None, mbu: float | None = None,
                 overhead_s: float = 0.0) -> None:
        self.profile = profile
        self.name = name
        if mfu is None:
            mfu = _fitted_mfu(profile)
        if mbu is None:
            mbu = profile.stream_mbu
        super().__init__(profile.model, replace(profile.gpu, count=profile.tp), mfu, mbu, overhead_s)
        mono = monotone(profile.seconds)
        self._linear = Curve({float(x): [float(t)] for x, t in zip(profile.tokens, mono, strict=True)})
        # Past the largest measured batch, extend with the slope over its upper half (the
        # compute-bound regime), not the last segment's, which pooling may have flattened.
        half = int(np.searchsorted(profile.tokens, profile.tokens[-1] / 2))
        if half < len(mono) - 1:
            slope = float((mono[-1] - mono[half]) / (profile.tokens[-1] - profile.tokens[half]))
            self._linear.slopes[-1] = slope
            self._linear._slopes_a[-1] = slope

    def linear_time(self, tokens: float) -> float:
        """The linear part for ``tokens`` tokens (seconds): :func:`monotone` of the measurements,
        interpolated."""
        return self._linear.at(tokens)


_OPTS = ("tp", "mfu", "mbu", "overhead_s", "model", "gpu")


def _split_opts(text: str, kind: str) -> tuple[str, dict[str, str]]:
    head, *items = text.split(",")
    opts: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in items)):
        key, eq, value = item.partition("=")
        if not eq or key.strip() not in _OPTS:
            raise ProfileError(f"latency: {kind} takes {', '.join(f'{o}=...' for o in _OPTS)}; got {item!r}")
        opts[key.strip()] = value.strip()
    return head.strip(), opts


def load_profile_model(kind: str, rest: str, fallback: Callable[[str, int], LatencyModel] | None = None
                       ) -> LatencyModel:
    """Build the model of a ``profile:PATH_OR_DIR[,opts]`` or ``vidur:GPU/MODEL[,opts]`` spec.

    Options: ``tp`` (default 1), ``mfu``, ``mbu``, ``overhead_s``, and for a path ``model``,
    ``gpu`` when the profile's shape or folder does not say. A ``vidur:`` name that no copy is
    found for is built by ``fallback(name, tp)`` when given (``make_latency`` falls back to the
    ``calibrated:`` preset fitted to that profile, whose name says so), else it is an error naming where it looked.
    """
    head, opts = _split_opts(rest, kind)
    try:
        tp = int(opts.get("tp", "1"))
        nums = {k: float(opts[k]) for k in ("mfu", "mbu", "overhead_s") if k in opts}
    except ValueError:
        raise ProfileError(f"latency: {kind} tp must be an integer and mfu, mbu, overhead_s numbers; got {rest!r}"
                           ) from None
    if kind == "vidur":
        head = head.lower()
        found = find_profile(head)
        if found is None:
            if fallback is not None:
                return fallback(head, tp)
            raise ProfileError(f"latency: vidur:{head}: mlp.csv not found; `llmsched data download vidur:{head}`")
        path = found
    else:
        path = Path(head)
    profiles = read_vidur_mlp(str(path), opts.get("model"), opts.get("gpu"))
    if tp not in profiles:
        raise ProfileError(f"latency: {kind}:{head}: tp={tp} not measured; allowed: {', '.join(map(str, profiles))}")
    name = f"{kind}:{head}" + "".join(f",{k}={v}" for k, v in opts.items() if not (k == "tp" and v == "1"))
    return ProfileLatency(profiles[tp], name, nums.get("mfu"), nums.get("mbu"), nums.get("overhead_s", 0.0))


def profile_to_rows(model: LatencyModel, prefill_tokens: tuple[int, ...] = (1, 16, 64, 128, 256, 512, 1024, 2048,
                                                                            4096, 8192),
                    n_decode: tuple[int, ...] = (1, 8, 32, 64, 128, 256),
                    ctx_per_seq: tuple[int, ...] = (0, 256, 1024, 4096)) -> list[tuple[int, int, int, int, int, float]]:
    """Rows of the project's table format (:data:`~llmsched_gym.core.latency.PROFILE_COLUMNS`)
    sampled from any model: single-request prefills and decode grids, for
    :class:`~llmsched_gym.core.latency.TableLatency` and ``llmsched gpu replay``."""
    rows = [(p, p, 1, 0, 0, model.batch_time(p, p, 1, 0, 0)) for p in prefill_tokens]
    rows += [(0, 0, 0, n, n * c, model.batch_time(0, 0, 0, n, n * c)) for n in n_decode for c in ctx_per_seq]
    return rows


register_latency("vidur", lambda rest: load_profile_model("vidur", rest, calibrated_fallback) if rest else None, "",
                 from_dict=by_name("vidur"), listing={"vidur:GPU/MODEL[,tp=N]": (
                     "measured linear part (Vidur's profiles: GPU a100, h100, a40; MODEL llama-2-7b, llama-2-70b, "
                     "llama-3-8b) + attention and all-reduce from FLOPs and bytes; stands in with calibrated:MODEL/GPU "
                     "when not found")})
register_latency("profile", lambda rest: load_profile_model("profile", rest, calibrated_fallback) if rest else None,
                 "", from_dict=by_name("profile"),
                 listing={"profile:PATH_OR_DIR[,tp=N]": "the same from a Vidur-format mlp.csv (or its folder)"})
