"""Request data: a workload is a set of pre-sampled, arrival-sorted NumPy arrays.

Request ``i`` of a workload is row ``i`` of every array; request ids are these row indices and
never change, so a policy, the engine and the metrics all talk about the same ``int`` id.

Prefix identity (for prefix caching) is a tuple of *segments*: ``((segment_id, n_tokens), ...)``
describing the shareable head of the prompt, in order. Two requests share their first ``k``
prompt tokens exactly when their segment lists agree up to ``k`` tokens. Segment ids are global
integers (a system prompt, a user's history, a document). Prompt tokens beyond the segments are
unique to the request. ``None`` means "nothing shareable".
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np

from llmsched_gym.config import ConfigError

ONLINE, OFFLINE = 0, 1
"""Task classes (Echo, Wang et al. 2025): online requests carry SLOs, offline ones are throughput work."""

Segments = tuple[tuple[int, int], ...]

MAX_TOKENS = 2**31 - 1
"""Most prompt or output tokens one request may have (every source: traces, generated and explicit
workloads); far above any context window, and sums over a workload stay in int64."""
MAX_ARRIVAL_S = 1e9
"""Latest arrival time, in seconds (about 31 years; float64 keeps the clock at sub-microsecond
resolution up to there): a generated workload is bounded like a trace."""
MAX_SPARSE_CLIENTS = 65_536
"""Without ``client_weight``, client ids must stay below ``max(MAX_SPARSE_CLIENTS, 2 n)``."""


class WorkloadError(ConfigError):
    """A workload field is invalid (the message names the field and the allowed values)."""


@dataclass
class Workload:
    """Pre-sampled requests, sorted by ``arrival_s``.

    :param arrival_s: arrival times in seconds (or rounds in round mode), non-decreasing.
    :param prompt_tokens: prompt length of each request (>= 1).
    :param output_tokens: true output length (>= 1); hidden from non-oracle policies.
    :param predicted_output: the output length a policy may use (defaults to the true one); all
        zeros means no prediction (the ``none`` predictor, the blind information model).
    :param client: client id of each request (fairness, Sheng et al. 2024); 0 when there is one client.
    :param task_class: ``ONLINE`` (0) or ``OFFLINE`` (1) (Wang et al. 2025).
    :param type_id: prompt type (Ao et al. 2025's types; 0 when untyped).
    :param ttft_slo_s: TTFT SLO in seconds, ``inf`` when unset.
    :param tpot_slo_s: TPOT SLO in seconds, ``inf`` when unset.
    :param prefix: per-request prefix segments (see module doc) or ``None``.
    :param client_weight: weight of each client id (index = client id), 1.0 by default.
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    predicted_output: np.ndarray | None = None
    client: np.ndarray | None = None
    task_class: np.ndarray | None = None
    type_id: np.ndarray | None = None
    ttft_slo_s: np.ndarray | None = None
    tpot_slo_s: np.ndarray | None = None
    prefix: list[Segments | None] | None = None
    client_weight: np.ndarray | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        self.arrival_s = np.asarray(self.arrival_s, dtype=np.float64)
        self.prompt_tokens = np.asarray(self.prompt_tokens, dtype=np.int64)
        self.output_tokens = np.asarray(self.output_tokens, dtype=np.int64)
        if self.predicted_output is None:
            self.predicted_output = self.output_tokens.copy()
        self.predicted_output = np.asarray(self.predicted_output, dtype=np.int64)
        self.client = _default(self.client, n, 0, np.int64)
        self.task_class = _default(self.task_class, n, ONLINE, np.int8)
        self.type_id = _default(self.type_id, n, 0, np.int64)
        self.ttft_slo_s = _default(self.ttft_slo_s, n, np.inf, np.float64)
        self.tpot_slo_s = _default(self.tpot_slo_s, n, np.inf, np.float64)
        n_clients = int(self.client.max()) + 1 if n else 1
        if self.client_weight is None:
            # per-client arrays are indexed by id: a huge id must not allocate them by the gigabyte
            if n_clients > max(MAX_SPARSE_CLIENTS, 2 * n):
                raise WorkloadError(f"client: id {n_clients - 1} is too large for {n} requests; number the clients "
                                    "densely from 0 (the trace loaders do) or give client_weight")
            self.client_weight = np.ones(n_clients)
        self.client_weight = np.asarray(self.client_weight, dtype=np.float64)
        self.validate()

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def n_clients(self) -> int:
        return len(self.client_weight)

    @property
    def has_slo(self) -> bool:
        return bool(np.isfinite(self.ttft_slo_s).any() or np.isfinite(self.tpot_slo_s).any())

    @property
    def has_prefix(self) -> bool:
        return self.prefix is not None and any(p for p in self.prefix)

    def validate(self) -> None:
        """Raise :class:`WorkloadError` naming the first bad field."""
        n = len(self.arrival_s)
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, np.ndarray) and f.name != "client_weight" and len(v) != n:
                raise WorkloadError(f"{f.name}: expected {n} entries (one per request), got {len(v)}")
        if self.prefix is not None and len(self.prefix) != n:
            raise WorkloadError(f"prefix: expected {n} entries (one per request), got {len(self.prefix)}")
        if n == 0:
            return
        if not np.all(np.isfinite(self.arrival_s)) or self.arrival_s.min() < 0:
            raise WorkloadError("arrival_s: must be finite and >= 0")
        if self.arrival_s.max() > MAX_ARRIVAL_S:
            i = int(np.argmax(self.arrival_s > MAX_ARRIVAL_S))
            raise WorkloadError(f"arrival_s: request {i} arrives at {self.arrival_s[i]:.3g} s, after the {MAX_ARRIVAL_S:g} s "
                                "bound (is the arrival rate far too low?)")
        if np.any(np.diff(self.arrival_s) < 0):
            raise WorkloadError("arrival_s: must be sorted (non-decreasing); use Workload.sorted()")
        for name in ("prompt_tokens", "output_tokens", "predicted_output"):
            a = getattr(self, name)
            if name == "predicted_output" and not a.any():
                continue  # all zeros: no prediction (blind)
            if a.min() < 1:
                i = int(np.argmin(a))
                raise WorkloadError(f"{name}: must be >= 1 (request {i} has {int(a[i])})")
            if a.max() > MAX_TOKENS:
                i = int(np.argmax(a))
                raise WorkloadError(f"{name}: must be <= {MAX_TOKENS:,} (request {i} has {int(a[i]):,})")
        if self.client.min() < 0:
            raise WorkloadError("client: must be >= 0")
        if len(self.client_weight) < int(self.client.max()) + 1 or np.any(self.client_weight <= 0):
            raise WorkloadError("client_weight: need one weight > 0 per client id")
        if not np.isin(self.task_class, (ONLINE, OFFLINE)).all():
            raise WorkloadError("task_class: allowed values are 0 (online) and 1 (offline)")
        if self.prefix is not None:
            for i, segs in enumerate(self.prefix):
                if segs and sum(k for _, k in segs) > self.prompt_tokens[i]:
                    raise WorkloadError(f"prefix: request {i}'s segments are longer than its prompt")

    def sorted(self) -> Workload:
        """A copy sorted by arrival time (stable, so equal arrivals keep their order)."""
        order = np.argsort(self.arrival_s, kind="stable")
        return self.take(order)

    def take(self, idx: np.ndarray | slice) -> Workload:
        """The sub-workload of rows ``idx`` (e.g. the first N requests)."""
        kw = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("client_weight", "meta"):
                kw[f.name] = v
            elif f.name == "prefix":
                kw[f.name] = None if v is None else [v[i] for i in np.arange(len(v))[idx]]
            else:
                kw[f.name] = v[idx]
        return Workload(**kw)

    def with_(self, **changes) -> Workload:
        """A copy with some fields replaced."""
        return replace(self, **changes)


def _default(a, n: int, value, dtype) -> np.ndarray:
    if a is None:
        return np.full(n, value, dtype=dtype)
    return np.asarray(a, dtype=dtype)
