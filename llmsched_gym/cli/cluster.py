"""``llmsched cluster run|compare|sweep``: a scenario served by N replicas behind a router
(:mod:`llmsched_gym.core.cluster`, :func:`llmsched_gym.cluster_sim.simulate_cluster`).

* ``run``: one cluster; prints the cluster's ``vllm bench serve`` metrics, its prefix hit rate and
  load imbalance, and one row per replica (``-o json``: the summary JSON instead).
* ``compare``: several routers on the same seeded workloads (paired): mean and 95% t-interval
  of each figure over the seeds, and each router's per-seed relative difference to the best one
  on ``--metric``.
* ``sweep``: every combination of replica counts, routers and loads (arrival-rate multipliers)
  over the seeds, one cell each, run locally (``--jobs``) or on Ray (``--backend ray``), as every
  sweep of the project (:mod:`llmsched_gym.parallel`); ``--out`` gets ``sweep.json`` and
  ``sweep.csv``.

A scenario's ``cluster:`` section gives the defaults (``mooncake-conv-8``: 8 replicas, llm-d);
``--replicas``, ``--router`` and ``--refresh-s`` replace them.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from llmsched_gym.config import ConfigError
from llmsched_gym.parallel import add_arguments as add_parallel_arguments

DEFAULT_SCENARIO = "mooncake-conv-8"
_TABLE_METRICS = (  # (dotted path, label): the vllm bench serve set
    ("serving.request_throughput", "request throughput (req/s)"),
    ("serving.output_throughput", "output token throughput (tok/s)"),
    ("serving.total_token_throughput", "total token throughput (tok/s)"),
    ("serving.mean_ttft_ms", "TTFT mean (ms)"), ("serving.median_ttft_ms", "TTFT median (ms)"),
    ("serving.p90_ttft_ms", "TTFT P90 (ms)"), ("serving.p99_ttft_ms", "TTFT P99 (ms)"),
    ("serving.mean_tpot_ms", "TPOT mean (ms)"), ("serving.median_tpot_ms", "TPOT median (ms)"),
    ("serving.p99_tpot_ms", "TPOT P99 (ms)"),
    ("serving.mean_itl_ms", "ITL mean (ms)"), ("serving.p99_itl_ms", "ITL P99 (ms)"),
    ("serving.mean_e2el_ms", "E2EL mean (ms)"), ("serving.p99_e2el_ms", "E2EL P99 (ms)"),
)
_COMPARE_METRICS = (("serving.p90_ttft_ms", "P90 TTFT (ms)"), ("serving.mean_ttft_ms", "mean TTFT (ms)"),
                    ("serving.mean_e2el_ms", "mean E2EL (ms)"), ("serving.output_throughput", "output tok/s"),
                    ("cluster.prefix_hit_rate", "prefix hit"), ("cluster.load_imbalance", "load imbalance"))


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return "-" if not math.isfinite(x) else f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"
    return str(x)


def _pm(mean: float, half: float) -> str:
    """``mean ± half`` (the 95% t-interval's half-width; the mean alone where it is undefined)."""
    return _fmt(mean) + (f" ± {_fmt(half)}" if math.isfinite(half) else "")


def _get(d: dict[str, Any], path: str) -> float:
    from llmsched_gym.core.metrics import metric_value

    return metric_value(d, path)


def _int_list(text: str, flag: str, lo: int = 1, hi: int = 4096) -> list[int]:
    try:
        out = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{flag}: {text!r} is not a list of integers like 4,8") from None
    if not out or any(not lo <= x <= hi for x in out):
        raise ConfigError(f"{flag}: {text!r}: expected integers in {lo}..{hi}")
    return out


def _float_list(text: str, flag: str) -> list[float]:
    try:
        out = [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{flag}: {text!r} is not a list of numbers like 0.5,1,2") from None
    if not out or any(not (math.isfinite(x) and x > 0) for x in out):
        raise ConfigError(f"{flag}: {text!r}: expected numbers > 0")
    return out


def _setup(args: argparse.Namespace) -> tuple[dict[str, Any], str | dict | None]:
    """The scenario overrides and the replica policy, checked before anything runs."""
    from baselines import validate_spec
    from llmsched_gym.config import parse_sets

    sets = parse_sets(args.set)
    policy = None if args.policy is None else validate_spec(args.policy, "--policy")
    if args.refresh_s is not None and not (math.isfinite(args.refresh_s) and args.refresh_s >= 0):
        raise ConfigError(f"--refresh-s: expected a number of seconds >= 0, got {args.refresh_s!r}")
    return sets, policy


def _routers(specs: list[str] | None, flag: str = "--router") -> list[str] | None:
    """Router specs checked by building each once (one line naming the flag on a bad one)."""
    if not specs:
        return None
    from llmsched_gym.cluster_sim import build_router

    for s in specs:
        build_router(s, field=flag)
    if len(set(specs)) != len(specs):
        raise ConfigError(f"{flag}: {next(s for s in specs if specs.count(s) > 1)!r} is given twice")
    return specs


def _write_json(path: str | None, data: Any) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data, indent=1, default=float) + "\n")


# ---------------------------------------------------------------------------------------------
# run


def cluster_tables(summary: dict[str, Any]) -> list[Any]:
    """The rich tables of a cluster summary: the cluster's figures, then one row per replica."""
    from rich.table import Table

    from llmsched_gym.data import synthetic_note

    c = summary["cluster"]
    t = Table(title=f"{summary['policy']} replicas behind {c['router']} on {summary['scenario']}"
              f"{synthetic_note(summary.get('workload_source'))} ({c['n_replicas']} replicas, refresh "
              f"{c['refresh_s']:g} s, seed {summary['seed']})")
    t.add_column("metric")
    t.add_column("value", justify="right")
    rows: list[tuple[str, Any]] = [
        ("requests arrived / completed / rejected / unfinished",
         f"{summary['n_arrived']} / {summary['n_completed']} / {summary['n_rejected']} / {summary['n_unfinished']}"),
        ("simulated time (s)", summary["sim_time_s"]),
        *((label, _get(summary, path)) for path, label in _TABLE_METRICS),
        ("prefix hit rate (prompt tokens)", c["prefix_hit_rate"]),
        ("load imbalance (max / mean routed requests)", c["load_imbalance"]),
        ("busy imbalance (max / mean busy time)", c["busy_imbalance"]),
        ("preemptions", summary["preemptions"]),
        ("wall time (s)", summary["wall_time_s"]),
    ]
    for k, v in rows:
        t.add_row(k, _fmt(v))
    r = Table(title="per replica")
    cols = (("replica", None), ("routed", None), ("done", "n_completed"), ("req/s", "serving.request_throughput"),
            ("out tok/s", "serving.output_throughput"), ("TTFT mean", "serving.mean_ttft_ms"),
            ("TTFT P90", "serving.p90_ttft_ms"), ("TTFT P99", "serving.p99_ttft_ms"),
            ("TPOT mean", "serving.mean_tpot_ms"), ("E2EL mean", "serving.mean_e2el_ms"),
            ("E2EL P99", "serving.p99_e2el_ms"), ("prefix hit", "prefix_hit_rate"), ("busy", "busy_frac"),
            ("KV peak", "kv_peak_frac"), ("preempt", "preemptions"))
    for name, _ in cols:
        r.add_column(name, justify="right")
    for i, rep in enumerate(c["replicas"]):
        name = f"{i} {rep['role']}" if "role" in rep else str(i)  # a pool's role (prefill, decode, mixed)
        r.add_row(name, str(c["routed"][i]), *(_fmt(_get(rep, path) if "." in path else rep.get(path, math.nan))
                                               for _, path in cols[2:]))
    return [t, r]


def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from llmsched_gym.cluster_sim import simulate_cluster
    from llmsched_gym.config import check_output_file

    sets, policy = _setup(args)
    check_output_file(args.json, "--json")
    router = None if args.router is None else _routers([args.router])[0]
    result = simulate_cluster(args.scenario, policy, router, args.replicas, args.seed, sets,
                              refresh_s=args.refresh_s)
    s = result.summary
    _write_json(args.json, s)
    if args.output == "json":
        print(json.dumps(s, indent=1, default=float))
    elif not args.quiet:
        con = Console(width=160)
        for table in cluster_tables(s):
            con.print(table)
    return 0


# ---------------------------------------------------------------------------------------------
# compare and sweep


def _cells(args: argparse.Namespace, routers: list[str], replicas: list[int | None], loads: list[float],
           seeds: list[int], sets: dict[str, Any], policy: Any) -> list[Any]:
    from llmsched_gym.parallel import Cell

    return [Cell(f"{router} x{n or 'scenario'} load {load:g} seed {seed}",
                 (args.scenario, policy, router, n, args.refresh_s, load, seed, sets))
            for n in replicas for router in routers for load in loads for seed in seeds]


def _run(cells: list[Any], args: argparse.Namespace, label: str) -> list[dict[str, Any]]:
    from llmsched_gym.cluster_sim import cluster_cell
    from llmsched_gym.parallel import failures, run_cells, settings_from

    outcomes = run_cells(cells, cluster_cell, settings_from(args, progress=not args.quiet), label=label)
    bad = failures(outcomes)
    if bad:  # a cell fails on its input (a policy a replica cannot run, a bad override)
        raise ConfigError(bad)
    return [o.value for o in outcomes]


def compare_report(rows: list[dict[str, Any]], metric: str, lower_is_better: bool) -> dict[str, Any]:
    """Per router: mean, 95% t-interval and per-seed values of every compared figure, and the
    paired per-seed relative difference to the best router on ``metric`` (``rows``: the cells of
    one replica count and load, every router on the same seeds)."""
    from llmsched_gym.benchmark import paired, t_interval

    routers = list(dict.fromkeys(r["router"] for r in rows))
    figures = list(dict.fromkeys([metric, *(m for m, _ in _COMPARE_METRICS)]))
    per = {rt: sorted((r for r in rows if r["router"] == rt), key=lambda r: r["seed"]) for rt in routers}
    out: dict[str, Any] = {"metric": metric, "lower_is_better": lower_is_better, "routers": {}}
    for rt, rs in per.items():
        out["routers"][rt] = {m: dict(zip(("mean", "ci95", "std"), t_interval([r[m] for r in rs]), strict=True))
                              | {"values": [r[m] for r in rs]} for m in figures}
    sign = 1.0 if lower_is_better else -1.0
    means = {rt: out["routers"][rt][metric]["mean"] for rt in routers}
    finite = [rt for rt in routers if math.isfinite(means[rt])]
    best = min(finite, key=lambda rt: sign * means[rt]) if finite else None
    out["best"] = best
    for rt in routers:
        if best is not None:
            out["routers"][rt]["vs_best"] = paired(out["routers"][rt][metric]["values"],
                                                   out["routers"][best][metric]["values"], lower_is_better)
    return out


def cmd_compare(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from agents.report import parse_seeds
    from llmsched_gym.config import check_output_file

    sets, policy = _setup(args)
    check_output_file(args.json, "--json")
    routers = _routers(args.router) or ["round-robin", "lor", "sglang-cache-aware", "llm-d"]
    if len(routers) < 2:
        raise ConfigError("--router: compare needs at least two routers (repeat --router)")
    seeds = parse_seeds(args.seeds)
    rows = _run(_cells(args, routers, [args.replicas], [1.0], seeds, sets, policy), args, "cluster compare")
    rep = compare_report(rows, args.metric, not args.higher_is_better)
    rep.update(scenario=args.scenario, seeds=seeds, n_replicas=rows[0]["n_replicas"])
    _write_json(args.json, rep)
    if args.output == "json":
        print(json.dumps(rep, indent=1, default=float))
        return 0
    if args.quiet:
        return 0
    t = Table(title=f"routers on {args.scenario} ({rep['n_replicas']} replicas, seeds {args.seeds}: paired); "
                    f"vs best on {args.metric}")
    t.add_column("router")
    labels = dict(_COMPARE_METRICS)
    figures = [(args.metric, labels.get(args.metric, args.metric)),
               *((path, label) for path, label in _COMPARE_METRICS if path != args.metric)]
    for _, label in figures:
        t.add_column(label, justify="right")
    t.add_column("vs best (paired)", justify="right")
    for rt, r in rep["routers"].items():
        cells = []
        for path, _ in figures:
            m = r[path]
            cells.append(_pm(m["mean"], m["ci95"]))
        vs = r.get("vs_best", {})
        rel = vs.get("rel", math.nan)
        vs_text = "-" if not math.isfinite(rel) else f"{100 * rel:+.1f}%" + (
            f" ± {100 * vs['ci95']:.1f}%" if math.isfinite(vs["ci95"]) else "") + f" {vs['verdict']}"
        t.add_row(rt + (" (best)" if rt == rep["best"] else ""), *cells, vs_text)
    Console(width=200).print(t)
    return 0


SWEEP_COLUMNS = ("n_replicas", "router", "load", "seed", "serving.request_throughput", "serving.output_throughput",
                 "serving.mean_ttft_ms", "serving.p90_ttft_ms", "serving.p99_ttft_ms", "serving.mean_tpot_ms",
                 "serving.mean_e2el_ms", "serving.p99_e2el_ms", "cluster.prefix_hit_rate", "cluster.load_imbalance",
                 "n_arrived", "n_completed", "n_rejected")


def cmd_sweep(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from agents.report import parse_seeds
    from llmsched_gym.benchmark import t_interval
    from llmsched_gym.config import check_output_dir

    sets, policy = _setup(args)
    check_output_dir(args.out, "--out")
    routers = _routers(args.router) or ["round-robin", "llm-d"]
    replicas: list[int | None] = _int_list(args.replicas, "--replicas") if args.replicas else [None]
    loads = _float_list(args.loads, "--loads")
    seeds = parse_seeds(args.seeds)
    rows = _run(_cells(args, routers, replicas, loads, seeds, sets, policy), args, "cluster sweep")
    meta = {"scenario": args.scenario, "policy": policy, "sets": sets, "refresh_s": args.refresh_s,
            "routers": routers, "replicas": replicas, "loads": loads, "seeds": seeds,
            "backend": args.backend}
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "sweep.json").write_text(json.dumps({**meta, "rows": rows}, indent=1, default=float) + "\n")
        with (out / "sweep.csv").open("w") as f:
            f.write(",".join(SWEEP_COLUMNS) + "\n")
            for r in rows:
                f.write(",".join(str(r[c]) for c in SWEEP_COLUMNS) + "\n")
    if args.output == "json":
        print(json.dumps({**meta, "rows": rows}, indent=1, default=float))
        return 0
    if args.quiet:
        return 0
    t = Table(title=f"cluster sweep on {args.scenario}: mean ± 95% CI over seeds {args.seeds}")
    for c in ("replicas", "router", "load", "P90 TTFT (ms)", "mean E2EL (ms)", "output tok/s", "prefix hit",
              "load imbalance"):
        t.add_column(c, justify="right")
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["n_replicas"], r["router"], r["load"]), []).append(r)
    for (n, rt, load), rs in groups.items():
        cells = []
        for m in ("serving.p90_ttft_ms", "serving.mean_e2el_ms", "serving.output_throughput",
                  "cluster.prefix_hit_rate", "cluster.load_imbalance"):
            mean, half, _ = t_interval([r[m] for r in rs])
            cells.append(_pm(mean, half))
        t.add_row(str(n), rt, f"{load:g}", *cells)
    Console(width=160).print(t)
    return 0


def add_subcommands(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """Add ``cluster`` (``run``, ``compare``, ``sweep``) to the ``llmsched`` parser's subcommands."""
    cp = sub.add_parser("cluster", help="a scenario on N replicas behind a router: run, compare routers, sweep",
                        formatter_class=formatter, description=__doc__)
    csub = cp.add_subparsers(dest="cluster_command", required=True)  # of the parent's class: one-line errors

    def common(sp: argparse.ArgumentParser, many: bool) -> None:
        sp.add_argument("--scenario", default=DEFAULT_SCENARIO,
                        help=f"scenario name, .yml file or trace:FORMAT:PATH (default {DEFAULT_SCENARIO}); its "
                             "cluster: section gives the defaults")
        sp.add_argument("--policy", default=None, metavar="NAME[:k=v,...]",
                        help="every replica's scheduler (default: the scenario's)")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override: workload.X, engine.X, latency, policy.X, cluster.X (repeatable)")
        sp.add_argument("--refresh-s", type=float, default=None,
                        help="load-signal refresh interval in seconds (0: exact; default: the scenario's, else 0.1)")
        sp.add_argument("-o", "--output", choices=("table", "json"), default="table",
                        help="print tables (default) or the JSON result")
        sp.add_argument("--quiet", action="store_true", help="print nothing (with --json/--out)")
        if many:
            sp.add_argument("--router", action="append", metavar="NAME[:k=v,...]",
                            help="a router (repeatable; docs/cluster.md lists them)")
            sp.add_argument("--seeds", default="0-2", help="workload seeds, e.g. 0-4 or 1,3,5 (default 0-2)")
            add_parallel_arguments(sp)

    sp = csub.add_parser("run", help="one cluster: the vllm bench serve metrics, per replica too",
                         formatter_class=formatter)
    common(sp, False)
    sp.add_argument("--router", default=None, metavar="NAME[:k=v,...]",
                    help="router (default: the scenario's, else round-robin); docs/cluster.md lists them, and so "
                         "does the error an unknown name gets")
    sp.add_argument("--replicas", type=int, default=None, help="replicas (default: the scenario's, else 1)")
    sp.add_argument("--seed", type=int, default=0, help="seeds the workload, the engines and the router")
    sp.add_argument("--json", default=None, metavar="PATH", help="write the summary JSON here")
    sp.set_defaults(func=cmd_run)

    sp = csub.add_parser("compare", help="routers side by side, paired over seeds", formatter_class=formatter)
    common(sp, True)
    sp.add_argument("--replicas", type=int, default=None, help="replicas (default: the scenario's, else 1)")
    sp.add_argument("--metric", default="serving.p90_ttft_ms",
                    help="dotted summary path the routers are ranked on (default serving.p90_ttft_ms)")
    sp.add_argument("--higher-is-better", action="store_true", help="--metric is better when higher (throughput)")
    sp.add_argument("--json", default=None, metavar="PATH", help="write the comparison JSON here")
    sp.set_defaults(func=cmd_compare)

    sp = csub.add_parser("sweep", help="replicas x routers x loads over seeds (--backend ray)",
                         formatter_class=formatter)
    common(sp, True)
    sp.add_argument("--replicas", default=None, help="replica counts, e.g. 4,8 (default: the scenario's)")
    sp.add_argument("--loads", default="1", help="arrival-rate multipliers, e.g. 0.5,1,2 (default 1)")
    sp.add_argument("--out", default=None, help="folder for sweep.json and sweep.csv")
    sp.set_defaults(func=cmd_sweep)
