"""The memory ledger (``llmsched_gym.core.ledger``): its block rule on constructed instances with
exact numbers, and its verdicts against what the engine then does.

* Hand-counted states (paged blocks of 4, prefill emitting token 1, a shared prefix): each answer
  of the ledger (a chunk's, a decode's, an admission's blocks; held and own blocks; a plan's
  shortfall; the LIFO victims) and the engine's resulting state.
* Random engine states (paged KV, prefix cache, swap, recompute, restart) and random plans:
  ``shortfall > 0`` exactly when the engine's overflow handler runs (``forbid`` refuses the plan,
  ``preempt_lifo_recompute`` preempts more than the plan asked, ``clear_all`` counts an overflow
  event), the victims the ledger names are the ones the engine preempts, and afterwards the KV is
  within capacity.
* Conservation along random runs: the blocks in use are the running requests' own blocks plus the
  referenced prefix blocks (a swapped-out request holds none), and used plus idle cached blocks
  stay within capacity.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from conftest import manual_engine, random_engine
from hypothesis import given, settings
from hypothesis import strategies as st

from baselines.base import fit_plan
from llmsched_gym.core.engine import RUNNING, Engine
from llmsched_gym.core.scheduler import BatchPlan, PlanError


# ---- constructed instances ----------------------------------------------------------------------
def test_the_block_rule_on_a_hand_counted_paged_state():
    # blocks of 4 tokens, 8 blocks; prompts 5, 7, 3
    e = manual_engine([5, 7, 3], [4, 4, 4], cap_tokens=32)
    led = e.ledger
    # a whole prompt plus token 1: ceil(6/4), ceil(8/4), ceil(4/4)
    assert led.whole_prompt(np.array([5, 7, 3])).tolist() == [2, 2, 1]
    assert led.blocks(9) == 3 and led.blocks(8) == 2 and led.blocks(0) == 0
    assert led.step(5, 3, last=True) == 1  # 5 -> 9 tokens: 2 -> 3 blocks
    assert led.step(5, 3, last=False) == 0  # 5 -> 8 tokens: 2 -> 2 blocks
    assert led.step(4, 4, last=False) == 1 and led.step(4, 4, last=True) == 2
    assert led.admission(2, 0) == 1  # 3 tokens + token 1 = one block
    assert led.chunk(2, 0, 2) == 1 and led.chunk(1, 0, 7) == 2 and led.chunk(1, 0, 4) == 1
    e.execute(BatchPlan.admit([0, 1]))
    # prompts stored with token 1: 6 and 8 tokens, 2 + 2 blocks
    assert e.kv_tokens[:2].tolist() == [6, 8] and e.kv.used_blocks == 4
    assert [led.decode(0), led.decode(1)] == [0, 1]  # 8 tokens fill request 1's last block
    assert led.decodes(np.array([0, 1])) == 1
    assert [led.held(1), led.own(1), led.growth(1), led.owed(1)] == [2, 2, 1, 0]
    # admitting 2 next: 4 used + 1 decode block + 1 block for 2's prompt, of 8
    assert led.shortfall(BatchPlan.admit([2]), e.running) == 4 + 1 + 1 - 8
    assert led.fits(4) and not led.fits(5)


def test_an_unfinished_prefill_owes_the_rest_of_its_prompt():
    e = manual_engine([10], [3], cap_tokens=64)
    e.execute(BatchPlan(prefill={0: 5}))  # a chunk of 5 of 10 prompt tokens: 2 blocks
    led = e.ledger
    assert (e.kv_tokens[0], e.kv.used_blocks) == (5, 2)
    # the other 5 tokens and token 1: ceil(11/4) - ceil(5/4) = 3 - 2
    assert led.owed(0) == led.growth(0) == 1
    assert led.running_growth(np.array([5]), np.array([5])) == 1
    assert led.iteration([(0, 0)], np.array([], int)) == ([(0, 5, True)], 1)  # 0: the rest
    assert led.iteration([(0, 2)], np.array([], int)) == ([(0, 2, False)], 0)  # 7 tokens still fit in 2 blocks


def test_forbid_refuses_with_the_ledgers_count_and_message():
    # 5 blocks: requests 0 and 1 hold 2 + 2; admitting 2 (1 block) while 1 decodes into a new block
    e = manual_engine([5, 7, 3], [4, 4, 4], cap_tokens=20)
    e.execute(BatchPlan.admit([0, 1]))
    plan = BatchPlan.admit([2])
    assert e.ledger.shortfall(plan, e.running) == 1
    with pytest.raises(PlanError, match=r"^overflow: the plan needs 1 more blocks of 4 than the KV capacity "
                                        r"\(5 blocks of 4, 4 used\); last admitted: request 2 \(prefill 3 tokens\)$"):
        e.execute(plan)


def test_lifo_preempts_the_admission_the_ledger_names():
    e = manual_engine([5, 7, 3], [4, 4, 4], cap_tokens=20, overflow="preempt_lifo_recompute")
    e.execute(BatchPlan.admit([0, 1]))
    _, grow = e.ledger.iteration([(2, 0)], np.array([0, 1]))
    # request 2 is not admitted yet: its chunk counts from 0 tokens; decodes of 0 and 1 add 1
    assert grow == 2
    e.execute(BatchPlan.admit([2]))
    # the newest running request (2, just admitted) went back to the head of the queue; 0 and 1 decoded
    assert e.waiting == [2] and e.preemptions.tolist() == [0, 0, 1]
    assert e.kv_tokens.tolist() == [7, 9, 0] and e.kv.used_blocks == 5 == e.kv.capacity_blocks


def test_lifo_preempts_a_decode_and_its_block_leaves_the_iteration():
    # 4 blocks, full after the admissions; request 1's decode needs a fifth
    e = manual_engine([5, 7], [4, 4], cap_tokens=16, overflow="preempt_lifo_recompute")
    e.execute(BatchPlan.admit([0, 1]))
    assert e.kv.used_blocks == 4
    victims, n_dec_gone, total = e.ledger.victims([], np.array([0, 1]), e.running)
    assert (victims, n_dec_gone, total) == ([1], 1, 0)
    e.execute(BatchPlan())
    assert e.waiting == [1] and e.kv_tokens.tolist() == [7, 0] and e.kv.used_blocks == 2
    assert e.prefill_target[1] == 7 + 1  # recompute: the prompt plus the token it had produced


def test_a_shared_prefix_counts_once_and_is_freed_by_its_last_holder():
    # two prompts of 10 sharing an 8-token head (2 full blocks of 4); 25 blocks
    prefix = [((7, 8),), ((7, 8),)]
    e = manual_engine([10, 10], [5, 5], cap_tokens=100, prefix=prefix)
    led = e.ledger
    e.execute(BatchPlan.admit([0]))  # 10 + token 1 = 3 blocks; its 2 head blocks enter the cache
    assert (e.kv.used_blocks, int(e.kv.shared[0])) == (3, 2)
    e.execute(BatchPlan.admit([1]))  # hit 8 (capped at 9); 2 tokens + token 1 = 1 new block; 0 decodes
    assert (e.cached_tokens[1], e.kv_tokens.tolist()) == (8, [12, 11])
    assert e.kv.used_blocks == 3 + 1 == 4  # 3 + 3 blocks, 2 of them shared
    assert [led.held(1), led.own(1)] == [3, 1]
    # 1 preempted: its own block is freed, the shared ones stay (0 holds them); 0 decodes at 12
    # tokens into a new block
    assert led.shortfall(BatchPlan(preempt=[1]), e.running) == (4 - 1 + 1) - 25
    # both preempted: the shared blocks become idle (free) too
    assert led.shortfall(BatchPlan(preempt=[0, 1]), e.running) == 0 - 25
    e.execute(BatchPlan(preempt=[0, 1]))
    assert (e.kv.used_blocks, e.kv.idle_blocks) == (0, 2)


def test_a_swapped_request_takes_its_kv_back_at_admission():
    e = manual_engine([5, 7], [4, 4], cap_tokens=40, preempt_mode="swap")
    e.execute(BatchPlan.admit([0, 1]))
    e.execute(BatchPlan(preempt=[1]))  # swapped out holding 8 tokens; 0 decodes to 7
    assert e.swapped[1] and e.kv_tokens.tolist() == [7, 8] and e.kv.used_blocks == 2
    # back in: its 2 blocks, then it resumes decoding into a new block (8 % 4 == 0); 0 decodes in
    # its second block
    assert e.ledger.shortfall(BatchPlan.admit([1]), e.running) == 2 + 2 + 1 - 10
    e.execute(BatchPlan.admit([1]))
    assert e.kv.used_blocks == 5 and e.kv_tokens.tolist() == [8, 9]


# ---- random engine states -----------------------------------------------------------------------
def random_engine_then(draw, bs: int, mode: str, overflow: str) -> Engine:
    """:func:`conftest.random_engine` in preemption ``mode``, then switched to ``overflow``."""
    e = random_engine(draw, bs, modes=(mode,))
    e.config.overflow = overflow
    return e


def random_plan(draw, e: Engine) -> BatchPlan:
    running = e.running
    preempt = draw(st.lists(st.sampled_from(running), unique=True)) if running else []
    candidates = list(e.waiting) + preempt + [r for r in running if e.prefilled[r] < e.prefill_target[r]]
    chosen = draw(st.lists(st.sampled_from(candidates), unique=True)) if candidates else []
    prefill = {r: draw(st.integers(0, 50)) for r in chosen}
    pause = frozenset(draw(st.lists(st.sampled_from(running), unique=True))) if running and draw(st.booleans()) else frozenset()
    return BatchPlan(prefill=prefill, preempt=preempt, decode=draw(st.booleans()), pause=pause)


MODES = st.sampled_from(["recompute", "restart", "swap"])


@settings(max_examples=150, deadline=None)
@given(st.data(), st.sampled_from([1, 4, 16]), MODES)
def test_shortfall_is_what_forbid_refuses_and_fit_plan_repairs_it(data, bs, mode):
    e = random_engine_then(data.draw, bs, mode, "forbid")
    if not e.poll():
        return
    view = e.view
    plan = random_plan(data.draw, e)
    short = view.ledger.shortfall(plan, view.running)
    trial = copy.deepcopy(e)
    try:
        trial.execute(plan)
        refused = False
    except PlanError as err:
        if not str(err).startswith("overflow"):
            return  # an invalid plan (not a memory question)
        refused = True
        if trial.kv.evicted_blocks == e.kv.evicted_blocks:  # see Ledger.shortfall on evictions
            assert f"needs {short} more" in str(err)
    assert refused == (short > 0), short
    if not refused:
        assert trial.kv.used_blocks <= trial.kv.capacity_blocks
    fitted = fit_plan(view, plan)
    if not refused:
        assert fitted is plan
    else:
        assert view.ledger.shortfall(fitted, view.running) <= 0
        copy.deepcopy(e).execute(fitted)


@settings(max_examples=150, deadline=None)
@given(st.data(), st.sampled_from([1, 4, 16]), MODES, st.sampled_from(["preempt_lifo_recompute", "swap"]))
def test_lifo_preempts_exactly_when_and_whom_the_ledger_says(data, bs, mode, overflow):
    e = random_engine_then(data.draw, bs, mode, overflow)
    if not e.poll():
        return
    plan = random_plan(data.draw, e)
    short = e.ledger.shortfall(plan, e.running)
    trial = copy.deepcopy(e)
    seen: list[int] = []  # the engine's preemptions, in order
    hook = trial.scheduler.on_preempt
    trial.scheduler.on_preempt = lambda rid, view: (seen.append(rid), hook(rid, view))
    trial._hook_preempt = True
    before = trial.n_preempt_events
    try:
        trial.execute(plan)
    except PlanError:
        return  # an invalid plan
    handler = seen[len(plan.preempt):]  # preempted by the overflow handler, newest first
    assert trial.n_preempt_events - before == len(plan.preempt) + len(handler)
    assert bool(handler) == (short > 0)
    if handler:  # the newest running requests, admissions of this plan included
        after_plan = [r for r in e.running if r not in plan.preempt] + [
            r for r in plan.prefill if e.state[r] != RUNNING or r in plan.preempt]
        assert handler == after_plan[::-1][: len(handler)]
    assert trial.kv.used_blocks <= trial.kv.capacity_blocks


@settings(max_examples=100, deadline=None)
@given(st.data(), st.sampled_from([1, 4, 16]), MODES)
def test_clear_all_counts_an_overflow_exactly_when_the_ledger_says(data, bs, mode):
    e = random_engine_then(data.draw, bs, mode, "clear_all")
    if not e.poll():
        return
    plan = random_plan(data.draw, e)
    short = e.ledger.shortfall(plan, e.running)
    trial = copy.deepcopy(e)
    try:
        trial.execute(plan)
    except PlanError:
        return
    assert trial.n_overflow_events - e.n_overflow_events == (1 if short > 0 else 0)
    assert trial.kv.used_blocks <= trial.kv.capacity_blocks  # cleared when it overflowed


def _check_conservation(e: Engine) -> None:
    kv, led = e.kv, e.ledger
    running = set(e.running)
    own = sum(led.own(r) for r in running)
    referenced = len({h for r in running for h in kv.block_hashes(r)[: int(kv.shared[r])]})
    assert kv.used_blocks == own + referenced
    assert kv.used_blocks + kv.idle_blocks <= kv.capacity_blocks
    # requests that are not running hold no blocks of the cache (a swapped one holds host memory)
    assert not kv.shared[[r for r in range(e.n) if r not in running]].any()


@settings(max_examples=60, deadline=None)
@given(st.data(), st.sampled_from([1, 4, 16]), MODES)
def test_blocks_are_conserved_and_within_capacity_along_a_run(data, bs, mode):
    e = random_engine_then(data.draw, bs, mode, "preempt_lifo_recompute")
    _check_conservation(e)
    for _ in range(60):
        if not e.poll():
            break
        try:
            e.execute(random_plan(data.draw, e) if data.draw(st.booleans()) else e.scheduler.schedule(e.view))
        except PlanError:
            break  # an invalid plan: the engine state is left as it was mid-plan
        _check_conservation(e)
