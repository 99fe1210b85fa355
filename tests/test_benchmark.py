"""``llmsched benchmark``: the fixed protocol, computed references and the normalised score."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from llmsched_gym.benchmark import (
    TASKS,
    TEST_SEEDS,
    VALIDATION_SEED,
    VALIDATION_SEEDS,
    Entry,
    leaderboard,
    normalised,
    paired,
    rank_family,
    run_benchmark,
    score_task,
    write_outputs,
)
from llmsched_gym.cli import main


def test_quick_benchmark_scores_the_best_baseline_one_and_fcfs_zero(tmp_path):
    out = tmp_path / "bench"
    res = run_benchmark(["azure-conv", "jaillet-high"], policies=[{"name": "sarathi", "chunk_size": 256}],
                        quick=True, out=out, baselines=["fcfs", "sjf", "sarathi", "vllm-v1", "rpm"])
    for name, r in res["tasks"].items():
        rows = {row["name"]: row for row in r["rows"]}
        best = r["best_baseline"]
        # computed, not typed in: the best complete default baseline on the test seeds
        means = {n: row["mean"] for n, row in rows.items() if row["kind"] == "baseline" and row["complete"]}
        assert best == min(means, key=means.get)
        if means[best] == means["fcfs"]:  # FCFS ties for the best: the score is undefined (documented nan)
            assert math.isnan(rows[best]["normalised"])
        else:
            assert rows[best]["normalised"] == pytest.approx(1.0)
        assert rows["fcfs"]["normalised"] == pytest.approx(0.0) or math.isnan(rows["fcfs"]["normalised"])
        assert rows[best]["paired_rel_vs_best"] == 0.0
        assert len(rows[best]["values"]) == 2  # the quick protocol's two test seeds
        # the best static heuristic: ranked first over the validation workloads (quick: two) by the
        # mean ratio to each workload's best member, recomputed here from the stored values
        fam = res["static_family"][name]
        assert r["best_static"] == fam["chosen"] and fam["validation_seeds"] == [98, 99]
        sign = 1 if r["task"]["lower_is_better"] else -1
        ok = [m for m in fam["values"] if all(fam["completed"][m])]
        best = [min(fam["values"][m][j] * sign for m in ok) * sign for j in range(2)]
        mean_ratio = {m: np.mean([v / b for v, b in zip(fam["values"][m], best, strict=True)]) for m in ok}
        assert fam["scores"] == pytest.approx(mean_ratio)
        assert fam["scores"][fam["chosen"]] * sign == min(v * sign for v in fam["scores"].values())
        static = rows[r["best_static"]]
        assert static["kind"] == "static" and static["paired_rel_vs_static"] == 0.0
        # the hindsight reference is, seed by seed, at least as good as every reference policy
        ref = rows["hindsight"]
        assert ref["kind"] == "reference"
        for row in r["rows"]:
            if row["kind"] in ("baseline", "static") and row["complete"]:
                assert all(h * sign <= v * sign for h, v in zip(ref["values"], row["values"], strict=True))
        assert r["headroom"] == pytest.approx(sign * (static["mean"] - ref["mean"]) / abs(static["mean"]))
        assert r["headroom"] >= 0 and r["information"] == r["task"]["information"]
    # azure-conv's small cut separates the baselines (jaillet-high's 120 requests may not: every
    # baseline schedules them the same way under the grounded batch times)
    az = {row["name"]: row for row in res["tasks"]["azure-conv"]["rows"]}
    assert az[res["tasks"]["azure-conv"]["best_baseline"]]["normalised"] == pytest.approx(1.0)
    assert not res["tasks"]["azure-conv"]["rows"][-1]["complete"]  # rpm rejects: listed last
    assert json.loads((out / "results.json").read_text())["protocol"]["test_seeds"] == [100, 101]
    text = (out / "leaderboard.md").read_text()
    # without the real trace (a clone with no data) the title says it ran on the synthetic stand-in
    assert re.search(r"^## azure-conv( \(synthetic stand-in for azure-conv\))? \(Mean E2EL \(ms\), lower is better\)$",
                     text, flags=re.M) and "(incomplete)" in text
    # the summary table names each task's information model, references and headroom
    assert re.search(r"^\| azure-conv( \(synthetic stand-in for azure-conv\))? \| predicted \| Mean E2EL \(ms\) \| ",
                     text, flags=re.M)
    assert re.search(r"^\| jaillet-high \| clairvoyant \| ", text, flags=re.M)
    assert (out / "scores.png").stat().st_size > 1000
    # an entrant that is not scored on a task is listed under it with the reason, never dropped
    res["skipped"] = {"azure-conv": {"runs/x": "runs/x was trained on jaillet-high, not azure-conv"}}
    board = leaderboard(res)
    assert "Not scored on this task:\n\n* runs/x: runs/x was trained on jaillet-high, not azure-conv" in board
    assert board.index("* runs/x") < board.index("## jaillet-high")


def test_the_protocol_has_ten_test_seeds_and_labelled_information():
    assert len(TEST_SEEDS) >= 10 and VALIDATION_SEED not in TEST_SEEDS
    # the static heuristic is chosen on several validation workloads, none a test or training one; the
    # agents' validation workload (best_model) is one of them
    assert len(VALIDATION_SEEDS) >= 5 and VALIDATION_SEED in VALIDATION_SEEDS
    assert not set(VALIDATION_SEEDS) & set(TEST_SEEDS) and all(s < 1000 for s in VALIDATION_SEEDS)
    assert {t.information for t in TASKS} == {"clairvoyant", "predicted", "blind"}
    by_name = {t.name: t for t in TASKS}
    for t in TASKS:
        assert t.information in ("clairvoyant", "predicted", "blind") and t.why
        if t.trained_on is not None:  # generalisation: scored with the static heuristic of the agent's task
            assert by_name[t.trained_on].scenario == t.scenario and by_name[t.trained_on].trained_on is None
    # the declared model is the one the task's scenario and overrides give (what the env and policies read)
    from llmsched_gym.core.information import information_of
    from llmsched_gym.core.scenarios import get_scenario

    for t in TASKS:
        assert information_of(get_scenario(t.scenario, t.overrides)) == t.information, t.name
    # real serving is never clairvoyant, except as a labelled upper reference
    assert by_name["azure-conv"].information == "predicted"
    assert by_name["azure-conv-blind"].information == "blind"


def test_paired_verdicts_tell_better_worse_and_tie_apart():
    assert paired([9.0, 9.1, 8.9], [10.0, 10.0, 10.0])["verdict"] == "better"
    assert paired([9.0, 9.1, 8.9], [10.0, 10.0, 10.0], lower_is_better=False)["verdict"] == "worse"
    tie = paired([9.0, 11.0, 10.0], [10.0, 10.0, 10.0])
    assert tie["verdict"] == "tie" and tie["rel"] == pytest.approx(0.0) and tie["ci95"] > 0
    assert paired([10.0, 10.0], [10.0, 10.0])["verdict"] == "tie"
    x = paired([11.0, 12.0], [10.0, 10.0])
    assert x["rel"] == pytest.approx(0.15) and x["verdict"] in ("worse", "tie")


def test_an_agent_is_scored_beside_its_start_with_what_training_added():
    task = TASKS[0]
    r = score_task(task, [Entry("fcfs", "baseline", [10.0, 12.0, 11.0], [True] * 3),
                          Entry("static", "static", [8.0, 9.0, 8.5], [True] * 3),
                          Entry("ppo, 10k steps", "agent", [7.0, 8.1, 7.6], [True] * 3, {"path": "runs/a"}),
                          Entry("ppo, untrained start", "start", [7.0, 8.0, 7.5], [True] * 3, {"path": "runs/a"}),
                          Entry("hindsight", "reference", [6.0, 7.0, 6.5], [True] * 3)])
    rows = {row["name"]: row for row in r["rows"]}
    learned = rows["ppo, 10k steps"]["learned"]
    assert rows["ppo, 10k steps"]["start"] == "ppo, untrained start"
    assert learned["rel"] == pytest.approx(np.mean([0.0, 0.1 / 8.0, 0.1 / 7.5]))
    assert r["best_static"] == "static" and r["hindsight_mean"] == pytest.approx(6.5)
    assert r["headroom"] == pytest.approx((8.5 - 6.5) / 8.5) and not r["no_headroom"]
    assert "learned" not in rows["ppo, untrained start"]


def test_a_generalisation_task_uses_the_static_heuristic_chosen_on_the_agents_task(tmp_path):
    res = run_benchmark(["azure-conv-load1.3"], quick=True, out=tmp_path, baselines=["fcfs", "sarathi"],
                        hindsight_sims=0)
    r = res["tasks"]["azure-conv-load1.3"]
    static = next(row for row in r["rows"] if row["kind"] == "static")
    assert static["params"]["chosen_on"] == "azure-conv seeds 98, 99"
    assert r["best_static"] == res["static_family"]["azure-conv"]["chosen"]
    assert "azure-conv-load1.3" not in res["static_family"] and math.isnan(r["headroom"])


def test_higher_is_better_tasks_and_ties_score_as_documented():
    assert normalised(5.0, fcfs=2.0, best=5.0) == 1.0 and normalised(2.0, fcfs=2.0, best=5.0) == 0.0
    assert normalised(6.5, fcfs=2.0, best=5.0) == 1.5  # above 1 beats the best baseline
    assert math.isnan(normalised(3.0, fcfs=4.0, best=4.0))
    task = next(t for t in TASKS if not t.lower_is_better)
    r = score_task(task, [Entry("fcfs", "baseline", [1.0, 1.2], [True, True]),
                          Entry("echo", "baseline", [2.0, 2.2], [True, True]),
                          Entry("x", "policy", [3.0, 3.3], [True, True])])
    assert r["best_baseline"] == "echo" and r["rows"][0]["name"] == "x"
    assert r["rows"][0]["normalised"] == pytest.approx((3.15 - 1.1) / (2.1 - 1.1))
    assert r["rows"][0]["paired_rel_vs_best"] == pytest.approx(0.5)


def test_cli_benchmark_quick_and_bad_task(tmp_path, capsys):
    assert main(["benchmark", "--quick", "--task", "jaillet-high", "--out", str(tmp_path), "--quiet",
                 "--policy", "sjf:max_num_seqs=96"]) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert any(r["name"] == "sjf:max_num_seqs=96" and r["kind"] == "policy" for r in res["tasks"]["jaillet-high"]["rows"])
    assert main(["benchmark", "--task", "nope", "--out", str(tmp_path)]) == 2
    assert "task: unknown 'nope'; allowed: azure-conv" in capsys.readouterr().err
    # --reuse: a missing or foreign file is one line and exit 2, before anything runs
    (tmp_path / "other.json").write_text('{"rows": []}')
    for bad, says in ((tmp_path / "missing", "missing: no such results.json"),
                      (tmp_path / "other.json", "other.json: not a benchmark results.json (KeyError: 'protocol')")):
        assert main(["benchmark", "--quick", "--task", "jaillet-high", "--reuse", str(bad), "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: reuse: ") and err.endswith(says) and "\n" not in err


def test_identical_entrants_are_marked_once():
    task = TASKS[0]
    r = score_task(task, [Entry("fcfs", "baseline", [3.0, 4.0], [True, True]),
                          Entry("sjf", "baseline", [2.0, 3.0], [True, True]),
                          Entry("mcsf", "baseline", [2.0, 3.0], [True, True])])
    rows = {row["name"]: row for row in r["rows"]}
    assert rows["mcsf"]["same_as"] == "sjf" and "same_as" not in rows["sjf"] and "same_as" not in rows["fcfs"]


# A family on five validation workloads (the last one is the single seed 99 of the old rule): "mlfq"
# is the best on seed 99 but collapses on two workloads, as mlfq/0/64 does on azure-conv-tail; "las"
# is a little behind it everywhere it does not collapse; "fast" is the best of all but leaves requests
# unserved on one workload; "total" is steady and never the best.
_FAMILY = {
    "mlfq": [500.0, 37400.0, 730.0, 102500.0, 711.0],
    "las": [550.0, 1800.0, 730.0, 2200.0, 736.0],
    "fast": [400.0, 1000.0, 600.0, 1500.0, 600.0],
    "total": [600.0, 2000.0, 800.0, 2400.0, 800.0],
}
_DONE = {m: [True] * 5 for m in _FAMILY} | {"fast": [True, True, False, True, True]}


def test_several_validation_workloads_choose_what_one_seed_does_not():
    # the single-seed rule (seed 99 alone) picks mlfq; over the five workloads las wins
    assert rank_family({m: v[-1:] for m, v in _FAMILY.items()}, {m: d[-1:] for m, d in _DONE.items()})[0][0] == "fast"
    one = rank_family({m: v[-1:] for m, v in _FAMILY.items() if m != "fast"}, {m: [True] for m in _FAMILY})
    assert [m for m, _ in one] == ["mlfq", "las", "total"]
    ranked = rank_family(_FAMILY, _DONE)
    # fast never completes workload 3: not eligible, and it is no reference for the others' ratios
    assert [m for m, _ in ranked] == ["las", "total", "mlfq"]
    best = [500.0, 1800.0, 730.0, 2200.0, 711.0]
    for m, score in ranked:
        assert score == pytest.approx(np.mean([v / b for v, b in zip(_FAMILY[m], best, strict=True)]))
    assert dict(ranked)["las"] == pytest.approx((1.1 + 1 + 1 + 1 + 736 / 711) / 5)
    assert dict(ranked)["mlfq"] > 10  # a collapse on one workload outweighs being best on the others


def test_rank_family_higher_is_better_zeros_and_ties():
    # goodput: higher is better, the ratio v / best is maximised; 0 of 0 counts as the best
    got = rank_family({"a": [2.0, 0.0, 1.0], "b": [1.0, 0.0, 1.0], "c": [2.0, 0.0, 0.5]},
                      {m: [True] * 3 for m in "abc"}, lower_is_better=False)
    assert got == [("a", 1.0), ("b", pytest.approx(5 / 6)), ("c", pytest.approx(5 / 6))]  # b, c tie: by label
    assert rank_family({"z": [1.0], "y": [1.0]}, {"z": [True], "y": [True]}) == [("y", 1.0), ("z", 1.0)]
    # a member that scores more than a workload's best of 0 (lower is better) counts infinite there
    got = rank_family({"a": [0.0, 2.0], "b": [1.0, 1.0]}, {"a": [True, True], "b": [True, True]})
    assert got == [("a", 1.5), ("b", math.inf)]
    # nothing complete, or a non-finite value: no choice rather than a wrong one
    assert rank_family({"a": [1.0]}, {"a": [False]}) == []
    assert rank_family({"a": [math.nan], "b": [2.0]}, {"a": [True], "b": [True]}) == [("b", 1.0)]


def test_reuse_takes_the_same_cells_and_a_witness_catches_a_changed_result(tmp_path):
    kw = {"quick": True, "baselines": ["fcfs", "sarathi"], "hindsight_sims": 2}
    first = run_benchmark(["jaillet-high"], out=tmp_path / "a", **kw)
    again = run_benchmark(["jaillet-high"], out=tmp_path / "b", reuse=[tmp_path / "a"], **kw)
    # the same figures (a search's wall time aside), every one taken but the witnesses, which ran again
    def figures(res):
        return json.loads(re.sub(r'"wall_time_s": [0-9.e-]+', '"wall_time_s": 0', json.dumps(res["tasks"])))

    assert figures(again) == figures(first) and again["static_family"] == first["static_family"]
    n_fam = len(first["static_family"]["jaillet-high"]["values"]) * 2
    assert again["reuse"]["cells"] == {"validation": {"jaillet-high": [n_fam, n_fam]},
                                       "test": {"jaillet-high": [8, 8]}}  # fcfs, sarathi, static, hindsight x 2
    # the witnesses: one policy cell of the task and the first hindsight search taken
    assert [w.split(": ")[1].startswith("static:") or w.split(": ")[1].startswith("hindsight")
            for w in again["reuse"]["witnesses"]] == [True, True]
    assert "hindsight seed 100" in again["reuse"]["witnesses"][1]
    board = (tmp_path / "b" / "leaderboard.md").read_text()
    assert f"Reused: {n_fam + 8} of {n_fam + 8} cells" in board and "taken from an earlier run (same inputs): 8 of 8" in board
    # a stored result the code no longer gives (here: tampered with) stops the run with one line
    res = json.loads((tmp_path / "a" / "results.json").read_text())
    fam = res["static_family"]["jaillet-high"]
    witness = again["reuse"]["witnesses"][0]
    label = witness.split(": ", 1)[1].rsplit(" seed ", 1)[0]
    fam["values"][label][fam["validation_seeds"].index(int(witness.rsplit(" ", 1)[1]))] *= 1.001
    (tmp_path / "c.json").write_text(json.dumps(res))
    with pytest.raises(ValueError, match=r"^reuse: .* the code changed since; run without --reuse$"):
        run_benchmark(["jaillet-high"], out=tmp_path / "d", reuse=[tmp_path / "c.json"], **kw)
    # a task whose definition changed since (here: the workload's size) matches no stored cell
    from llmsched_gym.benchmark import _cell_key, reusable_cells

    res = json.loads((tmp_path / "a" / "results.json").read_text())
    task = next(t for t in TASKS if t.name == "jaillet-high")
    over = {**task.overrides, **task.quick_overrides}
    key = _cell_key(("policy", (task, "fcfs", 100, over)))
    fcfs = next(row for row in res["tasks"]["jaillet-high"]["rows"] if row["name"] == "fcfs")
    assert reusable_cells(res)[key] == (fcfs["values"][0], True)
    for t in (res["tasks"]["jaillet-high"]["task"], res["static_family"]["jaillet-high"]["task"]):
        t["quick_overrides"] = {"workload.n_requests": 401}
    assert key not in reusable_cells(res) and not any('"jaillet-high"' in k and '400' in k for k in reusable_cells(res))
    with pytest.raises(ValueError, match="^reuse: .*nothing: no such results.json$"):
        run_benchmark(["jaillet-high"], out=tmp_path / "e", reuse=[tmp_path / "nothing"], **kw)


def test_reusable_agent_rows_need_to_know_which_model_ran():
    from dataclasses import asdict

    from llmsched_gym.benchmark import _cell_key, reusable_cells

    task = next(t for t in TASKS if t.name == "jaillet-high")
    rows = [{"name": "ppo, 10k steps", "kind": "agent", "values": [7.0, 8.0], "complete": True,
             "params": {"path": "runs/a"}},
            {"name": "ppo, untrained start", "kind": "start", "values": [9.0, 9.5], "complete": True,
             "params": {"path": "runs/a"}},
            {"name": "ppo2", "kind": "agent", "values": [1.0, 2.0], "complete": False, "params": {"path": "runs/b"}}]
    res = {"protocol": {"quick": False, "test_seeds": [100, 101]},
           "tasks": {"jaillet-high": {"task": asdict(task), "rows": rows}}}

    def key(path, best, seed):
        return _cell_key(("agent", (task, path, best, seed, task.overrides)))

    assert not any('"agent"' in k for k in reusable_cells(res))  # which model ran is unknown: nothing taken
    assumed = reusable_cells(res, best_model=True)  # a run with --best, checked by its witness episode
    assert assumed[key("runs/a", True, 101)] == (8.0, True, "ppo, 10k steps")
    assert assumed[key("runs/a", "start", 100)] == (9.0, True, "ppo, untrained start")
    assert key("runs/a", False, 100) not in assumed and key("runs/b", True, 100) not in assumed  # incomplete: runs
    res["protocol"]["best_model"] = False  # the results say: the final model
    said = reusable_cells(res, best_model=True)
    assert key("runs/a", False, 100) in said and key("runs/a", True, 100) not in said


def test_reuse_says_a_failing_check_run_failed_not_that_the_code_changed(tmp_path, monkeypatch):
    import llmsched_gym.benchmark as bm

    kw = {"quick": True, "baselines": ["fcfs"], "hindsight_sims": 0}
    run_benchmark(["jaillet-high"], out=tmp_path / "a", **kw)

    def broken(args):
        raise RuntimeError("worker died")

    monkeypatch.setattr(bm, "_run_cell", broken)
    with pytest.raises(ValueError, match=r"^reuse: the check run jaillet-high: .* failed \(.*worker died.*\); "
                                         r"fix that and run again$"):
        run_benchmark(["jaillet-high"], out=tmp_path / "b", reuse=[tmp_path / "a"], **kw)


def test_the_leaderboard_says_when_the_single_seed_choice_fails_another_seed():
    from llmsched_gym.benchmark import _choice_lines

    fam = {"values": _FAMILY, "completed": _DONE, "scores": dict(rank_family(_FAMILY, _DONE)), "chosen": "las",
           "validation_seeds": [95, 96, 97, 98, 99], "top_on_seed": 99}
    results = {"tasks": {"t": {"task": {"lower_is_better": True}}}, "static_family": {"t": fam}}
    line = _choice_lines(results, "t")[0]
    # seed 99 alone picks "fast", which leaves requests unserved on workload 3: no five-seed score
    assert "Seed 99 alone would choose fast (it does not complete every validation seed)." in line
    fam["completed"] = {m: [True] * 5 for m in _FAMILY}
    fam["scores"] = dict(rank_family(_FAMILY, fam["completed"]))
    fam["chosen"] = next(iter(fam["scores"]))
    assert "alone would choose" not in _choice_lines(results, "t")[0]  # fast is now the choice itself


def test_the_score_plot_draws_every_row_with_its_name_shortened_in_the_middle(tmp_path, monkeypatch):
    """An agent and its untrained start share a long name's start: each keeps its bar and its end
    (the checkpoint, "untrained start") shows; the plot's layout fits (no matplotlib warning)."""
    import warnings

    import matplotlib.pyplot as plt

    names = ["hindsight", "static:order=total,chunk_size=256,max_num_seqs=256",
             "ppo priority/shortest-order budget 256, untrained start",
             "ppo priority/shortest-order budget 256, best model at 221k of 326k steps", "lpm"]
    kinds = ["reference", "static", "start", "agent", "baseline"]
    rows = [{"name": n, "kind": k, "normalised": 2.0 - i / 4} for i, (n, k) in enumerate(zip(names, kinds, strict=True))]
    results = {"tasks": {"azure-conv": {"rows": rows, "information": "predicted"}}}
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    monkeypatch.setattr("llmsched_gym.benchmark.leaderboard", lambda r: "")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_outputs(results, tmp_path)
    ax = figures[0].axes[0]
    # the labels from the top down (the first row at the top)
    labels = [t.get_text() for _, t in sorted(zip(ax.get_yticks(), ax.get_yticklabels(), strict=True),
                                              key=lambda x: -x[0])]
    assert len(ax.patches) == len(rows) and len(set(labels)) == len(rows)
    assert labels[0] == "hindsight" and labels[-1] == "lpm"
    assert all(len(x) <= 32 for x in labels)
    assert labels[2].endswith("untrained start") and labels[3].endswith("326k steps")
    assert all(lb[:10] == n[:10] for lb, n in zip(labels, names, strict=True))
    plt.close(figures[0])
