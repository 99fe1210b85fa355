"""Reference scheduling policies: one file per policy family, all implementing the engine's
:class:`~llmsched_gym.core.scheduler.Scheduler`. ``make_policy(name, **params)`` builds one."""

from __future__ import annotations

import importlib
import pkgutil

from .base import REGISTRY, PolicyError, register

_loaded = False


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    for mod in pkgutil.iter_modules(__path__):
        if mod.name not in ("base",):
            importlib.import_module(f"{__name__}.{mod.name}")
    _loaded = True


def available() -> list[str]:
    _load_all()
    return sorted(REGISTRY)


def make_policy(name: str, **params):
    """Build the registered policy ``name`` with ``params``."""
    _load_all()
    cls = REGISTRY.get(name)
    if cls is None:
        raise PolicyError(f"policy: unknown {name!r}; allowed: {', '.join(sorted(REGISTRY))}")
    return cls(**params)


__all__ = ["REGISTRY", "PolicyError", "available", "make_policy", "register"]
