"""The KV transfer model (llmsched_gym.core.transfer): times from first principles (bytes over
bandwidth plus the base latency), tensor-parallel links, BLIS's fair-share rule, validation."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmsched_gym.config import ConfigError
from llmsched_gym.core.models import get_model
from llmsched_gym.core.transfer import (
    DEFAULT_BANDWIDTH_GB_S,
    DEFAULT_BASE_S,
    LINKS,
    TransferConfig,
    TransferModel,
    kv_bytes,
    parallel_links,
    transfer_time,
)


def test_kv_bytes_from_the_architecture() -> None:
    # Llama-2-7B: 2 (K, V) * 32 layers * 32 KV heads * 128 head dim * 2 bytes = 524,288 B per token
    assert kv_bytes(1, "llama-2-7b") == 2 * 32 * 32 * 128 * 2 == 524_288
    # Llama-3.1-8B (GQA, 8 KV heads): a quarter of that
    assert kv_bytes(1, "llama-3.1-8b") == 131_072
    assert kv_bytes(2048, "llama-2-7b") == 2**30  # 2048 tokens of Llama-2-7B: exactly 1 GiB


def test_transfer_time_is_base_plus_bytes_over_bandwidth() -> None:
    # 1 GiB over 25 GB/s = 1,073,741,824 / 25e9 s, plus 50 us
    t = transfer_time(2048, "llama-2-7b", bandwidth_gb_s=25.0, base_s=5e-5)
    assert math.isclose(t, 5e-5 + 1_073_741_824 / 25e9, rel_tol=1e-12)
    assert math.isclose(t, 0.04299967296, rel_tol=1e-12)
    # no base latency, 400 Gb/s (50 GB/s): half the time
    assert math.isclose(transfer_time(2048, "llama-2-7b", bandwidth_gb_s=50.0, base_s=0.0), 0.02147483648,
                        rel_tol=1e-12)
    assert transfer_time(0, "llama-2-7b", base_s=0.003) == 0.003  # nothing to move: the base only
    assert DEFAULT_BANDWIDTH_GB_S == 25.0 and DEFAULT_BASE_S == 5e-5


def test_tensor_parallel_ranks_ship_their_shards_in_parallel() -> None:
    # Llama-2-70B: 8 KV heads; 2 * 80 * 8 * 128 * 2 = 327,680 B per token
    m = get_model("llama-2-70b")
    assert m.kv_bytes_per_token == 327_680
    assert parallel_links(m, 1, 1) == 1
    assert parallel_links(m, 2, 4) == 2   # the TP-2 sender's links carry half each
    assert parallel_links(m, 4, 2) == 2   # the TP-2 receiver's links take half each
    assert parallel_links(m, 8, 8) == 8
    assert parallel_links(m, 16, 16) == 8  # heads replicated beyond 8: no link carries less than one head
    one = transfer_time(1000, m, 1, 1, bandwidth_gb_s=10.0, base_s=0.0)
    assert math.isclose(one, 327_680_000 / 10e9, rel_tol=1e-12)
    assert math.isclose(transfer_time(1000, m, 2, 4, bandwidth_gb_s=10.0, base_s=0.0), one / 2, rel_tol=1e-12)
    assert math.isclose(transfer_time(1000, m, 8, 8, bandwidth_gb_s=10.0, base_s=0.0), one / 8, rel_tol=1e-12)


def test_shared_link_divides_the_bandwidth_among_transfers_in_flight() -> None:
    """BLIS's rule: k transfers in flight (this one counted) -> bandwidth / k, fixed at the start."""
    b = kv_bytes(1000, "llama-2-7b") / 25e9  # 0.02097152 s at the full bandwidth
    link = TransferModel({"bandwidth_gb_s": 25.0, "base_s": 0.001, "shared_link": True})
    e1 = link.start(0.0, 1000, "llama-2-7b")
    e2 = link.start(0.0, 1000, "llama-2-7b")
    e3 = link.start(0.0, 1000, "llama-2-7b")
    assert math.isclose(e1, 0.001 + b, rel_tol=1e-12)
    assert math.isclose(e2, 0.001 + 2 * b, rel_tol=1e-12)
    assert math.isclose(e3, 0.001 + 3 * b, rel_tol=1e-12)
    assert link.in_flight(e1) == 2  # the first ended at e1: in flight on [start, end)
    e4 = link.start(e1, 1000, "llama-2-7b")  # two still in flight: a third of the bandwidth
    assert math.isclose(e4 - e1, 0.001 + 3 * b, rel_tol=1e-12)
    assert link.n_transfers == 4 and link.peak_concurrent == 3
    assert link.total_bytes == 4 * 524_288_000
    assert math.isclose(link.total_time_s, 4 * 0.001 + 9 * b, rel_tol=1e-12)


def test_unshared_link_gives_every_transfer_the_full_bandwidth() -> None:
    link = TransferModel({"bandwidth_gb_s": 25.0, "base_s": 0.0})
    ends = [link.start(0.0, 1000, "llama-2-7b") for _ in range(3)]
    assert ends == [kv_bytes(1000, "llama-2-7b") / 25e9] * 3
    assert link.peak_concurrent == 3  # counted, not charged


def test_named_links() -> None:
    assert TransferConfig.from_dict({"link": "ib-ndr"}).bandwidth_gb_s == 50.0
    assert TransferConfig.from_dict({"link": "ib-ndr", "bandwidth_gb_s": 7.0}).bandwidth_gb_s == 7.0
    assert TransferConfig.from_dict(None) == TransferConfig()
    assert LINKS["ib-hdr"] == 200 / 8 and LINKS["distserve-cross-node"] == 25 / 8


@pytest.mark.parametrize(("spec", "message"), [
    ({"bandwidth_gb_s": 0}, "transfer.bandwidth_gb_s: expected a finite number > 0, got 0"),
    ({"bandwidth_gb_s": float("inf")}, "transfer.bandwidth_gb_s: expected a finite number > 0"),
    ({"bandwidth_gb_s": "fast"}, "transfer.bandwidth_gb_s: expected a finite number > 0"),
    ({"base_s": -1e-3}, "transfer.base_s: expected a finite number >= 0"),
    ({"base_s": float("nan")}, "transfer.base_s: expected a finite number >= 0"),
    ({"shared_link": "yes"}, "transfer.shared_link: expected true or false, got 'yes'"),
    ({"bandwith_gb_s": 5}, "transfer.bandwith_gb_s: unknown setting (allowed: bandwidth_gb_s, base_s, "
                           "shared_link, link)"),
    ({"link": "ethernet"}, "transfer.link: unknown 'ethernet'; allowed: ib-hdr"),
    ([1, 2], "transfer: expected a mapping of transfer settings, got list"),
])
def test_bad_settings_are_one_line_errors(spec, message) -> None:
    with pytest.raises(ConfigError) as e:
        TransferConfig.from_dict(spec)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_bad_settings_name_the_caller_field() -> None:
    with pytest.raises(ConfigError, match=r"^migration\.transfer\.base_s: expected"):
        TransferConfig.from_dict({"base_s": -1}, prefix="migration.transfer")


@pytest.mark.parametrize(("kw", "message"), [
    ({"tokens": -1}, "transfer.tokens: expected an integer >= 0, got -1"),
    ({"tokens": 1.5}, "transfer.tokens: expected an integer >= 0, got 1.5"),
    ({"tp_src": 0}, "transfer.tp_src: expected a tensor-parallel degree"),
    ({"tp_dst": True}, "transfer.tp_dst: expected a tensor-parallel degree"),
    ({"concurrent": 0}, "transfer.concurrent: expected an integer >= 1, got 0"),
    ({"model": "gpt-5"}, "model: unknown 'gpt-5'"),
])
def test_bad_arguments_are_one_line_errors(kw, message) -> None:
    args = {"tokens": 10, "model": "llama-2-7b", **kw}
    with pytest.raises((ConfigError, ValueError)) as e:
        transfer_time(**args)
    assert str(e.value).startswith(message)


@given(a=st.integers(0, 200_000), b=st.integers(0, 200_000), bw=st.floats(0.1, 1000.0),
       base=st.floats(0.0, 0.01), tp=st.sampled_from([1, 2, 4, 8]))
def test_time_is_affine_in_tokens_and_falls_with_bandwidth(a, b, bw, base, tp) -> None:
    t = lambda n, w=bw: transfer_time(n, "llama-2-70b", tp, tp, bandwidth_gb_s=w, base_s=base)  # noqa: E731
    assert math.isclose(t(a + b) - base, (t(a) - base) + (t(b) - base), rel_tol=1e-9, abs_tol=1e-15)
    if a > 0:
        assert t(a, bw * 1.5) < t(a)
