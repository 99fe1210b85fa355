"""The VTC family (baselines/vtc.py) and the Echo family (baselines/echo.py) keep per-request
state; on a replica of a cluster their requests arrive at run time (Engine.extend), so that state
grows with the workload. Checked the way tests/test_cluster.py checks the growing engine: behind a
load-blind router every replica equals a plain engine given its requests from the start, bit for
bit (their one-engine runs are pinned by the golden summaries and the env fingerprints)."""

from __future__ import annotations

import numpy as np
import pytest

from llmsched_gym.cluster_sim import make_cluster
from llmsched_gym.core.cluster import _replica_seed
from llmsched_gym.core.engine import Engine
from llmsched_gym.core.latency import make_latency
from llmsched_gym.core.metrics import summarize
from llmsched_gym.sim import make_policy

VTC_FAMILY = ("vtc", "lcf", "vtc-weighted", "vtc-predict", "vtc-oracle", "drr", "rpm:limit=3,window_s=5")
ECHO_FAMILY = ("echo", "echo-bs", "echo-bs-e", "echo-bs-e-s")
_FIELDS = ("completion_s", "first_token_s", "first_scheduled_s", "state", "preemptions", "generated")


def _replicas_equal_plain_engines(scenario: str, policy: str, overrides: dict, router: str, refresh_s: float,
                                  seed: int = 3) -> list[int]:
    from baselines import parse_spec

    spec = parse_spec(policy)
    c, sc = make_cluster(scenario, spec, router, 3, seed, overrides, refresh_s=refresh_s)
    c.run()
    wl = c.workload
    for r, e in enumerate(c.engines):
        sub = wl.take(c.ids[r])
        if wl.prefix is not None:
            sub.prefix = [wl.prefix[i] for i in c.ids[r]]
        plain = Engine(sub, c.replicas[r].config, make_latency(sc["latency"]), make_policy(spec),
                       seed=_replica_seed(seed, r))
        plain.run()
        for f in _FIELDS:
            assert np.array_equal(getattr(plain, f), getattr(e, f), equal_nan=True), (policy, r, f)
        assert summarize(plain) == summarize(e)
    return [len(ids) for ids in c.ids]


@pytest.mark.parametrize("policy", VTC_FAMILY)
def test_vtc_family_replicas_equal_plain_engines(policy):
    over = {"workload.n_requests": 240, "workload.trace.time_scale": 0.1,  # 10x the rate: queues form
            "workload.predictor": {"type": "oracle"}}
    routed = _replicas_equal_plain_engines("vtc-arena", policy, over, "round-robin", 0.5)
    assert routed == [80, 80, 80]


@pytest.mark.parametrize("policy", ECHO_FAMILY)
def test_echo_family_replicas_equal_plain_engines(policy):
    over = {"workload.horizon_s": 40.0, "engine.horizon_s": 40.0, "workload.classes.offline.n_requests": 300,
            "workload.arrival.mean_rate": 8.0, "engine.kv_capacity_tokens": 30000}
    routed = _replicas_equal_plain_engines("echo-hybrid", policy, over, "random", 0.1)
    assert sum(routed) > 300 and min(routed) > 0


def test_a_policy_that_cannot_grow_is_still_refused_on_a_replica():
    from baselines.fcfs import FCFS
    from llmsched_gym.config import ConfigError

    class Sized(FCFS):
        grows = False

    with pytest.raises(ConfigError, match=r"^cluster\.replicas\[0\]\.policy: 'fcfs' keeps per-request arrays"):
        make_cluster("jaillet-low", Sized(), "lor", 2, overrides={"workload.n_requests": 5})
