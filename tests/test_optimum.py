"""Tests for llmsched_gym.optimum (Jaillet et al. 2025, sections 3, 4, 6 and Appendix B.1).

TEL convention throughout: TEL = sum_i (p_i + o_i - a_i) with completion c_i = p_i + o_i; convention
A holds s_i + k KV in rounds p_i + k, k = 0..o_i; convention B only k = 0..o_i - 1 (section 3 and Appendix B.1).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmsched_gym.optimum import (
    Instance,
    algorithm1_schedule,
    is_feasible,
    lp_bound,
    memory_profile,
    ratio_to_opt,
    regret,
    solve_exhaustive,
    solve_ip,
    solve_optimum,
    total_latency,
)
from llmsched_gym.reproduce.adversarial import (
    adversarial_bounds,
    adversarial_deterministic,
    adversarial_ratio_lower_bound,
    adversarial_wait_schedule,
    adversarial_yao,
)

CE_A = Instance.semi_online([4, 4, 5, 5], s=1, M=10, convention="A")
CE_B = Instance.semi_online([2, 3, 3, 5, 5], s=2, M=8, convention="B")


def test_memory_profile_conventions() -> None:
    a = Instance(arrival=[0], prompt=2, output=[3], M=10, convention="A")
    b = Instance(arrival=[0], prompt=2, output=[3], M=10, convention="B")
    assert memory_profile(a, [1]).tolist() == [0, 2, 3, 4, 5]
    assert memory_profile(b, [1]).tolist() == [0, 2, 3, 4]
    assert total_latency(a, [1]) == 4 == total_latency(b, [1])


def test_counterexample_convention_a() -> None:
    p = algorithm1_schedule(CE_A)
    assert p.tolist() == [0, 0, 5, 7]
    assert total_latency(CE_A, p) == 30 and is_feasible(CE_A, p)
    for res in (solve_ip(CE_A), solve_exhaustive(CE_A), solve_optimum(CE_A)):
        assert res.status == "optimal" and res.tel == 28 == res.lower_bound
        assert is_feasible(CE_A, res.starts)
        assert sorted((res.starts + CE_A.output).tolist()) == [4, 5, 9, 10]
    assert memory_profile(CE_A, [0, 5, 0, 5]).max() == 10


def test_counterexample_convention_b() -> None:
    p = algorithm1_schedule(CE_B)
    assert total_latency(CE_B, p) == 29 and is_feasible(CE_B, p)
    ex = solve_exhaustive(CE_B)
    ip = solve_ip(CE_B)
    assert ex.tel == ip.tel == 28 and ip.status == "optimal"
    assert total_latency(CE_B, [0, 0, 2, 2, 6]) == 28 and is_feasible(CE_B, [0, 0, 2, 2, 6])
    # the same schedule is infeasible under convention A (one more resident round)
    a_version = Instance.semi_online([2, 3, 3, 5, 5], s=2, M=8, convention="A")
    assert not is_feasible(a_version, [0, 0, 2, 2, 6])


@st.composite
def tiny_instances(draw: st.DrawFn) -> Instance:
    n = draw(st.integers(1, 4))
    o = draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    s = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    a = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    conv = draw(st.sampled_from(["A", "B"]))
    M = max(si + oi for si, oi in zip(s, o, strict=True)) + draw(st.integers(0, 8))
    return Instance(arrival=a, prompt=s, output=o, M=M, convention=conv)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_instances())
def test_ip_equals_exhaustive(inst: Instance) -> None:
    ex = solve_exhaustive(inst)
    ip = solve_ip(inst)
    assert ip.status == "optimal"
    assert ip.tel == ex.tel
    for res in (ex, ip):
        assert np.all(res.starts >= inst.arrival)
        assert memory_profile(inst, res.starts).max() <= inst.M
        assert total_latency(inst, res.starts) == res.tel
    greedy = algorithm1_schedule(inst)
    assert is_feasible(inst, greedy) and total_latency(inst, greedy) >= ex.tel
    assert inst.total_output() <= lp_bound(inst) <= ex.tel + 1e-6


def test_horizon_restriction() -> None:
    res = solve_ip(CE_A, horizon=10)  # optimum fits, but a cap of 10 cannot be proven lossless
    assert res.tel == 28 and res.status == "optimal_in_horizon"
    assert solve_ip(CE_A, horizon=40).status == "optimal"
    res = solve_ip(CE_A, horizon=3)
    assert res.status == "infeasible" and res.tel is None


def test_validation_and_size_limits() -> None:
    with pytest.raises(ValueError, match="^M:"):
        Instance.semi_online([10], s=1, M=10, convention="A")
    Instance.semi_online([10], s=1, M=10, convention="B")  # B peak is s + o - 1
    with pytest.raises(ValueError, match="^convention:"):
        Instance.semi_online([1], s=1, M=10, convention="C")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="^output:"):
        Instance(arrival=[0], prompt=1, output=[0], M=10)
    with pytest.raises(ValueError, match="^arrival:"):
        Instance(arrival=[-1], prompt=1, output=[1], M=10)
    with pytest.raises(ValueError, match="^prompt:"):
        Instance(arrival=[0, 0], prompt=[1, 2, 3], output=[1, 1], M=10)
    big = Instance.semi_online([1] * 61, s=1, M=100)
    with pytest.raises(ValueError, match="^n: solve_ip is limited to n <= 60"):
        solve_ip(big)
    with pytest.raises(ValueError, match="^n: solve_exhaustive is limited to n <= 8"):
        solve_exhaustive(Instance.semi_online([1] * 9, s=1, M=100))
    with pytest.raises(ValueError, match="^n"):
        solve_optimum(big)
    many_vars = Instance.semi_online([300] * 40, s=1, M=301)  # one at a time: huge windows
    with pytest.raises(ValueError, match="^n_vars: solve_ip is limited to 20000"):
        solve_ip(many_vars)


def test_adversarial_instance_and_bounds() -> None:
    inst = adversarial_deterministic(M=100, eps=0.05, t_long_start=3)
    assert inst.n == 6 and inst.output[0] == 95 and np.all(inst.prompt == 5)
    assert np.all(inst.arrival[1:] == 3 + 90) and np.all(inst.output[1:] == 1)
    # long job started at t' blocks every short at their arrival (convention A)
    prof = memory_profile(inst, [3] + [93] * 5)
    assert prof.max() > inst.M
    b = adversarial_bounds(1000, 0.1)
    assert b["A3"] < min(b["A1"], b["A2"])
    # the ratio grows like 1/eps for large M (Thm 6.2)
    for eps in (0.2, 0.1, 0.05, 0.02):
        r = adversarial_ratio_lower_bound(10**8, eps)
        assert r == pytest.approx(1 / eps, rel=0.05)
    rs = [adversarial_ratio_lower_bound(10**6, e) for e in (0.2, 0.1, 0.05)]
    assert rs[0] < rs[1] < rs[2]


def test_adversarial_small_instance_optimum() -> None:
    inst = adversarial_deterministic(M=20, eps=0.1)
    res = solve_optimum(inst)
    assert res.status == "optimal" and is_feasible(inst, res.starts)
    assert res.tel <= total_latency(inst, algorithm1_schedule(inst))


def test_adversarial_wait_schedule_is_feasible_and_bounds_opt() -> None:
    # Thm 6.2's A3: hold the long request for the shorts; optimal on the smallest instance
    inst = adversarial_deterministic(M=20, eps=0.25)
    p = adversarial_wait_schedule(inst)
    assert is_feasible(inst, p) and p[0] >= max(p[1:])
    assert total_latency(inst, p) == solve_optimum(inst).tel == 36
    for M, eps in ((100, 0.1), (200, 0.25)):
        inst = adversarial_deterministic(M=M, eps=eps)
        p = adversarial_wait_schedule(inst)
        assert is_feasible(inst, p)
        assert total_latency(inst, p) < total_latency(inst, algorithm1_schedule(inst))


def test_adversarial_yao() -> None:
    dist = adversarial_yao(M=100, eps=0.1, c=2)
    assert len(dist) == 21
    assert sum(p for p, _ in dist) == pytest.approx(1.0)
    assert [int(i.arrival[1]) for _, i in dist][:3] == [80, 90, 100]


def test_regret_and_ratio() -> None:
    assert regret(7.5, 28, 4) == pytest.approx(0.5)
    assert ratio_to_opt(30, 28) == pytest.approx(30 / 28)
    with pytest.raises(ValueError):
        ratio_to_opt(1, 0)
