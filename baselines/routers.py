"""The router catalogue (the cluster level, :mod:`llmsched_gym.core.cluster`): one file per family,
each a :class:`~llmsched_gym.core.cluster.Router`. ``make_router(name, **params)`` builds one;
:data:`ROUTERS` lists each name's ``module:Class`` and its parameters (a preset's fixed ones
included).
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple

from llmsched_gym.config import ConfigError, coerce_like
from llmsched_gym.core.cluster import Router


class RouterEntry(NamedTuple):
    """Where a router lives (``module:Class`` in this package) and the parameters of its preset."""

    target: str
    preset: dict[str, Any]


ROUTERS: dict[str, RouterEntry] = {
    "random": RouterEntry("route_simple:RandomRouter", {}),
    "round-robin": RouterEntry("route_simple:RoundRobin", {}),
    "lor": RouterEntry("route_load:LOR", {}),
    "jsq": RouterEntry("route_load:JSQ", {}),
    "token-jsq": RouterEntry("route_load:TokenJSQ", {}),
    "power-of-two": RouterEntry("route_load:PowerOfTwo", {}),
    "sglang-cache-aware": RouterEntry("route_sglang:CacheAware", {}),
    "llm-d": RouterEntry("route_llmd:LLMD", {}),
    "llm-d-approx": RouterEntry("route_llmd:LLMD", {"prefix": "approximate"}),
    "llm-d-load": RouterEntry("route_llmd:LLMD", {"prefix": "none"}),
    "llumnix": RouterEntry("route_llumnix:Llumnix", {}),
}
"""Every router by name; ``llm-d-approx`` and ``llm-d-load`` are llm-d's pipeline with approximate
prefix scoring and without prefix scoring (queue and KV only)."""


def router_class(name: str) -> type[Router]:
    entry = ROUTERS.get(name) if isinstance(name, str) else None
    if entry is None:
        raise ConfigError(f"router: unknown {name!r}; allowed: {', '.join(ROUTERS)}")
    module, cls = entry.target.split(":")
    return getattr(importlib.import_module(f"baselines.{module}"), cls)


def make_router(name: str, **params: Any) -> Router:
    """The router ``name`` with ``params`` over its preset's: an unknown name or parameter, or a
    value of another type than the parameter's default, is a one-line ConfigError
    (``router.w_queue: expected a number, got 'x'``)."""
    cls = router_class(name)
    params = {k: coerce_like(f"router.{k}", v, cls.params[k]) if k in cls.params else v for k, v in params.items()}
    r = cls(**{**ROUTERS[name].preset, **params})
    r.name = name
    return r
