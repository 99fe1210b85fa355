"""Memory soak of ``LLMSched-v1``: random masked steps for a long time, the RSS every 50k steps.

A leak shows as an RSS that keeps climbing after the first few episodes (the allocator's pools
are warm by then); a flat curve (within a few percent after 50k steps) means episodes free what
they allocate. The env is built with ``gym.make`` (so the wrappers are in the loop, as in
training), 2,000-request episodes by default, the default action mode, uniformly random valid
actions, reset at the end of each episode.

    python tools/soak_env.py azure-conv --steps 400000
"""

from __future__ import annotations

import argparse
import sys
import time

import gymnasium as gym
import numpy as np

from llmsched_gym.env.bench import random_masked_action


def rss_mb() -> float:
    """Resident set size of this process (Linux ``/proc``), MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("VmRSS not found in /proc/self/status")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scenario", nargs="?", default="azure-conv")
    p.add_argument("--steps", type=int, default=400_000)
    p.add_argument("--n-requests", type=int, default=2000, help="requests per episode")
    p.add_argument("--every", type=int, default=50_000, help="steps between RSS readings")
    args = p.parse_args(argv)
    env = gym.make("llmsched_gym:LLMSched-v1", scenario=args.scenario, n_requests=args.n_requests)
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    t0, episodes, first = time.perf_counter(), 0, None
    for i in range(1, args.steps + 1):
        _, _, terminated, truncated, _ = env.step(random_masked_action(env.unwrapped, rng))
        if terminated or truncated:
            episodes += 1
            env.reset()
        if i % args.every == 0:
            rss = rss_mb()
            first = first or rss
            print(f"{args.scenario}: {i:,} steps, {episodes} episodes, RSS {rss:.1f} MB "
                  f"({100 * (rss / first - 1):+.1f}% since the first reading), {time.perf_counter() - t0:.0f} s",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
