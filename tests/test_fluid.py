"""Tests for llmsched_gym.fluid: test vectors worked from Ao et al. 2025's examples and the section 4-5 recipes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmsched_gym.fluid import (
    capacity_aware_bound,
    fluid_bound,
    nested_mpi,
    nested_wait_thresholds,
    theta_root,
    wait_thresholds_fluid,
    wait_thresholds_practical,
)


def test_example2_fluid() -> None:
    fb = fluid_bound([(4, 1, 1)], d0=0.4, d1=0.05, C=12)
    assert fb.A == pytest.approx(12)
    assert fb.delta_T_star == pytest.approx(1.0)
    assert fb.n_star[0] == pytest.approx(8) and fb.per_stage[0] == pytest.approx(4)
    assert fb.M_star == pytest.approx(12) and fb.throughput_star == pytest.approx(4)
    assert fb.memory_slack == pytest.approx(1.0)
    d = fb.to_dict()
    assert d["throughput_star"] == pytest.approx(4)


def test_prop3_instance() -> None:
    fb = fluid_bound([(1, 1, 1), (1, 1, 2)], d0=0.55, d1=0.05)
    assert fb.n_star == pytest.approx([2, 3])
    assert fb.M_star == pytest.approx(9) and fb.delta_T_star == pytest.approx(1)
    assert fb.throughput_star == pytest.approx(3) and fb.capacity_aware is None


@pytest.mark.parametrize(
    "types, sum_lam, A, thr",
    [
        ([(1000, 10, 10), (1000, 10, 20)], 2000, 585_000, 30_000),
        ([(6000, 20, 100), (4000, 20, 200), (2000, 20, 300)], 12_000, 2.4124e8, 2_000_000),
        ([(20, 10, 20), (40, 10, 40), (80, 10, 80), (160, 10, 160)], 300, 2.7e6, 34_000),
        ([(55 * r / 66, 60, 50 * (k + 1)) for k, r in enumerate([23, 11, 8, 7, 6, 4, 3, 2, 1, 1])],
         55, 1.56782e6, 8625),
        ([(550 * r / 66, 60, 50 * (k + 1)) for k, r in enumerate([23, 11, 8, 7, 6, 4, 3, 2, 1, 1])],
         550, 1.56782e7, 86_250),
    ],
)
def test_stability_table(types, sum_lam, A, thr) -> None:
    fb = fluid_bound(types, d0=0.01, d1=0.0)
    assert sum(t[0] for t in types) == pytest.approx(sum_lam)
    assert fb.A == pytest.approx(A, rel=1e-5)
    assert fb.throughput_star == pytest.approx(thr)
    unstable = fluid_bound(types, d0=0.01, d1=1.01 / fb.A)
    assert not unstable.stable and math.isinf(unstable.M_star)


def test_capacity_aware() -> None:
    types = [(1, 1, 1), (1, 1, 2)]
    # C >= M*: reduces to Throughput*
    cap = capacity_aware_bound(types, 0.55, 0.05, C=9)
    assert cap.throughput == pytest.approx(3)
    fb = fluid_bound(types, 0.55, 0.05, C=5)
    assert fb.capacity_aware is not None and fb.capacity_aware.non_paper
    assert fb.capacity_aware.throughput < fb.throughput_star
    assert fb.capacity_aware.memory == pytest.approx(5)
    assert fluid_bound(types, 0.55, 0.2, C=5).capacity_aware is not None  # d1 A >= 1


def test_wait_thresholds_fluid() -> None:
    w = wait_thresholds_fluid([(4, 1, 1)], 0.4, 0.05, C=12)
    assert w.c_min == pytest.approx(1) and w.c_max == pytest.approx(1)
    assert w.n_int == [4] and w.eq11_ok and w.memory_ok
    w2 = wait_thresholds_fluid([(1, 1, 1), (1, 1, 2)], 0.55, 0.05, C=20, c=2.0)
    assert w2.n == pytest.approx([2, 2]) and w2.M_pi == pytest.approx(18) and w2.eq11_ok
    assert not wait_thresholds_fluid([(10, 1, 1), (10, 1, 2)], 0.55, 0.005, C=200, c=0.5).eq11_ok


def test_wait_thresholds_practical() -> None:
    types = [(1000, 10, 10), (1000, 10, 20)]
    lit = wait_thresholds_practical(types, B=256, rule="paper_literal")
    assert lit.n == pytest.approx([128 / 11, 128 / 21])
    fp = wait_thresholds_practical(types, B=256)
    assert fp.n == pytest.approx([8, 8])
    assert sum(n * (lp + 1) for n, (_, _, lp) in zip(fp.n, types, strict=True)) == pytest.approx(256)


def test_nested_thresholds_match_paper_ratios() -> None:
    plan = nested_wait_thresholds([20, 40, 80, 160], 10, [20, 40, 80, 160], d0=0.01, d1=1e-7, gamma=1.0)
    n = np.array(plan.n)
    assert n / n[-1] * 8 == pytest.approx([15, 14, 12, 8])
    assert not plan.eq12_ok  # zero drift: Eq. 12's second condition only with equality
    assert plan.theta == [0.0, 0.0, 0.0] and math.isinf(plan.memory_requirement)
    rates = [23, 11, 8, 7, 6, 4, 3, 2, 1, 1]
    tail = nested_wait_thresholds(rates, 60, [50 * (k + 1) for k in range(10)], d0=0.01, d1=1e-9).Lambda
    assert tail == pytest.approx([66, 43, 32, 24, 17, 11, 7, 4, 2, 1])


def test_nested_with_drift() -> None:
    plan = nested_wait_thresholds([20, 40, 80, 160], 10, [20, 40, 80, 160], d0=0.01, d1=1e-7, gamma=1.05,
                                  delta=0.01, n_batches=1e4, C=1e6)
    assert plan.eq12_ok and all(t > 0 for t in plan.theta)
    assert plan.delta_T < plan.n[0] / 300
    assert plan.memory_requirement > plan.M_pi and plan.fits_C
    with pytest.raises(ValueError, match="^gamma"):
        nested_wait_thresholds([20, 40, 80, 160], 10, [20, 40, 80, 160], d0=0.01, d1=1e-7, gamma=1.2)


def test_mpi_formulas() -> None:
    n = np.array([3.0, 2.0, 1.0])
    lps = np.array([2.0, 4.0, 8.0])
    # Eq. 13: sum n_k (l + L'_k/2) dl_k with L' = [2, 6, 14], dl = [2, 2, 4]
    assert nested_mpi(n, 1.0, lps) == pytest.approx(3 * 2 * 2 + 2 * 4 * 2 + 1 * 8 * 4)
    # exact: stages 1..2, 3..4, 5..8
    exact = 3 * (2 + 3) + 2 * (4 + 5) + 1 * (6 + 7 + 8 + 9)
    assert nested_mpi(n, 1.0, lps, "exact_stage_sum") == pytest.approx(exact)


def test_theta_root() -> None:
    n_prev, p = 100.0, 0.6
    for D in (0.5, 2.0, 8.0):
        th = theta_root(n_prev, n_prev * p + D, p)
        n_k = n_prev * p + D
        assert -th * n_k + n_prev * math.log(1 - p + p * math.exp(th)) == pytest.approx(0, abs=1e-9)
        assert th >= 8 * D / n_prev  # uniform lower bound (Ao et al. 2025, section 5)
    small = theta_root(n_prev, n_prev * p + 0.05, p)
    assert small == pytest.approx(2 * 0.05 / (n_prev * p * (1 - p)), rel=0.05)
    assert theta_root(10, 6, 0.6) == 0.0
    with pytest.raises(ValueError):
        theta_root(10, 5, 0.6)
