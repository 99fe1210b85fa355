"""SLO attainment (core/metrics.py), the goodput search (goodput.py), the placement candidates
(placement.py) and ``llmsched goodput``."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from llmsched_gym.cli import main
from llmsched_gym.config import ConfigError
from llmsched_gym.core.metrics import slo_attainment
from llmsched_gym.core.scenarios import get_scenario, resolve_scenario
from llmsched_gym.goodput import (
    Serving,
    at_rate,
    base_workloads,
    find_goodput,
    own_rate,
    parse_slo,
    tensor_parallel,
)
from llmsched_gym.placement import candidates, capacity_at
from llmsched_gym.sim import simulate


def unit_chain(n: int = 20, gap: float = 1.0, output: int = 2) -> dict:
    """Requests every ``gap`` s on the unit batch-time model: every iteration takes 1 s whatever
    it holds, so a request alone has TTFT 1 s (its prefill) and TPOT 1 s; at gaps under 1 s a
    request arriving during an iteration waits for it to end (TTFT > 1 s) unless it lands exactly on
    an iteration boundary."""
    return {"name": "unit-chain",
            "workload": {"explicit": {"arrival_s": [gap * i for i in range(n)], "prompt_tokens": [8] * n,
                                      "output_tokens": [output] * n}},
            "engine": {"kv_capacity_tokens": 100_000, "block_size": 1, "prefill_emits_token": True},
            "latency": "unit", "policy": "fcfs"}


# --- attainment -------------------------------------------------------------------------------

def test_attainment_counts_every_arrived_request_with_the_documented_rules():
    table = {"state": np.array([3, 3, 3, 2, 4, 3]),          # completed x3, running, rejected, completed
             "ttft_s": np.array([0.1, 0.5, 0.2, 0.2, np.nan, 0.3]),
             "tpot_s": np.array([0.02, 0.01, 0.09, np.nan, np.nan, np.nan])}  # last: one output token
    s = slo_attainment(table, ttft_s=0.25, tpot_s=0.05)
    # TTFT met: rows 0, 2, 3 (the running one got its first token in time); TPOT met: rows 0, 1, 5
    assert s == {"ttft_s": 0.25, "tpot_s": 0.05, "n": 6, "ttft_attainment": 0.5, "tpot_attainment": 0.5,
                 "attainment": 1 / 6}
    # no TPOT target: only the TTFT matters, and unfinished requests do not meet "completion"
    assert slo_attainment(table, ttft_s=0.25)["tpot_attainment"] == 4 / 6
    with pytest.raises(ValueError, match=r"slo.tpot_s: expected a number of seconds > 0"):
        slo_attainment(table, 1.0, 0.0)


@given(st.lists(st.tuples(st.sampled_from([1, 2, 3, 4]), st.floats(0, 5), st.floats(0, 1)), min_size=1, max_size=40),
       st.floats(0.01, 5), st.floats(0.01, 5), st.floats(1.0, 3.0))
def test_attainment_is_monotone_in_the_targets_and_bounded_by_each(rows, ttft, tpot, looser):
    state = np.array([r[0] for r in rows])
    table = {"state": state, "ttft_s": np.array([r[1] if r[0] != 4 else np.nan for r in rows]),
             "tpot_s": np.array([r[2] if r[0] == 3 else np.nan for r in rows])}
    a, b = slo_attainment(table, ttft, tpot), slo_attainment(table, ttft * looser, tpot * looser)
    for k in ("ttft_attainment", "tpot_attainment", "attainment"):
        assert b[k] >= a[k]
    assert a["attainment"] <= min(a["ttft_attainment"], a["tpot_attainment"])
    assert a["attainment"] >= a["ttft_attainment"] + a["tpot_attainment"] - 1 - 1e-12


def test_slo_section_adds_the_attainment_and_leaves_the_rest_of_the_summary_unchanged():
    over = {"workload.n_requests": 200}
    plain = simulate("azure-conv", overrides=over).summary
    with_slo = simulate("azure-conv", overrides={**over, "slo.ttft_s": 2.0, "slo.tpot_s": 0.1}).summary
    slo = with_slo.pop("slo")
    assert "slo" not in plain
    plain.pop("wall_time_s"), with_slo.pop("wall_time_s")
    assert plain == with_slo
    r = simulate("azure-conv", overrides=over)
    assert slo == slo_attainment(r.requests, 2.0, 0.1)


@pytest.mark.parametrize(("over", "message"), [
    ({"slo.ttft_s": 0}, "slo.ttft_s: expected a number > 0, got 0"),
    ({"slo.tpot": 0.1}, "slo.tpot: unknown field; allowed: ttft_s, tpot_s"),
    ({"slo": {}}, "slo: expected ttft_s and/or tpot_s (seconds), got an empty section"),
    ({"slo.ttft_s": "fast"}, "slo.ttft_s: expected a number > 0, got 'fast'"),
])
def test_bad_slo_section_is_one_line_naming_the_field(over, message):
    with pytest.raises(ConfigError) as e:
        get_scenario("azure-conv", over)
    assert str(e.value) == message


@pytest.mark.parametrize(("text", "expected"), [
    ("ttft=0.25,tpot=0.1", {"ttft_s": 0.25, "tpot_s": 0.1}),
    ("ttft=250ms, tpot=100ms", {"ttft_s": 0.25, "tpot_s": 0.1}),
    ("tpot=2s", {"tpot_s": 2.0}),
])
def test_parse_slo(text, expected):
    got = parse_slo(text)
    assert got.keys() == expected.keys() and all(math.isclose(got[k], v) for k, v in expected.items())


@pytest.mark.parametrize("text", ["", "ttft", "ttft=0", "ttft=-1", "ttft=1,ttft=2", "e2e=1", "ttft=nan", "ttft=abc"])
def test_parse_slo_rejects_with_one_line(text):
    with pytest.raises(ConfigError, match=r"^--slo: "):
        parse_slo(text)


# --- the search -------------------------------------------------------------------------------

@given(st.lists(st.floats(0.0, 100.0), min_size=2, max_size=50, unique=True), st.floats(0.01, 100.0))
@example([0.0, 2.2e-309], 1.0)  # a subnormal span: own_rate() alone would overflow
def test_at_rate_keeps_the_sequence_and_hits_the_mean_rate(arrivals, rate):
    from llmsched_gym.core.request import Workload

    a = np.sort(np.array(arrivals))
    wl = Workload(arrival_s=a - a[0], prompt_tokens=np.ones(len(a), int), output_tokens=np.ones(len(a), int))
    scaled = at_rate(wl, rate)
    assert math.isclose(own_rate(scaled), rate, rel_tol=1e-9)
    gaps, new_gaps = np.diff(wl.arrival_s), np.diff(scaled.arrival_s)
    # common random numbers: every gap scaled by one factor (compared as shares of the span, which a
    # span near the smallest float cannot overflow)
    assert np.allclose(new_gaps / np.ptp(scaled.arrival_s), gaps / np.ptp(wl.arrival_s), rtol=1e-9, atol=1e-12)
    assert np.array_equal(scaled.prompt_tokens, wl.prompt_tokens)


def test_goodput_of_the_unit_chain_is_exactly_one_request_per_second():
    """One output token: each request holds the engine for one 1-s iteration. At 1 req/s or less
    each is served alone (TTFT 1 s); above it, a request arriving during an iteration waits for its
    end (TTFT > 1 s) unless it lands on a boundary, so at most half meet TTFT <= 1 s."""
    serving = Serving(unit_chain(output=1))
    for start in (None, 0.3, 7.0):  # whichever side the bracket starts from
        res = find_goodput(serving, {"ttft_s": 1.0, "tpot_s": 1.0}, 0.9, n_requests=None, rel_tol=0.01,
                           start_rate=start)
        assert res.goodput == pytest.approx(1.0, rel=0.01) and res.goodput <= 1.0
        assert res.per_gpu == res.goodput and res.gpus == 1 and not res.capped and res.note == ""
        passed = max(p.rate for p in res.points if p.passed)
        failed = min(p.rate for p in res.points if not p.passed)
        assert passed == res.goodput and failed / passed <= 1.01  # the bracket closed within rel_tol
        assert all(p.attainment <= 0.5 for p in res.points if p.rate > 1.0)
        assert all(p.attainment == 1.0 for p in res.points if p.rate <= 1.0)
    assert find_goodput(serving, {"ttft_s": 1.0}, n_requests=None).goodput == 1.0  # starts at its own 1 req/s


def test_a_non_monotone_attainment_gives_the_boundary_the_bracket_finds():
    """Two output tokens: a request holds the engine for two iterations (prefill, then decode). At
    exactly 1 req/s each arrival lands on an iteration boundary and joins the batch (TTFT 1 s); between
    0.5 and 1 req/s arrivals land inside the decode iteration and wait. So attainment passes at 1 and
    at 0.5 or less, and fails between: the search reports a passing rate with a failing one within
    ``rel_tol`` above it, which depends on where the bracket starts (the module docstring's caveat)."""
    serving = Serving(unit_chain(output=2))
    from_own = find_goodput(serving, {"ttft_s": 1.0}, n_requests=None, rel_tol=0.01)  # starts at 1 req/s
    from_low = find_goodput(serving, {"ttft_s": 1.0}, n_requests=None, rel_tol=0.01, start_rate=0.3)
    assert from_own.goodput == 1.0
    assert from_low.goodput == pytest.approx(0.5, rel=0.01) and from_low.goodput <= 0.5
    dip = [p for p in from_own.points + from_low.points if 0.5 < p.rate < 1.0]
    assert dip and not any(p.passed for p in dip)


def test_unattainable_and_unbounded_slos_are_reported():
    serving = Serving(unit_chain())
    res = find_goodput(serving, {"tpot_s": 0.5}, n_requests=None, max_steps=4)  # every TPOT is 1 s
    assert res.goodput == 0.0 and "missed even at" in res.note and len(res.points) == 5
    # TTFT <= 2 s always holds on the unit model (each iteration prefills every waiting request)
    res = find_goodput(serving, {"ttft_s": 2.0}, n_requests=None, max_steps=3)
    assert res.capped and res.goodput == 8.0 and all(p.passed for p in res.points)


def test_goodput_is_monotone_in_the_slo_and_the_target_on_a_loaded_engine():
    serving = Serving("azure-conv")
    kw = {"n_requests": 300, "rel_tol": 0.02}
    tight = find_goodput(serving, {"ttft_s": 1.0, "tpot_s": 0.1}, **kw)
    loose = find_goodput(serving, {"ttft_s": 4.0, "tpot_s": 0.1}, **kw)
    lax = find_goodput(serving, {"ttft_s": 1.0, "tpot_s": 0.1}, attainment=0.5, **kw)
    assert 0 < tight.goodput <= loose.goodput and tight.goodput <= lax.goodput
    # the same rate runs the same simulation: attainments at the shared first rate are ordered
    assert tight.points[0].rate == loose.points[0].rate
    assert tight.points[0].attainment <= loose.points[0].attainment


def test_a_colocated_cluster_counts_its_gpus_and_pools_seeds():
    two = Serving("azure-conv", n_replicas=2, router="lor")
    assert two.gpus() == 2 and two.name() == "colocated 2 replicas, lor (fcfs)"
    res = find_goodput(two, {"ttft_s": 2.0, "tpot_s": 0.1}, seeds=(0, 1), n_requests=200, rel_tol=0.1)
    assert res.per_gpu == res.goodput / 2 and res.seeds == [0, 1] and res.goodput > 0
    wls = base_workloads(two, (0, 1), 200)
    assert len(wls) == 2 and all(w.arrival_s[0] == 0 and len(w) == 200 for w in wls)


def test_tensor_parallel_degree_of_the_batch_time_models():
    from llmsched_gym.core.latency import make_latency

    assert tensor_parallel(make_latency("roofline:llama-2-70b/2xa100")) == 2
    assert tensor_parallel(make_latency("calibrated:llama-2-70b/2xa100")) == 2
    assert tensor_parallel(make_latency("unit")) == 1
    assert Serving("azure-conv", {"latency": "calibrated:llama-2-70b/2xa100"}, n_replicas=3).gpus() == 6


# --- placement --------------------------------------------------------------------------------

def test_placement_candidates_spend_exactly_the_budget():
    cands = candidates(4, [1, 2])
    labels = [c.label() for c in cands]
    assert labels == ["colocated 4 x TP1", "colocated 2 x TP2",
                      "1P x TP1 + 3D x TP1", "2P x TP1 + 2D x TP1", "3P x TP1 + 1D x TP1",
                      "2P x TP1 + 1D x TP2", "1P x TP2 + 2D x TP1", "1P x TP2 + 1D x TP2"]
    assert all(c.gpus == 4 for c in cands)
    with pytest.raises(ConfigError, match=r"^--gpus: expected an integer in 2..1024"):
        candidates(1, [1])


def test_capacity_scales_with_the_memory_left_after_the_weights():
    from dataclasses import replace

    from llmsched_gym.core.models import get_gpu, get_model, kv_capacity_tokens
    from llmsched_gym.core.profile import find_profile

    if find_profile("a100/llama-2-7b") is None:
        pytest.skip("Vidur's profiles are not on this machine")
    spec = resolve_scenario("azure-conv", {"latency": "vidur:a100/llama-2-7b"})
    m, g = get_model("llama-2-7b"), get_gpu("a100")
    assert capacity_at(spec, 1) == 118_784  # the scenario's own
    want = int(118_784 * kv_capacity_tokens(m, replace(g, count=2)) / kv_capacity_tokens(m, g)) // 16 * 16
    assert capacity_at(spec, 2) == want


# --- the command ------------------------------------------------------------------------------

def test_cli_goodput_prints_the_table_and_the_answer(tmp_path, capsys):
    out = tmp_path / "g.json"
    rc = main(["goodput", "--scenario", "azure-conv", "--slo", "ttft=2,tpot=100ms", "--requests", "200",
               "--tol", "0.1", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "rate req/s" in text and "goodput:" in text and "req/s per GPU" in text and "s wall" in text
    data = json.loads(out.read_text())
    assert data["goodput_per_gpu"] == data["goodput_req_s"] > 0 and data["slo"] == {"ttft_s": 2.0, "tpot_s": 0.1}


@pytest.mark.parametrize(("argv", "message"), [
    (["--slo", "ttft=zero"], "error: --slo: ttft: expected"),
    (["--slo", "ttft=1", "--attainment", "1.5"], "error: --attainment: expected a fraction in (0, 1], got 1.5"),
    (["--slo", "ttft=1", "--pools", "prefill=1"], "error: --pools: expected prefill=P,decode=D"),
    (["--slo", "ttft=1", "--seeds", "a"], "error: --seeds: expected seeds >= 0"),
    (["--slo", "ttft=1", "--gpus", "4"], "error: --gpus/--tp: only with --placement"),
    (["--slo", "ttft=1", "--placement"], "error: --placement: give the GPU budget with --gpus N"),
    ([], "error: --slo: the scenario has no slo section"),
    (["--slo", "ttft=1", "--start-rate", "-1"], "error: --start-rate: expected a rate > 0 (req/s), got -1.0"),
    (["--slo", "ttft=1", "--placement", "--gpus", "1"], "error: --gpus: expected an integer in 2..1024"),
    (["--slo", "ttft=1", "--placement", "--gpus", "4", "--tp", "3"],
     "error: --tp: no batch-time model at tensor-parallel degree 3; allowed: 1"),
    (["--slo", "ttft=1", "--policy", "nope"], "error: policy: unknown 'nope'"),
])
def test_cli_goodput_errors_are_one_line(argv, message, capsys):
    rc = main(["goodput", "--scenario", "azure-conv", *argv])
    out, err = capsys.readouterr()
    assert rc == 2 and err.startswith(message) and err.count("\n") == 1 and out == ""


def test_a_cluster_scenario_runs_its_section_unless_told_otherwise():
    serving = Serving("prefix-groups-8")
    c = serving.cluster()
    assert c["n_replicas"] == 8 and serving.gpus() == 16  # Qwen3-32B on two H100s per replica (TP 2)
    assert serving.name().startswith("colocated 8 replicas")
    assert Serving("prefix-groups-8", n_replicas=2).gpus() == 4
    wl = base_workloads(serving, (0,), 50)[0]  # the requests, without the one-engine refusal
    assert len(wl) == 50 and wl.arrival_s[0] == 0.0


def test_placement_search_scores_every_split_and_refines_the_best():
    from llmsched_gym.placement import search_placement

    seen = []
    res = search_placement(Serving("azure-conv", router="lor"), {"ttft_s": 2.0, "tpot_s": 0.1}, gpus=3,
                           n_requests=150, rel_tol=0.05, coarse_tol=0.2, progress=lambda c, r: seen.append(c.label()))
    assert seen == ["colocated 3 x TP1", "1P x TP1 + 2D x TP1", "2P x TP1 + 1D x TP1"]  # calibrated: TP 1 only
    per_gpu = [r.per_gpu for _, r in res.rows]
    assert per_gpu == sorted(per_gpu, reverse=True) and all(r.gpus == 3 for _, r in res.rows)
    cand, best = res.best
    assert cand == res.rows[0][0] and best.goodput > 0
    assert "placement" in res.table() and cand.label() in res.table()


def test_at_rate_refuses_a_workload_arriving_at_one_instant():
    from llmsched_gym.core.request import Workload

    wl = Workload(arrival_s=np.zeros(3), prompt_tokens=np.ones(3, int), output_tokens=np.ones(3, int))
    with pytest.raises(ConfigError, match=r"^workload\.arrival_s: every request arrives at one instant"):
        at_rate(wl, 2.0)
