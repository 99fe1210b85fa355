"""Routing agents: ``llmsched train`` on a scenario that declares a cluster trains MaskablePPO on
``LLMSchedCluster-v0`` (one function scores every replica), its untrained start follows a router's
weights or is neutral, and ``llmsched benchmark`` scores it and its start on the routing task."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("sb3_contrib")

from agents.agent import load_agent, run_episode  # noqa: E402
from agents.envs import is_routing, make_env  # noqa: E402
from agents.train import TrainConfig, recipe, recipe_line, resolve, train  # noqa: E402
from llmsched_gym.config import ConfigError  # noqa: E402

OV = {"workload.n_requests": 40, "workload.arrival.rate": 45.0}
PRIOR = {"prefix_hit": 2.0, "queued_spread": 1.0, "kv_free": 1.0, "scale": 5.0}


def _recipe_file(tmp_path, prior: dict | None) -> str:
    entry = {"policy": "MlpPolicy", "n_envs": 1, "n_steps": 64, "batch_size": 32, "n_epochs": 1,
             "normalize": {"norm_obs": False, "norm_reward": True},
             "policy_kwargs": {"hidden": [16, 16], "net_arch": {"pi": [], "vf": [16]}},
             "task": "route-prefix-groups", "curves": {"hindsight_sims": 2}, "env_kwargs": {"overrides": OV}}
    if prior:
        entry["route_prior"] = prior
    path = tmp_path / f"route_{'prior' if prior else 'neutral'}.yml"
    path.write_text(json.dumps({"default": entry}))  # JSON is YAML
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from agents.curves import CurveSetup
    from llmsched_gym.benchmark import TASKS
    from llmsched_gym.route_hindsight import route_hindsight

    tmp = tmp_path_factory.mktemp("route")
    # the task's metric on a small validation workload
    curves = CurveSetup(tasks={t.name: replace(t, overrides={**t.overrides, **OV}) for t in TASKS},
                        route_hindsight=route_hindsight)
    out = {}
    for name, prior in (("prior", PRIOR), ("neutral", None)):
        cfg = TrainConfig(scenario="prefix-groups-8", name=name, out=str(tmp), timesteps=128, progress=False,
                          hyperparams_file=_recipe_file(tmp, prior), score_every=1)
        out[name] = (train(cfg, curves), tmp / name)
    return out


def test_a_cluster_scenario_is_a_routing_one():
    assert is_routing("prefix-groups-8") and is_routing("mooncake-conv-8")
    assert not is_routing("azure-conv") and not is_routing("prefix-groups-8", {"cluster.n_replicas": 1})
    env = make_env("prefix-groups-8", {}, OV)
    assert env.unwrapped.spec.id == "LLMSchedCluster-v0" and env.unwrapped.n_replicas == 8
    assert env.unwrapped.expert == "llm-d" and env.unwrapped.refresh_s == 0.1  # the scenario's cluster section


def test_routing_recipe_and_its_one_line_errors(tmp_path):
    cfg = TrainConfig(scenario="prefix-groups-8")
    r = recipe(cfg, resolve(cfg))
    assert recipe_line(r) == ("recipe: agents/hyperparams/routing.yml, entry prefix-groups-8 (over default): "
                              "maskable-ppo (from routing), action mode route (from the scenario's cluster), "
                              "200,000 steps, 2 envs")
    with pytest.raises(ConfigError, match=r"^action_mode: prefix-groups-8 declares a cluster, .* drop --action-mode$"):
        resolve(TrainConfig(scenario="prefix-groups-8", env_kwargs={"action_mode": "select"}))
    with pytest.raises(ConfigError, match=r"^algo: a routing agent is trained with maskable-ppo"):
        resolve(TrainConfig(scenario="prefix-groups-8", algo="ppo"))
    with pytest.raises(ConfigError, match=r"^bc.from: behaviour cloning clones LLMSched-v1's scheduling policies"):
        resolve(TrainConfig(scenario="prefix-groups-8", bc_from="fcfs"))
    with pytest.raises(ConfigError, match=r"^route_prior: only for routing scenarios"):
        resolve(TrainConfig(scenario="jaillet-low", hyperparams={"route_prior": {"kv_free": 1.0}}))
    bad = TrainConfig(scenario="prefix-groups-8", timesteps=64, out=str(tmp_path), progress=False, score_every=0,
                      hyperparams={"route_prior": {"prefix": 1.0}, "n_envs": 1, "n_steps": 64})
    with pytest.raises(ConfigError, match=r"^route_prior.prefix: unknown input; allowed: scale, queued, running, "):
        train(bad)


def test_tiny_routing_run_end_to_end(runs):
    meta, run_dir = runs["prior"]
    assert meta["status"] == "done" and meta["routing"] and meta["timesteps"] >= 128 and meta["vec"] == "dummy"
    assert {"model.json", "best_model.json", "start.json", "curve.json", "learning_curve.png"} <= {
        p.name for p in run_dir.iterdir()}
    val = meta["validation"]
    from baselines.routers import ROUTERS
    from llmsched_gym.cluster_sim import simulate_cluster

    assert set(val["baselines"]) == set(ROUTERS)  # the routers on the validation workload
    curve = val["curve"]
    refs = curve["references"]
    # the best static heuristic of a routing run is the best router; hindsight the router search from it
    best = min((simulate_cluster("prefix-groups-8", router=k, seed=99, overrides=OV).summary["serving"]["p90_ttft_ms"],
                k) for k in ROUTERS)
    assert refs["best_static"] == {"name": best[1], "value": best[0]} and curve["best_baseline"] == refs["best_static"]
    assert curve["target"]["metric"] == "serving.p90_ttft_ms" and curve["target"]["task"] == "route-prefix-groups"
    assert refs["hindsight"]["value"] <= best[0] and refs["hindsight"]["n_sims"] == 3 + 2
    assert curve["points"][0][0] == 0 and curve["start"] == curve["points"][0][1]
    agent = load_agent(run_dir)
    assert agent.name == "maskable-ppo route, prior prefix_hit=2,queued_spread=1,kv_free=1, 128 steps"
    env = make_env("prefix-groups-8", {}, OV)
    summary, _, _ = run_episode(agent, env, 5)
    assert summary["n_completed"] == 40 and "cluster" in summary
    assert runs["neutral"][0]["validation"]["curve"]["start"] > 0
    assert load_agent(runs["neutral"][1] / "start.json").name.startswith("maskable-ppo route, neutral start")


def test_the_prior_start_is_the_weighted_router_and_equivariant(runs):
    import torch

    from agents.features import PRIOR_INPUTS

    _, run_dir = runs["prior"]
    start = load_agent(run_dir / "start.json")
    ext = start.model.policy.features_extractor
    rng = np.random.default_rng(0)
    obs = rng.random((64, 8 * 5 + 2)).astype(np.float32)
    with torch.no_grad():
        t = torch.as_tensor(obs)
        z = ext.replica_inputs(t).numpy()
        logits = start.model.policy.get_distribution(t).distribution.logits.numpy()
    w = np.zeros(len(PRIOR_INPUTS))
    for k, v in PRIOR.items():
        if k != "scale":
            w[PRIOR_INPUTS.index(k)] = PRIOR["scale"] * v
    want = z @ w  # the weighted score of every replica: prefix hit, queue-depth spread, free KV
    assert np.allclose(logits - logits.mean(1, keepdims=True), want - want.mean(1, keepdims=True), atol=1e-4)
    # the spread of the queue: (max - q) / (max - min) over the replicas
    rows = obs[:, :40].reshape(64, 8, 5)
    q = rows[:, :, 0]
    assert np.allclose(z[:, :, 5], (q.max(1, keepdims=True) - q) / (q.max(1, keepdims=True) - q.min(1, keepdims=True)))
    # permuting the replicas permutes the logits (one function scores every replica)
    perm = rng.permutation(8)
    pobs = np.concatenate([rows[:, perm].reshape(64, 40), obs[:, 40:]], axis=1)
    neutral = load_agent(runs["neutral"][1])
    for model in (start.model, neutral.model):
        with torch.no_grad():
            a = model.policy.get_distribution(torch.as_tensor(obs)).distribution.logits.numpy()
            b = model.policy.get_distribution(torch.as_tensor(pobs)).distribution.logits.numpy()
        assert np.allclose(a[:, perm], b, atol=1e-5)


def test_benchmark_scores_the_agent_and_its_start(runs, tmp_path):
    from llmsched_gym.benchmark import run_benchmark

    _, run_dir = runs["prior"]
    res = run_benchmark(tasks=["route-prefix-groups"], quick=True, out=tmp_path, agents=[str(run_dir)], seeds=[100],
                        hindsight_sims=2)
    r = res["tasks"]["route-prefix-groups"]
    kinds = {row["kind"]: row for row in r["rows"]}
    agent, start = kinds["agent"], kinds["start"]
    assert agent["name"].startswith("maskable-ppo route, prior") and start["name"].endswith("untrained start")
    assert agent["learned"]["rel"] == pytest.approx((agent["values"][0] - start["values"][0]) / start["values"][0])
    ref = kinds["reference"]
    routers = [row["values"][0] for row in r["rows"] if row["kind"] == "baseline"]
    assert ref["values"][0] <= min(routers)  # never worse than any router's run
    search = ref["params"]["search"][0]
    assert search["n_sims"] == 3 + 2 and search["value"] >= ref["values"][0]
    assert res["protocol"]["route_hindsight_sims"] == 2


def test_mooncake_default_recipe_is_the_measured_route_mooncake_recipe() -> None:
    # routing.yml's mooncake-conv-8 entry (what `llmsched train --scenario mooncake-conv-8` uses) is the
    # recipe measured in agents/hyperparams/route_mooncake.yml: the same hyperparameters, key for key
    from agents.train import load_hyperparams

    default = load_hyperparams("mooncake-conv-8", "maskable-ppo", None, routing=True)
    measured = load_hyperparams("mooncake-conv-8", "maskable-ppo", "agents/hyperparams/route_mooncake.yml",
                                routing=True)
    assert default == measured
    assert default["route_prior"] == {"prefix_hit": 2.0, "queued_spread": 1.0, "kv_free": 1.0, "scale": 2.0}
    assert default["learning_rate"] == 1.0e-3 and default["task"] == "route-mooncake"
