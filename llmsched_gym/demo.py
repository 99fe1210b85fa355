"""The main job: train an agent on the default scenario and compare it with the baselines.

1. every policy that applies to ``azure-conv`` runs on the validation workload (seed 99);
2. a PPO agent trains in ``priority`` mode with the scenario's recipe (``agents/hyperparams/ppo.yml``):
   at every decision it scores the 16 shortest waiting requests (admitted by decreasing score,
   none below 0) and the batch is formed like Sarathi-Serve's with a 256-token prefill budget; the
   model with the best validation score is kept;
3. the agent and the baselines run on held-out seeds (``llmsched evaluate``): the table (means with
   95% CIs) and the agent's paired per-seed differences against the five best baselines are
   printed, and ``report.md``, ``results.json``/``.csv`` and the plots are written to
   ``runs/demo/eval``; TensorBoard logs are in ``runs/demo/train`` (``tensorboard --logdir runs``);
4. the agent against the best static chunk size of ``llmsched benchmark``'s grid, paired.

About 10 minutes on a 2-core machine; ``--quick`` is a one-minute smoke version (tests, CI).
Without the RL extras (torch, stable-baselines3) only the baseline table is printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time

DEMO_TIMESTEPS = 600_000
DEMO_MODE = "priority"
"""The action mode of the main job's agent (its recipe is the scenario's entry in ppo.yml)."""
DEMO_POLICIES = ["fcfs", "vllm-v1", "vllm-v0", "sarathi", "sjf", "srpt", "mcsf", "lpm", "vtc", "alpha-greedy",
                 "sglang-lpm", "echo-bs"]


def baseline_table(scenario: str, seed: int, n_requests: int | None) -> None:
    """The comparison of the baselines alone (when the RL stack is not installed)."""
    from agents.report import aggregate, print_table, run_baselines
    from baselines import available

    over = {"workload.n_requests": n_requests} if n_requests else {}
    names = [n for n in DEMO_POLICIES if n in available()]
    records, skipped = run_baselines(scenario, names, [seed], [1.0], over)
    from llmsched_gym.data import synthetic_note

    note = synthetic_note(records[0].summary.get("workload_source")) if records else ""
    print_table(aggregate(records), title=f"{scenario}{note}, seed {seed}")
    for k, v in skipped.items():
        print(f"  skipped {k}: {v}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llmsched_gym.demo")
    p.add_argument("--scenario", default="azure-conv", help="scenario (default: azure-conv)")
    p.add_argument("--timesteps", type=int, default=None,
                   help=f"training timesteps (default {DEMO_TIMESTEPS:,}; quick 1,024)")
    p.add_argument("--train-requests", type=int, default=None, help="requests per training episode")
    p.add_argument("--n-requests", type=int, default=None, help="requests per evaluation workload")
    p.add_argument("--seeds", default=None, help="held-out evaluation seeds (default 100-104; quick 100-101)")
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--max-minutes", type=float, default=7.0, help="stop training after this much wall time")
    p.add_argument("--quick", action="store_true", help="a one-minute smoke version")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    if importlib.util.find_spec("sb3_contrib") is None:
        print("the RL extras are not installed (pip install -e '.[rl]'): baselines only")
        baseline_table(args.scenario, 0, args.n_requests)
        return 0

    from agents.evaluate import compare
    from agents.report import parse_seeds
    from agents.train import TrainConfig, train
    from baselines import available
    from llmsched_gym.core.scenarios import get_scenario

    quick = args.quick
    workload = get_scenario(args.scenario)["workload"]
    fixed = "trace" in workload and "arrival" not in workload and workload["trace"].get("window", "head") == "head"
    if fixed and not args.seeds:
        # a trace replayed from its first row is the same workload whatever the seed
        args.seeds = "100"
        print(f"note: {args.scenario} replays a fixed trace (its first N requests), so seeds do not change the "
              "workload: one evaluation seed; training episodes are a prefix of the evaluation workload")
    eval_n = args.n_requests or (150 if quick else 1000)
    timesteps = args.timesteps or (1024 if quick else DEMO_TIMESTEPS)
    seeds = parse_seeds(args.seeds or ("100-101" if quick else "100-104"))
    policies = [n for n in DEMO_POLICIES if n in available()]
    if quick:
        policies = [n for n in ("fcfs", "sarathi", "sjf") if n in available()]

    # the scenario's recipe in agents/hyperparams/ppo.yml
    hp = {"n_steps": 256, "batch_size": 128, "n_epochs": 2} if quick else {}
    overrides = {"workload.n_requests": args.train_requests} if args.train_requests else {}
    if quick:
        overrides.setdefault("workload.n_requests", 100)
    from llmsched_gym.sim import what_runs

    print(f"[1/3] training PPO in {DEMO_MODE} mode on {what_runs(args.scenario)['title']} ({timesteps} steps; "
          "recipe agents/hyperparams/ppo.yml)")
    meta = train(TrainConfig(
        scenario=args.scenario, name="train", out=args.out, timesteps=timesteps, env_kwargs={"action_mode": DEMO_MODE},
        overrides=overrides, hyperparams=hp, validation_requests=150 if quick else None,
        checkpoint_every=max(timesteps // 4, 256), score_every=1, progress=not quick,
        max_minutes=None if quick else args.max_minutes,
    ))
    print(f"      {meta['timesteps']} steps in {meta['learn_wall_s']:.0f}s; best validation Mean E2EL "
          f"x{meta['validation']['best_rel_mean_e2el_vs_best']:.3f} of the best baseline (that model is evaluated)")
    print(f"[2/3] evaluating the agent and {len(policies)} baselines on seeds {seeds} ({eval_n} requests each)")
    over = {"workload.n_requests": eval_n}
    results = compare(args.scenario, seeds, [1.0], policies, [f"{args.out}/train"], over, {},
                      f"{args.out}/eval", plots=True, best=True)
    for agent, pairs in results.get("paired", {}).items():
        print(f"{agent}, Mean E2EL (ms) paired by seed against the five best baselines:")
        for x in pairs:
            print(f"  vs {x['baseline']:<22} {x['baseline_mean']:9.1f} ms -> {x['agent_mean']:9.1f} ms  "
                  f"{100 * x['paired_rel']:+6.1f}% ± {100 * x['paired_rel_ci95']:.1f}%  {x['verdict']}")
        best = pairs[0] if pairs else None
        if best is not None and best["verdict"] != "better":
            print(f"  the agent does not beat the best baseline ({best['baseline']}): {best['verdict']}")
        if best is not None:  # the tail, which the latency reward does not target
            tail = {who: {r["seed"]: r["metrics"]["p99_ttft_ms"] for r in results["runs"] if r["policy"] == who}
                    for who in (agent, best["baseline"])}
            y = paired(tail[agent], tail[best["baseline"]])
            print(f"  P99 TTFT (ms) vs {best['baseline']:<12} {sum(tail[best['baseline']].values()) / len(seeds):9.1f} ms -> "
                  f"{y['agent_mean']:9.1f} ms  {100 * y['rel']:+6.1f}% ± {100 * y['ci95']:.1f}%  {y['verdict']}")
            if y["verdict"] != "better":
                print("  the agent is not better on the tail: it is trained on mean latency (the reward), not P99 TTFT")
        print(f"[3/3] the best static tuning: {agent} against the benchmark's grid over Sarathi's chunk_size")
        mine = {r["seed"]: r["metrics"]["mean_e2el_ms"] for r in results["runs"] if r["policy"] == agent}
        static = static_tuning(args.scenario, seeds, over)
        x = paired(mine, static["values"])
        print(f"  vs {static['name']:<22} {static['mean']:9.1f} ms -> {x['agent_mean']:9.1f} ms  "
              f"{100 * x['rel']:+6.1f}% ± {100 * x['ci95']:.1f}%  {x['verdict']}")
        if x["verdict"] != "better":
            print(f"  the agent does not beat the best static tuning ({static['name']}): {x['verdict']}")
    print(f"total {time.perf_counter() - t0:.0f}s; TensorBoard: tensorboard --logdir {args.out}")
    return 0


def static_tuning(scenario: str, seeds: list[int], overrides: dict) -> dict:
    """The best point of the benchmark's Sarathi ``chunk_size`` grid by Mean E2EL on ``seeds``
    (with its per-seed values), among those that complete every request."""
    import numpy as np

    from llmsched_gym.benchmark import GRID
    from llmsched_gym.sim import simulate

    knob, grid = GRID["sarathi"]
    best = None
    for v in grid:
        runs = [simulate(scenario, {"name": "sarathi", knob: v}, s, overrides).summary for s in seeds]
        if any(r["n_completed"] < r["n_arrived"] for r in runs):
            continue
        vals = {s: r["serving"]["mean_e2el_ms"] for s, r in zip(seeds, runs, strict=True)}
        m = float(np.mean(list(vals.values())))
        if best is None or m < best["mean"]:
            best = {"name": f"sarathi:{knob}={v}", "mean": m, "values": vals}
    assert best is not None, "no Sarathi chunk size completes the workload"
    return best


def paired(mine: dict[int, float], theirs: dict[int, float]) -> dict:
    """Mean relative per-seed difference ``(mine - theirs) / theirs`` with its 95% t-interval."""
    import numpy as np

    from agents.report import mean_ci

    rel, h, _ = mean_ci((mine[s] - theirs[s]) / theirs[s] for s in mine if s in theirs)
    verdict = ("better" if rel < 0 else "worse") if np.isfinite(h) and abs(rel) > h else "tie (CI includes 0)"
    return {"agent_mean": float(np.mean(list(mine.values()))), "rel": rel, "ci95": h, "verdict": verdict}


if __name__ == "__main__":
    sys.exit(main())
