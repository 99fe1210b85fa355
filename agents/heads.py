"""A per-slot score head: the same learned function scores every queue slot (``slot_head: true``).

SB3's policy maps the features to the K slot scores of ``priority`` mode with one dense layer
(``action_net``), so "score a request by its predicted length" has to be learned K times, once per
output, each from 1/K of the data. :func:`slot_score_head` starts the policy at a head that is
*equivariant* instead: the features extractor's per-slot projection (:class:`~agents.features.
QueueSetExtractor` with ``slot_out: 1``: one number per slot from the slot MLP shared by every
slot) is routed straight to that slot's score, ``score_i = bias_i + w . h(slot_i)``, so one
gradient step improves the scoring of every slot (Deep Sets, Zaheer et al., NeurIPS 2017; the
per-job scoring of Decima, Mao et al., SIGCOMM 2019, Section 5.1). The dense layer is kept and
trained, starting from this routing: PPO may still learn context-dependent offsets from the pooled
features.

The recipe needs ``policy_kwargs: {slot_out: 1, net_arch: {pi: [], vf: [64]}}`` (no hidden layer
on the policy side, so that the action layer sees the features themselves). With ``action_bias``
the start is exactly that bias: the per-slot projection starts at zero.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def slot_score_head(model: Any) -> None:
    """Route each slot's projection to its own score and zero the projection (module docstring).

    :raises ValueError: (one line) the model is not a ``Box`` per-slot policy with ``slot_out: 1``
        and an empty policy network.
    """
    import torch
    from gymnasium import spaces

    policy = model.policy
    ext = policy.features_extractor
    k = int(np.prod(model.action_space.shape)) if isinstance(model.action_space, spaces.Box) else -1
    if getattr(ext, "slot_score", None) is None or ext.slot_score.out_features != 1 or k != ext.n_slots:
        raise ValueError("slot_head: needs the priority mode's K scores and policy_kwargs.slot_out: 1 "
                         f"(got an action space {model.action_space} and slot_out "
                         f"{getattr(getattr(ext, 'slot_score', None), 'out_features', 0)})")
    latent = policy.mlp_extractor.latent_dim_pi
    if latent != ext.features_dim:
        raise ValueError(f"slot_head: needs policy_kwargs.net_arch: {{pi: [], vf: [...]}} (the action layer must "
                         f"see the features: {ext.features_dim}, not a hidden layer of {latent})")
    offset = ext.features_dim - k  # the per-slot scores are the features' last K numbers
    with torch.no_grad():
        _scores_to_logits(policy.action_net, k, offset)
        ext.slot_score.weight.zero_()
        ext.slot_score.bias.zero_()


def _scores_to_logits(action_net: Any, k: int, offset: int) -> None:
    """Set the action layer's weights so that output ``i`` is input ``offset + i`` (call under
    ``torch.no_grad()``; the bias is left as it is)."""
    import torch

    w = action_net.weight
    w.zero_()
    w[torch.arange(k), offset + torch.arange(k)] = 1.0


def replica_head(model: Any, prior: dict[str, float] | None = None) -> None:
    """Routing: each replica's score (:class:`~agents.features.ReplicaScorer`) is its action logit.

    The action layer is set to route the extractor's last ``N`` features (the scores) one to one to
    the ``N`` logits and frozen there (:func:`freeze_replica_head`), so the policy stays
    equivariant while it learns: permuting the replicas permutes its choice. With ``prior`` (``route_prior`` in a recipe: weights
    by the names of :data:`agents.features.PRIOR_INPUTS`, and ``scale``, a factor on all of them,
    default 1) the scores' linear part starts at those weights and the learned correction at zero,
    so the untrained policy ranks replicas by the weighted score, a router: ``{prefix_hit: 2,
    queued_spread: 1, kv_free: 1}`` is llm-d's default scorer pipeline (Kubernetes Gateway API
    Inference Extension, 2025: "precise-prefix-cache 2, queue-depth 1, kv-utilization 1") on the
    env's features. Without it the linear part is zero and the correction at its random
    initialisation: a neutral start.

    :raises ValueError: (one line) not a :class:`ReplicaScorer` policy with ``net_arch: {pi: [],
        ...}``, or an unknown prior input.
    """
    import torch

    from agents.features import PRIOR_INPUTS, ReplicaScorer

    policy = model.policy
    ext = policy.features_extractor
    if not isinstance(ext, ReplicaScorer):
        raise ValueError(f"route_prior: needs the ReplicaScorer features extractor, got {type(ext).__name__}")
    n = ext.n_replicas
    if policy.mlp_extractor.latent_dim_pi != ext.features_dim or policy.action_net.out_features != n:
        raise ValueError(f"policy_kwargs.net_arch: a routing policy needs {{pi: [], vf: [...]}} (the action layer "
                         f"must see the {n} replica scores, not a hidden layer of {policy.mlp_extractor.latent_dim_pi})")
    prior = dict(prior or {})
    scale = float(prior.pop("scale", 1.0))
    unknown = [k for k in prior if k not in PRIOR_INPUTS]
    if unknown:
        raise ValueError(f"route_prior.{unknown[0]}: unknown input; allowed: scale, {', '.join(PRIOR_INPUTS)}")
    offset = ext.features_dim - n
    with torch.no_grad():
        _scores_to_logits(policy.action_net, n, offset)
        policy.action_net.bias.zero_()
        ext.prior.weight.zero_()
        if prior:
            for k, v in prior.items():
                ext.prior.weight[0, PRIOR_INPUTS.index(k)] = scale * float(v)
            ext.out.weight.zero_()
            ext.out.bias.zero_()
    freeze_replica_head(model)


def freeze_replica_head(model: Any) -> None:
    """Keep a routing policy's action layer (the scores' one-to-one routing) out of training; a
    resumed run calls it again (the flag is not saved with the weights)."""
    for p in model.policy.action_net.parameters():
        p.requires_grad_(False)


__all__ = ["freeze_replica_head", "replica_head", "slot_score_head"]
