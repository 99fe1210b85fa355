"""Action modes of ``LLMSched-v0``: spaces, validation of the agent's actions, knob mapping.

The env turns every mode's action into the list of waiting requests admitted into the next batch;
this module holds what does not need the engine state.
"""

from __future__ import annotations

import math

import numpy as np
from gymnasium import spaces

ACTION_MODES = ("select", "subset", "priority", "knob")
INVALID_ACTION = ("raise", "noop")

KNOBS = (
    ("alpha", "alpha-protection margin: admit while KV used + prompt <= (1 - alpha) M; alpha in [0, 0.5]"),
    ("max_batch_tokens", "prefill token budget of one batch, log-uniform in [16, M]"),
)
ALPHA_MAX = 0.5
MIN_BATCH_TOKENS = 16


class InvalidActionError(ValueError):
    """An action outside the space or on a masked slot (the message names the action and the mask)."""


def action_space(mode: str, k: int) -> spaces.Space:
    if mode == "select":
        return spaces.Discrete(k + 1)
    if mode == "subset":
        return spaces.MultiBinary(k)
    if mode == "priority":
        return spaces.Box(-1.0, 1.0, (k,), dtype=np.float32)
    return spaces.Box(-1.0, 1.0, (len(KNOBS),), dtype=np.float32)


def knob_values(action: np.ndarray, capacity_tokens: int) -> tuple[float, int]:
    """``(alpha, max_batch_tokens)`` of a knob action in [-1, 1]^2 (linear and log-uniform maps)."""
    u0 = (float(action[0]) + 1.0) / 2.0
    u1 = (float(action[1]) + 1.0) / 2.0
    lo, hi = math.log(MIN_BATCH_TOKENS), math.log(max(capacity_tokens, MIN_BATCH_TOKENS))
    return u0 * ALPHA_MAX, int(round(math.exp(lo + u1 * (hi - lo))))


def _mask_text(mask: np.ndarray) -> str:
    return "[" + " ".join("1" if m else "0" for m in mask) + "]"


def select_error(action, mask: np.ndarray) -> str:
    """Why ``action`` is not a valid ``select`` action given ``mask`` (K + 1 entries)."""
    k = len(mask) - 1
    where = f"(select mode: slots 0..{k - 1}, launch = {k}); mask = {_mask_text(mask)}"
    is_int = isinstance(action, int | np.integer) and not isinstance(action, bool | np.bool_)
    if not is_int:
        return f"action {action!r} is not a scalar integer in [0, {k}] {where}"
    a = int(action)
    if not 0 <= a <= k:
        return f"action {a} is out of range [0, {k}] {where}"
    return f"action {a} is masked {where}; valid actions: {np.flatnonzero(mask).tolist()}"


def check_subset(action, ok: np.ndarray, k: int) -> np.ndarray | str:
    """The chosen slots of a ``subset`` action, or an error message; ``ok`` = admissible slots."""
    a = np.asarray(action)
    full = np.zeros(k, bool)
    full[: len(ok)] = ok
    if a.shape != (k,):
        return (f"action {action!r} has shape {a.shape}, expected ({k},) (subset mode: MultiBinary({k})); "
                f"slot mask = {_mask_text(full)}")
    if not np.all((a == 0) | (a == 1)):
        return f"action {a.tolist()} is not binary (subset mode: MultiBinary({k})); slot mask = {_mask_text(full)}"
    chosen = np.flatnonzero(a)
    masked = chosen[~full[chosen]]
    if len(masked):
        return (f"action {a.astype(int).tolist()} chooses masked slots {masked.tolist()} (subset mode): "
                f"slot mask = {_mask_text(full)}")
    return chosen


def check_box(action, k: int, mode: str) -> np.ndarray | str:
    """A ``priority`` or ``knob`` action as float64, or an error message."""
    try:
        a = np.asarray(action, dtype=np.float64)
    except (TypeError, ValueError):
        return f"action {action!r} is not numeric ({mode} mode: Box(-1, 1, ({k},)))"
    if a.shape != (k,):
        return f"action {action!r} has shape {a.shape}, expected ({k},) ({mode} mode: Box(-1, 1, ({k},)))"
    if not np.all(np.isfinite(a)) or np.any(np.abs(a) > 1.0):
        return f"action {a.tolist()} is outside [-1, 1] or not finite ({mode} mode: Box(-1, 1, ({k},)))"
    return a
