"""Registry of scheduling policies and shared helpers.

A new baseline costs one file with a decorated class::

    @register("my-policy")
    class MyPolicy(Scheduler):
        params = {"alpha": 0.1}
        def schedule(self, view): ...

and, for one in this package, one line in the catalogue (``baselines.POLICIES``:
``"my-policy": PolicyEntry("my_module:MyPolicy", {"alpha": 0.1})``), so that it is listed without
importing its module. ``make_policy("my-policy", alpha=0.2)`` builds it; a parameter not listed in
``params``, or of another type than its default (``True`` for an integer, ``"no"`` for a boolean),
is rejected with a one-line error naming the parameter and what is allowed.
"""

from __future__ import annotations

from typing import Any

from llmsched_gym.config import ConfigError, coerce_like
from llmsched_gym.core.batching import chunk_blocks, decode_blocks
from llmsched_gym.core.scheduler import EngineView, Scheduler

REGISTRY: dict[str, type[Scheduler]] = {}


class PolicyError(ConfigError):
    """Unknown policy or bad policy parameter."""


def register(name: str):
    """Class decorator adding a Scheduler to the registry under ``name``."""

    def deco(cls: type[Scheduler]) -> type[Scheduler]:
        if name in REGISTRY and REGISTRY[name] is not cls:
            raise PolicyError(f"policy {name!r} registered twice")
        cls.name = name
        REGISTRY[name] = cls
        return cls

    return deco


def configure(obj: Scheduler, kwargs: dict[str, Any]) -> None:
    """Set ``params`` defaults on ``obj``, overridden by ``kwargs`` (type-coerced, validated)."""
    allowed = type(obj).params
    for key in kwargs:
        if key not in allowed:
            names = ", ".join(sorted(allowed)) or "none"
            raise PolicyError(f"policy.{key}: unknown parameter of {type(obj).name!r}; allowed: {names}")
    for key, default in allowed.items():
        value = kwargs.get(key, default)
        try:
            value = coerce_like(f"policy.{key}", value, default)
        except ConfigError as e:
            raise PolicyError(str(e)) from None
        setattr(obj, key, value)


def fits_now(view: EngineView, rid: int, extra_tokens: int = 0) -> bool:
    """Whether ``rid``'s prompt (minus cached prefix) plus its first token fits in free KV."""
    need = int(view.prompt_tokens[rid]) + 1 + extra_tokens
    return view.blocks_for(need) * view.block_size <= view.kv_free


def finish_prefills(view: EngineView) -> tuple[list[int], int]:
    """The unfinished prefills a whole-prefill policy finishes this iteration, and their blocks.

    A whole-prefill policy never leaves a running request mid-prefill, but in the env's ``meta``
    mode another policy's chunked prefill (Sarathi, vLLM v1, Echo) can; the policy then finishes
    it (``BatchPlan.FULL``), as it continues every running request, instead of leaving it stuck
    with its KV. Running requests in admission order, while the rest of their prompt (and token 1
    when prefill emits it) fits in the free blocks this iteration's decodes leave; the caller
    takes the returned blocks off its own free-memory estimate. Empty in a single-policy run.
    """
    if not view.n_in_prefill:
        return [], 0
    prefilled, target, kvt = view.prefilled, view.prefill_target, view.kv_tokens
    running = view.running
    free = view.kv_free // view.block_size - sum(decode_blocks(view, r) for r in running if prefilled[r] >= target[r])
    out: list[int] = []
    used = 0
    for r in running:
        if prefilled[r] < target[r]:
            need = chunk_blocks(view, r, int(kvt[r]), int(target[r] - prefilled[r]))
            if need > free:
                break
            free -= need
            used += need
            out.append(r)
    return out, used
