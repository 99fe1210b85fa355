"""Disaggregated serving (llmsched_gym.core.disagg): prefill and decode pools with KV transfers.
Constructed instances with exact times, the transfer's place (TPOT and end-to-end latency, not
TTFT), waiting for decode room, the decider, and properties: every request completes once, memory
stays within capacity on every replica and nothing stays held at the end."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baselines.route_pair import make_pair_router
from baselines.routers import make_router
from llmsched_gym.cluster_sim import simulate_cluster
from llmsched_gym.config import ConfigError
from llmsched_gym.core.cluster import Cluster, Replica
from llmsched_gym.core.disagg import Decider, DisaggCluster
from llmsched_gym.core.engine import EngineConfig
from llmsched_gym.core.latency import make_latency
from llmsched_gym.core.request import Workload
from llmsched_gym.sim import make_policy

KVB = 524_288  # the engine's default KV bytes per token (Llama-2-7B)


def _wl(arrival, prompt, output, prefix=None) -> Workload:
    return Workload(np.array(arrival, dtype=float), np.array(prompt), np.array(output), prefix=prefix)


def _rep(cap: int = 100_000, latency: str = "unit", policy: str = "fcfs", bs: int = 1) -> Replica:
    return Replica(EngineConfig(kv_capacity_tokens=cap, block_size=bs, overflow="preempt_lifo_recompute"),
                   make_latency(latency), make_policy(policy))


def _disagg(wl, roles, router="round-robin", decider="always", transfer=None, caps=None, latency="unit",
            bs: int = 1) -> DisaggCluster:
    caps = caps or [100_000] * len(roles)
    reps = [_rep(c, latency, bs=bs) for c in caps]
    c = DisaggCluster(wl, reps, roles, make_pair_router(router, decider), transfer or {"bandwidth_gb_s": 1.0,
                                                                                       "base_s": 0.001}, seed=0)
    c.run()
    return c


def test_one_request_prefill_transfer_decode_exact_times() -> None:
    """Unit batch times: the prefill iteration ends at 1 (the first token: TTFT 1), the 100-token
    prompt's KV (100 x 524,288 B) crosses 1 GB/s in 0.0524288 s plus 1 ms, and the decode replica
    produces tokens 2..4 in three iterations."""
    c = _disagg(_wl([0.0], [100], [4]), ["prefill", "decode"])
    t = c.request_table()
    xfer = 0.001 + 100 * KVB / 1e9
    assert t["prefill_replica"].tolist() == [0] and t["decode_replica"].tolist() == [1]
    assert t["first_token_s"][0] == 1.0 and t["ttft_s"][0] == 1.0
    assert t["prefill_end_s"][0] == 1.0 and t["transfer_start_s"][0] == 1.0
    assert t["transfer_end_s"][0] == pytest.approx(1.0 + xfer, abs=1e-12)
    assert t["completion_s"][0] == pytest.approx(4.0 + xfer, abs=1e-12)
    assert t["tpot_s"][0] == pytest.approx((3.0 + xfer) / 3, abs=1e-12)
    assert t["room_wait_s"][0] == 0.0 and t["generated"][0] == 4
    s = c.summary()
    assert s["n_completed"] == 1 and s["n_unfinished"] == 0
    p = s["pools"]
    assert p["transfer"]["count"] == 1 and p["transfer"]["bytes"] == 100 * KVB
    assert p["transfer"]["time_s"] == pytest.approx(xfer, abs=1e-12)
    assert p["disaggregated"] == 1 and p["local"] == 0
    assert p["prefill"]["requests"] == 1 and p["decode"]["requests"] == 1
    assert [e.kv.used_blocks for e in c.engines] == [0, 0]  # no hold or reservation left behind


def test_a_one_token_request_ends_at_its_prefill() -> None:
    c = _disagg(_wl([0.0], [50], [1]), ["prefill", "decode"])
    t = c.request_table()
    assert t["completion_s"][0] == 1.0 and math.isnan(t["transfer_start_s"][0])
    assert c.summary()["pools"]["transfer"]["count"] == 0


def test_raising_the_bandwidth_strictly_lowers_tpot_and_e2e_not_ttft() -> None:
    """TTFT ends at the prefill (DistServe's convention), so the bandwidth shows in TPOT and in
    end-to-end latency: every request's falls strictly when the link is faster."""
    wl = _wl(np.arange(6) * 10.0, [200, 400, 800, 100, 300, 50], [5, 8, 3, 9, 2, 6])
    runs = [_disagg(wl, ["prefill", "decode"], transfer={"bandwidth_gb_s": bw, "base_s": 1e-4}).request_table()
            for bw in (0.5, 5.0, 50.0)]
    for slow, fast in zip(runs, runs[1:], strict=False):
        assert np.array_equal(slow["ttft_s"], fast["ttft_s"])
        assert (fast["e2e_s"] < slow["e2e_s"]).all()
        assert (fast["tpot_s"] < slow["tpot_s"]).all()


def test_counting_the_first_token_at_the_hand_off_makes_ttft_fall_with_the_bandwidth() -> None:
    """With ``first_token="transfer"`` (the client streams from the decode replica) the first
    token counts when the KV arrives: TTFT = prefill end + wait + transfer, and a faster link
    lowers every disaggregated request's TTFT strictly."""
    wl = _wl(np.arange(6) * 10.0, [200, 400, 800, 100, 300, 50], [5, 8, 3, 9, 2, 1])
    runs = [_disagg(wl, ["prefill", "decode"], transfer={"bandwidth_gb_s": bw, "base_s": 1e-4,
                                                         "first_token": "transfer"}) for bw in (0.5, 5.0, 50.0)]
    tables = [c.request_table() for c in runs]
    t = tables[0]
    split = t["output_tokens"] > 1
    assert np.array_equal(t["first_token_s"][split], t["transfer_end_s"][split])
    assert t["first_token_s"][5] == 51.0  # one output token: done at its prefill, nothing moves
    assert t["ttft_s"][0] == pytest.approx(1.0 + 1e-4 + 200 * KVB / 0.5e9, abs=1e-12)
    for slow, fast in zip(tables, tables[1:], strict=False):
        assert (fast["ttft_s"][split] < slow["ttft_s"][split]).all()
        assert fast["ttft_s"][5] == slow["ttft_s"][5]
    assert runs[0].summary()["pools"]["transfer"]["first_token"] == "transfer"
    with pytest.raises(ConfigError, match=r"^transfer\.first_token: unknown 'decode'; allowed: prefill, transfer$"):
        _disagg(wl, ["prefill", "decode"], transfer={"first_token": "decode"})


def test_the_transfer_waits_for_room_on_the_decode_replica() -> None:
    """The decode replica holds 150 tokens: request 0 reserves 101, so request 1 (prefilled at the
    same time on the other prefill replica) waits until request 0 completes and frees 104."""
    wl = _wl([0.0, 0.0], [100, 100], [4, 4])
    c = _disagg(wl, ["prefill", "prefill", "decode"], router={"prefill": "round-robin", "decode": "round-robin"},
                caps=[100_000, 100_000, 150])
    t = c.request_table()
    xfer = 0.001 + 100 * KVB / 1e9
    assert t["prefill_replica"].tolist() == [0, 1] and t["decode_replica"].tolist() == [2, 2]
    assert t["completion_s"][0] == pytest.approx(4.0 + xfer, abs=1e-12)
    assert t["transfer_start_s"][1] == pytest.approx(4.0 + xfer, abs=1e-12)
    assert t["room_wait_s"][1] == pytest.approx(3.0 + xfer, abs=1e-12)
    assert t["completion_s"][1] == pytest.approx(7.0 + 2 * xfer, abs=1e-12)
    w = c.summary()["pools"]["decode_room_wait"]
    assert w["count"] == 1 and w["max_s"] == pytest.approx(3.0 + xfer, abs=1e-12)
    log = c.iteration_log()
    dec = log["kv_used"][log["replica"] == 2]
    assert dec.max() <= 150 and dec[0] == 102  # request 0's 101 reserved tokens, plus its second token


def test_a_request_the_decode_replica_can_never_hold_is_rejected_not_stuck() -> None:
    wl = _wl([0.0, 0.0], [100, 500], [4, 4])
    c = _disagg(wl, ["prefill", "decode"], caps=[100_000, 300])
    s, t = c.summary(), c.request_table()
    assert s["n_completed"] == 1 and s["n_rejected"] == 1 and s["n_unfinished"] == 0
    assert t["state"].tolist() == [3, 4] and t["disaggregated"].tolist() == [True, False]
    assert "more than the capacity of 300" in c.records().reject_reason[1]
    assert [e.kv.used_blocks for e in c.engines] == [0, 0]


def test_shared_link_slows_concurrent_transfers() -> None:
    """Two prefills end together: on a shared link the second transfer gets half the bandwidth."""
    wl = _wl([0.0, 0.0], [100, 100], [2, 2])
    t = _disagg(wl, ["prefill", "prefill", "decode", "decode"],
                transfer={"bandwidth_gb_s": 1.0, "base_s": 0.0, "shared_link": True}).request_table()
    d = t["transfer_end_s"] - t["transfer_start_s"]
    assert sorted(d.tolist()) == pytest.approx([100 * KVB / 1e9, 2 * 100 * KVB / 1e9], abs=1e-12)


def test_prompt_length_decider_keeps_short_prompts_whole() -> None:
    wl = _wl([0.0, 1.0, 2.0, 3.0], [10, 500, 20, 800], [3, 3, 3, 3])
    c = _disagg(wl, ["prefill", "decode"], decider={"kind": "prompt_len", "min": 256})
    t = c.request_table()
    assert t["disaggregated"].tolist() == [False, True, False, True]
    assert t["prefill_replica"].tolist() == [1, 0, 1, 0]  # whole: prefilled on the decode replica
    assert c.summary()["pools"]["transfer"]["count"] == 2
    assert c.summary()["n_completed"] == 4


def test_prefix_hit_decider_keeps_cached_prompts_on_the_decode_replica() -> None:
    """llm-d's threshold: request 1 shares request 0's 2,048-token prefix, which request 0 left in
    the decode replica's cache (it ran whole there: its prompt is short of cache); only 64 tokens
    are missing, fewer than 256, so it prefills locally too. Request 2 (another prefix) is disaggregated."""
    prefix = [((1, 2048),), ((1, 2048),), ((2, 2048),)]
    wl = _wl([0.0, 50.0, 100.0], [2112, 2112, 2112], [3, 3, 3], prefix)
    dec = Decider({"kind": "prefix_hit", "min_uncached": 256})
    reps = [_rep(), _rep()]
    router = make_pair_router("round-robin", dec)
    c = DisaggCluster(wl, reps, ["prefill", "decode"], router, {"bandwidth_gb_s": 1.0}, seed=0)
    steps = c.decisions()
    rid = next(steps)
    rid = steps.send((1, 1))  # request 0 whole on the decode replica: its prefix enters that cache
    p, d = router.route(rid, c.pview, c.dview)
    assert p is None and d == 0  # 2,112 - 2,048 = 64 uncached tokens
    rid = steps.send((1, 1))
    p, d = router.route(rid, c.pview, c.dview)
    assert (p, d) == (0, 0)  # a new prefix: all 2,112 uncached, disaggregated
    with pytest.raises(StopIteration):
        steps.send((0, 1))
    assert c.request_table()["disaggregated"].tolist() == [False, False, True]


def test_never_disaggregating_is_the_colocated_cluster() -> None:
    """Decode replicas only, the decider never splitting: request for request the colocated
    cluster with the same router and exact signals."""
    wl = _wl(np.sort(np.random.default_rng(3).uniform(0, 5, 40)), np.random.default_rng(4).integers(10, 900, 40),
             np.random.default_rng(5).integers(1, 60, 40))
    c = _disagg(wl, ["decode"] * 3, decider="never", latency="linear:d0=0.01,d1=1e-6", caps=[4000] * 3, bs=16)
    reps = [_rep(4000, "linear:d0=0.01,d1=1e-6", bs=16) for _ in range(3)]
    ref = Cluster(wl, reps, make_router("round-robin"), seed=0, refresh_s=0.0)
    ref.run()
    a, b = c.request_table(), ref.request_table()
    for col in ("first_token_s", "completion_s", "preemptions", "generated"):
        assert np.array_equal(a[col], b[col], equal_nan=True), col
    assert a["decode_replica"].tolist() == b["replica"].tolist()


def test_mixed_replicas_run_a_pair_on_one_replica_whole() -> None:
    wl = _wl([0.0, 0.5, 1.0], [100, 100, 100], [3, 3, 3])
    c = DisaggCluster(wl, [_rep(), _rep()], ["mixed", "mixed"], make_pair_router("round-robin"),
                      {"bandwidth_gb_s": 1.0}, seed=0)
    steps = c.decisions()
    next(steps)
    steps.send((0, 0))  # whole on replica 0
    steps.send((0, 1))  # prefill on 0, decode on 1
    with pytest.raises(StopIteration):
        steps.send((1, 0))
    t = c.request_table()
    assert t["disaggregated"].tolist() == [False, True, True]
    assert c.summary()["n_completed"] == 3


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 30), n_p=st.integers(0, 3), n_d=st.integers(1, 3), n_m=st.integers(0, 2),
       seed=st.integers(0, 10_000), shared=st.booleans(), bs=st.sampled_from([1, 16]),
       decider=st.sampled_from(["always", "never", {"kind": "prompt_len", "min": 300}]),
       router=st.sampled_from(["round-robin", "jsq", "random", "token-jsq"]),
       first=st.sampled_from(["prefill", "transfer"]))
def test_every_request_completes_once_within_memory(n, n_p, n_d, n_m, seed, shared, bs, decider, router,
                                                    first) -> None:
    if n_p + n_m == 0:
        n_p = 1
    rng = np.random.default_rng(seed)
    wl = _wl(np.sort(rng.uniform(0, 3, n)), rng.integers(1, 700, n), rng.integers(1, 40, n))
    roles = ["prefill"] * n_p + ["decode"] * n_d + ["mixed"] * n_m
    caps = rng.integers(800, 3000, len(roles)).tolist()
    c = _disagg(wl, roles, router=router, decider=decider, caps=caps, bs=bs, latency="linear:d0=0.01,d1=1e-6",
                transfer={"bandwidth_gb_s": float(rng.uniform(0.1, 50)), "base_s": 1e-3, "shared_link": shared,
                          "first_token": first})
    s, t = c.summary(), c.request_table()
    assert s["n_completed"] == n and s["n_unfinished"] == 0 and s["n_rejected"] == 0
    assert (t["generated"] == t["output_tokens"]).all()
    assert (t["first_token_s"] >= t["arrival_s"]).all() and (t["completion_s"] >= t["first_token_s"]).all()
    split = t["disaggregated"] & (t["output_tokens"] > 1)
    assert (t["transfer_start_s"][split] >= t["prefill_end_s"][split]).all()
    assert (t["transfer_end_s"][split] > t["transfer_start_s"][split]).all()
    assert (t["completion_s"][split] > t["transfer_end_s"][split]).all()
    dec_ok = np.isin(t["decode_replica"], [r for r, x in enumerate(roles) if x != "prefill"])
    assert dec_ok.all()
    log = c.iteration_log()
    cap = np.array([e.kv.capacity_tokens for e in c.engines])
    assert (log["kv_used"] <= cap[log["replica"]]).all()
    assert [e.kv.used_blocks for e in c.engines] == [0] * len(roles)  # no hold or reservation leaked
    assert s["pools"]["disaggregated"] + s["pools"]["local"] == n


def test_simulate_cluster_with_pools_on_a_scenario() -> None:
    kw = dict(seed=0, overrides={"workload.n_requests": 120})
    col = simulate_cluster("azure-conv", n_replicas=2, refresh_s=0.0, **kw)
    slow = simulate_cluster("azure-conv", pools={"prefill": {"n": 1}, "decode": {"n": 1}},
                            transfer={"bandwidth_gb_s": 2.0}, **kw)
    fast = simulate_cluster("azure-conv", pools={"prefill": {"n": 1}, "decode": {"n": 1}},
                            transfer={"link": "nvlink-a100"}, **kw)
    for r in (col, slow, fast):
        assert r.summary["n_completed"] == 120
    assert "pools" not in col.summary and col.summary["cluster"]["n_replicas"] == 2
    assert slow.summary["ttft_s"] == fast.summary["ttft_s"]
    assert fast.summary["e2e_s"]["mean"] < slow.summary["e2e_s"]["mean"]
    assert fast.summary["pools"]["transfer"]["bandwidth_gb_s"] == 300.0
    assert set(fast.requests) >= {"prefill_replica", "decode_replica", "transfer_end_s", "room_wait_s"}


@pytest.mark.parametrize(("kw", "message"), [
    ({"pools": {"prefil": {"n": 1}}}, "pools.prefil: unknown pool (allowed: prefill, decode, mixed)"),
    ({"pools": {"prefill": {"n": 1, "size": 2}, "decode": {}}}, "pools.prefill.size: unknown setting"),
    ({"pools": {"prefill": {"n": -1}, "decode": {}}}, "pools.prefill.n: expected an integer in 0..4096, got -1"),
    ({"pools": {"prefill": {"n": 2}}}, "pools.decode.n: expected at least one decode (or mixed) replica"),
    ({"pools": {"decode": {"n": 2}}}, "pools.prefill.n: expected at least one prefill (or mixed) replica"),
    ({"pools": {"prefill": {}, "decode": {}}, "decider": "sometimes"}, "decider.kind: unknown 'sometimes'"),
    ({"pools": {"prefill": {}, "decode": {}}, "decider": {"kind": "prompt_len"}},
     "decider.min: expected an integer >= 0, got None"),
    ({"pools": {"prefill": {}, "decode": {}}, "transfer": {"bandwidth_gb_s": -1}},
     "transfer.bandwidth_gb_s: expected a finite number > 0"),
    ({"pools": {"prefill": {}, "decode": {"policy": "vtc"}}}, "pools.decode.policy: 'vtc' keeps per-request arrays"),
    ({"pools": {"prefill": {}, "decode": {}}, "n_replicas": 3}, "cluster.n_replicas: 3 differs from the pools' 2"),
    ({"transfer": {"bandwidth_gb_s": 5}}, "cluster.transfer: transfer and decider apply to pools"),
    ({"pools": {"prefill": {}, "decode": {}}, "router": {"prefill": "jsq", "middle": "jsq"}},
     "router.middle: unknown pool (allowed: prefill, decode)"),
    ({"pools": {"prefill": {}, "decode": {}}, "router": {"prefill": "llm-d:w_queue=heavy"}},
     "router.prefill.w_queue: expected a number"),
    ({"pools": {"prefill": {"router": "nearest"}, "decode": {}}}, "pools.prefill.router: unknown 'nearest'"),
])
def test_bad_pool_settings_are_one_line_errors(kw, message) -> None:
    with pytest.raises(ConfigError) as e:
        simulate_cluster("azure-conv", overrides={"workload.n_requests": 5}, **kw)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_pool_routers_take_name_and_parameters() -> None:
    r = simulate_cluster("azure-conv", overrides={"workload.n_requests": 30}, seed=0,
                         router={"prefill": "llm-d:prefix=none", "decode": "jsq"},
                         pools={"prefill": {"n": 2}, "decode": {"n": 2, "router": "token-jsq"}})
    pair = r.cluster.router
    assert (pair.prefill.name, pair.prefill.prefix, pair.decode.name) == ("llm-d", "none", "token-jsq")
    assert r.summary["cluster"]["router"] == "llm-d+token-jsq" and r.summary["n_completed"] == 30


def test_tensor_parallel_pools_ship_their_shards_in_parallel() -> None:
    """A TP-2 prefill replica sends to a TP-4 decode replica over two links: the 100 prompt tokens
    of Llama-3.1-8B (131,072 B each) take 100 x 131,072 / 2 B over 1 GB/s."""
    from llmsched_gym.core.models import get_model

    m = get_model("llama-3.1-8b")
    c = DisaggCluster(_wl([0.0], [100], [3]), [_rep(), _rep()], ["prefill", "decode"], make_pair_router("round-robin"),
                      {"bandwidth_gb_s": 1.0, "base_s": 0.0}, seed=0, transfer_models=[(m, 2), (m, 4)])
    c.run()
    t = c.request_table()
    assert t["transfer_end_s"][0] - t["transfer_start_s"][0] == pytest.approx(100 * 131_072 / 2 / 1e9, abs=1e-12)
    assert c.summary()["pools"]["transfer"]["bytes"] == 100 * 131_072


def test_transfer_sizing_comes_from_the_batch_time_model() -> None:
    from llmsched_gym.core.disagg import transfer_model_of

    def of(lat: str):
        model, tp = transfer_model_of(_rep(latency=lat))
        return getattr(model, "name", model), tp

    assert of("roofline:llama-2-70b/a100x2") == ("Llama-2-70B", 2)
    assert of("calibrated:llama-2-7b/a100") == ("Llama-2-7B", 1)
    assert of("unit") == (KVB, 1)  # no architecture: the engine's KV bytes per token at TP 1
    r = simulate_cluster("azure-conv", overrides={"workload.n_requests": 20}, seed=0,
                         pools={"prefill": {"latency": "roofline:llama-2-70b/a100x2"},
                                "decode": {"latency": "roofline:llama-2-70b/a100x2", "tp": 1}},
                         transfer={"bandwidth_gb_s": 10.0, "base_s": 0.0})
    t = r.requests
    moved = np.isfinite(t["transfer_end_s"])
    want = t["prompt_tokens"][moved] * 327_680 / 1 / 10e9  # min(TP 2, TP 1) = one link
    assert np.allclose(t["transfer_end_s"][moved] - t["transfer_start_s"][moved], want, rtol=1e-12, atol=1e-12)


def test_splitwise_mixed_pool_falls_back_to_the_mixed_replica() -> None:
    """SplitwiseSim's MixedPoolScheduler: request 0 takes the dedicated pools; request 1 (same
    time) finds the prefill queue long (500 pending + 800 > 100 tokens) and the decode replica too
    small (800 + 100 > 700 tokens), so both halves go to the mixed replica: it runs whole there."""
    from baselines.route_pair import SplitwiseMixed

    wl = _wl([0.0, 0.0], [500, 800], [100, 100])
    reps = [_rep(100_000), _rep(700), _rep(100_000)]
    c = DisaggCluster(wl, reps, ["prefill", "decode", "mixed"], SplitwiseMixed(prompt_max_pending_tokens=100),
                      {"bandwidth_gb_s": 1.0}, seed=0)
    c.run()
    t = c.request_table()
    assert t["prefill_replica"].tolist() == [0, 2] and t["decode_replica"].tolist() == [1, 2]
    assert t["disaggregated"].tolist() == [True, False] and c.summary()["n_completed"] == 2
    r = simulate_cluster("azure-conv", router="splitwise-mixed", overrides={"workload.n_requests": 60}, seed=0,
                         pools={"prefill": {"n": 1}, "decode": {"n": 1}, "mixed": {"n": 1}})
    assert r.summary["cluster"]["router"] == "splitwise-mixed" and r.summary["n_completed"] == 60


def test_a_scenario_cluster_section_declares_the_pools() -> None:
    """``cluster: {pools, transfer, decider, router}`` in a scenario runs the same system as the
    arguments; one engine refuses such a scenario in one line; transfer without pools is refused."""
    from llmsched_gym.core.scenarios import build_scenario, resolve_scenario
    from llmsched_gym.goodput import Serving
    from llmsched_gym.sim import simulate

    wl, _, _ = build_scenario(resolve_scenario("azure-conv", {"workload.n_requests": 80}), 3)
    pools = {"prefill": {"n": 1}, "decode": {"n": 2, "policy": "vllm-v1"}}
    # the median prompt: some requests are kept whole, on the trace and on its synthetic stand-in alike
    transfer, decider = {"bandwidth_gb_s": 2.0}, {"kind": "prompt_len", "min": int(np.median(wl.prompt_tokens))}
    kw = dict(seed=3, overrides={"workload.n_requests": 80})
    by_args = simulate_cluster("azure-conv", router="lor", pools=pools, transfer=transfer, decider=decider, **kw)
    section = {"cluster.pools": pools, "cluster.transfer": transfer, "cluster.decider": decider,
               "cluster.router": "lor", "workload.n_requests": 80}
    by_section = simulate_cluster("azure-conv", seed=3, overrides=section)
    for key in ("decode_replica", "prefill_replica", "completion_s", "transfer_end_s"):
        assert np.array_equal(by_args.requests[key], by_section.requests[key], equal_nan=True), key
    assert 0 < by_section.summary["pools"]["disaggregated"] < 80  # the decider kept short prompts whole
    assert Serving("azure-conv", overrides=section).gpus() == 3
    with pytest.raises(ConfigError, match=r"^cluster\.pools: this scenario declares prefill/decode pools"):
        simulate("azure-conv", overrides=section)
    with pytest.raises(ConfigError, match=r"^cluster\.transfer: transfer and decider apply to pools"):
        simulate_cluster("azure-conv", overrides={"cluster.transfer": transfer, "workload.n_requests": 5})
