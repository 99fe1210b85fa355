"""Argument checks shared by the workload generators (messages name the argument;
:func:`~llmsched_gym.core.workload.spec.build_workload` prefixes the spec path)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from llmsched_gym.config import MAX_REQUESTS
from llmsched_gym.core.request import WorkloadError

RngLike = np.random.Generator | int | None


def _num(value: Any, name: str, *, gt: float | None = None, ge: float | None = None,
         le: float | None = None, integer: bool = False) -> float:
    ok = isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)
    if ok and integer:
        ok = float(value).is_integer()
    def show(x: float) -> str:
        return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"

    bounds = [f"> {show(gt)}" if gt is not None else "", f">= {show(ge)}" if ge is not None else "",
              f"<= {show(le)}" if le is not None else ""]
    want = f"{'an integer' if integer else 'a number'} {' and '.join(b for b in bounds if b)}".rstrip()
    if ok:
        v = float(value)
        ok = math.isfinite(v) and (gt is None or v > gt) and (ge is None or v >= ge) and (le is None or v <= le)
    if not ok:
        raise WorkloadError(f"{name}: expected {want}, got {value!r}")
    return int(value) if integer else float(value)



def _bounds(n: int | None, horizon_s: float | None) -> tuple[int | None, float | None]:
    if n is None and horizon_s is None:
        raise WorkloadError("n_requests: give n_requests and/or horizon_s")
    n = None if n is None else int(_num(n, "n_requests", ge=0, le=MAX_REQUESTS, integer=True))
    horizon_s = None if horizon_s is None else _num(horizon_s, "horizon_s", gt=0)
    return n, horizon_s


def _expected(horizon_s: float, rate: float) -> None:
    """Refuse a horizon that would draw more than MAX_REQUESTS arrivals (memory, not a message)."""
    if horizon_s * rate > MAX_REQUESTS:
        raise WorkloadError(f"horizon_s: {horizon_s:g} s at {rate:g} requests/s is about {horizon_s * rate:.3g} "
                            f"requests; at most {MAX_REQUESTS:,} (shorten it or set n_requests)")


def _cut(t: np.ndarray, n: int | None, horizon_s: float | None) -> np.ndarray:
    if horizon_s is not None:
        t = t[t < horizon_s]
    return t if n is None else t[:n]
