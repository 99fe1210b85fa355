"""Action modes of ``LLMSched-v1``: spaces, validation of the agent's actions, knob mapping.

The env turns every mode's action into the batch of the next iteration; this module holds what
does not need the engine state: the spaces, the ``select`` layout (slots, launch-with-budget,
preempt), validation messages and the knob maps of ``knob`` and ``tune``.
"""

from __future__ import annotations

import math

import numpy as np
from gymnasium import spaces

from llmsched_gym.config import ConfigError

ACTION_MODES = ("select", "subset", "priority", "knob", "tune", "meta")
INVALID_ACTION = ("noop", "raise")

DEFAULT_BUDGETS: tuple[int | None, ...] = (None, 8192, 4096, 2048, 1024, 512, 256, 128)
"""Token budgets a ``select`` launch can choose (``None``: unlimited, whole-prompt prefill):
vLLM v1's default 8192 and the Sarathi-Serve chunk sizes."""

PREEMPT_RULES = ("newest", "longest")
"""The two victims a ``select`` preempt action can name: the newest running request (vLLM's
rule) or the one with the longest predicted remaining output (SRPT's, ties: the newest id)."""

DEFAULT_TUNE = {"chunk_size": (32, 8192), "max_num_seqs": (16, 1024)}
"""``tune`` mode's default knobs of the default base policy (``sarathi``): log-uniform ranges
whose geometric middle (action 0) is the policy's default (512 and 128)."""


def check_budgets(budgets) -> tuple[int | None, ...]:
    """Validate the ``budgets`` argument: a non-empty sequence of distinct integers >= 1 or None."""
    try:
        out = tuple(None if b is None else b for b in budgets)
    except TypeError:
        raise ConfigError(f"budgets: expected a list of token budgets (integers >= 1, or None), got {budgets!r}") from None
    if not out:
        raise ConfigError("budgets: must name at least one token budget (integers >= 1, or None for unlimited)")
    for b in out:
        if b is not None and (isinstance(b, bool) or not isinstance(b, int | np.integer) or b < 1):
            raise ConfigError(f"budgets: {b!r} is not an integer >= 1 or None (unlimited)")
    if len(set(out)) != len(out):
        raise ConfigError(f"budgets: {list(out)} has duplicates")
    return tuple(None if b is None else int(b) for b in out)


def check_tune(knobs: dict, params: dict) -> dict[str, tuple[float, float]]:
    """Validate ``tune`` knobs against the base policy's ``params``: ``{name: (low, high)}``,
    ``0 < low < high`` (log-uniform)."""
    if not isinstance(knobs, dict) or not knobs:
        raise ConfigError(f"tune: expected a dict {{parameter: [low, high]}}, got {knobs!r}")
    out = {}
    for name, rng in knobs.items():
        if name not in params:
            raise ConfigError(f"tune.{name}: not a parameter of the base policy; allowed: {', '.join(sorted(params)) or 'none'}")
        if not isinstance(params[name], int | float) or isinstance(params[name], bool):
            raise ConfigError(f"tune.{name}: only numeric parameters can be tuned (default {params[name]!r})")
        try:
            lo, hi = (float(x) for x in rng)
        except (TypeError, ValueError):
            raise ConfigError(f"tune.{name}: expected [low, high], got {rng!r}") from None
        if not 0 < lo < hi or not math.isfinite(hi):
            raise ConfigError(f"tune.{name}: need 0 < low < high, got [{lo}, {hi}]")
        out[name] = (lo, hi)
    return out


def tune_values(action: np.ndarray, knobs: dict[str, tuple[float, float]], params: dict) -> dict:
    """Parameter values of a ``tune`` action in [-1, 1]^n: log-uniform, rounded for integer parameters."""
    vals = {}
    for a, (name, (lo, hi)) in zip(action, knobs.items(), strict=True):
        u = (float(a) + 1.0) / 2.0
        v = math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))
        vals[name] = max(1, int(round(v))) if isinstance(params[name], int) else v
    return vals


def select_size(k: int, n_budgets: int) -> int:
    """``select`` actions: K slots, one launch per budget, two preempt rules."""
    return k + n_budgets + len(PREEMPT_RULES)

KNOBS = (
    ("alpha", "alpha-protection margin: admit while KV used + prompt <= (1 - alpha) M; alpha in [0, 0.5]"),
    ("max_batch_tokens", "prefill token budget of one batch, log-uniform in [16, M]"),
)
ALPHA_MAX = 0.5
MIN_BATCH_TOKENS = 16


class InvalidActionError(ValueError):
    """An action outside the space or on a masked slot (the message names the action and the mask)."""


def action_space(mode: str, k: int, n_budgets: int = 1, n_candidates: int = 1, n_knobs: int = len(KNOBS)) -> spaces.Space:
    if mode == "select":
        return spaces.Discrete(select_size(k, n_budgets))
    if mode == "subset":
        return spaces.MultiBinary(k)
    if mode == "priority":
        return spaces.Box(-1.0, 1.0, (k,), dtype=np.float32)
    if mode == "meta":
        return spaces.Discrete(n_candidates)
    if mode == "tune":
        return spaces.Box(-1.0, 1.0, (n_knobs,), dtype=np.float32)
    return spaces.Box(-1.0, 1.0, (len(KNOBS),), dtype=np.float32)


def knob_values(action: np.ndarray, capacity_tokens: int) -> tuple[float, int]:
    """``(alpha, max_batch_tokens)`` of a knob action in [-1, 1]^2 (linear and log-uniform maps)."""
    u0 = (float(action[0]) + 1.0) / 2.0
    u1 = (float(action[1]) + 1.0) / 2.0
    lo, hi = math.log(MIN_BATCH_TOKENS), math.log(max(capacity_tokens, MIN_BATCH_TOKENS))
    return u0 * ALPHA_MAX, int(round(math.exp(lo + u1 * (hi - lo))))


def _mask_text(mask: np.ndarray) -> str:
    return "[" + " ".join("1" if m else "0" for m in mask) + "]"


def select_error(action, mask: np.ndarray, k: int) -> str:
    """Why ``action`` is not a valid ``select`` action given ``mask`` (``select_size`` entries)."""
    n = len(mask) - 1
    b = n + 1 - k - len(PREEMPT_RULES)
    where = (f"(select mode: slots 0..{k - 1}, launch with budget j = {k}..{k + b - 1}, "
             f"preempt newest = {k + b}, preempt longest = {k + b + 1}); mask = {_mask_text(mask)}")
    k = n
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


def discrete_error(action, n: int, mode: str) -> str | None:
    """Why ``action`` is not an integer in [0, n) (``meta`` mode), or None."""
    if isinstance(action, np.ndarray) and action.ndim == 0:
        action = action.item()
    if not isinstance(action, int | np.integer) or isinstance(action, bool | np.bool_):
        return f"action {action!r} is not a scalar integer in [0, {n - 1}] ({mode} mode: Discrete({n}))"
    if not 0 <= int(action) < n:
        return f"action {int(action)} is out of range [0, {n - 1}] ({mode} mode: Discrete({n}))"
    return None


def check_box(action, k: int, mode: str) -> np.ndarray | str:
    """A ``priority`` or ``knob`` action as float64, or an error message."""
    if type(action) is np.ndarray and action.shape == (k,) and action.dtype.kind == "f":
        a = action.astype(np.float64)
        if np.maximum.reduce(np.abs(a), initial=0.0) <= 1.0:  # (False for NaN)
            return a
    try:
        if np.iscomplexobj(action):  # float64 conversion would silently drop the imaginary part
            raise TypeError
        a = np.asarray(action, dtype=np.float64)
    except (TypeError, ValueError):
        return f"action {action!r} is not numeric ({mode} mode: Box(-1, 1, ({k},)))"
    if a.shape != (k,):
        return f"action {action!r} has shape {a.shape}, expected ({k},) ({mode} mode: Box(-1, 1, ({k},)))"
    if not np.all(np.isfinite(a)) or np.any(np.abs(a) > 1.0):
        return f"action {a.tolist()} is outside [-1, 1] or not finite ({mode} mode: Box(-1, 1, ({k},)))"
    return a
