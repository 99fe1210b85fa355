"""SGLang's cache-aware router (Zheng et al., "SGLang: Efficient Execution of Structured Language
Model Programs", NeurIPS 2024; the router: SGLang v0.4 release notes, December 2024, "cache-aware
load balancer", and ``sgl-router``'s ``CacheAwarePolicy``).

For each request:

1. The system is *imbalanced* when ``max(load) - min(load) > balance_abs_threshold`` and
   ``max(load) > balance_rel_threshold * min(load)`` (load: requests in flight per worker, here
   ``view.outstanding``); then the request goes to the least loaded worker (shortest queue).
2. Otherwise the worker whose approximate tree shares the longest prefix with the request is
   chosen when the match covers more than ``cache_threshold`` of the prompt; below that, the
   worker with the smallest tree (the most cache room).
3. The request's prompt is inserted into the chosen worker's tree.

Trees are pruned to ``max_tree_size`` tokens, least recently used first, every
``eviction_interval_s`` seconds of simulated time.

Defaults are those of the router's command line (``--cache-threshold 0.3
--balance-abs-threshold 64 --balance-rel-threshold 1.5 --eviction-interval 120
--max-tree-size 67108864``; the library's ``CacheAwareConfig::default`` has 0.5 / 32 / 1.1 / 30 /
10000). Departures: SGLang's tree is a character-level radix tree of the prompt text and its size
counts characters; ours keys prompt blocks of ``block`` tokens (:mod:`baselines.route_index`) and
counts tokens; the unique tail of a prompt (beyond its prefix segments) is inserted as keys that
never match; ties in the match go to the lowest worker index.
"""

from __future__ import annotations

import numpy as np

from llmsched_gym.core.cluster import ClusterView, Router

from .route_index import PrefixIndexes


class CacheAware(Router):
    """SGLang's cache-aware load balancer (see the module docstring)."""

    name = "sglang-cache-aware"
    params = {"cache_threshold": 0.3, "balance_abs_threshold": 64, "balance_rel_threshold": 1.5,
              "eviction_interval_s": 120.0, "max_tree_size": 67_108_864, "block": 64}

    def reset(self, n_replicas: int, rng: np.random.Generator) -> None:
        super().reset(n_replicas, rng)
        self.trees = PrefixIndexes(n_replicas, max(1, int(self.max_tree_size) // int(self.block)))
        self._next_evict = float(self.eviction_interval_s)

    def route(self, rid: int, view: ClusterView) -> int:
        if view.now >= self._next_evict:
            for r in range(self.n_replicas):
                self.trees.trim(r)
            self._next_evict = view.now + float(self.eviction_interval_s)
        load = view.outstanding
        lo, hi = int(load.min()), int(load.max())
        hashes = view.block_hashes(rid, int(self.block))
        if hi - lo > self.balance_abs_threshold and hi > self.balance_rel_threshold * lo:
            r = int(np.argmin(load))
        else:
            m = self.trees.match(hashes)
            best = int(np.argmax(m))  # the longest match, the lowest index among equals
            rate = int(m[best]) * int(self.block) / max(1, int(view.prompt_tokens[rid]))
            if rate > self.cache_threshold:
                r = best
            else:
                r = int(np.argmin(self.trees.sizes))  # the smallest tree
        # the whole prompt enters the tree, as SGLang inserts the request's text: the unique tail
        # as keys of its own (they never match), so tree sizes grow with the traffic each received
        tail = -(-(int(view.prompt_tokens[rid]) - len(hashes) * int(self.block)) // int(self.block))
        self.trees.insert(r, hashes + [(rid, b) for b in range(tail)], evict=False)
        return r
