"""``llmsched reproduce PAPER [--quick] [--out DIR]`` and ``llmsched optimum --scenario S``: the
arguments and the printed result; the work is :mod:`llmsched_gym.reproduce.papers`'s."""

from __future__ import annotations

import argparse
from typing import Any

from llmsched_gym.parallel import add_arguments as add_parallel_arguments
from llmsched_gym.parallel import settings_from
from llmsched_gym.reproduce import PAPERS
from llmsched_gym.reproduce.papers import optimum_for_scenario, run_paper
from llmsched_gym.reproduce.report import fmt


def cmd_reproduce(args: argparse.Namespace) -> int:
    from llmsched_gym.config import check_output_dir

    check_output_dir(args.out, "--out")
    run_paper(args.paper, args.quick, args.out, settings_from(args))
    return 0


def cmd_optimum(args: argparse.Namespace) -> int:
    from llmsched_gym.config import parse_sets

    res = optimum_for_scenario(args.scenario, parse_sets(args.set), args.method, args.seed, args.round_s,
                               args.policy)
    print(f"instance: {res['n']} requests, KV capacity M = {res['M']:,} tokens, "
          f"one round = {args.round_s:g} s of arrival time")
    print(f"solver: {res['method']}, status {res['status']}, {res['wall_s']:.2f} s")
    if res["tel"] is None:
        print("optimum: no feasible schedule found")
    else:
        print(f"optimal total end-to-end latency (TEL): {res['tel']:,} rounds")
        print(f"optimal mean end-to-end latency (AEL = TEL / n): {fmt(res['ael'])} rounds")
    print(f"lower bound on the optimal TEL: {fmt(res['lower_bound'])} rounds")
    if res.get("policy"):
        print(f"{res['policy']}: regret {fmt(res.get('regret'))} rounds per request (its AEL minus the optimal AEL), "
              f"ratio to the optimum {fmt(res.get('ratio_to_opt'))} (its TEL / the optimal TEL)")
    if res["starts"] is not None:
        print(f"optimal start round of each request: {res['starts']}")
    return 0


def add_subcommands(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """Add ``reproduce`` and ``optimum`` to the ``llmsched`` parser's subcommands."""
    sp = sub.add_parser("reproduce", help="reproduce a paper's results: " + ", ".join(PAPERS),
                        formatter_class=formatter)
    sp.add_argument("paper", help="one of " + ", ".join(PAPERS) + " (docs/papers.md)")
    sp.add_argument("--quick", action="store_true", help="reduced version (under 2 minutes)")
    sp.add_argument("--out", default=None, help="report folder (default: runs/reproduce/PAPER)")
    add_parallel_arguments(sp)
    sp.set_defaults(func=cmd_reproduce)

    sp = sub.add_parser("optimum", help="hindsight optimum of a small round-mode instance (Jaillet et al. 2025, Appendix B.1)",
                        formatter_class=formatter)
    sp.add_argument("--scenario", required=True, help="scenario whose workload becomes the instance")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="scenario overrides (repeatable)")
    sp.add_argument("--method", choices=("auto", "ip", "exhaustive"), default="auto",
                    help="integer program, exhaustive search (up to 8 requests), or auto: the one that fits")
    sp.add_argument("--seed", type=int, default=0, help="workload seed")
    sp.add_argument("--round-s", type=float, default=1.0, help="seconds of arrival time per round")
    sp.add_argument("--policy", default=None, help="also run this policy in round mode and report its ratio")
    sp.set_defaults(func=cmd_optimum)
