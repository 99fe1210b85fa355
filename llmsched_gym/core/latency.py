"""Batch-time models: how long one engine iteration takes.

Every model is a pure function of the batch's shape (noise is applied by the engine, indexed by
iteration number, so fast-forward and step-by-step runs draw the same noise):

* ``prefill_tokens``: new prompt tokens computed this iteration (sum of chunks);
* ``prefill_ctx_tokens``: sum over the prefill requests of their context after the chunk
  (cached prefix + earlier chunks + this chunk), for the attention cost;
* ``n_prefill``: number of requests with a prefill chunk in the batch;
* ``n_decode``: number of decode tokens (one per decoding request);
* ``decode_ctx_tokens``: sum over decoding requests of the tokens they attend to (their KV
  before this iteration).

``decode_times`` is the vectorised decode-only case used by fast-forward; it must equal
``batch_time(0, 0, 0, n_decode, c)`` element by element, bit for bit. Every model therefore
writes its decode-only arithmetic twice, once on Python floats and once on NumPy arrays, with
the same operations in the same order (IEEE add/multiply/divide are correctly rounded in both,
and NumPy does not fuse them). Integer token counts are exact in float64 below 2**53.

Models (``make_latency`` spec in brackets; each instance's ``name`` is a spec that rebuilds it):

=====================  ================================================================
``unit``               every iteration takes 1 (the theory papers' rounds)
``linear``             ``d0 + d1 * KV tokens in the batch`` (Ao et al. 2025, Eq. 1)
``piecewise``          ``c + a * max(0, tokens - b0)`` (Li et al. 2025, cited by Ao et al. 2025)
``affine``             separate prefill and decode fits (Sheng et al. 2024's A10G profile)
``roofline:M/G``       max(compute, memory) + overhead from model and GPU specs
``calibrated:M/G``     ``vidur:G/M``'s form, linear part = the roofline fitted to it
``vidur:G/M``          measured linear part + modelled attention (:mod:`.profile`)
``profile:PATH``       the same from a Vidur-format ``mlp.csv``
``table:PATH``         interpolation in a measured profile (the GPU backend's CSV)
``KIND:...``           a plug-in's model (``gpu:MODEL``, :func:`register_latency`)
=====================  ================================================================
"""

from __future__ import annotations

import csv
import math
import sys
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from llmsched_gym.core.models import GPUSpec, ModelSpec, get_gpu, get_model


class LatencyModel:
    """Base class: ``batch_time`` for one iteration, ``decode_times`` for many decode-only ones."""

    name = "base"

    def batch_time(
        self, prefill_tokens: int, prefill_ctx_tokens: int, n_prefill: int, n_decode: int, decode_ctx_tokens: int
    ) -> float:
        """Seconds (or rounds) one iteration of this shape takes."""
        raise NotImplementedError

    def decode_times(self, n_decode: int, decode_ctx_tokens: np.ndarray) -> np.ndarray:
        """``batch_time(0, 0, 0, n_decode, c)`` for every ``c`` in ``decode_ctx_tokens``, bit for bit."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class UnitLatency(LatencyModel):
    """Every iteration takes one unit (the theory papers' rounds)."""

    name = "unit"

    def batch_time(
        self, prefill_tokens: int, prefill_ctx_tokens: int, n_prefill: int, n_decode: int, decode_ctx_tokens: int
    ) -> float:
        return 1.0

    def decode_times(self, n_decode: int, decode_ctx_tokens: np.ndarray) -> np.ndarray:
        return np.ones(len(decode_ctx_tokens))


class LinearKVLatency(LatencyModel):
    """Ao et al. 2025's Eq. 1 (section 2.3): ``tau = d0 + d1 * (KV tokens of the requests in the batch)``.

    A prefill request counts its context after the chunk, a decode request its KV including the
    token it is about to produce, so the KV in the batch is
    ``prefill_ctx_tokens + decode_ctx_tokens + n_decode``. Resident but paused requests do not
    count.

    The paper publishes no coefficients. The defaults are our estimate for Llama-2-7B
    fp16 on one A100: ``d1`` = 0.5 MiB of KV per token at about 2 TB/s,
    ``d0`` = streaming 13.5 GB of weights (7-12 ms). Calibrate with :func:`fit_linear`.

    :param d0: fixed cost per iteration, seconds.
    :param d1: cost per KV token in the batch, seconds.
    """

    def __init__(self, d0: float = 0.01, d1: float = 2.6e-7) -> None:
        self.d0 = float(d0)
        self.d1 = float(d1)
        self.name = f"linear:d0={self.d0!r},d1={self.d1!r}"

    def batch_time(
        self, prefill_tokens: int, prefill_ctx_tokens: int, n_prefill: int, n_decode: int, decode_ctx_tokens: int
    ) -> float:
        return self.d0 + self.d1 * (prefill_ctx_tokens + decode_ctx_tokens + n_decode)

    def decode_times(self, n_decode: int, decode_ctx_tokens: np.ndarray) -> np.ndarray:
        ctx = np.asarray(decode_ctx_tokens, dtype=np.float64)
        return self.d0 + self.d1 * (ctx + n_decode)


class PiecewiseLatency(LatencyModel):
    """Li et al. (2025), as cited in Ao et al. 2025, section 2.3: ``tau = c + a * max(0, b' - b0)``.

    Flat below ``b0`` (the weights' memory read dominates), linear above it (compute-bound).
    The paper does not define the load ``b'``; we read it as the tokens computed in the
    iteration, ``prefill_tokens + n_decode``, which is the batch size for a decode-only batch.

    The defaults are ours, read off the ``roofline:llama-2-7b/a100`` preset: its decode floor
    (~9.8 ms), its compute cost per token (2 x 6.7e9 FLOP at 156 TFLOP/s = 86 us) and the knee
    where compute overtakes the weight read (~96 tokens).

    :param c: iteration time below the knee, seconds.
    :param a: extra seconds per token above the knee.
    :param b0: the knee, in tokens per iteration.
    """

    def __init__(self, c: float = 0.0098, a: float = 8.6e-5, b0: float = 96.0) -> None:
        self.c = float(c)
        self.a = float(a)
        self.b0 = float(b0)
        self.name = f"piecewise:c={self.c!r},a={self.a!r},b0={self.b0!r}"

    def batch_time(
        self, prefill_tokens: int, prefill_ctx_tokens: int, n_prefill: int, n_decode: int, decode_ctx_tokens: int
    ) -> float:
        excess = prefill_tokens + n_decode - self.b0
        return self.c + self.a * excess if excess > 0.0 else self.c

    def decode_times(self, n_decode: int, decode_ctx_tokens: np.ndarray) -> np.ndarray:
        # Independent of the context, so the scalar path gives the (only) value.
        return np.full(len(decode_ctx_tokens), self.batch_time(0, 0, 0, n_decode, 0))


class AffineLatency(LatencyModel):
    """Separate affine prefill and decode costs; a mixed batch pays both.

    * prefill (when ``prefill_tokens > 0``): ``prefill_base_s + prefill_per_seq_s * n_prefill
      + prefill_per_token_s * prefill_tokens + prefill_per_ctx_s * prefill_ctx_tokens``;
    * decode (when ``n_decode > 0``): ``decode_base_s + decode_per_seq_s * n_decode
      + decode_per_kv_s * (decode_ctx_tokens + n_decode)`` (KV in use after the step).

    A mixed batch costs the sum of the two parts, as in engines that run the prefill and the
    decode forward passes one after the other (S-LoRA/LightLLM, where Sheng et al. 2024 measured).

    Defaults: Sheng et al. 2024's A10G / Llama-2-7B profile (our fit to their artifact's
    ``cost_profile.json``): prefill ms = 35.7 + 0.21 x batch + 0.2086 x input tokens; decode
    ms = 16.3 + 0.245 x batch + 0.00202 x KV tokens (residuals within 4 ms).
    ``prefill_per_ctx_s`` (attention over a cached prefix) is 0 there; it is ours to set.
    All coefficients are in seconds. Calibrate with :func:`fit_affine`.
    """

    COEFFS = (
        "prefill_base_s",
        "prefill_per_seq_s",
        "prefill_per_token_s",
        "prefill_per_ctx_s",
        "decode_base_s",
        "decode_per_seq_s",
        "decode_per_kv_s",
    )

    def __init__(
        self,
        prefill_base_s: float = 35.7e-3,
        prefill_per_seq_s: float = 0.21e-3,
        prefill_per_token_s: float = 0.2086e-3,
        prefill_per_ctx_s: float = 0.0,
        decode_base_s: float = 16.3e-3,
        decode_per_seq_s: float = 0.245e-3,
        decode_per_kv_s: float = 0.00202e-3,
    ) -> None:
        self.prefill_base_s = float(prefill_base_s)
        self.prefill_per_seq_s = float(prefill_per_seq_s)
        self.prefill_per_token_s = float(prefill_per_token_s)
        self.prefill_per_ctx_s = float(prefill_per_ctx_s)
        self.decode_base_s = float(decode_base_s)
        self.decode_per_seq_s = float(decode_per_seq_s)
        self.decode_per_kv_s = float(decode_per_kv_s)
        self.name = "affine:" + ",".join(f"{k}={getattr(self, k)!r}" for k in self.COEFFS)

    def batch_time(
        self, prefill_tokens: int, prefill_ctx_tokens: int, n_prefill: int, n_decode: int, decode_ctx_tokens: int
    ) -> float:
        if n_decode > 0:
            t = (
                self.decode_base_s
                + self.decode_per_seq_s * n_decode
                + self.decode_per_kv_s * (decode_ctx_tokens + n_decode)
            )
        else:
            t = 0.0
        if prefill_tokens > 0:
            t += (
                self.prefill_base_s
                + self.prefill_per_seq_s * n_prefill
                + self.prefill_per_token_s * prefill_tokens
                + self.prefill_per_ctx_s * prefill_ctx_tokens
            )
        return t

    def decode_times(self, n_decode: int, decode_ctx_tokens: np.ndarray) -> np.ndarray:
        ctx = np.asarray(decode_ctx_tokens, dtype=np.float64)
        if n_decode <= 0:
            return np.zeros(len(ctx))
        return self.decode_base_s + self.decode_per_seq_s * n_decode + self.decode_per_kv_s * (ctx + n_decode)


def attention_pairs(prefill_tokens: int, prefill_ctx_tokens: int, n_prefill: int, n_decode: int,
                    decode_ctx_tokens: int) -> float:
    """(query, key) pairs of an iteration's attention: each decode token attends to its context and
    itself; a prefill chunk of ``q`` tokens ending at context ``C`` attends causally to
    ``q*C - q*q/2 + q/2`` pairs, evaluated at the batch's mean chunk and context (only the sums
    reach the latency models)."""
    pairs: float = decode_ctx_tokens + n_decode
    if n_prefill > 0:
        pairs += (prefill_tokens * prefill_ctx_tokens - 0.5 * prefill_tokens * prefill_tokens) / n_prefill \
            + 0.5 * prefill_tokens
    return pairs


class RooflineLatency(LatencyModel):
    """Roofline estimate from a model and a GPU: ``max(compute, memory) + overhead_s``.

    * compute = FLOPs / (peak x ``mfu``), with FLOPs = ``2 * params`` per token computed
      (``prefill_tokens + n_decode``) plus ``4 * layers * heads * head_dim`` per
      (query, key) pair of attention. A decode token attends to its context and itself; a
      prefill chunk of ``q`` tokens ending at context ``C`` attends causally to
      ``q*C - q*q/2 + q/2`` pairs, evaluated at the mean chunk and context of the batch
      (only the sums reach the model).
    * memory = bytes / (HBM bandwidth x ``mbu``), with bytes = the weights (once per
      iteration) + the KV read (``prefill_ctx_tokens + decode_ctx_tokens`` tokens) + the KV
      written (one token per computed token), at ``kv_bytes_per_token`` each.

    Tensor parallelism (``GPUSpec.count`` > 1) multiplies peak and bandwidth; its all-reduce
    cost is left in ``overhead_s``. Activation traffic is ignored.

    The efficiency factors are ours, typical of vLLM-class engines: ``mfu`` 0.5 (large
    prefills reach 50-60 % of peak), ``mbu`` 0.8 (decode kernels stream weights at 75-85 % of
    HBM bandwidth), ``overhead_s`` 1.5 ms (scheduling, sampling, kernel launches per step).
    With them a Llama-2-7B / A100 decode step of batch 1 at short context takes ~9.8 ms.

    :param model: a :class:`ModelSpec` or a model name (``llama-2-7b``).
    :param gpu: a :class:`GPUSpec` or a GPU name (``a100``).
    """

    DEFAULTS = (0.5, 0.8, 1.5e-3)
    """``mfu``, ``mbu``, ``overhead_s`` (ours, see above)."""

    def __init__(
        self,
        model: str | ModelSpec,
        gpu: str | GPUSpec,
        mfu: float = DEFAULTS[0],
        mbu: float = DEFAULTS[1],
        overhead_s: float = DEFAULTS[2],
    ) -> None:
        self.model = get_model(model)
        self.gpu = get_gpu(gpu)
        self.mfu, self.mbu, self.overhead_s = float(mfu), float(mbu), float(overhead_s)
        if not (0.0 < self.mfu <= 1.0 and 0.0 < self.mbu <= 1.0 and self.overhead_s >= 0.0):
            raise ValueError(f"latency: roofline needs 0 < mfu, mbu <= 1 and overhead_s >= 0, got {self._args()}")
        flops_s = self.gpu.peak_flops * self.mfu
        bytes_s = self.gpu.hbm_bytes_s * self.mbu
        m = self.model
        self._s_per_token = 2.0 * m.params / flops_s
        self._s_per_pair = 4.0 * m.layers * m.heads * m.head_dim / flops_s
        self._s_weights = m.weight_bytes / bytes_s
        self._s_per_kv = m.kv_bytes_per_token / bytes_s
        pair = (m.name, self.gpu.name)
        self.name = next(
            (k for k, v in ROOFLINE_PRESETS.items() if v == pair), f"roofline:{m.name.lower()}/{self.gpu.name.lower()}"
        )
        if (self.mfu, self.mbu, self.overhead_s) != self.DEFAULTS:
            self.name += "," + self._args()

    def _args(self) -> str:
        return f"mfu={self.mfu!r},mbu={self.mbu!r},overhead_s={self.overhead_s!r}"

    def batch_time(
        self, prefill_tokens: int, prefill_ctx_tokens: int, n_prefill: int, n_decode: int, decode_ctx_tokens: int
    ) -> float:
        tokens = prefill_tokens + n_decode
        pairs = attention_pairs(prefill_tokens, prefill_ctx_tokens, n_prefill, n_decode, decode_ctx_tokens)
        compute = self._s_per_token * tokens + self._s_per_pair * pairs
        memory = self._s_weights + self._s_per_kv * (prefill_ctx_tokens + decode_ctx_tokens + tokens)
        return (compute if compute > memory else memory) + self.overhead_s

    def decode_times(self, n_decode: int, decode_ctx_tokens: np.ndarray) -> np.ndarray:
        ctx = np.asarray(decode_ctx_tokens, dtype=np.float64)
        compute = self._s_per_token * n_decode + self._s_per_pair * (ctx + n_decode)
        memory = self._s_weights + self._s_per_kv * (ctx + n_decode)
        return np.where(compute > memory, compute, memory) + self.overhead_s


ALLREDUCE_LATENCY_S = 10e-6
"""Fixed cost of one NCCL all-reduce (ours; small-message latency on NVLink is 5-15 us)."""


class SummedLatency(LatencyModel):
    """One iteration as its kernels run, one after another (as Vidur sums its operators):

        linear(prefill_tokens + n_decode)            projections, MLP, norms (:meth:`linear_time`)
      + max(attention FLOPs / (peak x mfu),          prefill pairs and decode context, counted as
            KV bytes / (HBM x mbu))                  :class:`RooflineLatency` counts them
      + 2 x layers x all-reduce(tokens x hidden)     tensor parallel only (NVLink ring)
      + overhead_s

    Subclasses give the linear part: :class:`~llmsched_gym.core.profile.ProfileLatency`
    (measured, ``vidur:GPU/MODEL``) and :class:`CalibratedLatency` (the roofline fitted to the
    same measurements, ``calibrated:MODEL/GPU``). ``decode_times`` equals ``batch_time`` bit
    for bit: the linear part and the all-reduce depend on ``n_decode`` only, so both paths
    compute them with the same scalar code, and the attention with the same operations.

    :param model: the model.
    :param gpu: the tensor-parallel group (``count`` GPUs sharing every operator).
    :param mfu: attention's fraction of peak FLOP/s.
    :param mbu: the KV read/write's fraction of HBM bandwidth.
    :param overhead_s: seconds added per iteration.
    """

    def __init__(self, model: ModelSpec, gpu: GPUSpec, mfu: float, mbu: float, overhead_s: float) -> None:
        self.mfu, self.mbu, self.overhead_s = float(mfu), float(mbu), float(overhead_s)
        if not (0.0 < self.mfu <= 1.0 and 0.0 < self.mbu <= 1.0 and self.overhead_s >= 0.0):
            raise ValueError(f"latency: {type(self).__name__} needs 0 < mfu, mbu <= 1 and overhead_s >= 0, got "
                             f"mfu={self.mfu}, mbu={self.mbu}, overhead_s={self.overhead_s}")
        m, k = model, gpu.count
        self._s_per_pair = 4.0 * m.layers * m.heads * m.head_dim / (gpu.peak_flops * self.mfu)
        self._s_per_kv = m.kv_bytes_per_token / (gpu.hbm_bytes_s * self.mbu)
        # Megatron tensor parallelism: two all-reduces of tokens x hidden activations per layer;
        # a ring moves 2 (k - 1) / k of the bytes over each GPU's link.
        if k > 1:
            link = (gpu.nvlink_gb_s or gpu.pcie_gb_s) * 1e9
            self._s_comm_fixed = 2.0 * m.layers * ALLREDUCE_LATENCY_S
            self._s_comm_per_token = 2.0 * m.layers * 2.0 * (k - 1) / k * m.hidden * m.dtype_bytes / link
        else:
            self._s_comm_fixed = self._s_comm_per_token = 0.0

    def linear_time(self, tokens: float) -> float:
        """The linear part for ``tokens`` tokens computed in the iteration (seconds)."""
        raise NotImplementedError

    def batch_time(
        self, prefill_tokens: int, prefill_ctx_tokens: int, n_prefill: int, n_decode: int, decode_ctx_tokens: int
    ) -> float:
        tokens = prefill_tokens + n_decode
        pairs = attention_pairs(prefill_tokens, prefill_ctx_tokens, n_prefill, n_decode, decode_ctx_tokens)
        compute = self._s_per_pair * pairs
        memory = self._s_per_kv * (prefill_ctx_tokens + decode_ctx_tokens + tokens)
        attn = compute if compute > memory else memory
        comm = self._s_comm_fixed + self._s_comm_per_token * tokens
        return self.linear_time(tokens) + attn + comm + self.overhead_s

    def decode_times(self, n_decode: int, decode_ctx_tokens: np.ndarray) -> np.ndarray:
        ctx = np.asarray(decode_ctx_tokens, dtype=np.float64)
        compute = self._s_per_pair * (ctx + n_decode)
        memory = self._s_per_kv * (ctx + n_decode)
        attn = np.where(compute > memory, compute, memory)
        comm = self._s_comm_fixed + self._s_comm_per_token * n_decode
        return self.linear_time(n_decode) + attn + comm + self.overhead_s


ROOFLINE_PRESETS: dict[str, tuple[str, str]] = {
    "roofline:llama-2-7b/a100": ("Llama-2-7B", "A100-80GB"),
    "roofline:llama-2-13b/a100": ("Llama-2-13B", "A100-80GB"),
    "roofline:llama-2-70b/2xa100": ("Llama-2-70B", "A100x2"),
    "roofline:llama-2-7b/a10g": ("Llama-2-7B", "A10G"),
    "roofline:llama-3-8b/a100": ("Llama-3-8B", "A100-80GB"),
    "roofline:llama-3-8b/h100": ("Llama-3-8B", "H100-SXM"),
    "roofline:llama-3-8b/h200": ("Llama-3-8B", "H200"),
    "roofline:llama-3.1-8b/h100": ("Llama-3.1-8B", "H100-SXM"),
    "roofline:llama-3.2-1b/h100": ("Llama-3.2-1B", "H100-SXM"),
}
"""Named roofline pairs for ``llmsched list``; any ``roofline:MODEL/GPU`` of known names works."""


@dataclass(frozen=True)
class CalibratedPreset:
    """A ``calibrated:MODEL/GPU`` preset: efficiencies fitted to a measured Vidur profile.

    :param model: model name.
    :param gpu: GPU name (a multi-GPU name is the tensor-parallel group).
    :param profile: the Vidur profile fitted (``vidur:GPU/MODEL``) at tensor-parallel degree ``tp``.
    :param mfu: fraction of peak FLOP/s, ``mbu`` of HBM bandwidth and ``overhead_s`` fixed seconds
        of the roofline fitted to the profile's linear part
        (:func:`llmsched_gym.core.profile.fit_roofline`); ``mfu`` is also attention's.
    :param stream_mbu: the profile's ``stream_mbu`` (:class:`~llmsched_gym.core.profile.LinearProfile`):
        the KV read/write's fraction of HBM bandwidth, as in the profile model.
    :param mape: mean absolute percentage error of the fitted linear part over the profile's
        1 to 8,192 tokens (a fraction); ``worst`` the largest, at ``worst_tokens`` tokens.
    :param note: where the efficiencies come from when not from this pair's own profile.
    """

    model: str
    gpu: str
    profile: str
    tp: int
    mfu: float
    mbu: float
    overhead_s: float
    stream_mbu: float
    mape: float
    worst: float
    worst_tokens: int
    note: str = ""

    def describe(self) -> str:
        fit = (f"MAPE {self.mape:.1%}, worst {self.worst:.0%} at {self.worst_tokens} tokens against {self.profile}"
               + (f" TP {self.tp}" if self.tp > 1 else ""))
        return (f"{self.model} on {self.gpu}: the profile model with a fitted linear part (roofline, mfu "
                f"{self.mfu:.3f}, mbu {self.mbu:.2f}, {self.overhead_s * 1e3:.2f} ms) + attention (KV at mbu "
                f"{self.stream_mbu:.2f})" + (" + all-reduce" if self.tp > 1 else "") + "; "
                + (f"{self.note}; on that profile: " if self.note else "linear part: ") + fit)


CALIBRATED_PRESETS: dict[str, CalibratedPreset] = {
    # fit_roofline and stream_mbu of Vidur's profiles (microsoft/vidur 7d47513,
    # data/profiling/compute); a test re-derives them when ../shared/profiles is present. mbu ends
    # at its bound 1: the decode floor cannot tell bandwidth from fixed cost, and the fit puts the
    # rest of it in overhead_s.
    "calibrated:llama-2-7b/a100": CalibratedPreset(
        "Llama-2-7B", "A100-80GB", "vidur:a100/llama-2-7b", 1, 0.6780, 1.0, 3.0764e-3, 0.7463, 0.0386, 0.333, 136),
    "calibrated:llama-2-70b/2xa100": CalibratedPreset(
        "Llama-2-70B", "A100x2", "vidur:a100/llama-2-70b", 2, 0.7148, 1.0, 2.3574e-2, 0.7933, 0.0386, 0.274, 1),
    "calibrated:llama-3-8b/a100": CalibratedPreset(
        "Llama-3-8B", "A100-80GB", "vidur:a100/llama-3-8b", 1, 0.7635, 1.0, 4.4450e-3, 0.7751, 0.0362, 0.270, 1),
    "calibrated:llama-2-7b/h100": CalibratedPreset(
        "Llama-2-7B", "H100-SXM", "vidur:h100/llama-2-7b", 1, 0.6773, 1.0, 3.3263e-3, 0.7745, 0.0567, 0.342, 2),
    "calibrated:llama-2-70b/2xh100": CalibratedPreset(
        "Llama-2-70B", "H100x2", "vidur:h100/llama-2-70b", 2, 0.6569, 1.0, 9.2892e-3, 0.8688, 0.0618, 0.323, 520),
    "calibrated:llama-2-7b/a40": CalibratedPreset(
        "Llama-2-7B", "A40", "vidur:a40/llama-2-7b", 1, 0.7350, 1.0, 1.0821e-2, 0.7999, 0.0388, 0.261, 1),
    "calibrated:llama-3.1-8b/h100": CalibratedPreset(
        "Llama-3.1-8B", "H100-SXM", "vidur:h100/llama-2-7b", 1, 0.6773, 1.0, 3.3263e-3, 0.7745, 0.0567, 0.342, 2,
        "efficiencies of Llama-2-7B on H100 (Vidur has no Llama-3 profile on H100)"),
}
"""``calibrated:MODEL/GPU``: the offline stand-in of the profile model ``vidur:GPU/MODEL``
(:class:`CalibratedLatency`), the same on every machine and with nothing to download."""


class CalibratedLatency(SummedLatency):
    """``calibrated:MODEL/GPU``: the profile model's form with the measured linear part replaced
    by the roofline fitted to it (:data:`CALIBRATED_PRESETS`):

    * linear part: :class:`RooflineLatency` with the preset's ``mfu``, ``mbu``, ``overhead_s`` at
      context 0, ``max(compute, weights) + overhead_s`` (within 3.6-6.2% MAPE of the measurements);
    * attention: FLOPs at the preset's ``mfu``, KV bytes at its ``stream_mbu``;
    * tensor-parallel all-reduce as in the profile model;

    summed (:class:`SummedLatency`), as :class:`~llmsched_gym.core.profile.ProfileLatency` sums them.

    :param name: a key of :data:`CALIBRATED_PRESETS`.
    """

    def __init__(self, name: str) -> None:
        key = "calibrated:" + name.strip().lower().removeprefix("calibrated:")
        p = CALIBRATED_PRESETS.get(key)
        if p is None:
            raise ValueError(f"latency: unknown calibrated preset {key!r}; allowed: {', '.join(CALIBRATED_PRESETS)}")
        self.preset = p
        self.roofline = RooflineLatency(p.model, p.gpu, p.mfu, p.mbu, p.overhead_s)
        super().__init__(self.roofline.model, self.roofline.gpu, p.mfu, p.stream_mbu, 0.0)
        self.name = key

    def linear_time(self, tokens: float) -> float:
        """The fitted roofline's time for ``tokens`` tokens at context 0 (seconds)."""
        return self.roofline.batch_time(0, 0, 0, tokens, 0)  # type: ignore[arg-type]


_NOTIFIED: set[str] = set()


def _calibrated_fallback(profile: str, tp: int) -> CalibratedLatency:
    """Stand-in for a Vidur profile no copy is found of: its ``calibrated:`` preset (the same
    form, with the roofline fitted to that profile as the linear part), said once per process on
    stderr (as a missing trace's synthetic stand-in is)."""
    for key, p in CALIBRATED_PRESETS.items():
        if p.profile == f"vidur:{profile.strip().lower()}" and p.tp == tp and not p.note:
            if profile not in _NOTIFIED:
                _NOTIFIED.add(profile)
                print(f"vidur:{profile}: measured profile not found, using {key} (the roofline fitted to it as "
                      f"the linear part, MAPE {p.mape:.1%}); `llmsched data download vidur:{profile}`",
                      file=sys.stderr)
            return CalibratedLatency(key)
    raise ValueError(f"latency: vidur:{profile},tp={tp}: mlp.csv not found and no calibrated preset stands in; "
                     f"`llmsched data download vidur:{profile}`")


# --------------------------------------------------------------------------------------------
# Measured profiles


PROFILE_COLUMNS = ("prefill_tokens", "prefill_ctx_tokens", "n_prefill", "n_decode", "decode_ctx_tokens", "time_s")
"""The profile CSV header the GPU backend writes: the ``batch_time`` inputs, then seconds."""

ProfileRow = tuple[int, int, int, int, int, float]


class _Curve:
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
        self._prefill = _Curve(prefill)
        self._n_lines = [float(n) for n in sorted(decode)]
        self._lines = [_Curve(decode[n]) for n in sorted(decode)]

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


# --------------------------------------------------------------------------------------------
# Fitting


def _shapes(rows: Iterable[Sequence[float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a = np.array([list(r) for r in rows], dtype=np.float64).reshape(-1, len(PROFILE_COLUMNS))
    p, nd = a[:, 0], a[:, 3]
    return a, a[(nd == 0) & (p > 0)], a[(p == 0) & (nd > 0)]


def _lstsq(columns: list[np.ndarray], y: np.ndarray) -> list[float]:
    """Least squares on the columns that add rank, in order; dropped columns get 0.

    A profile often leaves columns collinear (one request per prefill, no cached prefix);
    dropping them keeps the coefficients interpretable instead of splitting them.
    """
    kept: list[int] = []
    for j in range(len(columns)):
        trial = np.column_stack([columns[i] for i in [*kept, j]])
        if np.linalg.matrix_rank(trial) == len(kept) + 1:
            kept.append(j)
    sol = np.linalg.lstsq(np.column_stack([columns[i] for i in kept]), y, rcond=None)[0]
    coef = [0.0] * len(columns)
    for i, c in zip(kept, sol, strict=True):
        coef[i] = float(c)
    return coef


def fit_affine(rows: Iterable[Sequence[float]]) -> AffineLatency:
    """Least-squares :class:`AffineLatency` from profile rows (:data:`PROFILE_COLUMNS` order).

    Prefill-only rows fit the prefill part, decode-only rows the decode part; mixed rows are
    ignored. Coefficients a profile cannot identify (a constant or collinear column) are 0.
    """
    _, pre, dec = _shapes(rows)
    if len(pre) == 0 or len(dec) == 0:
        raise ValueError("latency: fit_affine needs prefill-only and decode-only rows")
    one_p, one_d = np.ones(len(pre)), np.ones(len(dec))
    p0, p_tok, p_seq, p_ctx = _lstsq([one_p, pre[:, 0], pre[:, 2], pre[:, 1]], pre[:, 5])
    d0, d_seq, d_kv = _lstsq([one_d, dec[:, 3], dec[:, 4] + dec[:, 3]], dec[:, 5])
    return AffineLatency(p0, p_seq, p_tok, p_ctx, d0, d_seq, d_kv)


def fit_linear(rows: Iterable[Sequence[float]]) -> LinearKVLatency:
    """Least-squares :class:`LinearKVLatency` (Ao et al. 2025's ``d0``, ``d1``) from all profile rows."""
    a, _, _ = _shapes(rows)
    if len(a) < 2:
        raise ValueError("latency: fit_linear needs at least 2 rows")
    d0, d1 = _lstsq([np.ones(len(a)), a[:, 1] + a[:, 4] + a[:, 3]], a[:, 5])
    return LinearKVLatency(d0, d1)


# --------------------------------------------------------------------------------------------
# Construction from a spec


def _kv_args(text: str, allowed: Sequence[str], kind: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in allowed:
            raise ValueError(f"latency: {kind} takes {', '.join(f'{a}=...' for a in allowed)}; got {item!r}")
        try:
            out[key] = float(value)
        except ValueError:
            raise ValueError(f"latency: {kind} {key}: expected a number, got {value.strip()!r}") from None
        if not math.isfinite(out[key]):
            raise ValueError(f"latency: {kind} {key}: expected a finite number, got {value.strip()!r}")
    return out


_ALLOWED = (
    "unit, linear[:d0=..,d1=..], piecewise[:c=..,a=..,b0=..], affine[:COEFF=..,...], "
    "roofline:MODEL/GPU[,mfu=..,mbu=..,overhead_s=..], calibrated:MODEL/GPU, vidur:GPU/MODEL[,tp=N], "
    "profile:PATH_OR_DIR[,tp=N], table:PATH, KIND:... of a plug-in (gpu), or a dict with 'type'"
)


def _from_dict(spec: Mapping[str, Any]) -> LatencyModel:
    args = dict(spec)
    kind = str(args.pop("type", ""))
    for key, value in args.items():  # a coefficient of 1e400 (inf) would turn every time into inf or nan
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"latency.{key}: expected a finite number, got {value!r}")
    try:
        if kind == "unit" and not args:
            return UnitLatency()
        if kind == "linear":
            return LinearKVLatency(**args)
        if kind == "piecewise":
            return PiecewiseLatency(**args)
        if kind == "affine":
            return AffineLatency(**args)
        if kind == "roofline":
            return RooflineLatency(**args)
        if kind == "table" and set(args) == {"path"}:
            return TableLatency.from_csv(args["path"])
        if kind in ("calibrated", "vidur", "profile") and "name" in args:
            opts = "".join(f",{k}={v}" for k, v in args.items() if k != "name")
            return make_latency(f"{kind}:{args['name']}{opts}")
    except TypeError as e:
        raise ValueError(f"latency: bad arguments for {kind!r}: {e}") from None
    raise ValueError(f"latency: unknown model {dict(spec)!r}; allowed: {_ALLOWED}")


LatencyFactory = Callable[[str], LatencyModel]

LATENCY_PLUGINS: dict[str, tuple[LatencyFactory, str]] = {}
"""Spec kinds that plug-ins add (``gpu`` from :mod:`llmsched_gym.backends.gpu`): kind ->
(factory called with the text after ``KIND:``, a one-line description for ``llmsched list``)."""


def register_latency(kind: str, factory: LatencyFactory, description: str) -> None:
    """Let ``make_latency("KIND:ARGS")`` build a plug-in's model: ``factory("ARGS")``.

    Core modules import no plug-in; a plug-in registers its kinds when its package is imported
    (``llmsched_gym`` imports its bundled back-ends).
    """
    LATENCY_PLUGINS[kind.lower()] = (factory, description)


def make_latency(spec: str | Mapping[str, Any] | LatencyModel) -> LatencyModel:
    """Build a latency model from a spec string, a dict, or pass an instance through.

    Strings (case-insensitive except the path)::

        unit
        linear                                  linear:d0=0.01,d1=2.6e-7
        piecewise                               piecewise:c=0.01,a=8.6e-5,b0=96
        affine                                  affine:decode_base_s=0.02,decode_per_kv_s=1e-6
        roofline:llama-2-7b/a100                roofline:llama-3-8b/h100,mfu=0.6,overhead_s=0.002
        llama-2-7b/a100                         (same as roofline:llama-2-7b/a100)
        calibrated:llama-2-7b/a100              (vidur:a100/llama-2-7b's form, offline: the roofline
                                                 fitted to its measurements as the linear part)
        vidur:a100/llama-2-7b                   vidur:a100/llama-2-70b,tp=2
        profile:PATH/mlp.csv                    profile:PATH_DIR,tp=2,gpu=a100,overhead_s=0.001
        table:runs/profile/a100.csv
        gpu:llama-3-8b                          (a plug-in: times each batch on the local GPU; needs torch)

    Omitted keys keep the class defaults. Dicts use ``{"type": "linear", "d0": 0.01}``,
    ``{"type": "roofline", "model": "llama-3-8b", "gpu": "h100", "mfu": 0.6}``,
    ``{"type": "table", "path": ...}``. Every model's ``name`` is a spec that rebuilds it.
    """
    if isinstance(spec, LatencyModel):
        return spec
    if isinstance(spec, Mapping):
        return _from_dict(spec)
    if not isinstance(spec, str):
        raise ValueError(f"latency: expected a spec string, dict or LatencyModel, got {type(spec).__name__}")
    kind, _, rest = spec.strip().partition(":")
    kind = kind.lower()
    if kind == "table" and rest:
        return TableLatency.from_csv(rest)
    if kind in LATENCY_PLUGINS and rest:
        return LATENCY_PLUGINS[kind][0](rest.strip())
    if kind in ("profile", "vidur") and rest:
        from llmsched_gym.core.profile import load_profile_model

        return load_profile_model(kind, rest.strip(), _calibrated_fallback)
    if kind == "calibrated" and rest:
        return CalibratedLatency(rest)
    if kind == "unit" and not rest:
        return UnitLatency()
    if kind == "linear":
        return LinearKVLatency(**_kv_args(rest, ("d0", "d1"), kind))
    if kind == "piecewise":
        return PiecewiseLatency(**_kv_args(rest, ("c", "a", "b0"), kind))
    if kind == "affine":
        return AffineLatency(**_kv_args(rest, AffineLatency.COEFFS, kind))
    if kind == "roofline" or ("/" in kind and not rest):
        pair, _, opts = (rest if kind == "roofline" else kind).partition(",")
        model, slash, gpu = pair.strip().partition("/")
        if slash and model and gpu:
            return RooflineLatency(model, gpu, **_kv_args(opts, ("mfu", "mbu", "overhead_s"), "roofline"))
    raise ValueError(f"latency: unknown model {spec!r}; allowed: {_ALLOWED}")


def list_latency_presets() -> dict[str, str]:
    """Named latency specs with a one-line description each (for ``llmsched list``)."""
    presets = {
        "unit": "every iteration takes 1 round (theory papers)",
        "linear": "d0 + d1 x KV tokens in the batch, d0=10 ms, d1=2.6e-7 s (Ao et al. 2025, Eq. 1; our estimate)",
        "piecewise": "flat 9.8 ms up to 96 tokens, then 86 us/token (Li et al. 2025 form; ours)",
        "affine": "separate prefill and decode fits, A10G / Llama-2-7B (Sheng et al. 2024's profile)",
    }
    for name, (model, gpu) in ROOFLINE_PRESETS.items():
        presets[name] = f"roofline, {model} on {gpu} (mfu 0.5, mbu 0.8, 1.5 ms overhead; ours)"
    for name, p in CALIBRATED_PRESETS.items():
        presets[name] = p.describe()
    presets["vidur:GPU/MODEL[,tp=N]"] = (
        "measured linear part (Vidur's profiles: GPU a100, h100, a40; MODEL llama-2-7b, llama-2-70b, llama-3-8b) "
        "+ attention and all-reduce from FLOPs and bytes; stands in with calibrated:MODEL/GPU when not found")
    presets["profile:PATH_OR_DIR[,tp=N]"] = "the same from a Vidur-format mlp.csv (or its folder)"
    presets["table:PATH"] = "interpolate a measured profile CSV (" + ",".join(PROFILE_COLUMNS) + ")"
    for kind, (_, description) in LATENCY_PLUGINS.items():
        presets[f"{kind}:..."] = description
    return presets
