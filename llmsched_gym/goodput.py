"""SLO goodput: the highest arrival rate a serving setup sustains while meeting its latency targets
(DistServe, Zhong et al., OSDI 2024, section 2), per GPU as that paper reports it.

A request meets the SLO when its time to first token is within ``ttft_s`` and its mean time per
output token (after the first) within ``tpot_s``; the *attainment* at a rate is the fraction of
requests meeting both (:func:`llmsched_gym.core.metrics.slo_attainment`); the *goodput* is the
highest rate whose attainment is at least the target (0.9 by default, DistServe's). Dividing by the
GPUs (replicas x tensor-parallel degree, summed over pools) gives goodput per GPU.

>>> from llmsched_gym.goodput import Serving, find_goodput
>>> res = find_goodput(Serving("azure-conv", n_replicas=2, router="lor"), {"ttft_s": 2.0, "tpot_s": 0.1})
>>> res.goodput, res.per_gpu        # req/s, req/s per GPU
>>> print(res.table())              # every rate tried

**The search.** Each seed's workload is built once (the scenario's requests, ``n_requests`` of
them) and every rate runs *that same arrival sequence scaled in time* (common random numbers: at
rate ``r`` the gaps are multiplied by ``r0 / r``, where ``r0 = (n - 1) / (last - first arrival)`` is
the sequence's own rate, so its mean rate is exactly ``r``; a Poisson sequence stays Poisson, a
trace keeps its burstiness). The attainment of a rate pools every seed's requests. The search
brackets (doubling or halving from the sequence's own rate until one rate passes and the next
fails) and then bisects geometrically until the passing and failing rates are within ``rel_tol``.

**Noise.** Attainment falls with the rate only in expectation: a longer queue can reorder work so
that a higher rate meets a few more targets. Common random numbers remove the arrival noise
between rates (the only difference between two rates is the time scale), so what remains is the
scheduler's own response, usually small; the search keeps the invariant "the highest passing rate
is below the lowest failing one" and reports the highest passing rate, so a non-monotone dip
above the answer is never tested past. More seeds (``seeds``) and more requests average the
remaining noise; the table lists every rate run, so a non-monotone region shows there.

**Finite runs.** Every run serves its ``n_requests`` to completion; at a rate above capacity the
queue grows through the run, so attainment falls, but short runs overstate a little the goodput of
an overloaded system (the tail of the queue has not built up yet). DistServe's client sends 300
requests per rate; the default here is 1,000.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llmsched_gym.config import ConfigError
from llmsched_gym.core.metrics import slo_attainment
from llmsched_gym.core.request import Workload

DEFAULT_REQUESTS = 1000
"""Requests per run of the search unless given (DistServe's client sends 300 per rate)."""


def tensor_parallel(latency: Any) -> int:
    """GPUs one replica of this batch-time model uses (its tensor-parallel degree): a measured
    profile's ``tp``, a roofline's GPU group (``A100x2``: 2), a calibrated preset's GPU group;
    1 for the analytic models (``unit``, ``linear``, ...)."""
    from llmsched_gym.core.models import get_gpu

    prof = getattr(latency, "profile", None)
    if prof is not None and hasattr(prof, "tp"):
        return int(prof.tp)
    preset = getattr(latency, "preset", None)
    if preset is not None:
        return int(get_gpu(preset.gpu).count)
    gpu = getattr(latency, "gpu", None)
    if gpu is not None and hasattr(gpu, "count"):
        return int(gpu.count)
    return 1


def _latency_gpus(spec: Any) -> int:
    from llmsched_gym.core.latency import make_latency

    try:
        return tensor_parallel(make_latency(spec))
    except ValueError as e:
        raise ConfigError(str(e)) from None


@dataclass
class Serving:
    """What serves the traffic: a scenario's engine on one replica, a colocated cluster of
    ``n_replicas`` behind ``router``, or (with ``pools``) a disaggregated cluster.

    :param scenario: a scenario name, ``.yml`` file or dict (its engine, batch-time model and
        workload; the workload's arrival rate is what the search changes).
    :param overrides: dotted scenario overrides (``{"workload.n_requests": 500}``).
    :param policy: the replica scheduler (default: the scenario's); ``sarathi`` is chunked prefill.
    :param n_replicas: replicas of a colocated cluster (1: the plain engine; None: the scenario's
        ``cluster`` section's, else 1).
    :param router: the cluster's router (:data:`baselines.routers.ROUTERS`; None: the scenario's,
        else round-robin).
    :param pools: a prefill and a decode pool (``{"prefill": {"n": P, ...}, "decode": {"n": D,
        ...}}``), passed to :func:`llmsched_gym.cluster_sim.simulate_cluster` with ``transfer``
        and ``decider``; ``n_replicas`` is then ignored.
    :param label: the name printed for this setup (default: made from the fields).
    """

    scenario: str | dict[str, Any]
    overrides: dict[str, Any] = field(default_factory=dict)
    policy: str | dict[str, Any] | None = None
    n_replicas: int | None = None
    router: str | None = None
    pools: dict[str, dict[str, Any]] | None = None
    transfer: dict[str, Any] | None = None
    decider: Any = None
    label: str = ""

    def spec(self) -> dict[str, Any]:
        """The checked scenario with the overrides applied."""
        from llmsched_gym.core.scenarios import resolve_scenario

        return resolve_scenario(self.scenario, self.overrides)

    def pools_(self) -> dict[str, dict[str, Any]] | None:
        """The pools this setup runs: :attr:`pools`, else the scenario's ``cluster.pools``."""
        return self.pools or (self.spec().get("cluster") or {}).get("pools") or None

    def gpus(self) -> int:
        """GPUs this setup occupies: replicas x tensor-parallel degree, summed over pools."""
        spec = self.spec()
        base = spec.get("latency", "unit")
        pools = self.pools_()
        if pools:
            return sum(int(p.get("n", 1)) * _latency_gpus(p.get("latency", base)) for p in pools.values())
        c = self.cluster()
        return sum(_latency_gpus(c["replicas"].get(r, {}).get("latency", base)) for r in range(c["n_replicas"]))

    def cluster(self) -> dict[str, Any]:
        """The colocated cluster this setup runs (:func:`llmsched_gym.cluster_sim.cluster_settings`:
        the fields given here, else the scenario's ``cluster`` section, else one replica)."""
        from llmsched_gym.cluster_sim import cluster_settings

        return cluster_settings(self.spec(), self.router, self.n_replicas)

    def name(self) -> str:
        """:attr:`label`, or a description made from the fields."""
        if self.label:
            return self.label
        pol = self.policy if isinstance(self.policy, str | type(None)) else self.policy.get("name")
        pol = pol or self.spec().get("policy", "fcfs")
        pol = pol if isinstance(pol, str) else pol.get("name", "?")
        pools = self.pools_()
        if pools:
            return "disaggregated " + ", ".join(f"{k} {v.get('n', 1)}" for k, v in pools.items()) + f" ({pol})"
        c = self.cluster()
        if c["n_replicas"] == 1:
            return f"one replica ({pol})"
        return f"colocated {c['n_replicas']} replicas, {c['router']} ({pol})"

    def run(self, workload: Workload, seed: int) -> dict[str, np.ndarray]:
        """Serve ``workload`` and return the per-request table."""
        from llmsched_gym.cluster_sim import simulate_cluster

        extra: dict[str, Any] = {}
        if self.pools:
            extra = {"pools": self.pools}
            if self.transfer is not None:
                extra["transfer"] = self.transfer
            if self.decider is not None:
                extra["decider"] = self.decider
        res = simulate_cluster(self.scenario, self.policy, self.router, self.n_replicas, seed, self.overrides,
                               workload=workload, **extra)
        return res.requests


def parse_slo(text: str, flag: str = "--slo") -> dict[str, float]:
    """``ttft=0.25,tpot=0.1`` (seconds; a value may end in ``ms`` or ``s``) as an ``slo`` section
    (``{"ttft_s": 0.25, "tpot_s": 0.1}``); either target may be left out, not both.

    :raises ConfigError: one line naming the flag and what is allowed.
    """
    want = f"expected ttft=SECONDS,tpot=SECONDS (e.g. ttft=0.25,tpot=0.1 or ttft=250ms,tpot=100ms), got {text!r}"
    out: dict[str, float] = {}
    for item in filter(None, (s.strip() for s in str(text).split(","))):
        key, eq, value = item.partition("=")
        key, value = key.strip().lower(), value.strip().lower()
        if not eq or key not in ("ttft", "tpot") or key + "_s" in out:
            raise ConfigError(f"{flag}: {want}")
        scale = 1.0
        if value.endswith("ms"):
            value, scale = value[:-2], 1e-3
        elif value.endswith("s"):
            value = value[:-1]
        try:
            v = float(value) * scale
        except ValueError:
            raise ConfigError(f"{flag}: {key}: {want}") from None
        if not (math.isfinite(v) and v > 0):
            raise ConfigError(f"{flag}: {key}: expected a number of seconds > 0, got {item.split('=', 1)[1]!r}")
        out[key + "_s"] = v
    if not out:
        raise ConfigError(f"{flag}: {want}")
    return out


def base_workloads(serving: Serving, seeds: Sequence[int], n_requests: int | None = None) -> list[Workload]:
    """Each seed's requests, built once (the scenario's workload with ``n_requests``), sorted by
    arrival, first arrival at 0."""
    from llmsched_gym.core.scenarios import build_scenario, resolve_scenario

    over = dict(serving.overrides)
    if n_requests is not None:
        over["workload.n_requests"] = int(n_requests)
    spec = resolve_scenario(serving.scenario, over)
    spec = {k: v for k, v in spec.items() if k != "cluster"}  # the requests only: the cluster runs them
    out = []
    for seed in seeds:
        wl, _, _ = build_scenario(spec, int(seed), checked=True)
        if len(wl) < 2:
            raise ConfigError(f"workload.n_requests: the goodput search needs at least 2 requests, got {len(wl)}")
        wl = wl.sort_by_arrival() if np.any(np.diff(wl.arrival_s) < 0) else wl
        span = float(wl.arrival_s[-1] - wl.arrival_s[0])
        if not span > 0:
            raise ConfigError("workload: every request arrives at once; the goodput search scales arrival gaps "
                              "and needs a workload whose arrivals are spread in time")
        out.append(wl.with_(arrival_s=wl.arrival_s - wl.arrival_s[0]))
    return out


def own_rate(workload: Workload) -> float:
    """The workload's mean arrival rate ``(n - 1) / (last - first arrival)`` (req/s)."""
    a = workload.arrival_s
    return (len(a) - 1) / float(a[-1] - a[0])


def at_rate(workload: Workload, rate: float) -> Workload:
    """``workload``'s arrival sequence scaled in time to mean rate ``rate`` (common random numbers:
    the same requests in the same order at proportionally shorter or longer gaps)."""
    a = workload.arrival_s
    span = float(a[-1] - a[0])
    if not span > 0:
        raise ConfigError("workload.arrival_s: every request arrives at one instant, so no arrival rate can be "
                          "scaled (give the workload arrivals spread over time)")
    # (a - a0) / span first: a span near the smallest float would overflow own_rate() / rate
    return workload.with_(arrival_s=(a - a[0]) / span * ((len(a) - 1) / rate))


@dataclass
class RatePoint:
    """One rate of the search: its attainments (pooled over seeds) and whether it passed."""

    rate: float
    ttft_attainment: float
    tpot_attainment: float
    attainment: float
    passed: bool
    wall_s: float


@dataclass
class GoodputResult:
    """The answer of :func:`find_goodput`.

    :ivar goodput: the highest rate that passed (req/s); 0 when none did (the SLO is missed even
        at the lowest rate tried: see ``note``).
    :ivar per_gpu: ``goodput / gpus``.
    :ivar points: every rate run, in the order run.
    :ivar capped: the search stopped doubling at ``max_rate`` with every rate passing (the goodput
        is at least ``goodput``).
    """

    setup: str
    gpus: int
    slo: dict[str, float]
    target: float
    goodput: float
    points: list[RatePoint]
    seeds: list[int]
    n_requests: int
    wall_s: float
    capped: bool = False
    note: str = ""

    @property
    def per_gpu(self) -> float:
        return self.goodput / self.gpus

    def table(self) -> str:
        """The rates tried, sorted, as a text table."""
        lines = [f"{'rate req/s':>11} {'per GPU':>9} {'TTFT att':>9} {'TPOT att':>9} {'both':>7}  pass"]
        for p in sorted(self.points, key=lambda p: p.rate):
            lines.append(f"{p.rate:11.4g} {p.rate / self.gpus:9.4g} {p.ttft_attainment:9.3f} "
                         f"{p.tpot_attainment:9.3f} {p.attainment:7.3f}  {'yes' if p.passed else 'no'}")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready copy."""
        return {"setup": self.setup, "gpus": self.gpus, "slo": self.slo, "attainment_target": self.target,
                "goodput_req_s": self.goodput, "goodput_per_gpu": self.per_gpu, "capped": self.capped,
                "seeds": self.seeds, "n_requests": self.n_requests, "wall_s": self.wall_s, "note": self.note,
                "points": [vars(p) for p in self.points]}


def check_target(attainment: float, flag: str = "--attainment") -> float:
    a = float(attainment)
    if not 0 < a <= 1:
        raise ConfigError(f"{flag}: expected a fraction in (0, 1], got {attainment!r}")
    return a


def find_goodput(serving: Serving, slo: Mapping[str, float], attainment: float = 0.9, seeds: Sequence[int] = (0,),
                 n_requests: int | None = DEFAULT_REQUESTS, rel_tol: float = 0.03, start_rate: float | None = None,
                 max_steps: int = 24, progress: Callable[[RatePoint], None] | None = None) -> GoodputResult:
    """The highest arrival rate at which ``serving`` meets ``slo`` for at least ``attainment`` of the
    requests (module docstring: the search and how noise is handled).

    :param serving: what serves (:class:`Serving`).
    :param slo: ``{"ttft_s": ..., "tpot_s": ...}`` (either may be left out).
    :param attainment: the fraction of requests that must meet both targets (DistServe: 0.9).
    :param seeds: workload seeds; each rate runs every seed and pools their requests.
    :param n_requests: requests per run (None: the scenario's own count).
    :param rel_tol: the search stops when the failing rate is within this fraction above the passing one.
    :param start_rate: the first rate tried (default: the workload's own mean rate).
    :param max_steps: doublings (or halvings) of the bracket before giving up.
    :param progress: called with each rate's result as it is run.
    """
    t0 = time.perf_counter()
    target = check_target(attainment)
    if not rel_tol > 0:
        raise ConfigError(f"rel_tol: expected a number > 0, got {rel_tol!r}")
    if not seeds:
        raise ConfigError("seeds: expected at least one seed")
    ttft, tpot = float(slo.get("ttft_s", math.inf)), float(slo.get("tpot_s", math.inf))
    workloads = base_workloads(serving, seeds, n_requests)
    gpus = serving.gpus()
    points: list[RatePoint] = []

    def attain(rate: float) -> RatePoint:
        t = time.perf_counter()
        ok = np.zeros(3)
        n = 0
        for seed, wl in zip(seeds, workloads, strict=True):
            s = slo_attainment(serving.run(at_rate(wl, rate), int(seed)), ttft, tpot)
            ok += s["n"] * np.array([s["ttft_attainment"], s["tpot_attainment"], s["attainment"]])
            n += s["n"]
        p = RatePoint(float(rate), *(float(x) for x in ok / n), passed=bool(ok[2] / n >= target - 1e-12),
                      wall_s=time.perf_counter() - t)
        points.append(p)
        if progress is not None:
            progress(p)
        return p

    rate = float(start_rate) if start_rate is not None else float(np.mean([own_rate(w) for w in workloads]))
    if not (math.isfinite(rate) and rate > 0):
        raise ConfigError(f"start_rate: expected a rate > 0, got {start_rate!r}")
    first = attain(rate)
    lo, hi = (rate, math.inf) if first.passed else (0.0, rate)
    capped, note = False, ""
    step = 0
    while (math.isinf(hi) or lo == 0.0) and step < max_steps:
        step += 1
        if math.isinf(hi):
            r = lo * 2.0
            if attain(r).passed:
                lo = r
            else:
                hi = r
        else:
            r = hi / 2.0
            if attain(r).passed:
                lo = r
            else:
                hi = r
    if math.isinf(hi):
        capped, note = True, f"every rate up to {lo:.4g} req/s passed; the goodput is at least that"
    elif lo == 0.0:
        note = (f"the SLO is missed even at {hi:.4g} req/s (attainment {points[-1].attainment:.3f} < {target}): "
                "the targets are tighter than an unloaded request's latency")
    else:
        while hi / lo > 1.0 + rel_tol:
            mid = math.sqrt(lo * hi)
            if attain(mid).passed:
                lo = mid
            else:
                hi = mid
    n_req = len(workloads[0])
    return GoodputResult(serving.name(), gpus, {"ttft_s": ttft, "tpot_s": tpot}, target, lo, points,
                         [int(s) for s in seeds], n_req, time.perf_counter() - t0, capped, note)
