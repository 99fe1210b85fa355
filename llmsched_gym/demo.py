"""The main job: an end-to-end demo on the default scenario.

Runs every engine/paper policy that applies to ``azure-conv`` on the same seeded workload and
prints one comparison table. When the agents package is trained (``llmsched train``), the demo
also trains a small agent and places it in the table (see ``agents``).
"""

from __future__ import annotations

import argparse
import sys
import time

DEMO_POLICIES = ["fcfs", "vllm-v1", "vllm-v0", "sarathi", "sjf", "srpt", "mcsf", "vtc", "sglang-lpm", "echo-bs"]


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    from baselines import available
    from llmsched_gym.sim import simulate

    p = argparse.ArgumentParser(prog="python -m llmsched_gym.demo")
    p.add_argument("--scenario", default="azure-conv")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-requests", type=int, default=None)
    args = p.parse_args(argv)
    con = Console(width=160)
    over = {"workload.n_requests": args.n_requests} if args.n_requests else {}
    names = [n for n in DEMO_POLICIES if n in available()]
    t = Table(title=f"{args.scenario}, seed {args.seed}: policies on the same workload")
    for col in ("policy", "completed", "E2E mean (s)", "E2E p99 (s)", "TTFT p99 (s)", "TPOT mean (ms)",
                "tokens/s", "preemptions", "KV mean", "wall (s)"):
        t.add_column(col, justify="right" if col != "policy" else "left")
    t0 = time.perf_counter()
    for name in names:
        try:
            s = simulate(args.scenario, name, args.seed, over).summary
        except ValueError as e:
            con.print(f"[yellow]{name}: skipped ({e})[/yellow]")
            continue
        t.add_row(name, f"{s['n_completed']}/{s['n_arrived']}", f"{s['e2e_s']['mean']:.2f}", f"{s['e2e_s']['p99']:.2f}",
                  f"{s['ttft_s']['p99']:.2f}", f"{1000 * s['tpot_s']['mean']:.1f}",
                  f"{s['throughput_tokens_per_s']:.0f}", str(s["preemptions"]), f"{s['kv_mean_frac']:.2f}",
                  f"{s['wall_time_s']:.2f}")
    con.print(t)
    con.print(f"total {time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
