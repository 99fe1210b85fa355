"""The main job (``python -m llmsched_gym.demo``) in its quick form: it trains with the scenario's
recipe, scores the agent as the benchmark does, beside its untrained start and the references, and
says what training added."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("sb3_contrib")

from llmsched_gym.demo import main  # noqa: E402


def test_quick_demo_prints_the_references_the_start_and_what_training_added(tmp_path, capsys):
    assert main(["--quick", "--out", str(tmp_path / "demo"), "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "[1/2] training on azure-conv" in out and "exactly what `llmsched train --scenario azure-conv` trains" in out
    assert "recipe: agents/hyperparams/ppo.yml, entry azure-conv (over default): ppo" in out
    # the console table fits 100 columns and names the five rows
    table = out[out.index("[2/2]"):out.index("total ")].splitlines()[1:]
    assert all(len(line) <= 100 for line in table)
    for role in ("hindsight (reference)", "best static heuristic", "best baseline", "agent's untrained start",
                 "agent "):
        assert any(line.startswith(role) for line in table), role
    learned = re.search(r"^learned \(trained vs start\): ([+-]\d+\.\d)% ± (\d+\.\d)%: (.*)$", out, flags=re.M)
    assert learned is not None
    res = json.loads((tmp_path / "demo" / "benchmark" / "results.json").read_text())
    r = res["tasks"]["azure-conv"]
    agent = next(row for row in r["rows"] if row["kind"] == "agent")
    start = next(row for row in r["rows"] if row["kind"] == "start")
    assert agent["start"] == start["name"] and start["name"].endswith("untrained start")
    assert agent["name"].startswith("ppo priority/") and r["information"] == "predicted"
    assert f"agent: {agent['name'].rsplit(', ', 1)[0]}" in table
    # what the table says training added is the paired difference in results.json, said in words
    assert float(learned.group(1)) == pytest.approx(100 * agent["learned"]["rel"], abs=0.051)
    if agent["learned"]["verdict"] == "tie":
        assert learned.group(3) == "nothing measurable: the start's result"
    assert (tmp_path / "demo" / "train" / "start.json").exists()
