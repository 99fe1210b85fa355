"""``llmsched bench``: how fast the simulator and the env run on this machine.

Sections (``--only``, repeatable; the default runs engine and env):

* ``engine``: the Azure-conv trace (19,366 requests with their own arrival times; its synthetic
  stand-in where the trace is absent, said in the title) on the scenario's batch-time model
  (``calibrated:llama-2-7b/a100``) with paged KV and FCFS, reporting simulated requests/s,
  iterations/s, setup time (start to first iteration) and the wall time of the whole
  ``llmsched run`` process.
* ``overload``: jaillet-high with MC-SF (arrivals at 50/s, about five times what the worker
  serves, so the queue grows without bound) at 10k, 100k and 1M requests: the engine's CPU
  seconds per request must stay flat as the queue grows (``--quick``: 2k and 20k).
* ``memory``: steady load (jaillet-high at 8 arrivals/s, the default policy) at 1M requests: the
  peak RSS of the whole ``llmsched run`` process and its bytes per request (``--quick``: 100k).
* ``env``: env steps/s of the default action mode with random masked actions on jaillet-high and
  azure-conv.
* ``train``: end-to-end training speed (env + policy + PPO update: ``model.learn``) of ``llmsched
  train --scenario azure-conv --action-mode M --timesteps 16384 --score-every 0 --threads 1`` for
  every action mode ``M``, each in a fresh process on one core: with SB3's ``DummyVecEnv`` of
  single envs (``--vec dummy``, the recipe's ``n_envs``), with the native vector env at the same
  ``n_envs`` (``--vec native``, the same computation) and with the native vector env at 16 envs and
  the same rollout size (``n_steps`` scaled down: a different recipe). Steps per second of
  ``learn`` by wall clock and per CPU second, and the start-up (interpreter, imports, envs,
  model, and the interpreter's exit: the process's wall time outside ``learn``) apart, and the
  whole process's steps per CPU second (what one quiet core would give end to end; the wall figures
  grow with the machine's load) (``--quick``: 2,048 steps). No behaviour
  cloning (``--bc-from none``: a recipe's teacher may not be expressible in another action mode).
* ``sweep``: the wall time of one ``llmsched compare`` sweep (:data:`SWEEP`, 20 cells) run
  serially, with ``--jobs 2`` and, when the ray extra is installed, on a local Ray instance with 2
  CPUs, the records checked equal; the speed-ups over the serial run and the load average (other
  processes sharing the cores make the speed-up smaller).

Each case runs in a fresh process, one core each; take the minimum over repeated runs on a
shared machine.
"""

from __future__ import annotations

import json
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


_OVERLOAD = """
import json, sys, time
from llmsched_gym.sim import make_engine
engine, _ = make_engine("jaillet-high", "mcsf", seed=0, overrides={"workload.n_requests": int(sys.argv[1])})
t0 = time.process_time()
engine.run()
cpu = time.process_time() - t0
print(json.dumps({"requests": engine.n, "completed": engine.n_completed, "iterations": engine.n_iterations,
                  "run_cpu_s": cpu}))
"""

# a fresh process whose only child is the ``llmsched run`` process: RUSAGE_CHILDREN is that one's peak RSS
_MEMORY = """
import json, resource, subprocess, sys, time
t0 = time.perf_counter()
subprocess.run([sys.executable, "-m", "llmsched_gym.cli", "run", "--scenario", "jaillet-high",
                "--set", "workload.arrival.rate=8", "--set", f"workload.n_requests={sys.argv[1]}", "--quiet"],
               check=True)
print(json.dumps({"wall_s": time.perf_counter() - t0,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def _fresh_process(code: str, *args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONHASHSEED": "0"}).stdout
    return json.loads(out.strip().splitlines()[-1])


def bench_overload(sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000)) -> dict[str, Any]:
    """jaillet-high + MC-SF at growing sizes: engine CPU seconds per request (one fresh process each)."""
    runs = {}
    for n in sizes:
        r = _fresh_process(_OVERLOAD, str(n))
        r["cpu_us_per_request"] = 1e6 * r["run_cpu_s"] / n
        runs[n] = r
    first, last = runs[sizes[0]], runs[sizes[-1]]
    return {"runs": runs, "cost_ratio_largest_to_smallest": last["cpu_us_per_request"] / first["cpu_us_per_request"]}


def bench_memory(n: int = 1_000_000) -> dict[str, Any]:
    """Peak RSS of a whole ``llmsched run`` at steady load (jaillet-high, 8 arrivals/s); the bytes
    per request are the growth over a run ten times smaller (the interpreter and imports apart)."""
    small = _fresh_process(_MEMORY, str(n // 10))
    r = _fresh_process(_MEMORY, str(n))
    r["requests"] = n
    r["bytes_per_request"] = (r["peak_rss_mb"] - small["peak_rss_mb"]) * 2**20 / (n - n // 10)
    return r


def bench_import() -> dict[str, Any]:
    code = "import time; t=time.perf_counter(); import llmsched_gym, sys; print(time.perf_counter()-t); " \
           "print(int(any(m in sys.modules for m in ('torch','stable_baselines3','matplotlib'))))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    return {"import_s": float(out[0]), "heavy_modules_imported": bool(int(out[1]))}


SWEEP = {"scenario": "jaillet-low", "policies": ["sjf", "mcsf", "semi-online", "vllm-v1"], "seeds": [0, 1, 2, 3, 4]}
"""The sweep section's compare: 4 policies x 5 seeds, one cell each."""


def bench_sweep(jobs: int = 2, repeats: int = 3) -> dict[str, Any]:
    """Serial, ``jobs`` local processes and Ray (if installed): the minimum wall time of each over
    ``repeats`` interleaved rounds, and the speed-ups; the records are checked equal."""
    from agents.report import run_baselines
    from llmsched_gym.parallel import Settings

    def sweep(settings: Settings) -> tuple[float, list]:
        t0 = time.perf_counter()
        records, _ = run_baselines(SWEEP["scenario"], SWEEP["policies"], SWEEP["seeds"], [1.0], settings=settings)
        return time.perf_counter() - t0, [(r.policy, r.seed, r.metrics()) for r in records]

    variants = {"serial": Settings(jobs=1), f"jobs={jobs}": Settings(jobs=jobs)}
    ray = None
    try:
        import ray
    except ImportError:
        pass
    else:
        ray.init(num_cpus=jobs, include_dashboard=False, log_to_driver=False, configure_logging=False)
        variants[f"ray ({jobs} CPUs)"] = Settings(backend="ray")
    times: dict[str, list[float]] = {k: [] for k in variants}
    reference = None
    try:
        for _ in range(repeats):
            for name, settings in variants.items():
                wall, records = sweep(settings)
                times[name].append(wall)
                reference = reference or records
                if records != reference:
                    raise RuntimeError(f"sweep: {name} gave other records than the serial run")
    finally:
        if ray is not None:
            ray.shutdown()
    best = {k: min(v) for k, v in times.items()}
    return {"cells": len(SWEEP["policies"]) * len(SWEEP["seeds"]), "min_wall_s": best, "all_wall_s": times,
            "speedup": {k: best["serial"] / v for k, v in best.items() if k != "serial"},
            "loadavg_1min": os.getloadavg()[0]}


TRAIN_MODES = ("priority", "select", "subset", "knob", "meta", "tune")
"""The train section's action modes (the goal of the training-speed issue is priority mode's)."""


def train_variants(scenario: str, mode: str, n_envs: int = 16, base_envs: int | None = None,
                   hyperparams: dict[str, Any] | None = None) -> list[tuple[str, list[str]]]:
    """The train section's runs of one action mode: (label, extra ``llmsched train`` arguments):
    ``dummy`` and ``native`` at the recipe's ``n_envs`` (``base_envs`` if given), and ``native xN``
    at ``n_envs`` envs with ``n_steps`` scaled so that a rollout keeps the recipe's size."""
    from agents.train import TrainConfig, resolve

    hp = resolve(TrainConfig(scenario=scenario, env_kwargs={"action_mode": mode}, n_envs=base_envs,
                             hyperparams=dict(hyperparams or {})))
    envs, steps = int(hp.get("n_envs", 1)), int(hp.get("n_steps", 2048))
    scaled = max(1, envs * steps // n_envs)
    # a per-slot action_bias (priority's ramp) has no meaning in the knob and tune modes: zero there
    fix = ["--hp", "action_bias=0"] if isinstance(hp.get("action_bias"), list) and mode in ("knob", "tune") else []
    return [("dummy", [*fix, "--vec", "dummy"]), ("native", [*fix, "--vec", "native"]),
            (f"native x{n_envs}", [*fix, "--vec", "native", "--n-envs", str(n_envs), "--hp", f"n_steps={scaled}"])]


def bench_train(scenario: str = "azure-conv", modes: tuple[str, ...] = TRAIN_MODES, timesteps: int = 16_384,
                n_envs: int = 16, base_envs: int | None = None, hyperparams: dict[str, Any] | None = None,
                overrides: dict[str, Any] | None = None, repeats: int = 1) -> dict[str, Any]:
    """``llmsched train`` per action mode and vec env (:func:`train_variants`), each in a fresh
    process with one torch thread; ``repeats`` interleaved rounds, the fastest ``learn`` (CPU) of
    each kept. ``base_envs``, ``hyperparams`` and ``overrides`` go to every run (``--n-envs``,
    ``--hp``, ``--set``; the ``native xN`` run's ``--n-envs`` and ``n_steps`` apart)."""
    import resource
    import tempfile

    extra = [*(["--n-envs", str(base_envs)] if base_envs else []),
             *[a for k, v in (hyperparams or {}).items() for a in ("--hp", f"{k}={v}")],
             *[a for k, v in (overrides or {}).items() for a in ("--set", f"{k}={v}")]]
    runs: dict[str, dict[str, dict[str, Any]]] = {m: {} for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        plan = [(m, label, args) for m in modes
                for label, args in train_variants(scenario, m, n_envs, base_envs, hyperparams)]
        for r in range(repeats):
            for i, (mode, label, args) in enumerate(plan):
                name = f"r{r}-{i}"
                cmd = [sys.executable, "-m", "llmsched_gym.cli", "train", "--scenario", scenario, "--action-mode", mode,
                       "--timesteps", str(timesteps), "--score-every", "0", "--threads", "1", "--out", tmp,
                       "--name", name, "--no-progress", "--bc-from", "none", *extra, *args]
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.perf_counter()
                subprocess.run(cmd, check=True, capture_output=True, text=True,
                               env={**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"})
                wall = time.perf_counter() - t0
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                with open(os.path.join(tmp, name, "run.json")) as f:
                    meta = json.load(f)
                cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
                steps = int(meta["timesteps"])
                rec = {"steps": steps, "n_envs": int(meta["n_envs"]), "n_steps": int(meta["hyperparams"]["n_steps"]),
                       "learn_wall_s": meta["learn_wall_s"], "learn_cpu_s": meta["learn_cpu_s"],
                       "startup_wall_s": wall - meta["learn_wall_s"], "process_wall_s": wall, "process_cpu_s": cpu,
                       "steps_per_s": steps / meta["learn_wall_s"], "steps_per_cpu_s": steps / meta["learn_cpu_s"],
                       "steps_per_s_incl_startup": steps / wall, "steps_per_cpu_s_incl_startup": steps / cpu,
                       "command": " ".join(["llmsched", *cmd[3:]]),
                       "workload": (meta.get("workload") or {}).get("title", scenario)}
                best = runs[mode].get(label)
                if best is None or rec["learn_cpu_s"] < best["learn_cpu_s"]:
                    runs[mode][label] = rec
    return {"scenario": scenario, "timesteps": timesteps, "runs": runs, "loadavg_1min": os.getloadavg()[0]}


ENV_SCENARIOS = ("jaillet-high", "azure-conv")
"""Scenarios of the env section (1,000-request episodes each)."""


def _engine_section(con: Any, quick: bool) -> dict[str, Any] | None:
    """``engine``: the Azure-conv run in this process and as a whole ``llmsched run``, the imports."""
    from rich.table import Table

    from llmsched_gym.sim import what_runs

    eng = bench_engine(repeats=1 if quick else 3)
    eng.update(bench_process(repeats=1 if quick else 3))
    eng.update(bench_import())
    eng.update(what_runs("azure-conv"))  # the real trace or its stand-in, and the latency model
    t = Table(title=f"engine: {eng['title']}, FCFS, paged KV")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k in ("requests", "iterations", "setup_s", "run_s", "sim_requests_per_s", "sim_iterations_per_s",
              "requests_per_s_incl_setup", "process_wall_s", "import_s", "heavy_modules_imported"):
        v = eng[k]
        t.add_row(k, f"{v:,.3f}" if isinstance(v, float) else str(v))
    con.print(t)
    return eng


def _overload_section(con: Any, quick: bool) -> dict[str, Any] | None:
    """``overload``: the engine's CPU time per request as the queue grows."""
    from rich.table import Table

    ov = bench_overload((2_000, 20_000) if quick else (10_000, 100_000, 1_000_000))
    t = Table(title="overload: jaillet-high, MC-SF, 50 arrivals/s (the queue grows), fresh process each")
    for col in ("requests", "iterations", "run CPU s", "CPU us / request"):
        t.add_column(col, justify="right")
    for n, r in ov["runs"].items():
        t.add_row(f"{n:,}", f"{r['iterations']:,}", f"{r['run_cpu_s']:.2f}", f"{r['cpu_us_per_request']:.1f}")
    con.print(t)
    con.print(f"cost per request, largest / smallest: {ov['cost_ratio_largest_to_smallest']:.2f}")
    return ov


def _memory_section(con: Any, quick: bool) -> dict[str, Any] | None:
    """``memory``: peak RSS of a whole ``llmsched run`` at steady load."""
    mem = bench_memory(100_000 if quick else 1_000_000)
    con.print(f"memory: jaillet-high at 8 arrivals/s, {mem['requests']:,} requests, whole `llmsched run`: "
              f"peak RSS {mem['peak_rss_mb']:,.0f} MB ({mem['bytes_per_request']:,.0f} bytes/request), "
              f"{mem['wall_s']:.1f} s")
    return mem


def _env_section(con: Any, quick: bool) -> dict[str, Any] | None:
    """``env``: env steps/s with random masked actions (None where the env cannot be imported)."""
    from rich.table import Table

    from llmsched_gym.sim import what_runs

    try:
        from llmsched_gym.env.bench import bench_env
    except ImportError:
        con.print("env: not available")
        return None
    steps = 5_000 if quick else 50_000
    runs = {sc: {**bench_env(sc, steps=steps), **what_runs(sc)} for sc in ENV_SCENARIOS}
    t = Table(title=f"env: LLMSched-v1 default mode (select), random masked actions, {steps:,} steps, one core")
    keys = ("n_requests", "episodes", "iterations", "requests_completed", "wall_s", "steps_per_s",
            "steps_per_cpu_s")
    t.add_column("metric")
    for sc in runs:
        t.add_column(runs[sc]["title"], justify="right")
    for k in keys:
        t.add_row(k, *(f"{r[k]:,.3f}" if isinstance(r[k], float) else str(r[k]) for r in runs.values()))
    t.add_row("steps: admit / launch / preempt", *(
        " / ".join(f"{x:.0%}" for x in r["step_mix"].values()) for r in runs.values()))
    con.print(t)
    return runs


def _train_section(con: Any, quick: bool) -> dict[str, Any] | None:
    """``train``: ``llmsched train`` per action mode and vec env."""
    from rich.table import Table

    tr = bench_train(timesteps=2_048 if quick else 16_384)
    # a missing trace makes every run train on the synthetic stand-in: the title says so
    shown = sorted({r.get("workload", tr["scenario"]) for by_vec in tr["runs"].values() for r in by_vec.values()})
    t = Table(title=f"train: llmsched train --scenario {tr['scenario']} --timesteps {tr['timesteps']:,} "
                    f"--score-every 0 --threads 1, fresh process each (load average {tr['loadavg_1min']:.1f} "
                    f"on {os.cpu_count()} cores); workload: {', '.join(shown)}")
    for col in ("action mode", "vec env", "envs x steps", "learn steps/s", "steps/CPU-s", "vs dummy (CPU)",
                "start-up s", "steps/s incl. start-up", "steps/CPU-s incl. start-up"):
        t.add_column(col, justify="right" if col not in ("action mode", "vec env") else "left")
    for mode, by_vec in tr["runs"].items():
        ref = by_vec.get("dummy")
        for label, r in by_vec.items():
            t.add_row(mode, label, f"{r['n_envs']} x {r['n_steps']}", f"{r['steps_per_s']:,.0f}",
                      f"{r['steps_per_cpu_s']:,.0f}",
                      f"{r['steps_per_cpu_s'] / ref['steps_per_cpu_s']:.2f}x" if ref else "",
                      f"{r['startup_wall_s']:.1f}", f"{r['steps_per_s_incl_startup']:,.0f}",
                      f"{r['steps_per_cpu_s_incl_startup']:,.0f}")
    con.print(t)
    return tr


def _sweep_section(con: Any, quick: bool) -> dict[str, Any] | None:
    """``sweep``: one ``llmsched compare`` sweep serially, on processes and on Ray."""
    from rich.table import Table

    sw = bench_sweep(repeats=1 if quick else 3)
    t = Table(title=f"sweep: compare on {SWEEP['scenario']}, {sw['cells']} cells (min over rounds; load "
                    f"average {sw['loadavg_1min']:.1f} on {os.cpu_count()} cores)")
    t.add_column("run")
    t.add_column("wall (s)", justify="right")
    t.add_column("speed-up", justify="right")
    for k, v in sw["min_wall_s"].items():
        t.add_row(k, f"{v:.2f}", f"{sw['speedup'].get(k, 1.0):.2f}x")
    con.print(t)
    return sw


SECTIONS = ("engine", "overload", "memory", "env", "train", "sweep")
"""The sections of ``llmsched bench`` in the order they run (``--only``)."""


def run_bench(quick: bool = False, sections: list[str] | None = None) -> dict[str, Any]:
    """Run the ``sections`` (default: engine and env) in :data:`SECTIONS`' order, printing a table
    for each; returns the report (``--json``)."""
    from rich.console import Console

    sections = sections or ["engine", "env"]
    con = Console()
    report: dict[str, Any] = {"python": sys.version.split()[0], "cpu_count": os.cpu_count()}
    step = {"engine": _engine_section, "overload": _overload_section, "memory": _memory_section,
            "env": _env_section, "train": _train_section, "sweep": _sweep_section}
    for name in SECTIONS:
        if name in sections:
            result = step[name](con, quick)
            if result is not None:
                report[name] = result
    return report
