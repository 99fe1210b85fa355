"""Learning curves of a training run: the validation score against steps, beside its references.

Every time ``llmsched train`` scores the agent on the validation workload (seed 99: at the
start, every ``--score-every`` rollouts and at the end) the task's metric goes into

* ``curve.json`` in the run folder: the points ``(steps, value)`` and the references;
* ``learning_curve.png`` in the run folder: steps on x, the metric on y, the agent's curve with
  horizontal lines for its untrained **start** (the same policy before any update), the **best
  static heuristic** on this workload (the best member of :func:`baselines.static.static_family`
  on it: ``llmsched benchmark`` chooses its static heuristic over the validation seeds 95-99, and
  that choice may be another member, as good or worse on this one workload), the **hindsight** reference (the best schedule
  found with everything known, :func:`llmsched_gym.hindsight.hindsight`; a reference no scheduler
  can reach) and the **best baseline** (the best registered policy at its defaults);
* TensorBoard (``tb/curves``): ``validation/agent`` and the references as constant scalars
  ``validation/start``, ``validation/best_static``, ``validation/hindsight``,
  ``validation/best_baseline``, drawn together in one chart (the "Custom Scalars" tab,
  ``validation``).

What the run's figures mean: a curve that stays on the start line learned nothing, whatever its
place against the baselines; a curve that crosses the best static heuristic learned something a
fixed rule does not do; the gap to the hindsight line is what is left.

The metric is the recipe's ``task`` (a ``llmsched benchmark`` task: its metric, its direction
and its workload overrides) or, without one, the mean end-to-end latency.

The benchmark's tasks and the hindsight search live in the application layer, above the agents:
``llmsched train`` hands them to :func:`agents.train.train` as a :class:`CurveSetup`
(:func:`llmsched_gym.cli.agents.curve_setup`); without one (a direct call) a recipe cannot name a
task and the curve has no hindsight line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from llmsched_gym.core.metrics import metric_value

CURVE_JSON = "curve.json"
CURVE_PNG = "learning_curve.png"
HINDSIGHT_SIMS = 20
"""Search runs of the hindsight reference on the validation workload (``curves: {hindsight_sims: N}``
in a recipe; 0: no hindsight line). About 0.3-0.5 s each for 1000 azure-conv requests."""


@dataclass(frozen=True)
class Target:
    """What the curve measures: ``metric`` (a dotted path into the run summary), its direction,
    its label, and the validation workload's overrides (the task's, over the recipe's)."""

    metric: str = "serving.mean_e2el_ms"
    lower_is_better: bool = True
    label: str = "Mean E2EL (ms)"
    overrides: dict[str, Any] = field(default_factory=dict)
    task: str | None = None


@dataclass(frozen=True)
class CurveSetup:
    """What the application layer lends a training run's curve.

    :param tasks: benchmark tasks by name, each with ``metric``, ``lower_is_better``, ``label`` and
        ``overrides`` (``llmsched_gym.benchmark.TASKS``).
    :param hindsight: the search ``(scenario, overrides, seed, metric, lower_is_better, start=specs,
        sims=N) -> result with .value, .n_sims, .wall_s`` (``llmsched_gym.hindsight.hindsight``).
    """

    tasks: Mapping[str, Any] = field(default_factory=dict)
    hindsight: Callable[..., Any] | None = None
    route_hindsight: Callable[..., Any] | None = None
    """Routing runs: the router search, same signature (``llmsched_gym.route_hindsight.route_hindsight``)."""


def completed(summary: dict[str, Any]) -> bool:
    """Every request served and none rejected, or the horizon reached without a loop: the runs whose
    latencies ``llmsched benchmark`` compares (an incomplete run's cover the served requests only)."""
    rejected = summary.get("n_rejected", 0)
    return (summary["n_completed"] + rejected == summary["n_arrived"] and rejected == 0
            or (summary.get("stop_reason") == "horizon" and not summary.get("non_terminating")))


def _label(spec: dict[str, Any]) -> str:
    extra = ",".join(f"{k}={v}" for k, v in spec.items() if k != "name")
    return f"{spec['name']}:{extra}" if extra else spec["name"]


def target(task: str | None, overrides: dict[str, Any], tasks: Mapping[str, Any] | None = None) -> Target:
    """The validation target of a recipe: its benchmark ``task`` (metric, direction and exactly the
    task's workload: the one ``llmsched benchmark`` scores, whatever the training episodes'
    ``overrides``), else the mean E2EL on ``overrides``.

    :raises ValueError: an unknown task (one line naming the allowed ones).
    """
    if task is None:
        return Target(overrides=dict(overrides))
    if not tasks:
        raise ValueError(f"task: {task!r} needs the benchmark's tasks (llmsched train lends them; a direct "
                         "call passes curves=CurveSetup(tasks=...))")
    if task not in tasks:
        raise ValueError(f"task: unknown {task!r}; allowed: {', '.join(tasks)}")
    t = tasks[task]
    return Target(t.metric, t.lower_is_better, t.label, dict(t.overrides), task)


def references(scenario: str, tgt: Target, seed: int, information: str, hindsight_sims: int = HINDSIGHT_SIMS,
               family: list[dict[str, Any]] | None = None, hindsight: Callable[..., Any] | None = None
               ) -> dict[str, Any]:
    """The best static heuristic and the hindsight reference on the validation workload.

    :param information: what the env tells the agent of output lengths (``clairvoyant``,
        ``predicted``, ``blind``): the static family is restricted to the orders it allows.
    :param family: the static specs to try (default: the whole family ``information`` allows).
    :param hindsight: the search (:class:`CurveSetup`); ``None``: no hindsight reference.
    :returns: ``{"best_static": {"name", "value"}, "hindsight": {"value", "n_sims", "wall_s"} or None}``.
    """
    from baselines.static import static_family
    from llmsched_gym.sim import simulate

    sign = 1.0 if tgt.lower_is_better else -1.0
    scored = []
    for spec in family if family is not None else static_family(information):
        s = simulate(scenario, spec, seed, tgt.overrides).summary
        v = metric_value(s, tgt.metric)
        if completed(s) and np.isfinite(v):
            scored.append((sign * v, _label(spec), spec, v))
    scored.sort(key=lambda x: (x[0], x[1]))
    out: dict[str, Any] = {"best_static": None, "hindsight": None}
    if scored:
        out["best_static"] = {"name": scored[0][1], "value": scored[0][3]}
    if hindsight is not None and hindsight_sims and scored:
        r = hindsight(scenario, tgt.overrides, seed, tgt.metric, tgt.lower_is_better,
                      start=[x[2] for x in scored[:3]], sims=hindsight_sims)
        # a feasible schedule either way: never worse than the static heuristic on this workload
        value = min(r.value, scored[0][3]) if tgt.lower_is_better else max(r.value, scored[0][3])
        out["hindsight"] = {"value": value, "n_sims": r.n_sims, "wall_s": r.wall_s}
    return out


class LearningCurve:
    """Collects the validation scores of a run and writes ``curve.json``, ``learning_curve.png``
    and the TensorBoard scalars (module docstring).

    :param run_dir: the run folder.
    :param tgt: what is measured.
    :param refs: :func:`references`' result (``best_static``, ``hindsight``).
    :param best_baseline: ``(name, value)`` of the best registered baseline on the workload, or ``None``.
    :param tensorboard: write TensorBoard scalars under ``run_dir/tb/curves``.
    """

    def __init__(self, run_dir: Path, tgt: Target, refs: dict[str, Any],
                 best_baseline: tuple[str, float] | None = None, tensorboard: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.target = tgt
        self.refs = dict(refs)
        self.best_baseline = best_baseline
        self.points: list[tuple[int, float]] = []
        self.start: float | None = None
        self.note = ""  # appended to the plot's title: " (synthetic stand-in)" when the trace was missing
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self.run_dir / "tb" / "curves"))
            lines = ["validation/agent", "validation/start", "validation/best_static", "validation/hindsight",
                     "validation/best_baseline"]
            self._writer.add_custom_scalars({"validation": {tgt.label: ["Multiline", lines]}})

    @classmethod
    def for_run(cls, run_dir: Path, scenario: str, tgt: Target, seed: int, information: str,
                baselines: dict[str, dict], hindsight_sims: int = HINDSIGHT_SIMS,
                family: list[dict[str, Any]] | None = None, tensorboard: bool = True,
                hindsight: Callable[..., Any] | None = None, routing: bool = False) -> LearningCurve:
        """The curve of a training run: :func:`references` on the validation workload and the best
        of ``baselines`` (``{name: summary}`` on the same workload, as ``llmsched train`` computes
        them) by the target metric.

        ``routing``: the baselines are the routers; the best static heuristic is the best of them
        (as ``llmsched benchmark`` chooses a routing task's) and ``hindsight`` is the router search
        (:func:`llmsched_gym.route_hindsight.route_hindsight`) from the best three."""
        sign = 1.0 if tgt.lower_is_better else -1.0
        scored = sorted((sign * v, name, v) for name, s in baselines.items()
                        if completed(s) and np.isfinite(v := metric_value(s, tgt.metric)))
        if routing:
            refs: dict[str, Any] = {"best_static": {"name": scored[0][1], "value": scored[0][2]} if scored else None,
                                    "hindsight": None}
            if hindsight is not None and hindsight_sims and scored:
                r = hindsight(scenario, tgt.overrides, seed, tgt.metric, tgt.lower_is_better,
                              start=[x[1] for x in scored[:3]], sims=hindsight_sims)
                value = min(r.value, scored[0][2]) if tgt.lower_is_better else max(r.value, scored[0][2])
                refs["hindsight"] = {"value": value, "n_sims": r.n_sims, "wall_s": r.wall_s}
        else:
            refs = references(scenario, tgt, seed, information, hindsight_sims, family, hindsight)
        curve = cls(run_dir, tgt, refs, tensorboard=tensorboard)
        curve.best_baseline = (scored[0][1], scored[0][2]) if scored else None
        return curve

    def value(self, summary: dict[str, Any]) -> float:
        """The target metric of a run summary; nan when the run rejected or left requests unserved
        (its latencies would cover the served requests only: ``llmsched benchmark``'s rule)."""
        return metric_value(summary, self.target.metric) if completed(summary) else math.nan

    def reference_lines(self) -> dict[str, float]:
        """The horizontal lines: start, best static heuristic, hindsight, best baseline (those known)."""
        lines = {"start": self.start,
                 "best_static": (self.refs.get("best_static") or {}).get("value"),
                 "hindsight": (self.refs.get("hindsight") or {}).get("value"),
                 "best_baseline": self.best_baseline[1] if self.best_baseline else None}
        return {k: float(v) for k, v in lines.items() if v is not None and np.isfinite(v)}

    def record(self, steps: int, summary: dict[str, Any]) -> float:
        """Add the agent's score after ``steps`` training steps (the first one is the start's) and
        rewrite the outputs; returns the value."""
        v = self.value(summary)
        if not self.points:
            self.start = v
        if self.points and self.points[-1][0] == int(steps) and len(self.points) > 1:
            self.points[-1] = (int(steps), v)  # scored again at the same step (the end after a last rollout)
        else:
            self.points.append((int(steps), v))
        if self._writer is not None:
            if np.isfinite(v):
                self._writer.add_scalar("validation/agent", v, int(steps))
            for key, ref in self.reference_lines().items():
                self._writer.add_scalar(f"validation/{key}", ref, int(steps))
            self._writer.flush()
        self.write()
        return v

    def wrap(self, evaluate: Any) -> Any:
        """``evaluate(model) -> summary``, recording every score at ``model.num_timesteps``."""

        def scored(model: Any) -> dict[str, Any]:
            s = evaluate(model)
            self.record(int(getattr(model, "num_timesteps", 0)), s)
            return s

        return scored

    def as_dict(self) -> dict[str, Any]:
        best = self.best_baseline
        return {"target": asdict(self.target), "points": [[s, v] for s, v in self.points],
                "start": self.start, "references": self.refs,
                "best_baseline": {"name": best[0], "value": best[1]} if best else None, "note": self.note}

    def write(self) -> None:
        data = self.as_dict()
        (self.run_dir / CURVE_JSON).write_text(json.dumps(data, indent=1, default=float) + "\n")
        plot_curve(data, self.run_dir / CURVE_PNG)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def plot_curve(curve: dict[str, Any], path: Path, title: str | None = None) -> bool:
    """Draw a curve (``curve.json``'s content) as a PNG; ``False`` when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    pts = [(s, v) for s, v in curve["points"] if v is not None and np.isfinite(v)]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color="tab:orange", ms=3, label="agent (validation)")
    refs = curve.get("references") or {}
    lines = [("start", curve.get("start"), "tab:red", "untrained start"),
             ("best_static", (refs.get("best_static") or {}).get("value"), "tab:green",
              f"best static on this workload ({(refs.get('best_static') or {}).get('name', '')})"),
             ("hindsight", (refs.get("hindsight") or {}).get("value"), "tab:grey", "hindsight reference"),
             ("best_baseline", (curve.get("best_baseline") or {}).get("value"), "tab:blue",
              f"best baseline ({(curve.get('best_baseline') or {}).get('name', '')})")]
    for _, value, color, label in lines:
        if value is not None and np.isfinite(value):
            ax.axhline(value, color=color, ls="--", lw=1.0, label=f"{label}: {value:.4g}")
    t = curve["target"]
    ax.set_xlabel("training steps")
    ax.set_ylabel(f"{t['label']} ({'lower' if t['lower_is_better'] else 'higher'} is better)")
    ax.set_title(title or f"{t.get('task') or 'validation'}: seed 99{curve.get('note', '')}", fontsize=10)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


__all__ = ["CURVE_JSON", "CURVE_PNG", "CurveSetup", "LearningCurve", "Target", "completed", "metric_value", "plot_curve",
           "references", "target"]
