"""The arguments of ``LLMSched-v1``, checked before anything is built.

Every scalar argument goes through one schema (:data:`ENV_ARGS`, made of the project's
:class:`~llmsched_gym.config.Setting` entries, as the engine section of a scenario is), so bad input
is one :class:`~llmsched_gym.config.ConfigError` line naming the argument and what is allowed
(``K: expected an integer in [1, 4,096], got 0``). The structured ones have their own checks:
``budgets`` (:func:`~llmsched_gym.env.actions.check_budgets`), ``reward``
(:func:`~llmsched_gym.env.reward.parse_weights`), ``tune``
(:func:`~llmsched_gym.env.actions.check_tune`), and the scenario with its ``overrides``
(:func:`~llmsched_gym.core.scenarios.resolve_scenario`).

:func:`mode_policies` builds the policies of the ``meta`` and ``tune`` modes and refuses, in one
line, what the scenario's information model cannot feed (``baselines.NotApplicable``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from baselines import NotApplicable, applicable, check_applicable
from llmsched_gym.config import ConfigError, Setting
from llmsched_gym.core.information import BLIND
from llmsched_gym.core.scheduler import Scheduler
from llmsched_gym.env.actions import ACTION_MODES, DEFAULT_TUNE, INVALID_ACTION, check_tune
from llmsched_gym.env.admission import ADMISSION_RULES
from llmsched_gym.env.decision import ORDERS

MAX_K = 4096
"""Most queue slots ``K`` an observation may hold: the observation and mask arrays grow with K (at
K = 10^7 a 50-request episode took 2.2 GB)."""
RENDER_MODES = ("ansi", "rgb_array")

ENV_ARGS: dict[str, Setting] = {
    "action_mode": Setting("str", choices=ACTION_MODES),
    "order": Setting("str", choices=ORDERS),
    "admission": Setting("str", choices=ADMISSION_RULES),
    "invalid_action": Setting("str", choices=INVALID_ACTION),
    "K": Setting("int", ge=1, le=MAX_K),
    "budget": Setting("int", ge=1),
    "max_num_seqs": Setting("int", ge=1),
    "render_mode": Setting("str", choices=RENDER_MODES),
    "invalid_penalty": Setting("float"),
    "flat": Setting("bool"),
    "n_requests": Setting("int", ge=0),
    "horizon_s": Setting("float", gt=0),
    "decide_every_s": Setting("float", gt=0),
    "overrides": Setting("dict"),
}
"""The env's scalar arguments (in the order they are checked)."""
OPTIONAL = ("budget", "max_num_seqs", "render_mode", "n_requests", "horizon_s", "decide_every_s")
"""Arguments that may be ``None`` (their default: unlimited, none, or the scenario's)."""

ENGINE_POLICIES = ("fcfs", "sjf", "srpt", "sarathi", "vllm-v1", "vllm-v0")
"""The engine policies every ``meta`` mode offers by default."""
PAPER_POLICIES = {
    "jaillet": ("mcsf", "alpha-beta", "alpha-greedy"),
    "vtc": ("vtc", "lcf"),
    "klpm": ("lpm", "k-lpm", "sglang-lpm"),
    "echo": ("echo", "echo-bs"),
    "wait": ("wait", "nested-wait"),
    "nested": ("wait", "nested-wait"),
}
"""The paper policies ``meta`` adds by default, by the scenario name's first word."""


def default_candidates(scenario_name: str) -> list[str]:
    """``meta`` mode's default candidates for a scenario: the engine policies, then its paper's."""
    extra = PAPER_POLICIES.get(str(scenario_name).split("-")[0], ())
    return list(ENGINE_POLICIES) + [p for p in extra if p not in ENGINE_POLICIES]


def check_args(**args: Any) -> dict[str, Any]:
    """``args`` (a subset of :data:`ENV_ARGS`' names) checked and in their canonical types.

    :raises ConfigError: naming the first argument that fails, e.g. ``order: expected one of
        arrival, shortest, prompt, deadline, got 'lifo'``.
    """
    return {name: None if args[name] is None and name in OPTIONAL else ENV_ARGS[name].check(name, args[name])
            for name in ENV_ARGS if name in args}


def scenario_overrides(overrides: Mapping[str, Any] | None, n_requests: int | None, horizon_s: float | None,
                       latency: str | dict | None) -> dict[str, Any]:
    """The dotted overrides the env applies to its scenario: ``overrides``, then the shorthands
    ``n_requests`` (``workload.n_requests``), ``horizon_s`` (``engine.horizon_s``) and ``latency``."""
    out = dict(overrides or {})
    if n_requests is not None:
        out["workload.n_requests"] = n_requests
    if horizon_s is not None:
        out["engine.horizon_s"] = horizon_s
    if latency is not None:
        out["latency"] = latency
    return out


def check_information(order: str, admission: str, information: str) -> None:
    """``NotApplicable`` when the slot order or the admission rule needs output-length
    predictions and the task is ``blind``."""
    for name, value, choices, needs in (("order", order, ORDERS, order == "shortest"),
                                        ("admission", admission, ADMISSION_RULES, admission == "future")):
        if needs and information == BLIND:
            raise NotApplicable(f"{name}: {value!r} needs output-length predictions; the task is blind "
                                f"(allowed: {', '.join(x for x in choices if x != value)})")


def check_policy(policy: Scheduler, information: str, arg: str) -> None:
    """``NotApplicable`` naming the argument when ``policy`` needs what the task does not give."""
    try:
        check_applicable(policy, information)
    except NotApplicable as e:
        raise NotApplicable(f"{arg}: {e}") from None


@dataclass
class ModePolicies:
    """The policies an action mode drives: ``meta``'s Switch, ``tune``'s base and its knobs."""

    switch: Scheduler | None = None
    base: Scheduler | None = None
    tune: dict[str, tuple[float, float]] | None = None


def mode_policies(action_mode: str, candidates: list | None, base: str | dict, tune: dict | None,
                  scenario_name: str, information: str) -> ModePolicies:
    """The ``meta`` candidates (default: :func:`default_candidates` that the information model
    allows) as one Switch, or the ``tune`` base policy and its knobs (default
    :data:`~llmsched_gym.env.actions.DEFAULT_TUNE`); nothing for the slot modes."""
    from llmsched_gym.sim import make_policy

    if action_mode != "meta" and candidates is not None:
        raise ConfigError(f"candidates: only meta mode takes candidates (action_mode={action_mode!r})")
    if action_mode == "meta":
        from llmsched_gym.core.switch import Switch

        if candidates is not None:
            specs = candidates
        else:  # the defaults the task's information model allows
            specs = [c for c in default_candidates(scenario_name) if applicable(c, information)[0]]
        if not specs:
            raise ConfigError("candidates: meta mode needs at least one policy")
        switch = Switch([make_policy(c) for c in specs])
        check_policy(switch, information, "candidates")
        return ModePolicies(switch=switch)
    if action_mode == "tune":
        pol = make_policy(base)
        check_policy(pol, information, "base")
        return ModePolicies(base=pol, tune=check_tune(tune if tune is not None else DEFAULT_TUNE, type(pol).params))
    return ModePolicies()


__all__ = ["ENGINE_POLICIES", "ENV_ARGS", "MAX_K", "PAPER_POLICIES", "ModePolicies", "check_args",
           "default_candidates", "mode_policies"]
