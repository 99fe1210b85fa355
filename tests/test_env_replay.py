"""The env is a superset of the baselines: every baseline's plan is an action (exact expert replay).

Driving ``LLMSched-v1`` with ``expert_action()`` of a policy must give the summary ``simulate()``
gives for that policy (wall time aside): in the default ``select`` mode for the engine and paper
policies whose plans are preemptions, admissions and a token budget, and in ``meta`` mode for
every registered policy.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ORACLE, small_cuts, summaries_equal

import baselines
from llmsched_gym.env.llmsched_env import LLMSchedEnv
from llmsched_gym.env.settings import default_candidates
from llmsched_gym.sim import make_policy, simulate

# azure-conv clairvoyant: every registered policy (vtc-oracle too) can be a candidate
SIZES = small_cuts(120, ("azure-conv", "jaillet-high", "vtc-arena", "klpm-toy", "wait-high", "nested-synth4",
                         "echo-hybrid"), offline=30,
                   sizes={"azure-conv": 300, "jaillet-high": 150, "vtc-arena": 200, "echo-hybrid": 30},
                   extra={"azure-conv": ORACLE})
# each policy's own paper scenario
PAPER = {
    "mcsf": "jaillet-high", "alpha-beta": "jaillet-high", "alpha-greedy": "jaillet-high", "semi-online": "jaillet-high",
    "fcfs-greedy-lifo": "wait-high", "wait": "wait-high", "nested-wait": "nested-synth4",
    "vllm-v0": "wait-high", "vllm-v1": "wait-high", "sarathi": "wait-high",
    "vtc": "vtc-arena", "vtc-weighted": "vtc-arena", "vtc-predict": "vtc-arena", "vtc-oracle": "vtc-arena",
    "lcf": "vtc-arena", "rpm": "vtc-arena", "drr": "vtc-arena",
    "lpm": "klpm-toy", "k-lpm": "klpm-toy", "sglang-lpm": "klpm-toy",
    "echo": "echo-hybrid", "echo-bs": "echo-hybrid", "echo-bs-e": "echo-hybrid", "echo-bs-e-s": "echo-hybrid",
    "fcfs": "azure-conv", "sjf": "azure-conv", "srpt": "azure-conv",
}
# the default mode's list: (policy, slot order that shows its picks first)
SELECT_POLICIES = [
    ("fcfs", "arrival"), ("sjf", "shortest"), ("srpt", "shortest"), ("mcsf", "shortest"),
    ({"name": "sarathi", "chunk_size": 128}, "arrival"), ({"name": "sarathi", "chunk_size": 256}, "arrival"),
    ({"name": "sarathi", "chunk_size": 512}, "arrival"), ({"name": "sarathi", "chunk_size": 2048}, "arrival"),
    ("vllm-v1", "arrival"), ("lpm", "arrival"), ("k-lpm", "arrival"), ("sglang-lpm", "arrival"), ("vtc", "arrival"),
]


def replay(env: LLMSchedEnv, seed: int) -> tuple[dict, int]:
    env.reset(seed=seed)
    steps = 0
    while True:
        _, _, term, trunc, info = env.step(env.expert_action(strict=True))
        steps += 1
        if term or trunc:
            return info["summary"], steps


def name_of(policy) -> str:
    return policy if isinstance(policy, str) else policy["name"]


@pytest.mark.parametrize("own", [False, True], ids=["azure-conv", "paper"])
@pytest.mark.parametrize("policy,order", SELECT_POLICIES, ids=lambda p: str(p.get("chunk_size", "")) if isinstance(p, dict) else str(p))
def test_select_mode_replays_the_policy_exactly(policy, order, own):
    scenario = PAPER[name_of(policy)] if own else "azure-conv"
    # K = 128 slots: LPM and VTC pick far down the arrival-ordered queue
    env = LLMSchedEnv(scenario, overrides=SIZES[scenario], expert=policy, order=order, K=128, invalid_action="raise")
    got, steps = replay(env, seed=4)
    summaries_equal(simulate(scenario, make_policy(policy), 4, SIZES[scenario]).summary, got)
    assert got["n_completed"] + got["n_rejected"] + got["n_unfinished"] == got["n_arrived"]


def test_fixed_budget_256_with_the_sarathi_order_is_sarathi_256():
    # the prefill budget is the agent's decision: fixed at 256 and the arrival order, the actions
    # that reproduce Sarathi(chunk 256) use one launch action only
    policy = {"name": "sarathi", "chunk_size": 256}
    env = LLMSchedEnv("azure-conv", overrides=SIZES["azure-conv"], budgets=(256,), expert=policy)
    got, steps = replay(env, seed=7)
    ref = simulate("azure-conv", make_policy(policy), 7, SIZES["azure-conv"]).summary
    summaries_equal(ref, got)
    # the agent was asked at every iteration that had an unfinished prefill or a waiting request
    assert steps >= ref["iterations"] // 2


@pytest.mark.parametrize("own", [False, True], ids=["azure-conv", "paper"])
@pytest.mark.parametrize("name", baselines.available())
def test_meta_mode_replays_every_registered_policy_exactly(name, own):
    scenario = PAPER.get(name, "azure-conv") if own else "azure-conv"
    candidates = [name] + [c for c in default_candidates(scenario) if c != name]
    env = LLMSchedEnv(scenario, action_mode="meta", candidates=candidates, overrides=SIZES[scenario], expert=name,
                      invalid_action="raise")
    got, _ = replay(env, seed=3)
    summaries_equal(simulate(scenario, make_policy(name), 3, SIZES[scenario]).summary, got)


def test_inexpressible_plans_raise_naming_the_policy_and_the_reason():
    # vLLM v0 runs prefill-only batches: no select action skips the decodes
    env = LLMSchedEnv("azure-conv", overrides=SIZES["azure-conv"], expert="vllm-v0")
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"vllm-v0's plan cannot be expressed in select mode: .*prefill-only"):
        for _ in range(200):
            env.step(env.expert_action())
    # a pick outside the slots: LPM with 2 slots
    env = LLMSchedEnv("azure-conv", overrides=SIZES["azure-conv"], expert="lpm", K=2)
    env.reset(seed=4)
    with pytest.raises(ValueError, match="not among the 2 slots"):
        for _ in range(2000):
            env.step(env.expert_action())
    # a chunk size that is not a budget
    env = LLMSchedEnv("azure-conv", overrides=SIZES["azure-conv"], expert={"name": "sarathi", "chunk_size": 300})
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"no launch budget in \[None, 8192"):
        for _ in range(2000):
            env.step(env.expert_action())
    # strict=False: the launch action with the last budget instead
    env.reset(seed=0)
    for _ in range(2000):
        a = env.expert_action(strict=False)
        assert 0 <= a < env.action_space.n
        _, _, term, trunc, _ = env.step(a)
        if term or trunc:
            break


def test_behaviour_cloning_refuses_a_teacher_it_cannot_express():
    pytest.importorskip("torch")
    from agents.train import collect_demonstrations

    with pytest.raises(ValueError, match=r"bc.from: vllm-v0 cannot be cloned .* inexpressible, more than 1%"):
        collect_demonstrations("azure-conv", {"overrides": {"workload.n_requests": 60}}, "vllm-v0", 1, 0)
    obs, masks, acts, info = collect_demonstrations("azure-conv", {"overrides": {"workload.n_requests": 60}},
                                                    "sarathi", 1, 0)
    assert info["inexpressible_frac"] == 0.0 and len(acts) == info["steps"] > 60


def test_tune_mode_action_zero_is_the_base_policy_at_its_defaults():
    # chunk_size in [32, 8192] and max_num_seqs in [16, 1024], log-uniform: 0 maps to 512 and 128
    env = LLMSchedEnv("azure-conv", action_mode="tune", overrides=SIZES["azure-conv"])
    env.reset(seed=5)
    latency = 0.0
    while True:
        _, _, term, trunc, info = env.step(np.zeros(2, np.float32))
        latency += info["reward_components"]["latency"]
        if term or trunc:
            break
    assert (env.base.chunk_size, env.base.max_num_seqs) == (512, 128)
    ref = simulate("azure-conv", make_policy("sarathi"), 5, SIZES["azure-conv"]).summary
    summaries_equal(ref, info["summary"])
    assert latency == pytest.approx(-ref["total_latency_s"], rel=1e-9)


def test_tune_mode_sets_the_parameters_per_decision():
    env = LLMSchedEnv("azure-conv", action_mode="tune", overrides=SIZES["azure-conv"],
                      tune={"chunk_size": [64, 4096]})
    env.reset(seed=0)
    env.step(np.array([-1.0], np.float32))
    assert env.base.chunk_size == 64
    env.step(np.array([1.0], np.float32))
    assert env.base.chunk_size == 4096
    with pytest.raises(ValueError, match=r"tune.block: not a parameter of the base policy; allowed: chunk_size"):
        LLMSchedEnv("azure-conv", action_mode="tune", tune={"block": [1, 2]})


@pytest.mark.parametrize("scenario", ["azure-conv", "vtc-arena", "echo-hybrid", "jaillet-high", "wait-high", "klpm-toy"])
def test_meta_mode_switching_at_random_keeps_every_policy_valid_and_every_request(scenario):
    # every registered policy is a candidate; the agent switches at random at every decision, so
    # each stateful policy must cope with requests the others admitted, preempted or chunked
    env = LLMSchedEnv(scenario, action_mode="meta", candidates=baselines.available(), overrides=SIZES[scenario],
                      invalid_action="raise")
    for seed in range(2):
        rng = np.random.default_rng(seed)
        env.reset(seed=seed)
        latency = 0.0
        while True:
            _, _, term, trunc, info = env.step(int(rng.integers(env.action_space.n)))
            latency += info["reward_components"]["latency"]
            if term or trunc:
                break
        s = info["summary"]
        assert s["n_arrived"] == s["n_completed"] + s["n_rejected"] + s["n_unfinished"]
        if term:
            assert s["n_completed"] + s["n_rejected"] == len(env.engine.workload)
            assert latency == pytest.approx(-s["total_latency_s"], rel=1e-9)


def test_meta_default_candidates_are_the_engine_and_paper_policies():
    env = LLMSchedEnv("vtc-arena", action_mode="meta", n_requests=20)
    names = [c.name for c in env.switch.candidates]
    assert names[:6] == ["fcfs", "sjf", "srpt", "sarathi", "vllm-v1", "vllm-v0"] and "vtc" in names
    assert env.action_space.n == len(names)
    with pytest.raises(ValueError, match="expert: mcsf is not one of the candidates"):
        LLMSchedEnv("vtc-arena", action_mode="meta", n_requests=20, expert="mcsf")
