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

import numpy as np

from llmsched_gym.config import ConfigError, coerce_like
from llmsched_gym.core.batching import chunk_blocks, decode_blocks
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
    prefilled, target, kvt = view.prefilled, view.prefill_target, view.kv_tokens
    running = view.running
    free = view.kv_free // view.block_size - sum(decode_blocks(view, r) for r in running if prefilled[r] >= target[r])
    out: list[int] = []
    used = 0
    for r in running:
        if prefilled[r] < target[r]:
            need = chunk_blocks(view, r, int(kvt[r]), int(target[r] - prefilled[r]))
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


def plan_shortfall(view: EngineView, plan: BatchPlan) -> int:
    """Blocks by which ``plan`` would exceed the KV capacity (``<= 0``: it fits), counted as the
    engine counts them: the plan's preemptions free their blocks first (shared prefix blocks only
    when no one else holds them), admissions then take their cached prefix blocks (idle ones become
    used) or their swapped-out KV back, and the chunks and decodes of the iteration grow."""
    kv, bs, cfg = view.kv, view.block_size, view.config
    kvt, prefilled, target, gen, state = view.kv_tokens, view.prefilled, view.prefill_target, view.generated, view.state
    swapped = view.swapped
    used = kv.used_blocks
    refs: dict[int, int] = {}  # reference counts this plan changes

    def ref(h: int) -> int:
        return refs[h] if h in refs else kv.references(h)

    # 1. preemptions: the victim's state after it (kv tokens, prefilled, target, swapped)
    after: dict[int, tuple[int, int, int, bool]] = {}
    swap_s = False
    for rid in plan.preempt:
        k, shared = int(kvt[rid]), int(kv.shared[rid])
        used -= -(-k // bs) - shared
        for h in kv.block_hashes(rid)[:shared] if shared else ():
            refs[h] = ref(h) - 1
            used -= refs[h] == 0
        if cfg.preempt_mode == "swap":
            after[rid] = (k, int(prefilled[rid]), int(target[rid]), True)
            swap_s |= k > 0
        elif cfg.preempt_mode == "restart":
            after[rid] = (0, 0, int(view.prompt_tokens[rid]), False)
        else:
            after[rid] = (0, 0, int(view.prompt_tokens[rid] + gen[rid]), False)
    # 2. decodes of the requests running before the admissions
    dec: list[int] | np.ndarray = []
    if plan.decode:
        gone = after.keys() | plan.pause
        dec = [r for r in view.running if r not in gone and prefilled[r] >= target[r]]
    # 3. admissions and chunks
    chunks: list[tuple[int, int, int, int]] = []  # (rid, chunk, kv tokens, prefill left)
    for rid, chunk in plan.prefill.items():
        if rid in after:
            k, p, t, sw = after[rid]
        elif state[rid] == WAITING:
            k, p, t, sw = int(kvt[rid]), int(prefilled[rid]), int(target[rid]), bool(swapped[rid])
        else:  # a running request continues its prefill
            chunks.append((rid, chunk, int(kvt[rid]), int(target[rid] - prefilled[rid])))
            continue
        if sw:
            used += -(-k // bs)
            swap_s |= k > 0
        elif kv.enabled:
            m = kv.match_blocks(rid)
            for h in kv.block_hashes(rid)[:m]:
                r = ref(h)
                used += r == 0
                refs[h] = r + 1
            k = p = m * bs
        chunks.append((rid, chunk, k, t - p))
    if swap_s:  # swapped-in requests whose prefill was complete resume decoding (the engine's rule)
        resumed = [(rid, k) for rid, _, k, left in chunks if left <= 0]
        chunks = [x for x in chunks if x[3] > 0]
        if plan.decode:
            dec = list(dec) + [rid for rid, _ in resumed]
    grow = 0
    emits = cfg.prefill_emits_token
    for _, chunk, k, left in chunks:
        c = left if chunk == 0 or chunk > left else chunk
        grow += -(-(k + c + (1 if c == left and emits else 0)) // bs) - -(-k // bs)
    if len(dec):
        if bs == 1:
            grow += len(dec)
        else:
            ks = np.array([int(kvt[r]) if r not in after else after[r][0] for r in dec], dtype=np.int64)
            grow += int(np.count_nonzero(ks % bs == 0))
    return used + grow - kv.capacity_blocks


def _surely_fits(view: EngineView, plan: BatchPlan) -> bool:
    """A cheap upper bound on the plan's growth fits (the common case: no exact count needed)."""
    bs = view.block_size
    kvt, prefilled, target = view.kv_tokens, view.prefilled, view.prefill_target
    room = view.kv.capacity_blocks - view.kv.used_blocks - len(view.running)
    for rid in plan.prefill:
        room -= -(-(int(kvt[rid]) + int(target[rid] - prefilled[rid]) + 1) // bs) + 1
        if room < 0:
            return False
    return room >= 0


def fit_plan(view: EngineView, plan: BatchPlan) -> BatchPlan:
    """``plan``, or under ``overflow="forbid"`` a plan the engine accepts when ``plan`` would
    overflow: the admissions are cut to the longest prefix (in the plan's order) that fits, and if
    the running requests alone overflow, the newest of them are preempted (vLLM's rule, with the
    engine's ``preempt_mode``) until the iteration fits. The result never ``hold``s."""
    if view.config.overflow != "forbid" or plan.idle or _surely_fits(view, plan):
        return plan
    if plan_shortfall(view, plan) <= 0:
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
        if plan_shortfall(view, with_admissions(mid)) <= 0:
            lo = mid
        else:
            hi = mid - 1
    fitted = with_admissions(lo)
    victims = [r for r in view.running if r not in preempt]
    while plan_shortfall(view, fitted) > 0 and victims:
        rid = victims.pop()
        preempt.append(rid)
        keep.pop(rid, None)
        fitted = BatchPlan(prefill={**keep}, preempt=preempt, decode=plan.decode,
                           pause=frozenset(plan.pause) - {rid})
    return fitted
