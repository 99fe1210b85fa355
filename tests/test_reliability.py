"""Reliability II: outputs stay inside --out, strict YAML and workloads, bounded sizes, one line always.

* Paths: a run folder whose name or symbolic link leads outside ``--out`` is refused before anything
  is written; names are one safe folder name; two flags naming one file are refused; a dangling
  symlink or an unwritable folder is refused before the run.
* YAML: a key given twice is an error; only ``true``/``false`` are booleans; aliases cannot expand
  a small file beyond a bound; a device is never read.
* Workloads: explicit lists hold integers where integers are meant (``5.9`` is an error), token
  counts and arrival times are bounded for every source, round-count and gamma parameters are
  bounded, and time-zone offsets in trace timestamps are converted without warnings.
* The CLI's top level: input errors are one line with exit 2; a bug is one line saying "internal
  error" with exit 70; running out of memory names where.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest

from llmsched_gym import cli
from llmsched_gym.cli import run as run_command
from llmsched_gym.config import (
    MAX_YAML_NODES,
    ConfigError,
    check_distinct,
    check_output_dir,
    check_output_file,
    check_run_name,
    load_yaml,
    run_folder,
    safe_run_name,
    yaml_load,
)
from llmsched_gym.core import workload as W
from llmsched_gym.core.request import MAX_TOKENS, WorkloadError
from llmsched_gym.core.scenarios import get_scenario
from llmsched_gym.core.traces import TraceError, load_azure
from llmsched_gym.core.workload import spec

# ---------------------------------------------------------------------------------------------
# paths


def test_run_folder_refuses_a_symlink_leading_outside_out_and_accepts_one_inside(tmp_path):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "escape").symlink_to(elsewhere)
    with pytest.raises(ConfigError, match=r"^--out: .*escape is a symbolic link to .*elsewhere, outside"):
        run_folder(out, "fresh")  # the link anywhere under OUT is refused, whichever name is asked for
    (out / "escape").unlink()
    (out / "inner").mkdir()
    (out / "alias").symlink_to(out / "inner")
    assert run_folder(out, "alias") == out / "alias"  # resolves inside OUT: fine
    assert run_folder(out, "new-run") == out / "new-run" and not (out / "new-run").exists()  # nothing written
    assert not any(elsewhere.iterdir())


def test_run_folder_refuses_a_name_whose_link_is_the_run_folder_itself(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "victim").mkdir()
    (out / "jaillet-low-select-s0").symlink_to(tmp_path / "victim")
    with pytest.raises(ConfigError, match="outside"):
        run_folder(out, "jaillet-low-select-s0")


@pytest.mark.parametrize("name", ["a\nb", "..", ".hidden", "a/b", "/abs", "x" * 129, "", "a\\b", "-dash", "a b"])
def test_unsafe_run_names_are_refused(name):
    with pytest.raises(ConfigError, match="must be a plain folder name") as e:
        check_run_name(name)
    assert "\n" not in str(e.value)


def test_default_run_names_are_made_safe():
    assert safe_run_name("trace:csv:../t.csv-select-s0") == "trace_csv_.._t.csv-select-s0"
    assert safe_run_name("dir/my scen.yml-priority-s3") == "dir_my_scen.yml-priority-s3"
    for text in ("jaillet-low-select-s0", "../../etc-s0", "\n\n", "é-s1"):
        check_run_name(safe_run_name(text))


def test_outputs_naming_one_file_are_refused(tmp_path):
    (tmp_path / "real.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    with pytest.raises(ConfigError, match=r"^--log-iterations: .* is the file --json writes too"):
        check_distinct({"--json": tmp_path / "real.json", "--log-iterations": tmp_path / "link.json"})
    check_distinct({"--json": tmp_path / "a.json", "--log-iterations": tmp_path / "b.csv", "--x": None})


def test_dangling_symlinks_and_unwritable_folders_are_refused_before_the_run(tmp_path):
    (tmp_path / "dangling").symlink_to(tmp_path / "no" / "such")
    with pytest.raises(ConfigError, match="which does not exist"):
        check_output_file(tmp_path / "dangling", "--json")
    with pytest.raises(ConfigError, match="which does not exist"):
        check_output_dir(tmp_path / "dangling", "--out")
    assert not (tmp_path / "no").exists()
    if Path("/proc/self").is_dir():  # os.access says yes to root; creating a file there fails for anyone
        with pytest.raises(ConfigError, match="/proc is not writable"):
            check_output_dir("/proc/llmsched-out", "--out")


def test_a_relative_output_path_may_not_leave_the_working_folder_through_a_link(tmp_path, monkeypatch):
    work, outside = tmp_path / "work", tmp_path / "outside"
    (work / "out").mkdir(parents=True)
    outside.mkdir()
    (work / "out" / "link").symlink_to(outside)
    monkeypatch.chdir(work)
    with pytest.raises(ConfigError, match=r"^--log-iterations: out/link/x.csv leads to .*outside/x.csv through a "
                                          r"symbolic link, outside the working folder"):
        check_output_file("out/link/x.csv", "--log-iterations")
    with pytest.raises(ConfigError, match="through a symbolic link"):
        check_output_dir("out/link/run", "--out")
    check_output_file(outside / "x.csv", "--json")  # typed as an absolute path: the user's choice
    check_output_file("out/x.csv", "--json")


def test_cli_run_refuses_one_file_for_json_and_the_iteration_log(tmp_path, capsys):
    rc = cli.main(["run", "--scenario", "jaillet-low", "--set", "workload.n_requests=5", "--quiet",
                   "--json", str(tmp_path / "x"), "--log-iterations", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--log-iterations" in err and not (tmp_path / "x").exists()


# ---------------------------------------------------------------------------------------------
# YAML


def test_yaml_duplicate_keys_are_an_error_naming_key_and_lines():
    with pytest.raises(ConfigError, match=r"^engine: given twice in one mapping \(lines 1 and 3\)"):
        yaml_load("engine: {block_size: 1}\nworkload: {}\nengine: {block_size: 2}\n")
    with pytest.raises(ConfigError, match=r"^x: given twice"):
        yaml_load("a: {x: 1, x: 2}")
    assert yaml_load("base: &b {a: 1}\nd: {<<: *b, c: 2}") == {"base": {"a": 1}, "d": {"a": 1, "c": 2}}


def test_yaml_booleans_are_only_true_and_false():
    assert yaml_load("a: yes\nb: no\nc: on\nd: off\ne: true\nf: False\ng: 1e-4") == {
        "a": "yes", "b": "no", "c": "on", "d": "off", "e": True, "f": False, "g": 1e-4}
    with pytest.raises(ConfigError, match=r"^engine.prefill_emits_token: expected true or false, got 'yes'$"):
        get_scenario("jaillet-low", {"engine.prefill_emits_token": "yes"})


def test_yaml_alias_expansion_is_bounded():
    lol = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lol += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 7)]
    with pytest.raises(ConfigError, match=f"expand to more than {MAX_YAML_NODES:,} values"):
        yaml_load("\n".join(lol))  # 10^7 values from 70 lines
    assert len(yaml_load("\n".join(lol[:4]))["a3"]) == 10  # 10^4: fine


def test_a_device_or_oversized_file_is_never_read(tmp_path):
    if Path("/dev/zero").exists():
        (tmp_path / "zero.yml").symlink_to("/dev/zero")
        with pytest.raises(ConfigError, match="not a regular file"):
            load_yaml(tmp_path / "zero.yml", "scenario")
    (tmp_path / "big.yml").write_bytes(b"#" * (16 * 2**20 + 1))
    with pytest.raises(ConfigError, match="more than the 16,777,216 this file may have"):
        load_yaml(tmp_path / "big.yml", "scenario")


# ---------------------------------------------------------------------------------------------
# workloads


def _explicit(**ex):
    return {"workload": {"explicit": ex}, "engine": {"kv_capacity_tokens": 1000}, "latency": "unit"}


@pytest.mark.parametrize("ex, message", [
    ({"arrival_s": [0, 1], "prompt_tokens": [5.9, 2.5], "output_tokens": [3, 3]},
     "workload.explicit.prompt_tokens[0]: expected an integer >= 1 and <= 2,147,483,647, got 5.9"),
    ({"arrival_s": [0, 1], "prompt_tokens": [5, 99999999999999999999], "output_tokens": [3, 3]},
     "workload.explicit.prompt_tokens[1]: expected an integer >= 1 and <= 2,147,483,647, got 99999999999999999999"),
    ({"arrival_s": [0, 1], "prompt_tokens": [5, 5], "output_tokens": [3, 3], "priority": [1, 2]},
     "workload.explicit.priority: unknown key (allowed: arrival_s, prompt_tokens, output_tokens, predicted_output, "
     "client, task_class, type_id, ttft_slo_s, tpot_slo_s, client_weight, prefix)"),
    ({"arrival_s": [0, 1], "prompt_tokens": [5, 5], "output_tokens": [3, 3], "client": [[1], [2]]},
     "workload.explicit.client[0]: expected an integer >= 0 and <= 2,147,483,647, got [1]"),
    ({"arrival_s": [0, 1], "prompt_tokens": 5, "output_tokens": [3, 3]},
     "workload.explicit.prompt_tokens: expected a list (one entry per request), got '5'"),
    ({"arrival_s": [0, 1], "prompt_tokens": [5, 5]}, "workload.explicit.output_tokens: required (a list, one entry per request)"),
    ({"arrival_s": [0, 2e9], "prompt_tokens": [5, 5], "output_tokens": [3, 3]},
     "workload.arrival_s: request 1 arrives at 2e+09 s, after the 1e+09 s bound (is the arrival rate far too low?)"),
])
def test_explicit_workloads_are_checked_field_by_field(ex, message):
    from llmsched_gym.core.scenarios import build_scenario

    with pytest.raises(ConfigError) as e:
        build_scenario(_explicit(**ex), 0)
    assert str(e.value) == message


def test_explicit_workload_keeps_its_values_exactly():
    from llmsched_gym.core.scenarios import build_scenario

    wl, _, _ = build_scenario(_explicit(arrival_s=[0, 0.5], prompt_tokens=[10, 3.0], output_tokens=[1, 2],
                                        client=[0, 1], prefix=[[[1, 5]], None]), 0)
    assert wl.prompt_tokens.tolist() == [10, 3] and wl.output_tokens.tolist() == [1, 2]
    assert wl.arrival_s.tolist() == [0.0, 0.5] and wl.client.tolist() == [0, 1] and wl.prefix == [((1, 5),), None]


def test_lengths_beyond_the_bound_are_refused_for_every_source():
    with pytest.raises(WorkloadError, match=r"^value: expected an integer >= 1 and <= 2,147,483,647, got 4611686018427387904$"):
        W.fixed(2**62, 3)
    with pytest.raises(WorkloadError, match="prompt_tokens: must be <= 2,147,483,647"):
        W.Workload(np.zeros(1), np.array([2**40]), np.array([1]))
    # a heavy tail is clipped at the bound rather than overflowing int64
    x = W.lognormal(1e30, 1e10, 100, 0)
    assert x.max() <= MAX_TOKENS and x.dtype == np.int64


def test_generated_arrivals_are_bounded_like_trace_arrivals():
    with pytest.raises(WorkloadError, match=r"after the 1e\+09 s bound"):
        W.build_workload({"arrival": {"type": "poisson", "rate": 1e-300}, "n_requests": 5, "prompt": 5, "output": 5}, 0)


def test_round_count_and_gamma_parameters_are_bounded():
    with pytest.raises(WorkloadError, match=r"^arrival.B: expected an integer >= 0 and <= 100,000, got 10000000$"):
        W.build_workload({"arrival": {"type": "round_counts", "dist": "binomial", "B": 10_000_000, "p": 0.5},
                          "n_requests": 10, "prompt": 5, "output": 5}, 0)
    with pytest.raises(WorkloadError, match=r"^arrival.cv: expected a number > 0 and <= 100, got 1e\+200$"):
        W.build_workload({"arrival": {"type": "gamma", "rate": 1, "cv": 1e200}, "n_requests": 10, "prompt": 5,
                          "output": 5}, 0)


def test_binomial_round_counts_beyond_float_range_of_comb_are_exact_enough():
    from scipy.stats import binom

    exact = spec._Builder._pmf({"dist": "binomial", "B": 1000, "p": 0.3})
    np.testing.assert_allclose(exact, binom.pmf(np.arange(1001), 1000, 0.3), rtol=1e-9, atol=1e-15)
    big = spec._Builder._pmf({"dist": "binomial", "B": 2000, "p": 0.5})  # math.comb(2000, c) overflows a float
    assert len(big) == 2001 and math.isclose(big.sum(), 1.0) and int(np.argmax(big)) == 1000
    wl = W.build_workload({"arrival": {"type": "round_counts", "dist": "binomial", "B": 2000, "p": 0.5},
                           "n_requests": 200, "prompt": 5, "output": 5}, 0)
    assert len(wl) == 200 and wl.arrival_s.max() == 0.0  # about 1000 arrive in round 0


def test_timestamps_with_offsets_are_converted_to_utc_without_warnings(tmp_path):
    p = tmp_path / "tz.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68+02:00,5,5\n"
                 "2023-11-16 17:15:47.68+0100,5,5\n2023-11-16T16:15:48.18Z,5,5\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wl = load_azure(p)
    np.testing.assert_allclose(wl.arrival_s, [0.0, 1.0, 1.5])
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46+02:00,5,5\n2023-11-16 18:15:47,5,5\n")
    with pytest.raises(TraceError, match=r"^tz.csv:3: TIMESTAMP: expected the same form as the first row"):
        load_azure(p)


# ---------------------------------------------------------------------------------------------
# the CLI's top level


def _cmd_raising(exc: BaseException):
    def cmd(args):
        raise exc

    return cmd


def test_an_internal_error_is_one_line_saying_so(monkeypatch, capsys):
    monkeypatch.setattr(run_command, "cmd_list", _cmd_raising(TypeError("unsupported operand\nsecond line")))
    monkeypatch.delenv("LLMSCHED_DEBUG", raising=False)
    assert cli.main(["list"]) == 70
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: internal error (TypeError: unsupported operand second line)")
    assert "test_reliability.py" not in err and "please report it" in err


def test_out_of_memory_names_where_it_ran_out(monkeypatch, capsys):
    monkeypatch.setattr(run_command, "cmd_list", _cmd_raising(MemoryError()))
    assert cli.main(["list"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: out of memory in ") and "n_requests" in err


def test_seed_lists_and_queue_slots_are_bounded():
    pytest.importorskip("torch")
    import gymnasium as gym

    from agents.report import parse_seeds

    with pytest.raises(ConfigError, match="names more than 10,000 seeds"):
        parse_seeds("0-1000000000")
    assert parse_seeds("0-9999") == list(range(10_000))
    with pytest.raises(ConfigError, match=r"^K: expected an integer in \[1, 4,096\], got 10000000$"):
        gym.make("llmsched_gym:LLMSched-v1", scenario="jaillet-low", K=10**7)


def test_non_finite_latency_coefficients_are_refused():
    from llmsched_gym.core.latency import make_latency

    with pytest.raises(ValueError, match=r"^latency.prefill_per_seq_s: expected a finite number, got inf$"):
        make_latency({"type": "affine", "prefill_per_seq_s": float("inf")})
    with pytest.raises(ValueError, match=r"^latency: affine decode_base_s: expected a finite number, got '1e400'$"):
        make_latency("affine:decode_base_s=1e400")
