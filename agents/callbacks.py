"""Training callbacks: scheduling metrics in TensorBoard, score against the baselines, progress bar.

Custom scalars (``tensorboard --logdir runs``), written at the end of every rollout:

=========================================  ========================================================
``sched/mean_e2el_ms``, ``p99_e2el_ms``    latency of the episodes finished so far (mean over the
``sched/mean_ttft_ms``, ``p99_ttft_ms``    episodes that finished during the rollout, or the last
``sched/mean_tpot_ms``, ``p99_tpot_ms``    finished ones when none did), from the summary's
``sched/mean_itl_ms``                      ``serving`` block: ``vllm bench serve``'s names and units
``sched/output_throughput``                output tokens/s of the completed requests
``sched/total_token_throughput``           prompt + output tokens/s of the completed requests
``sched/evictions``, ``recomputed_tokens``  preemptions and the tokens they made recompute
``sched/completed_frac``                   completed / arrived
``sched/slo_attainment``, ``request_goodput``  only when the scenario has SLOs
``sched/episodes``                         episodes finished since training began
``eval/mean_e2el_ms``, ``eval/p99_ttft_ms``  the deterministic agent on the fixed evaluation workload
``eval/rel_mean_e2el_ms_vs_best``          agent / best baseline (< 1 = the agent is better)
``eval/rel_p99_ttft_ms_vs_best``           same for P99 TTFT
``eval/task_metric``                       the task's own metric (the recipe's benchmark ``task``;
                                           mean E2EL without one)
``eval/rel_task_vs_best``                  agent / best baseline on that metric (best / agent for
                                           a higher-is-better metric): < 1 = the agent is better;
                                           ``best_model`` is the checkpoint that minimised it
=========================================  ========================================================
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from agents.curves import completed
from llmsched_gym.core.metrics import metric_value

SUMMARY_SCALARS: list[tuple[str, Callable[[dict], float]]] = [
    # names and units as `vllm bench serve` prints them (the summary's "serving" block)
    ("mean_e2el_ms", lambda s: s["serving"]["mean_e2el_ms"]),
    ("p99_e2el_ms", lambda s: s["serving"]["p99_e2el_ms"]),
    ("mean_ttft_ms", lambda s: s["serving"]["mean_ttft_ms"]),
    ("p99_ttft_ms", lambda s: s["serving"]["p99_ttft_ms"]),
    ("mean_tpot_ms", lambda s: s["serving"]["mean_tpot_ms"]),
    ("p99_tpot_ms", lambda s: s["serving"]["p99_tpot_ms"]),
    ("mean_itl_ms", lambda s: s["serving"]["mean_itl_ms"]),
    ("output_throughput", lambda s: s["serving"]["output_throughput"]),
    ("total_token_throughput", lambda s: s["serving"]["total_token_throughput"]),
    ("evictions", lambda s: float(s["evictions"])),
    ("recomputed_tokens", lambda s: float(s["recomputed_tokens"])),
    ("completed_frac", lambda s: s["n_completed"] / max(1, s["n_arrived"])),
    ("slo_attainment", lambda s: s.get("slo_attainment", math.nan)),
    ("request_goodput", lambda s: s["serving"].get("request_goodput", math.nan)),
]


class SummaryScalarsCallback(BaseCallback):
    """Record the scheduling metrics of finished episodes (``info["summary"]``) every rollout, and
    the behaviour-cloning phase (``bc/*``: accuracy, loss, samples, seconds) once, at step 0."""

    def __init__(self, bc: dict | None = None) -> None:
        super().__init__()
        self._fresh: list[dict] = []
        self._last: list[dict] = []
        self.n_episodes = 0
        self.bc = bc or {}

    def _on_training_start(self) -> None:
        for key in ("bc_accuracy", "bc_loss", "bc_samples", "bc_seconds", "expert_mean_e2el_ms", "inexpressible_frac"):
            if key in self.bc:
                self.logger.record(f"bc/{key.removeprefix('bc_')}", float(self.bc[key]))
        if self.bc:
            self.logger.dump(self.num_timesteps)

    def _on_step(self) -> bool:
        for info in self.locals.get("infos", ()):
            s = info.get("summary")
            if s is not None:
                self._fresh.append(s)
                self.n_episodes += 1
        return True

    def _on_rollout_end(self) -> None:
        if self._fresh:
            self._last, self._fresh = self._fresh, []
        if not self._last:
            return
        for key, get in SUMMARY_SCALARS:
            vals = [float(get(s)) for s in self._last]
            vals = [v for v in vals if np.isfinite(v)]
            if vals:
                self.logger.record(f"sched/{key}", float(np.mean(vals)))
        self.logger.record("sched/episodes", self.n_episodes)


class BaselineScoreCallback(BaseCallback):
    """Every ``every`` rollouts, play the agent deterministically on a fixed workload and record its
    E2E mean, P99 TTFT and the task's own ``metric`` relative to the best baseline on the same
    workload (computed once). With ``save``, the model with the best relative task metric so far is
    saved as ``best_model`` (with its normalisation statistics): on a P99 TTFT or a fairness task
    that is the task's figure, not the mean latency.

    :param evaluate: ``model -> summary`` on the fixed workload (uses the current normalisation).
    :param baselines: ``{name: summary}`` of the baselines on that workload.
    :param save: ``stem -> None``, saves the current model and statistics as the run's ``stem``.
    :param metric: the task's metric, a dotted path into the summary (``fairness.tick_diff.max``).
    :param lower_is_better: the metric's direction.
    """

    def __init__(self, evaluate: Callable[[Any], dict], baselines: dict[str, dict], every: int = 1,
                 save: Callable[[str], None] | None = None, metric: str = "serving.mean_e2el_ms",
                 lower_is_better: bool = True) -> None:
        super().__init__()
        self.evaluate = evaluate
        self.every = max(1, int(every))
        self.metric, self.lower_is_better = metric, lower_is_better
        self.best = {key: best_value(baselines, get) for key, get in
                     (("mean_e2el_ms", SUMMARY_SCALARS[0][1]), ("p99_ttft_ms", SUMMARY_SCALARS[3][1]))}
        self.best_task = best_value(baselines, lambda s: metric_value(s, metric), lower_is_better)
        self.save = save
        self.best_rel = math.inf  # of the task metric: what best_model minimises
        self.best_rel_e2el = math.inf
        self._rollouts = 0
        self.last: dict[str, float] = {}

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        self._rollouts += 1
        if (self._rollouts - 1) % self.every:
            return
        s = self.evaluate(self.model)
        done = s["n_completed"] / max(1, s["n_arrived"])
        ok = served(s)
        self.last = {"mean_e2el_ms": s["serving"]["mean_e2el_ms"], "p99_ttft_ms": s["serving"]["p99_ttft_ms"],
                     "completed_frac": done}
        for key in ("mean_e2el_ms", "p99_ttft_ms"):
            best = self.best[key]
            # an agent that leaves requests unserved has no comparable latency: count it as 10x worse
            self.last[f"rel_{key}_vs_best"] = self.last[key] / best if ok and best > 0 else 10.0
        value = metric_value(s, self.metric)
        self.last["task_metric"] = value
        self.last["rel_task_vs_best"] = relative(value, self.best_task, self.lower_is_better) if ok else 10.0
        for key, v in self.last.items():
            self.logger.record(f"eval/{key}", float(v))
        self.best_rel_e2el = min(self.best_rel_e2el, self.last["rel_mean_e2el_ms_vs_best"])
        if self.save is not None and self.last["rel_task_vs_best"] < self.best_rel:
            self.best_rel = self.last["rel_task_vs_best"]
            self.save("best_model")


class Checkpoints(BaseCallback):
    """Save ``checkpoints/model_N_steps`` every ``every`` timesteps (N: timesteps so far), in the
    safe agent format (SB3's ``CheckpointCallback`` writes pickles).

    :param save: ``stem -> None``, saves the current model and statistics as the run's ``stem``.
    """

    def __init__(self, every: int, save: Callable[[str], None]) -> None:
        super().__init__()
        self.every, self.save = max(1, int(every)), save
        self._next = self.every

    def _on_step(self) -> bool:
        if self.num_timesteps >= self._next:
            self.save(f"checkpoints/model_{self.num_timesteps}_steps")
            self._next = (self.num_timesteps // self.every + 1) * self.every
        return True


def served(summary: dict[str, Any]) -> bool:
    """Whether a validation run's figures compare: at least 99% of the arrived requests completed, or
    the run stopped at the scenario's horizon without a loop (``engine.horizon_s``: echo-hybrid's
    offline pool is never meant to drain, and ``llmsched benchmark`` scores such runs alike)."""
    return summary["n_completed"] >= 0.99 * summary["n_arrived"] or completed(summary)


def best_value(summaries: dict[str, dict], get: Callable[[dict], float], lower_is_better: bool = True) -> float:
    """The best value of a metric (the lowest, or the highest when ``lower_is_better`` is false) over
    baselines that completed their workload (:func:`served`); nan when none did."""
    vals = [get(s) for s in summaries.values() if served(s)]
    vals = [v for v in vals if np.isfinite(v)]
    if not vals:
        return math.nan
    return float(min(vals) if lower_is_better else max(vals))


def relative(value: float, best: float, lower_is_better: bool = True) -> float:
    """``value`` against the best baseline's, below 1 when ``value`` is better: ``value / best`` for a
    lower-is-better metric, ``best / value`` otherwise; 10 (far worse) where undefined or not
    positive, as for an agent that leaves requests unserved."""
    num, den = (value, best) if lower_is_better else (best, value)
    if num == den:
        return 1.0
    if not (np.isfinite(num) and np.isfinite(den)) or den <= 0 or num < 0:
        return 10.0
    return float(num / den)


class WallClockLimit(BaseCallback):
    """Stop learning once ``minutes`` of wall time have passed since training began (the model and
    its statistics are then saved as after a complete run)."""

    def __init__(self, minutes: float, start: float | None = None) -> None:
        super().__init__()
        self.deadline = (start if start is not None else time.perf_counter()) + 60.0 * minutes
        self.stopped = False

    def _on_step(self) -> bool:
        if time.perf_counter() >= self.deadline:
            self.stopped = True
            return False
        return True


class RichProgressCallback(BaseCallback):
    """A rich progress bar over the timesteps of this ``learn`` call (tqdm is not required). Written
    to a log or a pipe (not a terminal), its line is 100 columns wide: rich's default there, 80,
    would cut the step count, the times and the score."""

    def __init__(self, score: BaselineScoreCallback | None = None) -> None:
        super().__init__()
        self.score = score

    def _on_training_start(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        console = Console()
        if not console.is_terminal:
            console = Console(width=100)
        self.progress = Progress(TextColumn("[bold]train"), BarColumn(bar_width=20), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[note]}"),
                                 console=console)
        self.progress.start()
        total = self.locals["total_timesteps"] - self.model.num_timesteps
        self.task = self.progress.add_task("train", total=total, note="")
        self._t0 = time.perf_counter()

    def _on_step(self) -> bool:
        self.progress.advance(self.task, self.training_env.num_envs)
        return True

    def _on_rollout_end(self) -> None:
        if self.score is not None and self.score.last:
            rel = self.score.last.get("rel_task_vs_best", math.nan)
            self.progress.update(self.task, note=f"{self.score.metric} vs best baseline x{rel:.3f}")

    def _on_training_end(self) -> None:
        self.progress.stop()
