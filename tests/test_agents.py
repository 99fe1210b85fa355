"""Agents: the set encoder, the report statistics, training plumbing (save, reload, masks,
resume, behaviour cloning), TensorBoard scalars, and baselines evaluated as ``llmsched run`` runs them."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sb3_contrib")

from gymnasium import spaces  # noqa: E402

from agents.agent import load_agent, make_env, run_episode, vecnormalize_path  # noqa: E402
from agents.features import QueueSetExtractor  # noqa: E402
from agents.report import mean_ci, parse_seeds  # noqa: E402
from agents.train import TrainConfig, resolve, schedule, train  # noqa: E402
from llmsched_gym.cli import main  # noqa: E402

SMALL = {"workload.n_requests": 120}


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _space(k: int = 5, f: int = 3) -> spaces.Dict:
    return spaces.Dict({"queue": spaces.Box(0, 1, (k, f), np.float32), "running": spaces.Box(0, 1, (4,), np.float32),
                        "globals": spaces.Box(0, 1, (2,), np.float32)})


def _extractor(**kw) -> QueueSetExtractor:
    torch.manual_seed(0)
    return QueueSetExtractor(_space(), slot_hidden=(8,), context_hidden=(4,), **kw)


def test_set_encoder_pools_are_permutation_invariant_and_slot_scores_follow_the_slots():
    ext = _extractor(slot_out=2)
    rng = np.random.default_rng(0)
    q = rng.uniform(0.1, 1, (1, 5, 3)).astype(np.float32)
    perm = np.array([3, 0, 4, 1, 2])
    obs = {"running": torch.rand(1, 4), "globals": torch.rand(1, 2)}
    a = ext({**obs, "queue": torch.as_tensor(q.reshape(1, -1))})
    b = ext({**obs, "queue": torch.as_tensor(q[:, perm].reshape(1, -1))})
    pooled = 2 * 8 + 2 * 4
    assert torch.allclose(a[:, :pooled], b[:, :pooled], atol=1e-6)
    slots_a = a[:, pooled:].reshape(5, 2)
    slots_b = b[:, pooled:].reshape(5, 2)
    assert torch.allclose(slots_a[perm], slots_b, atol=1e-6)


def test_set_encoder_ignores_empty_slots():
    ext = _extractor(slot_out=0)
    q = torch.zeros(1, 5, 3)
    q[0, 0] = torch.tensor([1.0, 0.5, 0.2])
    q2 = q.clone()
    q2[0, 3] = torch.tensor([1.0, 0.5, 0.2])  # the same request twice: mean and max unchanged
    obs = {"running": torch.rand(1, 4), "globals": torch.rand(1, 2)}
    a = ext({**obs, "queue": q.reshape(1, -1)})
    b = ext({**obs, "queue": q2.reshape(1, -1)})
    assert a.shape == (1, ext.features_dim) == (1, 24)
    assert torch.allclose(a, b, atol=1e-6)


def _dense_reference(ext: QueueSetExtractor, obs: dict) -> torch.Tensor:
    """The extractor's formula with the slot MLP run on every slot, empty ones masked afterwards."""
    q = obs["queue"].reshape(-1, ext.n_slots, ext.n_slot_features)
    occupied = (q.abs().sum(-1, keepdim=True) > 0).to(q.dtype)
    h = ext.slot(q) * occupied
    mean = h.sum(1) / occupied.sum(1).clamp(min=1.0)
    parts = [mean, h.max(1).values, ext.running(obs["running"]), ext.globals(obs["globals"])]
    if ext.slot_score is not None:
        parts.append((ext.slot_score(h) * occupied).flatten(1))
    return torch.cat(parts, dim=1)


@pytest.mark.parametrize("full", [False, True])
def test_set_encoder_on_occupied_slots_only_equals_the_dense_formula_and_its_gradients(full):
    ext = _extractor(slot_out=2)
    rng = np.random.default_rng(1)
    q = rng.uniform(0.1, 1, (7, 5, 3)).astype(np.float32)
    if not full:
        q[rng.uniform(size=(7, 5)) < 0.5] = 0.0  # empty slots, as the env writes them
        q[0] = 0.0  # an empty queue
    obs = {"queue": torch.as_tensor(q.reshape(7, -1)), "running": torch.rand(7, 4), "globals": torch.rand(7, 2)}
    w = torch.randn(7, ext.features_dim)
    grads = []
    for f in (ext, lambda o: _dense_reference(ext, o)):
        ext.zero_grad()
        out = f(obs)
        (out * w).sum().backward()
        grads.append((out.detach(), [p.grad.clone() for p in ext.parameters()]))
    (a, ga), (b, gb) = grads
    assert torch.allclose(a, b, atol=1e-6)
    assert all(torch.allclose(x, y, atol=1e-5) for x, y in zip(ga, gb, strict=True))
    if not full:
        assert torch.count_nonzero(a[0, :8]) == 0  # an empty queue pools to zeros


def test_mean_ci_is_the_t_interval():
    m, half, n = mean_ci([1.0, 2.0, 3.0])
    assert (m, n) == (2.0, 3)
    assert half == pytest.approx(4.302652729911275 / math.sqrt(3), rel=1e-9)
    assert math.isnan(mean_ci([5.0])[1])
    assert mean_ci([1.0, math.nan, 3.0]) == (2.0, pytest.approx(12.706204736174698), 2)


def test_parse_seeds_ranges_and_lists():
    assert parse_seeds("100-104") == [100, 101, 102, 103, 104]
    assert parse_seeds("1,5,7-8") == [1, 5, 7, 8]
    with pytest.raises(ValueError, match="seeds"):
        parse_seeds("a-b")


def test_hyperparams_pick_ppo_for_priority_and_reject_maskable_knob():
    hp = resolve(TrainConfig(scenario="jaillet-high", env_kwargs={"action_mode": "priority"}))
    assert hp["algo"] == "ppo" and hp["env_kwargs"]["action_mode"] == "priority"
    hp = resolve(TrainConfig(scenario="jaillet-high"))
    assert hp["algo"] == "maskable-ppo" and hp["env_kwargs"]["overrides"]["workload.n_requests"] == 500
    with pytest.raises(ValueError, match="maskable-ppo needs action_mode select, subset or meta"):
        resolve(TrainConfig(algo="maskable-ppo", env_kwargs={"action_mode": "knob"}))
    with pytest.raises(ValueError, match="hyperparams.n_stepz: unknown field; allowed: n_timesteps"):
        resolve(TrainConfig(hyperparams={"n_stepz": 3}))


def test_azure_conv_priority_recipe_admits_shortest_first_and_validates_on_the_test_size():
    hp = resolve(TrainConfig(scenario="azure-conv", env_kwargs={"action_mode": "priority"}))
    assert hp["algo"] == "ppo" and hp["action_bias"] == sorted(hp["action_bias"], reverse=True)  # shortest first
    kw = hp["env_kwargs"]
    assert (kw["order"], kw["K"], kw["budget"]) == ("shortest", 16, 256)
    assert kw["overrides"]["workload.trace.part"] == [0.0, 0.5]  # azure-conv-late stays held out
    assert hp["validation_requests"] == 1000  # the benchmark's test size
    assert resolve(TrainConfig(scenario="azure-conv", algo="ppo", validation_requests=200))["validation_requests"] == 200
    with pytest.raises(ValueError, match="hyperparams.validation_requests: expected an integer in \\[1, 100,000,000\\], got 0"):
        resolve(TrainConfig(scenario="azure-conv", algo="ppo", hyperparams={"validation_requests": 0}))


def test_agents_are_named_for_what_they_set():
    from agents.agent import describe_run

    tune = {"algo": "ppo", "timesteps": 60_000, "env_kwargs": {"action_mode": "tune", "tune": {"chunk_size": [32, 8192]}}}
    assert describe_run(tune, "x") == "ppo tune: sarathi chunk_size, 60k steps"
    both = {"algo": "ppo", "timesteps": 500, "env_kwargs": {"action_mode": "tune", "base": {"name": "sarathi", "watermark": 0.02}}}
    assert describe_run(both, "x") == "ppo tune: sarathi chunk_size+max_num_seqs, 500 steps"
    assert describe_run({"algo": "maskable-ppo", "timesteps": 41_000, "bc": {"policy": "sarathi"}}, "x") == \
        "maskable-ppo select, bc: sarathi, 41k steps"
    prio = {"algo": "ppo", "timesteps": 166_000,
            "env_kwargs": {"action_mode": "priority", "order": "prompt", "budget": 256}}
    assert describe_run(prio, "x") == "ppo priority/prompt-order budget 256, 166k steps"
    assert describe_run(prio, "x", start=True) == "ppo priority/prompt-order budget 256, untrained start"


def test_vecnormalize_names_follow_the_model_names(tmp_path):
    assert vecnormalize_path(tmp_path / "model.zip").name == "vecnormalize.pkl"
    assert vecnormalize_path(tmp_path / "best_model.zip").name == "best_vecnormalize.pkl"
    assert vecnormalize_path(tmp_path / "model_512_steps.zip").name == "model_vecnormalize_512_steps.pkl"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("train")
    cfg = TrainConfig(scenario="jaillet-low", name="tiny", out=str(out), timesteps=2048, seed=0, n_envs=2,
                      overrides=SMALL, env_kwargs={"K": 8},
                      hyperparams={"n_steps": 256, "batch_size": 128, "n_epochs": 2},
                      bc_from="fcfs", bc_episodes=1, bc_epochs=3, checkpoint_every=1024, progress=False)
    meta = train(cfg)
    return out / "tiny", meta, cfg


def test_benchmark_scores_an_agent_only_on_its_own_scenario(tiny_run, tmp_path):
    from llmsched_gym.benchmark import run_benchmark

    run_dir, _, _ = tiny_run
    res = run_benchmark(["azure-conv"], agents=[str(run_dir)], quick=True, baselines=["fcfs", "sarathi"],
                        out=tmp_path)
    assert res["skipped"]["azure-conv"][str(run_dir)].endswith("was trained on jaillet-low, not azure-conv")
    assert all(r["kind"] != "agent" for r in res["tasks"]["azure-conv"]["rows"])


def test_tiny_agent_trains_saves_reloads_and_serves_every_request_with_masks(tiny_run):
    run_dir, meta, _ = tiny_run
    assert meta["timesteps"] == 2048 and meta["episodes"] > 0  # four rollouts of 2 envs x 256 steps
    for f in ("model.json", "model.safetensors", "best_model.json", "best_model.safetensors", "run.json",
              "checkpoints/model_1024_steps.json", "checkpoints/model_1024_steps.safetensors"):
        assert (run_dir / f).exists(), f
    assert not list(run_dir.rglob("*.zip")) and not list(run_dir.rglob("*.pkl"))  # nothing unpickled later
    rec = json.loads((run_dir / "run.json").read_text())
    assert rec["seeds"]["model"] == 0 and rec["seeds"]["validation_workload"] == 99
    agent = load_agent(run_dir)
    seen = []
    real_act = agent.act

    def act(obs, mask, deterministic=True):
        seen.append(mask)
        a = real_act(obs, mask, deterministic)
        assert mask[int(a)], "the agent chose a masked action"
        return a

    agent.act = act  # type: ignore[method-assign]
    env = make_env("jaillet-low", {k: v for k, v in agent.env_kwargs.items() if k != "overrides"}, SMALL)
    summary, requests, iterations = run_episode(agent, env, seed=100)
    k = agent.env_kwargs.get("K", 16)
    assert seen and all(m is not None and m.dtype == bool and m[k] for m in seen)  # launch always valid
    assert summary["n_arrived"] == 120 == summary["n_completed"]
    assert len(requests["e2e_s"]) == 120 and len(iterations["kv_used"]) == summary["iterations"]


def test_behaviour_cloning_learns_the_experts_choices(tiny_run):
    _, meta, _ = tiny_run
    bc = meta["bc"]
    assert bc["policy"] == "fcfs" and bc["bc_samples"] == bc["steps"] > 0
    assert bc["bc_accuracy"] >= 0.9


def test_tensorboard_has_the_custom_scalars(tiny_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _, _ = tiny_run
    files = sorted((run_dir / "tb").rglob("events.out.tfevents.*"))
    assert files
    tags: set[str] = set()
    values: dict[str, float] = {}
    for f in files:
        ea = EventAccumulator(str(f))
        ea.Reload()
        for t in ea.Tags()["scalars"]:
            tags.add(t)
            values[t] = ea.Scalars(t)[-1].value
    for t in ("sched/mean_e2el_ms", "sched/p99_e2el_ms", "sched/mean_ttft_ms", "sched/p99_ttft_ms", "sched/mean_tpot_ms",
              "sched/mean_itl_ms", "sched/output_throughput", "sched/total_token_throughput", "sched/evictions", "sched/recomputed_tokens",
              "eval/rel_mean_e2el_ms_vs_best", "eval/rel_p99_ttft_ms_vs_best", "train/entropy_loss",
              "bc/accuracy", "bc/samples", "bc/seconds", "rollout/ep_rew_mean"):
        assert t in tags, t
    assert values["sched/mean_e2el_ms"] > 0 and values["eval/rel_mean_e2el_ms_vs_best"] > 0
    assert 0 <= values["bc/accuracy"] <= 1 and values["bc/samples"] > 0 and values["rollout/ep_rew_mean"] < 0


def test_resume_continues_from_a_checkpoint(tiny_run):
    run_dir, _, cfg = tiny_run
    cfg2 = TrainConfig(**{**cfg.__dict__, "name": "tiny-resumed", "resume": str(run_dir / "checkpoints/model_1024_steps.json"),
                          "timesteps": 1536, "bc_from": None, "score_every": 0})
    meta = train(cfg2)
    assert meta["timesteps"] == 1536


def test_bc_from_takes_a_baseline_with_parameters():
    from agents.train import parse_policy_spec

    assert parse_policy_spec("mcsf") == "mcsf"
    assert parse_policy_spec("None") is None
    assert parse_policy_spec("sjf:max_num_seqs=96,oracle=true") == {"name": "sjf", "max_num_seqs": 96, "oracle": True}
    assert resolve(TrainConfig(scenario="jaillet-high"))["bc"] == {
        "from": {"name": "sjf", "max_num_seqs": 96}, "episodes": 8, "epochs": 60}  # the file's entry
    assert resolve(TrainConfig(scenario="jaillet-high", bc_from="none", bc_epochs=3))["bc"] == {
        "from": None, "episodes": 8, "epochs": 3}
    env = make_env("jaillet-high", {"order": "shortest", "expert": parse_policy_spec("sjf:max_num_seqs=2"),
                                    "overrides": {"workload.n_requests": 30}})
    env.reset(seed=0)
    base = env.unwrapped
    most = 0
    while True:  # the capped expert's demonstrations never run more than 2 requests at once
        _, _, term, trunc, info = env.step(base.expert_action())
        most = max(most, len(base.engine.running))
        if term or trunc:
            break
    assert most == 2 and info["summary"]["n_completed"] == 30


def test_hyperparameters_read_exponent_floats_and_reject_non_numbers():
    from llmsched_gym.config import parse_value

    assert parse_value("1e-4") == pytest.approx(1e-4) and parse_value("fcfs") == "fcfs"
    hp = resolve(TrainConfig(scenario="jaillet-high", hyperparams={"learning_rate": "3e-5", "n_steps": "256"}))
    assert hp["learning_rate"] == pytest.approx(3e-5) and hp["n_steps"] == 256
    with pytest.raises(ValueError, match="hyperparams.learning_rate: expected a number > 0, got 'fast'"):
        resolve(TrainConfig(scenario="jaillet-high", hyperparams={"learning_rate": "fast"}))
    with pytest.raises(ValueError, match="hyperparams.n_steps: expected an integer in \\[1, 1,048,576\\], got 2.5"):
        resolve(TrainConfig(scenario="jaillet-high", hyperparams={"n_steps": 2.5}))
    hp = resolve(TrainConfig(scenario="jaillet-high", hyperparams={"learning_rate": "lin_3e-4"}))
    assert hp["learning_rate"] == "lin_3e-4"  # rl-zoo's linear decay, kept as written in run.json
    lr = schedule(hp["learning_rate"])
    assert (lr(1.0), lr(0.5), lr(0.0)) == pytest.approx((3e-4, 1.5e-4, 0.0))
    with pytest.raises(ValueError, match=r"hyperparams.learning_rate: expected a number > 0 or lin_START \(a linear decay from START > 0\), "
                       "got 'lin_fast'"):
        resolve(TrainConfig(scenario="jaillet-high", hyperparams={"learning_rate": "lin_fast"}))
    with pytest.raises(ValueError, match=r"hyperparams.gamma: expected a number in \[0, 1\], got 'lin_0.99'"):
        resolve(TrainConfig(scenario="jaillet-high", hyperparams={"gamma": "lin_0.99"}))


def test_wall_clock_limit_stops_learning_and_still_saves(tiny_run, tmp_path):
    _, _, cfg = tiny_run
    cfg2 = TrainConfig(**{**cfg.__dict__, "name": "tiny-limited", "out": str(tmp_path), "timesteps": 10**6,
                          "bc_from": None, "score_every": 0, "max_minutes": 1e-4})
    meta = train(cfg2)
    assert meta["stopped_by_time_limit"] is True
    assert 0 < meta["timesteps"] < 10**6
    assert (tmp_path / "tiny-limited" / "model.json").exists()


@pytest.mark.parametrize("scenario, policy", [("azure-conv", "mcsf"), ("jaillet-low", "fcfs"), ("jaillet-low", "vllm-v1")])
def test_evaluate_of_a_baseline_equals_llmsched_run(tmp_path, capsys, scenario, policy):
    run_json = tmp_path / "run.json"
    args = ["--scenario", scenario, "--set", "workload.n_requests=150"]
    assert main(["run", "--policy", policy, "--seed", "3", "--json", str(run_json), "--quiet", *args]) == 0
    assert main(["evaluate", "--policies", policy, "--seeds", "3", "--out", str(tmp_path / "ev"), "--no-plots",
                 "--quiet", *args]) == 0
    ev = json.loads((tmp_path / "ev" / "results.json").read_text())["runs"][0]["summary"]
    ran = json.loads(run_json.read_text())
    for s in (ran, ev):
        s.pop("wall_time_s")
    assert ev == ran


def test_compare_writes_report_tables_csv_and_plots(tmp_path, capsys):
    out = tmp_path / "cmp"
    rc = main(["compare", "--scenario", "jaillet-low", "--policies", "fcfs,sjf,semi-online", "--seeds", "0-2",
               "--loads", "1,2", "--set", "workload.n_requests=80", "--out", str(out), "--quiet"])
    assert rc == 0
    for f in ("report.md", "results.json", "results.csv", "cdf_load1.png", "kv_load1.png", "bars_load2.png"):
        assert (out / f).exists(), f
    res = json.loads((out / "results.json").read_text())
    ran = {r["policy"] for r in res["runs"]}
    assert {"fcfs", "sjf"} <= ran and ran | set(res["skipped"]) == {"fcfs", "sjf", "semi-online"}
    e2e = [r["metrics"]["mean_e2el_ms"] for r in res["runs"] if r["policy"] == "sjf" and r["load"] == 1.0]
    agg = res["aggregate"]["1"]["sjf"]["mean_e2el_ms"]
    m, half, n = mean_ci(e2e)
    assert (agg["mean"], agg["ci95"], agg["n"]) == (pytest.approx(m), pytest.approx(half), 3)
    rows = (out / "results.csv").read_text().splitlines()
    assert rows[0] == "load,policy,metric,mean,ci95_low,ci95_high,n"
    assert any(r.startswith("2,fcfs,mean_e2el_ms,") for r in rows)
    text = (out / "report.md").read_text()
    # a policy identical to another on every seed is marked once, with the reason stated
    same = all(a["metrics"] == b["metrics"] for a, b in zip(
        sorted((r for r in res["runs"] if r["policy"] == "sjf"), key=lambda r: (r["load"], r["seed"])),
        sorted((r for r in res["runs"] if r["policy"] == "fcfs"), key=lambda r: (r["load"], r["seed"])), strict=True))
    assert ("| sjf (= fcfs) |" in text) == same and ("| sjf |" in text) == (not same)
    assert ("`(= X)`: identical to X on every seed" in text) == same


def test_bad_evaluate_input_is_one_line(capsys):
    rc = main(["compare", "--scenario", "jaillet-low", "--policies", "nope"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: policies: unknown 'nope'") and err.count("\n") == 1


def test_action_bias_starts_a_box_policy_exactly_at_that_mean_action():
    import gymnasium as gym
    from stable_baselines3 import PPO

    from agents.train import set_action_bias

    env = gym.make("llmsched_gym:LLMSched-v1", scenario="azure-conv", action_mode="priority", order="shortest",
                   K=8, budget=256, overrides={"workload.n_requests": 30})
    model = PPO("MultiInputPolicy", env, seed=0, device="cpu", n_steps=64)
    set_action_bias(model, 0.5)
    obs, _ = env.reset(seed=0)
    action, _ = model.predict(obs, deterministic=True)
    assert action.shape == (8,) and np.array_equal(action, np.full(8, 0.5, np.float32))
    ramp = np.linspace(0.9, 0.2, 8)
    set_action_bias(model, list(ramp))
    for _ in range(3):  # whatever the observation
        action, _ = model.predict(obs, deterministic=True)
        assert np.allclose(action, ramp)
        obs, *_ = env.step(action)
    with pytest.raises(ValueError, match=r"action_bias: expected a number or 8 numbers, each in \[-1, 1\]"):
        set_action_bias(model, [0.5, 0.2])
    masked = gym.make("llmsched_gym:LLMSched-v1", scenario="azure-conv", overrides={"workload.n_requests": 30})
    with pytest.raises(ValueError, match="action_bias: only for Box"):
        set_action_bias(PPO("MultiInputPolicy", masked, device="cpu", n_steps=64), 0.5)
