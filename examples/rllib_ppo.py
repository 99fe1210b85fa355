"""Train LLMSched-v1 with Ray RLlib's PPO (new API stack, masked actions), then evaluate it.

    pip install -e ".[rl,rllib]"
    python examples/rllib_ppo.py --iterations 20 --env-runners 2 --set workload.n_requests=200
    tensorboard --logdir runs/rllib            # sched/* scalars, as for the SB3 agents
    llmsched evaluate --model runs/rllib/jaillet-low-rllib-ppo-s0 --policies fcfs,sjf,mcsf

``--env-runners N`` samples episodes in N Ray actors (0: in this process); ``--address auto``
trains on the Ray cluster started with ``ray start --head``. ``--quick`` is the CI size: two
iterations of 256 steps on 15-request episodes. The policy and ``run.json`` are saved in
``runs/rllib/NAME``, which ``llmsched evaluate --model`` plays like an SB3 run (see agents/rllib.py).
"""

from __future__ import annotations

import argparse
import sys

import ray

from agents.rllib import RLlibConfig, train_rllib
from llmsched_gym.config import ConfigError, parse_sets


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", default="jaillet-low")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="scenario override for training episodes")
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--env-runners", type=int, default=2)
    p.add_argument("--train-batch", type=int, default=4000, help="env steps per iteration")
    p.add_argument("--minibatch", type=int, default=500)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default=None)
    p.add_argument("--out", default="runs/rllib")
    p.add_argument("--address", default=None, help="Ray cluster (auto: `ray start --head`); default: a local one")
    p.add_argument("--quick", action="store_true", help="CI size: 2 iterations of 256 steps, 15-request episodes")
    args = p.parse_args(argv)
    try:
        overrides = parse_sets(args.set)
    except ConfigError as e:
        p.error(str(e))
    cfg = RLlibConfig(scenario=args.scenario, name=args.name, out=args.out, iterations=args.iterations,
                      env_runners=args.env_runners, train_batch=args.train_batch, minibatch=args.minibatch,
                      epochs=args.epochs, seed=args.seed, overrides=overrides)
    if args.quick:
        cfg.iterations, cfg.train_batch, cfg.minibatch, cfg.epochs, cfg.hidden = 2, 256, 64, 2, (32,)
        cfg.overrides = {"workload.n_requests": 15, **cfg.overrides}
    if not ray.is_initialized():
        ray.init(address=args.address, include_dashboard=False, configure_logging=False)
    meta = train_rllib(cfg)
    print(f"trained {meta['name']}: {meta['timesteps']} steps in {meta['learn_wall_s']:.0f}s; "
          f"saved in {args.out}/{meta['name']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
