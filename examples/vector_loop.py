"""A CleanRL-style rollout loop on LLMSched-v1: Gymnasium's vector env, its episode statistics
wrapper, and the action masks from ``infos``; the policy here draws a random valid action.

    python examples/vector_loop.py --num-envs 4 --steps 2000
    python examples/vector_loop.py --scenario azure-conv --set workload.n_requests=300

Replace ``act`` with your agent: it gets the batched observation and the ``(num_envs, n)`` masks.
The env writes its own ``info["episode_stats"]``; ``RecordEpisodeStatistics`` adds the usual
``info["episode"]`` (return ``r``, length ``l``, seconds ``t``) when an env finishes.
"""

from __future__ import annotations

import argparse
import sys

import gymnasium as gym
import numpy as np

import llmsched_gym  # noqa: F401  (registers LLMSched-v1)
from llmsched_gym.config import ConfigError, parse_sets


def act(obs: dict[str, np.ndarray], masks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random valid action per env (stand-in for a policy network)."""
    return np.array([rng.choice(np.flatnonzero(m)) for m in masks])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", default="jaillet-high")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="scenario override (workload.n_requests=200)")
    p.add_argument("--num-envs", type=int, default=4)
    p.add_argument("--steps", type=int, default=2000, help="vector steps")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        overrides = parse_sets(args.set) or {"workload.n_requests": 200}
        envs = gym.make_vec("llmsched_gym:LLMSched-v1", num_envs=args.num_envs, vectorization_mode="sync",
                            scenario=args.scenario, overrides=overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    rng = np.random.default_rng(args.seed)
    obs, infos = envs.reset(seed=args.seed)
    for step in range(args.steps):
        obs, rewards, terminations, truncations, infos = envs.step(act(obs, infos["action_mask"], rng))
        if "episode" in infos:
            for i in np.flatnonzero(infos["_episode"]):
                mean_e2e = infos["summary"]["e2e_s"]["mean"][i]
                print(f"step {step}: env {i} finished an episode: return {infos['episode']['r'][i]:.1f}, "
                      f"{infos['episode']['l'][i]} steps, mean E2E {mean_e2e:.2f} s")
    envs.close()
    print(f"{envs.episode_count} episodes; mean return {np.mean(envs.return_queue):.1f}" if envs.episode_count
          else "no episode finished: more --steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
