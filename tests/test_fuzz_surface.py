"""The whole-surface fuzzer: CLI flags, scenario YAML, trace files and agent files, each mutated.

Every case runs ``llmsched`` in this process (:func:`llmsched_gym.cli.main`; a subprocess would
spend a second starting) from a scratch working folder, on a small workload, and must keep the rule:

* exit 0 with a complete summary (``run``: the ``--json`` summary with every request accounted for:
  completed + rejected + unfinished = arrived; ``evaluate``: ``results.json`` with the agent's runs),
  or exit 2 with exactly one stderr line ``error: ...``;
* never a traceback (an exception reaching the top is "internal error", exit 70: a failure here),
  never a NumPy ``RuntimeWarning`` (overflow, invalid value);
* never more than :data:`MAX_CASE_S` seconds for one case, never more than :data:`MAX_RSS_GB` GB of
  peak memory over the whole run;
* never a file outside the output folder (``out/`` in the working folder): a folder ``outside/`` beside
  the working folder, which symbolic links planted in ``out/`` point to, must stay empty.

The cases are drawn from a seeded generator: CI runs :data:`CASES` of them (200, about 15 s on two cores); run it
longer locally with ``LLMSCHED_FUZZ_SURFACE=2000 python -m pytest tests/test_fuzz_surface.py``
(``LLMSCHED_FUZZ_SEED`` picks another sequence). A failing case is printed as its kind and argv.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import resource
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmsched_gym.cli import main
from llmsched_gym.core.scenarios import get_scenario, scenario_yaml

CASES = int(os.environ.get("LLMSCHED_FUZZ_SURFACE", "200"))
SEED = int(os.environ.get("LLMSCHED_FUZZ_SEED", "20261126"))
MAX_CASE_S = 60.0
MAX_RSS_GB = 3.0
SMALL = ["--set", "workload.n_requests=20", "--set", "engine.max_iterations=20000"]

NASTY: list[Any] = [
    0, -1, 1, 2**31, 2**62, 2**64, 99999999999999999999, 1e300, -1e300, 1e-300, 0.5, 5.9, float("nan"),
    float("inf"), True, False, None, "", "yes", "no", "abc", "1e400", "0x10", "\n", "é", "../../x", [], [1, 2],
    [[1], [2]], {}, {"a": 1}, [1e300], "*a", "&a", "{", "[", "~", "null", "- x", "a: b",
]
SCENARIOS = ["jaillet-low", "azure-conv", "vtc-arena", "klpm-toy", "wait-high", "nested-synth4", "jaillet-noisy"]
POLICIES = ["fcfs", "sjf", "vtc", "mcsf", "sarathi", "lpm", "echo", "wait", "vllm-v1", "k-lpm", "nosuch", "",
            "sarathi:chunk_size=abc", "fcfs:x=1"]
SET_KEYS = ["engine.kv_capacity_tokens", "engine.block_size", "engine.prefill_emits_token", "engine.overflow",
            "engine.preempt_mode", "engine.latency_noise_cv", "engine.horizon_s", "engine.swap_gb_s",
            "engine.kv_bytes_per_token", "engine.stall_iterations", "engine.overflow_beta", "engine.fast_forward",
            "workload.arrival.rate", "workload.arrival.type", "workload.prompt", "workload.output",
            "workload.prompt.max", "workload.predictor", "latency", "policy.chunk_size", "policy.x", "engine",
            "workload", "nosuch.key", "engine.block_size.x", "workload.arrival.cv", "workload.seed"]


def _value_text(rng: np.random.Generator) -> str:
    v = NASTY[rng.integers(len(NASTY))]
    return v if isinstance(v, str) else json.dumps(v)


def _mutate_tree(tree: Any, rng: np.random.Generator) -> Any:
    """A copy of ``tree`` with one node replaced by a nasty value, deleted, or given an unknown key."""
    tree = copy.deepcopy(tree)
    node, path = tree, []
    while isinstance(node, dict | list) and node and rng.random() < 0.7:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        k = keys[rng.integers(len(keys))]
        if not isinstance(node[k], dict | list) or not node[k]:
            break
        path.append(k)
        node = node[k]
    if not isinstance(node, dict | list) or not node:
        return NASTY[rng.integers(len(NASTY))]
    keys = list(node) if isinstance(node, dict) else list(range(len(node)))
    k = keys[rng.integers(len(keys))]
    action = rng.integers(4)
    if action == 0 and isinstance(node, dict):
        del node[k]
    elif action == 1 and isinstance(node, dict):
        node["bogus_key"] = NASTY[rng.integers(len(NASTY))]
    else:
        node[k] = NASTY[rng.integers(len(NASTY))]
    return tree


def _mutate_text(text: str, rng: np.random.Generator) -> str:
    """``text`` with a line duplicated or dropped, a token replaced, or bytes inserted."""
    lines = text.split("\n")
    i = int(rng.integers(len(lines)))
    action = rng.integers(6)
    if action == 0:
        lines.insert(i, lines[i])
    elif action == 1 and len(lines) > 1:
        del lines[i]
    elif action == 2:
        parts = lines[i].replace(":", ", ").split(",")
        j = int(rng.integers(len(parts)))
        parts[j] = _value_text(rng)
        lines[i] = ",".join(parts) if ":" not in lines[i] else lines[i].split(":")[0] + ": " + _value_text(rng)
    elif action == 3:
        lines[i] = lines[i][: int(rng.integers(len(lines[i]) + 1))]
    elif action == 4:
        lines.insert(i, _value_text(rng))
    else:
        lines[i] += ["\x00", "\ufeff", "\t", "\r", " # x", "'", '"'][int(rng.integers(7))]
    return "\n".join(lines)


def _case_run_flags(rng: np.random.Generator, d: Path, k: int) -> tuple[list[str], str]:
    argv = ["run", "--scenario", SCENARIOS[rng.integers(len(SCENARIOS))], "--seed", str(int(rng.integers(1000)))]
    for _ in range(int(rng.integers(1, 4))):
        flag = rng.integers(8)
        if flag == 0:
            argv += ["--policy", POLICIES[rng.integers(len(POLICIES))]]
        elif flag == 1:
            argv += ["--set", f"{SET_KEYS[rng.integers(len(SET_KEYS))]}={_value_text(rng)}"]
        elif flag == 2:
            argv += ["--latency", ["unit", "roofline:llama-3-8b/h100", "nosuch:x", "table:/dev/zero", "calibrated:",
                                   _value_text(rng)][rng.integers(6)]]
        elif flag == 3:
            argv += ["--seed", _value_text(rng)]
        elif flag == 4:
            argv += ["--log-iterations", ["out/it.csv", "out/sum.json", "out", "out/link/x.csv"][rng.integers(4)]]
        elif flag == 5:
            argv += ["--log-batches"]
        elif flag == 6:
            argv += ["--reference"]
        else:
            argv += ["--set", f"workload.n_requests={_value_text(rng)}"]
    return [*argv, *SMALL, "--quiet", "--json", "out/sum.json"], "run"


def _case_yaml(rng: np.random.Generator, d: Path, k: int) -> tuple[list[str], str]:
    spec = get_scenario(SCENARIOS[rng.integers(len(SCENARIOS))])
    if rng.random() < 0.5:
        spec = _mutate_tree(spec, rng)
        text = scenario_yaml(spec) if isinstance(spec, dict) else json.dumps(spec)
    else:
        text = _mutate_text(scenario_yaml(spec), rng)
    path = d / f"s{k}.yml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return ["run", "--scenario", str(path), *SMALL, "--quiet", "--json", "out/sum.json"], "run"


TRACES = {
    "csv": "arrival_s,prompt_tokens,output_tokens,client\n0,12,5,0\n0.5,40,9,1\n1.25,7,3,0\n2,100,20,2\n",
    "azure": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
             "2023-11-16 18:15:50.9951690,396,109\n2023-11-16 18:15:51.3246470,879,15\n",
    "vtc": "arrival_s,client,prompt_tokens,output_tokens\n0.0,0,20,10\n0.4,1,35,12\n0.9,0,15,30\n",
    "jsonl": '{"arrival_s": 0, "prompt_tokens": 12, "output_tokens": 5}\n'
             '{"arrival_s": 1.5, "prompt_tokens": 30, "output_tokens": 7, "client": 1}\n',
}


def _case_trace(rng: np.random.Generator, d: Path, k: int) -> tuple[list[str], str]:
    fmt = list(TRACES)[rng.integers(len(TRACES))]
    text = TRACES[fmt]
    for _ in range(int(rng.integers(1, 3))):
        text = _mutate_text(text, rng)
    path = d / f"t{k}.{'jsonl' if fmt == 'jsonl' else 'csv'}"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return ["run", "--scenario", f"trace:{fmt}:{path}", "--policy", ["fcfs", "vtc", "sjf"][rng.integers(3)],
            "--quiet", "--json", "out/sum.json"], "run"


def _case_agent(rng: np.random.Generator, d: Path, k: int, genuine: Path) -> tuple[list[str], str]:
    import shutil

    folder = d / f"agent{k}"
    shutil.copytree(genuine, folder)
    if rng.random() < 0.75:
        meta = json.loads((folder / "model.json").read_text())
        (folder / "model.json").write_text(json.dumps(_mutate_tree(meta, rng)))
    else:
        data = bytearray((folder / "model.safetensors").read_bytes())
        at = int(rng.integers(min(len(data), 200)))
        if rng.random() < 0.5:
            data = data[:at]
        else:
            data[at] = int(rng.integers(256))
        (folder / "model.safetensors").write_bytes(bytes(data))
    return ["evaluate", "--model", str(folder), "--scenario", "jaillet-low", "--policies", "none", "--seeds", "1",
            "--set", "workload.n_requests=5", "--quiet", "--no-plots", "--out", f"out/ev{k}"], "evaluate"


@pytest.fixture(scope="module")
def genuine_agent(tmp_path_factory) -> Path | None:
    """An untrained MaskablePPO with a tiny network, saved as an agent folder (None without the RL extra)."""
    try:
        from sb3_contrib import MaskablePPO
        from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
    except ImportError:
        return None
    from agents.features import QueueSetExtractor
    from agents.storage import save_agent
    from agents.train import _TrainingWorkloads

    env_kwargs = {"K": 4, "overrides": {"workload.n_requests": 10}}
    venv = VecNormalize(DummyVecEnv([_TrainingWorkloads("jaillet-low", env_kwargs, 0, 1, 1000)]),
                        norm_obs_keys=["running", "globals"])
    model = MaskablePPO("MultiInputPolicy", venv, n_steps=16, batch_size=16, seed=0, device="cpu",
                        policy_kwargs={"features_extractor_class": QueueSetExtractor,
                                       "features_extractor_kwargs": {"slot_hidden": (8,), "context_hidden": (4,),
                                                                     "slot_out": 2}, "net_arch": [8]})
    folder = tmp_path_factory.mktemp("genuine")
    save_agent(folder / "model", model, venv, {"scenario": "jaillet-low", "env_kwargs": env_kwargs})
    return folder


def _invoke(argv: list[str]) -> tuple[int, str, list[warnings.WarningMessage]]:
    err = io.StringIO()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stderr(err), \
            contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("always")
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse's own errors
            rc = e.code if isinstance(e.code, int) else 2
    return rc, err.getvalue(), [w for w in caught if issubclass(w.category, RuntimeWarning)]


def _complete(kind: str, argv: list[str]) -> str | None:
    """None when the output of a successful command is complete, else what is missing."""
    if kind == "run":
        path = Path("out/sum.json")
        if not path.is_file():
            return "no summary written"
        s = json.loads(path.read_text())
        if s["n_completed"] + s["n_rejected"] + s["n_unfinished"] != s["n_arrived"]:
            return f"requests not accounted for: {s['n_arrived']} arrived"
        return None
    results = Path(argv[argv.index("--out") + 1]) / "results.json"
    if not results.is_file():
        return "no results.json"
    res = json.loads(results.read_text())
    return None if res["runs"] or res["skipped"] else "no runs and nothing skipped"


def test_whole_surface_fuzz_keeps_the_rule(tmp_path, monkeypatch, genuine_agent):
    work, inputs, outside = tmp_path / "work", tmp_path / "inputs", tmp_path / "outside"
    for folder in (work, inputs, outside):
        folder.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("LLMSCHED_DEBUG", raising=False)
    rng = np.random.default_rng(SEED)
    makers = [_case_run_flags, _case_yaml, _case_trace]
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    failures, counts = [], {"exit 0": 0, "exit 2": 0}
    for k in range(CASES):
        out = work / "out"
        if out.exists():
            import shutil

            shutil.rmtree(out)
        out.mkdir()
        if rng.random() < 0.2:  # a planted link: following it would write into outside/
            (out / "link").symlink_to(outside)
        pick = int(rng.integers(len(makers) + (genuine_agent is not None)))
        if pick == len(makers):
            argv, kind = _case_agent(rng, inputs, k, genuine_agent)
        else:
            argv, kind = makers[pick](rng, inputs, k)
        if os.environ.get("LLMSCHED_FUZZ_VERBOSE"):
            print(k, argv, flush=True)
        t0 = time.perf_counter()
        rc, err, runtime_warnings = _invoke(argv)
        wall = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if os.environ.get("LLMSCHED_FUZZ_VERBOSE"):
            print(f"  rc {rc}, {wall:.2f} s, peak RSS {rss / 2**20:.2f} GB: {err.strip()[:200]}", flush=True)
        lines = [x for x in err.splitlines() if x.strip()]
        problem = None
        if rc == 0:
            problem = _complete(kind, argv)
        elif rc == 2:
            if len(lines) != 1 or not lines[0].startswith("error: "):
                problem = f"exit 2 with {len(lines)} stderr lines"
        else:
            problem = f"exit {rc}"
        if problem is None and runtime_warnings:
            problem = f"RuntimeWarning: {runtime_warnings[0].message}"
        if problem is None and wall > MAX_CASE_S:
            problem = f"took {wall:.0f} s"
        if problem is None and any(outside.iterdir()):
            problem = f"wrote outside the output folder: {sorted(p.name for p in outside.iterdir())}"
            for p in outside.iterdir():
                p.unlink()
        if problem is None:
            counts[f"exit {rc}"] += 1
        else:
            failures.append(f"{problem}: {argv} -> {' | '.join(lines[:2])[:300]}")
    rss_gb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 2**20
    print(f"whole-surface fuzz: {CASES} cases, {counts}, {len(failures)} failures, peak RSS +{rss_gb:.2f} GB")
    assert not failures, "\n".join(failures[:20])
    assert rss_gb < MAX_RSS_GB
    assert counts["exit 0"] > 0 and counts["exit 2"] > 0  # the mutations reach both outcomes
