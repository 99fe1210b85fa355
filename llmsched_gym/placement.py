"""Placement search for a GPU budget: which split into prefill and decode pools, and which
tensor-parallel degree for each, gives the most SLO goodput per GPU (DistServe, Zhong et al.,
OSDI 2024, section 4.1, Algorithm 1, simplified).

DistServe's algorithm searches each phase's parallelism (tensor- and pipeline-parallel degree) with
a simulator of one prefill instance and one decode instance, takes the configuration with the best
goodput per GPU for each phase, and replicates each instance enough times to carry the target
rate. Ours, simplified:

* **Candidates.** Every way to spend exactly ``gpus`` GPUs on ``P`` prefill replicas of
  tensor-parallel degree ``tp_p`` and ``D`` decode replicas of degree ``tp_d``
  (``P * tp_p + D * tp_d = gpus``, ``P, D >= 1``), for the degrees the scenario's batch-time
  model has (:func:`tp_variants`: a measured Vidur profile's 1, 2, 4, 8; otherwise only the
  scenario's own), and, as the reference, the colocated cluster of ``gpus // tp`` replicas at each
  degree. No pipeline parallelism (our batch-time models have none) and no node-affinity
  constraint (the transfer model is one link speed, set by ``transfer``).
* **Score.** Each candidate runs whole (both pools, the KV transfer and the routers together:
  :func:`llmsched_gym.goodput.find_goodput`), not phase by phase, so the interference that
  DistServe's per-phase simulation leaves out (a decode pool short of KV room making prefills
  wait) is counted. Candidates are searched at a coarse tolerance; the best is refined.
* **Memory.** A replica of degree ``k`` holds the scenario's KV capacity scaled by the memory left
  after the weights at ``k`` GPUs against the scenario's own degree
  (:func:`llmsched_gym.core.models.kv_capacity_tokens`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from llmsched_gym.config import ConfigError
from llmsched_gym.goodput import DEFAULT_REQUESTS, GoodputResult, Serving, find_goodput, tensor_parallel


def tp_variants(latency: str) -> dict[int, str]:
    """The tensor-parallel degrees for which ``latency`` (a batch-time model spec) has a model,
    each with its spec: every degree a ``vidur:`` or ``profile:`` profile measured
    (``vidur:a100/llama-2-7b,tp=2``), otherwise just the model's own degree."""
    from llmsched_gym.core.latency import make_latency

    if not isinstance(latency, str):
        return {tensor_parallel(make_latency(latency)): latency}
    kind, _, rest = latency.partition(":")
    model = make_latency(latency)
    if kind in ("vidur", "profile") and hasattr(model, "profile"):
        from llmsched_gym.core.profile import find_profile, read_vidur_mlp

        head, *opts = rest.split(",")
        opts = [o for o in opts if not o.strip().startswith("tp=")]
        path = find_profile(head.strip().lower()) if kind == "vidur" else head.strip()
        if path is not None:
            tps = sorted(read_vidur_mlp(str(path)))
            return {tp: ",".join([f"{kind}:{head}", *opts] + ([f"tp={tp}"] if tp != 1 else [])) for tp in tps}
    return {tensor_parallel(model): latency}


def capacity_at(spec: Mapping[str, Any], tp: int) -> int | None:
    """The KV capacity (tokens) of one replica at degree ``tp``: the scenario's capacity scaled by
    the memory left for KV after the weights (:func:`~llmsched_gym.core.models.kv_capacity_tokens`)
    at ``tp`` GPUs against the scenario's own degree; None when the model does not say its GPU."""
    from llmsched_gym.core.latency import make_latency
    from llmsched_gym.core.models import kv_capacity_tokens

    model = make_latency(spec.get("latency", "unit"))
    prof = getattr(model, "profile", None)
    cap = spec.get("engine", {}).get("kv_capacity_tokens")
    if prof is None or cap is None:
        return None
    own = tensor_parallel(model)
    try:
        ratio = kv_capacity_tokens(prof.model, replace(prof.gpu, count=tp)) / kv_capacity_tokens(
            prof.model, replace(prof.gpu, count=own))
    except ValueError:  # the weights do not fit at this degree
        return 0
    block = int(spec.get("engine", {}).get("block_size", 16))
    return int(cap * ratio) // block * block


@dataclass
class Candidate:
    """One placement: ``prefill`` replicas of degree ``tp_prefill`` and ``decode`` of ``tp_decode``
    (``prefill = 0``: colocated, ``decode`` replicas of degree ``tp_decode``)."""

    prefill: int
    tp_prefill: int
    decode: int
    tp_decode: int

    @property
    def gpus(self) -> int:
        return self.prefill * self.tp_prefill + self.decode * self.tp_decode

    @property
    def colocated(self) -> bool:
        return self.prefill == 0

    def label(self) -> str:
        if self.colocated:
            return f"colocated {self.decode} x TP{self.tp_decode}"
        return f"{self.prefill}P x TP{self.tp_prefill} + {self.decode}D x TP{self.tp_decode}"


def candidates(gpus: int, tps: list[int], colocated: bool = True) -> list[Candidate]:
    """Every split of exactly ``gpus`` GPUs (module docstring), colocated ones first."""
    if not isinstance(gpus, int) or isinstance(gpus, bool) or not 2 <= gpus <= 1024:
        raise ConfigError(f"--gpus: expected an integer in 2..1024 (a prefill and a decode replica), got {gpus!r}")
    out = [Candidate(0, tp, gpus // tp, tp) for tp in tps if gpus // tp >= 1] if colocated else []
    for tp_p in tps:
        for tp_d in tps:
            for p in range(1, gpus // tp_p + 1):
                rest = gpus - p * tp_p
                if rest >= tp_d and rest % tp_d == 0:
                    out.append(Candidate(p, tp_p, rest // tp_d, tp_d))
    return out


def serving_for(base: Serving, cand: Candidate, variants: dict[int, str], spec: Mapping[str, Any]) -> Serving:
    """The :class:`Serving` of a candidate (each replica's batch-time model and KV capacity at its degree)."""

    def pool(n: int, tp: int) -> dict[str, Any]:
        p: dict[str, Any] = {"n": n, "latency": variants[tp]}
        cap = capacity_at(spec, tp)
        if cap is not None:
            p["engine"] = {"kv_capacity_tokens": cap}
        return p

    if cand.colocated:
        over = dict(base.overrides)
        over["latency"] = variants[cand.tp_decode]
        cap = capacity_at(spec, cand.tp_decode)
        if cap is not None:
            over["engine.kv_capacity_tokens"] = cap
        return replace(base, overrides=over, n_replicas=cand.decode, pools=None, label=cand.label())
    return replace(base, pools={"prefill": pool(cand.prefill, cand.tp_prefill), "decode": pool(cand.decode, cand.tp_decode)},
                   label=cand.label())


@dataclass
class PlacementResult:
    """The candidates with their goodput (sorted, best first) and the best one refined."""

    gpus: int
    rows: list[tuple[Candidate, GoodputResult]]
    best: tuple[Candidate, GoodputResult]
    wall_s: float

    def table(self) -> str:
        lines = [f"{'placement':<28} {'GPUs':>4} {'goodput req/s':>14} {'per GPU':>9} {'runs':>5}"]
        for c, r in self.rows:
            lines.append(f"{c.label():<28} {c.gpus:>4} {r.goodput:14.4g} {r.per_gpu:9.4g} {len(r.points):>5}"
                         + ("  (at least)" if r.capped else ""))
        return "\n".join(lines)


def search_placement(base: Serving, slo: Mapping[str, float], gpus: int, attainment: float = 0.9,
                     seeds: tuple[int, ...] = (0,), n_requests: int | None = DEFAULT_REQUESTS,
                     tps: list[int] | None = None, rel_tol: float = 0.03, coarse_tol: float = 0.05,
                     colocated: bool = True, progress: Callable[[Candidate, GoodputResult], None] | None = None
                     ) -> PlacementResult:
    """Goodput per GPU of every candidate placement of ``gpus`` GPUs (module docstring), the best
    refined to ``rel_tol``.

    :param base: the serving setup whose scenario, policy, router, transfer and decider every
        candidate shares (its own ``pools`` and ``n_replicas`` are replaced).
    :param tps: the tensor-parallel degrees to try (default: every degree the model has).
    :param coarse_tol: the search tolerance of the candidates before the best is refined.
    """
    t0 = time.perf_counter()
    spec = base.spec()
    variants = tp_variants(spec.get("latency", "unit"))
    if tps is not None:
        missing = [t for t in tps if t not in variants]
        if missing:
            raise ConfigError(f"--tp: no batch-time model at tensor-parallel degree {missing[0]}; "
                              f"allowed: {', '.join(map(str, variants))}")
        variants = {t: variants[t] for t in tps}
    rows: list[tuple[Candidate, GoodputResult]] = []
    best_per_gpu = None
    for cand in candidates(gpus, sorted(variants), colocated):
        if capacity_at(spec, cand.tp_decode) == 0 or (not cand.colocated and capacity_at(spec, cand.tp_prefill) == 0):
            continue  # the weights do not fit at that degree
        start = best_per_gpu * cand.gpus if best_per_gpu else None
        res = find_goodput(serving_for(base, cand, variants, spec), slo, attainment, seeds, n_requests,
                           coarse_tol, start)
        rows.append((cand, res))
        if progress is not None:
            progress(cand, res)
        if res.goodput > 0 and (best_per_gpu is None or res.per_gpu > best_per_gpu):
            best_per_gpu = res.per_gpu
    if not rows:
        raise ConfigError(f"--gpus: no placement of {gpus} GPUs fits the model's weights")
    rows.sort(key=lambda cr: -cr[1].per_gpu)
    cand = rows[0][0]
    refined = find_goodput(serving_for(base, cand, variants, spec), slo, attainment, seeds, n_requests, rel_tol,
                           rows[0][1].goodput or None)
    return PlacementResult(gpus, rows, (cand, refined), time.perf_counter() - t0)
