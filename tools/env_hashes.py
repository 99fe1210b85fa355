"""Fingerprints of ``LLMSched-v1`` episodes, to prove that a speed change changed nothing else.

For each of 63 configurations (7 scenarios x 9 settings: admission rules, slot order, paged KV,
swap preemption, ``max_num_seqs``, ``meta`` and ``priority`` modes), 1,500 seeded steps (random
valid actions, one in twenty drawn from the whole action space) are hashed: every observation,
reward, mask, reward component, invalid-action count, clock and end-of-episode summary (wall time
aside). A configuration that raises records its error, so an error that appears or vanishes
shows too. Write the fingerprints before the change, check them after::

    python tools/env_hashes.py write /tmp/before.json
    # ... change the code ...
    python tools/env_hashes.py check /tmp/before.json     # "63 configurations, 0 differ"

Run it as a script (``python tools/env_hashes.py``), not with ``python -c`` from another
checkout: ``-c`` puts the current folder first on ``sys.path``, so the package imported may not
be the one ``PYTHONPATH`` names.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

import numpy as np

from llmsched_gym.env.bench import random_masked_action
from llmsched_gym.env.llmsched_env import LLMSchedEnv

SCENARIOS = ("jaillet-high", "azure-conv", "klpm-toy", "vtc-arena", "echo-hybrid", "wait-high", "jaillet-noisy")
SETTINGS: tuple[dict, ...] = (
    {}, {"admission": "current"}, {"admission": "future"}, {"order": "shortest"},
    {"overrides": {"engine.block_size": 16}}, {"overrides": {"engine.preempt_mode": "swap"}},
    {"max_num_seqs": 3}, {"action_mode": "meta"}, {"action_mode": "priority", "budget": 64},
)


def fingerprint(scenario: str, setting: dict, steps: int = 1500) -> str:
    """The hash of ``steps`` seeded steps of one configuration (episodes of 150 requests)."""
    h = hashlib.sha256()
    overrides = {**setting.get("overrides", {}), "workload.n_requests": 150}
    if scenario == "echo-hybrid":
        overrides.update({"workload.n_requests": 40, "workload.classes.offline.n_requests": 20})
    kwargs = {k: v for k, v in setting.items() if k != "overrides"}
    env = LLMSchedEnv(scenario, overrides=overrides, **kwargs)
    rng = np.random.default_rng(0)
    obs, info = env.reset(seed=1)
    env.action_space.seed(0)

    def add(obs, reward, info) -> None:
        for part in obs.values() if isinstance(obs, dict) else (obs,):
            h.update(np.ascontiguousarray(part).tobytes())
        h.update(repr(reward).encode())
        h.update(info["action_mask"].tobytes())
        h.update(repr(sorted(info["reward_components"].items())).encode())
        h.update(repr((info["invalid_actions"], info["clock_s"])).encode())
        if "summary" in info:
            # latency_model, information, env: labels added later, which would make every older revision differ
            h.update(repr(sorted((k, v) for k, v in info["summary"].items()
                                 if k not in ("wall_time_s", "latency_model", "information", "env"))).encode())

    add(obs, 0.0, info)
    for _ in range(steps):
        action = env.action_space.sample() if rng.random() < 0.05 else random_masked_action(env, rng)
        obs, reward, terminated, truncated, info = env.step(action)
        add(obs, reward, info)
        if terminated or truncated:
            obs, info = env.reset(seed=int(rng.integers(1000)))
            add(obs, 0.0, info)
    return h.hexdigest()[:16]


def fingerprints() -> dict[str, str]:
    out = {}
    for scenario in SCENARIOS:
        for setting in SETTINGS:
            key = f"{scenario} {json.dumps(setting, sort_keys=True)}"
            try:
                out[key] = fingerprint(scenario, setting)
            except Exception as ex:  # recorded: an error that appears or vanishes is a change too
                out[key] = f"error {type(ex).__name__}: {str(ex)[:80]}"
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("write", "check"))
    p.add_argument("path", help="the fingerprints' JSON file")
    args = p.parse_args(argv)
    got = fingerprints()
    if args.what == "write":
        with open(args.path, "w") as f:
            json.dump(got, f, indent=1)
        print(f"{len(got)} configurations written to {args.path}")
        return 0
    with open(args.path) as f:
        ref = json.load(f)
    differ = [k for k in ref if ref[k] != got.get(k)]
    print(f"{len(ref)} configurations, {len(differ)} differ")
    for k in differ:
        print(f"  {k}: {ref[k]} -> {got.get(k)}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
