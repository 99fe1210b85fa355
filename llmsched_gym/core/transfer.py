"""KV-cache transfer between replicas: how long moving a request's KV takes.

Used by disaggregated serving (the prefill replica ships a request's KV to the decode replica;
DistServe, Zhong et al., OSDI 2024, section 3; Splitwise, Patel et al., ISCA 2024, section 4) and
by live migration (Llumnix, Sun et al., OSDI 2024).

The model (a start latency plus bytes over bandwidth, as BLIS's and SplitwiseSim's)::

    total_bytes    = tokens * kv_bytes_per_token            # 2 * layers * kv_heads * head_dim * dtype_bytes
    links          = min(tp_src, tp_dst, kv_heads)          # links that carry distinct KV in parallel
    per_link_bytes = total_bytes / links
    duration_s     = base_s + per_link_bytes / (bandwidth_gb_s * 1e9 / k)

* **Tensor parallelism.** A tensor-parallel replica holds the KV sharded by KV heads: each of its
  ``tp`` GPUs holds ``kv_heads / tp`` heads of every token (heads are replicated when ``tp >
  kv_heads``, vLLM's GQA rule). Every GPU has its own network link (a DGX node has one InfiniBand
  NIC per GPU), and the shards move in parallel, one link per shard pair: a sender of a TP-2
  replica ships half the heads to the receivers of a TP-4 replica that need them, so the busiest
  link carries ``total / min(tp_src, tp_dst)``; no link carries less than one KV head's share,
  hence the ``kv_heads`` cap. BLIS sizes a transfer the same way (per-GPU bytes: the model's KV
  bytes per token divided by the prefill TP); SplitwiseSim ships the whole KV over one link
  (``tp = 1`` on both sides here).
* **Bandwidth** is per link and per direction, in GB/s (10**9 bytes/s), as BLIS's
  ``--pd-transfer-bandwidth`` (SplitwiseSim's ``transfer_bandwidth`` is in GiB/s; convert with
  ``x * 1.073741824``). :data:`LINKS` names the figures the papers and datasheets give.
* **Sharing** (``shared_link=True``): BLIS's fair-share contention rule (``--pd-transfer-contention``):
  a transfer that starts while ``k - 1`` others are in flight (``k`` counting itself) gets
  ``bandwidth / k`` for its whole duration; the rate is fixed at its start and not revised when
  others start or end. All transfers of a cluster count (one shared fabric). A transfer is in
  flight on ``[start, end)``: one ending exactly when another starts does not count. Without
  sharing (the default) every transfer gets the full bandwidth, as SplitwiseSim's KV flows do
  (they run on a link of unbounded concurrency).
* **Base latency** ``base_s`` (connection set-up, the first byte's flight, the receiver's block
  registration): BLIS's default is 0.05 ms (``--pd-transfer-base-latency``).

Defaults: 25 GB/s (200 Gb/s HDR InfiniBand, one NIC per GPU as in a DGX A100; BLIS's default) and
0.05 ms.

>>> t = TransferModel(TransferConfig(bandwidth_gb_s=25.0, base_s=5e-5))
>>> t.duration(1000, "llama-3.1-8b")     # 1000 tokens * 131,072 B = 131.072 MB over 25 GB/s
0.00529288
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from llmsched_gym.config import ConfigError
from llmsched_gym.core.models import ModelSpec, get_model

GB = 1e9
"""Bytes in a GB (the unit of every bandwidth here, as the papers' and BLIS's GB/s)."""

LINKS: dict[str, float] = {
    "ib-hdr": 25.0,
    "ib-ndr": 50.0,
    "nvlink-a100": 300.0,
    "nvlink-h100": 450.0,
    "pcie4": 32.0,
    "distserve-cross-node": 3.125,
}
"""Link bandwidths in GB/s per direction, by name (``transfer.link``):

* ``ib-hdr``: HDR InfiniBand, 200 Gb/s per GPU (NVIDIA DGX A100 datasheet: one NIC per GPU);
  BLIS's default 25 GB/s. Splitwise (Patel et al., ISCA 2024, section IV) ships KV over the
  per-GPU InfiniBand links of DGX A100 and H100 machines.
* ``ib-ndr``: NDR InfiniBand, 400 Gb/s per GPU (NVIDIA DGX H100 datasheet).
* ``nvlink-a100`` / ``nvlink-h100``: NVLink 3 / 4 per GPU and direction (600 / 900 GB/s both
  ways, NVIDIA datasheets): prefill and decode instances in one node, as DistServe places them
  when the network between nodes is slow (Zhong et al., OSDI 2024, section 4.2, placement for
  low node-affinity clusters).
* ``pcie4``: PCIe 4.0 x16 (32 GB/s per direction).
* ``distserve-cross-node``: 25 Gb/s, DistServe's testbed between nodes (section 6.1).
"""

DEFAULT_BANDWIDTH_GB_S = LINKS["ib-hdr"]
DEFAULT_BASE_S = 5e-5


def _number(value: Any, field: str, low: float, strict: bool) -> float:
    ok = (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
          and (value > low if strict else value >= low))
    if not ok:
        raise ConfigError(f"{field}: expected a finite number {'>' if strict else '>='} {low:g}, got {value!r}")
    return float(value)


def _tp(value: Any, field: str) -> int:
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        raise ConfigError(f"{field}: expected a tensor-parallel degree (an integer >= 1), got {value!r}")
    return value


@dataclass(frozen=True)
class TransferConfig:
    """The link a KV transfer crosses (see the module docstring).

    :param bandwidth_gb_s: per link and direction, GB/s (10**9 bytes/s).
    :param base_s: fixed start latency of each transfer, seconds.
    :param shared_link: concurrent transfers share the bandwidth (BLIS's fair-share rule).
    """

    bandwidth_gb_s: float = DEFAULT_BANDWIDTH_GB_S
    base_s: float = DEFAULT_BASE_S
    shared_link: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, prefix: str = "transfer") -> None:
        """One-line :class:`ConfigError` naming ``prefix.field`` for a bad value."""
        _number(self.bandwidth_gb_s, f"{prefix}.bandwidth_gb_s", 0.0, strict=True)
        _number(self.base_s, f"{prefix}.base_s", 0.0, strict=False)
        if not isinstance(self.shared_link, bool):
            raise ConfigError(f"{prefix}.shared_link: expected true or false, got {self.shared_link!r}")

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any] | TransferConfig | None, prefix: str = "transfer") -> TransferConfig:
        """Build from ``{"bandwidth_gb_s": .., "base_s": .., "shared_link": ..}``; ``"link": NAME``
        takes the bandwidth of :data:`LINKS` (an explicit ``bandwidth_gb_s`` wins). ``None`` gives
        the defaults."""
        if spec is None:
            return cls()
        if isinstance(spec, TransferConfig):
            return spec
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{prefix}: expected a mapping of transfer settings, got {type(spec).__name__}")
        allowed = [f.name for f in fields(cls)] + ["link"]
        unknown = sorted(set(spec) - set(allowed))
        if unknown:
            raise ConfigError(f"{prefix}.{unknown[0]}: unknown setting (allowed: {', '.join(allowed)})")
        kw = {k: v for k, v in spec.items() if k != "link"}
        if "link" in spec:
            link = spec["link"]
            if not isinstance(link, str) or link.lower() not in LINKS:
                raise ConfigError(f"{prefix}.link: unknown {link!r}; allowed: {', '.join(LINKS)}")
            kw.setdefault("bandwidth_gb_s", LINKS[link.lower()])
        try:
            return cls(**kw)
        except ConfigError as e:
            if prefix != "transfer":
                raise ConfigError(str(e).replace("transfer.", f"{prefix}.", 1)) from None
            raise


Model = str | ModelSpec | int
"""A model name, a :class:`ModelSpec`, or (architecture unknown) its KV bytes per token."""


def kv_bytes(tokens: int, model: Model) -> int:
    """Bytes of KV of ``tokens`` tokens of ``model`` (all layers and KV heads, K and V)."""
    per_token = model if isinstance(model, int) and not isinstance(model, bool) else get_model(model).kv_bytes_per_token
    return int(tokens) * per_token


def parallel_links(model: Model, tp_src: int = 1, tp_dst: int = 1) -> int:
    """Links carrying distinct KV at once between a TP-``tp_src`` and a TP-``tp_dst`` replica:
    ``min(tp_src, tp_dst, kv_heads)`` (no head cap when only the bytes per token are known)."""
    links = min(_tp(tp_src, "transfer.tp_src"), _tp(tp_dst, "transfer.tp_dst"))
    if isinstance(model, int) and not isinstance(model, bool):
        return links
    return min(links, get_model(model).kv_heads)


def transfer_time(tokens: int, model: Model, tp_src: int = 1, tp_dst: int = 1,
                  bandwidth_gb_s: float = DEFAULT_BANDWIDTH_GB_S, base_s: float = DEFAULT_BASE_S,
                  concurrent: int = 1) -> float:
    """Seconds to move ``tokens`` tokens of KV (``base_s + per-link bytes / (bandwidth / concurrent)``).

    :param concurrent: transfers sharing the link, this one included (1: the full bandwidth).
    """
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ConfigError(f"transfer.tokens: expected an integer >= 0, got {tokens!r}")
    if isinstance(concurrent, bool) or not isinstance(concurrent, int) or concurrent < 1:
        raise ConfigError(f"transfer.concurrent: expected an integer >= 1, got {concurrent!r}")
    bw = _number(bandwidth_gb_s, "transfer.bandwidth_gb_s", 0.0, strict=True) * GB
    base = _number(base_s, "transfer.base_s", 0.0, strict=False)
    per_link = kv_bytes(tokens, model) / parallel_links(model, tp_src, tp_dst)
    return base + per_link * concurrent / bw


class TransferModel:
    """A link with its transfers in flight (the state the sharing rule needs).

    :meth:`start` books a transfer and returns when it ends; :meth:`duration` prices one without
    booking it. Starts need not come in time order; a caller that knows no later start is
    earlier than ``t`` calls :meth:`forget` to keep the record short. Counters: ``n_transfers``, ``total_bytes`` (all links), ``total_time_s`` (sum of
    durations), ``peak_concurrent``.
    """

    def __init__(self, config: TransferConfig | Mapping[str, Any] | None = None) -> None:
        self.config = TransferConfig.from_dict(config)
        self.reset()

    def reset(self) -> None:
        self._active: list[tuple[float, float]] = []  # (start, end) of transfers that may be in flight
        self.n_transfers = 0
        self.total_bytes = 0
        self.total_time_s = 0.0
        self.peak_concurrent = 0

    def in_flight(self, now: float) -> int:
        """Transfers in flight at ``now``: started at or before ``now`` and ending after it."""
        return sum(1 for s, e in self._active if s <= now < e)

    def forget(self, before: float) -> None:
        """Drop the record of transfers that ended by ``before`` (no later :meth:`start` is earlier)."""
        self._active = [x for x in self._active if x[1] > before]

    def duration(self, tokens: int, model: Model, tp_src: int = 1, tp_dst: int = 1,
                 concurrent: int = 1) -> float:
        """Seconds for ``tokens`` tokens of KV with ``concurrent`` transfers on the link (this one
        included; ignored unless the link is shared)."""
        c = self.config
        return transfer_time(tokens, model, tp_src, tp_dst, c.bandwidth_gb_s, c.base_s,
                             concurrent if c.shared_link else 1)

    def start(self, now: float, tokens: int, model: Model, tp_src: int = 1, tp_dst: int = 1) -> float:
        """Book a transfer starting at ``now``; returns its end time."""
        k = self.in_flight(now) + 1
        d = self.duration(tokens, model, tp_src, tp_dst, k)
        end = now + d
        self._active.append((now, end))
        self.n_transfers += 1
        self.total_bytes += kv_bytes(tokens, model)
        self.total_time_s += d
        self.peak_concurrent = max(self.peak_concurrent, k)
        return end


__all__ = ["DEFAULT_BANDWIDTH_GB_S", "DEFAULT_BASE_S", "GB", "LINKS", "TransferConfig", "TransferModel",
           "kv_bytes", "parallel_links", "transfer_time"]
