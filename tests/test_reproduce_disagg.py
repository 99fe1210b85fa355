"""The DistServe and Splitwise reproductions' building blocks (the reports themselves run for
minutes: ``llmsched reproduce distserve --quick``)."""

from __future__ import annotations

import numpy as np
import pytest

from llmsched_gym.core.models import get_model, kv_capacity_tokens
from llmsched_gym.core.scenarios import build_scenario, resolve_scenario
from llmsched_gym.goodput import Serving, find_goodput
from llmsched_gym.reproduce import PAPERS, distserve, splitwise


def test_both_papers_are_registered():
    assert {"distserve", "splitwise"} <= set(PAPERS)


def test_distserve_figure1_workload_is_the_papers():
    spec = resolve_scenario(distserve.fig1_scenario(n_requests=300))
    wl, config, latency = build_scenario(spec, 0)
    assert len(wl) == 300 and set(wl.prompt_tokens) == {512} and set(wl.output_tokens) == {64}
    gaps = np.diff(wl.arrival_s)
    assert 0.5 < gaps.std() / gaps.mean() < 1.5  # Poisson: exponential gaps, coefficient of variation ~1
    assert config.kv_capacity_tokens == kv_capacity_tokens("llama-2-13b", "a100")
    assert config.kv_bytes_per_token == get_model("llama-2-13b").kv_bytes_per_token
    assert latency.name == distserve.LATENCY


def test_distserve_colocated_tpot_binds_before_ttft_as_in_figure1():
    """Figure 1 (left): the colocated GPU meets the TTFT target at higher rates than the TPOT one."""
    fig1 = distserve.fig1_scenario(n_requests=200)
    kw = {"n_requests": None, "rel_tol": 0.1}
    ttft = find_goodput(Serving(fig1), {"ttft_s": 0.4}, **kw).goodput
    tpot = find_goodput(Serving(fig1), {"tpot_s": 0.04}, **kw).goodput
    assert 0 < tpot < ttft


def test_distserve_2p1d_beats_one_colocated_gpu_per_gpu_under_the_tight_tpot():
    fig1 = distserve.fig1_scenario(n_requests=200)
    kw = {"n_requests": None, "rel_tol": 0.1}
    colo = find_goodput(Serving(fig1), distserve.FIG1_SLO, **kw)
    dis = find_goodput(Serving(fig1, router="lor", pools=distserve.pools(2, 1), transfer=distserve.TRANSFER),
                       distserve.FIG1_SLO, **kw)
    assert dis.gpus == 3 and colo.gpus == 1
    assert dis.per_gpu > colo.per_gpu > 0


@pytest.mark.skipif(not splitwise.have_profiles(), reason="Vidur's Llama-2-70B profiles are not on this machine")
def test_splitwise_phases_prompt_saturates_token_scales():
    prompt, token = splitwise.phase_throughput("a100")
    assert prompt[8192] / prompt[2048] < 1.15 < token[64] / token[32]  # prompt flat past 2k tokens, decode rising
    assert all(token[b] < token[2 * b] for b in (1, 2, 4, 8, 16, 32))
    prompt_h, token_h = splitwise.phase_throughput("h100")
    assert prompt_h[2048] / prompt[2048] > token_h[16] / token[16] > 1  # the H100 helps the prompt phase more


@pytest.mark.skipif(not splitwise.have_profiles(), reason="Vidur's Llama-2-70B profiles are not on this machine")
def test_splitwise_machine_is_one_tp8_replica_with_its_memory():
    from dataclasses import replace

    from llmsched_gym.core.models import get_gpu

    spec = splitwise.scenario("h100", 50)
    assert spec["latency"] == "vidur:h100/llama-2-70b,tp=8" and spec["policy"] == "vllm-v1"
    assert spec["engine"]["kv_capacity_tokens"] == kv_capacity_tokens("llama-2-70b", replace(get_gpu("h100"), count=8))
    assert Serving(spec, n_replicas=2).gpus() == 16


@pytest.mark.skipif(not splitwise.have_profiles(),
                    reason="needs Vidur's Llama-2-70B profiles")
def test_splitwise_transfer_share_is_the_transfer_over_e2e():
    conv = splitwise.scenario("a100", 60)
    serving = Serving(conv, router="lor", pools={"prefill": {"n": 1}, "decode": {"n": 1}}, transfer={"link": "ib-hdr"})
    share = splitwise.transfer_share(serving, 0.5, 60)
    assert 0 < share < 0.01  # a 70B prompt's KV over 8 HDR links: milliseconds against seconds of decode
