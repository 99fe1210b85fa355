"""Trace loaders: the shipped traces' statistics, strict one-line errors, the synthetic stand-in."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from llmsched_gym.core import traces as T
from llmsched_gym.core import workload as W
from llmsched_gym.core.traces import TraceError

TRACES = Path(__file__).parents[1] / ".." / "shared" / "traces"
AZURE = TRACES / "AzureLLMInferenceTrace_conv.csv"
VTC = TRACES / "vtc_arena_real_trace.csv"

# the real Azure conv trace's statistics: mean / p50 / p90 / p99 / max
AZURE_INPUT = (1155, 1020, 2735, 4142, 14050)
AZURE_OUTPUT = (211, 129, 424, 601, 1000)


def _need(path: Path) -> Path:
    if not path.is_file():
        pytest.skip(f"{path.name} not available (../shared/traces absent)")
    return path


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _close(stats: dict, table: tuple, rel: float) -> None:
    got = (stats["mean"], stats["p50"], stats["p90"], stats["p99"], stats["max"])
    assert got == pytest.approx(table, rel=rel)


# --- the shipped traces -------------------------------------------------------------------------


def test_azure_conv_trace_matches_its_statistics():
    wl = T.load_azure(_need(AZURE))
    s = T.trace_stats(wl)
    assert s["n"] == 19366 and wl.arrival_s[0] == 0.0
    assert s["rate"] == pytest.approx(5.53, abs=0.005)
    assert s["interarrival_cv"] == pytest.approx(1.09, abs=0.01)
    _close(s["input"], AZURE_INPUT, rel=0.001)
    _close(s["output"], AZURE_OUTPUT, rel=0.001)
    assert wl.arrival_s[1] == pytest.approx(50.9951690 - 46.6805900, abs=1e-9)  # all 7 digits kept


def test_vtc_trace_has_27_clients_and_the_published_means():
    wl = T.load_vtc(_need(VTC))
    s = T.trace_stats(wl)
    assert s["n"] == 1500 and wl.n_clients == 27
    assert s["duration_s"] == pytest.approx(600, abs=1)
    assert (s["input"]["mean"], s["output"]["mean"]) == pytest.approx((136, 256), abs=1)


def test_build_workload_rescales_the_vtc_trace_to_210_per_minute():
    _need(VTC)
    wl = W.build_workload({"trace": {"format": "vtc", "time_scale": 150 / 210}}, 0)
    assert T.trace_stats(wl)["rate"] * 60 == pytest.approx(210, rel=1e-6)


def test_build_workload_cuts_a_trace_by_n_and_horizon():
    _need(AZURE)
    assert len(W.build_workload({"trace": {"format": "azure"}, "n_requests": 100}, 0)) == 100
    wl = W.build_workload({"trace": {"format": "azure"}, "horizon_s": 60}, 0)
    assert wl.arrival_s.max() < 60 and 150 < len(wl) < 19366


def test_random_window_cut_differs_by_seed_and_is_a_contiguous_shifted_slice(tmp_path):
    rows = "\n".join(f"{t},{10 + t},{1 + t % 7}" for t in range(50))
    path = _write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens\n" + rows + "\n")
    spec = {"trace": {"format": "csv", "path": str(path), "window": "random"}, "n_requests": 10}
    a, b, a2 = (W.build_workload(spec, s) for s in (1, 2, 1))
    np.testing.assert_array_equal(a.prompt_tokens, a2.prompt_tokens)  # deterministic under a seed
    starts = {int(w.prompt_tokens[0]) - 10 for w in (a, b)}
    assert len(starts) == 2  # different seeds, different windows
    for w in (a, b):
        s0 = int(w.prompt_tokens[0]) - 10
        assert len(w) == 10 and w.arrival_s[0] == 0.0
        np.testing.assert_array_equal(w.prompt_tokens, np.arange(s0, s0 + 10) + 10)
        np.testing.assert_array_equal(w.arrival_s, np.arange(10.0))
    whole = W.build_workload({**spec, "n_requests": 50}, 3)  # no room to move: the whole trace
    assert int(whole.prompt_tokens[0]) == 10 and len(whole) == 50
    with pytest.raises(W.WorkloadError, match="trace.window: unknown value 'tail'"):
        W.build_workload({**spec, "trace": {**spec["trace"], "window": "tail"}}, 0)


def test_trace_part_keeps_windows_inside_their_fraction_of_the_rows(tmp_path):
    rows = "\n".join(f"{t},{10 + t},{1 + t % 7}" for t in range(100))
    path = _write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens\n" + rows + "\n")
    trace = {"format": "csv", "path": str(path), "window": "random"}
    for seed in range(20):  # every window lies inside its part: disjoint train and test windows
        early = W.build_workload({"trace": {**trace, "part": [0.0, 0.5]}, "n_requests": 10}, seed)
        late = W.build_workload({"trace": {**trace, "part": [0.5, 1.0]}, "n_requests": 10}, seed)
        assert 10 <= early.prompt_tokens.min() and early.prompt_tokens.max() <= 59
        assert 60 <= late.prompt_tokens.min() and late.prompt_tokens.max() <= 109
        assert late.arrival_s[0] == 0.0 and len(late) == 10
    head = W.build_workload({"trace": {"format": "csv", "path": str(path), "part": [0.25, 1.0]}, "n_requests": 5}, 0)
    np.testing.assert_array_equal(head.prompt_tokens, [35, 36, 37, 38, 39])  # a head cut starts at the part
    np.testing.assert_array_equal(head.arrival_s, np.arange(5.0))
    for bad in ([0.5, 0.5], [0.2], "half", [-0.1, 0.5]):
        with pytest.raises(W.WorkloadError, match=r"trace.part: "):
            W.build_workload({"trace": {**trace, "part": bad}, "n_requests": 10}, 0)


# --- synthetic stand-in and lookup --------------------------------------------------------------


def test_synthetic_azure_conv_matches_the_table():
    wl = T.synthetic_azure_conv(seed=0)
    s = T.trace_stats(wl)
    assert s["n"] == 19366
    assert s["rate"] == pytest.approx(5.53, rel=0.03)
    assert s["interarrival_cv"] == pytest.approx(1 / math.sqrt(0.87), rel=0.05)
    _close(s["input"], AZURE_INPUT, rel=0.08)
    _close(s["output"], AZURE_OUTPUT, rel=0.05)


# --- generic formats ----------------------------------------------------------------------------


def test_generic_csv_with_clients_and_prefix_groups(tmp_path):
    path = _write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens,client,prefix_group,prefix_tokens\n"
                                     "0.0,100,5,0,sys,40\n"
                                     "0.5,30,5,1,,\n"
                                     "\n"
                                     "1.0,200,5,1,sys,\n"
                                     "2.0,50,5,2,doc,50\n")
    wl = T.load_csv(path, first_segment_id=10)
    assert wl.client.tolist() == [0, 1, 1, 2]
    assert wl.prefix == [((10, 40),), None, ((10, 100),), ((11, 50),)]  # empty size: the group's shortest


def test_jsonl_loads_the_same_rows_as_csv(tmp_path):
    rows = [{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 3, "client": 1},
            {"arrival_s": 1.5, "prompt_tokens": 20, "output_tokens": 4, "prefix_group": "a", "prefix_tokens": 8}]
    wl = T.load_jsonl(_write(tmp_path, "t.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n"))
    assert wl.arrival_s.tolist() == [0.0, 1.5] and wl.client.tolist() == [1, 0]
    assert wl.prefix == [None, ((0, 8),)]


def test_out_of_order_rows_are_sorted_and_flagged(tmp_path):
    path = _write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens\n2,1,1\n1,2,2\n")
    wl = T.load_csv(path)
    assert wl.prompt_tokens.tolist() == [2, 1] and wl.meta["resorted"]


def test_sharegpt_lengths_from_characters_with_given_arrivals(tmp_path):
    data = [{"conversations": [{"from": "human", "value": "x" * 9}, {"from": "gpt", "value": "y" * 40}]},
            {"conversations": [{"from": "gpt", "value": "orphan reply"}]},
            {"conversations": [{"from": "human", "value": "abcd"}, {"from": "gpt", "value": "z"}]}]
    path = _write(tmp_path, "sg.json", json.dumps(data))
    wl = T.load_sharegpt(path, lambda k: W.poisson(2.0, n=k, rng=0))
    assert wl.prompt_tokens.tolist() == [3, 1] and wl.output_tokens.tolist() == [10, 1]
    assert wl.meta["skipped"] == 1 and np.all(np.diff(wl.arrival_s) > 0)
    spec = {"trace": {"format": "sharegpt", "path": str(path)}, "arrival": {"type": "poisson", "rate": 2}}
    assert W.build_workload(spec, 0).prompt_tokens.tolist() == [3, 1]


# --- malformed rows: exact one-line errors ------------------------------------------------------

AZ_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZ_ROW = "2023-11-16 18:15:46.6805900,374,44\n"
GEN_HEAD = "arrival_s,prompt_tokens,output_tokens\n"


@pytest.mark.parametrize("name, text, message", [
    ("az.csv", AZ_HEAD + AZ_ROW * 2 + "2023-11-16 18:15:47.1,12,x\n",
     "az.csv:4: GeneratedTokens: expected an integer >= 1, got 'x'"),
    ("az.csv", AZ_HEAD + AZ_ROW + "2023-11-16 25:00:00.0,12,3\n",
     "az.csv:3: TIMESTAMP: expected a timestamp like '2023-11-16 18:15:46.6805900' (an optional offset: Z, +02:00), got '2023-11-16 25:00:00.0'"),
    ("az.csv", AZ_HEAD + AZ_ROW + "2023-11-16 18:15:47.1,12\n",
     "az.csv:3: row: expected 3 fields (TIMESTAMP,ContextTokens,GeneratedTokens), got 2"),
    ("az.csv", "time,in,out\n" + AZ_ROW,
     "az.csv:1: header: expected TIMESTAMP,ContextTokens,GeneratedTokens, got 'time,in,out'"),
    ("trace.csv", GEN_HEAD + "0,5,5\n" * 15 + "1.0,5,x\n",
     "trace.csv:17: output_tokens: expected an integer >= 1, got 'x'"),
    ("trace.csv", GEN_HEAD + "0,5,5\n1,5,0\n", "trace.csv:3: output_tokens: expected an integer >= 1, got '0'"),
    ("trace.csv", GEN_HEAD + "0,5,5\n-1,5,5\n", "trace.csv:3: arrival_s: expected a finite number >= 0, got '-1'"),
    ("trace.csv", "arrival_s,prompt_tokens,output_tokens,model\n0,1,1,a\n",
     "trace.csv:1: header: unknown column 'model' (allowed: arrival_s, prompt_tokens, output_tokens, client, "
     "prefix_group, prefix_tokens)"),
    ("trace.csv", "arrival_s,prompt_tokens,output_tokens,prefix_group,prefix_tokens\n0,10,1,a,11\n",
     "trace.csv:2: prefix_tokens: expected an integer in 0..prompt_tokens (10), got '11'"),
    ("vtc.csv", "arrival_s,client,prompt_tokens,output_tokens\n0.0,-2,5,5\n",
     "vtc.csv:2: client: expected an integer >= 0, got '-2'"),
    ("t.jsonl", '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}\n{"arrival_s": 1, "prompt_tokens": 1}\n',
     "t.jsonl:2: output_tokens: required key is missing"),
    ("t.jsonl", '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}\n\n{"arrival_s": 1, "prompt_tokens"\n',
     "t.jsonl:3: row: expected a JSON object, got invalid JSON (Expecting ':' delimiter)"),
    ("t.jsonl", '{"arrival_s": 0, "prompt_tokens": 2.5, "output_tokens": 1}\n',
     "t.jsonl:1: prompt_tokens: expected an integer >= 1, got '2.5'"),
])
def test_malformed_rows_raise_one_line_errors(tmp_path, name, text, message):
    path = _write(tmp_path, name, text)
    fmt = {"az.csv": "azure", "vtc.csv": "vtc", "trace.csv": "csv", "t.jsonl": "jsonl"}[name]
    with pytest.raises(TraceError) as err:
        T.load_trace(fmt, path)
    assert str(err.value) == message and "\n" not in str(err.value)


def test_zero_output_can_be_clipped_and_is_counted(tmp_path):
    path = _write(tmp_path, "az.csv", AZ_HEAD + AZ_ROW + "2023-11-16 18:15:47.1,12,0\n")
    wl = T.load_azure(path, on_zero="clip")
    assert wl.output_tokens.tolist() == [44, 1]
    assert wl.meta["clipped_zero"] == {"GeneratedTokens": 1}


def test_sharegpt_malformed_entry_names_its_index(tmp_path):
    path = _write(tmp_path, "sg.json", json.dumps([{"conversations": []}, {"conversations": "oops"}]))
    with pytest.raises(TraceError, match=r"^sg\.json:entry 1: conversations: expected a list of \{from, value\}"):
        T.load_sharegpt(path, np.zeros(5))
