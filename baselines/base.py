"""Registry of scheduling policies and shared helpers.

A new baseline costs one file with a decorated class::

    @register("my-policy")
    class MyPolicy(Scheduler):
        params = {"alpha": 0.1}
        def schedule(self, view): ...

and, for one in this package, one line in the catalogue (``baselines.POLICIES``:
``"my-policy": PolicyEntry("my_module:MyPolicy", {"alpha": 0.1})``), so that it is listed without
importing its module. ``make_policy("my-policy", alpha=0.2)`` builds it; a parameter not listed in
``params``, or of another type than its default (``True`` for an integer, ``"no"`` for a boolean),
is rejected with a one-line error naming the parameter and what is allowed.

Under the ``forbid`` overflow handler the engine refuses a plan whose KV does not fit, and a
policy without a memory guarantee (FCFS admitting on the current free memory, VTC, a heuristic fed
noisy lengths) would abort the whole run. ``register`` therefore passes every registered policy's
plans through :func:`fit_plan`, which changes only a plan the engine would refuse: it drops the
newest admissions, then preempts the newest running requests (vLLM's rule), until the iteration
fits. A plan that fits is returned as it is, so runs that never overflow are unchanged. A
dropped admission goes back to the policy's own queue through its ``on_preempt`` hook, as when
the engine preempts a request just admitted.
"""

from __future__ import annotations

import functools
from typing import Any

from llmsched_gym.config import ConfigError, coerce_like
from llmsched_gym.core.information import reason_not_applicable
from llmsched_gym.core.scheduler import BatchPlan, EngineView, Scheduler

WAITING, RUNNING = 1, 2

REGISTRY: dict[str, type[Scheduler]] = {}


class PolicyError(ConfigError):
    """Unknown policy or bad policy parameter."""


class NotApplicable(PolicyError):
    """The policy needs output-length information the task's information model does not give
    (``"sjf needs output-length predictions; the task is blind"``)."""


def policy_label(policy: Scheduler) -> str:
    """``name`` plus the parameters that differ from their defaults (``mcsf:oracle=true``)."""
    def show(v: Any) -> str:  # as NAME:key=value specs write it
        return str(v).lower() if isinstance(v, bool) else repr(v).replace("'", "")

    changed = [f"{k}={show(getattr(policy, k))}" for k, d in type(policy).params.items()
               if hasattr(policy, k) and getattr(policy, k) != d]
    return f"{policy.name}:{','.join(changed)}" if changed else policy.name


def check_applicable(policy: Scheduler, information: str) -> None:
    """Raise :class:`NotApplicable` (one line) if ``policy.needs()`` exceeds ``information``
    (for a :class:`~llmsched_gym.core.switch.Switch`, the reason names the first candidate)."""
    from llmsched_gym.core.switch import Switch

    for p in policy.candidates if isinstance(policy, Switch) else [policy]:
        reason = reason_not_applicable(policy_label(p), p.needs(), information)
        if reason is not None:
            raise NotApplicable(reason)


def register(name: str):
    """Class decorator adding a Scheduler to the registry under ``name``."""

    def deco(cls: type[Scheduler]) -> type[Scheduler]:
        if name in REGISTRY and REGISTRY[name] is not cls:
            raise PolicyError(f"policy {name!r} registered twice")
        cls.name = name
        REGISTRY[name] = cls
        if not getattr(cls.schedule, "fits_memory", False):
            cls.schedule = _fitted(cls.schedule)
        return cls

    return deco


def configure(obj: Scheduler, kwargs: dict[str, Any]) -> None:
    """Set ``params`` defaults on ``obj``, overridden by ``kwargs`` (type-coerced, validated)."""
    allowed = type(obj).params
    for key in kwargs:
        if key not in allowed:
            names = ", ".join(sorted(allowed)) or "none"
            raise PolicyError(f"policy.{key}: unknown parameter of {type(obj).name!r}; allowed: {names}")
    for key, default in allowed.items():
        value = kwargs.get(key, default)
        try:
            value = coerce_like(f"policy.{key}", value, default)
        except ConfigError as e:
            raise PolicyError(str(e)) from None
        setattr(obj, key, value)


def fits_now(view: EngineView, rid: int, extra_tokens: int = 0) -> bool:
    """Whether ``rid``'s prompt (minus cached prefix) plus its first token fits in free KV."""
    need = int(view.prompt_tokens[rid]) + 1 + extra_tokens
    return view.blocks_for(need) * view.block_size <= view.kv_free


def finish_prefills(view: EngineView) -> tuple[list[int], int]:
    """The unfinished prefills a whole-prefill policy finishes this iteration, and their blocks.

    A whole-prefill policy never leaves a running request mid-prefill, but in the env's ``meta``
    mode another policy's chunked prefill (Sarathi, vLLM v1, Echo) can; the policy then finishes
    it (``BatchPlan.FULL``), as it continues every running request, instead of leaving it stuck
    with its KV. Running requests in admission order, while the rest of their prompt (and token 1
    when prefill emits it) fits in the free blocks this iteration's decodes leave; the caller
    takes the returned blocks off its own free-memory estimate. Empty in a single-policy run.
    """
    if not view.n_in_prefill:
        return [], 0
    prefilled, target, led = view.prefilled, view.prefill_target, view.ledger
    running = view.running
    free = view.kv_free // view.block_size - sum(led.decode(r) for r in running if prefilled[r] >= target[r])
    out: list[int] = []
    used = 0
    for r in running:
        if prefilled[r] < target[r]:
            need = led.owed(r)
            if need > free:
                break
            free -= need
            used += need
            out.append(r)
    return out, used


def _fitted(schedule):
    """``schedule`` whose plans pass :func:`fit_plan` (module docstring)."""

    @functools.wraps(schedule)
    def wrapper(self: Scheduler, view: EngineView) -> BatchPlan:
        plan = schedule(self, view)
        fitted = fit_plan(view, plan)
        if fitted is not plan and self.wants("on_preempt"):
            # an admission the policy counted on went back to the queue, as if preempted at once
            state = view.state
            for rid in plan.prefill:
                if rid not in fitted.prefill and state[rid] == WAITING:
                    self.on_preempt(rid, view)
        return fitted

    wrapper.fits_memory = True  # type: ignore[attr-defined]
    return wrapper


def fit_plan(view: EngineView, plan: BatchPlan) -> BatchPlan:
    """``plan``, or under ``overflow="forbid"`` a plan the engine accepts when ``plan`` would
    overflow: the admissions are cut to the longest prefix (in the plan's order) that fits, and if
    the running requests alone overflow, the newest of them are preempted (vLLM's rule, with the
    engine's ``preempt_mode``) until the iteration fits. The result never ``hold``s."""
    if view.config.overflow != "forbid" or plan.idle:
        return plan
    led, running = view.ledger, view.running
    if led.surely_fits(plan, len(running)) or led.shortfall(plan, running) <= 0:
        return plan
    state = view.state
    preempt = list(plan.preempt)
    keep = {r: c for r, c in plan.prefill.items() if state[r] == RUNNING and r not in preempt}
    new = [r for r in plan.prefill if r not in keep]

    def with_admissions(n: int) -> BatchPlan:
        return BatchPlan(prefill={**keep, **{r: plan.prefill[r] for r in new[:n]}}, preempt=preempt,
                         decode=plan.decode, pause=plan.pause)

    lo, hi = 0, len(new) - 1  # the longest admission prefix that fits: shortfall grows with it
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if led.shortfall(with_admissions(mid), running) <= 0:
            lo = mid
        else:
            hi = mid - 1
    fitted = with_admissions(lo)
    victims = [r for r in running if r not in preempt]
    while led.shortfall(fitted, running) > 0 and victims:
        rid = victims.pop()
        preempt.append(rid)
        keep.pop(rid, None)
        fitted = BatchPlan(prefill={**keep}, preempt=preempt, decode=plan.decode,
                           pause=frozenset(plan.pause) - {rid})
    return fitted
