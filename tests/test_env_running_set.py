"""The decision point's per-boundary arrays of the running requests (``DecisionPoint.running_set``)
against a plain recomputation from the engine's per-request state, on hypothesis-drawn engines
(paged and token-level KV, prefill emitting token 1 or not, recompute / restart / swap
preemptions), before and after preemptions chosen while a batch forms; and the memory ledger's two
ways of counting the running set's growth (per element, or decodes counted at once with a
correction per unfinished prefill)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from conftest import manual_engine, random_engine
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsched_gym.core.ledger import Ledger
from llmsched_gym.core.scheduler import BatchPlan
from llmsched_gym.env.decision import DecisionPoint


def expected(dp: DecisionPoint) -> dict:
    """What the running set's arrays must hold, from the engine's state, one request at a time."""
    e, led = dp.e, dp.led
    run = dp.survivors()
    rem, base, mids, owes, growth = [], [], [], [], 0
    n_dec = dec_ctx = mid_ctx = 0
    for r in run:
        kv, left = int(e.kv_tokens[r]), int(e.prefill_target[r] - e.prefilled[r])
        c = max(int(dp.pred[r] - e.generated[r]), 1)
        if left > 0:  # an unfinished prefill: a candidate's line over what it still owes
            mids.append(r)
            owes.append(left)
            mid_ctx += int(e.prefilled[r])
            c += 1 - dp.emit
            b = kv + left + dp.emit - 1 + dp.pad
        else:
            n_dec += 1
            dec_ctx += kv
            b = kv + dp.pad
        rem.append(c)
        base.append(b)
        growth += led.growth(r)
    return {"rem": rem, "base": base, "unfinished": (mids, owes), "growth": growth,
            "shape": (n_dec, dec_ctx, len(mids), sum(owes), mid_ctx)}


def check(dp: DecisionPoint) -> None:
    want = expected(dp)
    growth = dp.running_set()
    assert growth == want["growth"]
    assert dp.rem.tolist() == want["rem"] and dp.line_base.tolist() == want["base"]
    assert dp.unfinished_prefills() == want["unfinished"]
    assert dp.batch_shape() == want["shape"]


@settings(max_examples=200, deadline=None)
@given(st.data(), st.sampled_from([1, 4, 16]))
def test_the_running_sets_arrays_are_the_engines_state(data, bs):
    e = random_engine(data.draw, bs)
    if not e.poll():
        return
    dp = DecisionPoint(4, "arrival", "none", None)
    dp.setup(e)
    dp.begin()
    check(dp)
    # preemptions chosen while the batch forms take their victim out of the arrays in place
    for _ in range(data.draw(st.integers(0, 3))):
        victim = dp.victim(data.draw(st.sampled_from(["newest", "longest"])))
        if victim is None:
            break
        dp.preempt(victim)
        want = expected(dp)
        assert dp.rem.tolist() == want["rem"] and dp.line_base.tolist() == want["base"]
        assert dp.unfinished_prefills() == want["unfinished"]
        assert dp.batch_shape() == want["shape"]
        check(dp)  # and recomputed from scratch: the same


def test_an_unfinished_prefill_dropped_by_a_preemption_leaves_the_list():
    # hand-made: 0 decodes, 1 and 2 are mid-prefill; preempting 1 leaves 2 alone in the list
    e = manual_engine([4, 10, 12], [5, 5, 5], cap_tokens=64, overflow="preempt_lifo_recompute")
    e.execute(BatchPlan(prefill={0: 4}))
    e.poll()
    e.execute(BatchPlan(prefill={1: 3, 2: 5}))
    e.poll()
    dp = DecisionPoint(4, "arrival", "none", None)
    dp.setup(e)
    dp.begin()
    assert dp.unfinished_prefills() == ([1, 2], [7, 7])
    assert dp.batch_shape() == (1, 6, 2, 14, 8)  # 0 holds its 4 prompt tokens, token 1 and one decode
    dp.preempt(1)
    assert dp.unfinished_prefills() == ([2], [7])
    assert dp.batch_shape() == (1, 6, 1, 7, 5)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([1, 2, 4, 16]), st.booleans(),
       st.lists(st.tuples(st.integers(0, 200), st.integers(0, 300)), min_size=0, max_size=30))
def test_running_growth_counts_the_same_either_way(bs, emit, rows):
    kv = SimpleNamespace(block_size=bs)  # (the per-request rules read only the block size)
    z = np.zeros(1, np.int64)
    led = Ledger(kv, emit, z, z, z, z, z, np.zeros(1, bool), z)
    kvt = np.array([k for k, _ in rows], np.int64)
    left = np.array([c for _, c in rows], np.int64)
    per_element = led.running_growth(kvt, left)
    mids = [(k, c) for k, c in rows if c > 0]
    assert led.running_growth(kvt, mids=mids) == per_element
    # and the per-element count is the sum of the rule for one request
    one = sum(led.step(k, c, True) if c > 0 else int(k % bs == 0) for k, c in rows)
    assert per_element == one
