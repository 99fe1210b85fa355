"""Golden run summaries: every scenario x every registered policy on a small cut, recorded once
from a known-good engine and compared bit for bit by ``tests/test_golden.py``.

The engine may be rewritten for speed or structure, but its results must not move: a summary
(``wall_time_s`` removed) is a fingerprint of every clock, KV, token and latency statistic of the
run. Combinations a policy refuses (wrong workload shape, missing parameters) are recorded with
their one-line error, so a change in validation shows up too.

Trace scenarios use the synthetic stand-ins (the default trace files are reported missing), so
the recording is the same on a machine with or without the traces.

Regenerate (only when a behaviour change is intended, and say so in the commit)::

    python -m tests.golden.summaries --write
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any
from unittest import mock

PATH = Path(__file__).resolve().parents[1] / "data" / "golden_summaries.json"

SMALL = 300
CUTS: dict[str, dict[str, Any]] = {
    "azure-conv": {"workload.n_requests": SMALL},
    "jaillet-high": {"workload.n_requests": SMALL},
    "jaillet-low": {"workload.n_requests": SMALL},
    "jaillet-noisy": {"workload.n_requests": SMALL},
    "vtc-arena": {"workload.n_requests": SMALL},
    "wait-high": {"workload.n_requests": SMALL},
    "nested-synth4": {"workload.n_requests": SMALL},
    "klpm-toy": {},
    "echo-hybrid": {"workload.classes.offline.n_requests": SMALL, "workload.horizon_s": 20.0,
                    "engine.horizon_s": 20.0},
}
"""Scenario -> overrides that cut it to a few hundred requests."""


def _clean(x: Any) -> Any:
    """JSON-safe and comparable: NaN/inf as strings, tuples as lists, long lists (the fairness
    curves) as the SHA-256 of their JSON, to keep the file small."""
    if isinstance(x, float):
        return repr(x) if not math.isfinite(x) else x
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        items = [_clean(v) for v in x]
        if len(json.dumps(items)) > 400:
            return {"sha256": hashlib.sha256(json.dumps(items).encode()).hexdigest(), "len": len(items)}
        return items
    return x


def run_one(scenario: str, policy: str) -> dict[str, Any]:
    """The summary of ``policy`` on the cut ``scenario`` (or ``{"error": ...}``)."""
    from llmsched_gym import data
    from llmsched_gym.core.traces import DEFAULT_FILES
    from llmsched_gym.sim import simulate

    resolve = data.resolve_data

    def no_default_traces(name):
        return None if str(name) in DEFAULT_FILES.values() else resolve(name)

    with mock.patch.object(data, "resolve_data", no_default_traces), mock.patch.object(data, "notify_fallback"):
        try:
            s = simulate(scenario, policy, seed=0, overrides=CUTS[scenario]).summary
        except ValueError as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
    s.pop("wall_time_s", None)
    s.pop("latency_model", None)  # added after the recording; the scenario's latency spec decides it
    return _clean(s)


def cases() -> list[tuple[str, str]]:
    from baselines import available

    return [(sc, pol) for sc in CUTS for pol in available()]


def record() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for sc, pol in cases():
        out.setdefault(sc, {})[pol] = run_one(sc, pol)
    return out


def load() -> dict[str, dict[str, Any]]:
    return json.loads(PATH.read_text())


if __name__ == "__main__":
    if "--write" not in sys.argv:
        sys.exit("usage: python -m tests.golden.summaries --write")
    rec = record()
    PATH.write_text(json.dumps(rec, sort_keys=True, indent=1) + "\n")
    print(f"wrote {PATH}")
