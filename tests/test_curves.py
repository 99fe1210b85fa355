"""Learning curves (curve.json, learning_curve.png, TensorBoard) and input-baseline training, from a tiny run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from agents.curves import CURVE_JSON, CURVE_PNG, LearningCurve, Target, plot_curve, target
from agents.train import TrainConfig, train

SMALL = {"workload.n_requests": 60}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("curves")
    cfg = TrainConfig(scenario="jaillet-low", name="tiny", out=str(out), timesteps=1024, seed=0, n_envs=4,
                      overrides=SMALL, env_kwargs={"K": 8}, validation_requests=60,
                      hyperparams={"n_steps": 128, "batch_size": 128, "n_epochs": 1,
                                   "curves": {"hindsight_sims": 2}, "input_baseline": {"group_size": 2}},
                      bc_from="none", checkpoint_every=10_000, score_every=2, progress=False)
    from llmsched_gym.cli.agents import curve_setup

    meta = train(cfg, curve_setup())  # what llmsched train lends: the tasks and the hindsight search
    return out / "tiny", meta


def test_a_run_writes_its_curve_with_start_static_and_hindsight(tiny_run):
    run_dir, meta = tiny_run
    curve = json.loads((run_dir / CURVE_JSON).read_text())
    steps = [s for s, _ in curve["points"]]
    # the start before any update, every 2nd rollout of 4 x 128 steps, and the end
    assert steps == [0, 512, 1024]
    assert curve["start"] == curve["points"][0][1] and math.isfinite(curve["start"])
    static, hindsight = curve["references"]["best_static"], curve["references"]["hindsight"]
    assert static["name"].startswith("static:")
    assert hindsight["value"] <= static["value"]  # the search starts from the best static specs
    assert curve["best_baseline"]["name"] in meta["validation"]["baselines"]
    np.testing.assert_equal(meta["validation"]["curve"]["points"], curve["points"])
    png = (run_dir / CURVE_PNG).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_tensorboard_has_the_agent_beside_constant_reference_lines(tiny_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _ = tiny_run
    curve = json.loads((run_dir / CURVE_JSON).read_text())
    acc = EventAccumulator(str(run_dir / "tb" / "curves"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"validation/agent", "validation/start", "validation/best_static", "validation/hindsight",
            "validation/best_baseline"} <= tags
    agent = [(e.step, e.value) for e in acc.Scalars("validation/agent")]
    scored = [(s, v) for s, v in curve["points"] if math.isfinite(v)]  # an incomplete run is no point
    assert [s for s, _ in agent] == [s for s, _ in scored] and scored[0][0] == 0
    np.testing.assert_allclose([v for _, v in agent], [v for _, v in scored], rtol=1e-6)
    static = [e.value for e in acc.Scalars("validation/best_static")]
    assert len(static) == len(curve["points"]) >= 2  # drawn at every scored point: a horizontal line
    assert static == pytest.approx([curve["references"]["best_static"]["value"]] * len(static), rel=1e-6)


def test_input_baseline_training_logs_its_coverage(tiny_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, meta = tiny_run
    acc = EventAccumulator(str(run_dir / "tb" / "ppo_1"))
    acc.Reload()
    cov = [e.value for e in acc.Scalars("train/input_baseline_coverage")]
    assert cov and all(0.0 <= c <= 1.0 for c in cov) and max(cov) > 0.5  # peers share the workloads
    assert meta["timesteps"] == 1024


def test_the_target_is_the_task_metric_on_the_task_workload():
    from llmsched_gym.benchmark import TASKS

    tasks = {x.name: x for x in TASKS}
    t = target("jaillet-bursty", {"workload.n_requests": 100, "workload.trace.part": [0, 0.5]}, tasks)
    assert (t.metric, t.lower_is_better, t.label) == ("serving.p99_ttft_ms", True, "P99 TTFT (ms)")
    # exactly the workload the benchmark scores, not the training episodes'
    assert t.overrides == next(x for x in TASKS if x.name == "jaillet-bursty").overrides
    assert target(None, {"a": 1}) == Target(overrides={"a": 1})
    with pytest.raises(ValueError, match="task: unknown 'nope'; allowed: azure-conv,"):
        target("nope", {}, tasks)
    with pytest.raises(ValueError, match="task: 'jaillet-bursty' needs the benchmark's tasks"):
        target("jaillet-bursty", {})  # a direct call without the application layer's setup


def test_an_incomplete_validation_run_is_no_point_on_the_curve(tmp_path):
    curve = LearningCurve(tmp_path, Target(), {"best_static": {"name": "s", "value": 5.0}, "hindsight": None},
                          tensorboard=False)
    full = {"n_completed": 10, "n_rejected": 0, "n_arrived": 10, "serving": {"mean_e2el_ms": 7.0}}
    curve.record(0, full)
    assert math.isnan(curve.record(100, {**full, "n_completed": 9, "stop_reason": "done"}))
    assert curve.reference_lines() == {"start": 7.0, "best_static": 5.0}
    assert plot_curve(curve.as_dict(), tmp_path / "c.png") and (tmp_path / CURVE_PNG).exists()


def test_a_neutral_start_is_named_so_in_the_benchmark_rows():
    from agents.agent import describe_run

    env = {"action_mode": "priority", "order": "arrival", "budget": 128}
    neutral = {"algo": "ppo", "timesteps": 1_200_000, "hyperparams": {"action_bias": 0.0}, "env_kwargs": env}
    assert describe_run(neutral, "x") == "ppo priority/arrival-order budget 128, neutral start, 1.2M steps"
    assert describe_run(neutral, "x", start=True) == "ppo priority/arrival-order budget 128, neutral start, untrained start"
    ramp = {**neutral, "hyperparams": {"action_bias": [0.9, 0.5, 0.0]}}
    assert describe_run(ramp, "x") == "ppo priority/arrival-order budget 128, 1.2M steps"
    cloned = {**neutral, "bc": {"policy": "sarathi"}}
    assert "neutral" not in describe_run(cloned, "x")
    meta = {"algo": "maskable-ppo", "timesteps": 2_000, "hyperparams": {},
            "env_kwargs": {"action_mode": "meta", "candidates": ["sarathi", {"name": "vtc"}]}}
    assert describe_run(meta, "x") == "maskable-ppo meta over sarathi/vtc, neutral start, 2k steps"
    tune = {"algo": "ppo", "timesteps": 1000, "hyperparams": {"action_bias": 0.0},
            "env_kwargs": {"action_mode": "tune", "base": {"name": "static"}, "tune": {"max_num_seqs": [16, 256]}}}
    assert describe_run(tune, "x") == "ppo tune: static max_num_seqs, 1k steps"  # zero action = its base: not neutral
    # a run's best model is labelled with the steps it was saved at, beside the run's total
    assert describe_run({**tune, "timesteps": 851_000}, "x", best_at=36_864) == \
        "ppo tune: static max_num_seqs, best model at 36.9k of 851k steps"
    assert describe_run(neutral, "x", start=True, best_at=5) == describe_run(neutral, "x", start=True)
    assert "neutral" not in describe_run({**meta, "bc": {"policy": "vtc"}}, "x")
    assert "neutral" not in describe_run({**neutral, "hyperparams": {}}, "x")  # a Box head at random: no claim


def test_the_vtc_arena_neutral_recipe_learns_the_fairness_task_from_no_prior():
    from agents.train import HYPERPARAMS_DIR, resolve

    hp = resolve(TrainConfig(scenario="vtc-arena", hyperparams_file=str(HYPERPARAMS_DIR / "vtc_arena_neutral.yml")))
    assert hp["algo"] == "maskable-ppo" and hp["task"] == "vtc-arena" and hp["bc"]["from"] is None
    assert hp["env_kwargs"]["reward"] == {"fairness": 1.0} and "action_bias" not in hp


@pytest.mark.parametrize("name, order, neutral", [("azure_conv_tight_kv.yml", "shortest", False),
                                                  ("azure_conv_tight_kv_neutral.yml", "arrival", True)])
def test_the_tight_kv_recipes_score_the_task_and_differ_only_in_their_start(name, order, neutral):
    from agents.train import HYPERPARAMS_DIR, resolve

    hp = resolve(TrainConfig(scenario="azure-conv", hyperparams_file=str(HYPERPARAMS_DIR / name)))
    assert hp["task"] == "azure-conv-tight-kv" and hp["algo"] == "ppo" and hp["bc"]["from"] is None
    assert hp["env_kwargs"]["order"] == order and hp["env_kwargs"]["budget"] == 128
    assert hp["n_envs"] % hp["input_baseline"]["group_size"] == 0
    bias = np.atleast_1d(hp["action_bias"])
    assert not bias.any() if neutral else (np.diff(bias) < 0).all()
    other = resolve(TrainConfig(scenario="azure-conv", hyperparams_file=str(
        HYPERPARAMS_DIR / ("azure_conv_tight_kv.yml" if neutral else "azure_conv_tight_kv_neutral.yml"))))
    same = {k for k in hp if k not in ("action_bias", "env_kwargs") and hp[k] == other[k]}
    assert same == set(hp) - {"action_bias", "env_kwargs"}
    assert {k for k in hp["env_kwargs"] if hp["env_kwargs"][k] != other["env_kwargs"][k]} == {"order"}


def _summary(e2el: float, p99_ttft: float, done: int = 10) -> dict:
    return {"serving": {"mean_e2el_ms": e2el, "p99_ttft_ms": p99_ttft}, "n_completed": done, "n_arrived": 10}


@pytest.mark.parametrize("metric,lower,saved_at", [
    ("serving.p99_ttft_ms", True, [0, 2]),   # the tail task: P99 TTFT picks best_model
    ("serving.mean_e2el_ms", True, [0, 1]),  # no task: the mean E2EL, as before
])
def test_best_model_is_chosen_by_the_tasks_own_metric(metric, lower, saved_at):
    from types import SimpleNamespace

    from agents.callbacks import BaselineScoreCallback

    logged: dict[str, float] = {}
    # the agent's validation scores, in order: better E2E but a worse tail, then a better tail
    plays = iter([_summary(100.0, 50.0), _summary(80.0, 70.0), _summary(90.0, 30.0), _summary(95.0, 20.0, done=5)])
    saves: list[int] = []
    calls = [0]

    def save(stem: str) -> None:
        assert stem == "best_model"
        saves.append(calls[0] - 1)

    def evaluate(_model):
        calls[0] += 1
        return next(plays)

    baselines = {"a": _summary(120.0, 40.0), "b": _summary(110.0, 60.0), "unfinished": _summary(1.0, 1.0, done=3)}
    cb = BaselineScoreCallback(evaluate, baselines, save=save, metric=metric, lower_is_better=lower)
    cb.model = SimpleNamespace(logger=SimpleNamespace(record=logged.__setitem__))
    assert cb.best_task == (40.0 if "ttft" in metric else 110.0)  # the unfinished baseline does not count
    for _ in range(4):
        cb._on_rollout_end()
    assert saves == saved_at  # the last play left requests unserved: x10, never the best
    assert logged["eval/task_metric"] == (20.0 if "ttft" in metric else 95.0) and logged["eval/rel_task_vs_best"] == 10.0
    assert cb.best_rel == pytest.approx(30.0 / 40.0 if "ttft" in metric else 80.0 / 110.0)
    assert cb.best_rel_e2el == pytest.approx(80.0 / 110.0)


def test_best_model_follows_the_metric_on_a_horizon_task():
    # echo-hybrid stops at its horizon with most of its offline pool unserved (a goodput task, higher is
    # better): such runs compare, as in `llmsched benchmark`; before, every validation score counted as
    # x10 and best_model stayed at the first one whatever the agent did
    from types import SimpleNamespace

    from agents.callbacks import BaselineScoreCallback

    def horizon(goodput: float, done: int = 600, stop: str = "horizon", loop: bool = False) -> dict:
        return {"serving": {"mean_e2el_ms": 1.0, "p99_ttft_ms": 1.0, "request_goodput": goodput},
                "n_completed": done, "n_arrived": 1000, "stop_reason": stop, "non_terminating": loop}

    plays = iter([horizon(1.0), horizon(1.2), horizon(1.1), horizon(1.5, loop=True), horizon(1.6, stop="stuck")])
    saves: list[int] = []
    calls = [0]

    def evaluate(_model):
        calls[0] += 1
        return next(plays)

    baselines = {"a": horizon(1.15), "b": horizon(0.9), "looping": horizon(9.0, loop=True)}
    cb = BaselineScoreCallback(evaluate, baselines, save=lambda stem: saves.append(calls[0] - 1),
                               metric="serving.request_goodput", lower_is_better=False)
    cb.model = SimpleNamespace(logger=SimpleNamespace(record=lambda *_: None))
    assert cb.best_task == 1.15  # the looping baseline does not count
    for _ in range(5):
        cb._on_rollout_end()
    assert saves == [0, 1]  # 1.0, then 1.2; 1.1 is worse; a loop and a run stopped short are x10
    assert cb.best_rel == pytest.approx(1.15 / 1.2)


def test_relative_is_below_one_when_better_in_either_direction():
    from agents.callbacks import relative

    assert relative(30.0, 40.0) == 0.75
    assert relative(50.0, 40.0, lower_is_better=False) == 0.8  # a goodput of 50 against the best 40
    assert relative(0.0, 0.0) == 1.0
    assert relative(math.nan, 40.0) == 10.0 and relative(5.0, 0.0) == 10.0


def test_train_says_loudly_when_a_synthetic_stand_in_replaced_the_trace(clone, capsys):
    from agents.train import workload_line

    line, record = workload_line("azure-conv", {})  # a fresh clone: no trace anywhere
    assert line.startswith("WARNING: SYNTHETIC STAND-IN: azure-conv (synthetic stand-in for azure-conv)")
    assert "llmsched data download azure-conv" in line and "\n" not in line
    assert record["synthetic"] is True and record["workload_source"]["kind"] == "synthetic"
    assert "synthetic stand-in" in record["title"]
    line, record = workload_line("jaillet-high", {})  # a generated workload is no stand-in
    assert line.startswith("workload: jaillet-high") and record["synthetic"] is False


def test_a_stand_in_runs_curve_says_so_in_its_title(tmp_path):
    curve = LearningCurve(tmp_path, Target(), {}, tensorboard=False)
    curve.note = " (synthetic stand-in)"
    curve.record(0, {"serving": {"mean_e2el_ms": 5.0}, "n_completed": 3, "n_arrived": 3})
    data = json.loads((tmp_path / CURVE_JSON).read_text())
    assert data["note"] == " (synthetic stand-in)"


def test_run_json_names_the_workload_and_the_metric_that_chose_best_model(tiny_run):
    run_dir, meta = tiny_run
    saved = json.loads((run_dir / "run.json").read_text())
    assert saved["workload"] == {"title": meta["workload"]["title"], "synthetic": False,
                                 "workload_source": meta["workload"]["workload_source"]}
    assert saved["workload"]["title"].startswith("jaillet-low")
    sel = saved["validation"]["selection"]
    assert sel["metric"] == "serving.mean_e2el_ms" and sel["lower_is_better"] is True
    assert sel["best_rel_vs_best"] == pytest.approx(saved["validation"]["best_rel_mean_e2el_vs_best"])
