"""``llmsched train`` says which recipe it trains (file, entry, algorithm, action mode, and where
each came from), prints it and keeps it in ``run.json``."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("sb3_contrib")

from agents.train import TrainConfig, recipe, recipe_line, resolve  # noqa: E402
from llmsched_gym.cli import main  # noqa: E402


def _recipe(**kw):
    cfg = TrainConfig(**kw)
    return recipe(cfg, resolve(cfg))


def test_the_recipe_names_the_file_entry_algorithm_and_mode_and_where_each_came_from():
    # no --action-mode: maskable_ppo.yml's entry names the priority mode, so ppo.yml's entry (the main job's) applies
    r = _recipe(scenario="azure-conv")
    assert {k: r[k] for k in ("file", "entry", "algo", "algo_from", "action_mode", "action_mode_from")} == {
        "file": "agents/hyperparams/ppo.yml", "entry": "azure-conv", "algo": "ppo",
        "algo_from": "the action mode", "action_mode": "priority", "action_mode_from": "the file's azure-conv entry"}
    r = _recipe(scenario="jaillet-low")  # an entry without a mode: the default's (select, MaskablePPO)
    assert (r["file"], r["algo"], r["action_mode"], r["action_mode_from"]) == (
        "agents/hyperparams/maskable_ppo.yml", "maskable-ppo", "select", "the file's default entry")
    r = _recipe(scenario="azure-conv", env_kwargs={"action_mode": "priority"})
    assert (r["file"], r["entry"], r["algo"], r["action_mode_from"]) == (
        "agents/hyperparams/ppo.yml", "azure-conv", "ppo", "--action-mode")
    r = _recipe(scenario="vtc-arena")
    assert (r["action_mode"], r["action_mode_from"], r["bc_from"]) == ("meta", "the file's vtc-arena entry", "vtc")
    r = _recipe(scenario="klpm-toy", algo="ppo", env_kwargs={"action_mode": "knob"}, timesteps=512)
    assert (r["entry"], r["algo_from"], r["timesteps"]) == ("default", "--algo", 512)
    assert recipe_line(r) == ("recipe: agents/hyperparams/ppo.yml, entry default: ppo (from --algo), action mode knob "
                              "(from --action-mode), 512 steps, 2 envs")


def test_train_prints_the_recipe_and_stores_it_in_run_json(tmp_path, capsys):
    argv = ["train", "--scenario", "jaillet-low", "--K", "8", "--set", "workload.n_requests=20", "--timesteps", "256",
            "--hp", "n_steps=64", "--hp", "batch_size=64", "--hp", "n_envs=1", "--score-every", "0",
            "--bc-from", "none", "--no-progress", "--out", str(tmp_path), "--name", "r"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("recipe: "))
    assert line == ("recipe: agents/hyperparams/maskable_ppo.yml, entry jaillet-low (over default): maskable-ppo "
                    "(from the action mode), action mode select (from the file's default entry), 256 steps, 1 env")
    meta = json.loads((tmp_path / "r" / "run.json").read_text())
    assert recipe_line(meta["recipe"]) == line
