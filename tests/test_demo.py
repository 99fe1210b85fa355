"""The main job (``python -m llmsched_gym.demo``) in its quick form: it trains, evaluates, and says
where the agent stands against the best baselines, on the mean and on the tail."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("sb3_contrib")

from llmsched_gym.demo import main  # noqa: E402


def test_quick_demo_prints_paired_differences_on_the_mean_and_the_tail(tmp_path, capsys):
    assert main(["--quick", "--out", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    assert "[1/3] training PPO in priority mode on azure-conv" in out
    paired = re.findall(r"^  vs (\S+) .* ms -> .* ms +[+-]\d+\.\d% ± \d+\.\d%  (better|worse|tie \(CI includes 0\))$",
                        out, flags=re.M)
    assert len(paired) >= 3  # the quick demo's three baselines, then the best static tuning
    assert re.search(r"^  P99 TTFT \(ms\) vs \S+ .* ms -> .* ms", out, flags=re.M)
    results = json.loads((tmp_path / "demo" / "eval" / "results.json").read_text())
    agent, pairs = next(iter(results["paired"].items()))
    assert agent.startswith("ppo (") and pairs[0]["baseline"] == paired[0][0]  # best baseline first
    # a verdict that is not "better" is said in words, never left to the reader
    for name, verdict in paired:
        if verdict != "better" and name == pairs[0]["baseline"]:
            assert f"the agent does not beat the best baseline ({name})" in out
