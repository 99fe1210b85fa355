import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("dev", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"

SCENARIOS = ("azure-conv", "jaillet-high", "jaillet-low", "jaillet-noisy", "vtc-arena", "wait-high", "nested-synth4",
             "klpm-toy", "echo-hybrid")
"""The built-in scenarios."""
ORACLE = {"workload.predictor": {"type": "oracle"}}
"""A clairvoyant task: every registered policy (vtc-oracle, which reads the true lengths, too) runs."""


def small_cut(scenario: str, n: int | None, offline: int | None = None,
              extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Overrides that cut ``scenario`` short for a test: ``workload.n_requests = n`` (nothing for
    klpm-toy, a fixed toy instance, or for ``n=None``); echo-hybrid's offline class, counted apart,
    to ``offline`` requests; ``extra`` overrides on top."""
    out: dict[str, Any] = {} if scenario == "klpm-toy" or n is None else {"workload.n_requests": n}
    if scenario == "echo-hybrid" and offline is not None:
        out["workload.classes.offline.n_requests"] = offline
    return {**out, **(extra or {})}


def small_cuts(n: int | None, scenarios: tuple[str, ...] = SCENARIOS, offline: int | None = None,
               sizes: dict[str, int | None] | None = None,
               extra: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """:func:`small_cut` of each scenario, in order: ``n`` requests, or ``sizes[scenario]`` where
    given; ``extra[scenario]`` overrides on top."""
    sizes, extra = sizes or {}, extra or {}
    return {sc: small_cut(sc, sizes.get(sc, n), offline, extra.get(sc)) for sc in scenarios}


@pytest.fixture
def traces_dir() -> Path:
    if not TRACES.is_dir():
        pytest.skip("../shared/traces is absent")
    return TRACES


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray instance (2 CPUs) for every Ray test of the session: starting Ray costs seconds.
    Skipped when the ray extra is not installed."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def clone(tmp_path, monkeypatch):
    """A fresh user: an empty cache, no ../shared, no $LLMSCHED_TRACES, no fallback said yet."""
    from llmsched_gym import data
    from llmsched_gym.core.latency import calibrated

    cache = tmp_path / "cache"
    monkeypatch.setenv("LLMSCHED_DATA", str(cache))
    monkeypatch.delenv("LLMSCHED_TRACES", raising=False)
    monkeypatch.setattr(data, "shared_roots", lambda: [])
    monkeypatch.setattr(data, "_NOTIFIED", set())
    monkeypatch.setattr(calibrated, "_NOTIFIED", set())
    return cache


@pytest.fixture
def server():
    """A loopback HTTP server (``tests/test_data.py: _Server``): tests never touch the network."""
    from test_data import _Server

    s = _Server()
    yield s
    s.close()
