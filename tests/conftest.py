import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from baselines import make_policy
from llmsched_gym.core.engine import Engine, EngineConfig
from llmsched_gym.core.latency import UnitLatency
from llmsched_gym.core.request import Workload
from llmsched_gym.core.scheduler import Scheduler

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


class Manual(Scheduler):
    """A scheduler the test drives by hand (``execute`` gets explicit plans)."""

    name = "manual"


def summaries_equal(a: dict, b: dict) -> None:
    """Every field of summary ``a`` equals ``b``'s (NaN equal to NaN), but the policy's name and the
    wall time."""
    for k in a:
        if k in ("policy", "wall_time_s"):
            continue
        x, y = a[k], b[k]
        if isinstance(x, float) and math.isnan(x):
            assert isinstance(y, float) and math.isnan(y), k
        else:
            assert x == y, (k, x, y)


def manual_engine(prompts, outputs, cap_tokens: int, bs: int = 4, overflow: str = "forbid", prefix=None,
                  **cfg: Any) -> Engine:
    """An engine whose requests all arrived at 0, with unit iteration times and no fast-forward,
    driven by :class:`Manual`; polled once, so every request is waiting."""
    n = len(prompts)
    wl = Workload(arrival_s=np.zeros(n), prompt_tokens=prompts, output_tokens=outputs, prefix=prefix)
    config = EngineConfig(kv_capacity_tokens=cap_tokens, block_size=bs, overflow=overflow, fast_forward=False, **cfg)
    e = Engine(wl, config, UnitLatency(), Manual())
    assert e.poll()
    return e


def random_engine(draw, bs: int, *, prefix: bool = True, modes: tuple[str, ...] = ("recompute", "restart", "swap"),
                  policy=None) -> Engine:
    """A hypothesis-drawn engine with some history (running, swapped, cached, preempted requests):
    4 to 14 requests on a small paged KV cache with LIFO preemption in one of ``modes``, driven for
    0 to 40 iterations by ``policy(draw)`` (default: sarathi with 24-token chunks or fcfs)."""
    n = draw(st.integers(4, 14))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    prompt = rng.integers(1, 40, n)
    segs = [((int(rng.integers(0, 3)), int(p // 2)),) if p >= 2 and rng.random() < 0.7 else None for p in prompt]
    wl = Workload(arrival_s=np.sort(rng.uniform(0, 3, n)), prompt_tokens=prompt,
                  output_tokens=rng.integers(1, 30, n), prefix=segs if prefix else None)
    cfg = EngineConfig(kv_capacity_tokens=int(draw(st.integers(50, 150))), block_size=bs,
                       overflow="preempt_lifo_recompute", preempt_mode=draw(st.sampled_from(list(modes))),
                       prefill_emits_token=draw(st.booleans()), fast_forward=False)
    if policy is None:
        scheduler = make_policy("sarathi", chunk_size=24) if draw(st.booleans()) else make_policy("fcfs")
    else:
        scheduler = policy(draw)
    e = Engine(wl, cfg, UnitLatency(), scheduler)
    for _ in range(draw(st.integers(0, 40))):
        if not e.poll():
            break
        e.execute(e.scheduler.schedule(e.view))
    return e


def quiet(model: Any) -> Any:
    """``model`` (an SB3 algorithm) with a logger that writes nothing: without ``tensorboard_log``
    or a logger of its own, each SB3 ``learn`` makes an empty ``SB3-<date>`` folder in the temp dir
    (``llmsched train`` logs into its run folder's ``tb/``). Returns ``model``."""
    from stable_baselines3.common.logger import Logger

    model.set_logger(Logger(folder=None, output_formats=[]))
    return model


@pytest.fixture(autouse=True, scope="session")
def _sb3_default_log_folder(tmp_path_factory):
    """A safety net under :func:`quiet`: SB3's default log folder (``$SB3_LOGDIR``, else a new
    ``SB3-<date>`` in the temp dir at every ``learn`` without a logger) is one folder of the
    session's own temporary tree, so a test that forgets ``quiet`` leaves nothing in /tmp."""
    mp = pytest.MonkeyPatch()
    mp.setenv("SB3_LOGDIR", str(tmp_path_factory.mktemp("sb3")))
    yield
    mp.undo()


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
