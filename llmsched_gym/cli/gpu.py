"""``llmsched gpu calibrate`` and ``llmsched gpu replay``.

The ``llmsched`` parser adds these with :func:`add_subcommands`; each subcommand stores its handler
in ``args.func`` (called with the parsed ``args``, returns an exit code); the work is
:mod:`llmsched_gym.backends.gpu.backend`'s. Standalone:
``python -m llmsched_gym.cli.gpu gpu calibrate --model tiny --device cpu --quick``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from llmsched_gym.backends.gpu.config import PRESETS
from llmsched_gym.cli.help import HelpFormatter


def add_subcommands(subparsers: Any, fmt: type[argparse.HelpFormatter]) -> None:
    """Add the ``gpu`` command with its ``calibrate`` and ``replay`` subcommands."""
    gpu = subparsers.add_parser("gpu", help="time batches on a real GPU: calibrate, replay", formatter_class=fmt)
    sub = gpu.add_subparsers(dest="gpu_command", required=True)

    def common(p: argparse.ArgumentParser, out: str) -> None:
        p.add_argument("--model", required=True, help=f"model shape: {', '.join(PRESETS)}")
        p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                       help="default: the GPU; without one only --model tiny runs (on the CPU, for tests)")
        p.add_argument("--out", default=out, help="output folder")

    cal = sub.add_parser("calibrate", help="profile prefill/decode grids, write profile.csv, fit models",
                         formatter_class=fmt)
    common(cal, "runs/gpu/calibrate")
    cal.add_argument("--quick", action="store_true", help="a small grid (minutes on CPU, seconds on GPU)")
    cal.set_defaults(func=_calibrate)

    rep = sub.add_parser("replay", help="re-execute an iteration log and score batch-time models",
                         formatter_class=fmt)
    rep.add_argument("iteration_log", help="CSV written by `llmsched run --log-iterations PATH --log-batches`")
    common(rep, "runs/gpu/replay")
    rep.add_argument("--calibration", help="a calibrate output folder: score its affine and table models")
    rep.add_argument("--latency", action="append", default=[], help="a latency preset to score (repeatable; default: none)")
    rep.set_defaults(func=_replay)


def _calibrate(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from llmsched_gym.backends.gpu.backend import QUICK_GRID, CalibrationGrid, calibrate

    s = calibrate(args.model, args.device, args.out, grid=QUICK_GRID if args.quick else CalibrationGrid())
    console = Console()
    t = Table(title=f"calibration: {s['model']} on {s['device']} ({s['dtype']})")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_row("profile rows / held-out rows", f"{s['profile_rows']} / {s['heldout_rows']}")
    t.add_row("KV capacity (tokens)", f"{s['kv_capacity_tokens']:,}")
    for name, mape in s["heldout_mape"].items():
        t.add_row(f"held-out MAPE {name}", "n/a" if mape is None else f"{mape:.1%}")
    for name, c in s["affine"].items():
        t.add_row(f"affine {name}", f"{c * 1e3:.5f} ms")
    t.add_row("copy bandwidth", f"{s['copy_bandwidth_bytes_per_s'] / 1e9:.0f} GB/s")
    console.print(t)
    hbm = Table(title="decode step vs HBM bound (weights + KV read once)")
    for col in ("n_decode", "ctx/seq", "time ms", "bound ms", "time/bound"):
        hbm.add_column(col, justify="right")
    for r in s["decode_vs_hbm_bound"]:
        hbm.add_row(
            str(r["n_decode"]),
            str(r["ctx_per_seq"]),
            f"{r['time_s'] * 1e3:.3f}",
            f"{r['hbm_bound_s'] * 1e3:.3f}",
            f"{r['time_over_bound']:.2f}",
        )
    console.print(hbm)
    if s["table_skipped"]:
        console.print(f"table model not scored: {s['table_skipped']}")
    console.print(f"wrote {Path(args.out) / 'calibration.json'} and profile.csv ({s['wall_time_s']:.0f} s)")
    return 0


def _replay(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from llmsched_gym.backends.gpu.backend import FusedAffineLatency, load_table, replay
    from llmsched_gym.core.latency import make_latency

    models = [make_latency(name) for name in args.latency]
    if args.calibration:
        cal = Path(args.calibration)
        models.append(FusedAffineLatency.from_json(cal / "calibration.json"))
        table, why = load_table(cal / "profile.csv")
        if table is None:
            print(f"table model not scored: {why}")
        else:
            models.append(table)
    s = replay(args.iteration_log, args.model, args.device, args.out, models=models)
    t = Table(title=f"replay of {s['iterations']} iterations: {s['model']} on {s['device']}")
    for col in ("model", "MAPE", "P50 |err| ms", "P90 |err| ms", "bias", "makespan err", "request span P50"):
        t.add_column(col, justify="right")
    for name, m in s["models"].items():
        t.add_row(
            name,
            f"{m['mape']:.1%}",
            f"{m['p50_abs_err_s'] * 1e3:.3f}",
            f"{m['p90_abs_err_s'] * 1e3:.3f}",
            f"{m['bias_rel']:+.1%}",
            f"{m['makespan_rel_err']:+.1%}",
            f"{m['end_to_end']['request_span_rel_err_p50']:.1%}",
        )
    console = Console()
    console.print(t)
    noise = s["noise_band"]
    console.print(
        f"measured makespan {s['measured_makespan_s']:.3f} s; noise band (two passes, per-iteration "
        f"relative difference) P50 {noise['p50']:.1%} P90 {noise['p90']:.1%}"
    )
    console.print(f"wrote {Path(args.out) / 'replay.json'} and replay.csv")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point (the GPU machine may not have the full ``llmsched`` CLI)."""
    parser = argparse.ArgumentParser(prog="llmsched-gpu")
    add_subcommands(parser.add_subparsers(dest="command", required=True), HelpFormatter)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, OSError) as e:  # ConfigError (no GPU, bad input) is a ValueError
        print(f"error: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
