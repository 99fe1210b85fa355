"""Per-request records of a run: one row per request that arrived, its lengths, the times of its
first scheduling, first token and completion, and what it cost (preemptions, recomputed and cached
tokens). The summary (:mod:`llmsched_gym.core.metrics`) and the fairness metrics
(:mod:`llmsched_gym.core.fairness`) read them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from llmsched_gym.core.engine import Engine


def request_table(engine: Engine) -> dict[str, np.ndarray]:
    """Per-request records of every request that arrived (columns as arrays)."""
    wl = engine.workload
    arrived = engine.state != 0
    idx = np.nonzero(arrived)[0]
    out = wl.output_tokens
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (engine.completion_s - engine.first_token_s) / np.maximum(out - 1, 1), np.nan)
    cols = {
        "id": idx,
        "arrival_s": wl.arrival_s[idx],
        "prompt_tokens": wl.prompt_tokens[idx],
        "output_tokens": out[idx],
        "predicted_output": wl.predicted_output[idx],
        "client": wl.client[idx],
        "task_class": wl.task_class[idx],
        "type_id": wl.type_id[idx],
        "state": engine.state[idx],
        "first_scheduled_s": engine.first_scheduled_s[idx],
        "first_token_s": engine.first_token_s[idx],
        "completion_s": engine.completion_s[idx],
        "e2e_s": engine.completion_s[idx] - wl.arrival_s[idx],
        "ttft_s": engine.first_token_s[idx] - wl.arrival_s[idx],
        "tpot_s": tpot[idx],
        "queue_delay_s": engine.first_scheduled_s[idx] - wl.arrival_s[idx],
        "generated": engine.generated[idx],
        "preemptions": engine.preemptions[idx],
        "recomputed_tokens": engine.recomputed_tokens[idx],
        "cached_tokens": engine.cached_tokens[idx],
    }
    return cols
