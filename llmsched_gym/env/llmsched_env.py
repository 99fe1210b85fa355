"""``LLMSched-v1``: the Gymnasium environment (its class docstring is the manual)."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from baselines import NotApplicable, applicable, check_applicable
from llmsched_gym.config import ConfigError, Setting
from llmsched_gym.core.batching import BatchBuilder
from llmsched_gym.core.engine import RUNNING, WAITING, Engine
from llmsched_gym.core.information import BLIND, information_of
from llmsched_gym.core.metrics import summarize
from llmsched_gym.core.scenarios import resolve_scenario
from llmsched_gym.core.scheduler import BatchPlan, EngineView, Scheduler
from llmsched_gym.env import ENV_ID
from llmsched_gym.env import observation as obs_mod
from llmsched_gym.env.actions import (
    ACTION_MODES,
    DEFAULT_BUDGETS,
    DEFAULT_TUNE,
    INVALID_ACTION,
    InvalidActionError,
    check_budgets,
    check_tune,
)
from llmsched_gym.env.admission import ADMISSION_RULES
from llmsched_gym.env.decision import ORDERS, DecisionPoint
from llmsched_gym.env.experts import ExpertReplay
from llmsched_gym.env.modes import MODES
from llmsched_gym.env.reward import RewardTracker, parse_weights

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


MAX_K = 4096
"""Most queue slots ``K`` an observation may hold: the observation and mask arrays grow with K (at
K = 10^7 a 50-request episode took 2.2 GB)."""


class LLMSchedEnv(gym.Env):
    """LLM inference scheduling under a KV-cache limit: the agent forms each batch.

    **Description.** One GPU worker serves a seeded workload of requests (arrival time, prompt
    length, output length, optionally a predicted length, a client, a task class with SLOs, prefix
    segments). At every iteration boundary a batch is formed and run for one iteration; the agent
    decides what the batch holds. Everything else (time, KV memory, prefix cache, overflow
    handling, completions) is the project's engine (``llmsched_gym.core.engine``), the same one
    the baselines run, on the same seeded workload (``llmsched_gym.sim.simulate``).

    **Batches** are formed as vLLM and Sarathi-Serve form them
    (:class:`~llmsched_gym.core.batching.BatchBuilder`, shared with ``baselines/sarathi.py`` and
    ``vllm.py``): the running requests decode first, one token of the iteration's token budget
    each (those the budget does not reach are paused); unfinished prefills continue with what the
    budget leaves; then the admitted requests, in the order chosen, each get a chunk
    ``min(prompt - cached prefix, budget left)``; a chosen request the budget no longer reaches
    stays in the queue. An unlimited budget (``None``) prefills whole prompts. Preempted requests
    (recompute) go back to the head of the queue. If the batch does not fit in the KV cache the
    engine's overflow handler evicts the newest running requests (vLLM).

    **Decision epochs.** The agent is asked at every boundary where something can be decided: one
    of the ``K`` visible waiting requests passes the admission rule, or a prefill is unfinished
    (how big its next chunk is); in ``meta`` and ``tune`` modes, whenever a request waits or a
    prefill is unfinished. Other boundaries are simulated without asking (decode the running
    requests with the last budget, fast-forwarded while nothing changes, or wait for the next
    arrival) and their reward is added to the next step.

    **Information.** What the agent may know about output lengths is the scenario's information
    model (:mod:`llmsched_gym.core.information`, from ``workload.predictor``; ``env.information``,
    ``info["information"]`` and the summary's ``information`` name it): ``clairvoyant`` (the
    features named *predicted* are the true lengths), ``predicted`` (a predictor's lengths, with
    its error) or ``blind`` (no output-length information). Under ``blind`` the observation carries
    nothing that depends on output lengths before they show (two workloads that differ only in
    output lengths give identical observations until the first completion): the queue's
    ``predicted_output`` is the tokens the request generated so far (non-zero after a recompute
    preemption), ``uncertainty`` is 1, ``fits_future`` 0, the running part's
    ``remaining_hist_*`` counts tokens generated so far instead (attained service, same bins) and
    ``future_peak`` is 0; what needs predictions is refused in one line (``order="shortest"``,
    ``admission="future"``, a ``meta`` candidate, ``tune`` base or expert that needs them:
    ``baselines.NotApplicable``) or masked (``select``'s preempt-longest action). Prompt length,
    age, prefix hits, service, SLO slack and the running set's KV are legitimate under every model.

    **Slots.** Slots ``0..K-1`` show the first ``K`` waiting requests not chosen yet, in the
    canonical order ``order``: ``arrival`` (the engine's queue order: arrival order, with
    preempted requests back at the head as in vLLM), ``shortest`` (predicted remaining output,
    ties by queue order; not under ``blind``), ``prompt`` (tokens to prefill) or ``deadline``
    (TTFT deadline; requests without one last).

    **Action space** (``action_mode``):

    * ``select`` (default): ``Discrete(K + B + 2)`` with ``B = len(budgets)``. Action ``i < K``
      adds slot ``i`` to the batch being formed (the slots shift: the chosen request leaves the
      queue view); action ``K + j`` launches the batch with token budget ``budgets[j]`` (default
      ``(None, 8192, 4096, 2048, 1024, 512, 256, 128)``: unlimited, vLLM v1's default and the
      Sarathi-Serve chunk sizes, so ``K`` launches whole prefills); action ``K + B`` preempts the
      newest running request (vLLM's victim) and ``K + B + 1`` the one with the longest predicted
      remaining output (SRPT's; masked under ``blind``). Several steps form one batch.
    * ``subset``: ``MultiBinary(K)``: the whole admission set in one step; chosen slots are admitted
      in slot order, skipping those the admission rule rejects given the ones before; the batch
      launches with the fixed ``budget``.
    * ``priority``: ``Box(-1, 1, (K,))`` scores; requests are admitted by decreasing score (ties
      by slot) until the first one the rule rejects; slots scored below 0 are never admitted.
    * ``knob``: ``Box(-1, 1, (2,))``: Jaillet et al. (2025)'s alpha-protection FCFS: ``alpha =
      0.25 (a0 + 1)`` in [0, 0.5] and a prefill budget ``max_batch_tokens`` log-uniform in [16, M]
      from ``a1``; slots are admitted in order while ``KV used + chosen + prompt <= (1 - alpha) M``,
      the budget and the admission rule allow.
    * ``meta``: ``Discrete(len(candidates))``: action ``i`` runs candidate policy ``i``'s plan at
      this boundary (and at the following non-decision boundaries). Every candidate sees every
      engine hook, so stateful policies (VTC counters, k-LPM trees, Echo's pools) stay consistent
      when the agent switches (:class:`~llmsched_gym.core.switch.Switch`). Default candidates:
      the engine policies (fcfs, sjf, srpt, sarathi, vllm-v1, vllm-v0) and the scenario's paper
      policies.
    * ``tune``: ``Box(-1, 1, (n,))``: the parameters of the ``base`` policy (default ``sarathi``)
      for this decision, each log-uniform in its range (``tune``, default ``chunk_size`` in
      [32, 8192] and ``max_num_seqs`` in [16, 1024]: action 0 is Sarathi's defaults 512 and 128).

    **Admission rule** (``admission``), the mask of the slot modes: ``none`` (default): any waiting
    request (an overflow is left to the engine's handler and paid for in the reward); ``current``:
    the request's prefill fits in the KV free after this iteration's decode growth, the blocks
    unfinished prefills still owe and the batch so far; ``future``: Jaillet et al.'s Eq. (1)
    future-peak test (MC-SF) with predicted output lengths, in iterations. ``max_num_seqs`` caps
    the running requests plus those chosen.

    **Masks.** ``action_masks()`` (bool, for sb3-contrib) and ``info["action_mask"]`` (int8) are
    fresh arrays: ``select``: ``K + B + 2`` entries, the launches always valid, the preempts
    while a running request is left; ``subset``: ``2K`` entries, ``[choose 0, choose 1]`` per
    slot (sb3-contrib's MultiBinary layout); ``meta``: all candidates; ``priority``/``knob``/
    ``tune``: ``K`` entries telling which slots are admissible now (information only). Where to
    reach them: ``info["action_mask"]`` from ``reset`` and every ``step`` (a Gymnasium vector env
    stacks it: ``infos["action_mask"]`` is ``(n_envs, n)``); through wrappers (``gymnasium.make``
    adds ``TimeLimit``, which has no ``action_masks``) ``env.unwrapped.action_masks()`` or
    ``env.get_wrapper_attr("action_masks")()``; ``venv.env_method("action_masks")`` on an SB3
    VecEnv (what sb3-contrib's ``get_action_masks`` and ``MaskablePPO`` call) and
    ``envs.unwrapped.call("action_masks")`` on a Gymnasium vector env.

    **Invalid actions** (``invalid_action``). Every action inside ``action_space`` is accepted:
    ``noop`` (default): a masked, out-of-range or malformed action launches the batch formed so
    far (with the last budget; ``meta``/``tune``: keeps the last candidate or parameters), is
    counted in ``info["invalid_actions"]`` and costs ``invalid_penalty`` reward each; ``raise``:
    ``InvalidActionError`` naming the action and the mask (for debugging).

    **Observation space.** ``Dict`` of float32 ``Box`` es (``flat=True``: their concatenation in the
    order queue, running, globals, budgets). Token counts are scaled ``log1p(x) / log1p(M)`` (``M``
    the KV capacity in tokens), durations ``log1p(t / u) / log1p(1e6)`` (``u`` the scenario's time
    unit: the batch time of a one-token decode); values are clipped into the bounds.

    ``queue``: ``K x {n_queue}`` values, slot-major (feature ``f`` of slot ``i`` at ``{n_queue} i +
    f``); an empty slot is all zeros.

{queue_table}

    ``running``: about the running requests (less those chosen for preemption) plus those chosen
    for the batch being formed.

{running_table}

    ``globals``:

{globals_table}

    ``budgets`` (``select`` mode): one value per launch action, the latency model's prediction of
    the batch's duration with that budget (decodes first, then the unfinished prefills and the
    chosen requests' prompts), ``log1p(t / u) / log1p(1e6)``.

    **Reward** (``reward``: a dict of weights, default ``{{"latency": 1.0}}``; see
    ``llmsched_gym.env.reward``): the weighted sum of the step's components, measured over the
    iterations simulated since the previous step. ``latency``: minus the request-seconds spent in
    the system (sums exactly to minus the summary's ``total_latency_s`` when every request
    completes); ``throughput``: output tokens generated; ``eviction``: minus tokens recomputed after
    preemptions and clears; ``slo``: minus requests that missed their TTFT/TPOT SLO; ``fairness``:
    minus the growth of the maximum weighted service difference between clients. Steps that only
    add to the batch being formed (``select``) take no time and earn 0 (less ``invalid_penalty``).
    ``info["reward_components"]`` holds every raw component every step.

    **Starting state.** ``reset(seed=s)`` builds the scenario's workload and engine with seed ``s``
    (the same as ``simulate(scenario, policy, seed=s)``) and runs to the first decision; without a
    seed the episode seed is drawn from ``env.np_random``.

    **Episode end.** ``terminated`` when every request has completed (or been rejected);
    ``truncated`` when the engine stops first: the horizon ``horizon_s``, ``engine.max_iterations``
    or the engine's loop detector (``info["summary"]["non_terminating"]``). ``gymnasium.make``
    adds a step limit of one million steps (``max_episode_steps``). At the end ``info["summary"]``
    is the run summary (``llmsched run``'s JSON; its ``policy`` is ``"agent"``) and
    ``info["episode_stats"]`` holds ``r`` (return), ``l`` (steps) and ``t`` (seconds) of the
    episode. ``info["episode"]`` is left to the wrappers that write it: Gymnasium's
    ``RecordEpisodeStatistics`` (single and vector; it refuses to overwrite the key) and
    Stable-Baselines3's ``Monitor``, which SB3 adds around a single env itself and
    ``make_vec_env`` around each env, and whose ``info["episode"]`` becomes
    ``rollout/ep_rew_mean``. Over a whole episode the wrappers' ``r`` and ``l`` equal
    ``episode_stats``'s.

    **Experts.** ``expert=`` attaches a policy (registered name, ``{{"name": ..., **params}}`` or a
    Scheduler): the env forwards the engine's hooks to it and applies its ``engine_overrides``, and
    :meth:`expert_action` returns the action that reproduces its plan. In ``select`` mode every
    plan made of preemptions of the newest (or longest-remaining) running request, admissions of
    visible slots and a budget among ``budgets`` is exact: fcfs, sjf, srpt, mcsf (``order=
    "shortest"``), sarathi at chunk sizes in ``budgets``, vllm-v1, lpm, k-lpm, sglang-lpm and vtc
    reproduce ``simulate()`` (the summary, wall time aside) as long as their picks are among the
    ``K`` slots. In ``meta`` mode the expert must be one of the candidates and every registered
    policy is exact.

    **Arguments.**

    * ``scenario``: a scenario name (``llmsched list``), a ``.yml`` scenario file or a scenario dict; default ``jaillet-high``.
    * ``action_mode``: ``select`` | ``subset`` | ``priority`` | ``knob`` | ``meta`` | ``tune``.
    * ``reward``: weights (see above), or one component name.
    * ``K``: number of queue slots (default 32).
    * ``order``: ``arrival`` | ``shortest`` | ``prompt`` | ``deadline``.
    * ``admission``: ``none`` | ``current`` | ``future``; ``max_num_seqs``: cap (default none).
    * ``budgets``: the token budgets of ``select``'s launch actions (``None``: unlimited);
      ``budget``: the fixed budget of ``subset``, ``priority`` and ``knob`` (default unlimited).
    * ``candidates``: ``meta`` mode's policies (names or ``{{"name": ..., **params}}``).
    * ``base``, ``tune``: ``tune`` mode's policy and ``{{parameter: [low, high]}}``.
    * ``n_requests``, ``horizon_s``: episode length (``workload.n_requests``, ``engine.horizon_s``).
    * ``overrides``: dotted scenario overrides, as ``--set`` (``{{"engine.kv_capacity_tokens": 8000}}``).
    * ``flat``: one Box observation instead of the Dict.
    * ``invalid_action``: ``noop`` | ``raise``; ``invalid_penalty``: reward per invalid action.
    * ``expert``: a policy attached to the episode (see **Experts**).
    * ``latency``: a latency-model spec replacing the scenario's (``gpu:llama-3-8b`` times batches on
      the local GPU: ``LLMSchedGPU-v1``).
    * ``render_mode``: ``ansi`` | ``rgb_array``.

    **Notes and departures.** A scenario whose overflow handler is ``forbid`` runs with
    ``preempt_lifo_recompute`` here (an agent's batch must always run), unless ``overrides`` sets
    ``engine.overflow`` explicitly. ``priority`` scores and the knobs live in [-1, 1] rather than
    [0, 1] and ``queue`` is flat: both checkers (Gymnasium, Stable-Baselines3) warn on other Box
    actions and on 2-D observations. Between decisions the env fast-forwards decode runs
    (``hold``) unless ``admission="future"`` and requests wait (a later start can pass that rule
    without any event). A request whose prompt plus true output cannot fit in the whole KV cache
    is rejected at its arrival under every information model (the engine's rule, as a server
    rejects ``max_tokens`` beyond its capacity).

    **Version history.** ``LLMSched-v1`` (issue 25): information models; under ``blind`` the
    output-length features are replaced as above and prediction-based choices are refused or
    masked; ``info["information"]`` and ``info["env"]`` on every step, ``summary["env"]``; with a
    clairvoyant or predicted scenario the observations, masks and rewards are v0's.
    ``LLMSched-v0``: the first version (its default action mode became ``select`` without a
    version change); retired: ``gymnasium.make("LLMSched-v0")`` raises Gymnasium's
    ``DeprecatedEnv`` naming v1. Note that the built-in ``azure-conv`` became ``predicted`` at the
    same time (a log-normal predictor error; it was clairvoyant), which changes its episodes under
    any version: ``overrides={{"workload.predictor": {{"type": "oracle"}}}}`` is the old task.
    """

    metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 8}

    def __init__(
        self,
        scenario: str | dict = "jaillet-high",
        action_mode: str = "select",
        reward: str | dict | None = None,
        K: int = 32,
        order: str = "arrival",
        admission: str = "none",
        budgets: tuple[int | None, ...] | list = DEFAULT_BUDGETS,
        budget: int | None = None,
        max_num_seqs: int | None = None,
        candidates: list | None = None,
        base: str | dict = "sarathi",
        tune: dict | None = None,
        n_requests: int | None = None,
        horizon_s: float | None = None,
        overrides: dict[str, Any] | None = None,
        flat: bool = False,
        invalid_action: str = "noop",
        invalid_penalty: float = 0.0,
        expert: str | dict | Scheduler | None = None,
        latency: str | dict | None = None,
        render_mode: str | None = None,
    ) -> None:
        for name, value, allowed in (("action_mode", action_mode, ACTION_MODES), ("order", order, ORDERS),
                                     ("admission", admission, ADMISSION_RULES),
                                     ("invalid_action", invalid_action, INVALID_ACTION)):
            if value not in allowed:
                raise ConfigError(f"{name}: {value!r} is not one of {', '.join(allowed)}")
        if isinstance(K, bool) or not isinstance(K, int | np.integer) or not 1 <= K <= MAX_K:
            raise ConfigError(f"K: must be an integer in [1, {MAX_K}] (the observation holds K slots), got {K!r}")
        for name, value in (("budget", budget), ("max_num_seqs", max_num_seqs)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1):
                raise ConfigError(f"{name}: must be an integer >= 1 or None, got {value!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigError(f"render_mode: {render_mode!r} is not one of ansi, rgb_array")
        try:
            self.invalid_penalty = float(invalid_penalty)
        except (TypeError, ValueError):
            raise ConfigError(f"invalid_penalty: expected a number, got {invalid_penalty!r}") from None
        self.mode = action_mode
        self.K = int(K)
        self.order = order
        self.admission = admission
        self.budgets = check_budgets(budgets)
        self.budget = None if budget is None else int(budget)
        self.flat = Setting("bool").check("flat", flat)
        self.invalid_action = invalid_action
        self.render_mode = render_mode
        self.weights = parse_weights(reward)
        if overrides is not None and not isinstance(overrides, Mapping):
            raise ConfigError(f"overrides: expected a mapping like {{'engine.block_size': 16}}, got {overrides!r}")
        self._overrides = dict(overrides or {})
        if n_requests is not None:
            self._overrides["workload.n_requests"] = Setting("int", ge=0).check("n_requests", n_requests)
        if horizon_s is not None:
            self._overrides["engine.horizon_s"] = Setting("float", gt=0).check("horizon_s", horizon_s)
        if latency is not None:
            self._overrides["latency"] = latency
        self._spec = resolve_scenario(scenario, self._overrides)
        self.information = info = information_of(self._spec)
        for name, value, needs in (("order", order, order == "shortest"), ("admission", admission, admission == "future")):
            if needs and info == BLIND:
                raise NotApplicable(f"{name}: {value!r} needs output-length predictions; the task is blind "
                                    f"(allowed: {', '.join(x for x in (ORDERS if name == 'order' else ADMISSION_RULES) if x != value)})")
        from llmsched_gym.sim import make_policy

        self.switch = self.base = None
        self.tune = None
        if action_mode == "meta":
            from llmsched_gym.core.switch import Switch

            if candidates is not None:
                specs = candidates
            else:  # the defaults the task's information model allows
                specs = [c for c in default_candidates(self._spec.get("name", "")) if applicable(c, info)[0]]
            if not specs:
                raise ConfigError("candidates: meta mode needs at least one policy")
            self.switch = Switch([make_policy(c) for c in specs])
            _check_applicable(self.switch, info, "candidates")
        elif candidates is not None:
            raise ConfigError(f"candidates: only meta mode takes candidates (action_mode={action_mode!r})")
        if action_mode == "tune":
            self.base = make_policy(base)
            _check_applicable(self.base, info, "base")
            self.tune = check_tune(tune if tune is not None else DEFAULT_TUNE, type(self.base).params)
        self.dp = DecisionPoint(self.K, order, admission, None if max_num_seqs is None else int(max_num_seqs))
        self._mode = MODES[action_mode](self)
        self.action_space = self._mode.space
        self._obs = obs_mod.ObservationBuilder(self.K, self.flat, self.budgets if action_mode == "select" else None)
        self.observation_space = self._obs.space
        self._adapter = _AgentScheduler(self)
        self._expert: Scheduler | None = None
        self.set_expert(expert)
        self._tracker = RewardTracker(self.weights)
        self._experts = ExpertReplay(self)
        self._history: list[tuple[float, float, int]] = []
        self.engine: Engine | None = None
        self._ended = True
        self._episode = 0

    # ------------------------------------------------------------------------------------------
    # experts
    def set_expert(self, expert: str | dict | Scheduler | None) -> None:
        """Attach ``expert`` from the next :meth:`reset` on (its hooks and engine overrides apply)."""
        from llmsched_gym.sim import make_policy

        self._expert = None if expert is None else make_policy(expert)
        if self._expert is not None:
            _check_applicable(self._expert, self.information, "expert")
        if self.switch is not None and self._expert is not None:
            # meta mode: the expert is the candidate with the same name and parameters
            want = _spec_of(self._expert)
            match = [c for c in self.switch.candidates if _spec_of(c) == want]
            if not match:
                raise ValueError(f"expert: {self._expert.name} is not one of the candidates "
                                 f"({', '.join(c.name for c in self.switch.candidates)})")
            self._expert = match[0]
        delegate = self._delegate()
        forced = dict(getattr(delegate, "engine_overrides", {}) or {})
        # an agent's batch must always run: forbid becomes vLLM's LIFO preemption
        if forced.get("overflow", self._spec.get("engine", {}).get("overflow", "forbid")) == "forbid":
            forced["overflow"] = "preempt_lifo_recompute"
        self._adapter.engine_overrides = forced

    def _delegate(self) -> Scheduler | None:
        """The scheduler that receives the engine's hooks: the Switch, the tuned base or the expert."""
        return self.switch or self.base or self._expert

    def expert_action(self, policy: str | dict | Scheduler | None = None, strict: bool = True):
        """The action that reproduces ``policy``'s plan at this step, in this env's action mode.

        ``policy`` defaults to the attached ``expert``. A policy that uses engine hooks must be the
        attached one (its state must have seen the whole episode); a stateless one can be any
        registered name or Scheduler. Its ``schedule(view)`` runs once per boundary; the plan is
        translated step by step: ``select``: first its preemptions (each must be the newest or
        the longest-remaining running request), then its admissions in its order (each must be in
        a slot and not masked), then the launch whose budget forms exactly its batch (decodes,
        pauses, chunks); ``subset``: its admitted slots; ``priority``: decreasing positive scores in
        its admission order, -1 elsewhere; ``meta``: its index among the candidates. A plan the
        mode cannot express raises ``ValueError`` naming the policy and the reason when
        ``strict``, else becomes :meth:`fallback_action`. ``knob`` and ``tune`` have no translation.
        """
        if self._ended:
            raise RuntimeError("expert_action(): the episode has ended; call reset()")
        return self._experts.action(policy, strict)

    def fallback_action(self):
        """The launch action of the current mode (what an inexpressible expert plan becomes)."""
        if self.mode == "select":
            return self._mode.launch0 + self.budgets.index(self.last_budget)
        if self.mode == "subset":
            return np.zeros(self.K, np.int8)
        return np.full(self.K, -1.0, np.float32)

    # ------------------------------------------------------------------------------------------
    # batches: formed by the shared builder
    def form(self, budget: int | None, admit: list[int]) -> BatchPlan:
        """The batch launching now with ``budget`` and the admissions ``admit`` would run (dry):
        what :class:`~llmsched_gym.core.batching.BatchBuilder` forms (``reserve=False``, no
        memory check), computed from the decision point's running set unless a decode is paused."""
        e, dp = self.engine, self.dp
        if budget is None and not dp.victims and not e.n_in_prefill:
            return BatchPlan(prefill={r: BatchPlan.FULL for r in admit})
        n_dec = dp.batch_shape()[0]
        if budget is not None and budget < n_dec:  # decodes paused: the builder's own phases
            b = BatchBuilder(e.view, budget, reserve=False, preempted=dp.victims)
            b.decode_first(preempt=False)
            b.continue_prefills()
            for rid in admit:
                b.admit(rid, check=False)
            plan = b.plan()
            plan.hold = False
            return plan
        # decodes first, then unfinished prefills in admission order, then the admissions, each
        # with a chunk of what the budget leaves
        left = math.inf if budget is None else budget - n_dec
        prefill: dict[int, int] = {}
        for rid, owed in zip(*dp.unfinished_prefills(), strict=True):
            if left <= 0:
                break
            c = owed if owed <= left else left
            prefill[rid] = c
            left -= c
        if budget is None:
            for rid in admit:
                prefill[rid] = BatchPlan.FULL
        elif left > 0:
            target, match = e.prefill_target, e.kv.match_tokens
            for rid in admit:
                c = int(target[rid]) - match(rid)
                if c >= left:
                    prefill[rid] = left
                    break
                prefill[rid] = c
                left -= c
        return BatchPlan(prefill=prefill, preempt=list(dp.victims))

    def batch_shape(self) -> tuple[int, int, int, int, int]:
        """Decodes and their context, unfinished prefills, tokens owed and their context (now,
        less the requests chosen for preemption)."""
        return self.dp.batch_shape()

    # ------------------------------------------------------------------------------------------
    # gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        from llmsched_gym.sim import make_engine

        self._episode_seed = int(seed) if seed is not None else int(self.np_random.integers(2**31 - 1))
        self._episode += 1
        if self.engine is not None:  # free the last episode now, not at the next cyclic collection
            self.engine.close()
            self.engine = None
        self._wall0 = time.perf_counter()
        engine, _ = make_engine(self._spec, self._adapter, self._episode_seed, self._overrides)
        self.engine = e = engine
        self.dp.setup(e)
        self._obs.setup(self)
        self._tracker.reset(e)
        self._zeros = {"latency": 0.0, "throughput": 0.0, "eviction": 0.0, "slo": 0.0, "fairness": 0.0}
        if self._tracker.has_slo:
            self._zeros["slo_online"] = self._zeros["slo_offline"] = 0.0
        self._n_invalid = 0
        self._experts.plan_cache = None
        self._history = []
        self._summary: dict[str, Any] | None = None
        self._terminated = False
        self.last_admit_s = e.clock
        self.last_iter_s = 0.0
        self.last_prefill_tokens = self.last_decode_tokens = 0
        self.last_budget = self.budgets[0] if self.mode == "select" else self.budget
        self.stalled: dict[int, float] = {}
        self._return = 0.0
        self._steps = 0
        self._ended = False
        self._advance()
        self._ended_in_reset = self._ended
        return self._observe(), self._info(None)

    def step(self, action):
        reward, terminated, truncated, comps = self._step(action)
        return self._observe(), reward, terminated, truncated, self._info(comps)

    def _step(self, action) -> tuple[float, bool, bool, dict[str, float] | None]:
        """:meth:`step` without the observation and the info (the vector env builds those itself):
        the reward, terminated, truncated and the reward components (``None``: all zero)."""
        if self.engine is None:
            raise RuntimeError("step() before reset()")
        if self._ended:
            if not self._ended_in_reset:
                raise RuntimeError("step() after the episode ended; call reset()")
            # the episode ended during reset (nothing to decide at all)
            self._ended_in_reset = False
            return 0.0, self._terminated, not self._terminated, None
        bid, invalid0 = self.dp.bid, self._n_invalid
        self._mode.step(action)
        self._steps += 1
        if self.dp.bid == bid and not self._ended:  # still forming the same batch
            reward = -self.invalid_penalty * (self._n_invalid - invalid0)
            self._return += reward
            return reward, False, False, None
        reward, comps = self._tracker.collect()
        reward -= self.invalid_penalty * (self._n_invalid - invalid0)
        self._return += reward
        if self._ended:
            return reward, self._terminated, not self._terminated, comps
        return reward, False, False, comps

    def action_masks(self) -> np.ndarray:
        """Valid actions now: a fresh bool array, ``True`` = valid (the layout per mode is in the
        class docstring's **Masks**; behind wrappers call ``env.unwrapped.action_masks()``)."""
        return self._mode.masks()

    def summary(self) -> dict[str, Any]:
        """The run summary of the current episode so far (complete once the episode has ended)."""
        if self._ended and self._summary is not None:
            return self._summary
        return self._summarize()

    def _summarize(self) -> dict[str, Any]:
        s = summarize(self.engine, self._spec.get("name", "custom"), "agent", time.perf_counter() - self._wall0)
        s["env"] = ENV_ID
        return s

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        super().close()

    def render(self):
        from llmsched_gym.env.render import render_ansi, render_rgb

        if self.render_mode == "ansi":
            return render_ansi(self)
        if self.render_mode == "rgb_array":
            return render_rgb(self)
        return None

    # ------------------------------------------------------------------------------------------
    # the loop between decisions
    def _advance(self) -> None:
        """Simulate until the agent has something to decide, or the episode ends."""
        e, dp, mode = self.engine, self.dp, self._mode
        while e.poll():
            dp.begin()
            if mode.decides():
                if self.render_mode == "rgb_array":
                    self._history.append((e.clock, e.kv.used_blocks / dp.cap_blocks, len(e.waiting)))
                return
            self._execute(mode.between())
        self._end_episode()

    def _end_episode(self) -> None:
        e = self.engine
        self._ended = True
        self._terminated = e.stop_reason == "all requests finished"
        self._summary = self._summarize()
        self.dp.begin()

    def default_plan(self) -> BatchPlan:
        """A boundary without a decision: decode with the last budget, wait, or start the head."""
        e = self.engine
        if e.running:
            b = self.last_budget
            if b is not None and len(e.running) > b:
                return self.form(b, [])
            return BatchPlan(hold=self.admission != "future" or not e.waiting)
        if e.next_idx < e.n:
            return BatchPlan(idle=True)
        return BatchPlan.admit([self.dp.slots[0]])

    def launch(self, budget: int | None) -> None:
        """Run the batch formed so far with token ``budget``, then advance to the next decision."""
        e, dp = self.engine, self.dp
        if self.mode == "select":
            self.last_budget = budget
        plan = self.form(budget, dp.sel)
        if not plan.prefill and len(e.running) == len(dp.victims):
            # nothing would run: wait for the next arrival, or start the head of the queue
            if e.next_idx < e.n:
                plan = BatchPlan(preempt=plan.preempt, idle=True)
            elif dp.slots:
                dp.sel = [dp.slots[0]]
                plan = self.form(budget, dp.sel)
            else:
                dp.victims = []
                plan = self.form(budget, [])
        self.run_plan(plan)

    def run_plan(self, plan: BatchPlan) -> None:
        """Execute a plan of this boundary and advance to the next decision."""
        if any(self.engine.state[r] == WAITING for r in plan.prefill):
            self.last_admit_s = self.engine.clock
        self._execute(plan)
        self._advance()

    def invalid(self, message: str) -> None:
        if self.invalid_action == "raise":
            raise InvalidActionError(message)
        self._n_invalid += 1

    def _execute(self, plan: BatchPlan) -> None:
        e = self.engine
        t0, it0, pf0, dec0 = e.clock, e.n_iterations, e.total_prefill_tokens, e.total_decoded
        e.execute(plan)
        its = e.n_iterations - it0
        if its:
            self.last_iter_s = (e.clock - t0) / its
            self.last_prefill_tokens = e.total_prefill_tokens - pf0
            self.last_decode_tokens = (e.total_decoded - dec0) // its
        if plan.pause or e.n_in_prefill or self.stalled:
            self._track_stalls(plan, t0)

    def _track_stalls(self, plan: BatchPlan, t0: float) -> None:
        """Running requests that got neither a token nor a chunk since when (the ``stall`` feature)."""
        e = self.engine
        st = self.stalled
        if st:
            state, prefilled, target = e.state, e.prefilled, e.prefill_target
            for r in list(st):
                if state[r] != RUNNING or (r not in plan.pause and (r in plan.prefill or prefilled[r] >= target[r])):
                    del st[r]
        for r in plan.pause:
            if e.state[r] == RUNNING:
                st.setdefault(r, t0)
        if e.n_in_prefill:
            run = np.array(e.running, np.int64)
            for r in run[e.prefilled[run] < e.prefill_target[run]].tolist():
                if r not in plan.prefill:
                    st.setdefault(r, t0)

    def _refresh_request(self, rid: int) -> None:
        self.dp.refresh(rid)
        self._obs.refresh(rid)

    # ------------------------------------------------------------------------------------------
    # observation and info
    def _observe(self):
        return self._obs.observe(self)

    def _info(self, comps: dict[str, float] | None) -> dict[str, Any]:
        info: dict[str, Any] = {
            "action_mask": self._mode.info_mask(),
            "reward_components": comps if comps is not None else self._zeros.copy(),
            "invalid_actions": self._n_invalid,
            "clock_s": self.engine.clock,
            "information": self.information,
            "env": ENV_ID,
        }
        if self._ended:
            info["summary"] = copy.deepcopy(self._summary)
            info["episode_stats"] = {"r": self._return, "l": self._steps,
                                     "t": round(time.perf_counter() - self._wall0, 6)}
        return info


def _check_applicable(policy: Scheduler, information: str, arg: str) -> None:
    """``NotApplicable`` naming the argument when ``policy`` needs what the task does not give."""
    try:
        check_applicable(policy, information)
    except NotApplicable as e:
        raise NotApplicable(f"{arg}: {e}") from None


def _spec_of(pol: Scheduler) -> tuple:
    """A policy's name and parameters (to find an expert among ``meta`` candidates)."""
    return pol.name, tuple(sorted((k, repr(getattr(pol, k, None))) for k in type(pol).params))


def _docstring_tables() -> None:
    doc = LLMSchedEnv.__doc__ or ""

    def table(t):
        return "\n".join("    " + line for line in obs_mod.feature_table(t).splitlines())

    LLMSchedEnv.__doc__ = doc.format(
        n_queue=len(obs_mod.QUEUE_FEATURES), queue_table=table(obs_mod.QUEUE_FEATURES),
        running_table=table(obs_mod.RUNNING_FEATURES), globals_table=table(obs_mod.GLOBAL_FEATURES))


_docstring_tables()


class _AgentScheduler(Scheduler):
    """The env as the engine's Scheduler: it forms no plan itself (the env drives the engine) but
    feeds the reward tracker and forwards the engine's hooks to the delegate (the attached expert,
    ``meta``'s Switch or ``tune``'s base policy)."""

    name = "agent"

    def __init__(self, env: LLMSchedEnv) -> None:
        self.env = env
        self.engine_overrides: dict[str, Any] = {}

    def wants(self, hook: str) -> bool:  # type: ignore[override]
        if hook in ("on_finish", "on_preempt"):
            return True
        d = self.env._delegate()
        return d is not None and d.wants(hook)

    def reset(self, config, rng: np.random.Generator) -> None:
        super().reset(config, rng)
        d = self.env._delegate()
        if d is not None:
            # the delegate gets the policy stream simulate() would give it
            d.reset(config, rng)

    def schedule(self, view: EngineView) -> BatchPlan:
        raise RuntimeError("the LLMSched-v1 adapter is driven by env.step(), not engine.run()")

    def on_arrival(self, req_id: int, view: EngineView) -> bool:
        ok = self.env._delegate().on_arrival(req_id, view)
        if not ok:
            self.env._tracker.on_reject(req_id)
        return ok

    def on_tokens(self, req_ids: np.ndarray, n: int, view: EngineView) -> None:
        self.env._delegate().on_tokens(req_ids, n, view)

    def on_prefill(self, req_id: int, n_tokens: int, view: EngineView) -> None:
        self.env._delegate().on_prefill(req_id, n_tokens, view)

    def on_preempt(self, req_id: int, view: EngineView) -> None:
        self.env._refresh_request(req_id)
        d = self.env._delegate()
        if d is not None and d.wants("on_preempt"):
            d.on_preempt(req_id, view)

    def on_finish(self, req_id: int, view: EngineView) -> None:
        self.env._tracker.on_finish(req_id, view.now)
        d = self.env._delegate()
        if d is not None and d.wants("on_finish"):
            d.on_finish(req_id, view)

    def reject_reason(self, req_id: int) -> str:
        d = self.env._delegate()
        return d.reject_reason(req_id) if d is not None else super().reject_reason(req_id)
