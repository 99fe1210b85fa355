"""The configuration layer: one schema, one-line errors naming the dotted field, the value and what
is allowed; output paths checked before a run; the lazy policy catalogue."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import baselines
from llmsched_gym.cli import main
from llmsched_gym.config import (
    ENGINE,
    ConfigError,
    apply_overrides,
    check_output_dir,
    check_output_file,
    check_run_name,
    check_scenario,
    merge_engine_overrides,
    parse_sets,
)
from llmsched_gym.core.engine import EngineConfig
from llmsched_gym.core.scenarios import SCENARIOS, build_scenario, get_scenario

ENGINE_FIELDS = ", ".join("engine." + f for f in ENGINE)

# (--set overrides on jaillet-low, the exact one-line message)
MALFORMED = [
    ({"engine.kv_capacity_tokens": "abc"}, "engine.kv_capacity_tokens: expected an integer >= 1, got 'abc'"),
    ({"engine.kv_capacity_tokens": "[1,2]"}, "engine.kv_capacity_tokens: expected an integer >= 1, got [1, 2]"),
    ({"engine.kv_capacity_tokens": 1000.5}, "engine.kv_capacity_tokens: expected an integer >= 1, got 1000.5"),
    ({"engine.kv_capacity_tokens": 0}, "engine.kv_capacity_tokens: expected an integer >= 1, got 0"),
    ({"engine.kv_capacity_tokens": True}, "engine.kv_capacity_tokens: expected an integer >= 1, got True"),
    ({"engine.block_size": "x"}, "engine.block_size: expected an integer >= 1, got 'x'"),
    ({"engine.block_size": 2**63}, "engine.block_size: expected an integer >= 1, got 9223372036854775808"),
    ({"engine.block_size": 2.0**63}, "engine.block_size: expected an integer >= 1, got 9.223372036854776e+18"),
    ({"engine.swap_gb_s": "1" * 400}, "engine.swap_gb_s: expected a number > 0, got " + "1" * 57 + "..."),
    ({"engine.block_size": 1.5}, "engine.block_size: expected an integer >= 1, got 1.5"),
    ({"engine.horizon_s": "abc"}, "engine.horizon_s: expected null or a number > 0, got 'abc'"),
    ({"engine.horizon_s": "nan"}, "engine.horizon_s: expected null or a number > 0, got 'nan'"),
    ({"engine.horizon_s": float("inf")}, "engine.horizon_s: expected null or a number > 0, got inf"),
    ({"engine.max_iterations": "x"}, "engine.max_iterations: expected null or an integer >= 1, got 'x'"),
    ({"engine.max_iterations": -3}, "engine.max_iterations: expected null or an integer >= 1, got -3"),
    ({"engine.stall_iterations": -1}, "engine.stall_iterations: expected an integer >= 0, got -1"),
    ({"engine.kv_bytes_per_token": -5}, "engine.kv_bytes_per_token: expected an integer >= 1, got -5"),
    ({"engine.prefill_emits_token": "maybe"}, "engine.prefill_emits_token: expected true or false, got 'maybe'"),
    ({"engine.fast_forward": "maybe"}, "engine.fast_forward: expected true or false, got 'maybe'"),
    ({"engine.fast_forward": 1}, "engine.fast_forward: expected true or false, got 1"),
    ({"engine.overflow": "explode"},
     "engine.overflow: expected one of forbid, clear_all, clear_bernoulli, preempt_lifo_recompute, swap, got 'explode'"),
    ({"engine.preempt_mode": 3}, "engine.preempt_mode: expected one of recompute, restart, swap, got 3"),
    ({"engine.overflow_beta": 0}, "engine.overflow_beta: expected a number in (0, 1], got 0"),
    ({"engine.latency_noise_cv": -0.1}, "engine.latency_noise_cv: expected a number in [0, 10], got -0.1"),
    ({"engine.block_size.x": 1}, f"engine.block_size.x: unknown engine field; allowed: {ENGINE_FIELDS}"),
    ({"engine.colour": "red"}, f"engine.colour: unknown engine field; allowed: {ENGINE_FIELDS}"),
    ({"engin.block_size": 16},
     "engin.block_size: unknown section 'engin'; allowed: workload, engine, latency, policy, cluster, description, paper, "
     "slo"),
    ({"workload.n_requests.x": 1}, "workload.n_requests.x: workload.n_requests is 10000, not a section; "
     "set workload.n_requests=VALUE instead"),
    ({"latency": "affine", "latency.x": 1}, "latency.x: latency is 'affine', not a section; set latency=VALUE instead"),
    ({"description.x": 1}, "description.x: description is a string, not a section"),
    ({"engine..x": 1}, "overrides: 'engine..x' is not a dotted key like engine.block_size"),
    ({"workload.n_requests": "abc"}, "workload.n_requests: expected null or an integer in [0, 100,000,000], got 'abc'"),
    ({"workload.n_requests": 10**15},
     "workload.n_requests: expected null or an integer in [0, 100,000,000], got 1000000000000000"),
    ({"workload.horizon_s": "abc"}, "workload.horizon_s: expected null or a number > 0, got 'abc'"),
    ({"latency": 5}, "scenario.latency: expected a string or a mapping, got 5"),
    ({"policy": ["fcfs"]}, "scenario.policy: expected a string or a mapping, got ['fcfs']"),
    ({"policy.name": 3}, "policy.name: expected a policy name (a string), got 3"),
]


@pytest.mark.parametrize("overrides, message", MALFORMED, ids=[m.split(":")[0] + f"-{i}" for i, (_, m) in
                                                                enumerate(MALFORMED)])
def test_malformed_override_is_one_line_naming_field_value_and_allowed(overrides, message):
    with pytest.raises(ConfigError) as e:
        get_scenario("jaillet-low", overrides)
    assert str(e.value) == message


# (scenario overrides that pass the schema and fail when the workload is built, message)
MALFORMED_WORKLOAD = [
    ({"workload.prompt.mean": -1}, "workload.prompt.mean"),
    ({"workload.n_requests": None, "workload.horizon_s": 1e300},
     "workload.arrival.horizon_s: 1e+300 s at 10 requests/s is about 1e+301 requests; at most 100,000,000"),
    ({"workload.colour": 1}, "workload.colour"),
]


@pytest.mark.parametrize("overrides, needle", MALFORMED_WORKLOAD)
def test_malformed_workload_names_the_workload_section(overrides, needle):
    with pytest.raises(ConfigError) as e:
        build_scenario(get_scenario("jaillet-low", overrides), 0)
    assert str(e.value).startswith(needle) and "\n" not in str(e.value)


def test_valid_values_are_stored_in_their_canonical_type():
    spec = get_scenario("jaillet-low", {"engine.kv_capacity_tokens": "2e4", "engine.horizon_s": 60,
                                        "engine.fast_forward": "false"})
    eng = spec["engine"]
    assert eng["kv_capacity_tokens"] == 20000 and type(eng["kv_capacity_tokens"]) is int
    assert eng["horizon_s"] == 60.0 and type(eng["horizon_s"]) is float
    assert eng["fast_forward"] is False
    _, config, _ = build_scenario(spec, 0)
    assert config.kv_capacity_tokens == 20000 and config.fast_forward is False


def test_engine_schema_covers_every_engine_field():
    assert list(ENGINE) == EngineConfig.field_names()


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_builtin_scenarios_pass_the_schema(name):
    assert check_scenario(SCENARIOS[name]) == SCENARIOS[name]


def test_scenario_argument_of_wrong_type_is_one_line():
    import gymnasium as gym

    import llmsched_gym  # noqa: F401 (registers the env)

    with pytest.raises(ConfigError, match=r"^scenario: expected a name \(llmsched list\), a .yml file or a mapping, got 123$"):
        gym.make("LLMSched-v1", scenario=123)
    with pytest.raises(ConfigError, match=r"^engine.kv_capacity_tokens: expected an integer >= 1, got 'a'$"):
        gym.make("LLMSched-v1", scenario="jaillet-low", overrides={"engine.kv_capacity_tokens": "a"})
    with pytest.raises(ConfigError, match=r"^overrides: expected a mapping"):
        gym.make("LLMSched-v1", scenario="jaillet-low", overrides=["engine.block_size=16"])
    with pytest.raises(ConfigError, match=r"^flat: expected true or false, got 'no'$"):
        gym.make("LLMSched-v1", scenario="jaillet-low", flat="no")
    with pytest.raises(ConfigError, match=r"^K: expected an integer in \[1, 4,096\], got True$"):
        gym.make("LLMSched-v1", scenario="jaillet-low", K=True)
    with pytest.raises(ConfigError, match=r"^n_requests: expected an integer >= 0, got 'many'$"):
        gym.make("LLMSched-v1", scenario="jaillet-low", n_requests="many")


@pytest.mark.parametrize("kwargs, message", [
    ({"action_mode": "lifo"}, "action_mode: expected one of select, subset, priority, knob, tune, meta, got 'lifo'"),
    ({"order": "random"}, "order: expected one of arrival, shortest, prompt, deadline, got 'random'"),
    ({"admission": "maybe"}, "admission: expected one of current, future, none, got 'maybe'"),
    ({"invalid_action": "ignore"}, "invalid_action: expected one of noop, raise, got 'ignore'"),
    ({"K": 0}, "K: expected an integer in [1, 4,096], got 0"),
    ({"budget": 0}, "budget: expected an integer >= 1, got 0"),
    ({"max_num_seqs": 2.5}, "max_num_seqs: expected an integer >= 1, got 2.5"),
    ({"render_mode": "human"}, "render_mode: expected one of ansi, rgb_array, got 'human'"),
    ({"invalid_penalty": "high"}, "invalid_penalty: expected a number, got 'high'"),
    ({"horizon_s": 0}, "horizon_s: expected a number > 0, got 0"),
])
def test_every_env_argument_is_checked_in_one_line_naming_it(kwargs, message):
    from llmsched_gym.env.llmsched_env import LLMSchedEnv

    with pytest.raises(ConfigError) as e:
        LLMSchedEnv("jaillet-low", **kwargs)
    assert str(e.value) == message


def test_env_arguments_take_their_canonical_types():
    from llmsched_gym.env.llmsched_env import LLMSchedEnv

    env = LLMSchedEnv("jaillet-low", K=np.int64(8), budget=4.0, invalid_penalty=1, max_num_seqs=np.int32(3))
    assert (env.K, env.budget, env.invalid_penalty, env.dp.max_num_seqs) == (8, 4, 1.0, 3)
    assert type(env.K) is int and type(env.budget) is int and type(env.invalid_penalty) is float


def test_complex_priority_action_is_invalid_not_truncated():
    import gymnasium as gym

    from llmsched_gym.env.actions import InvalidActionError

    env = gym.make("LLMSched-v1", scenario="jaillet-low", action_mode="priority", n_requests=20, K=4,
                   invalid_action="raise")
    env.reset(seed=0)
    with pytest.raises(InvalidActionError, match="is not numeric"):
        env.step(np.array([1 + 2j, 0, 0, 0]))


# ---------------------------------------------------------------------------------------------
# policy parameters are checked against the type of their default


@pytest.mark.parametrize("name, params, message", [
    ("mcsf", {"oracle": "maybe"}, "policy.oracle: expected true or false, got 'maybe'"),
    ("sjf", {"max_num_seqs": True}, "policy.max_num_seqs: expected an integer, got True"),
    ("sjf", {"max_num_seqs": 2.5}, "policy.max_num_seqs: expected an integer, got 2.5"),
    ("sarathi", {"watermark": "low"}, "policy.watermark: expected a number, got 'low'"),
    ("fcfs", {"admission": 3}, "policy.admission: expected a string, got 3"),
    ("wait", {"thresholds": "abc"}, "policy.thresholds: expected a list, got 'abc'"),
    ("fcfs", {"bogus": 1}, "policy.bogus: unknown parameter of 'fcfs'; allowed: admission, max_batch"),
])
def test_policy_parameter_of_wrong_type_is_one_line(name, params, message):
    with pytest.raises(baselines.PolicyError) as e:
        baselines.make_policy(name, **params)
    assert str(e.value) == message


def test_policy_parameter_integral_float_becomes_int():
    assert baselines.make_policy("sjf", max_num_seqs=96.0).max_num_seqs == 96


# ---------------------------------------------------------------------------------------------
# one rule for a policy's engine_overrides


def test_policy_engine_overrides_yield_to_explicit_sets():
    scenario = {"overflow": "forbid", "block_size": 1}
    policy = {"overflow": "preempt_lifo_recompute", "preempt_mode": "recompute"}
    assert merge_engine_overrides(scenario, policy) == {"overflow": "preempt_lifo_recompute", "block_size": 1,
                                                        "preempt_mode": "recompute"}
    assert merge_engine_overrides(scenario, policy, {"overflow"})["overflow"] == "forbid"


def test_simulate_applies_the_rule():
    from llmsched_gym.sim import make_engine

    small = {"workload.n_requests": 20}
    engine, _ = make_engine("jaillet-low", "vllm-v1", 0, small)
    assert engine.config.overflow == "preempt_lifo_recompute"  # vLLM's own semantics
    engine, _ = make_engine("jaillet-low", "vllm-v1", 0, {**small, "engine.overflow": "swap"})
    assert engine.config.overflow == "swap"


# ---------------------------------------------------------------------------------------------
# hypothesis: any override value either validates or raises ConfigError


VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-10**30, 10**30), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(),
                                                                             max_size=2),
)
KEYS = st.one_of(st.sampled_from([f"engine.{f}" for f in ENGINE]),
                 st.sampled_from(["workload.n_requests", "workload.horizon_s", "latency", "policy", "engine",
                                  "engine.block_size.x", "policy.name", "description"]),
                 st.text(max_size=12))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(KEYS, VALUES, max_size=3))
@example({"engine.block_size": 16493})  # one block more than jaillet-low's KV: the schema says so, not the engine
def test_random_overrides_validate_or_raise_config_error(overrides):
    try:
        spec = get_scenario("jaillet-low", overrides)
    except ConfigError as e:
        assert "\n" not in str(e) and str(e)
        return
    config = EngineConfig(**spec["engine"])
    config.validate()  # what passed the schema is a valid engine


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=20), max_size=4))
def test_random_set_strings_parse_or_raise_config_error(items):
    try:
        sets = parse_sets(items)
        get_scenario("jaillet-low", {k: v for k, v in sets.items() if not k.startswith("policy.")})
    except ConfigError as e:
        assert "\n" not in str(e)


# ---------------------------------------------------------------------------------------------
# the CLI: exit code 2 and one line, before anything runs


def _cli(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("sets, needle", [
    ("engine.kv_capacity_tokens=abc", "engine.kv_capacity_tokens: expected an integer >= 1, got 'abc'"),
    ("engine.kv_capacity_tokens=[1,2]", "engine.kv_capacity_tokens: expected an integer >= 1, got [1, 2]"),
    ("engine.block_size=x", "engine.block_size: expected an integer >= 1, got 'x'"),
    ("engine.block_size=1.5", "engine.block_size: expected an integer >= 1, got 1.5"),
    ("engine.horizon_s=abc", "engine.horizon_s: expected null or a number > 0, got 'abc'"),
    ("workload.horizon_s=abc", "workload.horizon_s: expected null or a number > 0, got 'abc'"),
    ("workload.n_requests=1e15", "workload.n_requests: expected null or an integer in [0, 100,000,000], got 1000000000000000.0"),
    ("engine.max_iterations=x", "engine.max_iterations: expected null or an integer >= 1, got 'x'"),
    ("engine.block_size.x=1", "engine.block_size.x: unknown engine field"),
    ("engine.prefill_emits_token=maybe", "engine.prefill_emits_token: expected true or false, got 'maybe'"),
    ("engine.fast_forward=maybe", "engine.fast_forward: expected true or false, got 'maybe'"),
    ("engine.max_iterations=-3", "engine.max_iterations: expected null or an integer >= 1, got -3"),
    ("engine.stall_iterations=-1", "engine.stall_iterations: expected an integer >= 0, got -1"),
    ("engine.kv_bytes_per_token=-5", "engine.kv_bytes_per_token: expected an integer >= 1, got -5"),
    ("engine.kv_capacity_tokens=1000.5", "engine.kv_capacity_tokens: expected an integer >= 1, got 1000.5"),
    ("policy.oracle=maybe", "policy.oracle: expected true or false, got 'maybe'"),
    ("novalue", "--set novalue: expected KEY=VALUE"),
])
def test_cli_bad_set_exits_2_with_one_line(capsys, sets, needle):
    rc, out, err = _cli(capsys, "run", "--scenario", "jaillet-low", "--policy", "mcsf", "--set",
                        "workload.n_requests=20", "--set", sets, "--quiet")
    assert rc == 2 and out == ""
    assert err.startswith("error: " + needle) and err.count("\n") == 1


@pytest.fixture
def no_run(monkeypatch):
    """Fail the test if a simulation starts."""
    import llmsched_gym.sim as sim

    def boom(*a, **k):
        raise AssertionError("the run started before the output was checked")

    monkeypatch.setattr(sim, "simulate", boom)


@pytest.mark.parametrize("flag", ["--json", "--log-iterations"])
def test_cli_unwritable_outputs_fail_before_the_run(capsys, tmp_path, no_run, flag):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    for target, needle in ((tmp_path, "is a directory, expected a file path"),
                           (a_file / "out.json", "is a file, not a directory"),
                           (a_file / "deeper" / "out.json", "is a file, not a directory")):
        rc, _, err = _cli(capsys, "run", "--scenario", "jaillet-low", flag, str(target), "--quiet")
        assert rc == 2 and err.count("\n") == 1 and needle in err and err.startswith(f"error: {flag}: ")


def test_output_checks_accept_new_paths(tmp_path):
    check_output_file(tmp_path / "a" / "b" / "s.json", "--json")
    check_output_file(tmp_path / "exists.json", "--json")
    check_output_dir(tmp_path / "new" / "dir", "--out")
    check_output_dir(tmp_path, "--out")
    f = tmp_path / "f"
    f.write_text("")
    with pytest.raises(ConfigError, match=r"^--out: .* is a file, expected a directory$"):
        check_output_dir(f, "--out")


@pytest.mark.parametrize("name", ["/abs/path", "../up", "a/b", "..", ".", "", "a\\b"])
def test_run_name_cannot_escape_out(name):
    with pytest.raises(ConfigError, match="must be a plain folder name"):
        check_run_name(name)


def test_train_name_escaping_out_exits_2_before_training(capsys, tmp_path):
    rc, _, err = _cli(capsys, "train", "--name", str(tmp_path / "elsewhere"), "--out", str(tmp_path / "runs"))
    assert rc == 2 and "--name:" in err and err.count("\n") == 1
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "runs").exists()


# ---------------------------------------------------------------------------------------------
# hyperparameter files


def _hp_file(tmp_path: Path, text: str) -> str:
    p = tmp_path / "hp.yml"
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("text, message", [
    ("default: [unclosed\n", "hyperparams: {p}: line 2: YAML syntax error"),
    ("- a\n- b\n", "hyperparams: {p}: expected a mapping of scenario names (and default) to entries, got a list"),
    ("default: 5\n", "hyperparams: {p}: default: expected a mapping of n_timesteps"),
    ("default: {gamma: 1.5}\n", "hyperparams: {p}: default.gamma: expected a number in [0, 1], got 1.5"),
    ("jaillet-low: {n_steps: 0}\n", "hyperparams: {p}: jaillet-low.n_steps: expected an integer in [1, 1,048,576], got 0"),
    ("default: {learning_rate: fast}\n",
     "hyperparams: {p}: default.learning_rate: expected a number > 0, got 'fast'"),
    ("default: {bc: {from: sjf, epochs: -1}}\n", "hyperparams: {p}: default.bc.epochs: expected an integer >= 1"),
    ("default: {normalize: {norm_obs: maybe}}\n",
     "hyperparams: {p}: default.normalize.norm_obs: expected true or false, got 'maybe'"),
    ("default: {n_stepz: 3}\n", "hyperparams: {p}: default.n_stepz: unknown field; allowed: n_timesteps"),
])
def test_malformed_hyperparameter_file_is_one_line(tmp_path, text, message):
    pytest.importorskip("yaml")
    from agents.train import load_hyperparams

    path = _hp_file(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_hyperparams("jaillet-low", "ppo", path)
    assert str(e.value).startswith(message.format(p=path)) and "\n" not in str(e.value)


def test_hyperparameter_file_reads_exponent_floats(tmp_path):
    from agents.train import load_hyperparams

    hp = load_hyperparams("jaillet-low", "ppo", _hp_file(tmp_path, "default: {learning_rate: 1e-4}\n"))
    assert hp["learning_rate"] == pytest.approx(1e-4)


def test_bundled_hyperparameter_files_pass_the_schema():
    from agents.train import load_hyperparams

    for algo in ("ppo", "maskable-ppo"):
        for scenario in SCENARIOS:
            load_hyperparams(scenario, algo)


def test_cli_missing_hyperparameter_file_exits_2(capsys, tmp_path):
    rc, _, err = _cli(capsys, "train", "--hyperparams", str(tmp_path / "none.yml"), "--out", str(tmp_path))
    assert rc == 2 and err.startswith("error: hyperparams: ") and "no such file" in err


# ---------------------------------------------------------------------------------------------
# the policy catalogue


@pytest.mark.parametrize("name", sorted(baselines.POLICIES))
def test_catalogue_entry_matches_its_class(name):
    entry = baselines.POLICIES[name]
    cls = baselines.policy_class(name)
    assert cls.name == name and entry.target.split(":")[1] == cls.__name__
    assert list(cls.params.items()) == list(entry.params.items())


def test_every_registered_policy_is_catalogued():
    for name in baselines.POLICIES:
        baselines.policy_class(name)
    assert set(baselines.REGISTRY) == set(baselines.POLICIES)


def test_unknown_policy_is_one_line():
    with pytest.raises(baselines.PolicyError, match=r"^policy: unknown 'nope'; allowed: alpha-beta, "):
        baselines.make_policy("nope")


def test_list_and_a_fcfs_run_import_neither_scipy_nor_other_policies():
    code = ("import sys, io, contextlib\n"
            "from llmsched_gym.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    main(['list'])\n"
            "    main(['run', '--scenario', 'jaillet-low', '--policy', 'fcfs', '--set', 'workload.n_requests=20',"
            " '--quiet'])\n"
            "print(sorted(m for m in sys.modules if m == 'scipy' or m.startswith('baselines.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['baselines.base', 'baselines.fcfs']"


def test_apply_overrides_leaves_the_input_alone():
    spec = SCENARIOS["jaillet-low"]
    before = repr(spec)
    out = apply_overrides(spec, {"engine.block_size": 16, "policy.max_num_seqs": 4})
    assert repr(spec) == before
    assert out["engine"]["block_size"] == 16 and out["policy"] == {"name": "mcsf", "max_num_seqs": 4}


# ---------------------------------------------------------------------------------------------
# scenario files


def _summary(capsys, tmp_path, *argv):
    out = tmp_path / f"s{len(list(tmp_path.iterdir()))}.json"
    rc, _, err = _cli(capsys, "run", *argv, "--json", str(out), "--quiet")
    assert rc == 0, err
    import json

    s = json.loads(out.read_text())
    s.pop("wall_time_s")
    return s


def test_scenario_file_round_trip_equals_builtin_with_the_same_set(capsys, tmp_path):
    rc, shown, _ = _cli(capsys, "list", "--scenario", "jaillet-low", "--show")
    assert rc == 0
    edited = shown.replace("kv_capacity_tokens: 16492", "kv_capacity_tokens: 6000")
    assert edited != shown
    path = tmp_path / "mine.yml"
    path.write_text(edited)
    small = ["--set", "workload.n_requests=150", "--policy", "sjf"]
    from_file = _summary(capsys, tmp_path, "--scenario", str(path), *small)
    builtin = _summary(capsys, tmp_path, "--scenario", "jaillet-low", "--set", "engine.kv_capacity_tokens=6000", *small)
    # the names differ (the file's stem); everything else is the same run
    for s, name in ((from_file, "mine"), (builtin, "jaillet-low")):
        assert s.pop("scenario") == name and s["workload_source"].pop("name") == name
    assert from_file == builtin


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_show_output_loads_back_to_the_builtin_scenario(name):
    from llmsched_gym.config import yaml_load
    from llmsched_gym.core.scenarios import scenario_yaml

    spec = get_scenario(name)
    back = yaml_load(scenario_yaml(spec))
    assert {**back, "name": name} == spec


def test_env_accepts_a_scenario_file(tmp_path):
    import gymnasium as gym

    from llmsched_gym.core.scenarios import scenario_yaml

    path = tmp_path / "tiny.yml"
    path.write_text(scenario_yaml(get_scenario("jaillet-low", {"workload.n_requests": 30})))
    env = gym.make("LLMSched-v1", scenario=str(path), action_mode="select")
    env.reset(seed=0)
    assert env.unwrapped.scenario["name"] == "tiny" and env.unwrapped.scenario["workload"]["n_requests"] == 30


@pytest.mark.parametrize("text, needle", [
    ("workload: {n_requests: 5\n", "scenario: {p}: line 2: YAML syntax error"),
    ("- 1\n- 2\n", "scenario: {p}: expected a mapping with workload, engine, latency, policy, got list"),
    ("workload: {n_requests: 5}\nengine: {block_size: maybe}\n",
     "engine.block_size: expected an integer >= 1, got 'maybe'"),
    ("engine: {block_size: 16}\n", "scenario.workload: missing"),
    ("workload: {n_requests: 5}\ncolour: red\n", "scenario.colour: unknown field; allowed: description"),
])
def test_malformed_scenario_file_is_one_line(capsys, tmp_path, text, needle):
    path = tmp_path / "bad.yml"
    path.write_text(text)
    rc, _, err = _cli(capsys, "run", "--scenario", str(path), "--quiet")
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: " + needle.format(p=path))


def test_missing_scenario_file_is_one_line(capsys, tmp_path):
    rc, _, err = _cli(capsys, "run", "--scenario", str(tmp_path / "nope.yml"))
    assert rc == 2 and err == f"error: scenario: {tmp_path / 'nope.yml'}: no such file\n"


WORKLOAD_KEYS = st.sampled_from([
    "workload.arrival.rate", "workload.arrival.type", "workload.prompt.mean", "workload.prompt.median",
    "workload.prompt.max", "workload.prompt.type", "workload.output.mean", "workload.output.max",
    "workload.predictor", "workload.predictor.x", "workload.horizon_s", "workload.clients", "latency",
    "engine.block_size", "engine.kv_capacity_tokens",
])
SMALL_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(-1e3, 1e12, allow_nan=False),
    st.sampled_from(["poisson", "lognormal", "uniform", "noisy", "oracle", "affine", "roofline:nope", "x"]),
    st.lists(st.integers(0, 5), max_size=3), st.dictionaries(st.sampled_from(["type", "x", "mean"]),
                                                             st.integers(0, 9), max_size=2),
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(WORKLOAD_KEYS, SMALL_VALUES, max_size=3), st.integers(0, 3))
def test_random_workload_overrides_build_or_raise_config_error(overrides, seed):
    try:
        build_scenario(get_scenario("jaillet-low", {"workload.n_requests": 20, **overrides}), seed)
    except ConfigError as e:
        assert "\n" not in str(e) and str(e)


# ---------------------------------------------------------------------------------------------
# one check per scenario on the way to the engine


def test_a_scenario_is_checked_once_on_its_way_to_the_engine(monkeypatch):
    import llmsched_gym.config as config_mod
    import llmsched_gym.core.scenarios as scenarios_mod
    from llmsched_gym.env.llmsched_env import LLMSchedEnv
    from llmsched_gym.sim import simulate

    calls = []
    real = config_mod.check_scenario

    def counting(spec):
        calls.append(spec.get("description"))
        return real(spec)

    monkeypatch.setattr(scenarios_mod, "check_scenario", counting)
    simulate("jaillet-low", "fcfs", 0, {"workload.n_requests": 5})
    assert calls == [SCENARIOS["jaillet-low"]["description"]]
    calls.clear()
    env = LLMSchedEnv("jaillet-low", n_requests=5)
    env.reset(seed=0)
    env.reset(seed=1)
    assert calls == [SCENARIOS["jaillet-low"]["description"]]  # at construction, not at every reset


def test_a_checked_engine_config_is_checked_again_only_when_a_field_changed():
    c = EngineConfig.checked({"kv_capacity_tokens": 100, "block_size": 16})
    c.validate()
    c.block_size = "16"
    with pytest.raises(ConfigError, match=r"^engine.block_size: expected an integer >= 1, got '16'$"):
        c.validate()
    # the capacity a section leaves to its default is still held against the block size
    with pytest.raises(ConfigError, match=r"^engine.kv_capacity_tokens: 118784 is less than one block"):
        EngineConfig.checked({"block_size": 200_000})
