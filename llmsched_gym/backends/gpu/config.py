"""Llama-architecture model shapes for the real-GPU executor (no weights, no tokenizer).

The shapes are :data:`llmsched_gym.core.models.MODELS`' (the models' published configs, Hugging Face
``config.json``), the same numbers the roofline and KV-capacity formulas use. ``tiny`` is a toy shape
for CPU tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmsched_gym.core.models import MODELS, ModelSpec


@dataclass(frozen=True)
class LlamaConfig:
    """Shape of a Llama decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU MLP).

    :param name: preset name.
    :param n_layers: decoder layers.
    :param hidden: model width.
    :param n_heads: query heads.
    :param n_kv_heads: key/value heads (fewer than ``n_heads`` means GQA).
    :param head_dim: width of one head.
    :param ffn: SwiGLU intermediate width.
    :param vocab: vocabulary size.
    :param rope_theta: RoPE base.
    :param tie_embeddings: the LM head reuses the embedding matrix (Llama-3.2-1B).
    """

    name: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_theta: float = 10000.0
    tie_embeddings: bool = False

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> LlamaConfig:
        """The executor's shape of a :class:`~llmsched_gym.core.models.ModelSpec` (named in lower case)."""
        return cls(spec.name.lower(), spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.head_dim, spec.ffn,
                   spec.vocab, rope_theta=spec.rope_theta, tie_embeddings=spec.tie_embeddings)

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """K and V bytes one token occupies over all layers."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * dtype_bytes

    def layer_params(self) -> int:
        """Parameters of one decoder layer (projections, MLP, two norms)."""
        qkv = self.hidden * (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
        out = self.n_heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.ffn
        return qkv + out + mlp + 2 * self.hidden

    def n_params(self) -> int:
        """All parameters (embedding counted once when tied)."""
        head = 0 if self.tie_embeddings else self.vocab * self.hidden
        return self.n_layers * self.layer_params() + self.vocab * self.hidden + head + self.hidden

    def decode_weight_bytes(self, dtype_bytes: int = 2) -> int:
        """Weight bytes one decode step must read: every layer, the final norm and the LM head
        (the embedding lookup reads only the batch's rows, so it is left out)."""
        return (self.n_layers * self.layer_params() + self.vocab * self.hidden + self.hidden) * dtype_bytes


PRESETS: dict[str, LlamaConfig] = {
    c.name: c
    for c in (
        *(LlamaConfig.from_spec(MODELS[name]) for name in ("llama-2-7b", "llama-3-8b", "llama-3.2-1b")),
        LlamaConfig("tiny", 2, 128, 4, 2, 32, 256, 1000),
    )
}


def get_config(name: str) -> LlamaConfig:
    """The preset called ``name``; a one-line ``ValueError`` lists the allowed names otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"gpu model: unknown name {name!r}; allowed: {', '.join(PRESETS)}") from None
