"""Models from a model's and a GPU's specifications: the ``roofline`` and the kernel-by-kernel
sum (:class:`SummedLatency`) that the profile and calibrated models share."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmsched_gym.core.latency.base import LatencyModel, kv_args, register_latency
from llmsched_gym.core.models import GPUSpec, ModelSpec, get_gpu, get_model

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
        self.model, self.gpu = model, gpu  # what it serves (the KV transfer of a disaggregated cluster reads them)
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



def _roofline(rest: str) -> RooflineLatency | None:
    pair, _, opts = rest.partition(",")
    model, slash, gpu = pair.strip().partition("/")
    if not (slash and model and gpu):
        return None
    return RooflineLatency(model, gpu, **kv_args(opts, ("mfu", "mbu", "overhead_s"), "roofline"))


def _roofline_dict(args: dict[str, Any]) -> RooflineLatency:
    return RooflineLatency(**args)


register_latency("roofline", _roofline, "", from_dict=_roofline_dict, listing={
    name: f"roofline, {model} on {gpu} (mfu 0.5, mbu 0.8, 1.5 ms overhead; ours)"
    for name, (model, gpu) in ROOFLINE_PRESETS.items()})
