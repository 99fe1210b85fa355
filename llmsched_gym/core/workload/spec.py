"""The declarative entry point, :func:`build_workload` (its spec is documented in
:mod:`llmsched_gym.core.workload`), and :func:`explicit_workload`."""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from llmsched_gym.config import MAX_REQUESTS
from llmsched_gym.core.information import information_of_predictor
from llmsched_gym.core.request import MAX_TOKENS, Segments, Workload, WorkloadError
from llmsched_gym.core.workload.arrivals import (
    MAX_ROUND_B,
    all_at_zero,
    deterministic,
    diurnal,
    gamma,
    on_off,
    piecewise,
    poisson,
    round_counts,
)
from llmsched_gym.core.workload.checks import _num
from llmsched_gym.core.workload.lengths import _clip, empirical, fixed, lognormal, uniform, zipf
from llmsched_gym.core.workload.predictors import _PREDICTORS, predict
from llmsched_gym.core.workload.structured import (
    _ROW_ARRAYS,
    _mix,
    _slo,
    merge_clients,
    regular_shuffled_queue,
    shared_system_prompts,
    with_task_classes,
)

_TOP_KEYS = ("n_requests", "horizon_s", "arrival", "prompt", "output", "predictor", "clients",
             "classes", "prefix", "types", "trace")
_ARRIVALS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {  # type: (required, optional)
    "poisson": (("rate",), ()),
    "gamma": (("rate", "cv"), ()),
    "deterministic": (("rate",), ()),
    "all_at_zero": ((), ()),
    "on_off": (("rate_on", "on_s", "off_s"), ()),
    "piecewise": (("rates", "boundaries_s"), ()),
    "diurnal": (("mean_rate", "amplitude", "period_s"), ("peak_s",)),
    "round_counts": (("dist",), ("B", "p", "pmf")),
}
_RATE_ARRIVALS: dict[str, Callable[..., np.ndarray]] = {
    "poisson": poisson, "gamma": gamma, "on_off": on_off, "piecewise": piecewise, "diurnal": diurnal,
}
_ROUND_DISTS = {"binomial": ("B", "p"), "uniform": ("B",), "pmf": ("pmf",)}
_LENGTHS = {
    "fixed": (("value",), ()), "uniform": (("lo", "hi"), ()), "lognormal": (("mean", "median"), ()),
    "zipf": (("a",), ()), "empirical": ((), ("values", "path", "column")),
}
_PREFIXES = {
    "system": (("groups", "tokens"), ("weights",)),
    "users": (("users", "k", "user_tokens", "doc_tokens"), ("base_tokens", "s", "shuffle")),
    "sessions": (("groups", "tokens", "question_tokens", "output_tokens"), ("turns", "think_s", "length_cv")),
}


@contextmanager
def _field(path: str) -> Iterator[None]:
    """Prefix error messages raised inside with the spec path (``arrival`` + ``rate: ...``)."""
    try:
        yield
    except WorkloadError as e:
        raise WorkloadError(f"{path}.{e}") from None


def _mapping(value: Any, path: str, allowed: Sequence[str]) -> dict:
    """Check that ``value`` is a mapping with only ``allowed`` keys (``path`` "" is the top level)."""
    if not isinstance(value, dict):
        raise WorkloadError(f"{path or 'workload'}: expected a mapping, got {value!r}")
    unknown = [key for key in value if key not in allowed]
    if unknown:
        where = f"{path}.{unknown[0]}" if path else str(unknown[0])
        raise WorkloadError(f"{where}: unknown key (allowed: {', '.join(allowed)})")
    return value


def _typed(value: Any, path: str, table: dict[str, tuple[tuple[str, ...], tuple[str, ...]]],
           extra: Sequence[str] = ()) -> tuple[str, dict]:
    """Check a ``{"type": ..., params}`` mapping against ``table``; return (type, params)."""
    if not isinstance(value, dict):
        raise WorkloadError(f"{path}: expected a mapping with a 'type', got {value!r}")
    kind = value.get("type")
    if not isinstance(kind, str) or kind not in table:
        raise WorkloadError(f"{path}.type: unknown value {kind!r} (allowed: {', '.join(table)})")
    required, optional = table[kind]
    _mapping(value, path, ("type", *required, *optional, *extra))
    for key in required:
        if key not in value:
            raise WorkloadError(f"{path}.{key}: required for type {kind!r}")
    return kind, {key: v for key, v in value.items() if key != "type"}


class _Builder:
    """One build: derives an independent random stream per spec path and hands out globally
    unique segment ids."""

    def __init__(self, seed: int) -> None:
        self.seed = int(_num(seed, "seed", ge=0, integer=True))
        self.next_segment = 0

    def rng(self, path: str) -> np.random.Generator:
        return np.random.default_rng([self.seed, zlib.crc32(path.encode())])

    def segments(self, count: int) -> int:
        first, self.next_segment = self.next_segment, self.next_segment + count
        return first

    def arrivals(self, spec: Any, path: str, n: int | None, horizon_s: float | None) -> np.ndarray:
        kind, p = _typed(spec, path, _ARRIVALS)
        if n is None and horizon_s is None:
            raise WorkloadError("n_requests: give n_requests and/or horizon_s")
        rng = self.rng(path)
        with _field(path):
            if kind == "all_at_zero":
                if n is None:
                    raise WorkloadError("type: all_at_zero needs n_requests")
                return all_at_zero(n)
            if kind == "deterministic":
                return deterministic(p["rate"], n=n, horizon_s=horizon_s)
            if kind == "round_counts":
                return round_counts(self._pmf(p), n=n, horizon_s=horizon_s, rng=rng)
            fn = _RATE_ARRIVALS[kind]
            return fn(**p, n=n, horizon_s=horizon_s, rng=rng)

    @staticmethod
    def _pmf(p: dict) -> np.ndarray:
        dist = p["dist"]
        if dist not in _ROUND_DISTS:
            raise WorkloadError(f"dist: unknown value {dist!r} (allowed: {', '.join(_ROUND_DISTS)})")
        for key in ("B", "p", "pmf"):
            if (key in p) != (key in _ROUND_DISTS[dist]):
                raise WorkloadError(f"{key}: {'required' if key not in p else 'not allowed'} for dist {dist!r}")
        if dist == "pmf":
            return p["pmf"]
        big_b = int(_num(p["B"], "B", ge=0, le=MAX_ROUND_B, integer=True))
        if dist == "uniform":
            return np.full(big_b + 1, 1.0 / (big_b + 1))
        q = _num(p["p"], "p", ge=0, le=1)
        if big_b <= 1000:  # exact (math.comb fits a float)
            return np.array([math.comb(big_b, c) * q**c * (1 - q) ** (big_b - c) for c in range(big_b + 1)])
        from scipy.stats import binom

        return binom.pmf(np.arange(big_b + 1), big_b, q)

    def lengths(self, spec: Any, path: str, size: int) -> np.ndarray:
        if spec is None:
            raise WorkloadError(f"{path}: required (an int or a length mapping)")
        if not isinstance(spec, dict):
            return np.full(size, int(_num(spec, path, ge=1, le=MAX_TOKENS, integer=True)), dtype=np.int64)
        kind, p = _typed(spec, path, _LENGTHS, extra=("max",))
        rng = self.rng(path)
        max_tokens = p.pop("max", None)
        with _field(path):
            if kind == "fixed":
                return _clip(fixed(p["value"], size), max_tokens)
            if kind == "uniform":
                return _clip(uniform(p["lo"], p["hi"], size, rng), max_tokens)
            if kind == "lognormal":
                return lognormal(p["mean"], p["median"], size, rng, max_tokens=max_tokens)
            if kind == "zipf":
                return zipf(p["a"], size, rng, max_tokens=max_tokens)
            return empirical(_empirical_values(p), size, rng, max_tokens=max_tokens)

    def stream(self, spec: dict, path: str, n: int | None, horizon_s: float | None) -> Workload:
        """Arrivals + lengths + types + prefix of one stream (the top level, a client, offline)."""
        prefix = spec.get("prefix")
        if prefix is not None:
            kind, pp = _typed(prefix, f"{path}prefix", _PREFIXES)
            if kind == "users":
                return self._users(spec, pp, path, n, horizon_s)
            if kind == "sessions":
                return self._sessions(spec, pp, path, n, horizon_s)
        types = spec.get("types")
        if types is not None:
            wl = self._types(spec, types, path, n, horizon_s)
        else:
            if "arrival" not in spec:
                raise WorkloadError(f"{path}arrival: required (a mapping with a 'type')")
            t = self.arrivals(spec["arrival"], f"{path}arrival", n, horizon_s)
            wl = Workload(t, self.lengths(spec.get("prompt"), f"{path}prompt", len(t)),
                          self.lengths(spec.get("output"), f"{path}output", len(t)))
        if prefix is not None:
            with _field(f"{path}prefix"):
                first = self.segments(int(_num(pp["groups"], "groups", ge=1, integer=True)))
                wl = shared_system_prompts(wl, pp["groups"], pp["tokens"], self.rng(f"{path}prefix"),
                                           weights=pp.get("weights"), first_segment_id=first)
        return wl

    def _types(self, spec: dict, types: Any, path: str, n: int | None, horizon_s: float | None) -> Workload:
        tp = f"{path}types"
        if not isinstance(types, list) or not types:
            raise WorkloadError(f"{tp}: expected a non-empty list of {{rate, prompt, output}} mappings")
        for j, t in enumerate(types):
            _mapping(t, f"{tp}[{j}]", ("rate", "prompt", "output"))
            for key in ("rate", "prompt", "output"):
                if key not in t:
                    raise WorkloadError(f"{tp}[{j}].{key}: required")
        for key in ("prompt", "output"):
            if key in spec:
                raise WorkloadError(f"{path}{key}: not allowed with types (each type sets its own)")
        rates = [t["rate"] for t in types]
        if "arrival" in spec:
            arr = self.arrivals(spec["arrival"], f"{path}arrival", n, horizon_s)
        else:
            total = sum(_num(r, f"{tp}[{j}].rate", gt=0) for j, r in enumerate(rates))
            arr = poisson(total, n=n, horizon_s=horizon_s, rng=self.rng(f"{path}arrival"))
        type_id = _mix(rates, len(arr), self.rng(tp)) if len(arr) else np.zeros(0, dtype=np.int64)
        prompt, output = np.ones(len(arr), np.int64), np.ones(len(arr), np.int64)
        for j, t in enumerate(types):
            mask = type_id == j
            prompt[mask] = self.lengths(t["prompt"], f"{tp}[{j}].prompt", int(mask.sum()))
            output[mask] = self.lengths(t["output"], f"{tp}[{j}].output", int(mask.sum()))
        return Workload(arr, prompt, output, type_id=type_id)

    def _users(self, spec: dict, pp: dict, path: str, n: int | None, horizon_s: float | None) -> Workload:
        pre = f"{path}prefix"
        with _field(pre):
            users = int(_num(pp["users"], "users", ge=1, integer=True))
            total = users * int(_num(pp["k"], "k", ge=1, integer=True))
        if n is not None and n != total:
            raise WorkloadError(f"{path}n_requests: must equal prefix.users * prefix.k = {total} (or be omitted)")
        for key in ("types", "prompt"):
            if key in spec:
                raise WorkloadError(f"{path}{key}: not allowed with prefix type 'users' (it sets the prompts)")
        arr = None
        if "arrival" in spec:
            arr = self.arrivals(spec["arrival"], f"{path}arrival", total, None)
            if len(arr) < total:
                raise WorkloadError(f"{path}arrival: produced {len(arr)} arrivals, need {total}")
        out = 1 if spec.get("output") is None else self.lengths(spec["output"], f"{path}output", total)
        with _field(pre):
            base = int(_num(pp.get("base_tokens", 0), "base_tokens", ge=0, integer=True))
            first = self.segments((1 if base else 0) + users + total)
            wl = regular_shuffled_queue(users, pp["k"], pp["user_tokens"], pp["doc_tokens"], pp.get("s", 0.0),
                                        base_tokens=base, output_tokens=out, arrival_s=arr,
                                        shuffle=bool(pp.get("shuffle", True)), rng=self.rng(pre),
                                        first_segment_id=first)
        return _cut_workload(wl, None, horizon_s)


    def _sessions(self, spec: dict, pp: dict, path: str, n: int | None, horizon_s: float | None) -> Workload:
        """llm-d's prefix-heavy benchmark traffic: :func:`llmsched_gym.core.sessions.prefix_groups`."""
        from llmsched_gym.core.sessions import prefix_groups

        pre = f"{path}prefix"
        for key in ("types", "prompt", "output"):
            if key in spec:
                raise WorkloadError(f"{path}{key}: not allowed with prefix type 'sessions' (question_tokens and "
                                    "output_tokens set the lengths)")
        if n is None:
            raise WorkloadError(f"{path}n_requests: required with prefix type 'sessions'")
        kind, ap = _typed(spec.get("arrival"), f"{path}arrival", _ARRIVALS)
        if kind != "poisson":
            raise WorkloadError(f"{path}arrival.type: prefix type 'sessions' starts sessions as a Poisson process; "
                                f"allowed: poisson, got {kind!r}")
        rate = _num(ap["rate"], f"{path}arrival.rate", gt=0)
        if n == 0:
            return Workload(np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64))
        with _field(pre):
            groups = int(_num(pp["groups"], "groups", ge=1, integer=True))
            turns = int(_num(pp.get("turns", 1), "turns", ge=1, integer=True))
            first = self.segments(groups + 2 * turns * -(-n // turns))
            wl = prefix_groups(n, rate, groups, pp["tokens"], pp["question_tokens"], pp["output_tokens"],
                               turns=turns, think_s=pp.get("think_s", 0.0), rng=self.rng(pre),
                               first_segment_id=first, length_cv=pp.get("length_cv", 0.0))
        return _cut_workload(wl, None, horizon_s)


def _empirical_values(p: dict) -> np.ndarray:
    if ("values" in p) == ("path" in p):
        raise WorkloadError("values: give either values or path + column")
    if "values" in p:
        return np.asarray(p["values"])
    if "column" not in p:
        raise WorkloadError("column: required with path")
    from llmsched_gym.core import traces  # traces builds on arrivals and lengths

    return traces.read_column(p["path"], p["column"])


_EXPLICIT_INTS = ("prompt_tokens", "output_tokens", "predicted_output", "client", "task_class", "type_id")
_EXPLICIT_FLOATS = ("arrival_s", "ttft_slo_s", "tpot_slo_s", "client_weight")


def explicit_workload(spec: Any) -> Workload:
    """The workload a scenario lists request by request (``workload.explicit``): ``arrival_s``,
    ``prompt_tokens``, ``output_tokens`` (required lists, one entry per request), optionally
    ``predicted_output``, ``client``, ``task_class``, ``type_id`` (integers), ``ttft_slo_s``,
    ``tpot_slo_s``, ``client_weight`` (numbers) and ``prefix`` (per request: null or a list of
    ``[segment_id, tokens]`` pairs). Integers must be integers (``5.9`` is an error, not 5), token
    counts at most :data:`MAX_TOKENS`; messages name ``explicit.FIELD[i]``."""
    allowed = (*_EXPLICIT_FLOATS[:1], *_EXPLICIT_INTS, *_EXPLICIT_FLOATS[1:], "prefix")
    ex = _mapping(spec, "explicit", allowed)
    kw: dict[str, Any] = {}
    for key in ("arrival_s", "prompt_tokens", "output_tokens"):
        if key not in ex:
            raise WorkloadError(f"explicit.{key}: required (a list, one entry per request)")
    for key, value in ex.items():
        path = f"explicit.{key}"
        if not isinstance(value, list | tuple):
            raise WorkloadError(f"{path}: expected a list (one entry per request), got {str(value)[:40]!r}")
        if len(value) > MAX_REQUESTS:
            raise WorkloadError(f"{path}: {len(value):,} entries; at most {MAX_REQUESTS:,}")
        if key == "prefix":
            kw[key] = [_explicit_prefix(p, f"{path}[{i}]") for i, p in enumerate(value)]
            continue
        integer = key in _EXPLICIT_INTS
        hi = MAX_TOKENS if integer else None
        lo = 1 if key in ("prompt_tokens", "output_tokens", "predicted_output") else 0
        kw[key] = np.array([_num(x, f"{path}[{i}]", ge=lo, le=hi, integer=integer) if key != "ttft_slo_s"
                            and key != "tpot_slo_s" else _slo(x, f"{path}[{i}]") for i, x in enumerate(value)],
                           dtype=np.int64 if integer else np.float64)
    return Workload(**kw)


def _explicit_prefix(p: Any, path: str) -> Segments | None:
    if p is None or p == []:
        return None
    if not isinstance(p, list | tuple) or not all(isinstance(seg, list | tuple) and len(seg) == 2 for seg in p):
        raise WorkloadError(f"{path}: expected null or a list of [segment_id, tokens] pairs, got {str(p)[:40]!r}")
    return tuple((int(_num(a, f"{path}.segment_id", ge=0, integer=True)),
                  int(_num(k, f"{path}.tokens", ge=1, le=MAX_TOKENS, integer=True))) for a, k in p)


def _cut_workload(wl: Workload, n: int | None, horizon_s: float | None) -> Workload:
    keep = len(wl) if horizon_s is None else int(np.searchsorted(wl.arrival_s, horizon_s, side="left"))
    keep = keep if n is None else min(keep, n)
    if keep == len(wl):
        return wl
    # Workload.take would turn the prefix tuples into a nested object array; slice the list instead.
    rows = {name: getattr(wl, name)[:keep] for name in _ROW_ARRAYS}
    return wl.with_(**rows, prefix=None if wl.prefix is None else wl.prefix[:keep])


def build_workload(spec: dict, seed: int) -> Workload:
    """Build a :class:`Workload` from a declarative spec (keys: see the module docstring).

    :param spec: the mapping (e.g. a scenario's ``workload:`` section from YAML).
    :param seed: non-negative int; the same ``(spec, seed)`` always gives identical arrays.
    :raises WorkloadError: on an unknown key or a bad value, naming the field and what is allowed.
    """
    _mapping(spec, "", _TOP_KEYS)
    b = _Builder(seed)
    n = spec.get("n_requests")
    horizon_s = spec.get("horizon_s")
    n = None if n is None else int(_num(n, "n_requests", ge=0, integer=True))
    horizon_s = None if horizon_s is None else _num(horizon_s, "horizon_s", gt=0)

    source = None
    if "trace" in spec:
        wl, source = _from_trace(b, spec, n, horizon_s)
    elif "clients" in spec:
        wl = _clients(b, spec, n, horizon_s)
    else:
        wl = b.stream(spec, "", n, horizon_s)

    if "classes" in spec:
        c = _mapping(spec["classes"], "classes", ("offline", "ttft_slo_s", "tpot_slo_s"))
        offline = _mapping(c.get("offline", {"n_requests": 0, "prompt": 1, "output": 1}), "classes.offline",
                           ("n_requests", "prompt", "output", "prefix"))
        if "n_requests" not in offline:
            raise WorkloadError("classes.offline.n_requests: required")
        m = int(_num(offline["n_requests"], "classes.offline.n_requests", ge=0, integer=True))
        off = b.stream({**offline, "arrival": {"type": "all_at_zero"}}, "classes.offline.", m, None)
        with _field("classes"):
            wl = with_task_classes(wl, off, ttft_slo_s=c.get("ttft_slo_s", 1.0),
                                   tpot_slo_s=c.get("tpot_slo_s", 0.05))

    kind = "oracle"
    if "predictor" in spec:
        kind, p = _typed(spec["predictor"], "predictor", _PREDICTORS)
        with _field("predictor"):
            wl = wl.with_(predicted_output=predict(wl, kind, b.rng("predictor"), **p))
    wl.meta = {**wl.meta, "seed": b.seed, "information": information_of_predictor(kind)}
    if source is not None:
        wl.meta["workload_source"] = source
    return wl


def _clients(b: _Builder, spec: dict, n: int | None, horizon_s: float | None) -> Workload:
    for key in ("arrival", "types"):
        if key in spec:
            raise WorkloadError(f"{key}: not allowed with clients (give each client its own rate or arrival)")
    clients = spec["clients"]
    if not isinstance(clients, list) or not clients:
        raise WorkloadError("clients: expected a non-empty list of {rate or arrival, weight, prompt, output}")
    if n is None and horizon_s is None:
        raise WorkloadError("n_requests: give n_requests and/or horizon_s")
    parts, weights = [], []
    for i, c in enumerate(clients):
        path = f"clients[{i}]"
        _mapping(c, path, ("rate", "arrival", "weight", "prompt", "output", "prefix"))
        if ("rate" in c) == ("arrival" in c):
            raise WorkloadError(f"{path}: give exactly one of rate or arrival")
        sub = {"arrival": c.get("arrival") or {"type": "poisson", "rate": c["rate"]},
               "prompt": c.get("prompt", spec.get("prompt")), "output": c.get("output", spec.get("output")),
               "prefix": c.get("prefix", spec.get("prefix"))}
        parts.append(b.stream({k: v for k, v in sub.items() if v is not None}, f"{path}.", n, horizon_s))
        weights.append(_num(c.get("weight", 1.0), f"{path}.weight", gt=0))
    wl = merge_clients(parts, weights)
    return _cut_workload(wl, n, horizon_s)


def _from_trace(b: _Builder, spec: dict, n: int | None, horizon_s: float | None) -> tuple[Workload, dict]:
    """The trace's workload and its ``workload_source`` (real file and its sha256, or synthetic)."""
    from llmsched_gym import data
    from llmsched_gym.core import traces  # traces builds on arrivals and lengths

    for key in ("clients", "types", "prompt", "output", "prefix"):
        if key in spec:
            raise WorkloadError(f"{key}: not allowed with trace (the trace supplies it)")
    t = _mapping(spec["trace"], "trace", ("format", "path", "on_zero", "time_scale", "window", "part"))
    window = t.get("window", "head")
    if window not in ("head", "random"):
        raise WorkloadError(f"trace.window: unknown value {window!r} (allowed: head, random)")
    part = _trace_part(t.get("part", (0.0, 1.0)))
    fmt = t.get("format")
    if fmt not in traces.FORMATS:
        raise WorkloadError(f"trace.format: unknown value {fmt!r} (allowed: {', '.join(traces.FORMATS)})")
    on_zero = t.get("on_zero", "error")
    if on_zero not in ("error", "clip"):
        raise WorkloadError(f"trace.on_zero: unknown value {on_zero!r} (allowed: error, clip)")
    path = t.get("path") or traces.DEFAULT_FILES.get(fmt)
    if path is None:
        raise WorkloadError(f"trace.path: required for format {fmt!r}")
    try:
        found = data.resolve_data(path)
    except data.DataError as e:
        raise WorkloadError(f"trace.path: {e}") from None
    ds = data.known(str(path))
    if found is None:  # a known trace (resolve_data raised for anything else) that is nowhere local
        if fmt not in traces.SYNTHETIC or "path" in t:
            raise WorkloadError(f"trace.path: {path!r} not found; `llmsched data download {ds.name}` fetches it")
        data.notify_fallback(ds.name)
        source = {"kind": "synthetic", "name": ds.name, "sha256": None}
    else:
        source = data.trace_source(found, ds)  # a known name is checked against its published sha256
    if found is None:
        wl = traces.SYNTHETIC[fmt](b.seed)
    elif fmt == "sharegpt":
        if "arrival" not in spec:
            raise WorkloadError("arrival: required with trace format 'sharegpt' (ShareGPT has no timestamps)")
        wl = traces.load_sharegpt(found, lambda k: b.arrivals(spec["arrival"], "arrival", k, None),
                                  on_zero=on_zero)
    else:
        wl = traces.load_trace(fmt, found, on_zero=on_zero)
    if "arrival" in spec and fmt != "sharegpt":
        arr = b.arrivals(spec["arrival"], "arrival", len(wl), None)
        if len(arr) < len(wl):
            raise WorkloadError(f"arrival: produced {len(arr)} arrivals for {len(wl)} trace rows")
        wl = wl.with_(arrival_s=arr)
    if "time_scale" in t:
        wl = wl.with_(arrival_s=wl.arrival_s * _num(t["time_scale"], "trace.time_scale", gt=0))
    if part != (0.0, 1.0):
        lo, hi = (int(round(f * len(wl))) for f in part)
        rows = {name: getattr(wl, name)[lo:hi] for name in _ROW_ARRAYS}
        rows["arrival_s"] = rows["arrival_s"] - rows["arrival_s"][0]
        wl = wl.with_(**rows, prefix=None if wl.prefix is None else wl.prefix[lo:hi])
    if window == "random":
        wl = _random_window(wl, n, horizon_s, b.rng("trace.window"))
    return _cut_workload(wl, n, horizon_s), source


def _trace_part(value: Any) -> tuple[float, float]:
    """``trace.part``: ``[start, end]`` fractions of the trace's rows (held-out windows: train on
    one part of a trace, test on another)."""
    try:
        lo, hi = (float(x) for x in value)
    except (TypeError, ValueError):
        raise WorkloadError(f"trace.part: expected [start, end] fractions of the rows, got {value!r}") from None
    if not 0.0 <= lo < hi <= 1.0:
        raise WorkloadError(f"trace.part: need 0 <= start < end <= 1, got [{lo}, {hi}]")
    return lo, hi


def _random_window(wl: Workload, n: int | None, horizon_s: float | None, rng: np.random.Generator) -> Workload:
    """The trace from a seeded start row on (arrivals shifted to start at 0), such that ``n`` rows
    (or ``horizon_s`` seconds) remain; the whole trace when it is not longer than that."""
    t = wl.arrival_s
    if n is not None:
        last_start = len(wl) - n
    elif horizon_s is not None:
        last_start = int(np.searchsorted(t, t[-1] - horizon_s, side="right")) - 1
    else:
        return wl
    if last_start <= 0:
        return wl
    start = int(rng.integers(0, last_start + 1))
    rows = {name: getattr(wl, name)[start:] for name in _ROW_ARRAYS}
    rows["arrival_s"] = rows["arrival_s"] - rows["arrival_s"][0]
    return wl.with_(**rows, prefix=None if wl.prefix is None else wl.prefix[start:])
