"""``llmsched list`` and ``llmsched run``: the scenarios, policies and latency models, and one
policy on one scenario (the summary table, ``--json``, the iteration log)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from llmsched_gym.config import ConfigError


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def print_summary(summary: dict[str, Any]) -> None:
    """A readable table of the headline metrics."""
    from rich.console import Console
    from rich.table import Table

    from llmsched_gym.data import synthetic_note

    info = f", {summary['information']} output lengths" if summary.get("information") else ""
    t = Table(title=f"{summary['policy']} on {summary['scenario']}{synthetic_note(summary.get('workload_source'))} "
              f"(seed {summary['seed']}{info})", show_header=True)
    t.add_column("metric")
    t.add_column("value", justify="right")
    rows = [
        ("requests arrived / completed / rejected / unfinished",
         f"{summary['n_arrived']} / {summary['n_completed']} / {summary['n_rejected']} / {summary['n_unfinished']}"),
        ("simulated time (s)", summary["sim_time_s"]),
        ("iterations", summary["iterations"]),
        ("throughput (tokens/s)", summary["throughput_tokens_per_s"]),
        ("E2E mean / p99 (s)", f"{_fmt(summary['e2e_s']['mean'])} / {_fmt(summary['e2e_s']['p99'])}"),
        ("TTFT mean / p99 (s)", f"{_fmt(summary['ttft_s']['mean'])} / {_fmt(summary['ttft_s']['p99'])}"),
        ("TPOT mean / p99 (s)", f"{_fmt(summary['tpot_s']['mean'])} / {_fmt(summary['tpot_s']['p99'])}"),
        ("KV peak / mean (fraction)", f"{_fmt(summary['kv_peak_frac'])} / {_fmt(summary['kv_mean_frac'])}"),
        ("preemptions / recomputed tokens", f"{summary['preemptions']} / {summary['recomputed_tokens']}"),
    ]
    if "slo_attainment" in summary:
        rows.append(("SLO attainment", summary["slo_attainment"]))
    if "slo" in summary:  # the scenario's slo section (DistServe's TTFT and TPOT targets)
        s = summary["slo"]
        rows.append((f"SLO TTFT <= {s['ttft_s']:g} s / TPOT <= {s['tpot_s']:g} s / both (fraction)",
                     f"{_fmt(s['ttft_attainment'])} / {_fmt(s['tpot_attainment'])} / {_fmt(s['attainment'])}"))
    if "fairness" in summary:
        rows.append(("max service diff / Jain",
                     f"{_fmt(summary['fairness']['max_service_diff'])} / {_fmt(summary['fairness']['jain'])}"))
    if "prefix_hit_rate" in summary:
        rows.append(("prefix hit rate (tokens)", summary["prefix_hit_rate"]))
    for key, label in (("ratio_to_fluid", "throughput / fluid bound"), ("ratio_to_opt", "total latency / optimum"),
                       ("regret", "regret (total latency - optimum)")):
        if key in summary:
            rows.append((label, summary[key]))
    if summary.get("non_terminating"):
        rows.append(("NON-TERMINATING", summary["stop_reason"]))
    rows.append(("wall time (s)", summary["wall_time_s"]))
    for k, v in rows:
        t.add_row(k, _fmt(v))
    Console(width=120).print(t)


def write_iteration_log(result, path: str, batches: bool = False) -> None:
    """The iteration log as CSV; with ``batches``, also ``PATH.batches.jsonl`` beside it (each
    iteration's batch composition, which ``llmsched gpu replay`` reads)."""
    import numpy as np

    from llmsched_gym.core.engine import LOG_COLUMNS

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    log = result.iterations
    cols = [np.asarray(log[c]) for c in LOG_COLUMNS]
    with p.open("w") as f:
        f.write(",".join(LOG_COLUMNS) + "\n")
        for row in zip(*cols, strict=True):
            f.write(",".join(repr(float(v)) if isinstance(v, float | np.floating) else str(int(v)) for v in row) + "\n")
    if not batches:
        return
    with p.with_suffix(".batches.jsonl").open("w") as f:
        for b in result.engine.batches:
            f.write(json.dumps(b) + "\n")


def cmd_list(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from baselines import available, policy_params
    from llmsched_gym.core.latency import list_latency_presets
    from llmsched_gym.core.scenarios import get_scenario, list_scenarios, scenario_yaml

    if args.scenario is not None:
        spec = get_scenario(args.scenario)
        if args.show:
            print(f"# scenario {spec['name']}: save as my.yml, edit, then `llmsched run --scenario my.yml`")
            print(scenario_yaml(spec), end="")
        else:
            print(f"{spec['name']}: {spec.get('description', '')}")
        return 0
    if args.show:
        raise ConfigError("--show: give the scenario to print (llmsched list --scenario NAME --show)")
    con = Console()
    t = Table(title="scenarios")
    t.add_column("name")
    t.add_column("description")
    for k, v in list_scenarios().items():
        t.add_row(k, v)
    con.print(t)
    t = Table(title="policies")
    t.add_column("name")
    t.add_column("parameters (defaults)")
    for name in available():
        t.add_row(name, ", ".join(f"{k}={v}" for k, v in policy_params(name).items()))
    con.print(t)
    t = Table(title="latency models (--latency, --set latency=...); calibrated: the fit's error against its profile")
    t.add_column("spec")
    t.add_column("what")
    for name, what in list_latency_presets().items():
        t.add_row(name, what)
    con.print(t)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from baselines import validate_spec
    from llmsched_gym.config import check_distinct, check_output_file, parse_sets, split_policy_sets
    from llmsched_gym.sim import simulate

    if args.log_batches and not args.log_iterations:
        raise ConfigError("--log-batches: needs --log-iterations PATH (the batches go beside that CSV)")
    policy = None if args.policy is None else validate_spec(args.policy, "--policy")
    sets, policy_params = split_policy_sets(parse_sets(args.set))
    check_output_file(args.json, "--json")
    check_output_file(args.log_iterations, "--log-iterations")
    batches = Path(args.log_iterations).with_suffix(".batches.jsonl") if args.log_batches else None
    check_output_file(batches, "--log-batches")
    check_distinct({"--json": args.json, "--log-iterations": args.log_iterations, "--log-batches": batches})
    if args.latency:
        sets["latency"] = args.latency
    result = simulate(args.scenario, policy, args.seed, sets, policy_params,
                      log_batches=args.log_batches)
    s = result.summary
    if args.reference:
        from llmsched_gym.reproduce.report import add_reference_metrics

        add_reference_metrics(s, result.scenario)  # the scenario simulate() checked and ran
        if not any(k in s for k in ("ratio_to_fluid", "ratio_to_opt")):
            print("reference: none applies (the fluid bound needs a typed workload; the optimum a small "
                  "round-mode run that completed every request)", file=sys.stderr)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(s, indent=2, default=float) + "\n")
    if args.log_iterations:
        write_iteration_log(result, args.log_iterations, batches=args.log_batches)
    if not args.quiet:
        print_summary(s)
    return 0


def add_subcommands(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """Add ``list`` and ``run`` to the ``llmsched`` parser's subcommands."""
    sp = sub.add_parser("list", help="scenarios, policies and latency presets", formatter_class=formatter)
    sp.add_argument("--scenario", default=None, help="describe one scenario (a name or a .yml file)")
    sp.add_argument("--show", action="store_true",
                    help="with --scenario: print it as a YAML scenario file to edit and run with --scenario FILE")
    sp.set_defaults(func=cmd_list)

    sp = sub.add_parser("run", help="run one policy on one scenario", formatter_class=formatter)
    sp.add_argument("--scenario", default="azure-conv",
                    help="scenario name (`llmsched list`), a .yml scenario file, or trace:FORMAT:PATH")
    sp.add_argument("--policy", default=None, metavar="NAME[:k=v,...]",
                    help="policy, e.g. sarathi or sarathi:chunk_size=256 (default: the scenario's)")
    sp.add_argument("--seed", type=int, default=0, help="seeds the workload, the engine and the policy")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="override: workload.X, engine.X, latency, policy.X (repeatable)")
    sp.add_argument("--latency", default=None,
                    help="batch-time model, e.g. roofline:llama-3-8b/h100 or gpu:MODEL (default: the scenario's)")
    sp.add_argument("--json", default=None, metavar="PATH", help="write the summary JSON here")
    sp.add_argument("--log-iterations", default=None, metavar="PATH",
                    help="write the iteration log CSV here (one row per engine iteration)")
    sp.add_argument("--log-batches", action="store_true",
                    help="also write PATH.batches.jsonl beside the iteration log: each iteration's batch "
                         "composition, for `llmsched gpu replay` (large: tens of MB on azure-conv)")
    sp.add_argument("--reference", action="store_true",
                    help="add ratio_to_fluid (typed workloads) or ratio_to_opt/regret (small round-mode runs)")
    sp.add_argument("--quiet", action="store_true", help="print no summary table")
    sp.set_defaults(func=cmd_run)
