"""Prefix-aware traffic: the Mooncake loader, its catalogue entry and stand-in, and prefix_groups."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsched_gym import data
from llmsched_gym.core import traces
from llmsched_gym.core.kv import KVCache
from llmsched_gym.core.request import WorkloadError
from llmsched_gym.core.sessions import prefix_groups


def _write(tmp_path, rows) -> str:
    p = tmp_path / "mc.jsonl"
    p.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(p)


def test_mooncake_rows_become_512_token_segments(tmp_path) -> None:
    path = _write(tmp_path, [
        {"timestamp": 1000, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]},
        {"timestamp": 1500, "input_length": 600, "output_length": 7, "hash_ids": [0, 3]},
        {"timestamp": 1250, "input_length": 512, "output_length": 1, "hash_ids": [4]},
    ])
    wl = traces.load_trace("mooncake", path)
    # sorted by time, relative to the first row, in seconds
    assert wl.arrival_s.tolist() == [0.0, 0.25, 0.5]
    assert wl.meta["resorted"] is True
    assert wl.prompt_tokens.tolist() == [1100, 512, 600]
    assert wl.output_tokens.tolist() == [5, 1, 7]
    assert wl.prefix == [((0, 512), (1, 512), (2, 76)), ((4, 512),), ((0, 512), (3, 88))]
    # the prefix cache shares exactly the repeated block: 512 tokens = 32 blocks of 16
    kv = KVCache(10**6, 16, wl, True)
    h0, h2 = kv.block_hashes(0), kv.block_hashes(2)
    assert len(h0) == 1100 // 16 and len(h2) == 600 // 16
    shared = next(i for i, (a, b) in enumerate(zip(h0, h2, strict=False)) if a != b)
    assert shared == 32


def test_load_trace_hands_out_independent_copies(tmp_path) -> None:
    # load_trace parses a file once and hands out copies (env resets reload it every episode): what
    # a caller changes in one copy (arrays, the prefix list, meta) never reaches the next
    path = _write(tmp_path, [
        {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 500, "input_length": 512, "output_length": 7, "hash_ids": [0]},
    ])
    a = traces.load_trace("mooncake", path)
    a.prompt_tokens[0] = 1
    a.arrival_s[1] = 9.0
    a.prefix[0] = None
    a.prefix.append(((7, 1),))
    a.meta["source"] = "changed"
    b = traces.load_trace("mooncake", path)
    assert b.prompt_tokens.tolist() == [600, 512]
    assert b.arrival_s.tolist() == [0.0, 0.5]
    assert b.prefix == [((0, 512), (1, 88)), ((0, 512),)]
    assert b.meta["source"].endswith("mc.jsonl")
    assert b.prefix is not a.prefix and b.arrival_s is not a.arrival_s


@pytest.mark.parametrize(("row", "message"), [
    ({"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1]},
     r"mc\.jsonl:1: hash_ids: expected 3 blocks of 512 tokens for input_length 1100, got 2"),
    ({"timestamp": 0, "input_length": 10, "output_length": 5}, r"mc\.jsonl:1: hash_ids: required key is missing"),
    ({"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": ["a"]},
     r"mc\.jsonl:1: hash_ids: expected a list of integers"),
    ({"timestamp": 0, "input_length": 10, "output_length": 0, "hash_ids": [1]}, r"mc\.jsonl:1: output_length"),
    ("{not json", r"mc\.jsonl:1: row: expected a JSON object, got invalid JSON"),
])
def test_mooncake_bad_rows_name_line_and_field(tmp_path, row, message) -> None:
    with pytest.raises(traces.TraceError, match=message):
        traces.load_mooncake(_write(tmp_path, [row]))


def test_mooncake_catalogue_entry() -> None:
    ds = data.known("mooncake-conv")
    assert ds is data.known("mooncake_conversation_trace.jsonl")
    assert ds.url.startswith("https://raw.githubusercontent.com/kvcache-ai/Mooncake/")
    assert ds.url.endswith("/FAST25-release/traces/conversation_trace.jsonl")
    assert ds.sha256 == "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df"
    assert ds.size == 3_029_533 and "FAST 2025" in ds.citation
    assert traces.DEFAULT_FILES["mooncake"] == ds.filename


def test_mooncake_stand_in_matches_the_trace_statistics() -> None:
    wl = traces.synthetic_mooncake_conv(0)
    s = traces.trace_stats(wl)
    assert s["n"] == 12031
    assert s["input"]["mean"] == pytest.approx(12035, rel=0.05)
    assert s["output"]["mean"] == pytest.approx(343, rel=0.05)
    assert s["rate"] == pytest.approx(3.4, rel=0.05)
    kv = KVCache(10**9, 512, wl, True)
    seen: set[int] = set()
    rep = tot = 0
    for i in range(len(wl)):
        for h in kv.block_hashes(i):
            tot += 1
            rep += h in seen
            seen.add(h)
    assert rep / tot == pytest.approx(0.37, abs=0.03)


def test_mooncake_scenario_runs_on_the_stand_in(monkeypatch) -> None:
    from llmsched_gym.sim import simulate

    monkeypatch.setattr(data, "resolve_data", lambda n: None)
    monkeypatch.setattr(data, "notify_fallback", lambda n: None)
    r = simulate("mooncake-conv", seed=0, overrides={"workload.n_requests": 60})
    assert r.summary["workload_source"]["kind"] == "synthetic"
    assert r.summary["n_completed"] == 60
    assert r.summary["prefix_hit_tokens"] > 0


def test_prefix_groups_structure() -> None:
    wl = prefix_groups(6, 2.0, groups=3, system_tokens=100, question_tokens=10, output_tokens=5, turns=3,
                       think_s=1000.0, rng=0, first_segment_id=50)
    # two sessions of three turns; turns 1000 s apart, so each session's turns come in order
    assert len(wl) == 6 and wl.arrival_s[0] == 0.0
    # sessions start seconds apart, turns 1000 s apart: rows 0, 2, 4 are session 0's turns
    t1, t2, t3 = wl.prefix[0], wl.prefix[2], wl.prefix[4]
    assert t1[0][0] in (50, 51, 52) and t1[0][1] == 100 and wl.prefix[1][0][1] == 100
    # turn 2 = turn 1's prompt + its answer + a new question; turn 3 likewise
    assert t2[:2] == t1 and len(t2) == 4 and t2[2][1] == 5 and t2[3][1] == 10
    assert t3[:4] == t2 and len(t3) == 6
    assert wl.prompt_tokens[[0, 2, 4]].tolist() == [110, 125, 140]
    # the two sessions share nothing but (perhaps) the system prompt
    assert set(wl.prefix[1][1:]) & set(t3) == set()


def test_prefix_groups_llm_d_shape_and_errors() -> None:
    wl = prefix_groups(3000, 30.0, groups=150, system_tokens=6000, question_tokens=1200, output_tokens=1000, rng=1)
    heads = {p[0][0] for p in wl.prefix}
    assert len(heads) == 150 and all(p[0][1] == 6000 for p in wl.prefix)
    assert (wl.prompt_tokens == 7200).all()
    assert len(wl) / wl.arrival_s[-1] == pytest.approx(30.0, rel=0.1)
    with pytest.raises(WorkloadError, match=r"groups: expected an integer >= 1, got 0"):
        prefix_groups(10, 1.0, groups=0, system_tokens=1, question_tokens=1, output_tokens=1)
    with pytest.raises(WorkloadError, match=r"rate: expected a number > 0"):
        prefix_groups(10, -1.0, groups=1, system_tokens=1, question_tokens=1, output_tokens=1)
    g = prefix_groups(500, 5.0, groups=2, system_tokens=64, question_tokens=100, output_tokens=50, rng=2,
                      length_cv=1.0)
    assert np.std(g.output_tokens) > 10 and g.output_tokens.min() >= 1


def test_completed_requests_leave_no_block_hash_lists() -> None:
    """Memory follows the live requests: once a request completes its block-hash list is dropped
    (a cluster's routing index drops it once the request is routed); asked again, it is equal."""
    from llmsched_gym.cluster_sim import make_cluster

    wl = prefix_groups(300, 40.0, 5, 256, 64, 16, rng=0)
    c, _ = make_cluster("mooncake-conv", "vllm-v1", "llm-d-approx", 2, 0, workload=wl)
    before = [list(c.view.block_hashes(g)) for g in range(3)]
    c.run()
    assert c.summary()["n_completed"] == 300
    assert all(not e.kv._hashes for e in c.engines)
    assert all(not h._hashes for h in c._hashers.values())
    assert [c.view.block_hashes(g) for g in range(3)] == before


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.lists(st.integers(0, 6), max_size=6)), max_size=30),
       st.lists(st.integers(0, 6), max_size=6), st.integers(0, 5))
def test_prefix_indexes_match_each_replica_by_brute_force(ops, query, capacity) -> None:
    """The inverted map gives every replica the leading blocks its own LRU index holds."""
    from collections import OrderedDict

    from baselines.route_index import PrefixIndexes

    ix, lru = PrefixIndexes(4, capacity), [OrderedDict() for _ in range(4)]
    for r, keys in ops:
        ix.insert(r, keys)
        for k in keys:
            lru[r][k] = None
            lru[r].move_to_end(k)
        while capacity and len(lru[r]) > capacity:
            lru[r].popitem(last=False)
    want = []
    for r in range(4):
        m = 0
        while m < len(query) and query[m] in lru[r]:
            m += 1
        want.append(m)
    assert ix.match(query).tolist() == want
    assert ix.sizes.tolist() == [len(x) for x in lru]
    assert ix.owners == {k: sum(1 << r for r in range(4) if k in lru[r]) for k in set().union(*lru)}
