"""The env section of ``llmsched bench``: ``LLMSched-v1`` steps per second with random masked actions.

The loop is what a rollout worker does without a network: read the masks, draw a valid action
uniformly (``select``), a random admissible subset (``subset``) or uniform scores/knobs (Box
modes), step, reset at the end of an episode. It runs in the calling process, which uses one
core (numpy on arrays this small starts no threads); the rate is reported per wall-clock second
and per CPU second of the process (the latter is robust to other load on the machine).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from llmsched_gym.env.actions import DEFAULT_BUDGETS
from llmsched_gym.env.llmsched_env import LLMSchedEnv


def random_masked_action(env: LLMSchedEnv, rng: np.random.Generator):
    """A uniformly random valid action of ``env``'s mode."""
    mask = env.action_masks()
    if env.mode in ("select", "meta"):
        valid = mask.nonzero()[0]
        return int(valid[int(rng.random() * len(valid))])
    if env.mode == "subset":
        ok = mask[1::2]
        return (ok & (rng.random(len(ok)) < 0.5)).astype(np.int8)
    return rng.uniform(-1.0, 1.0, env.action_space.shape).astype(np.float32)


FUZZ_VARIANTS: tuple[dict[str, Any], ...] = (
    {},
    {"engine.overflow": "clear_all", "engine.stall_iterations": 3000},
    {"engine.overflow": "clear_bernoulli", "engine.overflow_beta": 0.3},
    {"engine.overflow": "swap"},
    {"engine.preempt_mode": "swap"},
    {"engine.preempt_mode": "restart"},
    {"engine.block_size": 16},
    {"workload.predictor": {"type": "noisy", "x": 0.5}},
    {"workload.predictor": {"type": "bucketed", "edges": [16, 64, 256, 1024, 4096]}},
)
FUZZ_BUDGETS: tuple[tuple, ...] = ((None,), DEFAULT_BUDGETS, (256, 32), (None, 16))
FUZZ_SIZES = {"echo-hybrid": {"workload.n_requests": 15, "workload.classes.offline.n_requests": 10},
              "mooncake-conv": {"workload.n_requests": 2}}  # 12k-token prompts: long episodes


def fuzz_env(steps: int = 100_000, seed: int = 0, n_requests: int = 60) -> dict[str, Any]:
    """Random masked steps (and one in ten unmasked) over every scenario, action mode, admission
    rule, order, budget set and engine variant (``FUZZ_VARIANTS``); raises ``AssertionError`` on an observation outside its space or
    not finite, a mask without the launch action, or a request lost (every request of the workload
    is pending, waiting, running, completed or rejected at every step, and all are completed or
    rejected when an episode terminates), or the engine's count of requests in prefill disagreeing with
    the running requests' progress.

    :returns: steps, episodes, wall seconds and how many episodes ended terminated / truncated.
    """
    from llmsched_gym.core.engine import ConfigError
    from llmsched_gym.core.scenarios import SCENARIOS
    from llmsched_gym.env.actions import ACTION_MODES
    from llmsched_gym.env.admission import ADMISSION_RULES
    from llmsched_gym.env.decision import ORDERS

    rng = np.random.default_rng(seed)
    done = episodes = terminated_n = truncated_n = skipped = 0
    wall0 = time.perf_counter()
    while done < steps:
        scenario = str(rng.choice(sorted(SCENARIOS)))
        overrides = {"workload.n_requests": n_requests, **FUZZ_SIZES.get(scenario, {}),
                     **FUZZ_VARIANTS[rng.integers(len(FUZZ_VARIANTS))]}
        kwargs = {"action_mode": str(rng.choice(ACTION_MODES)), "admission": str(rng.choice(ADMISSION_RULES)),
                  "order": str(rng.choice(ORDERS)), "K": int(rng.choice([1, 4, 32])), "flat": bool(rng.integers(2)),
                  "budgets": FUZZ_BUDGETS[rng.integers(len(FUZZ_BUDGETS))],
                  "max_num_seqs": [None, 3][rng.integers(2)]}
        if kwargs["action_mode"] in ("subset", "priority", "knob"):
            kwargs["budget"] = [None, 64][rng.integers(2)]
        try:
            env = LLMSchedEnv(scenario, overrides=overrides, **kwargs)
            obs, info = env.reset(seed=int(rng.integers(1 << 30)))
            env.action_space.seed(int(rng.integers(1 << 30)))
        except ConfigError:  # e.g. block_size 16 makes a request larger than a tiny cache
            skipped += 1
            continue
        n = len(env.engine.workload)
        while done < steps:
            _check_step(env, obs, info, n)
            # mostly valid actions; one in ten drawn from the whole space (a counted no-op if masked)
            action = env.action_space.sample() if rng.random() < 0.1 else random_masked_action(env, rng)
            obs, _, term, trunc, info = env.step(action)
            done += 1
            if term or trunc:
                _check_step(env, obs, info, n)
                s = info["summary"]
                assert s["n_arrived"] == s["n_completed"] + s["n_rejected"] + s["n_unfinished"], s
                if term:
                    assert s["n_completed"] + s["n_rejected"] == n, s
                terminated_n += term
                truncated_n += trunc
                episodes += 1
                break
    return {"steps": done, "episodes": episodes, "terminated": terminated_n, "truncated": truncated_n,
            "configs_skipped": skipped, "wall_s": time.perf_counter() - wall0}


def _check_step(env: LLMSchedEnv, obs, info: dict, n: int) -> None:
    parts = obs.values() if isinstance(obs, dict) else (obs,)
    for part in parts:
        assert part.dtype == np.float32 and np.all(np.isfinite(part)), "observation not finite"
    assert obs in env.observation_space, "observation outside its space"
    mask = info["action_mask"]
    assert mask.dtype == np.int8 and (env.mode != "select" or mask[env.K] == 1)
    e = env.engine
    counts = np.bincount(e.state, minlength=5)
    assert counts.sum() == n and len(e.waiting) == counts[1] and len(e.running) == counts[2]
    run = np.array(e.running, np.int64)
    mid = int(np.count_nonzero(e.prefilled[run] < e.prefill_target[run]))
    assert e.n_in_prefill == mid, f"n_in_prefill {e.n_in_prefill}, running requests mid-prefill {mid}"


def bench_env(
    scenario: str = "jaillet-high",
    action_mode: str = "select",
    K: int = 32,
    admission: str = "none",
    n_requests: int | None = 1000,
    steps: int = 50_000,
    seed: int = 0,
    **env_kwargs: Any,
) -> dict[str, Any]:
    """Run ``steps`` random masked env steps and return the rates.

    :param scenario: scenario name (episodes of ``n_requests`` requests; ``None`` keeps the
        scenario's own count).
    :param action_mode: ``select`` (the benchmark's reference), ``subset``, ``priority``, ``knob``.
    :param K: queue slots.
    :param admission: ``none`` (the env's default), ``current`` or ``future``.
    :param steps: env steps to time (resets included, the first reset excluded).
    :param env_kwargs: more ``LLMSched-v1`` arguments (``order``, ``reward``, ``overrides``, ...).
    :returns: ``steps_per_s`` (wall clock), ``steps_per_cpu_s``, the settings, episodes finished,
        engine iterations simulated, requests completed and, in ``select`` mode, ``step_mix``: the
        fractions of admit, launch and preempt steps. A launch step runs an engine iteration and
        builds the next boundary's observation, an admit step only updates the batch being formed
        (several times cheaper), so the rate depends on the mix the action space gives a
        random agent.
    """
    env = LLMSchedEnv(scenario, action_mode=action_mode, K=K, admission=admission, n_requests=n_requests,
                      **env_kwargs)
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    episodes = iterations = completed = 0
    kinds = [0, 0, 0]  # admit, launch, preempt (select mode)
    select = env.mode == "select"
    launch0, preempt0 = env.K, env.K + len(env.budgets)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        action = random_masked_action(env, rng)
        if select:
            kinds[(action >= launch0) + (action >= preempt0)] += 1
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            episodes += 1
            iterations += env.engine.n_iterations
            completed += env.engine.n_completed
            env.reset()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    iterations += env.engine.n_iterations
    completed += env.engine.n_completed
    out = {
        "scenario": scenario,
        "action_mode": action_mode,
        "K": K,
        "admission": admission,
        "n_requests": n_requests,
        "steps": steps,
        "episodes": episodes,
        "iterations": iterations,
        "requests_completed": completed,
        "wall_s": wall,
        "cpu_s": cpu,
        "steps_per_s": steps / wall,
        "steps_per_cpu_s": steps / cpu,
    }
    if select:
        out["step_mix"] = dict(zip(("admit", "launch", "preempt"), (k / steps for k in kinds), strict=True))
    return out
