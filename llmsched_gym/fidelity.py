"""``llmsched fidelity``: how far each batch-time model is from real GPU measurements.

Two kinds of measurement are scored:

* **Operator profiles** (Vidur's ``mlp.csv``, see :mod:`llmsched_gym.core.profile`): the
  measured linear part of an iteration for 1 to several thousand tokens. A model's linear part is
  its time for ``n`` decode requests at context 0, ``batch_time(0, 0, 0, n, 0)`` (attention over
  an empty context is negligible), or ``linear_time(n)`` for the profile model and the
  ``calibrated:`` presets, which add a modelled all-reduce the per-GPU profile does not contain. Each model is scored against the
  profiles of its own model, GPU and tensor-parallel degree; a model given with ``--latency``
  against every profile. The profile model built from the scored profile is scored twice: at
  the measured points (its non-decreasing fit of them) and leave-one-out (each point predicted
  from its two neighbours: the error between measured batch sizes).
* **Iteration logs** measured on a GPU (``llmsched gpu replay``'s ``replay.csv``, or any CSV with
  the batch-shape columns and ``time_s``): every model's prediction per iteration.

Per point and per iteration the error is ``predicted / measured - 1``; the report gives the
mean absolute percentage error (MAPE), the worst case and where, and the mean signed error.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from llmsched_gym.core.latency import (
    CALIBRATED_PRESETS,
    PROFILE_COLUMNS,
    ROOFLINE_PRESETS,
    CalibratedLatency,
    LatencyModel,
    RooflineLatency,
    SummedLatency,
    list_latency_presets,
    make_latency,
)
from llmsched_gym.core.models import get_gpu, get_model
from llmsched_gym.core.profile import (
    FIT_MAX_TOKENS,
    LinearProfile,
    ProfileLatency,
    find_profile,
    fit_roofline,
    loo_errors,
    read_vidur_mlp,
    vidur_names,
)

BUILTIN_PAIRS: dict[str, tuple[str, str]] = {"linear": ("Llama-2-7B", "A100-80GB"),
                                             "piecewise": ("Llama-2-7B", "A100-80GB")}
"""The model and GPU the parameter-free presets' defaults were estimated for."""

FITTED = "roofline fitted to this profile"
"""Label of :func:`~llmsched_gym.core.profile.fit_roofline` on the scored profile (the
calibration of a ``calibrated:`` preset, for every profile and TP degree)."""

GROUNDED = "grounded (profile model)"
"""Label of the profile model built from the scored profile, at the measured points."""

GROUNDED_LOO = "grounded (leave-one-out)"
"""The same, each point predicted from its two neighbours (between measured batch sizes)."""


def load_profiles(sources: list[str] | None = None, tps: tuple[int, ...] | None = None
                  ) -> list[tuple[str, LinearProfile]]:
    """``(spec, profile)`` for every source (``vidur:GPU/MODEL`` or a path) and TP degree.

    :param sources: default: every ``vidur:GPU/MODEL`` a copy is found of (see
        :func:`~llmsched_gym.core.profile.find_profile`).
    :param tps: tensor-parallel degrees to keep (default: all measured).
    :raises ValueError: a named source is not found or a TP degree is in none of them.
    """
    if sources is None:
        sources = [name for name in vidur_names() if find_profile(name)]
    out = []
    for src in sources:
        path = find_profile(src) if src.startswith("vidur:") else Path(src)
        if path is None:
            raise ValueError(f"fidelity: profile {src}: mlp.csv not found; `llmsched data download {src}`")
        for tp, prof in read_vidur_mlp(str(path)).items():
            if tps is None or tp in tps:
                out.append((src if src.startswith("vidur:") else f"profile:{src}", prof))
    if not out:
        raise ValueError(f"fidelity: no profile at tp in {tps}" if sources else
                         "fidelity: no profile found; `llmsched data download vidur:a100/llama-2-7b` (or --profile PATH)")
    return out


def matching_models(spec: str, prof: LinearProfile) -> dict[str, LatencyModel]:
    """The built-in models made for this profile's model, GPU and TP degree (label -> model)."""
    gpu = replace(prof.gpu, count=prof.tp)
    models: dict[str, LatencyModel] = {}

    def same(model_name: str, gpu_name: str) -> bool:
        g = get_gpu(gpu_name)
        return (get_model(model_name).name == prof.model.name and g.count == prof.tp
                and (g.tflops, g.hbm_tb_s) == (gpu.tflops, gpu.hbm_tb_s))

    for name, (m, g) in ROOFLINE_PRESETS.items():
        if same(m, g):
            models[name] = make_latency(name)
    if not models:  # the roofline with our default factors, where no preset names the pair
        models[f"roofline (mfu 0.5, mbu 0.8, 1.5 ms; {prof.model.name}/{prof.gpu.name} x{prof.tp})"] = \
            RooflineLatency(prof.model, gpu)
    for name, p in CALIBRATED_PRESETS.items():
        if same(p.model, p.gpu):
            models[name] = CalibratedLatency(name)
    fit = fit_roofline(prof)
    models[FITTED] = RooflineLatency(prof.model, gpu, fit.mfu, fit.mbu, fit.overhead_s)
    for name, (m, g) in BUILTIN_PAIRS.items():
        if same(m, g):
            models[name] = make_latency(name)
    return models


def linear_part(model: LatencyModel, tokens: np.ndarray) -> np.ndarray:
    """A model's time for ``n`` tokens at context 0 (see the module docstring)."""
    if isinstance(model, SummedLatency):
        return np.array([model.linear_time(float(n)) for n in tokens])
    return np.array([model.batch_time(0, 0, 0, int(n), 0) for n in tokens])


def _stats(tokens: np.ndarray, rel: np.ndarray) -> dict[str, Any]:
    k = int(np.argmax(np.abs(rel)))
    return {"points": len(rel), "mape": float(np.mean(np.abs(rel))), "worst": float(rel[k]),
            "worst_at": int(tokens[k]), "bias": float(np.mean(rel)),
            "per_point": {"tokens": [int(x) for x in tokens], "rel_err": [float(x) for x in rel]}}


def score_profile(spec: str, prof: LinearProfile, extra: dict[str, LatencyModel],
                  max_tokens: int = FIT_MAX_TOKENS) -> dict[str, Any]:
    """Every matching model's (and every ``extra`` model's) linear-part error against ``prof``."""
    keep = prof.tokens <= max_tokens
    n, y = prof.tokens[keep], prof.seconds[keep]
    inner = np.nonzero(keep)[0]
    inner = inner[(inner > 0) & (inner < len(prof.tokens) - 1)]
    grounded = ProfileLatency(prof, spec, mfu=1.0, mbu=1.0)  # efficiencies do not enter the linear part
    rows = {GROUNDED: _stats(n, linear_part(grounded, n) / y - 1.0),
            GROUNDED_LOO: _stats(prof.tokens[inner], loo_errors(prof, max_tokens))}
    for label, model in {**matching_models(spec, prof), **extra}.items():
        rows[label] = _stats(n, linear_part(model, n) / y - 1.0)
    return {"profile": spec, "label": prof.label, "tp": prof.tp, "source": prof.source,
            "tokens": [int(n[0]), int(n[-1])], "models": rows}


def read_measured_iterations(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Batch shapes (``PROFILE_COLUMNS[:5]``) and measured seconds of a measured iteration log.

    Accepts ``llmsched gpu replay``'s ``replay.csv`` (the mean of its ``measured_K_s`` columns)
    or any CSV with the five shape columns and ``time_s``.
    """
    path = Path(path)
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        missing = [c for c in PROFILE_COLUMNS[:5] if c not in header]
        measured = [c for c in header if c.startswith("measured_") and c.endswith("_s")] or (
            ["time_s"] if "time_s" in header else [])
        if missing or not measured:
            raise ValueError(f"fidelity: {path}:1: needs columns {', '.join(PROFILE_COLUMNS[:5])} and time_s "
                             "(or replay.csv's measured_K_s)" + (f"; missing {missing[0]!r}" if missing else ""))
        shapes, times = [], []
        for line, row in enumerate(reader, start=2):
            try:
                shapes.append([int(float(row[c])) for c in PROFILE_COLUMNS[:5]])
                times.append(math.fsum(float(row[c]) for c in measured) / len(measured))
            except ValueError as e:
                raise ValueError(f"fidelity: {path}:{line}: {e}") from None
    return np.array(shapes, dtype=np.int64).reshape(-1, 5), np.array(times)


def score_iterations(shapes: np.ndarray, measured: np.ndarray, models: dict[str, LatencyModel]) -> dict[str, Any]:
    """Per-iteration error of every model on measured iterations (idle ones, time 0, skipped)."""
    busy = measured > 0
    out = {}
    for label, model in models.items():
        pred = np.array([model.batch_time(*map(int, s)) for s in shapes[busy]])
        rel = pred / measured[busy] - 1.0
        stats = _stats(np.nonzero(busy)[0], rel)
        stats["worst_iteration"] = stats.pop("worst_at")
        stats["per_point"] = {"iteration": stats["per_point"].pop("tokens"), "rel_err": stats["per_point"]["rel_err"]}
        stats["makespan_rel_err"] = float(pred.sum() / measured[busy].sum() - 1.0)
        out[label] = stats
    return out


def default_iteration_models() -> dict[str, LatencyModel]:
    """Every concrete preset but ``unit`` (rounds, not seconds) and the templates."""
    names = [n for n in list_latency_presets() if n != "unit" and not any(c.isupper() for c in n) and "..." not in n]
    return {n: make_latency(n) for n in names}


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, r in result["models"].items():
        pp = r["per_point"]
        ax.plot(pp["tokens"], [100 * e for e in pp["rel_err"]], label=f"{label} (MAPE {r['mape']:.1%})",
                lw=1.2, ls="--" if label == GROUNDED_LOO else "-")
    ax.axhline(0, color="black", lw=0.6)
    ax.axhspan(-5, 5, color="green", alpha=0.08, label="within 5%")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens in the batch")
    ax.set_ylabel("predicted / measured - 1 (%)")
    ax.set_title(f"linear part vs {result['label']} ({result['profile']})")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def render_markdown(results: dict[str, Any]) -> str:
    """The report as markdown: one table per profile, then the iteration logs."""
    lines = ["# Batch-time model fidelity", "",
             "Error = predicted / measured - 1. Profiles: the linear part of an iteration (Vidur's operator "
             f"medians x layers + embedding), up to {results['max_tokens']:,} tokens. "
             f"`{GROUNDED}`: the profile model built from the scored profile (a non-decreasing fit of its "
             f"points); `{GROUNDED_LOO}`: the same with each point predicted from its two neighbours.", ""]
    for r in results["profiles"]:
        lines += [f"## {r['label']} (`{r['profile']}`, {r['tokens'][0]} to {r['tokens'][1]:,} tokens)", "",
                  "| model | points | MAPE | worst (at tokens) | mean error |", "|---|---:|---:|---:|---:|"]
        for label, s in sorted(r["models"].items(), key=lambda kv: kv[1]["mape"]):
            lines.append(f"| `{label}` | {s['points']} | {s['mape']:.2%} | {_pct(s['worst'])} ({s['worst_at']}) "
                         f"| {_pct(s['bias'])} |")
        if r.get("plot"):
            lines += ["", f"![{r['label']}]({r['plot']})"]
        lines.append("")
    for log in results.get("iteration_logs", []):
        lines += [f"## Iteration log `{log['path']}` ({log['iterations']} iterations)", "",
                  "| model | MAPE | worst (iteration) | mean error | makespan error |", "|---|---:|---:|---:|---:|"]
        for label, s in sorted(log["models"].items(), key=lambda kv: kv[1]["mape"]):
            lines.append(f"| `{label}` | {s['mape']:.2%} | {_pct(s['worst'])} ({s['worst_iteration']}) | "
                         f"{_pct(s['bias'])} | {_pct(s['makespan_rel_err'])} |")
        lines.append("")
    return "\n".join(lines)


def run_fidelity(profiles: list[str] | None = None, latency: list[str] | None = None,
                 tps: tuple[int, ...] | None = None, replay: list[str] | None = None,
                 out: str | Path | None = "runs/fidelity", max_tokens: int = FIT_MAX_TOKENS,
                 plots: bool = True) -> dict[str, Any]:
    """Score the models against the profiles (and iteration logs); write ``fidelity.md``,
    ``fidelity.json`` and one plot per profile under ``out`` (nothing written when ``out`` is None).

    :param profiles: ``vidur:GPU/MODEL`` names or paths (default: every one found; none needed
        when only ``replay`` logs are scored).
    :param latency: extra model specs, scored against every profile and every log.
    :param tps: tensor-parallel degrees (default: all measured).
    :param replay: measured iteration logs (see :func:`read_measured_iterations`).
    """
    extra = {m.name: m for m in map(make_latency, latency or [])}
    results: dict[str, Any] = {"max_tokens": max_tokens, "profiles": [], "iteration_logs": []}
    if profiles is not None or not replay:
        for spec, prof in load_profiles(profiles, tps):
            results["profiles"].append(score_profile(spec, prof, extra, max_tokens))
    for path in replay or []:
        shapes, measured = read_measured_iterations(path)
        models = extra or default_iteration_models()
        results["iteration_logs"].append({"path": str(path), "iterations": len(measured),
                                          "models": score_iterations(shapes, measured, models)})
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        for r in results["profiles"]:
            if plots:
                name = f"{r['label'].replace(' / ', '_').replace(' ', '_').lower()}.png"
                _plot(r, out / name)
                r["plot"] = name
        (out / "fidelity.json").write_text(json.dumps(results, indent=1))
        (out / "fidelity.md").write_text(render_markdown(results))
    return results


def import_profile(source: str, out: str | Path, tp: int = 1) -> Path:
    """Write a profile model (``vidur:GPU/MODEL`` or a path) in the project's table format.

    The rows (:func:`~llmsched_gym.core.profile.profile_to_rows`) are single-request prefills of
    1 to 8,192 tokens and decode grids; ``table:OUT`` then interpolates them, and the GPU
    back-end's tools read the same format.
    """
    from llmsched_gym.core.latency import TableLatency
    from llmsched_gym.core.profile import profile_to_rows

    kind = "vidur" if source.startswith("vidur:") else "profile"
    spec = f"{source}{',tp=' + str(tp) if tp != 1 else ''}"
    model = make_latency(spec if kind == "vidur" else f"profile:{spec}")
    if not isinstance(model, ProfileLatency):
        raise ValueError(f"fidelity: {source}: mlp.csv not found; `llmsched data download {source}`")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    TableLatency(profile_to_rows(model), model.name).to_csv(out)
    return out
