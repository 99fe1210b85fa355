"""Fuzzing: random scenario x policy x engine overrides, and a corpus of malformed traces.

``test_random_configurations_keep_the_contracts`` draws a scenario, a registered policy, a seed,
overrides (50-500 requests, or none one draw in fifty; KV capacity, block size, overflow handler,
preemption mode, batch-time noise, horizon, whether prefill emits a token, prefix caching, fast
forward, an iteration cap) and, one draw in three, some of the policy's parameters (numbers, flags,
the admission/memory rule) and checks on every run:

* the outcome is a summary, or the project's one-line error (a ``ValueError`` such as a policy that
  does not apply to the scenario), never a PlanError and never another exception;
* conservation: every arrived request is completed, rejected with a reason, or reported unfinished;
* memory: under ``overflow="forbid"`` the KV in use never exceeds the capacity;
* liveness: a run the loop detector stops has something running (a thrashing policy), never an idle
  engine with requests waiting (a policy that waits for room it already has);
* determinism: the same seed gives the same summary and the same per-request table.

CI runs a few derandomized examples (``tests/conftest.py``'s ``ci`` profile); run it longer locally
with ``LLMSCHED_FUZZ_EXAMPLES=2000 python -m pytest tests/test_fuzz.py``.

The trace corpus pairs malformed files with the exact one-line message each must give.
"""

from __future__ import annotations

import math
import os
import tracemalloc

import numpy as np
import pytest
from conftest import small_cuts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baselines import available, policy_params
from llmsched_gym.config import OVERFLOW_HANDLERS, PREEMPT_MODES
from llmsched_gym.core import traces as T
from llmsched_gym.core.scheduler import PlanError
from llmsched_gym.core.traces import TraceError
from llmsched_gym.sim import simulate

SCENARIOS = small_cuts(None, offline=100)  # scenario -> overrides that keep a run small whatever is drawn
EXAMPLES = int(os.environ.get("LLMSCHED_FUZZ_EXAMPLES", "40"))


@st.composite
def configurations(draw: st.DrawFn) -> tuple[str, str, int, dict, dict]:
    """A scenario, a policy, a seed, engine/workload overrides and policy parameters."""
    scenario = draw(st.sampled_from(sorted(SCENARIOS)))
    over: dict = {**SCENARIOS[scenario]}
    if scenario != "klpm-toy":  # an explicit 4-request workload
        n = draw(st.integers(50, 509))
        over["workload.n_requests"] = 0 if n > 500 else n  # an empty workload one draw in fifty
    if draw(st.booleans()):
        over["engine.kv_capacity_tokens"] = int(math.exp(draw(st.floats(math.log(300), math.log(200_000)))))
    if draw(st.booleans()):
        over["engine.block_size"] = draw(st.sampled_from([1, 4, 16, 32]))
    if draw(st.booleans()):
        over["engine.overflow"] = draw(st.sampled_from(OVERFLOW_HANDLERS))
    if draw(st.booleans()):
        over["engine.preempt_mode"] = draw(st.sampled_from(PREEMPT_MODES))
    if draw(st.booleans()):
        over["engine.latency_noise_cv"] = draw(st.sampled_from([0.05, 0.3, 1.0]))
    if draw(st.booleans()):
        over["engine.horizon_s"] = draw(st.floats(0.5, 120.0))
    if draw(st.booleans()):
        over["engine.prefill_emits_token"] = draw(st.booleans())
    if draw(st.booleans()):
        over["engine.prefix_cache"] = draw(st.booleans())
    if draw(st.integers(0, 3)) == 0:
        over["engine.fast_forward"] = draw(st.booleans())
    if draw(st.integers(0, 3)) == 0:
        over["engine.max_iterations"] = draw(st.integers(1, 5000))
    policy = draw(st.sampled_from(available()))
    params: dict = {}
    if draw(st.integers(0, 2)) == 0:  # a few of the policy's parameters (invalid values: one-line errors)
        for key, default in policy_params(policy).items():
            if not draw(st.booleans()):
                continue
            if key in ("admission", "memory"):
                params[key] = draw(st.sampled_from(["fit", "reserve", "peak"]))
            elif isinstance(default, bool):
                params[key] = draw(st.booleans())
            elif isinstance(default, int):
                params[key] = draw(st.sampled_from([0, 1, 2, 7, 64, 4096]))
            elif isinstance(default, float):
                params[key] = draw(st.sampled_from([0.0, 0.001, 0.5, 1.0, 2.0]))
    return scenario, policy, draw(st.integers(0, 2**31 - 1)), over, params


def check_configuration(scenario: str, policy: str, seed: int, over: dict, params: dict | None = None) -> str:
    """Run one configuration and assert the contracts; returns ``"ok"`` or ``"error: MESSAGE"``.

    The loop detector is set to 3,000 iterations without a completion (a policy that over-admits
    under ``clear_all`` thrashes until it fires; the default would take minutes to get there)."""
    over = {"engine.stall_iterations": 3000, **over}
    try:
        r = simulate(scenario, policy, seed, over, policy_params=params)
    except PlanError:
        raise  # a valid configuration must never abort
    except ValueError as e:  # the project's one-line errors (ConfigError, PolicyError, ...)
        msg = str(e)
        assert msg and "\n" not in msg, msg
        return f"error: {msg}"
    s, e = r.summary, r.engine
    assert s["n_arrived"] == s["n_completed"] + s["n_rejected"] + s["n_unfinished"]
    state = e.state[: e.next_idx]
    assert s["n_arrived"] == e.next_idx and s["n_completed"] == int(np.count_nonzero(state == 3))
    rejected = set(np.flatnonzero(state == 4).tolist())
    assert rejected == set(e.reject_reason) and all(e.reject_reason[i] for i in rejected)
    if e.config.overflow == "forbid":
        assert (r.iterations["kv_used"] <= r.iterations["kv_capacity"]).all()
    if s["non_terminating"]:
        assert r.iterations["n_running"][-1] > 0, f"{policy} waits with an idle engine: {s['stop_reason']}"
    again = simulate(scenario, policy, seed, over, policy_params=params)
    assert {k: v for k, v in again.summary.items() if k != "wall_time_s"} == {
        k: v for k, v in s.items() if k != "wall_time_s"}
    for col, values in r.requests.items():
        assert np.array_equal(values, again.requests[col], equal_nan=values.dtype.kind == "f"), col
    return "ok"


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configurations())
def test_random_configurations_keep_the_contracts(config):
    check_configuration(*config)


# --- configurations that failed: reported in the issue (PlanError) or found by the fuzzer --------
@pytest.mark.parametrize("scenario, policy, seed, over", [
    ("jaillet-noisy", "vtc-oracle", 23526, {"workload.n_requests": 236, "engine.kv_capacity_tokens": 8246,
                                            "engine.overflow": "forbid",  # vtc-oracle needs the true lengths
                                            "workload.predictor": {"type": "oracle"}}),
    ("azure-conv", "echo-bs-e", 692495, {"workload.n_requests": 121, "engine.kv_capacity_tokens": 5939,
                                         "engine.block_size": 32, "engine.preempt_mode": "swap"}),
    ("jaillet-low", "fcfs", 0, {"workload.n_requests": 0}),
    ("vtc-arena", "vtc", 0, {"workload.n_requests": 0}),  # the fairness summary indexed the first arrival
    ("klpm-toy", "fcfs", 31, {"engine.block_size": 16, "engine.overflow": "swap"}),  # divided by 0 blocks
    ("klpm-toy", "wait", 0, {"engine.fast_forward": False}),  # a fluid threshold of 0 never ran its type
])
def test_reported_configurations_keep_the_contracts(scenario, policy, seed, over):
    outcome = check_configuration(scenario, policy, seed, over)
    assert outcome == ("error: engine.kv_capacity_tokens: 11 is less than one block (engine.block_size 16)"
                       if over.get("engine.block_size") == 16 else "ok")


# --- malformed traces: exact one-line messages ----------------------------------------------------
GEN = "arrival_s,prompt_tokens,output_tokens\n"
VTC = "arrival_s,client,prompt_tokens,output_tokens\n"
AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"

CORPUS = [  # (file name, bytes, message)
    ("a.csv", (GEN + "0,5,5\n1,12345678901234567890123,5\n").encode(),
     "a.csv:3: prompt_tokens: expected an integer <= 2147483647, got '12345678901234567890123'"),
    ("a.csv", (GEN + "0,5,5\n1,5,3000000000\n").encode(),
     "a.csv:3: output_tokens: expected an integer <= 2147483647, got '3000000000'"),
    ("v.csv", (VTC + "0,99999999999999999999999,5,5\n").encode(),
     "v.csv:2: client: expected an integer that fits in 64 bits, got '99999999999999999999999'"),
    ("a.csv", (GEN + "0,5,5\n1e300,5,5\n").encode(), "a.csv:3: arrival_s: expected a number <= 1e+09 (seconds), got '1e300'"),
    ("a.csv", (GEN + "0,5,5\ninf,5,5\n").encode(), "a.csv:3: arrival_s: expected a finite number >= 0, got 'inf'"),
    ("a.csv", (GEN + "nan,5,5\n").encode(), "a.csv:2: arrival_s: expected a finite number >= 0, got 'nan'"),
    ("a.csv", (GEN + "0,5,5\n1,5,5\n2,\xe9,5\n").encode("latin-1"), "a.csv:4: file: expected UTF-8 text, got byte 0xe9"),
    ("a.csv", b"arrival_s,prompt_tokens,output_tokens,prompt_tokens\n0,5,5,6\n",
     "a.csv:1: header: column 'prompt_tokens' appears twice"),
    ("a.csv", b"", "a.csv:1: header: expected arrival_s,prompt_tokens,output_tokens, got an empty file"),
    ("a.csv", GEN.encode(), "a.csv:2: row: expected at least one data row, got none"),
    ("a.csv", (GEN + "0,5\n").encode(), "a.csv:2: row: expected 3 fields (arrival_s,prompt_tokens,output_tokens), got 2"),
    ("a.csv", (GEN + "0,0x10,5\n").encode(), "a.csv:2: prompt_tokens: expected an integer >= 1, got '0x10'"),
    ("z.csv", (AZ + "2023-11-16 18:15:46.68,5,5\n2100-11-16 18:15:46.68,5,5\n").encode(),
     "z.csv:3: TIMESTAMP: expected a time at most 1e+09 s after the earliest row, got '2100-11-16 18:15:46.68'"),
    ("z.csv", (AZ + "2023-11-16 18:15:46.68,5,5\n4023-11-16 18:15:46.68,5,5\n").encode(),
     "z.csv:3: TIMESTAMP: expected a timestamp between the years 1678 and 2261, got '4023-11-16 18:15:46.68'"),
    ("t.jsonl", b'{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 5, "prompt_tokens": 6}\n',
     "t.jsonl:1: prompt_tokens: key appears twice"),
    ("t.jsonl", b'{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 5}\n{"arrival_s": 1, "prompt_tokens": 1e999, '
                b'"output_tokens": 5}\n', "t.jsonl:2: prompt_tokens: expected an integer >= 1, got 'Infinity'"),
    ("t.jsonl", b'{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 5}\n\xff\n',
     "t.jsonl:2: file: expected UTF-8 text, got byte 0xff"),
]


@pytest.mark.parametrize("name, data, message", CORPUS)
def test_malformed_trace_gives_its_one_line_message(tmp_path, name, data, message):
    path = tmp_path / name
    path.write_bytes(data)
    fmt = {".csv": "csv", ".jsonl": "jsonl"}[path.suffix]
    fmt = "vtc" if name == "v.csv" else "azure" if name == "z.csv" else fmt
    with pytest.raises(TraceError) as err:
        T.load_trace(fmt, path)
    assert str(err.value) == message


def test_a_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "b.csv"
    path.write_bytes(b"\xef\xbb\xbf" + (VTC + "0,4,5,6\n").encode())
    wl = T.load_trace("vtc", path)
    assert wl.prompt_tokens.tolist() == [5]


def test_client_ids_are_numbered_densely_so_a_huge_id_costs_nothing(tmp_path, capsys):
    from llmsched_gym.cli import main

    path = tmp_path / "c.csv"
    path.write_text(VTC + "0,1000000000,10,5\n0.5,3,20,4\n1,1000000000,7,2\n")
    wl = T.load_trace("vtc", path)
    assert wl.client.tolist() == [1, 0, 1] and wl.meta["client_ids"] == [3, 1_000_000_000] and wl.n_clients == 2
    tracemalloc.start()
    try:
        assert main(["run", "--scenario", f"trace:vtc:{path}", "--policy", "vtc", "--quiet"]) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50e6  # arrays sized by client id would need gigabytes
