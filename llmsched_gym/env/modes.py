"""The action modes of ``LLMSched-v1``: one small class per mode.

A mode owns its ``space`` and turns an action into the env's batch: it calls the decision point
(select a slot, preempt) and the episode's :class:`~llmsched_gym.env.driver.Driver`, which is all
it knows of the env: ``launch(budget)`` runs the batch formed so far, ``run_plan(plan)`` a
policy's plan, ``default_plan()`` is what runs where nothing is decided, ``invalid(message)``
counts an invalid action, ``form(budget, admit)`` the batch a launch would form (dry) and
``view`` the engine's read-only state. It also says which boundaries are decisions
(:meth:`Mode.decides`), what runs at the others (:meth:`Mode.between`) and how a policy's plan
becomes an action (:meth:`Mode.expert`, which raises :class:`Inexpressible` when the mode cannot
express it). :func:`make_mode` builds the mode an env asks for.
"""

from __future__ import annotations

import math

import numpy as np

from llmsched_gym.core.scheduler import BatchPlan, Scheduler
from llmsched_gym.env.actions import (
    KNOBS,
    PREEMPT_RULES,
    action_space,
    check_box,
    check_subset,
    discrete_error,
    knob_values,
    select_error,
    select_size,
    tune_values,
)
from llmsched_gym.env.decision import DecisionPoint
from llmsched_gym.env.driver import Driver
from llmsched_gym.env.experts import Inexpressible, describe, plan_admissions, plan_key


class Mode:
    """Base class: the slot-based modes (the agent forms the batch through the decision point)."""

    name = ""

    def __init__(self, driver: Driver, dp: DecisionPoint, k: int, budget: int | None = None) -> None:
        self.driver = driver
        self.dp = dp
        self.K = k
        self.budget = budget  # the launch budget of subset, priority and knob

    @property
    def space(self):
        return action_space(self.name, self.K)

    def start(self) -> None:
        """A new episode begins (the driver has its new engine)."""

    def decides(self) -> bool:
        """Whether this boundary is a decision: a slot is admissible or a prefill is unfinished."""
        return self.dp.any or self.driver.view.n_in_prefill > 0

    def between(self) -> BatchPlan:
        """The plan of a boundary that is not a decision (nothing admissible, nothing chunked)."""
        return self.driver.default_plan()

    def masks(self) -> np.ndarray:
        """Admissible slots (information only in the Box modes)."""
        dp = self.dp
        return np.concatenate((dp.ok, np.zeros(self.K - len(dp.slots), bool)))

    def info_mask(self) -> np.ndarray:
        """``info["action_mask"]``: :meth:`masks` as a fresh int8 array."""
        return self.masks().view(np.int8)

    def step(self, action) -> None:
        raise NotImplementedError

    def fallback(self):
        """The action an inexpressible expert plan becomes (the env's ``fallback_action``): here
        all scores -1 (admit nothing)."""
        return np.full(self.K, -1.0, np.float32)

    def expert(self, pol: Scheduler, plan: BatchPlan):
        raise Inexpressible(f"{self.name} mode has no translation of a batch plan into an action")

    # shared by subset and priority: the plan must be what admitting its requests forms
    def _admissions(self, plan: BatchPlan) -> list[int]:
        driver, view = self.driver, self.driver.view
        if plan.preempt:
            raise Inexpressible(f"it preempts {list(plan.preempt)} (only select mode has preempt actions)")
        admitted = plan_admissions(view, plan)
        slot_of = {r: i for i, r in enumerate(self.dp.slots)}
        missing = [r for r in admitted if r not in slot_of]
        if missing:
            raise Inexpressible(f"requests {missing} are not among the {self.K} slots (order={self.dp.order!r})")
        masked = [slot_of[r] for r in admitted if not self.dp.ok[slot_of[r]]]
        if masked:
            raise Inexpressible(f"slots {masked} are masked by admission={self.dp.admission!r}")
        if plan_key(view, plan) != plan_key(view, driver.form(self.budget, admitted)):
            raise Inexpressible(f"its batch is not the one admitting {admitted} forms with budget={self.budget}")
        return admitted


class SelectMode(Mode):
    """``Discrete(K + B + 2)``: admit slot ``i``; launch with budget ``budgets[j]``; preempt."""

    name = "select"

    def __init__(self, driver: Driver, dp: DecisionPoint, k: int, budgets: tuple[int | None, ...],
                 blind: bool) -> None:
        super().__init__(driver, dp, k)
        self.budgets = budgets
        self.B = len(self.budgets)
        self.n = select_size(self.K, self.B)
        self.launch0 = self.K
        self.preempt0 = self.K + self.B
        # the preempt actions offered: under blind only the newest (the longest needs predictions)
        self.preempt_end = self.n if not blind else self.preempt0 + 1
        self._blank = np.zeros(self.n, bool)  # the launch actions are always valid
        self._blank[self.launch0:self.preempt0] = True
        self._mask_version = -1
        self._templates: dict[tuple[int, bool], tuple[np.ndarray, np.ndarray]] = {}

    @property
    def space(self):
        return action_space("select", self.K, self.B)

    def masks(self) -> np.ndarray:
        return self._current().copy()

    def info_mask(self) -> np.ndarray:
        self._current()
        return self._mask_i8.copy()

    def _current(self) -> np.ndarray:
        """The mask of this step, computed once (both :meth:`masks` and ``info`` copy it); when
        every slot shown is admissible it only depends on how many there are and whether a
        running request is left to preempt, so those masks are kept (never handed out)."""
        dp = self.dp
        if dp.version != self._mask_version:  # unchanged until the slots or the batch change
            self._mask_version = dp.version
            preempt = len(self.driver.view.running) > len(dp.victims)
            if dp.all_ok:
                key = (len(dp.slots), preempt)
                got = self._templates.get(key)
                if got is None:
                    got = self._templates[key] = self._build(dp.ok, preempt)
                self._mask, self._mask_i8 = got
            else:
                self._mask, self._mask_i8 = self._build(dp.ok, preempt)
        return self._mask

    def _build(self, ok: np.ndarray, preempt: bool) -> tuple[np.ndarray, np.ndarray]:
        """A mask (bool, and its int8 view): the slots ``ok``, the launches, the preempts."""
        m = self._blank.copy()
        m[: len(ok)] = ok
        if preempt:
            m[self.preempt0:self.preempt_end] = True
        return m, m.view(np.int8)

    def step(self, action) -> None:
        if type(action) is not int and isinstance(action, np.ndarray | np.integer) \
                and action.ndim == 0 and action.dtype.kind in "iu":
            action = int(action)
        dp, driver = self.dp, self.driver
        if type(action) is int:
            if 0 <= action < len(dp.slots) and dp.ok[action]:
                dp.select(action)
                return
            if self.launch0 <= action < self.preempt0:
                driver.launch(self.budgets[action - self.launch0])
                return
            if self.preempt0 <= action < self.preempt_end:
                victim = dp.victim(PREEMPT_RULES[action - self.preempt0])
                if victim is not None:
                    dp.preempt(victim)
                    return
        driver.invalid(select_error(action, self.masks(), self.K))
        driver.launch(driver.recent.budget)

    def fallback(self) -> int:
        """The launch with the last budget."""
        return self.launch0 + self.budgets.index(self.driver.recent.budget)

    def expert(self, pol: Scheduler, plan: BatchPlan) -> int:
        driver, view, dp = self.driver, self.driver.view, self.dp
        victims = list(plan.preempt)
        done = len(dp.victims)
        if dp.victims != victims[:done]:
            raise Inexpressible(f"the batch being formed preempted {dp.victims}, the plan {victims}")
        if done < len(victims):
            v = victims[done]
            for j, rule in enumerate(PREEMPT_RULES[: self.preempt_end - self.preempt0]):
                if dp.victim(rule) == v:
                    return self.preempt0 + j
            raise Inexpressible(f"it preempts request {v}, neither the newest running request nor the one "
                                "with the longest predicted remaining output")
        admitted = plan_admissions(view, plan)
        if admitted[: len(dp.sel)] != dp.sel:
            raise Inexpressible(f"the batch being formed chose {dp.sel}, the plan admits {admitted}")
        if len(admitted) > len(dp.sel):
            rid = admitted[len(dp.sel)]
            try:
                s = dp.slots.index(rid)
            except ValueError:
                raise Inexpressible(f"request {rid} is not among the {self.K} slots (order={dp.order!r})") from None
            if not dp.ok[s]:
                raise Inexpressible(f"request {rid} (slot {s}) is masked by admission={dp.admission!r}"
                                    + (f", max_num_seqs={dp.max_num_seqs}" if dp.max_num_seqs else ""))
            return s
        key = plan_key(view, plan)
        for j, b in enumerate(self.budgets):
            if plan_key(view, driver.form(b, dp.sel)) == key:
                return self.launch0 + j
        raise Inexpressible(f"no launch budget in {list(self.budgets)} forms its batch ({describe(view, plan)})")


class SubsetMode(Mode):
    """``MultiBinary(K)``: the whole admission set in one step (budget: the env's ``budget``)."""

    name = "subset"

    def masks(self) -> np.ndarray:
        dp = self.dp
        m2 = np.zeros((self.K, 2), dtype=bool)
        m2[:, 0] = True
        m2[: len(dp.slots), 1] = dp.ok
        return m2.reshape(-1)

    def step(self, action) -> None:
        chosen = check_subset(action, self.dp.ok, self.K)
        if isinstance(chosen, str):
            self.driver.invalid(chosen)
            chosen = np.empty(0, np.int64)
        self.dp.filter([int(i) for i in chosen], stop_at_first=False)
        self.driver.launch(self.budget)

    def fallback(self) -> np.ndarray:
        """Admit nothing."""
        return np.zeros(self.K, np.int8)

    def expert(self, pol: Scheduler, plan: BatchPlan) -> np.ndarray:
        act = np.zeros(self.K, np.int8)
        slot_of = {r: i for i, r in enumerate(self.dp.slots)}
        act[[slot_of[r] for r in self._admissions(plan)]] = 1
        return act


class PriorityMode(Mode):
    """``Box(-1, 1, (K,))``: admit by decreasing score until the rule rejects; below 0 never."""

    name = "priority"

    def step(self, action) -> None:
        dp = self.dp
        scores = check_box(action, self.K, self.name)
        if isinstance(scores, str):
            self.driver.invalid(scores)
            self.driver.launch(self.budget)
            return
        s = scores[: len(dp.slots)]
        # by decreasing score, ties by slot; those scored >= 0 come first
        by_score = (-s).argsort(kind="stable")
        self.admit_ranked(by_score[: np.count_nonzero(s >= 0.0)].tolist())

    def admit_ranked(self, slots: list[int]) -> None:
        """The step of a valid action already ranked: ``slots``, the shown slots scored >= 0 by
        decreasing score (ties by slot), admitted in that order until the rule rejects one, then
        the launch. (The vector env ranks the scores of all its envs at once: ``rank_scores``.)"""
        self.dp.filter(slots, stop_at_first=True)
        self.driver.launch(self.budget)

    def expert(self, pol: Scheduler, plan: BatchPlan) -> np.ndarray:
        admitted = self._admissions(plan)
        scores = np.full(self.K, -1.0, np.float32)
        slot_of = {r: i for i, r in enumerate(self.dp.slots)}
        for rank, r in enumerate(admitted):
            scores[slot_of[r]] = 1.0 - rank / (len(admitted) + 1)
        return scores


def rank_scores(actions, n_shown: list[int], k: int | None = None) -> list[list[int] | None]:
    """:class:`PriorityMode`'s ranking of many envs' actions at once (rows of ``actions``, each of
    ``k`` scores when given; env ``i`` shows ``n_shown[i]`` slots): for each valid row the slots :meth:`PriorityMode.step`
    admits in order (``admit_ranked``'s argument), ``None`` for a row that is not a valid action
    (the env's own step then counts it as invalid). The same slots in the same order: sorting
    every row with the slots not shown at +inf puts the shown ones first, in their own stable
    order."""
    n = len(n_shown)
    if not (type(actions) is np.ndarray and actions.ndim == 2 and actions.shape[0] == n and actions.dtype.kind == "f"
            and (k is None or actions.shape[1] == k)):  # as check_box: a row of another width is invalid
        return [None] * n
    a = actions.astype(np.float64)
    ok = np.maximum.reduce(np.abs(a), axis=1, initial=0.0) <= 1.0  # (False for NaN)
    shown = np.arange(a.shape[1]) < np.array(n_shown)[:, None]
    order = np.where(shown, -a, np.inf).argsort(axis=1, kind="stable").tolist()
    counts = np.add.reduce(shown & (a >= 0.0), axis=1).tolist()
    return [order[i][: counts[i]] if valid else None for i, valid in enumerate(ok.tolist())]


class KnobMode(Mode):
    """``Box(-1, 1, (2,))``: Jaillet et al.'s alpha-protection margin and a prefill token budget."""

    name = "knob"

    def step(self, action) -> None:
        dp = self.dp
        knobs = check_box(action, len(KNOBS), self.name)
        if isinstance(knobs, str):
            self.driver.invalid(knobs)
        else:
            alpha, budget = knob_values(knobs, dp.cap_tokens)
            limit = (1.0 - alpha) * dp.cap_tokens
            used = self.driver.view.kv_used
            order, tokens, reserved = [], 0, 0
            for s, rid in enumerate(dp.slots):
                p = int(dp.target[rid])
                need = int(dp.need[rid]) * dp.bs
                if used + reserved + need > limit or tokens + p > budget:
                    break
                order.append(s)
                tokens += p
                reserved += need
            dp.filter(order, stop_at_first=True)
        self.driver.launch(self.budget)


class PolicyMode(Mode):
    """Modes whose action picks or parameterises a policy that forms the whole plan. With
    ``decide_every_s`` a decision holds for that many simulated seconds: the boundaries before
    then are not decisions and run the policy as the last action left it."""

    def __init__(self, driver: Driver, dp: DecisionPoint, k: int, policy: Scheduler,
                 decide_every_s: float | None = None) -> None:
        super().__init__(driver, dp, k)
        self.policy = policy
        self.decide_every_s = decide_every_s
        self._next_s = -math.inf

    def start(self) -> None:
        self._next_s = -math.inf

    def decides(self) -> bool:
        view = self.driver.view
        if self.decide_every_s is not None and view.now < self._next_s:
            return False
        return bool(view.waiting) or view.n_in_prefill > 0

    def between(self) -> BatchPlan:
        return self.policy.schedule(self.driver.view)

    def masks(self) -> np.ndarray:
        return np.ones(self.space.n if self.name == "meta" else self.K, bool)

    def run(self) -> None:
        view = self.driver.view
        if self.decide_every_s is not None:
            self._next_s = view.now + self.decide_every_s
        plan = self.policy.schedule(view)
        if view.waiting:
            plan.hold = False  # the next boundary is a decision again
        self.driver.run_plan(plan)


class MetaMode(PolicyMode):
    """``Discrete(len(candidates))``: action ``i`` executes candidate ``i``'s plan (a Switch)."""

    name = "meta"

    def __init__(self, driver: Driver, dp: DecisionPoint, k: int, switch: Scheduler,
                 decide_every_s: float | None = None) -> None:
        super().__init__(driver, dp, k, switch, decide_every_s)
        self.n = len(switch.candidates)

    @property
    def space(self):
        return action_space("meta", self.K, n_candidates=self.n)

    def step(self, action) -> None:
        err = discrete_error(action, self.n, self.name)
        if err:
            self.driver.invalid(err)
        else:
            self.policy.active = int(action)
        self.run()

    def expert(self, pol: Scheduler, plan: BatchPlan | None) -> int:
        for i, c in enumerate(self.policy.candidates):
            if c is pol:
                return i
        raise Inexpressible(f"{pol.name} is not one of the candidates "
                            f"({', '.join(c.name for c in self.policy.candidates)})")


class TuneMode(PolicyMode):
    """``Box(-1, 1, (n,))``: the base policy's parameters for this decision (log-uniform ranges)."""

    name = "tune"

    def __init__(self, driver: Driver, dp: DecisionPoint, k: int, base: Scheduler,
                 knobs: dict[str, tuple[float, float]], decide_every_s: float | None = None) -> None:
        super().__init__(driver, dp, k, base, decide_every_s)
        self.knobs = knobs
        self.params = type(self.policy).params

    @property
    def space(self):
        return action_space("tune", self.K, n_knobs=len(self.knobs))

    def masks(self) -> np.ndarray:
        return Mode.masks(self)

    def step(self, action) -> None:
        a = check_box(action, len(self.knobs), self.name)
        if isinstance(a, str):
            self.driver.invalid(a)
        else:
            for name, value in tune_values(a, self.knobs, self.params).items():
                setattr(self.policy, name, value)
        self.run()


MODES: dict[str, type[Mode]] = {m.name: m for m in (SelectMode, SubsetMode, PriorityMode, KnobMode, MetaMode, TuneMode)}


def make_mode(name: str, driver: Driver, dp: DecisionPoint, k: int, *, budgets: tuple[int | None, ...],
              budget: int | None, blind: bool, switch: Scheduler | None = None, base: Scheduler | None = None,
              tune: dict[str, tuple[float, float]] | None = None, decide_every_s: float | None = None) -> Mode:
    """The action mode ``name`` over ``driver`` and ``dp`` with ``k`` slots: ``select`` launches
    with ``budgets`` (its longest-remaining preempt masked when ``blind``), ``subset``,
    ``priority`` and ``knob`` with ``budget``; ``meta`` runs ``switch``'s candidates, ``tune``
    the ``base`` policy with knobs ``tune``, both deciding at most every ``decide_every_s``
    simulated seconds when it is set."""
    if name == "select":
        return SelectMode(driver, dp, k, budgets, blind)
    if name == "meta":
        return MetaMode(driver, dp, k, switch, decide_every_s)
    if name == "tune":
        return TuneMode(driver, dp, k, base, tune, decide_every_s)
    return MODES[name](driver, dp, k, budget)


__all__ = ["MODES", "Mode", "make_mode"]
