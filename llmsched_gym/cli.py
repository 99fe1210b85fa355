"""The ``llmsched`` command: ``llmsched --help`` lists the subcommands.

``list``, ``run`` and ``bench`` need only NumPy; ``train``/``evaluate``/``compare`` import the RL
stack and ``gpu`` imports torch, each only when invoked. Errors in user input are printed as one
line (``error: FIELD: ...``) with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

from llmsched_gym.config import ConfigError
from llmsched_gym.help import HelpFormatter
from llmsched_gym.parallel import add_arguments as add_parallel_arguments


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llmsched-gym")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """``--version``: the installed version, looked up only when asked (importlib.metadata costs
    ~10 ms of every start otherwise)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(f"llmsched-gym {_version()}")
        parser.exit()


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
        from llmsched_gym.core.scenarios import get_scenario
        from llmsched_gym.reproduce.report import add_reference_metrics

        add_reference_metrics(s, get_scenario(args.scenario, sets))
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
                            hindsight_sims=args.hindsight_sims, seeds=seeds)
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


class _Parser(argparse.ArgumentParser):
    """argparse with the project's one-line errors: ``error: llmsched train: argument --K: invalid
    int value: 'true' (llmsched train --help)`` instead of the usage block and the message (the
    subcommand parsers are of this class too)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {' '.join(message.split())} ({self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="llmsched", description="LLM inference scheduling gym and simulator",
                                formatter_class=HelpFormatter)
    p.add_argument("--version", action=_VersionAction)
    sub = p.add_subparsers(dest="command", required=True)

    sp = sub.add_parser("list", help="scenarios, policies and latency presets", formatter_class=HelpFormatter)
    sp.add_argument("--scenario", default=None, help="describe one scenario (a name or a .yml file)")
    sp.add_argument("--show", action="store_true",
                    help="with --scenario: print it as a YAML scenario file to edit and run with --scenario FILE")
    sp.set_defaults(func=cmd_list)

    sp = sub.add_parser("run", help="run one policy on one scenario", formatter_class=HelpFormatter)
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

    sp = sub.add_parser("bench", help="speed report", formatter_class=HelpFormatter)
    sp.add_argument("--quick", action="store_true", help="smaller runs (for CI)")
    sp.add_argument("--only", action="append", choices=("engine", "overload", "memory", "env", "train", "sweep"),
                    help="sections: engine, overload, memory, env, train, sweep (repeatable; default: engine and env)")
    sp.add_argument("--json", default=None, metavar="PATH", help="write the report JSON here")
    sp.set_defaults(func=cmd_bench)

    sp = sub.add_parser("benchmark", help="the fixed task suite: score policies and agents against the baselines",
                        formatter_class=HelpFormatter)
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
    sp.add_argument("--out", default="runs/benchmark", help="output folder")
    sp.add_argument("--quiet", action="store_true", help="print no progress")
    add_parallel_arguments(sp)
    sp.set_defaults(func=cmd_benchmark)

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

    from llmsched_gym.data import add_subcommands as add_data

    add_data(sub)

    for extra in ("agents.cli", "llmsched_gym.backends.gpu.cli", "llmsched_gym.reproduce.cli"):
        _maybe_add(sub, extra)
    return p


def _maybe_add(sub, module: str) -> None:
    """Subcommands from other packages register themselves when the package is present."""
    import importlib

    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError:
        return
    for name in ("add_subcommands", "add_gpu_subcommands"):
        fn = getattr(mod, name, None)
        if fn is not None:
            fn(sub)


_PACKAGES = ("llmsched_gym", "agents", "baselines")


def _where(tb: Any) -> str:
    """``module.function (file:line)`` of the innermost frame of the project in a traceback."""
    import traceback

    frames = [f for f in traceback.extract_tb(tb) if any(f"/{p}/" in f.filename.replace("\\", "/") for p in _PACKAGES)]
    if not frames:
        return "outside the project's code"
    f = frames[-1]
    path = f.filename.replace("\\", "/")
    short = next((path[path.rindex(f"/{p}/") + 1:] for p in _PACKAGES if f"/{p}/" in path), path)
    return f"{f.name} ({short}:{f.lineno})"


def main(argv: list[str] | None = None) -> int:
    """Run ``llmsched ARGV``; returns the exit status.

    0: done. 2: bad input (a file, flag or setting), printed as one line ``error: FIELD: ...``, or
    out of memory (one line naming where the memory ran out). 130: interrupted. 70: an internal
    error, a bug: one line saying so, where it happened and that it should be reported
    (``LLMSCHED_DEBUG=1`` shows the traceback instead).
    """
    import os

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except KeyboardInterrupt:
        return 130
    except (ConfigError, ValueError, KeyError, OSError) as e:
        # ConfigError is every input error the project raises (one line naming the field); the
        # others are library errors about the same input (a file that cannot be read)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"error: {msg}", file=sys.stderr)
        return 2
    except MemoryError as e:
        print(f"error: out of memory in {_where(e.__traceback__)}: a size in the input is too large for this "
              "machine (workload.n_requests, K, network widths, n_steps); make it smaller", file=sys.stderr)
        return 2
    except Exception as e:  # a bug: say so in one line, never a bare traceback
        if os.environ.get("LLMSCHED_DEBUG"):
            raise
        msg = " ".join(str(e).split())[:200]
        print(f"error: internal error ({type(e).__name__}: {msg}) in {_where(e.__traceback__)}; please report it "
              "to the project's issue tracker with the command and this line (LLMSCHED_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 70
    return rc or 0


if __name__ == "__main__":
    sys.exit(main())
