"""The main job: train an agent on the default scenario and score it as the benchmark scores it.

0. the default scenario's real trace: fetched from its publisher when reachable (checksummed, the
   code of ``llmsched data download``), else the synthetic stand-in runs, and the job says so;
1. a PPO agent trains with the scenario's recipe, exactly what ``llmsched train --scenario S``
   trains (for azure-conv: ``agents/hyperparams/ppo.yml``, priority mode: at every decision it
   scores the 16 waiting requests with the shortest predicted output, admitted by decreasing score,
   and the batch is formed like Sarathi-Serve's with a 256-token prefill budget); its untrained
   start is saved beside it, and the model with the best validation score is kept;
2. ``llmsched benchmark``'s task for the scenario, on its held-out test seeds: the hindsight
   reference, the best static heuristic (chosen on the validation seeds), the baselines, the agent's
   untrained start and the agent. Printed: the five references with the paired per-seed
   differences to the best static heuristic, and what training added (trained vs start); written:
   ``leaderboard.md``, ``results.json`` and ``scores.png`` under ``OUT/benchmark``, TensorBoard logs
   and the learning curve under ``OUT/train``.

About 10 minutes on a 2-core machine; ``--quick`` is a one-minute smoke version (tests, CI: no
download). Without the RL extras (torch, stable-baselines3) only the baseline table is printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import time
from typing import Any

DEMO_TIMESTEPS = 600_000
DEMO_POLICIES = ["fcfs", "vllm-v1", "vllm-v0", "sarathi", "sjf", "srpt", "mcsf", "lpm", "vtc", "alpha-greedy",
                 "sglang-lpm", "echo-bs"]
"""The baselines the main job runs (the full benchmark runs every registered one)."""
TRACES = {"azure-conv": "azure-conv", "vtc-arena": "vtc-arena"}
"""Scenario -> the dataset its trace comes from (``llmsched data``)."""


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


def fetch_trace(scenario: str, quick: bool) -> None:
    """Step 0: the scenario's real trace, downloaded (checksummed) when the publisher is reachable."""
    from llmsched_gym.data import DataError, download, known, locate

    name = TRACES.get(scenario)
    if name is None:
        return
    ds = known(name)
    found = locate(ds) if ds is not None else None
    if found is not None:
        print(f"[0/2] {name}: the real trace, {found[0]} ({found[1]})")
        return
    if quick:
        print(f"[0/2] {name}: not present, and --quick does not download: the SYNTHETIC STAND-IN runs "
              f"(`llmsched data download {name}` fetches the real trace)")
        return
    print(f"[0/2] {name}: fetching the real trace from its publisher (sha256-checked) ...")
    try:
        download(name, progress=lambda m: print(f"      {m}"), timeout_s=30.0)
    except DataError as e:
        print(f"      {e}\n      the publisher is not reachable: the SYNTHETIC STAND-IN runs instead; every "
              "title below says so")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llmsched_gym.demo")
    p.add_argument("--scenario", default="azure-conv", help="scenario (default: azure-conv)")
    p.add_argument("--timesteps", type=int, default=None,
                   help=f"training timesteps (default {DEMO_TIMESTEPS:,}; quick 1,024)")
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--max-minutes", type=float, default=6.0, help="stop training after this much wall time")
    p.add_argument("--jobs", type=int, default=2, help="parallel workers for the benchmark's runs")
    p.add_argument("--quick", action="store_true", help="a one-minute smoke version")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    from llmsched_gym.benchmark import TASKS

    task = next((t for t in TASKS if t.scenario == args.scenario and t.trained_on is None), None)
    if task is None:
        scenarios = sorted({t.scenario for t in TASKS})
        print(f"error: --scenario: no benchmark task for {args.scenario!r}; allowed: {', '.join(scenarios)}",
              file=sys.stderr)
        return 2
    if importlib.util.find_spec("sb3_contrib") is None:
        print("the RL extras are not installed (pip install -e '.[rl]'): baselines only")
        baseline_table(args.scenario, 0, None)
        return 0
    fetch_trace(args.scenario, args.quick)

    from agents.train import TrainConfig, train
    from llmsched_gym.benchmark import run_benchmark
    from llmsched_gym.parallel import Settings
    from llmsched_gym.sim import what_runs

    quick = args.quick
    timesteps = args.timesteps or (1024 if quick else DEMO_TIMESTEPS)
    hp = {"n_steps": 64, "batch_size": 128, "n_epochs": 2} if quick else {}  # 16 envs x 64: one 1,024-step rollout
    overrides = {"workload.n_requests": 100} if quick else {}
    print(f"[1/2] training on {what_runs(args.scenario)['title']} with the scenario's recipe, exactly what "
          f"`llmsched train --scenario {args.scenario}` trains ({timesteps:,} steps at most)")
    meta = train(TrainConfig(
        scenario=args.scenario, name="train", out=args.out, timesteps=timesteps, overrides=overrides, hyperparams=hp,
        validation_requests=150 if quick else None, checkpoint_every=max(timesteps // 4, 256), score_every=1,
        progress=not quick, max_minutes=None if quick else args.max_minutes,
    ))
    mode = meta["env_kwargs"].get("action_mode")
    print(f"      {mode} mode, {meta['timesteps']:,} steps in {meta['learn_wall_s']:.0f}s; best validation "
          f"x{meta['validation']['best_rel_mean_e2el_vs_best']:.3f} of the best baseline (that model is scored)")
    print(f"[2/2] benchmark task {task.name} ({task.information} output lengths): hindsight reference, static "
          f"heuristics, {len(DEMO_POLICIES)} baselines, the agent and its untrained start")
    run_dir = f"{args.out}/train"
    res = run_benchmark([task.name], agents=[run_dir], quick=quick, best_model=True, out=f"{args.out}/benchmark",
                        baselines=DEMO_POLICIES, settings=Settings(jobs=args.jobs))
    print(console_table(res["tasks"][task.name]))
    print(f"total {time.perf_counter() - t0:.0f}s; leaderboard {args.out}/benchmark/leaderboard.md; "
          f"TensorBoard: tensorboard --logdir {args.out}")
    return 0


def console_table(r: dict[str, Any]) -> str:
    """The five rows that answer "did the agent learn, and how far is it from what is possible?"
    within 100 columns: hindsight, best static heuristic, best baseline, start, agent; the full table
    is in the leaderboard."""
    from llmsched_gym.data import synthetic_note

    t = r["task"]
    rows = {row["kind"]: row for row in reversed(r["rows"])}  # the best of each kind
    by_name = {row["name"]: row for row in r["rows"]}
    picked = [("hindsight (reference)", rows.get("reference")),
              ("best static heuristic", rows.get("static")),
              ("best baseline", by_name.get(r["best_baseline"])),
              ("agent's untrained start", rows.get("start")),
              ("agent", rows.get("agent"))]
    head = (f"{t['name']}{synthetic_note(r.get('workload_source'))}: {t['label']}, "
            f"{'lower' if t['lower_is_better'] else 'higher'} is better; {r['information']} lengths; "
            f"{len(r['rows'][0]['values'])} test seeds; headroom {_pct(r['headroom'])}")
    lines = [head[:100]]
    agent = rows.get("agent")
    shown = {id(row): row["name"] for _, row in picked if row is not None}
    if agent is not None and ", " in agent["name"]:  # the structure once, then what differs
        structure = agent["name"].rsplit(", ", 1)[0]
        lines.append(f"agent: {structure}"[:100])
        for _, row in picked[3:]:
            if row is not None and row["name"].startswith(structure + ", "):
                shown[id(row)] = row["name"][len(structure) + 2:]
    lines += [f"{'':<23} {'who':<40} {'mean':>10}  {'vs best static':<23}", "-" * 100]
    for what, row in picked:
        if row is None:
            continue
        vs = row.get("paired_rel_vs_static", math.nan)
        paired = (f"{100 * vs:+.1f}% ± {100 * row.get('paired_rel_static_ci95', math.nan):.1f}% "
                  f"{row.get('verdict_vs_static', '')}" if math.isfinite(vs) else "-")
        lines.append(f"{what:<23} {shown[id(row)][:40]:<40} {row['mean']:>10.1f}  {paired}"[:100])
    if agent is not None and "learned" in agent:
        x = agent["learned"]
        verdict = {"better": "training improved on the start",
                   "worse": "training made the policy worse than its start",
                   "tie": "nothing measurable: the start's result"}
        lines.append(f"learned (trained vs start): {100 * x['rel']:+.1f}% ± {100 * x['ci95']:.1f}%: "
                     f"{verdict.get(x['verdict'], x['verdict'])}"[:100])
    return "\n".join(lines)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if math.isfinite(x) else "-"


if __name__ == "__main__":
    sys.exit(main())
