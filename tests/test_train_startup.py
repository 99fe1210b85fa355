"""``llmsched train``'s start-up and exit: the RL stack imported without TensorBoard's remote file
systems, the benchmark's tasks imported only when a recipe names one, and the process ending
without the interpreter's teardown only when it is the ``llmsched`` process itself."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sb3_contrib")

from llmsched_gym.cli import main  # noqa: E402
from llmsched_gym.cli.agents import _REMOTE_FS_MODULES, curve_setup  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--scenario", "jaillet-low", "--K", "8", "--set", "workload.n_requests=20", "--timesteps", "128",
        "--hp", "n_steps=64", "--hp", "batch_size=64", "--hp", "n_envs=2", "--score-every", "0", "--bc-from", "none",
        "--no-progress", "--threads", "1"]


def _python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def test_the_rl_stack_imports_without_remote_file_systems_and_leaves_them_importable():
    code = f"""
import gc, sys
from llmsched_gym.cli.agents import _import_rl_stack
_import_rl_stack()
assert "stable_baselines3" in sys.modules and "agents.train" in sys.modules
assert gc.isenabled() and gc.get_freeze_count() > 100_000, gc.get_freeze_count()
for m in {_REMOTE_FS_MODULES!r}:
    assert m not in sys.modules, m  # neither imported nor left blocked (a None entry)
from tensorboard.compat.tensorflow_stub.io import gfile
assert gfile.S3_ENABLED is False
import importlib.util
if importlib.util.find_spec("boto3") is not None:
    import boto3  # importable again after the block
    assert sys.modules["boto3"] is boto3
print("ok")
"""
    r = _python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_an_already_imported_module_is_not_blocked():
    if importlib.util.find_spec("fsspec") is None:
        pytest.skip("fsspec not installed")
    code = """
import sys
import fsspec
from llmsched_gym.cli.agents import _import_rl_stack
_import_rl_stack()
assert sys.modules["fsspec"] is fsspec
print("ok")
"""
    r = _python(code)
    assert r.returncode == 0, r.stderr


def test_curve_setup_imports_the_benchmark_only_when_asked():
    code = """
import sys
from llmsched_gym.cli.agents import curve_setup
c = curve_setup()
assert "llmsched_gym.benchmark" not in sys.modules and "llmsched_gym.hindsight" not in sys.modules
assert "azure-conv" in c.tasks and len(c.tasks) == len(list(c.tasks)) > 1
assert "llmsched_gym.benchmark" in sys.modules
from llmsched_gym.benchmark import TASKS
assert c.tasks["azure-conv"] is next(t for t in TASKS if t.name == "azure-conv")
print("ok")
"""
    r = _python(code)
    assert r.returncode == 0, r.stderr


def test_curve_setup_hindsight_is_the_search_itself():
    from llmsched_gym.hindsight import hindsight

    c = curve_setup()
    kw = {"scenario": "jaillet-low", "overrides": {"workload.n_requests": 12}, "seed": 3, "sims": 2}
    assert c.hindsight(**kw).value == hindsight(**kw).value


def test_the_train_process_exits_zero_with_every_file_written(tmp_path):
    # with the progress bar and its score note (scored every 64 steps), as a user's run prints them
    with_progress = [a for a in TINY if a != "--no-progress"]
    with_progress[with_progress.index("--score-every") + 1] = "64"
    r = subprocess.run([sys.executable, "-m", "llmsched_gym.cli", "train", *with_progress, "--out", str(tmp_path),
                        "--name", "q"], capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(ln.startswith("trained q: 128 steps") for ln in lines), lines
    assert lines[-1].startswith("validation (seed 99): agent ")  # the last line, flushed before the quick exit
    # the progress bar, written to a pipe, keeps its whole line: the step count, both times, the score
    bar = [ln for ln in lines if ln.startswith("train ")]
    assert bar and "128/128" in bar[-1] and "\u2026" not in bar[-1] and len(bar[-1]) <= 100, bar
    assert re.search(r"vs best baseline x\d\.\d{3}$", bar[-1]), bar
    run = tmp_path / "q"
    assert json.loads((run / "run.json").read_text())["status"] == "done"
    for stem in ("model", "best_model", "start"):
        assert (run / f"{stem}.json").exists() and (run / f"{stem}.safetensors").stat().st_size > 0
    events = list((run / "tb").glob("*/events.out.tfevents.*"))
    assert events and all(f.stat().st_size > 0 for f in events)


def test_main_with_argv_returns_instead_of_exiting(tmp_path, monkeypatch):
    def refuse(code):
        raise AssertionError(f"os._exit({code}) from main(argv)")

    monkeypatch.setattr(os, "_exit", refuse)
    assert main(["train", *TINY, "--out", str(tmp_path), "--name", "r"]) == 0
    assert json.loads((tmp_path / "r" / "run.json").read_text())["status"] == "done"


def test_under_a_profiler_the_process_exits_normally_and_the_profile_is_written(tmp_path):
    prof = tmp_path / "train.prof"
    r = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "llmsched_gym.cli", "train", *TINY,
                        "--out", str(tmp_path), "--name", "p"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    assert prof.stat().st_size > 0  # os._exit would have skipped cProfile's dump
    assert json.loads((tmp_path / "p" / "run.json").read_text())["status"] == "done"
