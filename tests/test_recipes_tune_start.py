"""The ``tune`` recipes that start at a task's best static heuristic really start there.

Each recipe in ``agents/hyperparams/*_tune.yml`` listed here maps its ``action_bias`` (the
untrained policy's mean action) to the knob values of the task's best static heuristic, so that
anything its agent does beyond that heuristic is learned. Played as a constant action on a small
workload of the task, the recipe's env must give exactly the static heuristic's run (the summaries
agree to the last digit), and the base policy must hold exactly the heuristic's parameters."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from llmsched_gym.env.llmsched_env import LLMSchedEnv
from llmsched_gym.sim import simulate

HP = Path(__file__).parents[1] / "agents" / "hyperparams"
ECHO_SMALL = {"workload.n_requests": 40, "workload.classes.offline.n_requests": 200, "engine.horizon_s": 15.0,
              "workload.predictor": {"type": "lognormal", "sigma": 0.7}}

# (recipe file, entry, scenario, small workload of the task, the task's best static heuristic, the
# base policy's parameters after the start action)
CASES = [
    ("azure_conv_clairvoyant_tune.yml", "azure-conv", "azure-conv",
     {"workload.n_requests": 150, "workload.predictor": {"type": "oracle"}},
     {"order": "total", "chunk_size": 256, "max_num_seqs": 256}, {"prompt_weight": 1.0, "chunk_size": 256}),
    ("azure_conv_blind_tune.yml", "azure-conv", "azure-conv",
     {"workload.n_requests": 150, "workload.predictor": {"type": "none"}},
     {"order": "prompt", "chunk_size": 256, "max_num_seqs": 256}, {"chunk_size": 256}),
    ("jaillet_high_tune.yml", "jaillet-high", "jaillet-high", {"workload.n_requests": 150},
     {"order": "total", "chunk_size": 128, "max_num_seqs": 256}, {"prompt_weight": 1.0, "chunk_size": 128}),
    ("jaillet_noisy_tune.yml", "jaillet-noisy", "jaillet-noisy", {"workload.n_requests": 150},
     {"order": "total", "chunk_size": 128, "max_num_seqs": 256}, {"prompt_weight": 1.0, "chunk_size": 128}),
    ("echo_hybrid_tune.yml", "echo-hybrid", "echo-hybrid", ECHO_SMALL,
     {"order": "total", "chunk_size": 128, "max_num_seqs": 256}, {"prompt_weight": 1.0, "chunk_size": 128}),
    ("azure_conv_tail_tune.yml", "azure-conv", "azure-conv", {"workload.n_requests": 150},
     {"order": "las", "chunk_size": 0, "max_num_seqs": 64}, {"max_num_seqs": 64}),
]


def play(env: LLMSchedEnv, seed: int, action: np.ndarray) -> tuple[dict, int]:
    """The episode's summary and its number of decisions under a constant action."""
    env.reset(seed=seed)
    steps = 0
    while True:
        _, _, term, trunc, info = env.step(action)
        steps += 1
        if term or trunc:
            return info["summary"], steps


def same(a: dict, b: dict) -> None:
    skip = {"policy", "wall_time_s", "env"}
    assert {k: v for k, v in a.items() if k not in skip} == {k: v for k, v in b.items() if k not in skip}


@pytest.mark.parametrize(("recipe", "entry", "scenario", "small", "static", "knobs"), CASES, ids=[c[0] for c in CASES])
def test_the_recipe_starts_exactly_at_its_tasks_best_static_heuristic(recipe, entry, scenario, small, static, knobs):
    hp = yaml.safe_load((HP / recipe).read_text())[entry]
    kw = {k: v for k, v in hp["env_kwargs"].items() if k != "overrides"}
    if "decide_every_s" in kw:  # a constant action gives the same run however often it is applied; decide
        kw["decide_every_s"] = 5.0  # often enough that a small workload (the real trace's or the stand-in's) has several
    env = LLMSchedEnv(scenario, overrides=small, **kw)
    action = np.atleast_1d(np.asarray(hp["action_bias"], np.float32))
    summary, steps = play(env, 3, action)
    assert steps > 1  # the agent decides more than once per episode: there is something to learn
    assert {k: getattr(env.base, k) for k in knobs} == knobs
    same(summary, simulate(scenario, {"name": "static", **static}, 3, small).summary)


@pytest.mark.parametrize("recipe", [c[0] for c in CASES])
def test_the_recipe_trains_on_its_tasks_information(recipe):
    # the training episodes must carry the task's predictor (oracle, none, the learned ranker's error),
    # else the agent learns under other information than the benchmark scores it with
    from agents.train import load_hyperparams
    from llmsched_gym.benchmark import TASKS

    ((key, raw),) = yaml.safe_load((HP / recipe).read_text()).items()
    entry = load_hyperparams(key, "ppo", str(HP / recipe))  # every field checked (one-line errors)
    assert entry["env_kwargs"] == raw["env_kwargs"] and entry["env_kwargs"]["action_mode"] == "tune"
    task = next(t for t in TASKS if t.name == entry["task"])
    assert task.scenario == key  # `llmsched train --scenario KEY` trains on the task's scenario
    train = entry["env_kwargs"]["overrides"]
    if "workload.predictor" in task.overrides:
        assert train["workload.predictor"] == task.overrides["workload.predictor"]
    env = LLMSchedEnv(task.scenario, overrides=train)
    assert env.information == task.information
