"""Model and GPU specifications: KV bytes per token, KV capacity, and the roofline's inputs.

Architecture numbers are the models' published configs (Hugging Face ``config.json``); GPU
numbers are the vendors' datasheets (dense bf16 tensor throughput, HBM bandwidth, nominal PCIe
x16 bandwidth per direction). ``memory_gb`` is the memory ``nvidia-smi`` reports, in GiB
(2**30 bytes), which is what an inference engine can allocate from.

KV capacity in tokens (what the engine's ``kv_capacity`` means)::

    usable_bytes = mem_util * count * memory_gb * 2**30          # the engine's share of HBM
                   - params * dtype_bytes                        # weights (split across TP ranks)
                   - count * activation_reserve_gb * 2**30       # activations, CUDA graphs, workspace
    capacity     = floor(usable_bytes / kv_bytes_per_token), rounded down to whole blocks

This is the vLLM recipe (``gpu_memory_utilization`` minus weights minus the profiled peak
activation memory). The 2 GiB activation reserve per GPU is ours; with it the formula gives
117,648 tokens for Llama-2-7B on an A100-80GB, within 1 % of the 118,784 that Vidur sets.
Where a paper fixed a capacity, :func:`preset_capacity_tokens` returns the paper's number
instead (see :data:`REFERENCE_CAPACITY_TOKENS`).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, as far as memory and FLOPs are concerned.

    :param name: canonical name, e.g. ``"Llama-2-7B"``.
    :param layers: transformer blocks.
    :param hidden: model width.
    :param heads: query heads.
    :param kv_heads: key/value heads (fewer than ``heads`` under GQA).
    :param head_dim: width of one head.
    :param ffn: MLP intermediate width.
    :param params: parameter count (embeddings and LM head included).
    :param dtype_bytes: bytes per weight and per KV element (2 for fp16/bf16).
    :param vocab: vocabulary size; ``rope_theta`` the RoPE base; ``tie_embeddings`` whether the LM
        head reuses the embedding matrix (Llama-3.2-1B). Only the real-GPU executor
        (:mod:`llmsched_gym.backends.gpu`) builds the model from them; ``params`` is the published count.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    params: float
    dtype_bytes: int = 2
    vocab: int = 32000
    rope_theta: float = 10000.0
    tie_embeddings: bool = False

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer and KV head: ``2 * layers * kv_heads * head_dim * dtype_bytes``."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes


@dataclass(frozen=True)
class GPUSpec:
    """One GPU, or ``count`` identical GPUs used as one tensor-parallel group.

    Per-GPU numbers are stored; the totals are properties.

    :param name: canonical name, e.g. ``"A100-80GB"``.
    :param memory_gb: HBM per GPU in GiB, as ``nvidia-smi`` reports it.
    :param tflops: dense bf16 tensor-core peak per GPU, TFLOP/s.
    :param hbm_tb_s: HBM bandwidth per GPU, TB/s (10**12 bytes/s).
    :param count: GPUs in the tensor-parallel group.
    :param pcie_gb_s: host link per GPU, GB/s per direction (nominal; used for swap cost).
    :param nvlink_gb_s: GPU-to-GPU link per GPU, GB/s per direction (0: none, PCIe is used);
        the tensor-parallel all-reduce cost of the profile model.
    """

    name: str
    memory_gb: float
    tflops: float
    hbm_tb_s: float
    count: int = 1
    pcie_gb_s: float = 32.0
    nvlink_gb_s: float = 0.0

    @property
    def memory_bytes(self) -> float:
        return self.count * self.memory_gb * GIB

    @property
    def peak_flops(self) -> float:
        return self.count * self.tflops * 1e12

    @property
    def hbm_bytes_s(self) -> float:
        return self.count * self.hbm_tb_s * 1e12


MODELS: dict[str, ModelSpec] = {
    m.name.lower(): m
    for m in (
        ModelSpec("Llama-2-7B", layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128, ffn=11008, params=6.738e9),
        ModelSpec("Llama-2-13B", layers=40, hidden=5120, heads=40, kv_heads=40, head_dim=128, ffn=13824, params=13.016e9),
        ModelSpec("Llama-2-70B", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28672, params=68.977e9),
        ModelSpec("Llama-3-8B", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336, params=8.030e9,
                  vocab=128256, rope_theta=500000.0),
        ModelSpec("Llama-3.1-8B", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336, params=8.030e9,
                  vocab=128256, rope_theta=500000.0),
        # Qwen3-32B (Qwen team 2025, its published config.json): the model of llm-d's prefix-cache benchmark
        ModelSpec("Qwen3-32B", layers=64, hidden=5120, heads=64, kv_heads=8, head_dim=128, ffn=25600, params=32.76e9,
                  vocab=151936, rope_theta=1000000.0),
        ModelSpec("Llama-3.2-1B", layers=16, hidden=2048, heads=32, kv_heads=8, head_dim=64, ffn=8192, params=1.236e9,
                  vocab=128256, rope_theta=500000.0, tie_embeddings=True),
    )
}

GPUS: dict[str, GPUSpec] = {
    g.name.lower(): g
    for g in (
        GPUSpec("A100-80GB", memory_gb=80.0, tflops=312.0, hbm_tb_s=2.039, pcie_gb_s=32.0, nvlink_gb_s=300.0),
        GPUSpec("A100x2", memory_gb=80.0, tflops=312.0, hbm_tb_s=2.039, count=2, pcie_gb_s=32.0, nvlink_gb_s=300.0),
        GPUSpec("H100-SXM", memory_gb=79.6, tflops=989.0, hbm_tb_s=3.35, pcie_gb_s=64.0, nvlink_gb_s=450.0),
        GPUSpec("H100x2", memory_gb=79.6, tflops=989.0, hbm_tb_s=3.35, count=2, pcie_gb_s=64.0, nvlink_gb_s=450.0),
        GPUSpec("H200", memory_gb=140.4, tflops=989.0, hbm_tb_s=4.8, pcie_gb_s=64.0, nvlink_gb_s=450.0),
        GPUSpec("A40", memory_gb=44.99, tflops=149.7, hbm_tb_s=0.696, pcie_gb_s=32.0, nvlink_gb_s=56.25),
        GPUSpec("A10G", memory_gb=22.5, tflops=125.0, hbm_tb_s=0.6, pcie_gb_s=32.0),
        GPUSpec("L20", memory_gb=45.0, tflops=119.5, hbm_tb_s=0.864, pcie_gb_s=32.0),
    )
}

GPU_ALIASES: dict[str, str] = {"a100": "a100-80gb", "2xa100": "a100x2", "h100": "h100-sxm", "2xh100": "h100x2"}
"""Short names accepted wherever a GPU name is (``roofline:llama-2-7b/a100``)."""

REFERENCE_CAPACITY_TOKENS: dict[tuple[str, str], int] = {
    # Vidur's setting in Ao et al. 2025's experiments: 7,424 blocks of 16 tokens.
    ("llama-2-7b", "a100-80gb"): 118_784,
    # Jaillet et al. 2025's M (section 7). Its own formula gives a different number; kept as used, for reproduction.
    ("llama-2-70b", "a100x2"): 16_492,
}
"""Capacities the papers used, keyed by lower-case (model, GPU); they win over the formula."""


def get_model(model: str | ModelSpec) -> ModelSpec:
    """The :class:`ModelSpec` named ``model`` (case-insensitive); a spec passes through."""
    if isinstance(model, ModelSpec):
        return model
    spec = MODELS.get(model.lower())
    if spec is None:
        raise ValueError(f"model: unknown {model!r}; allowed: {', '.join(m.name for m in MODELS.values())}")
    return spec


def get_gpu(gpu: str | GPUSpec) -> GPUSpec:
    """The :class:`GPUSpec` named ``gpu`` (case-insensitive, aliases in :data:`GPU_ALIASES`)."""
    if isinstance(gpu, GPUSpec):
        return gpu
    key = gpu.lower()
    spec = GPUS.get(GPU_ALIASES.get(key, key))
    if spec is None:
        allowed = [g.name for g in GPUS.values()] + list(GPU_ALIASES)
        raise ValueError(f"gpu: unknown {gpu!r}; allowed: {', '.join(allowed)}")
    return spec


def kv_capacity_tokens(
    model: str | ModelSpec,
    gpu: str | GPUSpec,
    mem_util: float = 0.9,
    activation_reserve_gb: float = 2.0,
    block_size: int = 16,
) -> int:
    """KV capacity in tokens from memory minus weights (formula in the module docstring).

    :param mem_util: share of HBM the engine may use (vLLM's ``gpu_memory_utilization``).
    :param activation_reserve_gb: GiB per GPU kept for activations and workspace (ours).
    :param block_size: the result is rounded down to whole blocks of this many tokens.
    :raises ValueError: when the weights and reserve do not fit.
    """
    m, g = get_model(model), get_gpu(gpu)
    usable = mem_util * g.memory_bytes - m.weight_bytes - g.count * activation_reserve_gb * GIB
    if usable <= 0:
        raise ValueError(f"capacity: {m.name} does not fit on {g.name} at mem_util={mem_util}")
    tokens = int(usable // m.kv_bytes_per_token)
    return tokens - tokens % block_size


def preset_capacity_tokens(model: str | ModelSpec, gpu: str | GPUSpec) -> int:
    """The papers' capacity for this pair if one is recorded, else :func:`kv_capacity_tokens`."""
    m, g = get_model(model), get_gpu(gpu)
    ref = REFERENCE_CAPACITY_TOKENS.get((m.name.lower(), g.name.lower()))
    return ref if ref is not None else kv_capacity_tokens(m, g)
