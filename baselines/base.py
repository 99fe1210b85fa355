"""Registry of scheduling policies and shared helpers.

A new baseline costs one file and one decorator::

    @register("my-policy")
    class MyPolicy(Scheduler):
        params = {"alpha": 0.1}
        def schedule(self, view): ...

``make_policy("my-policy", alpha=0.2)`` builds it; parameters not listed in ``params`` are
rejected with a one-line error naming the policy, the parameter and the allowed names.
"""

from __future__ import annotations

from typing import Any

from llmsched_gym.core.scheduler import EngineView, Scheduler

REGISTRY: dict[str, type[Scheduler]] = {}


class PolicyError(ValueError):
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
        if default is not None and value is not None and not isinstance(value, type(default)):
            try:
                value = type(default)(value)
            except (TypeError, ValueError):
                raise PolicyError(f"policy.{key}: expected {type(default).__name__}, got {value!r}") from None
        setattr(obj, key, value)


def fits_now(view: EngineView, rid: int, extra_tokens: int = 0) -> bool:
    """Whether ``rid``'s prompt (minus cached prefix) plus its first token fits in free KV."""
    need = int(view.prompt_tokens[rid]) + 1 + extra_tokens
    return view.blocks_for(need) * view.block_size <= view.kv_free
