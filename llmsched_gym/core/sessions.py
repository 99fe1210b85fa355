"""Prefix-heavy traffic: groups sharing a long system prompt, and multi-turn sessions.

:func:`prefix_groups` is the workload of llm-d's prefix-heavy benchmark (llm-d blog, "KV-cache wins
you can see", 2025: 150 groups of 6,000-token system prompts behind 8 pods at 3 to 60 QPS) with
optional multi-turn sessions (each turn's prompt is the previous turn's prompt and answer plus a
new question, as chat traffic and the Mooncake conversation trace have it). Prefix identity is
given as segments (:mod:`llmsched_gym.core.request`), so every replica's prefix cache and every
prefix-aware router see exactly which prompt blocks two requests share.
"""

from __future__ import annotations

import numpy as np

from llmsched_gym.core.request import Segments, Workload, WorkloadError


def _positive(name: str, value: object, *, integer: bool = True, zero: bool = False) -> float:
    ok = isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)
    if ok and integer:
        ok = float(value).is_integer()
    if not ok or not (value >= 0 if zero else value > 0):
        want = ("an integer" if integer else "a number") + (" >= 0" if zero else " >= 1" if integer else " > 0")
        raise WorkloadError(f"{name}: expected {want}, got {value!r}")
    return value


def prefix_groups(n: int, rate: float, groups: int, system_tokens: int, question_tokens: int, output_tokens: int,
                  turns: int = 1, think_s: float = 0.0, rng: np.random.Generator | int | None = None,
                  first_segment_id: int = 0, length_cv: float = 0.0) -> Workload:
    """``n`` requests in sessions of ``turns`` turns; each session belongs to one of ``groups``
    groups (uniformly at random) and every prompt starts with its group's system prompt.

    Sessions start as a Poisson process of ``rate / turns`` per second (so requests arrive at about
    ``rate``); turn ``k`` of a session arrives ``k * think_s`` seconds after its start (0: all
    turns at once, which only makes sense with ``turns = 1``). Turn ``k``'s prompt is the system
    prompt (``system_tokens``), the ``k - 1`` earlier questions and answers, and a new question
    (``question_tokens``); its output is ``output_tokens``. With ``length_cv > 0`` questions and
    outputs are drawn from a Gamma distribution with those means and that coefficient of
    variation (at least 1 token).

    Segment ids: group ``g``'s system prompt is ``first_segment_id + g``; every question and answer
    gets an id of its own after those, so two prompts share exactly their group's system prompt
    and, within a session, the whole earlier conversation.
    """
    n = int(_positive("n_requests", n))
    rate = float(_positive("rate", rate, integer=False))
    groups = int(_positive("groups", groups))
    system_tokens = int(_positive("system_tokens", system_tokens, zero=True))
    question_tokens = int(_positive("question_tokens", question_tokens))
    output_tokens = int(_positive("output_tokens", output_tokens))
    turns = int(_positive("turns", turns))
    think_s = float(_positive("think_s", think_s, integer=False, zero=True))
    length_cv = float(_positive("length_cv", length_cv, integer=False, zero=True))
    rng = np.random.default_rng(rng)
    n_sessions = -(-n // turns)
    start = np.cumsum(rng.exponential(turns / rate, n_sessions))
    group = rng.integers(0, groups, n_sessions)

    def lengths(mean: int, size: int) -> np.ndarray:
        if length_cv == 0:
            return np.full(size, mean, dtype=np.int64)
        k = 1.0 / length_cv**2
        return np.maximum(1, np.rint(rng.gamma(k, mean / k, size))).astype(np.int64)

    q = lengths(question_tokens, n_sessions * turns).reshape(n_sessions, turns)
    a = lengths(output_tokens, n_sessions * turns).reshape(n_sessions, turns)
    next_id = first_segment_id + groups
    arrival, prompt, output, prefix = [], [], [], []
    for s in range(n_sessions):
        head: Segments = ((first_segment_id + int(group[s]), system_tokens),) if system_tokens else ()
        length = system_tokens
        for k in range(turns):
            segs = head + ((next_id, int(q[s, k])),)
            next_id += 1
            arrival.append(start[s] + k * think_s)
            prompt.append(length + int(q[s, k]))
            output.append(int(a[s, k]))
            prefix.append(segs)
            head = segs + ((next_id, int(a[s, k])),)  # the answer joins the next turn's prompt
            next_id += 1
            length = prompt[-1] + int(a[s, k])
    order = np.argsort(np.asarray(arrival), kind="stable")[:n]
    wl = Workload(np.asarray(arrival)[order], np.asarray(prompt)[order], np.asarray(output)[order],
                  prefix=[prefix[i] for i in order],
                  meta={"generator": "prefix_groups", "groups": groups, "turns": turns})
    wl.arrival_s = wl.arrival_s - (wl.arrival_s[0] if n else 0.0)
    return wl
