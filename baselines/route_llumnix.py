"""Llumnix's dispatching by freeness (Sun et al., "Llumnix: Dynamic Scheduling for Large Language
Model Serving", OSDI 2024, section 4.4: the global scheduler dispatches each new request to the
instance with the highest freeness).

An instance's freeness is ``F = (M - sum V) / B``: ``M`` its KV capacity, ``sum V`` the virtual
usage of its requests (the KV its running requests hold plus the demand of its queue, here the
prompt tokens still to prefill, which Llumnix's virtual usage of the queue head generalises), and
``B`` its batch size (running requests, at least 1). The paper's other virtual-usage terms
(priorities, the fake infinite usage of a terminating instance) and its live migration between
instances are not modelled: the dispatcher alone is reproduced.
"""

from __future__ import annotations

import numpy as np

from llmsched_gym.core.cluster import ClusterView, Router


class Llumnix(Router):
    """Dispatch to the freest instance (see the module docstring)."""

    name = "llumnix"

    def freeness(self, view: ClusterView) -> np.ndarray:
        """Every replica's freeness, in tokens per running request."""
        return (view.kv_capacity - view.kv_used - view.waiting_tokens) / np.maximum(view.running, 1)

    def route(self, rid: int, view: ClusterView) -> int:
        return int(np.argmax(self.freeness(view)))
