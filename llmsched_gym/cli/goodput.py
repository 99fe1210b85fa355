"""``llmsched goodput``: the highest arrival rate meeting TTFT and TPOT targets (SLO goodput,
DistServe's definition), per GPU; with ``--placement --gpus N``, the placement search over
prefill:decode splits and tensor-parallel degrees (the work is :mod:`llmsched_gym.goodput` and
:mod:`llmsched_gym.placement`)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from llmsched_gym.config import ConfigError


def parse_pools(text: str, flag: str = "--pools") -> dict[str, dict[str, Any]]:
    """``prefill=P,decode=D`` as the ``pools`` of :func:`llmsched_gym.cluster_sim.simulate_cluster`."""
    want = f"expected prefill=P,decode=D with P, D integers >= 1 (e.g. prefill=2,decode=1), got {text!r}"
    out: dict[str, dict[str, Any]] = {}
    for item in filter(None, (s.strip() for s in str(text).split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in ("prefill", "decode") or key in out:
            raise ConfigError(f"{flag}: {want}")
        try:
            n = int(value)
        except ValueError:
            raise ConfigError(f"{flag}: {key}: {want}") from None
        if not 1 <= n <= 4096:
            raise ConfigError(f"{flag}: {key}: expected an integer in 1..4096, got {value.strip()!r}")
        out[key] = {"n": n}
    if set(out) != {"prefill", "decode"}:
        raise ConfigError(f"{flag}: {want}")
    return out


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in str(text).split(",") if s.strip()]
    except ValueError:
        seeds = []
    if not seeds or any(s < 0 for s in seeds):
        raise ConfigError(f"--seeds: expected seeds >= 0 separated by commas (e.g. 0,1,2), got {text!r}")
    return seeds


def _serving(args: argparse.Namespace) -> tuple[Any, dict[str, float]]:
    from llmsched_gym.config import parse_sets
    from llmsched_gym.goodput import Serving, parse_slo

    sets = parse_sets(args.set)
    serving = Serving(args.scenario, sets, args.policy, args.replicas, args.router,
                      parse_pools(args.pools) if args.pools else None,
                      {"bandwidth_gb_s": args.bandwidth_gb_s} if args.bandwidth_gb_s is not None else None)
    spec = serving.spec()  # checks the scenario and the --set overrides
    slo = parse_slo(args.slo) if args.slo else spec.get("slo")
    if not slo:
        raise ConfigError("--slo: the scenario has no slo section; give --slo ttft=SECONDS,tpot=SECONDS")
    return serving, slo


def _slo_text(slo: dict[str, float]) -> str:
    return ", ".join(f"{k.removesuffix('_s').upper()} <= {v:g} s" for k, v in slo.items() if v != float("inf"))


def cmd_goodput(args: argparse.Namespace) -> int:
    from llmsched_gym.config import check_output_file
    from llmsched_gym.goodput import check_target, find_goodput

    t0 = time.perf_counter()
    check_output_file(args.json, "--json")
    check_target(args.attainment)
    if args.requests is not None and not 2 <= args.requests <= 10_000_000:
        raise ConfigError(f"--requests: expected an integer in 2..10,000,000, got {args.requests}")
    if not 0 < args.tol <= 1:
        raise ConfigError(f"--tol: expected a fraction in (0, 1], got {args.tol}")
    if args.start_rate is not None and not (0 < args.start_rate < float("inf")):
        raise ConfigError(f"--start-rate: expected a rate > 0 (req/s), got {args.start_rate}")
    seeds = _seeds(args.seeds)
    serving, slo = _serving(args)
    if args.placement:
        return _placement(args, serving, slo, seeds, t0)
    if args.gpus is not None or args.tp:
        raise ConfigError("--gpus/--tp: only with --placement")
    header = [f"{serving.name()} on {args.scenario}: {serving.gpus()} GPU(s); SLO {_slo_text(slo)} for "
              f"{args.attainment:.0%} of requests; seeds {seeds}, {args.requests or 'the scenario'} requests per run"]

    def first(_: Any) -> None:  # the header once the first run went through (a bad setting is one line)
        if header:
            print(header.pop(), flush=True)

    res = find_goodput(serving, slo, args.attainment, seeds, args.requests, args.tol, args.start_rate, progress=first)
    print(res.table())
    if res.note:
        print(f"note: {res.note}")
    print(f"goodput: {res.goodput:.4g} req/s{' (at least)' if res.capped else ''}, {res.per_gpu:.4g} req/s per GPU "
          f"({res.gpus} GPU(s)); {len(res.points)} rates, {time.perf_counter() - t0:.1f} s wall")
    if args.json:
        Path(args.json).write_text(json.dumps(res.as_dict(), indent=2) + "\n")
    return 0


def _placement(args: argparse.Namespace, serving: Any, slo: dict[str, float], seeds: list[int], t0: float) -> int:
    from llmsched_gym.placement import candidates, search_placement

    if args.gpus is None:
        raise ConfigError("--placement: give the GPU budget with --gpus N")
    candidates(args.gpus, [1])  # checks the budget
    tps = None
    if args.tp:
        try:
            tps = sorted({int(t) for t in args.tp.split(",") if t.strip()})
        except ValueError:
            raise ConfigError(f"--tp: expected degrees separated by commas (e.g. 1,2,4), got {args.tp!r}") from None
    header = [f"placement of {args.gpus} GPUs on {args.scenario}: SLO {_slo_text(slo)} for {args.attainment:.0%} of "
              f"requests; seeds {seeds}, {args.requests or 'the scenario'} requests per run"]

    def say(c: Any, r: Any) -> None:  # the header once the first candidate ran (a bad setting is one line)
        if header:
            print(header.pop(), flush=True)
        if not args.quiet:
            print(f"  {c.label()}: {r.per_gpu:.4g} req/s per GPU", flush=True)

    res = search_placement(serving, slo, args.gpus, args.attainment, tuple(seeds), args.requests, tps, args.tol,
                           progress=say, colocated=not args.no_colocated)
    print(res.table())
    cand, best = res.best
    print(f"best: {cand.label()}: goodput {best.goodput:.4g} req/s, {best.per_gpu:.4g} req/s per GPU; "
          f"{time.perf_counter() - t0:.1f} s wall")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "gpus": res.gpus, "best": {"placement": cand.label(), **best.as_dict()},
            "candidates": [{"placement": c.label(), "gpus": c.gpus, "goodput_req_s": r.goodput,
                            "goodput_per_gpu": r.per_gpu, "capped": r.capped} for c, r in res.rows]}, indent=2) + "\n")
    return 0


def add_subcommands(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """Add ``goodput`` to the ``llmsched`` parser's subcommands."""
    sp = sub.add_parser("goodput", formatter_class=formatter,
                        help="highest arrival rate meeting TTFT/TPOT SLOs, per GPU (DistServe); --placement searches "
                             "prefill:decode splits")
    sp.add_argument("--scenario", required=True, help="scenario (its engine, batch-time model and workload)")
    sp.add_argument("--slo", default=None,
                    help="targets, e.g. ttft=0.25,tpot=0.1 (seconds; 250ms works); default: the scenario's slo section")
    sp.add_argument("--attainment", type=float, default=0.9,
                    help="fraction of requests that must meet both targets (DistServe: 0.9)")
    sp.add_argument("--policy", default=None, help="replica scheduler (default: the scenario's; sarathi: chunked prefill)")
    sp.add_argument("--replicas", type=int, default=None,
                    help="colocated replicas (default: the scenario's cluster section, else 1: one engine)")
    sp.add_argument("--router", default=None, help="the cluster's router (default: the scenario's, else round-robin)")
    sp.add_argument("--pools", default=None, help="disaggregated: prefill=P,decode=D replicas")
    sp.add_argument("--bandwidth-gb-s", type=float, default=None, help="KV transfer link bandwidth (GB/s) of --pools")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="scenario overrides (repeatable)")
    sp.add_argument("--seeds", default="0", help="workload seeds, pooled at each rate (e.g. 0,1,2)")
    sp.add_argument("--requests", type=int, default=1000, help="requests per run")
    sp.add_argument("--tol", type=float, default=0.03, help="relative width at which the rate bisection stops")
    sp.add_argument("--start-rate", type=float, default=None, help="first rate tried (default: the workload's own)")
    sp.add_argument("--placement", action="store_true",
                    help="search prefill:decode splits and tensor-parallel degrees for --gpus (DistServe section 4)")
    sp.add_argument("--gpus", type=int, default=None, help="GPU budget of --placement")
    sp.add_argument("--tp", default=None, help="tensor-parallel degrees --placement tries (default: all modelled)")
    sp.add_argument("--no-colocated", action="store_true", help="--placement: leave out the colocated references")
    sp.add_argument("--quiet", action="store_true", help="--placement: no line per candidate")
    sp.add_argument("--json", default=None, help="also write the result as JSON to this file")
    sp.set_defaults(func=cmd_goodput)
