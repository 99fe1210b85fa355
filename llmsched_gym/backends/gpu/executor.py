"""A Llama decoder with a paged KV cache that executes one engine iteration per forward pass.

The point is realistic *cost*, not text: weights are random (``randn * 0.02``), token ids are
random, and nothing is downloaded. Each call to :meth:`LlamaExecutor.execute` runs the batch the
engine formed, prefill chunks and decode tokens of different requests packed into one token
sequence, through every layer, and returns the time it took.

KV memory is paged as in vLLM: one K pool and one V pool per layer, each shaped
``[num_blocks, block_size, kv_heads, head_dim]``; a request owns a block table (list of block
ids); token ``p`` of a request lives in slot ``table[p // block_size] * block_size + p %
block_size``. New tokens' K/V are scattered into their slots, and attention gathers each
request's K/V from the pool (a production engine reads the blocks in place inside a fused
paged-attention kernel; see README.md).

Attention: prefill chunks run one ``scaled_dot_product_attention`` call each (causal, offset by
the request's context before the chunk); decode tokens run as padded, masked calls over
groups of requests sorted by context (each group's gathered K/V bounded by ``decode_chunk_tokens``),
with the query heads of a KV group laid out as query rows so GQA needs no K/V copies.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from llmsched_gym.backends.gpu.config import LlamaConfig

if TYPE_CHECKING:
    import torch

PrefillEntry = tuple[int, int, int]
"""``(request_id, n_new_tokens, ctx_before)``."""
DecodeEntry = tuple[int, int]
"""``(request_id, ctx_before)``."""


class KVPoolExhausted(RuntimeError):
    """The batch needs more KV blocks than the pool has free."""


@dataclass
class _Batch:
    """Device-side metadata of one packed batch (prefill tokens first, then decode tokens)."""

    token_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    write_slots: torch.Tensor  # [T]
    prefill: list[tuple[int, int, torch.Tensor, torch.Tensor | None]]  # start, n, key slots, mask
    n_prefill_tokens: int
    decode: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # per chunk: rows [b], key slots [b, L], mask
    logit_rows: torch.Tensor  # rows whose next token is sampled


class LlamaExecutor:
    """Random-weight Llama decoder plus paged KV cache; times one engine iteration per call.

    :param config: model shape.
    :param device: ``"cuda"`` or ``"cpu"``; bf16 on CUDA, float32 on CPU.
    :param block_size: tokens per KV block.
    :param num_blocks: KV pool size; ``None`` sizes it as :meth:`kv_capacity_blocks` says.
    :param kv_budget_bytes: KV budget on CPU (no device memory to measure there).
    :param gpu_memory_utilization: fraction of device memory the weights, activations and KV pool
        may use together (vLLM's knob of the same name).
    :param max_batch_tokens: largest batch (tokens) the activation peak is measured for.
    :param decode_chunk_tokens: decode attention runs in chunks of requests (sorted by context) whose
        padded gathered K/V covers at most this many token slots, so a large decode batch with long
        contexts cannot exhaust the memory left beside the KV pool; the chunk's gather is added to
        the measured activation peak.
    :param seed: seeds weights, pool contents and token ids.
    """

    def __init__(
        self,
        config: LlamaConfig,
        device: str = "cuda",
        block_size: int = 16,
        num_blocks: int | None = None,
        kv_budget_bytes: int = 256 * 2**20,
        gpu_memory_utilization: float = 0.9,
        max_batch_tokens: int = 4096,
        decode_chunk_tokens: int = 32768,
        seed: int = 0,
    ) -> None:
        import torch

        self.config = config
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        self.dtype = torch.bfloat16 if self.is_cuda else torch.float32
        self.block_size = block_size
        self.max_batch_tokens = max_batch_tokens
        self.decode_chunk_tokens = decode_chunk_tokens
        self.gpu_memory_utilization = gpu_memory_utilization
        self.kv_budget_bytes = kv_budget_bytes
        self._gen = torch.Generator(device=self.device).manual_seed(seed)
        self._init_weights()
        self._capacity = self._measure_capacity_blocks()
        self.num_blocks = self._capacity if num_blocks is None else num_blocks
        self.k_pool, self.v_pool = self._new_pool(self.num_blocks)
        self.free_blocks: list[int] = list(range(self.num_blocks - 1, -1, -1))
        self.block_tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}
        self._warm_up()

    # ------------------------------------------------------------------ weights and memory
    def _randn(self, *shape: int) -> torch.Tensor:
        import torch

        w = torch.randn(*shape, generator=self._gen, device=self.device, dtype=self.dtype)
        return w.mul_(0.02)

    def _init_weights(self) -> None:
        import torch

        c = self.config
        qkv_out = (c.n_heads + 2 * c.n_kv_heads) * c.head_dim
        self.embed = self._randn(c.vocab, c.hidden)
        self.lm_head = self.embed.T if c.tie_embeddings else self._randn(c.hidden, c.vocab)
        ones = torch.ones(c.hidden, device=self.device, dtype=self.dtype)
        self.final_norm = ones
        self.layers = [
            {
                "attn_norm": ones.clone(),
                "wqkv": self._randn(c.hidden, qkv_out),
                "wo": self._randn(c.n_heads * c.head_dim, c.hidden),
                "mlp_norm": ones.clone(),
                "w_gate_up": self._randn(c.hidden, 2 * c.ffn),
                "w_down": self._randn(c.ffn, c.hidden),
            }
            for _ in range(c.n_layers)
        ]
        half = c.head_dim // 2
        exponent = torch.arange(half, device=self.device, dtype=torch.float32) / half
        self.inv_freq = 1.0 / (c.rope_theta**exponent)

    def block_bytes(self) -> int:
        """Bytes of one KV block over all layers (K and V)."""
        return self.block_size * self.config.kv_bytes_per_token(self.dtype.itemsize)

    def _new_pool(self, num_blocks: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-layer K and V pools, filled with random values so never-computed context (cached
        prefixes, synthetic profiling context) is realistic data rather than zeros."""
        import torch

        c = self.config
        shape = (num_blocks, self.block_size, c.n_kv_heads, c.head_dim)

        def pool() -> torch.Tensor:
            return torch.empty(shape, device=self.device, dtype=self.dtype).normal_(generator=self._gen)

        return [pool() for _ in range(c.n_layers)], [pool() for _ in range(c.n_layers)]

    def _measure_capacity_blocks(self) -> int:
        """KV blocks that fit beside the weights and the activation peak of a
        ``max_batch_tokens`` prefill (measured on CUDA; ``kv_budget_bytes`` on CPU)."""
        if not self.is_cuda:
            return max(1, self.kv_budget_bytes // self.block_bytes())
        import torch

        self.num_blocks = -(-self.max_batch_tokens // self.block_size)
        self.k_pool, self.v_pool = self._new_pool(self.num_blocks)
        self.free_blocks = list(range(self.num_blocks))
        self.block_tables, self.lengths = {}, {}
        torch.cuda.synchronize(self.device)
        before = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.execute([(-1, self.max_batch_tokens, 0)], [])
        # plus one decode chunk's gathered K and V (the gather is not in the prefill probe)
        gather = 2 * self.decode_chunk_tokens * self.config.n_kv_heads * self.config.head_dim * self.dtype.itemsize
        activation_peak = torch.cuda.max_memory_allocated(self.device) - before + gather
        del self.k_pool, self.v_pool
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        budget = total * self.gpu_memory_utilization - (total - free) - activation_peak
        self.activation_peak_bytes = activation_peak
        return max(1, int(budget // self.block_bytes()))

    def kv_capacity_blocks(self) -> int:
        """Blocks that fit after weights and the measured activation peak (CUDA), or in the
        configured ``kv_budget_bytes`` (CPU). The pool holds ``num_blocks`` of them."""
        return self._capacity

    def _warm_up(self) -> None:
        """Run a few small mixed batches so lazy initialisation stays out of the timings."""
        n_prefill = min(256, self.max_batch_tokens, self.block_size * max(1, self.num_blocks // 4))
        ctx = min(128, self.block_size * max(1, self.num_blocks // 16))
        for _ in range(3):
            self.execute([(-1, n_prefill, 0)], [(-2 - i, ctx) for i in range(4)])
            for rid in (-1, -2, -3, -4, -5):
                self.release(rid)

    # ------------------------------------------------------------------ block management
    def _reserve(self, rid: int, n_tokens: int) -> list[int]:
        """Grow ``rid``'s block table to cover ``n_tokens`` tokens; return the table."""
        table = self.block_tables.setdefault(rid, [])
        need = -(-n_tokens // self.block_size) - len(table)
        if need > len(self.free_blocks):
            raise KVPoolExhausted(
                f"KV pool exhausted: request {rid} needs {need} more blocks, {len(self.free_blocks)} "
                f"of {self.num_blocks} free"
            )
        for _ in range(need):
            table.append(self.free_blocks.pop())
        return table

    def _slots(self, table: list[int], start: int, stop: int) -> np.ndarray:
        pos = np.arange(start, stop)
        return (
            np.asarray(table, dtype=np.int64)[pos // self.block_size] * self.block_size
            + pos % self.block_size
        )

    def release(self, rid: int) -> None:
        """Free ``rid``'s KV blocks (completion or preemption); unknown ids are ignored."""
        self.free_blocks.extend(reversed(self.block_tables.pop(rid, [])))
        self.lengths.pop(rid, None)

    def n_free_blocks(self) -> int:
        """Blocks not owned by any request."""
        return len(self.free_blocks)

    # ------------------------------------------------------------------ batch preparation
    def _decode_chunks(self, lengths: list[int]) -> list[list[int]]:
        """Decode rows grouped for attention: sorted by length (less padding), each group's
        ``rows x longest`` within ``decode_chunk_tokens`` (a single longer row gets its own)."""
        chunks: list[list[int]] = []
        for i in sorted(range(len(lengths)), key=lengths.__getitem__):
            if chunks and (len(chunks[-1]) + 1) * lengths[i] <= self.decode_chunk_tokens:
                chunks[-1].append(i)
            else:
                chunks.append([i])
        return chunks

    def _prepare(self, prefill: list[PrefillEntry], decode: list[DecodeEntry]) -> _Batch:
        """Allocate KV for the batch and build its metadata on the host.

        A request seen for the first time with ``ctx_before > 0`` (a prefix-cache hit, or a log
        that starts mid-request) gets blocks for that context, holding pool values nobody
        computed: the cost of attending to them is the same.
        """
        import torch

        positions, slots, logit_rows = [], [], []
        prefill_meta: list[tuple[int, int, np.ndarray, np.ndarray | None]] = []
        start = 0
        for rid, n, ctx in prefill:
            table = self._reserve(rid, ctx + n)
            self.lengths[rid] = ctx + n
            positions.append(np.arange(ctx, ctx + n))
            slots.append(self._slots(table, ctx, ctx + n))
            mask = None
            if ctx:
                mask = np.arange(ctx + n)[None, :] <= np.arange(ctx, ctx + n)[:, None]
            prefill_meta.append((start, n, self._slots(table, 0, ctx + n), mask))
            start += n
            logit_rows.append(start - 1)
        n_prefill_tokens = start
        tables = []
        for rid, ctx in decode:
            table = self._reserve(rid, ctx + 1)
            self.lengths[rid] = ctx + 1
            tables.append(table)
            positions.append(np.array([ctx]))
            slots.append(self._slots(table, ctx, ctx + 1))
        decode_chunks = []
        for rows in self._decode_chunks([ctx + 1 for _, ctx in decode]):
            max_len = decode[rows[-1]][1] + 1
            key_slots = np.zeros((len(rows), max_len), dtype=np.int64)
            mask = np.zeros((len(rows), max_len), dtype=bool)
            for j, i in enumerate(rows):
                n = decode[i][1] + 1
                key_slots[j, :n] = self._slots(tables[i], 0, n)
                mask[j, :n] = True
            decode_chunks.append((
                torch.from_numpy(np.asarray(rows, dtype=np.int64) + n_prefill_tokens),
                torch.from_numpy(key_slots),
                torch.from_numpy(mask)[:, None, None, :],
            ))
        logit_rows.extend(range(n_prefill_tokens, n_prefill_tokens + len(decode)))
        n_tokens = n_prefill_tokens + len(decode)
        return _Batch(
            token_ids=torch.randint(self.config.vocab, (n_tokens,), generator=self._gen, device=self.device),
            positions=torch.from_numpy(np.concatenate(positions)),
            write_slots=torch.from_numpy(np.concatenate(slots)),
            prefill=[
                (s, n, torch.from_numpy(k), None if m is None else torch.from_numpy(m))
                for s, n, k, m in prefill_meta
            ],
            n_prefill_tokens=n_prefill_tokens,
            decode=decode_chunks,
            logit_rows=torch.tensor(logit_rows, dtype=torch.int64),
        )

    def _to_device(self, b: _Batch) -> _Batch:
        """Copy the batch metadata to the device (part of every iteration's cost)."""

        def dev(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(self.device, non_blocking=True)

        return _Batch(
            token_ids=b.token_ids,
            positions=dev(b.positions),
            write_slots=dev(b.write_slots),
            prefill=[(s, n, dev(k), dev(m)) for s, n, k, m in b.prefill],
            n_prefill_tokens=b.n_prefill_tokens,
            decode=[(dev(r), dev(k), dev(m)) for r, k, m in b.decode],
            logit_rows=dev(b.logit_rows),
        )

    # ------------------------------------------------------------------ the forward pass
    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate-half RoPE on ``x`` shaped [T, heads, head_dim]."""
        import torch

        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def _attention(self, q: torch.Tensor, layer: int, b: _Batch) -> torch.Tensor:
        """Attention of the packed queries ``q`` [T, heads, head_dim] over each request's K/V
        gathered from the pool; returns [T, heads * head_dim]."""
        import torch
        import torch.nn.functional as F

        c = self.config
        group = c.n_heads // c.n_kv_heads
        k_flat = self.k_pool[layer].view(-1, c.n_kv_heads, c.head_dim)
        v_flat = self.v_pool[layer].view(-1, c.n_kv_heads, c.head_dim)
        out = torch.empty_like(q)
        for start, n, key_slots, mask in b.prefill:
            # 4-D inputs: the fused CUDA kernels (flash, memory-efficient) take nothing else
            k = k_flat.index_select(0, key_slots).transpose(0, 1).repeat_interleave(group, dim=0)[None]
            v = v_flat.index_select(0, key_slots).transpose(0, 1).repeat_interleave(group, dim=0)[None]
            qi = q[start : start + n].transpose(0, 1)[None]
            o = F.scaled_dot_product_attention(qi, k, v, attn_mask=mask, is_causal=mask is None)
            out[start : start + n] = o[0].transpose(0, 1)
        for rows, key_slots, mask in b.decode:
            n_dec, max_len = key_slots.shape
            flat = key_slots.reshape(-1)
            k = k_flat.index_select(0, flat).view(n_dec, max_len, c.n_kv_heads, c.head_dim).transpose(1, 2)
            v = v_flat.index_select(0, flat).view(n_dec, max_len, c.n_kv_heads, c.head_dim).transpose(1, 2)
            qd = q.index_select(0, rows).reshape(n_dec, c.n_kv_heads, group, c.head_dim)
            o = F.scaled_dot_product_attention(qd, k, v, attn_mask=mask)
            out.index_copy_(0, rows, o.reshape(n_dec, c.n_heads, c.head_dim))
        return out.view(q.shape[0], -1)

    def _forward(self, b: _Batch) -> torch.Tensor:
        """Run every layer over the packed batch; return the logits of the sampled rows."""
        import torch
        import torch.nn.functional as F

        c = self.config
        n_tokens = b.token_ids.shape[0]
        x = self.embed.index_select(0, b.token_ids)
        angles = b.positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        cos = angles.cos().to(self.dtype)[:, None, :]
        sin = angles.sin().to(self.dtype)[:, None, :]
        q_width, kv_width = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        for i, w in enumerate(self.layers):
            h = F.rms_norm(x, (c.hidden,), w["attn_norm"], eps=1e-5)
            q, k, v = (h @ w["wqkv"]).split((q_width, kv_width, kv_width), dim=-1)
            q = self._rope(q.view(n_tokens, c.n_heads, c.head_dim), cos, sin)
            k = self._rope(k.view(n_tokens, c.n_kv_heads, c.head_dim), cos, sin)
            self.k_pool[i].view(-1, c.n_kv_heads, c.head_dim).index_copy_(0, b.write_slots, k)
            self.v_pool[i].view(-1, c.n_kv_heads, c.head_dim).index_copy_(
                0, b.write_slots, v.view(n_tokens, c.n_kv_heads, c.head_dim)
            )
            x = x + self._attention(q, i, b) @ w["wo"]
            h = F.rms_norm(x, (c.hidden,), w["mlp_norm"], eps=1e-5)
            gate, up = (h @ w["w_gate_up"]).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ w["w_down"]
        h = F.rms_norm(x.index_select(0, b.logit_rows), (c.hidden,), self.final_norm, eps=1e-5)
        return h @ self.lm_head

    def execute(self, prefill: list[PrefillEntry], decode: list[DecodeEntry]) -> float:
        """Run one engine iteration and return its duration in seconds.

        :param prefill: ``(request_id, n_new_tokens, ctx_before)`` per prefill chunk.
        :param decode: ``(request_id, ctx_before)`` per decoding request.

        KV for the new tokens is allocated on a request's first appearance and grown as it
        advances; :meth:`release` frees it. Timed with CUDA events on GPU (the metadata copy,
        the forward pass and greedy sampling; host-side batch building is left out) and with
        ``time.perf_counter`` on CPU.
        """
        import torch

        if not prefill and not decode:
            return 0.0
        host = self._prepare(prefill, decode)
        with torch.inference_mode():
            if not self.is_cuda:
                t0 = time.perf_counter()
                self._forward(host).argmax(dim=-1)
                return time.perf_counter() - t0
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self._forward(self._to_device(host)).argmax(dim=-1)
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3

    def forward_tokens(
        self, prefill: list[PrefillEntry], decode: list[DecodeEntry], token_ids: torch.Tensor
    ) -> torch.Tensor:
        """Like :meth:`execute` with given token ids; returns the sampled rows' logits (tests)."""
        import torch

        host = self._prepare(prefill, decode)
        host.token_ids = token_ids.to(self.device)
        with torch.inference_mode():
            return self._forward(self._to_device(host) if self.is_cuda else host)
