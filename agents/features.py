"""The default policy network's features extractor: a set encoder for the queue slots.

``queue`` (K x F, or flattened slot by slot) goes through one per-slot MLP shared by every slot (Deep Sets); the slot
embeddings are pooled by mean and max over the occupied slots, which is invariant to the order of
the requests. ``running`` and ``globals`` (with ``budgets``, the predicted batch time per launch budget, in
``select`` mode) get their own small MLPs. The features are::

    [ mean-pool | max-pool | running MLP | globals(+budgets) MLP | per-slot scores (K x slot_out) ]

The last block keeps a small projection of every slot in slot order so that the action head can
point at a slot (``select``/``subset``/``priority`` modes need per-slot logits; a pooled vector
alone cannot say which slot is best). It is equivariant (same weights for every slot); set
``slot_out=0`` for a fully permutation-invariant extractor (``knob`` mode).

Empty slots are the env's zero rows: they are excluded from the pools and their slot scores are
zero. The queue must therefore not be shifted by observation normalisation (the env already
normalises its features; ``VecNormalize`` is applied to ``running`` and ``globals`` only).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn
from torch.nn import functional as F


def _mlp(n_in: int, sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for n_out in sizes:
        layers += [nn.Linear(n_in, n_out), nn.ReLU()]
        n_in = n_out
    return nn.Sequential(*layers)


def slot_max(h: torch.Tensor) -> torch.Tensor:
    """Max-pool ``(B, K, D)`` over the K slots: ``h.max(1).values``. Without autograd (a rollout's
    forward passes) ``amax``: the same values (a maximum is exact) without the indices that
    ``torch.max`` computes for its backward pass, most of its time over a middle dimension.
    With autograd ``torch.max`` itself, whose backward pass sends the gradient to the first
    maximal slot (a custom one with ``amax`` was slower: the indices cost the same either way)."""
    if h.requires_grad and torch.is_grad_enabled():
        return h.max(1).values
    return h.amax(1)


class QueueSetExtractor(BaseFeaturesExtractor):
    """Shared per-slot MLP + mean/max pooling for ``queue``, MLPs for ``running`` and ``globals``.

    :param observation_space: the env's ``Dict`` space with ``queue`` (K x F), ``running`` and
        ``globals`` Boxes.
    :param slot_hidden: sizes of the shared per-slot MLP.
    :param context_hidden: sizes of the ``running`` and ``globals`` MLPs.
    :param slot_out: per-slot features kept in slot order (0 = permutation-invariant output).
    """

    def __init__(self, observation_space: gym.spaces.Dict, slot_hidden: tuple[int, ...] = (64, 64),
                 context_hidden: tuple[int, ...] = (32,), slot_out: int = 4) -> None:
        for key in ("queue", "running", "globals"):
            if key not in observation_space.spaces:
                raise ValueError(f"policy_kwargs: QueueSetExtractor needs a Dict observation with {key!r} "
                                 "(use the env without flat=True)")
        qshape = observation_space["queue"].shape
        if len(qshape) == 2:
            k, f = qshape
        else:  # the env flattens the K x F table slot by slot
            from llmsched_gym.env.observation import QUEUE_FEATURES

            f = len(QUEUE_FEATURES)
            k = int(qshape[0]) // f
        n_run = int(observation_space["running"].shape[0])
        self.has_budgets = "budgets" in observation_space.spaces
        n_glob = int(observation_space["globals"].shape[0])
        if self.has_budgets:
            n_glob += int(observation_space["budgets"].shape[0])
        d = slot_hidden[-1]
        c = context_hidden[-1]
        super().__init__(observation_space, features_dim=2 * d + 2 * c + k * slot_out)
        self.n_slots, self.n_slot_features, self.slot_dim = int(k), int(f), int(d)
        self.slot = _mlp(f, list(slot_hidden))
        self.slot_score = nn.Linear(d, slot_out) if slot_out else None
        self.running = _mlp(n_run, list(context_hidden))
        self.globals = _mlp(n_glob, list(context_hidden))
        self._table: torch.Tensor | None = None  # zeros: the (B * K, D) table of _RowSum, _RowScores (not a buffer)

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        q = obs["queue"].reshape(-1, self.n_slots, self.n_slot_features)
        g = torch.cat([obs["globals"], obs["budgets"]], dim=1) if self.has_budgets else obs["globals"]
        if torch.is_grad_enabled():
            return self._forward_rows(q, obs["running"], g)
        present = q.abs().sum(-1) > 0  # (B, K)
        occupied = present.unsqueeze(-1).to(q.dtype)  # (B, K, 1)
        if bool(present.all()):
            h = self.slot(q)
        else:  # the slot MLP runs on the occupied slots only (about half of them in a training batch)
            h = q.new_zeros(q.shape[0], self.n_slots, self.slot_dim)
            h[present] = self.slot(q[present])
        n = occupied.sum(1).clamp(min=1.0)
        mean = h.sum(1) / n
        # embeddings are >= 0 after ReLU, so zeroed empty slots never win the max
        mx = slot_max(h)
        parts = [mean, mx, self.running(obs["running"]), self.globals(g)]
        if self.slot_score is not None:
            parts.append((self.slot_score(h) * occupied).flatten(1))
        return torch.cat(parts, dim=1)

    def _forward_rows(self, q: torch.Tensor, running: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` with autograd (a PPO update's minibatch): the same features and the same
        gradients, bit for bit, with the occupied slots' embeddings kept as one ``(M, D)`` block of
        rows (M is about an eighth of B x K in the azure-conv recipe's rollouts) instead of the
        ``(B, K, D)`` table with zeros in the empty slots that the path above pools: the sum is
        the table's (:class:`_RowSum`), the max a scatter of the rows (:class:`_RowMax`: the same
        values, the gradient to the same slot) and the slot scores those of the rows, written
        into the empty slots' values (:class:`_RowScores`; the weight's gradient is the table's
        product over all B x K rows: the BLAS adds it in an order that depends on the rows'
        positions). Autograd adds the three gradients of the rows in the table's order (scores,
        max, sum). About half the time of the table's forward and backward pass."""
        b, k, d = q.shape[0], self.n_slots, self.slot_dim
        flat = q.reshape(b * k, self.n_slot_features)
        present = flat.abs().sum(-1) > 0  # (B * K,)
        idx = present.nonzero().squeeze(1)
        rows = idx.div(k, rounding_mode="floor")  # each occupied slot's sample
        hp = self.slot(flat.index_select(0, idx))  # (M, D), >= 0 after ReLU
        n = present.view(b, k).sum(1, keepdim=True).to(q.dtype).clamp(min=1.0)
        table = getattr(self, "_table", None)  # (an extractor unpickled from before it had one: None)
        if table is None or table.shape != (b * k, d) or table.dtype != hp.dtype or table.device != hp.device:
            table = self._table = hp.new_zeros(b * k, d)
        mean = _RowSum.apply(hp, idx, rows, table, k) / n
        mx = _RowMax.apply(hp, rows, b)
        parts = [mean, mx, self.running(running), self.globals(g)]
        if self.slot_score is not None:
            scores = _RowScores.apply(hp, self.slot_score.weight, self.slot_score.bias, idx,
                                      present.unsqueeze(1).to(q.dtype), table)
            parts.append(scores.view(b, -1))
        return torch.cat(parts, dim=1)


class _RowSum(torch.autograd.Function):
    """``(B, D)`` sum of each sample's occupied rows of ``hp``, as ``sum(1)`` of the ``(B, K, D)``
    table with zeros in the empty slots sums them (the table is filled for the sum and zeroed
    again: the reduction's order of additions depends on the table's shape and the CPU's vector
    width, and it is the table's that the features had). The backward pass gives each row its
    sample's gradient, what the table's ``sum`` and the gather of the occupied slots gave."""

    @staticmethod
    def forward(ctx: Any, hp: torch.Tensor, idx: torch.Tensor, rows: torch.Tensor, table: torch.Tensor,
                k: int) -> torch.Tensor:
        table.index_copy_(0, idx, hp)
        total = table.view(-1, k, table.shape[1]).sum(1)
        table.index_fill_(0, idx, 0.0)
        ctx.save_for_backward(rows)
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (rows,) = ctx.saved_tensors
        return grad.index_select(0, rows), None, None, None, None


class _RowMax(torch.autograd.Function):
    """``(B, D)`` max over each sample's occupied rows of ``hp`` (``(M, D)``, >= 0; ``rows``: the
    sample of each row, ascending) and 0 where a sample has none: the values of ``torch.max``
    over the ``(B, K, D)`` table with zeros in the empty slots. The backward pass sends each
    gradient to the first row (in slot order) that holds a positive maximum, as ``torch.max``'s
    sends it to the first maximal slot; where the maximum is 0 the table's gradient went to a
    slot that the ReLU below blocks or to an empty one, i.e. nowhere."""

    @staticmethod
    def forward(ctx: Any, hp: torch.Tensor, rows: torch.Tensor, n: int) -> torch.Tensor:
        mx = hp.new_zeros(n, hp.shape[1]).scatter_reduce_(0, rows.unsqueeze(1).expand_as(hp), hp, "amax")
        ctx.save_for_backward(hp, rows, mx)
        return mx

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        hp, rows, mx = ctx.saved_tensors
        positive = mx > 0
        hit = hp == mx.masked_fill(~positive, -1.0).index_select(0, rows)  # a row holding a positive maximum
        if int(hit.sum()) == int(positive.sum()):  # one row per positive maximum (no tie)
            return grad.index_select(0, rows).masked_fill_(hit.logical_not_(), 0.0), None, None
        m = hp.shape[0]  # a tie (equal embeddings in one sample): the first of the tied rows
        at = torch.where(hit, torch.arange(m, device=hp.device).unsqueeze(1), m)
        first = torch.full(mx.shape, m, dtype=at.dtype, device=hp.device)
        first.scatter_reduce_(0, rows.unsqueeze(1).expand_as(hp), at, "amin")
        out = hp.new_zeros(m + 1, hp.shape[1]).scatter_(0, first, grad)
        return out[:m], None, None


class _RowScores(torch.autograd.Function):
    """The slot scores ``(B * K, S)``: ``linear(hp, weight, bias)`` in the occupied rows ``idx``
    and, in the empty ones, ``bias * 0``, the value of ``linear(0) * 0`` there. The backward pass
    computes ``hp``'s gradient from the occupied rows and the weight's and the bias's as
    ``linear`` on the table did: ``grad.t() @ table`` and ``grad.sum(0)`` over all B x K rows, the
    empty ones' gradient times 0, with ``table`` (zeros, returned as zeros) holding the table for
    the product."""

    @staticmethod
    def forward(ctx: Any, hp: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, idx: torch.Tensor,
                occupied: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        empty = (bias.detach() * 0.0).expand(occupied.shape[0], -1)
        ctx.save_for_backward(hp, weight, idx, occupied)
        ctx.table = table
        return empty.index_copy(0, idx, F.linear(hp, weight, bias))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hp, weight, idx, occupied = ctx.saved_tensors
        table = ctx.table
        g = grad * occupied  # the table's gradient: empty rows times 0
        g_hp = grad.index_select(0, idx).mm(weight)
        table.index_copy_(0, idx, hp)
        g_weight = g.t().mm(table)
        table.index_fill_(0, idx, 0.0)
        return g_hp, g_weight, g.sum(0), None, None, None


class ReplicaScorer(BaseFeaturesExtractor):
    """Routing (``LLMSchedCluster-v0``): one learned function scores every replica.

    The observation is ``N`` rows of the env's per-replica features (queued and running requests,
    free KV, queued prompt tokens, this request's prefix hit) and then the request's features. Each
    replica's input ``z_i`` is its row, its row spread over the replicas (``(max - x_i) / (max -
    min)`` per feature, 1 where all are equal: llm-d's queue scorer's normalisation) and the request's
    features. A shared MLP embeds it, ``h_i = MLP(z_i)`` (Deep Sets: Zaheer et al., NeurIPS 2017),
    and the replica's score is

        ``s_i = prior . z_i + out(h_i)``

    a linear part (zero, or a router's weights: :func:`agents.heads.replica_head` with
    ``route_prior``) plus a learned correction. The features are ``[mean_i h_i | max_i h_i | s_1 ..
    s_N]``; :func:`agents.heads.replica_head` routes the scores straight to the action's logits,
    so the policy is equivariant: permuting the replicas permutes its choice.

    :param observation_space: the env's ``Box(N * 5 + 2)`` (colocated replicas; not pools).
    :param hidden: sizes of the shared per-replica MLP.
    """

    ROW = 5
    REQUEST = 2

    def __init__(self, observation_space: gym.spaces.Box, hidden: tuple[int, ...] = (64, 64)) -> None:
        dim = int(observation_space.shape[0]) if len(observation_space.shape) == 1 else -1
        if dim < self.ROW + self.REQUEST or (dim - self.REQUEST) % self.ROW:
            raise ValueError(f"policy_kwargs: ReplicaScorer needs LLMSchedCluster-v0's Box(N * {self.ROW} + "
                             f"{self.REQUEST}) observation, got {observation_space}")
        n = (dim - self.REQUEST) // self.ROW
        d = int(hidden[-1])
        super().__init__(observation_space, features_dim=2 * d + n)
        self.n_replicas, self.inputs = n, 2 * self.ROW + self.REQUEST
        self.embed = _mlp(self.inputs, list(hidden))
        self.prior = nn.Linear(self.inputs, 1, bias=False)
        self.out = nn.Linear(d, 1)
        nn.init.zeros_(self.prior.weight)

    def replica_inputs(self, obs: torch.Tensor) -> torch.Tensor:
        """``z``: (B, N, 2 * 5 + 2), each replica's row, its spread and the request's features."""
        n, f = self.n_replicas, self.ROW
        rows = obs[:, : n * f].reshape(-1, n, f)
        hi, lo = rows.max(1, keepdim=True).values, rows.min(1, keepdim=True).values
        width = hi - lo
        spread = torch.where(width > 0, (hi - rows) / width.clamp(min=1e-12), torch.ones_like(rows))
        req = obs[:, n * f:].unsqueeze(1).expand(-1, n, self.REQUEST)
        return torch.cat([rows, spread, req], dim=2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        z = self.replica_inputs(obs)
        h = self.embed(z)
        score = (self.prior(z) + self.out(h)).squeeze(-1)
        return torch.cat([h.mean(1), slot_max(h), score], dim=1)


PRIOR_INPUTS = ("queued", "running", "kv_free", "queued_tokens", "prefix_hit",
                "queued_spread", "running_spread", "kv_free_spread", "queued_tokens_spread", "prefix_hit_spread",
                "prompt", "output")
"""The names of :class:`ReplicaScorer`'s inputs ``z_i``, in order (the keys of ``route_prior``)."""
