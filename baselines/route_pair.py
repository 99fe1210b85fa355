"""Routers of a disaggregated cluster (:mod:`llmsched_gym.core.disagg`): a pair router composes
two routers of :data:`baselines.routers.ROUTERS`, one for the decode pool and one for the
prefill pool, with a :class:`~llmsched_gym.core.disagg.Decider` between them.

For each arrival it asks the decode router for the decode replica ``d`` (over the decode-capable
replicas), then the decider whether to disaggregate; if so the prefill router picks the prefill
replica ``p`` (over the prefill-capable replicas), else the request runs whole on ``d``. Picking
``d`` first is llm-d's order (its router picks the decode pod, whose sidecar then picks a prefill
pod when the P/D decider says so); DistServe and SplitwiseSim pick both at arrival too
(SplitwiseSim's ``KVJSQScheduler``: the prompt instance and the token instance each by the
shortest queue). Each router keeps its own state and its own random stream.

    make_pair_router("round-robin")                       # both pools round-robin, always disaggregate
    make_pair_router({"prefill": "token-jsq", "decode": "jsq"}, decider={"kind": "prompt_len", "min": 256})
    make_pair_router("splitwise-mixed")                   # Splitwise's mixed-pool policy (below)

:class:`SplitwiseMixed` (``splitwise-mixed``) is SplitwiseSim's ``MixedPoolScheduler`` (Patel et
al., ISCA 2024, section 4.2 and the simulator's scheduler module) for a cluster with a mixed pool:
the prompt goes to the dedicated prefill replica with the fewest pending tokens unless its queue
is long (queued requests and pending prompt tokens above ``prompt_max_pending_tokens``, 8,192 in
SplitwiseSim's configuration), then to the mixed replica with the fewest; the decode goes to the
dedicated decode replica with the least KV in use unless the request would not fit there, then to
the least used mixed replica; when neither pool has room, the request runs whole on the
decode-capable replica with the fewest pending tokens (SplitwiseSim's fallback to mixed batching).
SplitwiseSim also moves machines between the pools as their load changes; here the roles are
fixed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from llmsched_gym.config import ConfigError
from llmsched_gym.core.cluster import ClusterView, Router
from llmsched_gym.core.disagg import Decider
from llmsched_gym.core.disagg import PairRouter as PairRouterBase
from llmsched_gym.core.information import InformationError


class PairRouter(PairRouterBase):
    """A prefill router and a decode router with a decider (see the module docstring).

    :param prefill: the prefill pool's router.
    :param decode: the decode pool's router.
    :param decider: a :class:`Decider` or its spec (``"always"``, ``{"kind": "prompt_len", "min": 512}``).
    """

    def __init__(self, prefill: Router, decode: Router, decider: Decider | str | Mapping[str, Any] = "always") -> None:
        self.prefill, self.decode = prefill, decode
        self.decider = decider if isinstance(decider, Decider) else Decider(decider)
        self.name = prefill.name if prefill.name == decode.name else f"{prefill.name}+{decode.name}"

    def reset(self, n_prefill: int, n_decode: int, rng: np.random.Generator) -> None:
        a, b = rng.spawn(2)
        if n_prefill:
            self.prefill.reset(n_prefill, a)
        self.decode.reset(n_decode, b)

    def route(self, rid: int, prefill_view: ClusterView, decode_view: ClusterView) -> tuple[int | None, int]:
        d = self.decode.route(rid, decode_view)
        if not self.decider(rid, int(d), decode_view):
            return None, d
        return self.prefill.route(rid, prefill_view), d


class SplitwiseMixed(PairRouterBase):
    """Splitwise's mixed-pool routing (see the module docstring).

    :param prompt_max_pending_tokens: a prefill replica whose pending prompt tokens would pass
        this (with a request already queued) counts as busy.
    """

    name = "splitwise-mixed"

    def __init__(self, prompt_max_pending_tokens: int = 8192, decider: Any = "always") -> None:
        self.prompt_max_pending_tokens = int(prompt_max_pending_tokens)
        self.decider = decider if isinstance(decider, Decider) else Decider(decider)

    def reset(self, n_prefill: int, n_decode: int, rng: np.random.Generator) -> None:
        self.rng = rng

    @staticmethod
    def _least(view: ClusterView, key: np.ndarray, roles: set[str], ok: np.ndarray | None = None) -> int | None:
        cand = [j for j, r in enumerate(view.roles) if r in roles and (ok is None or ok[j])]
        return min(cand, key=lambda j: (key[j], j)) if cand else None

    def route(self, rid: int, prefill_view: ClusterView, decode_view: ClusterView) -> tuple[int | None, int]:
        dv, pv = decode_view, prefill_view
        prompt = int(dv.prompt_tokens[rid])
        try:  # SplitwiseSim books prompt + output; here what the information model lets a router know
            out = int(dv.predicted_output[rid])
        except InformationError:
            out = 1
        need = dv.kv_used + -(-(prompt + out) // dv.block_size) * dv.block_size
        fits = need <= dv.kv_capacity
        d = self._least(dv, dv.kv_used, {"decode"}, fits)
        if d is None:
            d = self._least(dv, dv.kv_used, {"mixed"}, fits)
        pending = pv.waiting_tokens
        short = (pv.waiting == 0) | (pending + prompt <= self.prompt_max_pending_tokens)
        p = self._least(pv, pending, {"prefill"}, short)
        if p is None:
            p = self._least(pv, pending, {"mixed"}, short)
        if d is None or p is None:  # no room in either pool: mixed batching on the least loaded
            return None, int(np.argmin(dv.waiting_tokens + dv.kv_used))
        return (p, d) if self.decider(rid, d, dv) else (None, d)


PAIR_ROUTERS = {"splitwise-mixed": SplitwiseMixed}
"""Pair routers that are not two routers of :data:`baselines.routers.ROUTERS` composed."""


def make_pair_router(router: str | Router | Mapping[str, Any] = "round-robin", decider: Any = "always",
                     router_params: Mapping[str, Any] | None = None) -> PairRouter:
    """A :class:`PairRouter`: ``router`` names one router for both pools, or maps ``prefill`` and
    ``decode`` to a router (a name of :data:`baselines.routers.ROUTERS` or a
    :class:`~llmsched_gym.core.cluster.Router`) each; ``router_params`` go to the named ones.
    (:func:`llmsched_gym.cluster_sim.simulate_cluster` also takes ``NAME:key=value,...``.)"""
    from baselines.routers import make_router

    if isinstance(router, str) and router in PAIR_ROUTERS:
        return PAIR_ROUTERS[router](**dict(router_params or {}), decider=decider)
    if isinstance(router, Mapping):
        unknown = sorted(set(router) - {"prefill", "decode"})
        if unknown:
            raise ConfigError(f"router.{unknown[0]}: unknown pool (allowed: prefill, decode)")
        names = (router.get("prefill", "round-robin"), router.get("decode", "round-robin"))
    else:
        names = (router, router)
    built = [r if isinstance(r, Router) else make_router(r, **dict(router_params or {})) for r in names]
    if built[0] is built[1]:  # one Router object: each pool needs its own state
        import copy

        built[1] = copy.deepcopy(built[0])
    return PairRouter(built[0], built[1], decider)
