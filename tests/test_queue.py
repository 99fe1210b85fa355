"""The engine's waiting queue (``llmsched_gym.core.queue.WaitingQueue``): queue order with arrivals
at the tail and preempted requests at the head, O(1) removal of any request, and a read-only list
view for policies. Constructed sequences with the exact order expected, and a hypothesis test
against a plain list doing the same operations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsched_gym.core.queue import WaitingQueue


def test_arrivals_join_the_tail_and_preempted_requests_the_head():
    q = WaitingQueue([1, 2, 3])
    q.append(4)
    q.extend([5, 6])
    assert q == [1, 2, 3, 4, 5, 6]
    q.push_front([7, 8])  # 7 becomes the head, 8 second
    assert q == [7, 8, 1, 2, 3, 4, 5, 6]
    q.push_front([9])  # the most recent push goes first
    assert list(q) == [9, 7, 8, 1, 2, 3, 4, 5, 6]
    q.remove(2)  # from the arrivals
    q.remove(7)  # from the pushed-back head
    assert list(q) == [9, 8, 1, 3, 4, 5, 6]
    assert len(q) == 7 and 8 in q and 7 not in q and 2 not in q


def test_reads_like_a_list():
    q = WaitingQueue([10, 11, 12])
    q.push_front([5])
    assert q[0] == 5 and q[1] == 10 and q[-1] == 12
    assert q[:2] == [5, 10] and q[1:3] == [10, 11] and q[::2] == [5, 11]
    assert np.asarray(q).tolist() == [5, 10, 11, 12] and np.asarray(q).dtype == np.int64
    assert q == (5, 10, 11, 12) and q != [10, 11, 12, 5]
    assert repr(q) == "WaitingQueue([5, 10, 11, 12])"
    assert bool(q) and not WaitingQueue()
    with pytest.raises(IndexError):
        WaitingQueue()[0]


def test_the_list_view_is_built_once_per_change():
    q = WaitingQueue([1, 2, 3])
    first = q.as_list()
    assert q.as_list() is first  # unchanged queue: the same list
    q.append(4)
    assert q.as_list() is not first and q.as_list() == [1, 2, 3, 4]
    for change in (lambda: q.remove(1), lambda: q.push_front([1]), lambda: q.extend([8])):
        before = q.as_list()
        change()
        assert q.as_list() is not before


def test_removing_a_request_that_is_not_waiting_raises():
    q = WaitingQueue([1])
    with pytest.raises(KeyError):
        q.remove(2)


OPS = st.lists(st.tuples(st.sampled_from(["append", "extend", "push_front", "remove"]),
                         st.lists(st.integers(0, 60), min_size=1, max_size=4)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_the_queue_is_a_list_with_cheap_removal(ops):
    """Any sequence of the engine's operations leaves the queue equal to a plain list doing them."""
    q, ref = WaitingQueue(), []
    for op, ids in ops:
        if op == "remove":
            rid = ids[0]
            if rid in ref:
                q.remove(rid)
                ref.remove(rid)
            continue
        ids = [r for r in dict.fromkeys(ids) if r not in ref]  # a request waits at most once
        if op == "append" and ids:
            q.append(ids[0])
            ref.append(ids[0])
        elif op == "extend":
            q.extend(ids)
            ref.extend(ids)
        elif op == "push_front":
            q.push_front(ids)
            ref[:0] = ids
        assert list(q) == ref and len(q) == len(ref)
        if ref:
            assert q[0] == ref[0] and q[len(ref) - 1] == ref[-1] and q[:3] == ref[:3]
