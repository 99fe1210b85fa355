"""What actually ran is never hidden: a synthetic stand-in is named in every console title, a
hand-placed trace is checked against its published sha256, and the summary names the latency
model that ran (a missing Vidur profile's calibrated stand-in included).

Like tests/test_data.py, each test is a fresh user: an empty cache and no ``../shared``."""

from __future__ import annotations

import json

from llmsched_gym import data as D
from llmsched_gym.cli import main
from llmsched_gym.sim import simulate, what_runs

AZURE_ROWS = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
    f"2023-11-16 18:15:{10 + i:02d}.0000000,{100 + 7 * i},{20 + i}\n" for i in range(40))


def test_a_hand_placed_trace_with_other_contents_is_run_but_flagged(clone, capsys):
    path = clone / "traces" / "AzureLLMInferenceTrace_conv.csv"
    path.parent.mkdir(parents=True)
    path.write_text(AZURE_ROWS)
    s = simulate("azure-conv", "fcfs", 0, {"workload.n_requests": 30}).summary
    simulate("azure-conv", "fcfs", 1, {"workload.n_requests": 30})  # said once per file, not per run
    src = s["workload_source"]
    assert src["kind"] == "trace" and src["verified"] is False and src["name"] == "azure-conv"
    assert src["sha256"] == D.sha256_of(path) and src["expected_sha256"] == D.DATASETS["azure-conv"].sha256
    assert s["n_arrived"] == 30  # the file as given ran
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"azure-conv: {path.resolve()} is not the published file (sha256 ")
    assert D.synthetic_note(src) == " (not the published azure-conv: sha256 mismatch)"
    assert main(["run", "--scenario", "azure-conv", "--policy", "fcfs", "--set", "workload.n_requests=30"]) == 0
    assert "fcfs on azure-conv (not the published azure-conv: sha256 mismatch)" in capsys.readouterr().out
    assert main(["data", "list"]) == 0
    assert f"present (cache: {path.resolve()}, NOT the published file: sha256 differs)" in capsys.readouterr().out


def test_a_hand_placed_file_under_llmsched_traces_is_checked_too(clone, tmp_path, monkeypatch):
    traces = tmp_path / "mine"
    traces.mkdir()
    (traces / "AzureLLMInferenceTrace_conv.csv").write_text(AZURE_ROWS)
    monkeypatch.setenv("LLMSCHED_TRACES", str(traces))
    src = simulate("azure-conv", "fcfs", 0, {"workload.n_requests": 10}).summary["workload_source"]
    assert src["verified"] is False
    # a file the user names by path is theirs: no published checksum applies
    own = simulate(f"trace:azure:{traces / 'AzureLLMInferenceTrace_conv.csv'}", "fcfs", 0).summary
    assert "verified" not in own["workload_source"] and own["workload_source"]["kind"] == "trace"


def test_the_summary_names_the_latency_model_that_ran(clone, capsys):
    s = simulate("jaillet-low", "fcfs", 0, {"workload.n_requests": 20, "latency": "vidur:a100/llama-2-7b"}).summary
    assert s["latency_model"] == "calibrated:llama-2-7b/a100"  # no profile here: its calibrated stand-in
    assert "vidur:a100/llama-2-7b: measured profile not found, using calibrated:llama-2-7b/a100" in capsys.readouterr().err
    s = simulate("jaillet-low", "fcfs", 0, {"workload.n_requests": 20, "latency": "roofline:llama-2-7b/a100"}).summary
    assert s["latency_model"] == "roofline:llama-2-7b/a100"
    assert simulate("jaillet-low", "fcfs", 0, {"workload.n_requests": 20}).summary["latency_model"] == \
        "calibrated:llama-2-70b/2xa100"


def test_console_titles_say_synthetic_stand_in(clone, tmp_path, capsys):
    info = what_runs("azure-conv")
    assert info["title"] == "azure-conv (synthetic stand-in for azure-conv), calibrated:llama-2-7b/a100"
    assert what_runs("jaillet-high")["title"] == "jaillet-high, calibrated:llama-2-70b/2xa100"
    assert main(["compare", "--scenario", "azure-conv", "--seeds", "0", "--policies", "fcfs", "--no-plots",
                 "--set", "workload.n_requests=20", "--out", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    assert "azure-conv (synthetic stand-in for azure-conv) load x1" in " ".join(out.split())
    runs = json.loads((tmp_path / "cmp" / "results.json").read_text())["runs"]
    assert runs[0]["summary"]["latency_model"] == "calibrated:llama-2-7b/a100"


def test_the_demo_baseline_table_says_synthetic_stand_in(clone, capsys):
    from llmsched_gym.demo import baseline_table

    baseline_table("azure-conv", 0, 20)
    assert "azure-conv (synthetic stand-in for azure-conv), seed 0" in " ".join(capsys.readouterr().out.split())


def test_the_reproduce_line_says_synthetic_stand_in(clone, tmp_path, capsys):
    assert main(["reproduce", "vtc", "--quick", "--out", str(tmp_path / "vtc")]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("vtc (VTC (Sheng et al. 2024) (synthetic stand-in for vtc-arena)): ")
    assert "rows reproduced" in line
