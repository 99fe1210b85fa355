"""The env's decision point (``llmsched_gym.env.decision.DecisionPoint``): the free blocks the next
batch can use, the slots, the ``current`` admission rule and how choosing a request or a
preemption changes them. Constructed engine states with the exact blocks and masks expected, and
hypothesis tests on random states: the decision point's free blocks are the memory ledger's, and a
batch it admits under ``current`` (unlimited budget) never makes the engine preempt on its own."""

from __future__ import annotations

import copy

import numpy as np
from conftest import manual_engine, random_engine
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsched_gym.core.batching import BatchBuilder
from llmsched_gym.core.engine import Engine
from llmsched_gym.core.scheduler import BatchPlan
from llmsched_gym.env.decision import DecisionPoint


def engine(prompts, outputs, cap_tokens, bs=4) -> Engine:
    return manual_engine(prompts, outputs, cap_tokens, bs, overflow="preempt_lifo_recompute")


def point(e: Engine, k=4, admission="current", max_num_seqs=None, order="arrival") -> DecisionPoint:
    dp = DecisionPoint(k, order, admission, max_num_seqs)
    dp.setup(e)
    dp.begin()
    return dp


def test_free_blocks_needs_and_masks_on_a_hand_counted_state():
    # blocks of 4, 10 blocks; 0 and 1 run with 6 and 8 tokens (2 + 2 blocks); 1 decodes into a new block
    e = engine([5, 7, 3, 10, 6], [9] * 5, 40)
    e.execute(BatchPlan.admit([0, 1]))
    dp = point(e)
    assert dp.free == 10 - 4 - 1
    assert dp.need.tolist() == [2, 2, 1, 3, 2]  # each prompt with token 1: ceil(6/4), ceil(8/4), ...
    assert dp.slots == [2, 3, 4] and dp.fits_now.tolist() == [True, True, True] and dp.any
    dp.select(1)  # request 3 reserves 3 blocks; the slots shift up
    assert dp.sel == [3] and dp.slots == [2, 4] and dp.sel_blocks == 3
    assert dp.fits_now.tolist() == [True, True]
    dp.select(1)  # request 4: 5 of 5 blocks reserved
    assert dp.slots == [2] and dp.fits_now.tolist() == [False] and not dp.any
    assert dp.victim("newest") == 1
    dp.preempt(1)  # its 2 blocks and its decode's block come back
    assert dp.free == 5 + 2 + 1 and dp.released == 2 and dp.fits_now.tolist() == [True]
    assert dp.victim("newest") == 0 and dp.survivors() == [0]


def test_an_unfinished_prefill_reserves_what_it_still_owes():
    e = engine([10, 4], [3, 3], 64)  # 16 blocks
    e.execute(BatchPlan(prefill={0: 4}))  # 4 of 10 prompt tokens: 1 block
    dp = point(e)
    # the rest: 6 tokens and token 1 end at 11 tokens, 3 blocks: 2 more
    assert dp.free == 16 - 1 - 2
    assert dp.unfinished_prefills() == ([0], [6])
    assert dp.batch_shape() == (0, 0, 1, 6, 4)
    assert dp.growth(0) == 2


def test_max_num_seqs_masks_every_slot():
    e = engine([5, 7, 3], [9] * 3, 64)
    e.execute(BatchPlan.admit([0]))
    dp = point(e, max_num_seqs=2)
    assert dp.ok.tolist() == [True, True]
    dp.select(0)
    assert dp.ok.tolist() == [False] and not dp.any and not dp.admissible(2)
    dp.preempt(0)
    assert dp.ok.tolist() == [True]


@settings(max_examples=150, deadline=None)
@given(st.data(), st.sampled_from([1, 4, 16]))
def test_the_decision_points_memory_is_the_ledgers_and_current_admissions_fit(data, bs):
    e = random_engine(data.draw, bs)
    if not e.poll():
        return
    dp = DecisionPoint(4, "arrival", "current", None)
    dp.setup(e)
    for rid in np.flatnonzero(e.preemptions).tolist():  # the env refreshes a request it saw preempted
        dp.refresh(rid)
    dp.begin()
    led, kv = e.ledger, e.kv
    assert dp.free == kv.capacity_blocks - kv.used_blocks - sum(led.growth(r) for r in e.running)
    for rid in e.waiting:
        whole = led.blocks(int(e.kv_tokens[rid]) + 1) if e.swapped[rid] else led.whole_prompt(int(e.prefill_target[rid]))
        assert dp.need[rid] == whole
    # preempt some of the newest, then admit slots in order while the rule allows
    for _ in range(data.draw(st.integers(0, len(e.running)))):
        v = dp.victim("newest")
        free = dp.free
        dp.preempt(v)
        assert dp.free == free + led.own(v) + led.growth(v)
    while dp.slots and dp.ok[0]:
        need, free = int(dp.need[dp.slots[0]]), dp.free - dp.sel_blocks
        assert need <= free
        dp.select(0)
    # launched with an unlimited budget (every prefill completes), a batch that fits by the decision
    # point's count fits: the engine's overflow handler preempts nobody (the running requests alone
    # may not fit; a request swapped out mid-prefill is charged one token only)
    if dp.free - dp.sel_blocks < 0 or any(e.swapped[r] and e.prefilled[r] < e.prefill_target[r] for r in dp.sel):
        return
    b = BatchBuilder(e.view, None, reserve=False, preempted=dp.victims)
    b.decode_first(preempt=False)
    b.continue_prefills()
    for rid in dp.sel:
        b.admit(rid, check=False)
    trial = copy.deepcopy(e)
    before = trial.n_preempt_events
    trial.execute(b.plan())
    assert trial.n_preempt_events - before == len(dp.victims)
