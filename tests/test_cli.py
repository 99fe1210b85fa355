"""CLI contract: list/run/bench work, bad input gives one-line errors naming the field."""

from __future__ import annotations

import json

import pytest

from llmsched_gym.cli import main


def run_cli(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_list_shows_scenarios_and_policies(capsys):
    rc, out, _ = run_cli(capsys, "list")
    assert rc == 0
    for name in ("azure-conv", "jaillet-high", "klpm-toy", "fcfs"):
        assert name in out


def test_run_writes_summary_json_and_iteration_log(tmp_path, capsys):
    js, log = tmp_path / "s.json", tmp_path / "it.csv"
    rc, out, _ = run_cli(capsys, "run", "--scenario", "jaillet-low", "--set", "workload.n_requests=200",
                         "--json", str(js), "--log-iterations", str(log), "--quiet")
    assert rc == 0
    s = json.loads(js.read_text())
    assert s["n_arrived"] == 200 == s["n_completed"] + s["n_rejected"] + s["n_unfinished"]
    lines = log.read_text().splitlines()
    assert lines[0].startswith("t_start,duration,n_prefill_tokens")
    assert len(lines) == s["iterations"] + 1
    assert not log.with_suffix(".batches.jsonl").exists()  # the batch detail only when asked for
    rc, _, _ = run_cli(capsys, "run", "--scenario", "jaillet-low", "--set", "workload.n_requests=200",
                       "--log-iterations", str(log), "--log-batches", "--quiet")
    batches = log.with_suffix(".batches.jsonl").read_text().splitlines()
    assert rc == 0 and len(batches) == s["iterations"]
    assert json.loads(batches[0]).keys() == {"prefill", "decode"}


def test_log_batches_needs_an_iteration_log(capsys):
    rc, _, err = run_cli(capsys, "run", "--scenario", "klpm-toy", "--log-batches", "--quiet")
    assert rc == 2 and err.strip() == "error: --log-batches: needs --log-iterations PATH (the batches go beside that CSV)"


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        run_cli(capsys, "--version")
    assert e.value.code == 0 and capsys.readouterr().out.startswith("llmsched-gym ")


@pytest.mark.parametrize("argv, line", [
    (["train", "--K", "true"], "error: llmsched train: argument --K: invalid int value: 'true' (llmsched train --help)"),
    (["run", "--seed", "x"], "error: llmsched run: argument --seed: invalid int value: 'x' (llmsched run --help)"),
    (["run", "--bogus"], "error: llmsched: unrecognized arguments: --bogus (llmsched --help)"),
    (["data", "frob"], "error: llmsched data: argument data_command: invalid choice: 'frob' "
                       "(choose from 'list', 'download', 'path') (llmsched data --help)"),
])
def test_argument_errors_are_one_line_not_the_usage_block(capsys, argv, line):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and capsys.readouterr().err == line + "\n"


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["run", "--scenario", "nope"], "scenario: unknown 'nope'"),
        (["run", "--policy", "nope"], "policy: unknown 'nope'"),
        (["run", "--scenario", "jaillet-low", "--set", "workload.prompt.mean=-1"], "workload.prompt.mean"),
        (["run", "--scenario", "jaillet-low", "--set", "engine.colour=red"], "unknown engine field"),
        (["run", "--scenario", "jaillet-low", "--set", "engine.overflow=explode"], "engine.overflow: expected one of forbid, clear_all"),
        (["run", "--scenario", "jaillet-low", "--set", "policy.bogus=1"], "policy.bogus"),
    ],
)
def test_bad_input_gives_one_line_error(capsys, argv, needle):
    rc, _, err = run_cli(capsys, *argv)
    assert rc == 2
    assert err.startswith("error: ") and err.count("\n") == 1
    assert needle in err


def test_malformed_trace_row_names_file_line_and_field(tmp_path, capsys):
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,10,5\n0.5,-3,5\n")
    rc, _, err = run_cli(capsys, "run", "--scenario", f"trace:csv:{p}")
    assert rc == 2
    assert "t.csv:3" in err and "prompt_tokens" in err and err.count("\n") == 1


def test_negative_length_in_workload_is_rejected():
    from llmsched_gym.core.request import Workload, WorkloadError

    with pytest.raises(WorkloadError, match="output_tokens: must be >= 1"):
        Workload(arrival_s=[0.0], prompt_tokens=[5], output_tokens=[-2])


def test_run_reference_adds_ratio_to_fluid_for_typed_workloads(tmp_path, capsys):
    out = tmp_path / "s.json"
    assert main(["run", "--scenario", "nested-synth4", "--policy", "nested-wait", "--set", "workload.n_requests=500",
                 "--reference", "--json", str(out), "--quiet"]) == 0
    s = json.loads(out.read_text())
    assert s["ratio_to_fluid"] == pytest.approx(s["throughput_tokens_per_s"] / s["fluid_throughput_star"])
    assert 0 < s["ratio_to_fluid"] < 1
    assert main(["run", "--scenario", "jaillet-low", "--set", "workload.n_requests=50", "--reference", "--quiet"]) == 0
    assert "reference: none applies" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [[], ["--scenario", "jaillet-low"]])
def test_evaluate_names_a_missing_model_path(capsys, extra):
    rc, _, err = run_cli(capsys, "evaluate", "--model", "/no/such/run", *extra)
    assert rc == 2 and err.strip() == "error: --model: /no/such/run: no such path (give a run folder or a model .zip)"


def test_optimum_prints_words_and_units(capsys):
    rc, out, _ = run_cli(capsys, "optimum", "--scenario", "klpm-toy", "--policy", "fcfs")
    assert rc == 0
    assert "instance: 4 requests, KV capacity M = 11 tokens, one round = 1 s of arrival time" in out
    assert "optimal total end-to-end latency (TEL): " in out and " rounds" in out
    assert "fcfs: regret " in out and "rounds per request" in out
