"""Expert replay for ``LLMSched-v1``: a policy's plan at this boundary and the action that
reproduces it (the translation itself is each action mode's ``expert``).

Plans are compared by what they do, not how they spell them (:func:`plan_key`): the chunk of
every prefill (``-1`` for the whole rest, whether written ``BatchPlan.FULL`` or as a count), the
paused requests and the preemptions. ``hold`` never matters: a fast-forward gives the same
results as the step-by-step run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmsched_gym.core.engine import WAITING, Engine
from llmsched_gym.core.scheduler import BatchPlan, EngineView, Scheduler
from llmsched_gym.env.settings import check_policy

HOOKS = ("on_arrival", "on_tokens", "on_prefill", "on_preempt", "on_finish")


class Inexpressible(ValueError):
    """A policy's plan that the action mode cannot express (the message says why)."""


class ExpertReplay:
    """Policies replayed through an env: the attached expert, other stateless policies, one
    plan per boundary and its translation by the action mode.

    :param mode: the env's action mode (a :class:`~llmsched_gym.env.modes.Mode`: its ``expert``
        translates a plan into an action, its ``fallback`` is the action of a plan it cannot).
    :param information: the task's information model (a policy that needs more is refused).
    """

    def __init__(self, mode: Any, information: str) -> None:
        self.mode = mode
        self.information = information
        self.expert: Scheduler | None = None
        self.others: dict[str, Scheduler] = {}
        self.plan_cache: tuple[int, int, BatchPlan] | None = None
        self.engine: Engine | None = None
        self.episode, self.seed = 0, 0

    def attach(self, expert: str | dict | Scheduler | None, switch: Any = None) -> Scheduler | None:
        """Resolve and keep the expert (``None``: none); in ``meta`` mode (``switch``, the
        candidates) it must be the candidate with the same name and parameters, which it becomes."""
        from llmsched_gym.sim import make_policy

        pol = None if expert is None else make_policy(expert)
        if pol is not None:
            check_policy(pol, self.information, "expert")
        if switch is not None and pol is not None:
            want = _spec_of(pol)
            match = [c for c in switch.candidates if _spec_of(c) == want]
            if not match:
                raise ValueError(f"expert: {pol.name} is not one of the candidates "
                                 f"({', '.join(c.name for c in switch.candidates)})")
            pol = match[0]
        self.expert = pol
        return pol

    def start(self, engine: Engine, episode: int, seed: int) -> None:
        """A new episode on ``engine`` (number ``episode``, workload seed ``seed``)."""
        self.engine, self.episode, self.seed = engine, episode, seed
        self.plan_cache = None

    def action(self, policy, strict: bool, bid: int):
        """See :meth:`~llmsched_gym.env.llmsched_env.LLMSchedEnv.expert_action` (``bid``: the
        decision point's boundary id, which keys the plan cache)."""
        mode = self.mode
        pol = self.resolve(policy)
        try:
            return mode.expert(pol, None if mode.name == "meta" else self.plan(pol, bid))
        except Inexpressible as err:
            if strict or mode.name in ("knob", "tune", "meta"):
                raise ValueError(f"expert_action(): {pol.name}'s plan cannot be expressed in {mode.name} mode: "
                                 f"{err}") from None
            return mode.fallback()

    def resolve(self, policy) -> Scheduler:
        """The policy to replay: the attached expert, or a stateless policy reset for this episode."""
        if policy is None or policy is self.expert:
            if self.expert is None:
                raise ValueError("expert_action(): no policy given and no expert attached (expert=...)")
            return self.expert
        if isinstance(policy, Scheduler):
            pol = policy
        else:
            key = repr(policy)
            pol = self.others.get(key)
            if pol is None:
                from llmsched_gym.sim import make_policy

                pol = self.others[key] = make_policy(policy)
        from baselines import check_applicable

        check_applicable(pol, self.information)  # NotApplicable: it needs what the task does not give
        stateful = [h for h in HOOKS if type(pol).wants(h)]
        if stateful:
            raise ValueError(
                f"expert_action(): {pol.name} uses engine hooks ({', '.join(stateful)}); attach it with "
                "expert=... (or set_expert() before reset) so it sees the whole episode"
            )
        if getattr(pol, "_env_episode", None) != self.episode:
            pol.reset(self.engine.config, np.random.default_rng([self.seed, 17]))
            pol._env_episode = self.episode  # type: ignore[attr-defined]
        return pol

    def plan(self, pol: Scheduler, bid: int) -> BatchPlan:
        """``pol``'s plan at this boundary (its ``schedule`` runs once per boundary)."""
        key = (id(pol), bid)
        if self.plan_cache is not None and self.plan_cache[:2] == key:
            return self.plan_cache[2]
        plan = pol.schedule(self.engine.view)
        self.plan_cache = (*key, plan)
        return plan


def _spec_of(pol: Scheduler) -> tuple:
    """A policy's name and parameters (to find an expert among ``meta`` candidates)."""
    return pol.name, tuple(sorted((k, repr(getattr(pol, k, None))) for k in type(pol).params))


def plan_admissions(view: EngineView, plan: BatchPlan) -> list[int]:
    """Waiting requests ``plan`` admits, in its order; raises Inexpressible for what no slot
    mode can do (idling while requests run, skipping decodes)."""
    if plan.idle and (view.running or plan.prefill):
        raise Inexpressible("it idles while requests run (no action pauses every request)")
    if not plan.decode and (view.running or plan.prefill):
        raise Inexpressible("it runs a prefill-only batch (decode=False)")
    state = view.state
    return [int(r) for r in plan.prefill if state[r] == WAITING]


def plan_key(view: EngineView, plan: BatchPlan) -> tuple:
    """What a plan does, independent of how it spells it: chunks (-1: the whole rest), paused
    requests, preemptions."""
    target, state, prefilled = view.prefill_target, view.state, view.prefilled
    chunks = []
    for rid, c in plan.prefill.items():
        whole = int(target[rid]) - (view.prefix_match(rid) if state[rid] == WAITING else int(prefilled[rid]))
        chunks.append((int(rid), -1 if c == 0 or c >= whole else int(c)))
    return tuple(chunks), frozenset(int(r) for r in plan.pause), tuple(int(r) for r in plan.preempt)


def describe(view: EngineView, plan: BatchPlan) -> str:
    """A plan in a few words (for error messages)."""
    ch, pause, pre = plan_key(view, plan)
    return f"prefill {list(ch)}, {len(pause)} paused, preempt {list(pre)}"
