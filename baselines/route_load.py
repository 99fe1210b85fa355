"""Load-aware routers: least outstanding requests, join-the-shortest-queue by requests and by
tokens, and the power of two choices.

* ``lor``: Vidur's ``LORGlobalScheduler`` (Agrawal et al. 2024, MLSys 2024, section 4): the
  replica with the fewest pending requests, counting those it placed in the same scheduling
  round. Vidur's "pending" are the requests in a replica's queue, not yet scheduled: here
  ``view.waiting`` (the queue plus what was routed since the last load snapshot); ties go to the
  replica with fewer requests on it (Vidur: the lowest index).
* ``jsq``: SplitwiseSim's ``JSQScheduler`` (Patel et al. 2024, "Splitwise", ISCA 2024; the
  simulator's scheduler module): the replica with the fewest requests on it
  (``view.outstanding``: queued and running).
* ``token-jsq``: SplitwiseSim's ``TokenJSQScheduler``: the replica with the fewest pending
  tokens. SplitwiseSim books each request's prompt plus its true output length; we count what a
  router can observe, the prompt tokens still to prefill plus the KV tokens resident
  (``view.waiting_tokens + view.kv_used``).
* ``power-of-two``: Mitzenmacher 2001, "The power of two choices in randomized load balancing"
  (IEEE TPDS 12(10)); SGLang's router ships it as ``power_of_two``: two distinct replicas drawn
  at random, the one with fewer outstanding requests (the first drawn on a tie).

Other ties go to the lowest replica index (Python's ``min`` over replicas, as in both simulators). The
work per arrival is one pass over N small arrays (an ``argmin`` in C).
"""

from __future__ import annotations

import numpy as np

from llmsched_gym.core.cluster import ClusterView, Router


class LOR(Router):
    """Least outstanding requests (Vidur): the fewest queued requests; among equals, the fewest
    requests on the replica (departure: Vidur takes the lowest index, which sends every arrival
    to replica 0 whenever the replicas admit at once and the queues are empty)."""

    name = "lor"

    def route(self, rid: int, view: ClusterView) -> int:
        # one key per replica ordered as (waiting, outstanding): exact while outstanding < 2**32
        key = view.waiting << 32
        key += view.outstanding
        return int(key.argmin())


class JSQ(Router):
    """Join the shortest queue by requests (SplitwiseSim ``jsq``): the fewest requests on the replica."""

    name = "jsq"

    def route(self, rid: int, view: ClusterView) -> int:
        return int(np.argmin(view.outstanding))


class TokenJSQ(Router):
    """Join the shortest queue by tokens (SplitwiseSim ``token_jsq``): the fewest pending tokens."""

    name = "token-jsq"

    def route(self, rid: int, view: ClusterView) -> int:
        return int(np.argmin(view.waiting_tokens + view.kv_used))


class PowerOfTwo(Router):
    """Power of two choices: the less loaded of two replicas drawn at random."""

    name = "power-of-two"

    def route(self, rid: int, view: ClusterView) -> int:
        n = self.n_replicas
        if n == 1:
            return 0
        a, b = (int(x) for x in self.rng.choice(n, size=2, replace=False))
        return b if view.outstanding[b] < view.outstanding[a] else a
