"""What the README says the tool does, checked on the tool: each preset's fit error in
``llmsched list``, ``--no-plots`` on every command that plots, the real signature of
``llmsched_gym.simulate`` without loading the engine on ``import llmsched_gym``."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from llmsched_gym.cli import build_parser, main
from llmsched_gym.core.latency import CALIBRATED_PRESETS


def test_list_gives_each_calibrated_presets_fit_error(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "500")  # one line per preset
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name, preset in CALIBRATED_PRESETS.items():
        line = next(x for x in out.splitlines() if f" {name} " in x)
        assert f"MAPE {preset.mape:.1%}" in line, (name, line)


@pytest.mark.parametrize("command", ["fidelity", "evaluate", "compare"])
def test_every_plotting_command_takes_no_plots(command):
    args = build_parser().parse_args([command, "--no-plots"])
    assert (args.no_plot if command == "fidelity" else args.no_plots) is True


def test_simulate_has_its_real_signature_and_import_stays_light():
    code = ("import sys, inspect, llmsched_gym; light = 'llmsched_gym.core.engine' not in sys.modules; "
            "print(light, inspect.signature(llmsched_gym.simulate))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out.startswith("True (scenario: 'str | dict' = 'azure-conv', policy: ")
    import llmsched_gym
    from llmsched_gym.sim import SimResult, simulate

    assert llmsched_gym.simulate is simulate and llmsched_gym.SimResult is SimResult
    assert list(inspect.signature(llmsched_gym.simulate).parameters) == [
        "scenario", "policy", "seed", "overrides", "policy_params", "log_batches"]
    with pytest.raises(AttributeError, match="has no attribute 'simulat'"):
        llmsched_gym.simulat  # noqa: B018


def test_the_env_manual_holds_the_observation_tables_as_the_code_defines_them():
    """``LLMSchedEnv``'s docstring is plain text (``help()`` and the source show the same manual);
    its three feature tables must be what ``feature_table`` writes from the observation's tables."""
    from llmsched_gym.env.llmsched_env import LLMSchedEnv
    from llmsched_gym.env.observation import GLOBAL_FEATURES, QUEUE_FEATURES, RUNNING_FEATURES, feature_table

    doc = LLMSchedEnv.__doc__
    for table in (QUEUE_FEATURES, RUNNING_FEATURES, GLOBAL_FEATURES):
        text = "\n".join("    " + line for line in feature_table(table).splitlines())
        assert text in doc, f"LLMSchedEnv's docstring lacks this table (paste it in):\n{text}"
    n = len(QUEUE_FEATURES)
    assert f"``queue``: ``K x {n}`` values, slot-major (feature ``f`` of slot ``i`` at ``{n} i +" in doc
