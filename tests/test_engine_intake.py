"""Requests given to an engine at run time (``Engine.extend``, the cluster's replicas): the engine
reads and writes its per-request buffers by id, and its public arrays (``state``, ``prefilled``,
..., ``cached_tokens``) and a replica's workload arrays are views of the buffers' first ``n``
rows, cut again when read after requests were added. Constructed instances: the views' lengths
and shared memory, the ledger's prompt of a new request, a copied engine, a replica's workload
against the global rows."""

from __future__ import annotations

import copy

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmsched_gym.core.cluster import _Rows
from llmsched_gym.core.engine import Engine, EngineConfig
from llmsched_gym.core.latency import make_latency
from llmsched_gym.core.request import Workload
from llmsched_gym.sim import make_policy

PUBLIC = ("state", "prefilled", "prefill_target", "generated", "kv_tokens", "swapped", "first_scheduled_s",
          "first_token_s", "completion_s", "preemptions", "recomputed_tokens", "cached_tokens")


def _workload(n: int) -> Workload:
    return Workload(arrival_s=np.arange(n) * 0.5, prompt_tokens=np.arange(n) * 7 + 20,
                    output_tokens=np.arange(n) % 5 + 3, client=np.arange(n) % 2, client_weight=np.ones(2))


def _engine(wl: Workload) -> Engine:
    cfg = EngineConfig(kv_capacity_tokens=4_000, block_size=16, overflow="preempt_lifo_recompute")
    return Engine(wl, cfg, make_latency("linear:d0=0.0625,d1=0"), make_policy("fcfs"), seed=0)


def _grown(n: int) -> tuple[Engine, _Rows, Workload]:
    """An engine given the first ``n`` of 10 requests one at a time through a replica's rows."""
    wl = _workload(10)
    rows = _Rows(wl)
    e = _engine(rows.workload)
    for g in range(n):
        e.extend(rows.add([g]))
    return e, rows, wl


def test_public_arrays_have_n_rows_and_share_the_buffers() -> None:
    e, rows, _ = _grown(3)
    assert [len(getattr(e, name)) for name in PUBLIC] == [3] * len(PUBLIC)
    assert e.prefill_target.tolist() == [20, 27, 34]
    state = e.state
    e.extend(rows.add([3]))
    assert len(e.state) == 4 and len(state) == 3  # a view read before stays as it was
    assert e.prefill_target.tolist() == [20, 27, 34, 41]  # the new row holds its initial value
    assert np.isnan(e.first_token_s).all() and not e.swapped.any()
    e.prefilled[3] = 5  # a write through the view is the engine's own
    assert e._prefilled[3] == 5
    assert len(e._prefilled) >= 64  # the buffer has rows to spare


def test_the_ledger_sees_a_request_added_without_regrowing() -> None:
    e, rows, _ = _grown(2)
    ledger = e.ledger
    e.extend(rows.add([2]))
    assert e.ledger is ledger  # the same buffers: no new ledger
    # a cold admission of request 2 (prompt 34, no hit) needs 3 blocks of 16, its first token included
    assert ledger.prompt[2] == 34 and ledger.admission(2, 0) == 3


def test_an_engine_given_its_requests_one_by_one_runs_as_one_given_them_at_once() -> None:
    wl = _workload(10)
    plain = _engine(wl)
    plain.run()
    e, _, _ = _grown(10)
    rows = _Rows(wl)
    once = _engine(rows.workload)
    once.extend(rows.add(list(range(10))))  # a one-replica cluster's engine: its arrays are plain ones
    assert type(once) is Engine and once.state is once._state and len(once._state) == 10
    for x in (e, once):
        x.run()
        for name in PUBLIC:
            np.testing.assert_array_equal(getattr(x, name), getattr(plain, name), err_msg=name)


def test_a_copied_grown_engine_runs_on_its_own_copy() -> None:
    e, rows, _ = _grown(6)
    e.state  # noqa: B018 -- a view cut before the copy must not be copied as a separate array
    twin = copy.deepcopy(e)
    twin.run()
    assert (twin.state == 3).all() and len(twin.completion_s) == 6
    assert (e.state == 0).all()  # the original did not move
    e.run()
    np.testing.assert_array_equal(e.completion_s, twin.completion_s)


def test_a_replica_workload_is_the_global_rows_it_was_given() -> None:
    wl = _workload(10)
    rows = _Rows(wl)
    w = rows.add([1, 4])
    assert len(w) == 2 and w.prompt_tokens.tolist() == [27, 48]
    prompt = w.prompt_tokens
    rows.add([7])
    assert len(prompt) == 2  # cut before the add
    for f in ("arrival_s", "prompt_tokens", "output_tokens", "predicted_output", "client", "task_class", "type_id",
              "ttft_slo_s", "tpot_slo_s"):
        np.testing.assert_array_equal(getattr(w, f), getattr(wl, f)[[1, 4, 7]], err_msg=f)
    later = w.with_(arrival_s=w.arrival_s + 1.0)  # a plain copy, as Workload.with_ gives
    assert type(later) is Workload and later.arrival_s.tolist() == [1.5, 3.0, 4.5] and len(later) == 3
    rows.add([g % 10 for g in range(100)])  # past the 64 rows of the first buffers
    assert len(w) == 103 and w.output_tokens[3:].tolist() == wl.output_tokens[np.arange(100) % 10].tolist()


def test_a_disaggregated_replica_row_replaces_the_given_fields() -> None:
    from llmsched_gym.core.disagg import _Rows as _DisaggRows

    wl = _workload(10)
    rows = _DisaggRows(wl)
    w = rows.add_one(2, output_tokens=1, predicted_output=1)  # a prefill row: one output token
    assert rows.add_one(5, arrival_s=9.25) is w  # a decode row arrives at its transfer's end; grown in place
    assert w.output_tokens.tolist() == [1, 3] and w.predicted_output.tolist() == [1, 3]
    assert w.arrival_s.tolist() == [1.0, 9.25] and w.prompt_tokens.tolist() == [34, 55]
    assert rows.gids[:rows.n].tolist() == [2, 5]
    rows.add_one(6, ttft_slo_s=2.5)  # a field copied only when read: the change survives the copy
    rows.add_one(8)
    assert w.ttft_slo_s.tolist() == [np.inf, np.inf, 2.5, np.inf] and w.client.tolist() == [0, 1, 0, 0]


def _engine_state(e: Engine) -> dict:
    """Everything the engine's intake sets, as plain values (rows past ``n`` excluded)."""
    n = e.n
    return {"n": n, "arrival": list(e._arrival), "prompt": e._prompt[:n].tolist(), "output": e._output[:n].tolist(),
            "ledger_prompt": e.ledger.prompt[:n].tolist(), "kv_prompt": e.kv._prompt[:n].tolist(),
            "cum": e._prompt_cum[:n + 1].tolist(), "target": e._prefill_target[:n].tolist(),
            "oversize": sorted(e._oversize), "max_len": e._max_len, "stall": e.stall_iterations,
            "kv_shared": e.kv.shared[:n].tolist(), "kv_enabled": e.kv.enabled}


def _intake_state(e: Engine, rows: _Rows) -> dict:
    """The engine's intake state and the replica's rows."""
    return {**_engine_state(e), "gids": rows.gids[:rows.n].tolist(), "prefix": list(rows.prefix or []),
            **{f: getattr(rows.workload, f).tolist() for f in ("arrival_s", "prompt_tokens", "output_tokens",
                                                               "predicted_output", "client", "ttft_slo_s")}}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), n=st.integers(1, 150), capacity=st.sampled_from([120, 4_000]))
def test_one_row_at_a_time_equals_rows_in_batches(data: st.DataObject, n: int, capacity: int) -> None:
    """``_Rows.append`` and the engine's one-request path (scalars, buffers read by id) leave the
    same state as the many-row paths (scalars up to ``_FEW`` rows, index arrays and slices above)
    given the same rows, and as an engine constructed with them all, with and without
    arrivals replaced (migration), past the buffers' first doubling, with requests too large for
    the KV (``capacity`` 120 tokens) and with prefix segments turning the prefix cache on late; and
    both engines then run alike."""
    arrival = np.sort(np.asarray(data.draw(st.lists(st.integers(0, 400), min_size=n, max_size=n)))) * 0.25
    prompt = np.asarray(data.draw(st.lists(st.integers(1, 150), min_size=n, max_size=n)))
    output = np.asarray(data.draw(st.lists(st.integers(1, 40), min_size=n, max_size=n)))
    late = data.draw(st.integers(0, n))  # the first request with a prefix segment
    prefix = [None if g < late else [(g % 3, int(prompt[g]) // 2)] for g in range(n)]
    wl = Workload(arrival_s=arrival, prompt_tokens=prompt, output_tokens=output, predicted_output=output + 1,
                  prefix=prefix, ttft_slo_s=np.arange(n) * 0.5 + 1)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, n), max_size=8))) | {n})
    shift = data.draw(st.booleans())  # replaced arrivals (a migrated request's: its transfer's end)
    cfg = EngineConfig(kv_capacity_tokens=capacity, block_size=16, overflow="preempt_lifo_recompute")

    def build(batched: bool) -> tuple[Engine, _Rows]:
        rows = _Rows(wl)
        e = Engine(rows.workload, cfg, make_latency("linear:d0=0.0625,d1=0"), make_policy("vllm-v1"), seed=0)
        e.more_from = 0.0
        lo = 0
        for hi in cuts:
            gids = list(range(lo, hi))
            arr = [float(arrival[g]) + 0.125 for g in gids] if shift else None
            if batched and len(gids) > 1:
                e.extend(rows.add(gids, arr))
            else:
                for k, g in enumerate(gids):
                    e.extend(rows.append(g, None if arr is None else arr[k]))
            if data.draw(st.booleans()):  # the views read between adds (cut, then cut again)
                rows.workload.predicted_output, e.prefill_target  # noqa: B018
            lo = hi
        return e, rows

    (one, r1), (many, r2) = build(False), build(True)
    assert _intake_state(one, r1) == _intake_state(many, r2)
    if not shift:  # an engine constructed with the whole workload holds the same
        whole = Engine(wl, cfg, make_latency("linear:d0=0.0625,d1=0"), make_policy("vllm-v1"), seed=0)
        assert _engine_state(one) == _engine_state(whole)
    for e in (one, many):
        e.more_from = None
        e.run()
    for name in PUBLIC:
        np.testing.assert_array_equal(getattr(one, name), getattr(many, name), err_msg=name)


def test_a_field_never_read_has_no_buffer_and_one_read_late_is_whole() -> None:
    wl = _workload(10)
    rows = _Rows(wl)
    for g in range(100):  # past the first buffers' 64 rows, one row at a time
        rows.append(g % 10)
    assert set(rows.bufs) == {"arrival_s", "prompt_tokens", "output_tokens"}  # nothing else copied or grown
    assert rows.workload.client.tolist() == [g % 2 for g in range(100)]  # its buffer made at this first read
    rows.append(3)
    assert rows.workload.client.tolist()[-2:] == [1, 1] and "type_id" not in rows.bufs
