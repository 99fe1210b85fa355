"""``llmsched bench``, ``benchmark``, ``fidelity`` and ``import-profile``: the speed report, the
task suite, and the batch-time models against real GPU measurements (the work is in
:mod:`llmsched_gym.bench`, :mod:`llmsched_gym.benchmark` and :mod:`llmsched_gym.fidelity`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from llmsched_gym.parallel import add_arguments as add_parallel_arguments


def cmd_bench(args: argparse.Namespace) -> int:
    from llmsched_gym.bench import run_bench
    from llmsched_gym.config import check_output_file

    check_output_file(args.json, "--json")
    report = run_bench(quick=args.quick, sections=args.only)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def cmd_benchmark(args: argparse.Namespace) -> int:
    from baselines import validate_spec
    from llmsched_gym.benchmark import run_benchmark
    from llmsched_gym.config import check_output_dir
    from llmsched_gym.parallel import settings_from

    policies = [validate_spec(spec, "--policy") for spec in args.policy or []]
    check_output_dir(args.out, "--out")
    say = None if args.quiet else (lambda m: print(f"  {m}", flush=True))
    seeds = None
    if args.seeds:
        from agents.report import parse_seeds

        seeds = parse_seeds(args.seeds)
    results = run_benchmark(args.task, policies, args.agent, quick=args.quick, best_model=args.best, out=args.out,
                            progress=say, settings=settings_from(args, progress=not args.quiet),
                            hindsight_sims=args.hindsight_sims, seeds=seeds, reuse=args.reuse)
    if not args.quiet:
        print(f"leaderboard: {Path(args.out) / 'leaderboard.md'} ({results['wall_s']:.0f}s)")
    return 0


def cmd_fidelity(args: argparse.Namespace) -> int:
    from llmsched_gym.config import check_output_dir
    from llmsched_gym.fidelity import run_fidelity

    check_output_dir(args.out, "--out")
    tps = _tp_list(args.tp) if args.tp else None
    res = run_fidelity(args.profile, args.latency, tps, args.replay, args.out, args.max_tokens, plots=not args.no_plot)
    for r in res["profiles"]:
        best = ", ".join(f"{k} {v['mape']:.1%}" for k, v in sorted(r["models"].items(), key=lambda kv: kv[1]["mape"]))
        print(f"{r['label']}: MAPE {best}")
    for log in res["iteration_logs"]:
        best = ", ".join(f"{k} {v['mape']:.1%}" for k, v in sorted(log["models"].items(), key=lambda kv: kv[1]["mape"]))
        print(f"{log['path']} ({log['iterations']} iterations): MAPE {best}")
    if args.out:
        print(f"report: {Path(args.out) / 'fidelity.md'}")
    return 0


def cmd_import_profile(args: argparse.Namespace) -> int:
    from llmsched_gym.config import check_output_file
    from llmsched_gym.fidelity import import_profile

    check_output_file(args.out, "--out")
    path = import_profile(args.source, args.out, args.tp)
    print(f"wrote {path}; use it as --latency table:{path}")
    return 0


def _tp_list(text: str) -> tuple[int, ...]:
    if not all(t.strip().isdigit() and int(t) > 0 for t in text.split(",")):
        raise ValueError(f"--tp: expected positive integers separated by commas (1,2,4), got {text!r}")
    return tuple(int(t) for t in text.split(","))


def add_subcommands(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """Add ``bench``, ``benchmark``, ``fidelity`` and ``import-profile`` to the ``llmsched`` parser's
    subcommands."""
    sp = sub.add_parser("bench", help="speed report", formatter_class=formatter)
    sp.add_argument("--quick", action="store_true", help="smaller runs (for CI)")
    sp.add_argument("--only", action="append", choices=("engine", "overload", "memory", "env", "train", "sweep"),
                    help="sections: engine, overload, memory, env, train, sweep (repeatable; default: engine and env)")
    sp.add_argument("--json", default=None, metavar="PATH", help="write the report JSON here")
    sp.set_defaults(func=cmd_bench)

    sp = sub.add_parser("benchmark", help="the fixed task suite: score policies and agents against the baselines",
                        formatter_class=formatter)
    sp.add_argument("--task", action="append", help="a task of the suite (repeatable; default: all)")
    sp.add_argument("--policy", action="append", metavar="NAME[:k=v,...]",
                    help="an extra (parameterised) policy to score (repeatable)")
    sp.add_argument("--agent", action="append", metavar="RUN_DIR", help="a trained agent to score (repeatable)")
    sp.add_argument("--best", action="store_true", help="agents: use best_model instead of model")
    sp.add_argument("--quick", action="store_true",
                    help="two tasks (azure-conv, jaillet-high), small workloads, two seeds, a reduced static family "
                         "and a 12-simulation hindsight search (CI)")
    sp.add_argument("--seeds", default=None, metavar="A-B",
                    help="test seeds instead of the protocol's 100-109 (results then do not compare with others')")
    sp.add_argument("--hindsight-sims", type=int, default=None, metavar="N",
                    help="simulations per test workload of the hindsight search (default 60; 0: no reference)")
    sp.add_argument("--reuse", action="append", metavar="RESULTS",
                    help="an earlier run's results.json (or its folder): take every cell whose inputs are the same "
                         "instead of running it; one per task runs again and must match (repeatable)")
    sp.add_argument("--out", default="runs/benchmark", help="output folder")
    sp.add_argument("--quiet", action="store_true", help="print no progress")
    add_parallel_arguments(sp)
    sp.set_defaults(func=cmd_benchmark)

    # fidelity and import-profile keep argparse's plain formatter: their help texts state the defaults
    sp = sub.add_parser("fidelity", help="batch-time models against real GPU measurements (MAPE, worst case, plots)")
    sp.add_argument("--profile", action="append", metavar="vidur:GPU/MODEL|PATH",
                    help="a measured operator profile (repeatable; default: every Vidur profile found)")
    sp.add_argument("--latency", action="append", metavar="SPEC", help="an extra model to score (repeatable)")
    sp.add_argument("--tp", default=None, help="tensor-parallel degrees, e.g. 1,2,4 (default: all)")
    sp.add_argument("--replay", action="append", metavar="CSV",
                    help="a measured iteration log: `llmsched gpu replay`'s replay.csv, or shape columns + time_s")
    sp.add_argument("--max-tokens", type=int, default=8192, help="score profile points up to this many tokens")
    sp.add_argument("--out", default="runs/fidelity", help="report folder (default runs/fidelity)")
    sp.add_argument("--no-plots", "--no-plot", dest="no_plot", action="store_true",
                    help="write no PNG plots (as evaluate and compare)")
    sp.set_defaults(func=cmd_fidelity)

    sp = sub.add_parser("import-profile", help="write a Vidur profile model as a table:PATH profile CSV")
    sp.add_argument("source", metavar="vidur:GPU/MODEL|PATH")
    sp.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    sp.add_argument("--out", required=True, help="CSV to write")
    sp.set_defaults(func=cmd_import_profile)
