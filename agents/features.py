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

import gymnasium as gym
import torch
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn


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

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        q = obs["queue"].reshape(-1, self.n_slots, self.n_slot_features)
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
        g = torch.cat([obs["globals"], obs["budgets"]], dim=1) if self.has_budgets else obs["globals"]
        parts = [mean, mx, self.running(obs["running"]), self.globals(g)]
        if self.slot_score is not None:
            parts.append((self.slot_score(h) * occupied).flatten(1))
        return torch.cat(parts, dim=1)


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
