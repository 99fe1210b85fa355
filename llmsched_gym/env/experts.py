"""Expert replay for ``LLMSched-v1``: a policy's plan at this boundary and the action that
reproduces it (the translation itself is each action mode's ``expert``).

Plans are compared by what they do, not how they spell them (:func:`plan_key`): the chunk of
every prefill (``-1`` for the whole rest, whether written ``BatchPlan.FULL`` or as a count), the
paused requests and the preemptions. ``hold`` never matters: a fast-forward gives the same
results as the step-by-step run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from llmsched_gym.core.engine import WAITING
from llmsched_gym.core.scheduler import BatchPlan, Scheduler

if TYPE_CHECKING:
    from llmsched_gym.env.llmsched_env import LLMSchedEnv

HOOKS = ("on_arrival", "on_tokens", "on_prefill", "on_preempt", "on_finish")


class Inexpressible(ValueError):
    """A policy's plan that the action mode cannot express (the message says why)."""


class ExpertReplay:
    """Policies replayed through an env: resolution, one plan per boundary, translation."""

    def __init__(self, env: LLMSchedEnv) -> None:
        self.env = env
        self.others: dict[str, Scheduler] = {}
        self.plan_cache: tuple[int, int, BatchPlan] | None = None

    def action(self, policy, strict: bool):
        """See :meth:`LLMSchedEnv.expert_action`."""
        env = self.env
        pol = self.resolve(policy)
        try:
            return env._mode.expert(pol, None if env.mode == "meta" else self.plan(pol))
        except Inexpressible as err:
            if strict or env.mode in ("knob", "tune", "meta"):
                raise ValueError(f"expert_action(): {pol.name}'s plan cannot be expressed in {env.mode} mode: "
                                 f"{err}") from None
            return env.fallback_action()

    def resolve(self, policy) -> Scheduler:
        """The policy to replay: the attached expert, or a stateless policy reset for this episode."""
        env = self.env
        if policy is None or policy is env._expert:
            if env._expert is None:
                raise ValueError("expert_action(): no policy given and no expert attached (expert=...)")
            return env._expert
        if isinstance(policy, Scheduler):
            pol = policy
        else:
            key = repr(policy)
            pol = self.others.get(key)
            if pol is None:
                from llmsched_gym.sim import make_policy

                pol = self.others[key] = make_policy(policy)
        from baselines import check_applicable

        check_applicable(pol, env.information)  # NotApplicable: it needs what the task does not give
        stateful = [h for h in HOOKS if type(pol).wants(h)]
        if stateful:
            raise ValueError(
                f"expert_action(): {pol.name} uses engine hooks ({', '.join(stateful)}); attach it with "
                "expert=... (or set_expert() before reset) so it sees the whole episode"
            )
        if getattr(pol, "_env_episode", None) != env._episode:
            pol.reset(env.engine.config, np.random.default_rng([env._episode_seed, 17]))
            pol._env_episode = env._episode  # type: ignore[attr-defined]
        return pol

    def plan(self, pol: Scheduler) -> BatchPlan:
        """``pol``'s plan at this boundary (its ``schedule`` runs once per boundary)."""
        key = (id(pol), self.env.dp.bid)
        if self.plan_cache is not None and self.plan_cache[:2] == key:
            return self.plan_cache[2]
        plan = pol.schedule(self.env.engine.view)
        self.plan_cache = (*key, plan)
        return plan


def plan_admissions(env: LLMSchedEnv, plan: BatchPlan) -> list[int]:
    """Waiting requests ``plan`` admits, in its order; raises Inexpressible for what no slot
    mode can do (idling while requests run, skipping decodes)."""
    e = env.engine
    if plan.idle and (e.running or plan.prefill):
        raise Inexpressible("it idles while requests run (no action pauses every request)")
    if not plan.decode and (e.running or plan.prefill):
        raise Inexpressible("it runs a prefill-only batch (decode=False)")
    state = e.state
    return [int(r) for r in plan.prefill if state[r] == WAITING]


def plan_key(env: LLMSchedEnv, plan: BatchPlan) -> tuple:
    """What a plan does, independent of how it spells it: chunks (-1: the whole rest), paused
    requests, preemptions."""
    e = env.engine
    view = e.view
    chunks = []
    for rid, c in plan.prefill.items():
        whole = int(e.prefill_target[rid]) - (view.prefix_match(rid) if e.state[rid] == WAITING
                                              else int(e.prefilled[rid]))
        chunks.append((int(rid), -1 if c == 0 or c >= whole else int(c)))
    return tuple(chunks), frozenset(int(r) for r in plan.pause), tuple(int(r) for r in plan.preempt)


def describe(env: LLMSchedEnv, plan: BatchPlan) -> str:
    """A plan in a few words (for error messages)."""
    ch, pause, pre = plan_key(env, plan)
    return f"prefill {list(ch)}, {len(pause)} paused, preempt {list(pre)}"
