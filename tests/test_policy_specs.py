"""One ``NAME:key=value`` policy syntax for ``run --policy``, ``benchmark --policy`` and
``train --bc-from``, checked before anything runs (``baselines.parse_spec`` / ``validate_spec``)."""

from __future__ import annotations

import json

import pytest

from baselines import PolicyError, parse_spec, validate_spec
from llmsched_gym.cli import main


def test_parse_spec_reads_names_parameters_and_bracketed_lists():
    assert parse_spec("fcfs") == "fcfs"
    assert parse_spec(" sarathi:chunk_size=256 ") == {"name": "sarathi", "chunk_size": 256}
    assert parse_spec("sjf:max_num_seqs=96,oracle=true") == {"name": "sjf", "max_num_seqs": 96, "oracle": True}
    assert parse_spec("wait:thresholds=[1, 2.5],c=0.5") == {"name": "wait", "thresholds": [1, 2.5], "c": 0.5}
    assert parse_spec("sarathi:") == "sarathi"
    spec = {"name": "sarathi", "chunk_size": 64}
    assert parse_spec(spec) == spec and parse_spec(spec) is not spec


@pytest.mark.parametrize("spec, message", [
    ("sarathii", r"^--policy 'sarathii': policy: unknown 'sarathii'; allowed: .*sarathi"),
    ("sarathi:chunksize=256", r"^--policy 'sarathi:chunksize=256': policy.chunksize: unknown parameter of "
                              r"'sarathi'; allowed: chunk_size, max_num_seqs, watermark$"),
    ("sarathi:chunk_size=abc", r"^--policy 'sarathi:chunk_size=abc': policy.chunk_size: expected an integer"),
    ("sarathi:chunk_size", r"^--policy 'sarathi:chunk_size': chunk_size: expected KEY=VALUE$"),
    ({"name": "sjf", "oracle": "maybe"}, r"^--policy 'sjf': policy.oracle: expected true or false"),
    ("", r"^--policy: expected NAME or NAME:key=value"),
])
def test_validate_spec_refuses_in_one_line(spec, message):
    with pytest.raises(PolicyError, match=message) as err:
        validate_spec(spec, "--policy")
    assert "\n" not in str(err.value)


def test_validate_spec_returns_what_the_commands_run():
    assert validate_spec("sarathi:chunk_size=256") == {"name": "sarathi", "chunk_size": 256}
    assert validate_spec("vllm-v1") == "vllm-v1"


@pytest.mark.parametrize("argv", [
    ["benchmark", "--quick", "--policy", "sarathii"],
    ["benchmark", "--quick", "--policy", "sarathi:chunksize=256"],
    ["benchmark", "--quick", "--policy", "sarathi:chunk_size=abc"],
    ["run", "--scenario", "jaillet-low", "--policy", "sarathi:chunk_size=abc"],
    ["run", "--scenario", "jaillet-low", "--policy", "mcsf:on_fail=maybe"],
])
def test_commands_refuse_a_bad_entrant_before_running(argv, tmp_path, capsys):
    out = tmp_path / "out"
    argv = [*argv, "--out", str(out)] if argv[0] == "benchmark" else argv
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --policy '") and err.count("\n") == 1
    assert not out.exists()  # nothing ran, nothing was written


def test_train_refuses_a_bad_bc_teacher_before_making_the_run_folder(tmp_path, capsys):
    pytest.importorskip("stable_baselines3")
    assert main(["train", "--scenario", "jaillet-low", "--bc-from", "sjf:max_num_seq=96",
                 "--out", str(tmp_path), "--name", "t"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --bc-from 'sjf:max_num_seq=96': policy.max_num_seq: unknown parameter of 'sjf'")
    assert not (tmp_path / "t").exists()


def test_run_policy_takes_parameters_like_benchmark_and_set(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    common = ["run", "--scenario", "jaillet-low", "--set", "workload.n_requests=60", "--quiet"]
    assert main([*common, "--policy", "sarathi:chunk_size=64,max_num_seqs=8", "--json", str(a)]) == 0
    assert main([*common, "--policy", "sarathi", "--set", "policy.chunk_size=64", "--set", "policy.max_num_seqs=8",
                 "--json", str(b)]) == 0
    sa, sb = json.loads(a.read_text()), json.loads(b.read_text())
    sa.pop("wall_time_s"), sb.pop("wall_time_s")
    assert sa == sb and sa["policy"] == "sarathi"
    c = tmp_path / "c.json"
    assert main([*common, "--policy", "sarathi", "--json", str(c)]) == 0
    assert json.loads(c.read_text())["iterations"] != sa["iterations"]  # the parameters took effect


def test_run_benchmark_validates_its_policies_first(tmp_path):
    from llmsched_gym.benchmark import run_benchmark

    with pytest.raises(PolicyError, match="policies 'sarathi:chunksize=1': policy.chunksize: unknown parameter"):
        run_benchmark(quick=True, policies=["sarathi:chunksize=1"], out=tmp_path / "b")
    assert not (tmp_path / "b").exists()


def test_compare_and_evaluate_take_parameterised_policies_as_run_does(tmp_path, capsys):
    from llmsched_gym.cli import main
    from llmsched_gym.sim import simulate

    out = tmp_path / "cmp"
    assert main(["compare", "--scenario", "jaillet-high", "--seeds", "0", "--set", "workload.n_requests=60",
                 "--policies", "fcfs", "--policy", "sarathi:chunk_size=128", "--no-plots", "--quiet",
                 "--out", str(out)]) == 0
    runs = {r["policy"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    direct = simulate("jaillet-high", {"name": "sarathi", "chunk_size": 128}, 0, {"workload.n_requests": 60}).summary
    assert runs["sarathi:chunk_size=128"]["metrics"]["mean_e2el_ms"] == direct["serving"]["mean_e2el_ms"]
    assert main(["compare", "--scenario", "jaillet-high", "--policy", "sarathi:chunksize=1",
                 "--out", str(tmp_path / "bad")]) == 2
    assert "policy.chunksize: unknown parameter of 'sarathi'" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()  # refused before anything ran or was written
