"""Named scenarios: a workload spec, engine settings and a batch-time model, as plain data.

A scenario is a nested dict with four sections::

    workload:  the spec of :func:`llmsched_gym.core.workload.build_workload` (or ``explicit``
               arrays for hand-made instances)
    engine:    fields of :class:`llmsched_gym.core.engine.EngineConfig`
    latency:   a :func:`llmsched_gym.core.latency.make_latency` spec
    policy:    the default policy name (``--policy`` overrides it)

plus ``description`` and ``paper`` (where it comes from). Override any leaf with a dotted key
(``--set workload.n_requests=500 --set engine.kv_capacity_tokens=20000``); values are parsed as
YAML scalars. ``--scenario trace:azure:PATH`` (or ``trace:vtc:``, ``trace:csv:``, ``trace:jsonl:``,
``trace:sharegpt:``) runs a trace file on the ``azure-conv`` engine settings.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from llmsched_gym.config import ConfigError, apply_overrides, check_scenario
from llmsched_gym.core.engine import EngineConfig
from llmsched_gym.core.latency import LatencyModel, make_latency
from llmsched_gym.core.request import Workload, WorkloadError

LMSYS_PROMPT = {"type": "lognormal", "mean": 40.62, "median": 11, "max": 4096}
LMSYS_OUTPUT = {"type": "lognormal", "mean": 85.32, "median": 45, "max": 4096}


def _jaillet(rate: float) -> dict[str, Any]:
    return {
        "description": f"Jaillet et al. 2025, section 7: Poisson {rate:g}/s, LMSYS-like word-count lengths "
        "(lognormal fits of mean/median), Llama-2-70B on 2xA100 with M = 16,492 tokens, token-level KV, "
        "prefill emits no token (convention A).",
        "paper": "Jaillet et al. 2025, section 7",
        "workload": {"arrival": {"type": "poisson", "rate": rate}, "n_requests": 10_000,
                     "prompt": LMSYS_PROMPT, "output": LMSYS_OUTPUT},
        "engine": {"kv_capacity_tokens": 16_492, "block_size": 1, "prefill_emits_token": False,
                   "overflow": "forbid", "kv_bytes_per_token": 327_680},
        "latency": "roofline:llama-2-70b/2xa100",
        "policy": "mcsf",
    }


SCENARIOS: dict[str, dict[str, Any]] = {
    "azure-conv": {
        "description": "Azure LLM inference trace 2023 (conversation, 19,366 requests, its own arrival times); "
        "Llama-2-7B on one A100 (roofline), paged KV with 118,784 tokens (7,424 blocks of 16) as Vidur "
        "sets it, vLLM-style LIFO preemption with recompute. A cut (n_requests, horizon_s) starts at a seeded row. Without the trace (`llmsched data download "
        "azure-conv`) it runs a synthetic stand-in fitted to the trace's statistics, and says so.",
        "paper": "Azure trace of Patel et al. 2024 (Splitwise); capacity as Vidur sets it in Ao et al. 2025, section 6",
        "workload": {"trace": {"format": "azure", "window": "random"}},
        "engine": {"kv_capacity_tokens": 118_784, "block_size": 16, "prefill_emits_token": True,
                   "overflow": "preempt_lifo_recompute", "kv_bytes_per_token": 524_288},
        "latency": "roofline:llama-2-7b/a100",
        "policy": "fcfs",
    },
    "jaillet-high": _jaillet(50.0),
    "jaillet-low": _jaillet(10.0),
    "jaillet-noisy": {
        **_jaillet(50.0),
        "description": "jaillet-high with output lengths known only through a noisy prediction "
        "(round(true x U(0.5, 1.5)); Jaillet et al. 2025, section 8.1, bounds the error instead): memory-aware admission can "
        "under-reserve, so overflow preempts the newest request and recomputes it (vLLM-style).",
        "workload": {**_jaillet(50.0)["workload"], "predictor": {"type": "noisy", "x": 0.5}},
        "engine": {**_jaillet(50.0)["engine"], "overflow": "preempt_lifo_recompute"},
    },
    "vtc-arena": {
        "description": "Sheng et al. 2024's real workload (section 5.3): the 27-client Chatbot Arena trace (1,500 requests over "
        "600 s), Llama-2-7B on an A10G (the affine fit to Sheng et al.'s profile), token-level KV pool of 10,000 tokens. "
        "Without the trace it runs a synthetic 27-client stand-in with the same size and mean lengths, and says so.",
        "paper": "Sheng et al. 2024, section 5.3",
        "workload": {"trace": {"format": "vtc"}},
        "engine": {"kv_capacity_tokens": 10_000, "block_size": 1, "prefill_emits_token": True,
                   "overflow": "preempt_lifo_recompute"},
        "latency": "affine",
        "policy": "fcfs",
    },
    "wait-high": {
        "description": "Ao et al. 2025, high demand (section 6.1): three types (l=20; l'=100/200/300; rates "
        "6000/4000/2000 req/s), 10,000 requests (a burst then a drain, as in the companion code), "
        "Llama-3-8B on an A100 with Vidur's 483,328-token capacity, paged KV, prefill emits no token.",
        "paper": "Ao et al. 2025, section 6.1",
        "workload": {"types": [{"rate": 6000, "prompt": 20, "output": 100},
                               {"rate": 4000, "prompt": 20, "output": 200},
                               {"rate": 2000, "prompt": 20, "output": 300}],
                     "n_requests": 10_000},
        "engine": {"kv_capacity_tokens": 483_328, "block_size": 16, "prefill_emits_token": False,
                   "overflow": "preempt_lifo_recompute", "preempt_mode": "restart",
                   "kv_bytes_per_token": 131_072},
        "latency": "roofline:llama-3-8b/a100",
        "policy": "fcfs",
    },
    "nested-synth4": {
        "description": "Ao et al. 2025, Nested WAIT synthetic 4-type workload (Fig. 11): prefill 10, decode "
        "20/40/80/160, rates 20/40/80/160 req/s (the companion code's values), 15,000 requests, "
        "Llama-3-8B on an A100.",
        "paper": "Ao et al. 2025, section 6.2",
        "workload": {"types": [{"rate": 20, "prompt": 10, "output": 20},
                               {"rate": 40, "prompt": 10, "output": 40},
                               {"rate": 80, "prompt": 10, "output": 80},
                               {"rate": 160, "prompt": 10, "output": 160}],
                     "n_requests": 15_000},
        "engine": {"kv_capacity_tokens": 483_328, "block_size": 16, "prefill_emits_token": False,
                   "overflow": "preempt_lifo_recompute", "preempt_mode": "restart",
                   "kv_bytes_per_token": 131_072},
        "latency": "roofline:llama-3-8b/a100",
        "policy": "fcfs",
    },
    "klpm-toy": {
        "description": "Dexter et al. 2025's toy example (section 4.2): queries U1D1, U2D2, U1D3, U2D4 (user and "
        "document segments of 5 tokens) all at t = 0, batch size 1, cost = uncached prompt tokens "
        "(c_attn = 0), a cache holding only the last prompt. FCFS max TTFT 40, LPM 30.",
        "paper": "Dexter et al. 2025, section 4.2",
        "workload": {"explicit": {
            "arrival_s": [0, 0, 0, 0], "prompt_tokens": [10, 10, 10, 10], "output_tokens": [1, 1, 1, 1],
            "prefix": [[[1, 5], [11, 5]], [[2, 5], [12, 5]], [[1, 5], [13, 5]], [[2, 5], [14, 5]]]}},
        "engine": {"kv_capacity_tokens": 11, "block_size": 1, "prefill_emits_token": True,
                   "overflow": "forbid", "prefix_cap_prompt_minus_one": False},
        "latency": {"type": "affine", "prefill_base_s": 0.0, "prefill_per_seq_s": 0.0,
                    "prefill_per_token_s": 1.0, "prefill_per_ctx_s": 0.0, "decode_base_s": 0.0,
                    "decode_per_seq_s": 0.0, "decode_per_kv_s": 0.0},
        "policy": "fcfs",
    },
    "echo-hybrid": {
        "description": "Echo (Wang et al. 2025, section 7.1): online requests (diurnal Poisson, ShareGPT-like lengths, TTFT 1 s / "
        "TPOT 0.05 s SLOs) co-scheduled with an offline pool submitted at t = 0 (LooGLE-like long "
        "shared-document prompts; 40,000 of them, more than a 10-minute window can serve, so the "
        "offline queue never drains), Llama-3.1-8B (~150K KV tokens), paged KV with prefix caching. "
        "Time compressed to a 10-minute window; the run stops at 600 s and reports the rest unfinished.",
        "paper": "Wang et al. 2025 (Echo), section 7.1",
        "workload": {
            "arrival": {"type": "diurnal", "mean_rate": 4.0, "amplitude": 0.7142857, "period_s": 600.0,
                        "peak_s": 300.0},
            "horizon_s": 600.0,
            "prompt": {"type": "lognormal", "mean": 308, "median": 150, "max": 2048},
            "output": {"type": "lognormal", "mean": 270, "median": 239, "max": 1024},
            "classes": {"ttft_slo_s": 1.0, "tpot_slo_s": 0.05,
                        "offline": {"n_requests": 40_000, "prompt": {"type": "uniform", "lo": 60, "hi": 300},
                                    "output": {"type": "uniform", "lo": 16, "hi": 128},
                                    "prefix": {"type": "system", "groups": 40, "tokens": 4096}}},
        },
        "engine": {"kv_capacity_tokens": 150_000, "block_size": 16, "prefill_emits_token": True,
                   "overflow": "preempt_lifo_recompute", "kv_bytes_per_token": 131_072,
                   "horizon_s": 600.0},
        "latency": "roofline:llama-3.1-8b/h100",
        "policy": "fcfs",
    },
}
DEFAULT_SCENARIO = "azure-conv"
_FIELD_FIRST = re.compile(r"^[A-Za-z_][\w.\[\]]*: ")


class ScenarioError(ConfigError):
    """Unknown scenario or bad scenario field."""


def list_scenarios() -> dict[str, str]:
    return {k: v["description"] for k, v in SCENARIOS.items()}


def get_scenario(name: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The scenario dict for ``name`` (a registered name or ``trace:FORMAT:PATH``), overridden."""
    if name.startswith("trace:"):
        try:
            _, fmt, path = name.split(":", 2)
        except ValueError:
            raise ScenarioError(f"scenario: {name!r} should look like trace:FORMAT:PATH") from None
        base = copy.deepcopy(SCENARIOS[DEFAULT_SCENARIO])
        base["description"] = f"{fmt} trace {path} on the {DEFAULT_SCENARIO} engine settings"
        base["workload"] = {"trace": {"format": fmt, "path": path}}
        spec = base
    elif name in SCENARIOS:
        spec = SCENARIOS[name]
    else:
        raise ScenarioError(
            f"scenario: unknown {name!r}; allowed: {', '.join(SCENARIOS)} or trace:FORMAT:PATH"
        )
    spec = check_scenario(apply_overrides(spec, overrides))
    spec["name"] = name
    return spec


def build_scenario(spec: dict[str, Any], seed: int) -> tuple[Workload, EngineConfig, LatencyModel]:
    """Materialise a scenario dict into a workload, an engine config and a latency model."""
    from llmsched_gym.core.workload import build_workload

    spec = check_scenario(spec)
    wspec = spec["workload"]
    try:
        if "explicit" in wspec:
            ex = dict(wspec["explicit"])
            if "prefix" in ex:
                ex["prefix"] = [tuple(tuple(seg) for seg in p) if p else None for p in ex["prefix"]]
            workload = Workload(**ex)
        else:
            workload = build_workload(wspec, seed)
    except WorkloadError as e:
        # build_workload names the field inside the section (arrival.rate); say which section
        raise WorkloadError(f"workload.{e}" if _FIELD_FIRST.match(str(e)) else str(e)) from None
    config = EngineConfig(**spec.get("engine", {}))
    config.validate()
    latency = make_latency(spec.get("latency", "unit"))
    return workload, config, latency


__all__ = [
    "DEFAULT_SCENARIO", "SCENARIOS", "ScenarioError", "WorkloadError", "build_scenario", "get_scenario",
    "list_scenarios",
]
