"""Sheng et al. 2024 ("Fairness in Serving Large Language Models") fairness metrics beyond
the summary's ``fairness`` block: cost functions, per-client service over time, the accumulated
service gap and the paper's per-tick service difference (Tables 2-6: Max/Avg/Var Diff).

Service of a request is a cost ``h(n_p, n_q)`` of its input and output tokens (section 3.1):
``linear`` (``w_p n_p + w_q n_q``, the paper's 1 and 2), ``profiled`` (Appendix B.2's fit for
Llama-2-7B on an A10G, ``2.1 n_p + n_q + 0.04 n_p n_q + 0.032 n_q^2 + 11.46``) or
``profiled-artifact`` (the artifact's millisecond coefficients, ~1/10 of the paper's).

Service over time comes from the per-request table, in one of two ways:

* ``spread`` (the artifact's, which produced the paper's numbers): each completed request's cost
  is spread uniformly over ``[first token, completion]``;
* ``tokens``: the input part ``h(n_p, 0)`` counts when the prompt is processed (first token), the
  output part ``h(n_p, n_q) - h(n_p, 0)`` uniformly from the first token to completion (or, for a
  request still running, to the end of the run, pro rata to the tokens generated).

Per-tick service difference (§4.2): at each tick, with ``s_j`` client j's service rate in a
window and ``r_j`` the cost rate of the requests it sent in that window (rejected ones excluded,
as in the artifact), ``diff = sum_j min(s_max - s_j, |r_j - s_j|)``; Max/Avg/Var are taken over
the ticks. The artifact's ticks: ``x_k = k (T - w/2) / 20`` for ``k = 1..19`` with windows
``[x_k, x_k + w]``, ``w = 60 s`` and ``T = 600 s`` (19 values).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from llmsched_gym.core.engine import Engine


class Records(Protocol):
    """A finished run as these functions read it: the per-request table and the engine
    (:class:`~llmsched_gym.sim.SimResult` is one; a bare :class:`Engine` is accepted too)."""

    requests: dict[str, np.ndarray]
    engine: Engine


if TYPE_CHECKING:
    Run = Records | Engine

CostFn = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""``h(n_p, n_q)``: vectorised over NumPy arrays of input and output token counts."""

COST_NAMES = ("linear", "profiled", "profiled-artifact")
DONE, REJECTED = 3, 4


def make_cost(name: str = "linear", w_p: float = 1.0, w_q: float = 2.0) -> CostFn:
    """The cost function ``name`` (see the module docstring); ``w_p``/``w_q`` weight ``linear``."""
    if name == "linear":
        return lambda n_p, n_q: w_p * np.asarray(n_p, dtype=float) + w_q * np.asarray(n_q, dtype=float)
    if name == "profiled":
        return lambda n_p, n_q: _quadratic(n_p, n_q, 2.1, 1.0, 0.04, 0.032, 11.46)
    if name == "profiled-artifact":
        return lambda n_p, n_q: _quadratic(n_p, n_q, 0.21001891, 0.10075395, 0.0039868, 0.00324733, 1.14601454)
    raise ValueError(f"cost: {name!r} is not one of {', '.join(COST_NAMES)}")


def _quadratic(n_p, n_q, a: float, b: float, c: float, d: float, e: float) -> np.ndarray:
    x = np.asarray(n_p, dtype=float)
    y = np.asarray(n_q, dtype=float)
    return a * x + b * y + c * x * y + d * y * y + e


class _Records:
    """The per-request table and the engine of a run, built once."""

    def __init__(self, run: Run) -> None:
        from llmsched_gym.core.engine import Engine
        from llmsched_gym.core.records import request_table

        if isinstance(run, Engine):
            self.requests, self.engine = request_table(run), run
        else:
            self.requests, self.engine = run.requests, run.engine


def _pieces(result: _Records, cost: CostFn, method: str) -> tuple[np.ndarray, ...]:
    """(client, start, end, amount) of every service piece, spread uniformly on [start, end]."""
    req = result.requests
    state = req["state"]
    prompt, out = req["prompt_tokens"], req["output_tokens"]
    ft, done_s = req["first_token_s"], req["completion_s"]
    t_end = float(result.engine.clock)
    if method == "spread":
        m = state == DONE
        return req["client"][m], ft[m], done_s[m], cost(prompt[m], out[m])
    if method != "tokens":
        raise ValueError(f"method: {method!r} is not one of spread, tokens")
    started = np.isfinite(ft)
    gen = np.where(state == DONE, out, req["generated"])
    end = np.where(state == DONE, done_s, t_end)
    c = req["client"][started]
    inp = cost(prompt[started], np.zeros(int(started.sum())))
    outp = cost(prompt[started], gen[started]) - inp
    ft_s = ft[started]
    return (np.concatenate([c, c]), np.concatenate([ft_s, ft_s]), np.concatenate([ft_s, end[started]]),
            np.concatenate([inp, outp]))


def _cumulative(start: np.ndarray, end: np.ndarray, amount: np.ndarray, times: np.ndarray,
                chunk: int = 4096) -> np.ndarray:
    """``sum_j amount_j * clip((t - start_j) / (end_j - start_j), 0, 1)`` at each time (a step at
    ``start_j`` when the span is empty), over chunks of pieces to bound memory."""
    out = np.zeros(len(times))
    t = times[:, None]
    for i in range(0, len(start), chunk):
        a, b, w = start[i:i + chunk], end[i:i + chunk], amount[i:i + chunk]
        span = b - a
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # clipped to [0, 1] below
            frac = np.where(span > 0, np.clip((t - a) / np.where(span > 0, span, 1.0), 0.0, 1.0), t >= a)
        out += frac @ w
    return out


def service_curves(run: Run, times, *, cost: CostFn | None = None, method: str = "spread",
                   per_weight: bool = False) -> np.ndarray:
    """Cumulative service ``W_i(0, t)``: an array of shape ``(len(times), n_clients)``.

    :param run: a finished run: a :class:`~llmsched_gym.sim.SimResult` or its engine.
    :param times: the instants (seconds).
    :param cost: ``h(n_p, n_q)`` (default: linear with ``w_p = 1``, ``w_q = 2``).
    :param method: ``spread`` or ``tokens`` (module docstring).
    :param per_weight: divide each client's service by its weight (weighted fairness, §4.3).
    """
    cost = cost or make_cost()
    times = np.atleast_1d(np.asarray(times, dtype=float))
    result = _Records(run)
    wl = result.engine.workload
    client, start, end, amount = _pieces(result, cost, method)
    curves = np.zeros((len(times), wl.n_clients))
    for i in np.unique(client):
        m = client == i
        curves[:, i] = _cumulative(start[m], end[m], amount[m], times)
    if per_weight:
        curves /= np.asarray(wl.client_weight)[None, :]
    return curves


def window_service(run: Run, t1: float, t2: float, **kw: Any) -> np.ndarray:
    """Service ``W_i(t1, t2)`` of every client (keyword arguments as :func:`service_curves`)."""
    c = service_curves(run, [t1, t2], **kw)
    return c[1] - c[0]


def requested_service(run: Run, t1: float, t2: float, cost: CostFn | None = None) -> np.ndarray:
    """Cost of the requests each client sent in ``[t1, t2)``, rejected requests excluded."""
    cost = cost or make_cost()
    result = _Records(run)
    req = result.requests
    m = (req["arrival_s"] >= t1) & (req["arrival_s"] < t2) & (req["state"] != REJECTED)
    n_clients = result.engine.workload.n_clients
    return np.bincount(req["client"][m], weights=cost(req["prompt_tokens"][m], req["output_tokens"][m]),
                       minlength=n_clients)


def accumulated_gap(run: Run, times, clients=None, **kw: Any) -> np.ndarray:
    """``max_{i,j} |W_i(0, t) - W_j(0, t)|`` over ``clients`` (default: all) at each time."""
    c = service_curves(run, times, **kw)
    if clients is not None:
        c = c[:, list(clients)]
    return c.max(axis=1) - c.min(axis=1)


def tick_service_difference(run: Run, *, horizon_s: float = 600.0, window_s: float = 60.0,
                            n_ticks: int = 20, cost: CostFn | None = None, method: str = "spread") -> dict[str, Any]:
    """The paper's per-tick service difference with Max/Avg/Var over the ticks (§4.2).

    Rates are per second (service and requested cost divided by the window); ticks and windows
    follow the artifact (module docstring).
    """
    cost = cost or make_cost()
    result = _Records(run)
    ticks = np.arange(1, n_ticks) * (horizon_s - window_s / 2) / n_ticks
    bounds = np.concatenate([ticks, ticks + window_s])
    curves = service_curves(result, bounds, cost=cost, method=method)
    k = len(ticks)
    diffs = []
    for j, x in enumerate(ticks):
        s = (curves[k + j] - curves[j]) / window_s
        r = requested_service(result, x, x + window_s, cost) / window_s
        diffs.append(float(np.minimum(s.max() - s, np.abs(r - s)).sum()))
    d = np.asarray(diffs)
    return {"max": float(d.max()), "avg": float(d.mean()), "var": float(d.var()), "ticks": ticks.tolist(),
            "values": d.tolist()}


def throughput_in_out(run: Run) -> float:
    """The paper's throughput: input + output tokens of completed requests per second of run."""
    result = _Records(run)
    req = result.requests
    m = req["state"] == DONE
    arrivals = result.engine.workload.arrival_s
    if not len(arrivals):  # an empty workload (n_requests=0)
        return 0.0
    span = float(result.engine.clock) - float(arrivals[0])
    return float((req["prompt_tokens"][m].sum() + req["output_tokens"][m].sum()) / max(span, 1e-12))


def fairness_report(run: Run, *, cost: CostFn | None = None, horizon_s: float | None = None,
                    n_times: int = 200) -> dict[str, Any]:
    """Sheng et al. 2024's numbers of one run, ready for the summary: per-tick difference (horizon: 600 s
    or the run's end if sooner), the largest accumulated gap, per-client service over time
    (``n_times`` instants up to the end of the run) and throughput (in + out tokens/s)."""
    result = _Records(run)
    end = float(result.engine.clock)
    horizon = horizon_s if horizon_s is not None else min(600.0, end)
    times = np.linspace(0.0, end, n_times)
    curves = service_curves(result, times, cost=cost)
    return {
        "tick_diff": {k: v for k, v in tick_service_difference(result, horizon_s=horizon, cost=cost).items()
                      if k in ("max", "avg", "var")},
        "max_accumulated_gap": float((curves.max(axis=1) - curves.min(axis=1)).max()),
        "service_over_time": {"t_s": times.tolist(), "per_client": curves.T.tolist()},
        "throughput_in_out_tokens_per_s": throughput_in_out(result),
    }


__all__ = [
    "COST_NAMES", "CostFn", "Records", "accumulated_gap", "fairness_report", "make_cost", "requested_service",
    "service_curves", "throughput_in_out", "tick_service_difference", "window_service",
]
