"""Input-dependent baselines (Mao et al., ICLR 2019): exact advantages on constructed returns."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from agents.input_baseline import (
    GroupSeeds,
    InputBaselineBuffer,
    ReturnCurves,
    check_input_baseline,
    input_baseline,
)


def test_baseline_is_the_peers_return_at_the_same_simulated_time():
    # two rollouts of workload 7: env 0 decides at t = 0, 1, 2 s, env 1 (fewer, longer steps) at 0, 2, 4 s
    returns = np.array([[6.0, 10.0], [4.0, 6.0], [2.0, 2.0]])
    times = np.array([[0.0, 0.0], [1.0, 2.0], [2.0, 4.0]])
    seeds = np.full((3, 2), 7)
    base, covered = input_baseline(returns, times, seeds)
    # env 0 at t=1 s: env 1's return interpolated between (0 s, 10) and (2 s, 6) = 8
    np.testing.assert_allclose(base[:, 0], [10.0, 8.0, 6.0])
    # env 1 at t=4 s: env 0's rollout ends at 2 s in this buffer: no peer covers it
    np.testing.assert_allclose(base[:, 1], [6.0, 2.0, 0.0])
    assert covered.tolist() == [[True, True], [True, True], [True, False]]
    np.testing.assert_allclose((returns - base)[covered], [-4.0, 4.0, -4.0, 4.0, -4.0])


def test_other_workloads_and_own_rollout_never_enter_the_baseline():
    returns = np.array([[5.0, 100.0, 1.0]])
    times = np.zeros((1, 3))
    seeds = np.array([[1, 2, 1]])  # env 1 runs another workload
    base, covered = input_baseline(returns, times, seeds)
    assert base.tolist() == [[1.0, 0.0, 5.0]]  # leave-one-out: env 0 gets env 2's, env 2 env 0's
    assert covered.tolist() == [[True, False, True]]


def test_peers_curves_from_earlier_buffers_serve_a_lagging_rollout():
    curves = ReturnCurves()
    # buffer 1: env 0 runs workload 3 from 0 to 10 s; env 1 is still on workload 1
    input_baseline(np.array([[9.0, 1.0], [4.0, 1.0]]), np.array([[0.0, 50.0], [10.0, 60.0]]),
                   np.array([[3, 1], [3, 1]]), curves)
    # buffer 2: env 1 reaches workload 3 at 5 s; env 0 has moved on to workload 5
    base, covered = input_baseline(np.array([[0.0, 7.0]]), np.array([[0.0, 5.0]]), np.array([[5, 3]]), curves)
    assert covered.tolist() == [[False, True]]
    assert base[0, 1] == pytest.approx(6.5)  # env 0's return at 5 s, from the earlier buffer


def test_buffer_replaces_the_critic_advantage_where_a_peer_covers_the_time():
    class Clock:
        times = np.zeros(2)
        seeds = np.array([7, 7])

    gs = GroupSeeds(0, 2, 2)
    gs.current[:] = 7
    clock = Clock()
    space = spaces.Box(-1, 1, (1,), np.float32)
    buf = InputBaselineBuffer(3, space, space, gamma=1.0, gae_lambda=1.0, n_envs=2, clock=clock, group_seeds=gs)
    rewards = [[2.0, 4.0], [2.0, 4.0], [2.0, 2.0]]  # returns-to-go: env 0 6, 4, 2; env 1 10, 6, 2
    for t, r in enumerate(rewards):
        clock.times = np.array([float(t), 2.0 * t])
        buf.add(np.zeros((2, 1), np.float32), np.zeros((2, 1), np.float32), np.array(r), np.array([t == 0] * 2),
                torch.zeros(2), torch.zeros(2))
    buf.compute_returns_and_advantage(torch.zeros(2), np.array([True, True]))
    np.testing.assert_allclose(buf.returns, [[6, 10], [4, 6], [2, 2]])
    # the critic's value is 0 here, so the one uncovered step keeps its GAE advantage: the return, 2
    np.testing.assert_allclose(buf.advantages, [[-4, 4], [-4, 4], [-4, 2]])
    assert buf.last_coverage == pytest.approx(5 / 6)


def test_group_seeds_share_workloads_within_a_group_only():
    gs = GroupSeeds(1000, 6, 3)
    assert [gs(r, 0) for r in range(6)] == [1000, 1000, 1000, 1001, 1001, 1001]
    assert [gs(r, 2) for r in range(6)] == [1004, 1004, 1004, 1005, 1005, 1005]
    assert gs.current.tolist() == [1004, 1004, 1004, 1005, 1005, 1005]
    with pytest.raises(ValueError, match="multiple of the group size"):
        GroupSeeds(0, 5, 2)


@pytest.mark.parametrize("spec, why", [({"group_size": 3}, "divides n_envs"), ({"group_size": 1}, ">= 2"),
                                       ({"size": 2}, "expected"), ([2], "expected")])
def test_bad_input_baseline_entries_are_one_line_errors(spec, why):
    with pytest.raises(ValueError, match=why):
        check_input_baseline(spec, 8, "native")


def test_input_baseline_needs_the_native_vector_env():
    assert check_input_baseline({"group_size": 4}, 8, "native") == 4
    assert check_input_baseline(None, 8, "dummy") is None
    with pytest.raises(ValueError, match="native"):
        check_input_baseline({"group_size": 4}, 8, "dummy")
