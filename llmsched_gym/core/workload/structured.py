"""Structured workloads: merged streams, clients, task classes, typed mixtures and shared prefixes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from llmsched_gym.core.request import OFFLINE, ONLINE, Segments, Workload, WorkloadError
from llmsched_gym.core.workload.arrivals import poisson
from llmsched_gym.core.workload.checks import RngLike, _num

_ROW_ARRAYS = ("arrival_s", "prompt_tokens", "output_tokens", "predicted_output", "client", "task_class",
               "type_id", "ttft_slo_s", "tpot_slo_s")


def merge(parts: Sequence[Workload], client_weight: Sequence[float] | None = None) -> Workload:
    """Concatenate workloads and sort them by arrival (stable: ties keep part order).

    Request ids are renumbered (row order of the result). Segment ids are kept as they are, so
    parts may deliberately share segments; give parts disjoint ids otherwise. ``client_weight``
    defaults to the weights of the part with the most clients (1.0 for ids beyond them).
    """
    if not parts:
        raise WorkloadError("parts: need at least one workload")
    cat: dict[str, Any] = {name: np.concatenate([getattr(p, name) for p in parts]) for name in _ROW_ARRAYS}
    order = np.argsort(cat["arrival_s"], kind="stable")
    cat = {name: a[order] for name, a in cat.items()}
    prefix = None
    if any(p.prefix is not None for p in parts):
        flat = [s for p in parts for s in (p.prefix or [None] * len(p))]
        prefix = [flat[i] for i in order]
    if client_weight is None:
        n_clients = int(cat["client"].max()) + 1 if len(cat["client"]) else 1
        longest = max((np.asarray(p.client_weight) for p in parts), key=len)
        weight = np.concatenate([longest, np.ones(max(n_clients - len(longest), 0))])
    else:
        weight = np.asarray(client_weight, dtype=np.float64)
    return Workload(**cat, prefix=prefix, client_weight=weight)


def merge_clients(parts: Sequence[Workload], weights: Sequence[float] | None = None) -> Workload:
    """Sheng et al. 2024's multi-client workload: part ``i`` becomes client ``i`` with weight ``weights[i]``
    (default 1), merged by arrival time."""
    w = [1.0] * len(parts) if weights is None else [_num(x, f"weights[{i}]", gt=0) for i, x in enumerate(weights)]
    if len(w) != len(parts):
        raise WorkloadError(f"weights: expected {len(parts)} entries (one per client), got {len(w)}")
    tagged = [p.with_(client=np.full(len(p), i), client_weight=np.ones(i + 1)) for i, p in enumerate(parts)]
    return merge(tagged, client_weight=w)


def with_task_classes(online: Workload, offline: Workload, *, ttft_slo_s: float = 1.0,
                      tpot_slo_s: float = 0.05) -> Workload:
    """Echo's co-located serving (Wang et al. 2025): ``online`` requests keep their arrivals and get the SLOs;
    ``offline`` requests all arrive at t = 0 with no SLO (``inf``)."""
    ttft_slo_s, tpot_slo_s = _slo(ttft_slo_s, "ttft_slo_s"), _slo(tpot_slo_s, "tpot_slo_s")
    n_on, n_off = len(online), len(offline)
    on = online.with_(task_class=np.full(n_on, ONLINE), ttft_slo_s=np.full(n_on, ttft_slo_s),
                      tpot_slo_s=np.full(n_on, tpot_slo_s))
    off = offline.with_(arrival_s=np.zeros(n_off), task_class=np.full(n_off, OFFLINE),
                        ttft_slo_s=np.full(n_off, np.inf), tpot_slo_s=np.full(n_off, np.inf))
    return merge([on, off])


def _slo(value: Any, name: str) -> float:
    return math.inf if value == math.inf else _num(value, name, gt=0)


def _mix(rates: Sequence[float], size: int, rng: np.random.Generator) -> np.ndarray:
    r = np.array([_num(x, f"types[{i}].rate", gt=0) for i, x in enumerate(rates)])
    if len(r) == 0:
        raise WorkloadError("types: need at least one type")
    return rng.choice(len(r), size=size, p=r / r.sum())


def typed_mixture(types: Sequence[tuple[float, int, int]], *, n: int | None = None,
                  horizon_s: float | None = None, rng: RngLike = None) -> Workload:
    """Ao et al. 2025's prompt types: type ``j = (rate_j, prompt_j, output_j)`` arrives as its own
    Poisson process; sets ``type_id`` = j.

    Sampled as one Poisson stream at ``sum(rate_j)`` whose requests pick type j with probability
    ``rate_j / sum(rate)`` (the same process, by superposition).
    """
    rng = np.random.default_rng(rng)
    rates = [t[0] for t in types]
    t = poisson(sum(_num(r, f"types[{i}].rate", gt=0) for i, r in enumerate(rates)),
                n=n, horizon_s=horizon_s, rng=rng)
    type_id = _mix(rates, len(t), rng)
    prompt = np.array([_num(x[1], f"types[{j}].prompt", ge=1, integer=True) for j, x in enumerate(types)])
    output = np.array([_num(x[2], f"types[{j}].output", ge=1, integer=True) for j, x in enumerate(types)])
    return Workload(t, prompt[type_id], output[type_id], type_id=type_id)


def shared_system_prompts(workload: Workload, groups: int, tokens: int, rng: RngLike = None, *,
                          weights: Sequence[float] | None = None, first_segment_id: int = 0) -> Workload:
    """Prepend one of ``groups`` shared system prompts of ``tokens`` tokens to every prompt.

    Request i picks group g (uniformly, or with probability proportional to ``weights[g]``); its
    prompt grows by ``tokens`` and its prefix becomes ``((first_segment_id + g, tokens),)``
    followed by any segments it already had.
    """
    groups = int(_num(groups, "groups", ge=1, integer=True))
    tokens = int(_num(tokens, "tokens", ge=1, integer=True))
    if weights is None:
        p = None
    else:
        w = np.array([_num(x, f"weights[{i}]", ge=0) for i, x in enumerate(weights)])
        if len(w) != groups or w.sum() <= 0:
            raise WorkloadError(f"weights: expected {groups} non-negative weights (one per group), not all 0")
        p = w / w.sum()
    g = np.random.default_rng(rng).choice(groups, size=len(workload), p=p) + int(first_segment_id)
    old = workload.prefix or [None] * len(workload)
    prefix = [((int(gi), tokens),) + (segs or ()) for gi, segs in zip(g, old, strict=True)]
    return workload.with_(prompt_tokens=workload.prompt_tokens + tokens, prefix=prefix)


def regular_shuffled_queue(n_users: int, k: int, user_tokens: int, doc_tokens: int, s: float = 0.0, *,
                           base_tokens: int = 0, output_tokens: int | np.ndarray = 1,
                           arrival_s: np.ndarray | None = None, shuffle: bool = True,
                           rng: RngLike = None, first_segment_id: int = 0) -> Workload:
    """Dexter et al. 2025's Definition 4 ("Regular Arrival Shuffled Queue"): ``n = n_users * k`` prompts
    ``(base)(user)(doc)``.

    Each user prefix (``user_tokens``) is shared by exactly ``k`` prompts; each doc
    (``doc_tokens``) is unique; the optional base prompt (``base_tokens`` > 0) is shared by all.
    Arrivals fill the slots ``s, 2s, ..., n s`` (all 0 when ``s`` = 0, a burst) in a uniformly
    random user order; ``shuffle=False`` cycles users 0, 1, ..., n_users - 1, 0, 1, ... instead
    (the paper's toy example U1D1, U2D2, U1D3, U2D4). ``arrival_s`` (n sorted times, e.g. Poisson)
    replaces the regular slots, as in the paper's SGLang experiment.

    Segments: base ``first_segment_id``, then one id per user, then one id per doc, so distinct
    users and distinct docs never overlap; ``meta`` records the id ranges.
    """
    n_users = int(_num(n_users, "users", ge=1, integer=True))
    k = int(_num(k, "k", ge=1, integer=True))
    u = int(_num(user_tokens, "user_tokens", ge=1, integer=True))
    d = int(_num(doc_tokens, "doc_tokens", ge=1, integer=True))
    b = int(_num(base_tokens, "base_tokens", ge=0, integer=True))
    n = n_users * k
    if arrival_s is None:
        arrival_s = _num(s, "s", ge=0) * np.arange(1, n + 1)
    elif len(arrival_s) != n:
        raise WorkloadError(f"arrival: expected users * k = {n} arrivals, got {len(arrival_s)}")
    user = np.tile(np.arange(n_users), k)
    if shuffle:
        user = np.random.default_rng(rng).permutation(user)
    user_base = first_segment_id + (1 if b else 0)
    doc_base = user_base + n_users
    head: Segments = ((first_segment_id, b),) if b else ()
    prefix: list[Segments | None] = [head + ((user_base + int(ui), u), (doc_base + i, d))
                                     for i, ui in enumerate(user)]
    meta = {"base_segment": first_segment_id if b else None, "user_segments": (user_base, doc_base),
            "doc_segments": (doc_base, doc_base + n)}
    out = np.broadcast_to(np.asarray(output_tokens), (n,)).copy()
    return Workload(arrival_s, np.full(n, b + u + d), out, prefix=prefix, meta=meta)
