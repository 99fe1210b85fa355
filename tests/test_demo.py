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


def test_the_main_job_fetches_its_trace_or_says_plainly_that_the_stand_in_runs(tmp_path, monkeypatch, capsys):
    from llmsched_gym import data
    from llmsched_gym.demo import fetch_trace

    monkeypatch.setenv("LLMSCHED_DATA", str(tmp_path))
    monkeypatch.setattr(data, "shared_roots", lambda: [])  # a user's clone: no ../shared
    calls = []

    def unreachable(name, **kw):
        calls.append(name)
        raise data.DataError(f"{name}: download from https://example.invalid failed (no route)")

    monkeypatch.setattr(data, "download", unreachable)
    fetch_trace("azure-conv", quick=False)
    out = capsys.readouterr().out
    assert calls == ["azure-conv"]  # announced, through `llmsched data download`'s code
    assert "fetching the real trace from its publisher (sha256-checked)" in out
    assert "the SYNTHETIC STAND-IN runs instead" in out
    fetch_trace("azure-conv", quick=True)  # --quick never downloads, and says what runs
    assert calls == ["azure-conv"] and "--quick does not download: the SYNTHETIC STAND-IN runs" in capsys.readouterr().out
    fetch_trace("jaillet-high", quick=False)  # a synthetic scenario has no trace to fetch
    assert calls == ["azure-conv"] and capsys.readouterr().out == ""
