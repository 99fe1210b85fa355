"""``llmsched bench``: how fast the simulator and the env run on this machine.

Engine section: the Azure-conv trace (19,366 requests with their own arrival times) on the
Llama-2-7B/A100 roofline preset with paged KV and FCFS, reporting simulated requests/s,
iterations/s, setup time (start to first iteration) and the wall time of the whole
``llmsched run`` process. Env section: env steps/s of the default action mode with random
masked actions on jaillet-high and azure-conv.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any


def _best(fn, repeats: int):
    best = None
    for _ in range(repeats):
        r = fn()
        if best is None or r["wall_s"] < best["wall_s"]:
            best = r
    return best


def bench_engine(scenario: str = "azure-conv", policy: str = "fcfs", repeats: int = 3) -> dict[str, Any]:
    from llmsched_gym.sim import make_engine

    def once() -> dict[str, Any]:
        t0 = time.perf_counter()
        engine, _ = make_engine(scenario, policy, seed=0)
        setup = time.perf_counter() - t0
        t1 = time.perf_counter()
        engine.run()
        run = time.perf_counter() - t1
        return {"wall_s": setup + run, "setup_s": setup, "run_s": run, "requests": engine.n,
                "iterations": engine.n_iterations, "completed": engine.n_completed}

    r = _best(once, repeats)
    r["sim_requests_per_s"] = r["requests"] / r["run_s"]
    r["sim_iterations_per_s"] = r["iterations"] / r["run_s"]
    r["requests_per_s_incl_setup"] = r["requests"] / r["wall_s"]
    return r


def bench_process(scenario: str = "azure-conv", policy: str = "fcfs", repeats: int = 3) -> dict[str, Any]:
    """Wall time of the whole ``llmsched run`` process (interpreter start included)."""
    cmd = [sys.executable, "-m", "llmsched_gym.cli", "run", "--scenario", scenario, "--policy", policy, "--quiet"]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, env={**os.environ, "PYTHONHASHSEED": "0"})
        times.append(time.perf_counter() - t0)
    return {"process_wall_s": min(times), "command": " ".join(["llmsched"] + cmd[3:])}


def bench_import() -> dict[str, Any]:
    code = "import time; t=time.perf_counter(); import llmsched_gym, sys; print(time.perf_counter()-t); " \
           "print(int(any(m in sys.modules for m in ('torch','stable_baselines3','matplotlib'))))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    return {"import_s": float(out[0]), "heavy_modules_imported": bool(int(out[1]))}


ENV_SCENARIOS = ("jaillet-high", "azure-conv")
"""Scenarios of the env section (1,000-request episodes each)."""


def run_bench(quick: bool = False, sections: list[str] | None = None) -> dict[str, Any]:
    from rich.console import Console
    from rich.table import Table

    sections = sections or ["engine", "env"]
    con = Console()
    report: dict[str, Any] = {"python": sys.version.split()[0], "cpu_count": os.cpu_count()}
    if "engine" in sections:
        eng = bench_engine(repeats=1 if quick else 3)
        eng.update(bench_process(repeats=1 if quick else 3))
        eng.update(bench_import())
        report["engine"] = eng
        t = Table(title="engine: azure-conv, FCFS, Llama-2-7B/A100 roofline, paged KV")
        t.add_column("metric")
        t.add_column("value", justify="right")
        for k in ("requests", "iterations", "setup_s", "run_s", "sim_requests_per_s", "sim_iterations_per_s",
                  "requests_per_s_incl_setup", "process_wall_s", "import_s", "heavy_modules_imported"):
            v = eng[k]
            t.add_row(k, f"{v:,.3f}" if isinstance(v, float) else str(v))
        con.print(t)
    if "env" in sections:
        try:
            from llmsched_gym.env.bench import bench_env
        except ImportError:
            con.print("env: not available")
        else:
            steps = 5_000 if quick else 50_000
            runs = {sc: bench_env(sc, steps=steps) for sc in ENV_SCENARIOS}
            report["env"] = runs
            t = Table(title=f"env: LLMSched-v0 default mode (select), random masked actions, {steps:,} steps, one core")
            keys = ("n_requests", "episodes", "iterations", "requests_completed", "wall_s", "steps_per_s",
                    "steps_per_cpu_s")
            t.add_column("metric")
            for sc in runs:
                t.add_column(sc, justify="right")
            for k in keys:
                t.add_row(k, *(f"{r[k]:,.3f}" if isinstance(r[k], float) else str(r[k]) for r in runs.values()))
            con.print(t)
    return report
