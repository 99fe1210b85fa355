"""The batch former (``llmsched_gym.core.batching.BatchBuilder``) shared by Sarathi, vLLM, the static
heuristics and the env: decodes first within the token budget (the rest paused, or the newest
preempted when a decode lacks a block), unfinished prefills next, admissions last, each checked
against the free blocks and the watermark. Constructed engine states with the exact batch
expected, and hypothesis tests: a formed batch stays within its token budget, and the free blocks
the builder reports are never more than the engine then has (and when they are not negative, the
engine accepts the batch)."""

from __future__ import annotations

import copy

from conftest import manual_engine, random_engine
from hypothesis import given, settings
from hypothesis import strategies as st

from baselines import make_policy
from llmsched_gym.core.batching import BatchBuilder, budget_plan
from llmsched_gym.core.scheduler import BatchPlan


def test_decodes_beyond_the_budget_are_paused():
    e = manual_engine([5, 7, 3, 4], [9, 9, 9, 9], 64)
    e.execute(BatchPlan.admit([0, 1, 2]))
    b = BatchBuilder(e.view, budget=2, reserve=False)
    b.decode_first(preempt=False)
    assert (b.pause, b.budget) == ({2}, 0)
    assert not b.admit(3)  # the budget is spent
    plan = b.plan()
    assert plan.pause == {2} and not plan.prefill and not plan.hold


def test_a_decode_without_a_block_preempts_the_newest():
    # blocks of 4, 6 blocks: 0, 1, 2 hold 6, 8, 4 tokens (2 + 2 + 1 blocks); 1 and 2 need a new block
    e = manual_engine([5, 7, 3], [9, 9, 9], 24)
    e.execute(BatchPlan.admit([0, 1, 2]))
    assert e.kv_tokens.tolist() == [6, 8, 4] and e.kv.used_blocks == 5
    b = BatchBuilder(e.view, budget=None, reserve=True)
    assert b.free == 1
    b.decode_first(preempt=True)
    # 0 needs none; 1 takes the last block; 2 then lacks one and is the newest: it goes itself
    assert b.preempt == [2] and b.n == 2 and b.free == 0 and not b.pause
    e.execute(b.plan())
    assert e.waiting == [2] and e.kv.used_blocks == 5


def test_a_preempted_victim_frees_its_blocks_for_an_older_decode():
    e = manual_engine([5, 3, 7], [9, 9, 9], 24)  # 0, 1, 2 hold 6, 4, 8 tokens: 2 + 1 + 2 blocks
    e.execute(BatchPlan.admit([0, 1, 2]))
    b = BatchBuilder(e.view, budget=None)
    assert b.free == 1
    b.decode_first()
    # 1 takes the free block, 2 lacks one and preempts itself (the newest)
    assert b.preempt == [2]
    b2 = BatchBuilder(e.view, budget=None, preempted=[2])  # 2 chosen beforehand: its 2 blocks count free
    assert b2.free == 3 and b2.running == [0, 1]
    b2.decode_first()
    assert b2.preempt == [2] and b2.free == 2


def test_unfinished_prefills_continue_within_the_budget():
    e = manual_engine([10, 20], [3, 3], 128)
    e.execute(BatchPlan(prefill={0: 4, 1: 6}))  # both unfinished: 6 and 14 tokens owed
    b = BatchBuilder(e.view, budget=10, reserve=False)
    b.decode_first(preempt=False)
    b.continue_prefills()
    assert b.prefill == {0: 6, 1: 4} and b.budget == 0
    # reserve: the blocks still owed are held back from the start: ceil(11/4) - 1 and ceil(21/4) - 2
    r = BatchBuilder(e.view, budget=10, reserve=True)
    assert r.reserved == {0: 2, 1: 4} and r.free == 32 - 3 - 6


def test_admission_charges_the_whole_prompt_with_reserve_and_the_chunk_without():
    e = manual_engine([30, 9], [3, 3], 64)  # 16 blocks
    for reserve, need in ((True, 8), (False, 4)):  # 30 + token 1 = 8 blocks; a 16-token chunk = 4
        b = BatchBuilder(e.view, budget=16, reserve=reserve)
        assert b.admit(0) and b.prefill == {0: 16} and b.free == 16 - need and b.budget == 0
        assert not b.admit(1)  # no budget left
    b = BatchBuilder(e.view, budget=None, watermark=0.5)  # 8 blocks must stay free
    assert b.admit(0) and b.prefill == {0: BatchPlan.FULL} and b.free == 8
    assert not b.admit(1)  # 3 more blocks would cut into the watermark
    b = BatchBuilder(e.view, budget=None, max_num_seqs=1)
    assert b.admit(0) and not b.admit(1)
    b = BatchBuilder(e.view, budget=100, reserve=False)
    assert b.admit(0, chunk_cap=8) and b.prefill == {0: 8} and b.budget == 92


def test_a_decode_only_batch_holds():
    e = manual_engine([5], [9], 64)
    e.execute(BatchPlan.admit([0]))
    b = BatchBuilder(e.view, budget=None)
    b.decode_first()
    b.continue_prefills()
    assert b.plan().hold
    b = BatchBuilder(e.view, budget=0)
    b.decode_first(preempt=False)
    assert not b.plan().hold  # a paused decode: the plan changes when the budget does


# ---- random states --------------------------------------------------------------------------------
def sarathi_any_chunk(draw):
    return make_policy("sarathi", chunk_size=int(draw(st.integers(4, 64))))


@settings(max_examples=150, deadline=None)
@given(st.data(), st.sampled_from([1, 4, 16]), st.booleans(), st.booleans())
def test_a_formed_batch_fits_its_budget_and_the_free_blocks_it_reports(data, bs, reserve, prefix):
    e = random_engine(data.draw, bs, prefix=prefix, modes=("recompute", "swap"), policy=sarathi_any_chunk)
    if not e.poll():
        return
    view = e.view
    budget = data.draw(st.sampled_from([None, 1, 8, 32, 256]))
    b = BatchBuilder(view, budget, reserve=reserve, max_num_seqs=data.draw(st.sampled_from([None, 2, 8])),
                     watermark=data.draw(st.sampled_from([0.0, 0.1])))
    b.decode_first(preempt=True)
    b.continue_prefills()
    for rid in view.waiting:
        if not b.admit(rid):
            break
    plan = b.plan()
    # the token budget: one per decode that runs, the chunks (a whole prompt under no budget)
    running = [r for r in view.running if r not in plan.preempt]
    n_dec = sum(1 for r in running if view.prefilled[r] >= view.prefill_target[r] and r not in plan.pause)
    if budget is not None:
        assert n_dec + sum(plan.prefill.values()) <= budget and BatchPlan.FULL not in plan.prefill.values()
    admitted = [r for r in plan.prefill if r not in view.running]
    assert not admitted or len(running) + len(admitted) <= (b.max_num_seqs or 10**9)
    # the builder's free blocks are a lower bound of what the engine has after the batch, except
    # where a preempted victim shared prefix blocks (counted as freed; the engine keeps them) or a
    # swapped-out request comes back (charged as a fresh prompt)
    short = view.ledger.shortfall(plan, view.running)
    if (not plan.preempt or not e.kv.enabled) and not view.swapped[admitted].any():
        assert short <= -b.free
        if b.free < 0:  # unchecked: without reserve, unfinished prefills continue whatever they need
            return
        trial = copy.deepcopy(e)
        before = trial.n_preempt_events
        trial.execute(plan)
        assert trial.n_preempt_events - before == len(plan.preempt)  # the overflow handler never ran


@settings(max_examples=150, deadline=None)
@given(st.data(), st.sampled_from([1, 4, 16]), st.booleans())
def test_budget_plan_is_the_builders_plan_when_the_budget_reaches_every_decode(data, bs, prefix):
    """The env's launch former (``budget_plan``, closed form) against the builder's own phases."""
    e = random_engine(data.draw, bs, prefix=prefix, modes=("recompute", "swap"), policy=sarathi_any_chunk)
    if not e.poll():
        return
    view = e.view
    running = list(view.running)
    victims = data.draw(st.lists(st.sampled_from(running), unique=True, max_size=2)) if running else []
    survivors = [r for r in running if r not in victims]
    n_dec = sum(1 for r in survivors if view.prefilled[r] >= view.prefill_target[r])
    mid = [r for r in survivors if view.prefilled[r] < view.prefill_target[r]]
    unfinished = (mid, [int(view.prefill_target[r] - view.prefilled[r]) for r in mid])
    budget = data.draw(st.sampled_from([None, n_dec, n_dec + 1, n_dec + 8, n_dec + 64]))
    admit = list(view.waiting)[: data.draw(st.integers(0, 4))]
    b = BatchBuilder(view, budget, reserve=False, preempted=victims, memory=False)
    b.decode_first(preempt=False)
    b.continue_prefills()
    for rid in admit:
        if not b.admit(rid):
            break
    built = b.plan()
    quick = budget_plan(view, budget, admit, n_dec, unfinished, victims)
    assert quick.prefill == built.prefill
    assert list(quick.prefill) == list(built.prefill)  # the same order
    assert sorted(quick.preempt) == sorted(built.preempt) and not built.pause
