"""``decide_every_s``: the ``meta`` and ``tune`` modes hold a decision for a stretch of simulated time.

A held decision changes nothing but *when* the agent is asked: with a constant action the episode
is the same run whatever the interval, with fewer steps; decisions are at least the interval apart;
every episode starts deciding at once."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmsched_gym.config import ConfigError
from llmsched_gym.env.llmsched_env import LLMSchedEnv
from llmsched_gym.sim import simulate

OV = {"workload.n_requests": 150, "engine.kv_capacity_tokens": 24000}
BASE = {"name": "static", "order": "output", "chunk_size": 128, "max_num_seqs": 256}
TUNE = {"prompt_weight": [0.01, 1.0], "chunk_size": [32, 512]}


def play(env: LLMSchedEnv, seed: int, action) -> tuple[dict, list[float]]:
    """The episode's summary and the simulated time of every decision."""
    _, info = env.reset(seed=seed)
    clocks = [info["clock_s"]]
    while True:
        _, _, term, trunc, info = env.step(action)
        if term or trunc:
            return info["summary"], clocks
        clocks.append(info["clock_s"])


def same(a: dict, b: dict) -> None:
    skip = {"policy", "wall_time_s", "env"}
    assert {k: v for k, v in a.items() if k not in skip} == {k: v for k, v in b.items() if k not in skip}


def test_a_constant_tune_action_gives_the_same_run_whatever_the_interval():
    # prompt weight 0.3 (action 2 log(30)/log(100) - 1), budget 128 (action 0)
    action = np.array([2 * math.log(30) / math.log(100) - 1, 0.0], np.float32)
    runs = {}
    for every in (None, 0.5, 4.0):
        env = LLMSchedEnv("azure-conv", action_mode="tune", base=BASE, tune=TUNE, overrides=OV, decide_every_s=every)
        runs[every] = play(env, 3, action)
        assert env.base.prompt_weight == pytest.approx(0.3) and env.base.chunk_size == 128
    ref = simulate("azure-conv", {**BASE, "prompt_weight": 0.3}, 3, OV).summary
    for summary, _ in runs.values():
        same(summary, ref)
    steps = [len(runs[e][1]) for e in (None, 0.5, 4.0)]
    assert steps[0] > steps[1] > steps[2] > 1


@pytest.mark.parametrize("every", [0.5, 3.0])
def test_decisions_are_at_least_the_interval_apart_and_each_episode_starts_deciding_at_once(every):
    env = LLMSchedEnv("azure-conv", action_mode="tune", base=BASE, tune=TUNE, overrides=OV, decide_every_s=every)
    rng = np.random.default_rng(0)
    first = None
    for _ in range(2):  # the same workload twice: the hold restarts with the episode
        _, info = env.reset(seed=5)
        clocks = [info["clock_s"]]
        while True:
            _, _, term, trunc, info = env.step(rng.uniform(-1, 1, 2).astype(np.float32))
            if term or trunc:
                break
            clocks.append(info["clock_s"])
        assert np.all(np.diff(clocks) >= every)
        assert clocks[0] == first if first is not None else True
        first = clocks[0]
        assert len(clocks) > 3


def test_meta_mode_holds_its_candidate():
    env = LLMSchedEnv("azure-conv", action_mode="meta", candidates=["fcfs", "sarathi"], overrides=OV,
                      decide_every_s=2.0)
    summary, clocks = play(env, 1, 1)
    same(summary, simulate("azure-conv", "sarathi", 1, OV).summary)
    assert np.all(np.diff(clocks) >= 2.0)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"action_mode": "priority"}, "decide_every_s: only the meta and tune action modes hold a decision, not 'priority'"),
    ({"action_mode": "tune", "decide_every_s": 0.0}, "decide_every_s: expected a number > 0, got 0.0"),
])
def test_decide_every_s_errors_are_one_line(kwargs, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(") + "$"):
        LLMSchedEnv("azure-conv", **{"decide_every_s": 1.0, **kwargs})


def test_the_azure_conv_tune_recipe_starts_exactly_at_the_best_static_heuristic():
    # agents/hyperparams/azure_conv_tune.yml: action_bias [0, 0] is prompt weight 1.0 (order total) and
    # budget 256, i.e. static:order=total,chunk_size=256,max_num_seqs=256 on every workload
    from pathlib import Path

    import yaml

    entry = yaml.safe_load((Path(__file__).parents[1] / "agents/hyperparams/azure_conv_tune.yml").read_text())["azure-conv"]
    kw = {k: v for k, v in entry["env_kwargs"].items() if k not in ("overrides", "reward")}
    env = LLMSchedEnv("azure-conv", overrides={"workload.n_requests": 150}, **kw)
    summary, _ = play(env, 2, np.asarray(entry["action_bias"], np.float32))
    assert (env.base.prompt_weight, env.base.chunk_size) == (1.0, 256)
    ref = {"name": "static", "order": "total", "chunk_size": 256, "max_num_seqs": 256}
    same(summary, simulate("azure-conv", ref, 2, {"workload.n_requests": 150}).summary)
