"""Regenerate docs/reliability_inputs.md: every input listed under "Why" in issues 15 and 30, run as a user would.

Each row runs one command in a scratch folder (``llmsched ...`` through the installed CLI, or a
``python -c`` snippet for the Python API) and records the exit code and the line it printed: the
first stderr line of a failing command (with the count of stderr lines when there is more than
one), or the summary line of a run that completed. A Python API row exits 2 and prints
``ConfigError: MESSAGE`` when the project's error type is raised; any other exception gives a
traceback (exit 1).

    python tools/reliability_inputs.py [--issue 15|30|all] [--out docs/reliability_inputs.md]

The runs are serial on one core (OMP/MKL threads 1), each under an 8 GB address-space limit and a
300 s timeout; the whole table takes a few minutes. Issue 30's rows run ``python -m
llmsched_gym.cli`` with this checkout first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--set", "workload.n_requests=50"]
VTC = "arrival_s,client,prompt_tokens,output_tokens\n"
GEN = "arrival_s,prompt_tokens,output_tokens\n"
TRAIN = ["train", "--scenario", "jaillet-low", "--timesteps", "256", "--hp", "n_steps=128", "--hp", "batch_size=64",
         "--n-envs", "1", "--score-every", "0", "--no-progress", "--threads", "1"]


def _api(code: str, catch: str = "ConfigError") -> list[str]:
    """A ``python -c`` command running ``code``; the project's ConfigError (or ``catch``) becomes exit 2
    and one line."""
    return [sys.executable, "-c", "import sys\nfrom llmsched_gym.config import ConfigError\ntry:\n"
            + "".join(f"    {line}\n" for line in code.splitlines())
            + f"except {catch} as e:\n"
            + "    print(f'{type(e).__name__}: {e}', file=sys.stderr); sys.exit(2)\n"]


def cases(d: Path) -> list[tuple[str, str, list[str]]]:
    """(section, input as written in the table, argv) for every input of the issue."""
    (d / "file").write_text("x\n")
    hp = {"syntax": "default: [unclosed\n", "list": "- a\n- b\n", "five": "default: 5\n",
          "gamma": "default: {gamma: 1.5}\n", "k": "default: {env_kwargs: {K: true}}\n"}
    for k, text in hp.items():
        (d / f"hp_{k}.yml").write_text(text)
    (d / "digits.csv").write_text(GEN + "0,5,5\n1,12345678901234567890123,5\n")
    (d / "latin1.csv").write_bytes((GEN + "0,5,5\n1,5,5\n2,\xe9,5\n").encode("latin-1"))
    (d / "dup.csv").write_text("arrival_s,prompt_tokens,output_tokens,prompt_tokens\n0,5,5,6\n")
    (d / "far.csv").write_text(GEN + "0,5,5\n1e300,5,5\n")
    rows = (ROOT.parent / "shared" / "traces" / "vtc_arena_real_trace.csv").read_text().splitlines()[1:301]
    if len(rows) < 300:  # no shared trace: a synthetic one of the same shape
        rows = [f"{0.2 * i:.6f},{i % 27},{20 + i % 50},{10 + i % 30}" for i in range(300)]
    big = [r.split(",") for r in rows]
    big[149][1] = "1000000000"
    (d / "bigid.csv").write_text(VTC + "".join(",".join(r) + "\n" for r in big))

    def run(*a: str) -> list[str]:
        return ["llmsched", "run", "--scenario", "jaillet-low", "--policy", "fcfs", *SMALL, *a]

    def over(field: str, value: str) -> tuple[str, str, list[str]]:
        return ("traceback", f"`--set engine.{field}={value}`", run("--set", f"engine.{field}={value}"))

    t = [over("kv_capacity_tokens", "abc"), over("kv_capacity_tokens", "[1,2]"), over("block_size", "x"),
         over("horizon_s", "abc"), over("max_iterations", "x"), over("block_size.x", "1"),
         ("traceback", "`--set engine.block_size=1.5` (mcsf)",
          ["llmsched", "run", "--scenario", "jaillet-low", "--policy", "mcsf", *SMALL, "--set", "engine.block_size=1.5"]),
         ("traceback", "a trace integer of 23 digits", ["llmsched", "run", "--scenario", f"trace:csv:{d}/digits.csv"])]
    for k, what in (("syntax", "a YAML syntax error"), ("list", "a list"), ("five", "`default: 5`")):
        t.append(("traceback", f"hyperparameter file with {what}",
                  ["llmsched", *TRAIN, "--hyperparams", str(d / f"hp_{k}.yml"), "--out", str(d / "tr")]))
    (d / "dir").mkdir()
    for flag in ("--json", "--log-iterations"):
        t.append(("traceback-run", f"`run {flag}` an existing file (replaced, as an output file is)",
                  run(flag, str(d / "file"))))
        t.append(("traceback", f"`run {flag}` an existing directory", run(flag, str(d / "dir"))))
        t.append(("traceback", f"`run {flag}` a path under a file", run(flag, str(d / "file" / "o"))))
    for sub in ("compare", "evaluate"):
        base = ["llmsched", sub, "--scenario", "jaillet-low", "--policies", "fcfs", "--seeds", "100", *SMALL,
                "--no-plots", "--quiet"]
        t.append(("traceback", f"`{sub} --out` an existing file", [*base, "--out", str(d / "file")]))
        t.append(("traceback", f"`{sub} --out` a path under a file", [*base, "--out", str(d / "file" / "o")]))
    t.append(("traceback", "`train --out` an existing file", ["llmsched", *TRAIN, "--out", str(d / "file")]))
    t.append(("traceback", "`train --out` a path under a file", ["llmsched", *TRAIN, "--out", str(d / "file" / "o")]))
    t.append(("traceback", "`benchmark --out` an existing file",
              ["llmsched", "benchmark", "--quick", "--out", str(d / "file")]))
    t.append(("traceback", "`gym.make(..., scenario=123)`",
              _api("import gymnasium as gym\ngym.make('llmsched_gym:LLMSched-v1', scenario=123)")))
    t.append(("traceback", "`gym.make(..., overrides={\"engine.kv_capacity_tokens\": \"a\"})`",
              _api("import gymnasium as gym\n"
                   "gym.make('llmsched_gym:LLMSched-v1', overrides={'engine.kv_capacity_tokens': 'a'})")))
    t.append(("traceback", "non-UTF-8 trace bytes", ["llmsched", "run", "--scenario", f"trace:csv:{d}/latin1.csv"]))

    s = [("silent", "`--set engine.prefill_emits_token=maybe`", run("--set", "engine.prefill_emits_token=maybe")),
         ("silent", "`--set engine.fast_forward=maybe`", run("--set", "engine.fast_forward=maybe"))]
    for field in ("max_iterations", "stall_iterations", "kv_bytes_per_token"):
        s.append(("silent", f"`--set engine.{field}=-1`", run("--set", f"engine.{field}=-1")))
    s.append(("silent", "`--set engine.kv_capacity_tokens=1000.5`", run("--set", "engine.kv_capacity_tokens=1000.5")))
    s.append(("silent", "hyperparameter file `default: {gamma: 1.5}`",
              ["llmsched", *TRAIN, "--hyperparams", str(d / "hp_gamma.yml"), "--out", str(d / "tr")]))
    s.append(("silent", "`train --hp gamma=1.5`", ["llmsched", *TRAIN, "--hp", "gamma=1.5", "--out", str(d / "tr")]))
    s.append(("silent", "a duplicated CSV column", ["llmsched", "run", "--scenario", f"trace:csv:{d}/dup.csv"]))
    s.append(("silent", "a trace arrival of 1e300", ["llmsched", "run", "--scenario", f"trace:csv:{d}/far.csv"]))
    s.append(("silent", "`gym.make(..., K=True)`", _api("import gymnasium as gym\ngym.make('llmsched_gym:LLMSched-v1', K=True)")))
    s.append(("silent", "`train --K true`", ["llmsched", *TRAIN, "--K", "true", "--out", str(d / "tr")]))
    s.append(("silent", "hyperparameter file `default: {env_kwargs: {K: true}}`",
              ["llmsched", *TRAIN, "--hyperparams", str(d / "hp_k.yml"), "--out", str(d / "tr")]))
    s.append(("silent", "`gym.make(..., flat='no')`",
              _api("import gymnasium as gym\ngym.make('llmsched_gym:LLMSched-v1', flat='no')")))
    step = ("import gymnasium as gym, numpy as np\n"
            "env = gym.make('llmsched_gym:LLMSched-v1', scenario='jaillet-low', action_mode='priority', K=4{})\n"
            "env.reset(seed=0)\ninfo = env.step(np.full(4, 1 + 2j))[-1]\n"
            "print('invalid_actions', info['invalid_actions'], '(a no-op, penalised)')")
    s.append(("silent-run", "a complex action in priority mode (`env.step(np.full(K, 1+2j))`, default `invalid_action='noop'`)",
              _api(step.format(""))))
    s.append(("silent", "the same with `invalid_action='raise'`",
              _api(step.format(", invalid_action='raise'"), "ValueError")))
    s.append(("silent", "`--scenario trace:csv:/no/such/dir/vtc_arena_real_trace.csv`",
              ["llmsched", "run", "--scenario", "trace:csv:/no/such/dir/vtc_arena_real_trace.csv"]))
    s.append(("silent", "`train --name /abs/path` (outside `--out`)",
              ["llmsched", *TRAIN, "--name", str(d / "escaped"), "--out", str(d / "tr")]))

    p = [("planerror", "`--scenario jaillet-high --policy fcfs`",
          ["llmsched", "run", "--scenario", "jaillet-high", "--policy", "fcfs"]),
         ("planerror", "`--policy fcfs --set engine.kv_capacity_tokens=1000` (jaillet-low)",
          ["llmsched", "run", "--scenario", "jaillet-low", "--policy", "fcfs", "--set", "engine.kv_capacity_tokens=1000"]),
         ("planerror", "`--scenario azure-conv --policy echo-bs-e --seed 692495 --set workload.n_requests=121 "
          "--set engine.kv_capacity_tokens=5939 --set engine.block_size=32 --set engine.preempt_mode=swap`",
          ["llmsched", "run", "--scenario", "azure-conv", "--policy", "echo-bs-e", "--seed", "692495", "--set",
           "workload.n_requests=121", "--set", "engine.kv_capacity_tokens=5939", "--set", "engine.block_size=32",
           "--set", "engine.preempt_mode=swap"]),
         ("planerror", "`--scenario jaillet-noisy --policy vtc-oracle --seed 23526 --set workload.n_requests=236 "
          "--set engine.kv_capacity_tokens=8246 --set engine.overflow=forbid`",
          ["llmsched", "run", "--scenario", "jaillet-noisy", "--policy", "vtc-oracle", "--seed", "23526", "--set",
           "workload.n_requests=236", "--set", "engine.kv_capacity_tokens=8246", "--set", "engine.overflow=forbid"]),
         ("planerror", "`--set workload.n_requests=0` (jaillet-low, fcfs)",
          ["llmsched", "run", "--scenario", "jaillet-low", "--policy", "fcfs", "--set", "workload.n_requests=0"]),
         ("oom", "a trace row with client id 1000000000 (300 rows of the vtc-arena trace, `trace:csv`, vtc)",
          ["llmsched", "run", "--scenario", f"trace:csv:{d}/bigid.csv", "--policy", "vtc"])]
    return t + s + p


class _Marker:
    """Unpickling this runs ``touch PATH`` (what an attacker's payload would do, harmlessly)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def craft(folder: Path, marker: Path) -> None:
    """A crafted ``vecnormalize.pkl`` (and ``best_``) and an SB3 ``model.zip`` (and ``best_``) whose
    ``data`` holds the payload where SB3 keeps its cloudpickled objects."""
    folder.mkdir(parents=True, exist_ok=True)
    blob = pickle.dumps(_Marker(marker))
    payload = base64.b64encode(blob).decode()
    data = {"policy_class": {":type:": "<class 'abc.ABCMeta'>", ":serialized:": payload},
            "observation_space": {":type:": "<class 'gymnasium.spaces.dict.Dict'>", ":serialized:": payload}}
    for prefix in ("", "best_"):
        (folder / f"{prefix}vecnormalize.pkl").write_bytes(blob)
        with zipfile.ZipFile(folder / f"{prefix}model.zip", "w") as z:
            z.writestr("data", json.dumps(data))
            z.writestr("_stable_baselines3_version", "2.3.0")


def agent_cases(d: Path) -> list[tuple[str, str, list[str]]]:
    """Train a tiny agent, then put crafted files beside it (A) and in its place (B)."""
    trained = d / "agents" / "genuine"
    subprocess.run(["llmsched", *TRAIN, "--out", str(d / "agents"), "--name", "genuine"], check=True,
                   capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    a, b = d / "A", d / "B"
    shutil.copytree(trained, a)
    craft(a, d / "MARKER")
    shutil.copytree(trained, b)
    for f in b.glob("*model.*"):
        f.unlink()
    craft(b, d / "MARKER")
    ev = ["--scenario", "jaillet-low", "--policies", "none", "--seeds", "100", "--set", "workload.n_requests=10",
          "--no-plots", "--quiet"]

    def evaluate(model: Path, out: str, *extra: str) -> list[str]:
        return ["llmsched", "evaluate", "--model", str(model), *ev, "--out", str(d / out), *extra]

    return [("agent", "agent folder with its safetensors+JSON files and the crafted pickle and zip beside them",
             evaluate(a, "ev1")),
            ("agent", "the same, `--best`", evaluate(a, "ev2", "--best")),
            ("agent", "the same, `--trust-model` (the safe files are still preferred)", evaluate(a, "ev3", "--trust-model")),
            ("agent", "agent folder holding only the crafted `model.zip` and `vecnormalize.pkl`", evaluate(b, "ev4")),
            ("agent", "`--model DIR/model.zip` (crafted)", evaluate(b / "model.zip", "ev5")),
            ("agent", "`--model DIR/vecnormalize.pkl` (crafted)", evaluate(b / "vecnormalize.pkl", "ev6")),
            ("agent-trust", "crafted folder with `--trust-model`", evaluate(b, "ev7", "--trust-model"))]


ISSUE30_SECTIONS = {"trust": "Code from a shared agent folder (a marker file is created if a crafted pickle is unpickled)",
                    "paths": "Writes outside --out", "tb": "Tracebacks",
                    "res": "Resources not bounded before allocation", "silent": "Nonsense accepted silently"}


def _yml(d: Path, name: str, text: str) -> str:
    (d / name).write_text(text)
    return str(d / name)


def _wl(body: str) -> str:
    return f"workload:\n{body}engine: {{kv_capacity_tokens: 16492}}\nlatency: unit\npolicy: fcfs\n"


def _edited_agent(d: Path, name: str, edit) -> str:
    """A copy of the tiny trained agent with ``edit`` applied to its model.json."""
    src, dst = d / "agents" / "genuine", d / name
    shutil.copytree(src, dst)
    for stem in ("model", "best_model"):
        p = dst / f"{stem}.json"
        if p.exists():
            meta = json.loads(p.read_text())
            edit(meta)
            p.write_text(json.dumps(meta))
    return str(dst)


def cases30(d: Path) -> list[tuple[str, str, list[str]]]:
    """(section, input, argv) for every input of issue 30's Why list (agent_cases(d) must have run)."""
    py = [sys.executable, "-m", "llmsched_gym.cli"]
    ev = ["--scenario", "jaillet-low", "--policies", "none", "--seeds", "100", "--set", "workload.n_requests=10",
          "--no-plots", "--quiet"]
    r = [*py, "run", "--policy", "fcfs"]
    rl = d / "R"
    (rl / "rl_module").mkdir(parents=True)
    (rl / "rl_module" / "class_and_ctor_args.pkl").write_bytes(pickle.dumps(_Marker(d / "MARKER")))
    (rl / "rl_module" / "module_state.pkl").write_bytes(pickle.dumps(_Marker(d / "MARKER")))
    (rl / "rl_module" / "metadata.json").write_text(json.dumps(
        {"class_and_ctor_args_file": "class_and_ctor_args.pkl", "state_file": "module_state",
         "ray_version": "2.60.0", "checkpoint_version": "2.1"}))
    (rl / "run.json").write_text(json.dumps({"algo": "rllib-ppo", "scenario": "jaillet-low"}))
    out = [("trust", "RLlib run folder whose `rl_module/class_and_ctor_args.pkl` is crafted, `evaluate --model DIR`",
            [*py, "evaluate", "--model", str(rl), *ev, "--out", str(d / "e30a")]),
           ("trust", "the same, `--model DIR/rl_module`",
            [*py, "evaluate", "--model", str(rl / "rl_module"), *ev, "--out", str(d / "e30b")])]
    # paths
    (d / "tr30").mkdir()
    (d / "tr30b").mkdir()
    (d / "elsewhere").mkdir()
    (d / "tr30" / "link").symlink_to(d / "elsewhere")
    (d / "tr30b" / "jaillet-low-select-s0").symlink_to(d / "elsewhere")
    (d / "dangling").symlink_to(d / "no" / "such" / "target.json")
    (d / "ro").mkdir()
    tr = [*py, *TRAIN[:1], *TRAIN[1:]]
    out += [("paths", "`train --out OUT --name NAME` with OUT/NAME a symlink to another folder",
             [*tr, "--out", str(d / "tr30"), "--name", "link"]),
            ("paths", "the same with the default run name (OUT/jaillet-low-select-s0 a symlink)",
             [*tr, "--out", str(d / "tr30b")]),
            ("paths", "`train --name` with a newline", [*tr, "--out", str(d / "tr30"), "--name", "a\nb"]),
            ("paths", "`run --json` and `--log-iterations` the same file",
             [*r, "--scenario", "jaillet-low", *SMALL, "--json", str(d / "same"), "--log-iterations", str(d / "same")]),
            ("paths", "`run --json` a dangling symlink", [*r, "--scenario", "jaillet-low", *SMALL, "--json", str(d / "dangling")]),
            ("paths", "`compare --out` an unwritable folder (/proc/llmsched, even for root)",
             [*py, "compare", *ev, "--policies", "fcfs", "--out", "/proc/llmsched"]),
            ("paths", "`evaluate --out` a folder holding a symlink to outside (report.md -> ../elsewhere/x)",
             [*py, "evaluate", "--model", str(d / "agents" / "genuine"), *ev, "--out", str(d / "evlink")])]
    (d / "evlink").mkdir()
    (d / "evlink" / "report.md").symlink_to(d / "elsewhere" / "x")
    # tracebacks
    tb = [("`arrival: {type: gamma, rate: 1, cv: 1e200}`",
           _wl("  arrival: {type: gamma, rate: 1, cv: 1e200}\n  n_requests: 50\n  prompt: 10\n  output: 10\n")),
          ("`arrival: {type: round_counts, dist: binomial, B: 2000, p: 0.5}`",
           _wl("  arrival: {type: round_counts, dist: binomial, B: 2000, p: 0.5}\n  n_requests: 200\n  prompt: 10\n  output: 10\n")),
          ("explicit workload with `priority: [[1], [2]]`",
           _wl("  explicit: {arrival_s: [0, 1], prompt_tokens: [5, 5], output_tokens: [3, 3], priority: [[1], [2]]}\n")),
          ("explicit workload with `client: [[1], [2]]`",
           _wl("  explicit: {arrival_s: [0, 1], prompt_tokens: [5, 5], output_tokens: [3, 3], client: [[1], [2]]}\n")),
          ("explicit `prompt_tokens: [5, 99999999999999999999]`",
           _wl("  explicit: {arrival_s: [0, 1], prompt_tokens: [5, 99999999999999999999], output_tokens: [3, 3]}\n"))]
    for i, (label, text) in enumerate(tb):  # B: 2000 is a valid distribution: it must run
        out.append(("tb-run" if i == 1 else "tb", label, [*r, "--scenario", _yml(d, f"tb{i}.yml", text)]))

    def pk(key, value):
        return lambda m: m["policy_kwargs"].update({key: value})

    for name, label, edit in (
            ("ag_unknown", "agent `model.json` with `policy_kwargs: {bogus: 1}`", pk("bogus", 1)),
            ("ag_fe", "agent `model.json` whose features-extractor kwargs have an extra field",
             lambda m: m["policy_kwargs"]["features_extractor_kwargs"].update(bogus=1)),
            ("ag_arch", "agent `model.json` with `net_arch: [1000000000]`", pk("net_arch", [1000000000])),
            ("ag_steps", "agent `model.json` with `n_steps: 1e9`", lambda m: m["hyperparams"].update(n_steps=1e9))):
        out.append(("tb" if name != "ag_steps" else "res", label,
                    [*py, "evaluate", "--model", _edited_agent(d, name, edit), *ev, "--out", str(d / f"ev_{name}")]))
    out += [("res", "`gym.make(..., K=10**7)`",
             _api("import gymnasium as gym\nenv = gym.make('llmsched_gym:LLMSched-v1', scenario='jaillet-low', K=10**7, "
                  "overrides={'workload.n_requests': 50})\nenv.reset(seed=0)\nprint('reset done')")),
            ("res", "`compare --seeds 0-1000000000`",
             [*py, "compare", *ev[:4], "--seeds", "0-1000000000", *ev[6:], "--policies", "fcfs", "--out", str(d / "cs")]),
            ("res", "a scenario file that is a symlink to /dev/zero", [*r, "--scenario", str(d / "zero.yml")]),
            ("res", "`arrival: {type: round_counts, dist: binomial, B: 10000000, p: 0.5}`, 200 requests",
             [*r, "--scenario", _yml(d, "b1e7.yml", _wl("  arrival: {type: round_counts, dist: binomial, B: 10000000, "
                                                         "p: 0.5}\n  n_requests: 200\n  prompt: 10\n  output: 10\n"))])]
    (d / "zero.yml").symlink_to("/dev/zero")
    huge = 2**62
    out += [("silent", "prompt and output lengths of 2^62 (explicit)",
             [*r, "--scenario", _yml(d, "l62.yml", _wl(f"  explicit: {{arrival_s: [0, 1], prompt_tokens: [{huge}, 5], "
                                                        f"output_tokens: [3, {huge}]}}\n"))]),
            ("silent", "`prompt: 2^62` (generated)",
             [*r, "--scenario", _yml(d, "g62.yml", _wl(f"  arrival: {{type: poisson, rate: 1}}\n  n_requests: 50\n"
                                                        f"  prompt: {huge}\n  output: 10\n"))]),
            ("silent", "`--set engine.latency_noise_cv=1e300`",
             [*r, "--scenario", "jaillet-low", *SMALL, "--set", "engine.latency_noise_cv=1e300"]),
            ("silent", "a Poisson rate of 1e-300",
             [*r, "--scenario", "jaillet-low", "--set", "workload.n_requests=200", "--set", "workload.arrival.rate=1e-300"]),
            ("silent", "a scenario file with `engine:` twice",
             [*r, "--scenario", _yml(d, "twice.yml", _wl("  n_requests: 20\n  arrival: {type: poisson, rate: 1}\n"
                                                          "  prompt: 10\n  output: 10\n") + "engine: {block_size: 16}\n")]),
            ("silent", "explicit `prompt_tokens: [5.9, 2.5]`",
             [*r, "--scenario", _yml(d, "frac.yml", _wl("  explicit: {arrival_s: [0, 1], prompt_tokens: [5.9, 2.5], "
                                                         "output_tokens: [3, 3]}\n"))]),
            ("silent-run", "trace timestamps with a time-zone offset (`2023-11-16 18:15:46.68+02:00`)",
             [*r, "--scenario", f"trace:azure:{d / 'tz.csv'}"]),
            ("silent", "`--set engine.prefill_emits_token=yes`",
             [*r, "--scenario", "jaillet-low", *SMALL, "--set", "engine.prefill_emits_token=yes"]),
            ("silent", "YAML alias expansion (a billion laughs, 9 levels of 10)",
             [*r, "--scenario", str(d / "laughs.yml")])]
    (d / "tz.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68+02:00,5,5\n"
                              "2023-11-16 18:15:47.68+02:00,5,5\n")
    lol = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, 10):
        lol.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    (d / "laughs.yml").write_text("\n".join(lol) + "\nworkload: *a9\n")
    return out


SECTIONS = {"agent": "Agent files (a marker file is created if a crafted pickle is ever unpickled)",
            "traceback": "Tracebacks instead of one line", "silent": "Silently accepted",
            "planerror": "Valid configurations that aborted with PlanError", "oom": "Memory", **ISSUE30_SECTIONS}


LIMIT_GB = 8
LIMIT_S = 300


def _limit() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_GB * 2**30, LIMIT_GB * 2**30))


def outcome(argv: list[str], cwd: Path) -> tuple[int, str, int, float, str]:
    """Exit code, the line to report, stderr line count, wall seconds and peak RSS of one command
    (run under an address-space limit of LIMIT_GB and a timeout of LIMIT_S: rc 124 when it ran out)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "COLUMNS": "200",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    t0 = time.perf_counter()
    tm = ["/usr/bin/time", "-f", "@@time %e %M"] if Path("/usr/bin/time").exists() else []
    proc = subprocess.Popen([*tm, *argv], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_limit, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # its own session: the command and its children
        proc.communicate()
        return 124, f"(killed after {LIMIT_S} s)", 1, float(LIMIT_S), "?"
    p = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
    wall = time.perf_counter() - t0
    err = [x for x in p.stderr.splitlines() if x.strip()]
    rss = ""
    if err and err[-1].startswith("@@time"):
        _, secs, kb = err.pop().split()
        wall, rss = float(secs), f"{int(kb) / 1024:.0f} MB"
    err = [x for x in err if not x.startswith("Command exited with non-zero status")]
    if p.returncode != 0 or not p.stdout.strip():
        line = err[0] if err else (p.stdout.strip().splitlines() or [""])[0]
        if len(err) > 1:
            line = f"{line} … {err[-1]} ({len(err)} stderr lines)"
        return p.returncode, line, len(err), wall, rss
    out = p.stdout.splitlines()
    row = next((x for x in out if "arrived / completed" in x), None)
    line = " ".join(re.sub(r"[│┃]", " ", row if row else out[-1]).split())
    if err:
        line = f"{line} (stderr: {err[0]}{' …' if len(err) > 1 else ''})"
    return p.returncode, line, len(err), wall, rss


HEADER15 = ["## Issue 15", "",
            "The agent rows evaluate a tiny trained agent (`llmsched train --timesteps 256`) next to a",
            "crafted `vecnormalize.pkl` and SB3 `model.zip` whose pickles run `touch MARKER` when loaded."]
HEADER30 = ["## Issue 30", "",
            "The trust rows evaluate an RLlib run folder whose `rl_module/` pickles run `touch MARKER` when",
            "loaded; the agent-file rows edit the `model.json` of the tiny trained agent. Each command runs",
            f"under an {LIMIT_GB} GB address-space limit and a {LIMIT_S} s timeout (what the whole-surface fuzzer",
            "allows), so a row that would allocate without bound fails here instead of taking the machine.", "",
            "The bounds every input is checked against before anything is allocated (each an error naming the",
            "field and the bound, exit 2):", "",
            "| input | bound | where |", "|---|---|---|",
            "| prompt / output tokens of one request (traces, generated, explicit) | 2,147,483,647 | "
            "`llmsched_gym.core.request.MAX_TOKENS` |",
            "| arrival time (traces and generated workloads alike) | 1e9 s | `core.request.MAX_ARRIVAL_S` |",
            "| requests in a workload | 100,000,000 | `config.MAX_REQUESTS` |",
            "| gamma arrival `cv` | 100 | `core.workload.MAX_CV` |",
            "| round-count `B` (binomial, uniform) | 100,000 | `core.workload.MAX_ROUND_B` |",
            "| `engine.latency_noise_cv` | 10 | `config.ENGINE` |",
            "| env `K` (queue slots) | 4,096 | `env.settings.MAX_K` |",
            "| seeds of one `compare`/`evaluate` | 10,000 | `agents.report.MAX_SEEDS` |",
            "| layer width / layers in `policy_kwargs` (hyperparameter and agent files) | 4,096 / 16 | "
            "`config.MAX_WIDTH`, `config.MAX_LAYERS` |",
            "| `n_steps`, `batch_size` / `n_envs` / `n_epochs` | 2^20 / 256 / 10,000 | `config.HYPERPARAMS` |",
            "| YAML file / values after alias expansion | 16 MiB / 1,000,000 | `config.MAX_YAML_BYTES`, "
            "`config.MAX_YAML_NODES` |",
            "| trace file / `table:` latency file / agent JSON / agent weights | 4 GiB / 256 MiB / 64 MiB / 4 GiB | "
            "`core.traces.MAX_TRACE_BYTES`, `TableLatency.from_csv`, `agents.storage` |",
            "| a run name (`--name`) | `[A-Za-z0-9][A-Za-z0-9._+=@,-]{0,127}` | `config.SAFE_NAME` |", "",
            "Also: a YAML key given twice is an error; only `true`/`false` are booleans (`yes`, `on` stay",
            "strings); a float where an integer is meant is an error; trace timestamps are ISO 8601 with an",
            "optional offset (converted to UTC; all rows with one or none); a device or pipe is never read; a",
            "relative output path may not leave the working folder through a symbolic link, and no symbolic",
            "link inside an output folder may lead outside it. An exception that is not about the input",
            "reaches the top as one line `error: internal error (...) in FUNCTION (FILE:LINE)` with exit 70."]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "reliability_inputs.md"))
    ap.add_argument("--issue", choices=("15", "30", "all"), default="all", help="which issue's Why list to run")
    args = ap.parse_args()
    lines = ["# Every input listed under \"Why\" in issues 15 and 30, and what it gives now", "",
             "Generated by `python tools/reliability_inputs.py` (each command run in a scratch folder; the",
             "trace, scenario and hyperparameter files are written there). `--set workload.n_requests=50` keeps",
             "the override rows short. Python API rows (`gym.make`, `env.step`) print `ConfigError: MESSAGE`",
             "and exit 2 when the project's error type is raised; any other exception would be a traceback",
             "(exit 1). Bad input passes with exit code 2 and one stderr line; a valid configuration with a",
             "completed run (exit 0) or exit code 2 and one line. The last column is wall time and peak RSS.", ""]
    with tempfile.TemporaryDirectory(prefix="llmsched-inputs-") as tmp:
        d = Path(tmp)
        section = None
        bad = 0
        marker = d / "MARKER"
        rows = agent_cases(d)
        if args.issue in ("15", "all"):
            lines += HEADER15
            rows15 = [*rows, *cases(d)]
        else:
            rows15 = []
        rows30 = cases30(d) if args.issue in ("30", "all") else []
        for kind, label, argv in [*rows15, ("header30", "", []), *rows30]:
            if kind == "header30":
                if rows30:
                    lines += ["", *HEADER30]
                continue
            sec, _, expect = kind.partition("-")  # "-run": the correct outcome is a completed run
            if sec != section:
                section = sec
                last = "marker created" if sec == "agent" else "marker; s, peak RSS" if sec == "trust" else "s, peak RSS"
                lines += ["", f"### {SECTIONS[sec]}", "", f"| input | exit code | output line | {last} |",
                          "|---|---|---|---|"]
            rc, line, n_err, wall, rss = outcome(argv, d)
            # bad input: exit 2 and one line; a valid configuration: a run, or exit 2 and one line
            if sec in ("agent", "trust"):  # no marker, except with --trust-model (after a one-line warning)
                pwned = marker.exists()
                marker.unlink(missing_ok=True)
                ok = pwned if expect == "trust" else not pwned and (rc == 0 or (rc == 2 and n_err == 1))
                last = "yes" if pwned else "no"
                if sec == "trust":
                    last += f"; {wall:.1f} s, {rss}"
                results = Path(argv[argv.index("--out") + 1]) / "results.json"
                if rc == 0 and results.exists():
                    runs = json.loads(results.read_text())["runs"]
                    line = "evaluated: " + ", ".join(sorted({r["policy"] for r in runs}))
            else:
                if expect == "run":  # a completed run, without warnings
                    ok = rc == 0 and n_err == 0
                else:
                    ok = (rc == 2 and n_err == 1) or (rc == 0 and sec in ("planerror", "oom"))
                last = f"{wall:.1f} s, {rss}"
            if sec == "paths":  # nothing written outside the scratch folder's own files
                ok = ok and not any((d / "elsewhere").iterdir()) and not (d / "no").exists()
            bad += not ok
            line = line.replace(tmp, "TMP").replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {label} | {rc}{'' if ok else ' ✗'} | {line} | {last} |")
            print(f"{rc:>3} {'ok ' if ok else 'BAD'} {label}: {line}", flush=True)
    lines += ["", f"{bad} row(s) fail the rule (marked ✗)." if bad else "Every row passes the rule.", ""]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines))
    print(f"wrote {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
