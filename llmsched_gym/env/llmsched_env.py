"""``LLMSched-v0``: the Gymnasium environment (one class; its docstring is the manual)."""

from __future__ import annotations

import bisect
import copy
import math
import time
from typing import Any

import gymnasium as gym
import numpy as np

from llmsched_gym.core.engine import WAITING, Engine
from llmsched_gym.core.metrics import client_service, summarize
from llmsched_gym.core.scenarios import apply_overrides, get_scenario
from llmsched_gym.core.scheduler import BatchPlan, EngineView, Scheduler
from llmsched_gym.env import observation as obs_mod
from llmsched_gym.env.actions import (
    ACTION_MODES,
    INVALID_ACTION,
    KNOBS,
    InvalidActionError,
    action_space,
    check_box,
    check_subset,
    knob_values,
    select_error,
)
from llmsched_gym.env.admission import ADMISSION_RULES, FutureProfile
from llmsched_gym.env.reward import RewardTracker, parse_weights

ORDERS = ("arrival", "shortest", "prompt", "deadline")
HOOKS = ("on_arrival", "on_tokens", "on_prefill", "on_preempt", "on_finish")
_F = {name: i for i, (name, *_rest) in enumerate(obs_mod.QUEUE_FEATURES)}
_EDGES = list(obs_mod.REMAINING_BIN_EDGES)
_EDGES_ARRAY = np.array(_EDGES, np.int64)
_N_BINS = len(_EDGES) + 1


class LLMSchedEnv(gym.Env):
    """LLM inference scheduling under a KV-cache limit: the agent forms each batch.

    **Description.** One GPU worker serves a seeded workload of requests (arrival time, prompt
    length, output length, optionally a predicted length, a client, a task class with SLOs, prefix
    segments). At every iteration boundary a batch is formed: running requests decode one token
    and waiting requests may be admitted (their prompt is prefilled). The agent decides which
    waiting requests to admit; everything else (time, KV memory, prefix cache, overflow handling,
    completions) is the project's engine (``llmsched_gym.core.engine``), the same one the baselines
    run, on the same seeded workload (``llmsched_gym.sim.simulate``).

    **Decision epochs.** The agent is asked only when at least one of the ``K`` visible waiting
    requests passes the admission rule. Other boundaries are simulated without asking (decode the
    running requests, or wait for the next arrival) and their reward is added to the next step.

    **Slots.** Slot ``0..K-1`` show the first ``K`` waiting requests, not yet chosen for the batch
    being formed, in the canonical order ``order``: ``arrival`` (the engine's queue order: arrival
    order, with preempted requests back at the head as in vLLM), ``shortest`` (predicted remaining
    output, ties by queue order), ``prompt`` (tokens to prefill) or ``deadline`` (TTFT deadline;
    requests without one last).

    **Action space** (``action_mode``):

    * ``select`` (default): ``Discrete(K + 1)``. Action ``i < K`` adds slot ``i`` to the batch being
      formed (the slots shift: the chosen request leaves the queue view and joins the ``running``
      summary); action ``K`` launches the batch. Several steps build one batch; the batch launches
      by itself when no slot is admissible any more.
    * ``subset``: ``MultiBinary(K)``: the whole admission set in one step; chosen slots are admitted
      in slot order, skipping those the admission rule rejects given the ones before.
    * ``priority``: ``Box(-1, 1, (K,))`` scores; requests are admitted by decreasing score (ties
      by slot) until the first one the rule rejects; slots scored below 0 are never admitted.
    * ``knob``: ``Box(-1, 1, (2,))``: the parameters of seed 000's alpha-protection FCFS (section
      2.5a of the digest): ``alpha = 0.25 (a0 + 1)`` in [0, 0.5] and a prefill budget
      ``max_batch_tokens`` log-uniform in [16, M] from ``a1``. Slots are admitted in order while
      ``KV used + chosen + prompt <= (1 - alpha) M``, the budget and the admission rule allow.

    Launching an empty batch decodes the running requests; when nothing runs it waits for the next
    arrival, and when no arrival is left it admits slot 0 (so every episode ends).

    **Admission rule** (``admission``): ``current`` (default): the request's prefill fits in the
    KV free now, after this iteration's decode growth and the batch so far; ``future``: seed 000's
    Eq. (1) future-peak test (MC-SF) with predicted output lengths, in iterations; ``none``: any
    waiting request (overflow is left to the engine's handler and paid for in the reward).

    **Masks.** ``env.action_masks()`` (bool, for sb3-contrib) and ``info["action_mask"]`` (int8) are
    fresh arrays: ``select``: ``K + 1`` entries, launch always valid; ``subset``: ``2K`` entries,
    ``[choose 0, choose 1]`` per slot (sb3-contrib's MultiBinary layout); ``priority``/``knob``:
    ``K`` entries telling which slots are admissible now (information only).

    **Invalid actions.** Out of range, wrong shape, not finite, or a masked slot: ``InvalidActionError``
    naming the action and the mask, unless ``invalid_action="noop"``, which launches the batch
    formed so far instead and counts it in ``info["invalid_actions"]``.

    **Observation space.** ``Dict`` of float32 ``Box`` es (``flat=True``: their concatenation in the
    order queue, running, globals). Token counts are scaled ``log1p(x) / log1p(M)`` (``M`` the KV
    capacity in tokens), durations ``log1p(t / u) / log1p(1e6)`` (``u`` the scenario's time unit:
    the batch time of a one-token decode), values are clipped into the bounds.

    ``queue``: ``K x 11`` values, slot-major (feature ``f`` of slot ``i`` at ``11 i + f``); an empty
    slot is all zeros.

    ===  =================  ===========  ==========================================================
    f    name               range        meaning
    ===  =================  ===========  ==========================================================
    0    present            {0, 1}       a request occupies the slot
    1    prompt             [0, 1]       tokens to prefill (prompt, + generated after a recompute
                                         preemption), log-scaled
    2    predicted_output   [0, 1]       predicted output tokens still to generate, log-scaled
    3    uncertainty        [0, 1]       predictor spread: 0 oracle, x for ``noisy(x)``, bucket
                                         width / upper edge for ``bucketed``
    4    age                [0, 1]       time since arrival, log-scaled
    5    prefix_hit         [0, 1]       fraction of the prompt the prefix cache would serve now
    6    service_deficit    [0, 1]       (max client service - this client's) / (max + 1),
                                         weighted (seed 002's service, prompt + 2 x output)
    7    task_class         {0, 1}       0 online, 1 offline (seed 001)
    8    slo_slack          [-1, 1]      (TTFT deadline - now) / TTFT SLO; 1 without a TTFT SLO
    9    fits_now           {0, 1}       passes the ``current`` rule given the batch so far
    10   fits_future        {0, 1}       passes the ``future`` rule given the running requests and
                                         the batch so far (exact under ``admission="future"``;
                                         otherwise the chosen requests count at their predicted
                                         peak throughout: a sound, cheaper version)
    ===  =================  ===========  ==========================================================

    ``running``: 12 values about the running requests plus those chosen for the batch being formed.

    ===  =================  ===========  ==========================================================
    i    name               range        meaning
    ===  =================  ===========  ==========================================================
    0    count              [0, 1]       how many, ``log1p(n) / log1p(M)``
    1    kv_used            [0, 2]       (KV used + KV the chosen requests will need) / capacity
    2-9  remaining_hist_*   [0, 1]       fraction with predicted remaining output in [1, 2),
                                         [2, 8), [8, 32), [32, 128), [128, 512), [512, 2048),
                                         [2048, 8192), [8192, inf) tokens
    10   future_peak        [0, 2]       predicted future KV peak of the running requests alone
                                         (Eq. (1) profile) / capacity
    11   selected           [0, 1]       requests chosen for this batch so far, log-scaled
    ===  =================  ===========  ==========================================================

    ``globals``: 6 values.

    ===  =================  ===========  ==========================================================
    i    name               range        meaning
    ===  =================  ===========  ==========================================================
    0    kv_used            [0, 2]       KV used / capacity (> 1 only after a clear handler's
                                         overflow)
    1    queue_len          [0, 1]       waiting requests not chosen yet, ``log1p(n) / log1p(N)``
    2    arrival_rate       [0, 1]       arrivals in the last 100 time units, ``log1p(n) / log1p(N)``
    3    since_batch        [0, 1]       time since the last batch that admitted a request, log-scaled
    4    last_iteration     [0, 1]       duration of the last iteration, log-scaled
    5    arrived            [0, 1]       fraction of the episode's ``N`` requests that have arrived
    ===  =================  ===========  ==========================================================

    **Reward** (``reward``: a dict of weights, default ``{"latency": 1.0}``; see
    ``llmsched_gym.env.reward``): the weighted sum of the step's components, measured over the
    iterations simulated since the previous step. ``latency``: minus the request-seconds spent in
    the system (sums exactly to minus the summary's ``total_latency_s`` when every request
    completes; use a weight ``1 / scale`` to rescale); ``throughput``: output tokens generated;
    ``eviction``: minus tokens recomputed after preemptions and clears; ``slo``: minus requests that
    missed their TTFT/TPOT SLO (a number, or ``{"online": w, "offline": w}``); ``fairness``: minus
    the growth of the maximum weighted service difference between clients. Steps that only add a
    request to the batch (``select``) take no time and earn 0. ``info["reward_components"]`` holds
    every raw component (plus ``slo_online``/``slo_offline`` when SLOs exist) every step.

    **Starting state.** ``reset(seed=s)`` builds the scenario's workload and engine with seed ``s``
    (the same as ``simulate(scenario, policy, seed=s)``) and runs to the first decision; without a
    seed the episode seed is drawn from ``env.np_random``.

    **Episode end.** ``terminated`` when every request has completed (or been rejected);
    ``truncated`` when the engine stops first: the horizon ``horizon_s``, ``engine.max_iterations``
    or the engine's loop detector (``info["summary"]["non_terminating"]``). Episode length is
    ``n_requests`` requests or a ``horizon_s``; ``gymnasium.make(..., max_episode_steps=T)`` adds
    a step limit. At the end ``info["summary"]`` is the run summary (``llmsched run``'s JSON;
    its ``policy`` is ``"agent"`` and ``wall_time_s`` is the episode's wall time).

    **Arguments.**

    * ``scenario``: a scenario name (``llmsched list``) or a scenario dict; default ``jaillet-high``.
    * ``action_mode``: ``select`` | ``subset`` | ``priority`` | ``knob``.
    * ``reward``: weights (see above), or one component name.
    * ``K``: number of queue slots (default 32).
    * ``order``: ``arrival`` | ``shortest`` | ``prompt`` | ``deadline``.
    * ``admission``: ``current`` | ``future`` | ``none``.
    * ``n_requests``, ``horizon_s``: episode length (``workload.n_requests``, ``engine.horizon_s``).
    * ``overrides``: dotted scenario overrides, as ``--set`` (``{"engine.kv_capacity_tokens": 8000}``).
    * ``flat``: one Box observation instead of the Dict.
    * ``invalid_action``: ``raise`` | ``noop``.
    * ``expert``: a policy (registered name, ``{"name": ..., **params}`` or a Scheduler) attached to
      the episode: the env forwards the engine's hooks to it and applies its ``engine_overrides``,
      so ``expert_action()`` reproduces it exactly (see :meth:`expert_action`).
    * ``latency``: a latency-model spec replacing the scenario's (``gpu:llama-3-8b`` times batches on
      the local GPU: ``LLMSchedGPU-v0``).
    * ``render_mode``: ``ansi`` | ``rgb_array``.

    **Notes and departures.** A scenario whose overflow handler is ``forbid`` runs with
    ``preempt_lifo_recompute`` here (an agent's batch must always run), unless ``overrides`` sets
    ``engine.overflow`` explicitly (an expert asking for ``forbid`` gets the same replacement; one
    asking for a clear handler keeps it). ``priority`` scores and
    the knobs live in [-1, 1] rather than [0, 1] and ``queue`` is flat: both checkers (Gymnasium,
    Stable-Baselines3) warn on other Box actions and on 2-D observations. Between decisions the
    env lets the engine fast-forward decode runs (``hold``) under the ``current`` and ``none``
    rules, whose answers only change with an arrival, a completion or a memory event; under
    ``future`` a later start can pass without any event, so every boundary is checked.
    """

    metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 8}

    def __init__(
        self,
        scenario: str | dict = "jaillet-high",
        action_mode: str = "select",
        reward: str | dict | None = None,
        K: int = 32,
        order: str = "arrival",
        admission: str = "current",
        n_requests: int | None = None,
        horizon_s: float | None = None,
        overrides: dict[str, Any] | None = None,
        flat: bool = False,
        invalid_action: str = "raise",
        expert: str | dict | Scheduler | None = None,
        latency: str | dict | None = None,
        render_mode: str | None = None,
    ) -> None:
        for name, value, allowed in (("action_mode", action_mode, ACTION_MODES), ("order", order, ORDERS),
                                     ("admission", admission, ADMISSION_RULES),
                                     ("invalid_action", invalid_action, INVALID_ACTION)):
            if value not in allowed:
                raise ValueError(f"{name}: {value!r} is not one of {', '.join(allowed)}")
        if not isinstance(K, int | np.integer) or K < 1:
            raise ValueError(f"K: must be an integer >= 1, got {K!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode: {render_mode!r} is not one of ansi, rgb_array")
        self.mode = action_mode
        self.K = int(K)
        self.order = order
        self.admission = admission
        self.flat = bool(flat)
        self.invalid_action = invalid_action
        self.render_mode = render_mode
        self.weights = parse_weights(reward)
        self._overrides = dict(overrides or {})
        if n_requests is not None:
            self._overrides["workload.n_requests"] = int(n_requests)
        if horizon_s is not None:
            self._overrides["engine.horizon_s"] = float(horizon_s)
        if latency is not None:
            self._overrides["latency"] = latency
        if isinstance(scenario, str):
            self._spec = get_scenario(scenario, self._overrides)
        else:
            self._spec = apply_overrides(scenario, self._overrides)
            self._spec.setdefault("name", "custom")
        self.action_space = action_space(action_mode, self.K)
        self.observation_space = obs_mod.observation_space(self.K, self.flat)
        self._adapter = _AgentScheduler(self)
        self._expert: Scheduler | None = None
        self.set_expert(expert)
        self._tracker = RewardTracker(self.weights)
        self._false = np.zeros(self.K, bool)
        self._true = np.ones(1, bool)
        self._others: dict[str, Scheduler] = {}
        self._others_reset: dict[int, int] = {}
        self._plan_cache: tuple[int, int, BatchPlan] | None = None
        self._history: list[tuple[float, float, int]] = []
        self.engine: Engine | None = None
        self._ended = True

    # ------------------------------------------------------------------------------------------
    # experts
    def set_expert(self, expert: str | dict | Scheduler | None) -> None:
        """Attach ``expert`` from the next :meth:`reset` on (its hooks and engine overrides apply)."""
        from llmsched_gym.sim import make_policy

        self._expert = None if expert is None else make_policy(expert)
        forced = dict(getattr(self._expert, "engine_overrides", {}) or {})
        # an agent's batch must always run: forbid (the scenario's or the expert's, which then
        # preempts by itself, something no action expresses) becomes vLLM's LIFO preemption
        if forced.get("overflow", self._spec.get("engine", {}).get("overflow", "forbid")) == "forbid":
            forced["overflow"] = "preempt_lifo_recompute"
        self._adapter.engine_overrides = forced

    def expert_action(self, policy: str | dict | Scheduler | None = None, strict: bool = True):
        """The action ``policy`` would take now, in this env's action mode.

        ``policy`` defaults to the attached ``expert``. A policy that uses engine hooks must be the
        attached one (its state must have seen the whole episode); a stateless one can be any
        registered name or Scheduler. Its ``schedule(view)`` runs once per decision boundary on the
        current engine state; the plan is translated: ``select``: the slot of the first request it
        admits that is not chosen yet, else launch; ``subset``: its admitted slots; ``priority``:
        decreasing positive scores in its admission order, -1 elsewhere. A plan the mode cannot
        express (a request outside the ``K`` slots or masked, a preemption, a chunked prefill,
        paused requests, idling while requests run) raises ``ValueError`` when ``strict``, else
        becomes the launch action. ``knob`` mode has no translation. An attached expert that
        updates its own state inside ``schedule`` (``mcsf`` removes what it admits from its queue)
        stays exact only while the env follows its actions.
        """
        if self._ended:
            raise RuntimeError("expert_action(): the episode has ended; call reset()")
        if self.mode == "knob":
            raise ValueError("expert_action(): knob mode has no translation of a batch plan into knob values")
        pol = self._resolve(policy)
        plan = self._expert_plan(pol)
        admitted, problem = self._plan_admissions(plan)
        k = self.K
        slot_of = {r: i for i, r in enumerate(self._slots)}
        if self.mode == "select":
            pending = [r for r in admitted if r not in self._sel_set]
            if not pending and not problem:
                return k
            if not problem:
                s = slot_of.get(pending[0])
                if s is None:
                    problem = f"request {pending[0]} is not among the {k} slots (order={self.order!r})"
                elif not self._ok[s]:
                    problem = f"request {pending[0]} (slot {s}) is masked by admission={self.admission!r}"
                else:
                    return s
            return self._unrepresentable(pol, problem, strict, k)
        missing = [r for r in admitted if r not in slot_of]
        if missing and not problem:
            problem = f"requests {missing} are not among the {k} slots (order={self.order!r})"
        if self.mode == "subset":
            act = np.zeros(k, np.int8)
            if problem:
                return self._unrepresentable(pol, problem, strict, act)
            act[[slot_of[r] for r in admitted]] = 1
            masked = [slot_of[r] for r in admitted if not self._ok[slot_of[r]]]
            if masked:
                return self._unrepresentable(pol, f"slots {masked} are masked by admission={self.admission!r}",
                                             strict, np.zeros(k, np.int8))
            return act
        scores = np.full(k, -1.0, np.float32)
        if problem:
            return self._unrepresentable(pol, problem, strict, scores)
        for rank, r in enumerate(admitted):
            scores[slot_of[r]] = 1.0 - rank / (len(admitted) + 1)
        return scores

    def _unrepresentable(self, pol: Scheduler, problem: str, strict: bool, launch):
        if strict:
            raise ValueError(f"expert_action(): {pol.name}'s plan cannot be expressed in {self.mode} mode: {problem}")
        return launch

    def _resolve(self, policy) -> Scheduler:
        if policy is None or policy is self._expert:
            if self._expert is None:
                raise ValueError("expert_action(): no policy given and no expert attached (expert=...)")
            return self._expert
        if isinstance(policy, Scheduler):
            pol = policy
        else:
            key = repr(policy)
            pol = self._others.get(key)
            if pol is None:
                from llmsched_gym.sim import make_policy

                pol = self._others[key] = make_policy(policy)
        stateful = [h for h in HOOKS if type(pol).wants(h)]
        if stateful:
            raise ValueError(
                f"expert_action(): {pol.name} uses engine hooks ({', '.join(stateful)}); attach it with "
                "expert=... (or set_expert() before reset) so it sees the whole episode"
            )
        if self._others_reset.get(id(pol)) != self._episode:
            pol.reset(self.engine.config, np.random.default_rng([self._episode_seed, 17]))
            self._others_reset[id(pol)] = self._episode
        return pol

    def _expert_plan(self, pol: Scheduler) -> BatchPlan:
        key = (id(pol), self._bid)
        if self._plan_cache is not None and self._plan_cache[:2] == key:
            return self._plan_cache[2]
        plan = pol.schedule(self.engine.view)
        self._plan_cache = (*key, plan)
        return plan

    def _plan_admissions(self, plan: BatchPlan) -> tuple[list[int], str]:
        e = self.engine
        if plan.idle:
            # launching nothing idles only when nothing runs; otherwise the running requests decode
            return [], "it idles while requests run (no action pauses them)" if e.running else ""
        if plan.preempt:
            return [], f"it preempts {list(plan.preempt)}"
        if plan.pause or not plan.decode:
            return [], "it pauses running requests"
        admitted = []
        for rid, chunk in plan.prefill.items():
            if e.state[rid] != WAITING:
                return [], f"it continues a chunked prefill of request {rid}"
            if chunk and chunk < self._target[rid] - e.prefilled[rid]:
                return [], f"it prefills request {rid} in chunks"
            admitted.append(int(rid))
        return admitted, ""

    # ------------------------------------------------------------------------------------------
    # gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        from llmsched_gym.sim import make_engine

        self._episode_seed = int(seed) if seed is not None else int(self.np_random.integers(2**31 - 1))
        self._episode = getattr(self, "_episode", 0) + 1
        self._wall0 = time.perf_counter()
        engine, _ = make_engine(self._spec, self._adapter, self._episode_seed, self._overrides)
        self.engine = e = engine
        self._setup_episode(e)
        self._tracker.reset(e)
        self._zeros = {"latency": 0.0, "throughput": 0.0, "eviction": 0.0, "slo": 0.0, "fairness": 0.0}
        if self._tracker.has_slo:
            self._zeros["slo_online"] = self._zeros["slo_offline"] = 0.0
        self._n_invalid = 0
        self._plan_cache = None
        self._history = []
        self._ended = False
        self._advance()
        self._ended_in_reset = self._ended
        return self._observe(), self._info(None)

    def step(self, action):
        if self.engine is None:
            raise RuntimeError("step() before reset()")
        if self._ended:
            if not self._ended_in_reset:
                raise RuntimeError("step() after the episode ended; call reset()")
            # the episode ended during reset (nothing to decide at all)
            self._ended_in_reset = False
            return self._observe(), 0.0, self._terminated, not self._terminated, self._info(None)
        mode = self.mode
        if mode == "select":
            if type(action) is not int and isinstance(action, np.ndarray | np.integer) \
                    and action.ndim == 0 and action.dtype.kind in "iu":
                action = int(action)
            if type(action) is int and 0 <= action < len(self._slots) and self._ok[action]:
                self._select(action)
                if self._any:
                    return self._observe(), 0.0, False, False, self._info(None)
            elif not (type(action) is int and action == self.K):
                self._invalid(select_error(action, self.action_masks()))
            self._launch(self._sel)
        elif mode == "subset":
            chosen = check_subset(action, self._ok, self.K)
            if isinstance(chosen, str):
                self._invalid(chosen)
                chosen = np.empty(0, np.int64)
            self._launch(self._filter([int(i) for i in chosen], stop_at_first=False))
        elif mode == "priority":
            scores = check_box(action, self.K, mode)
            if isinstance(scores, str):
                self._invalid(scores)
                self._launch([])
            else:
                n = len(self._slots)
                by_score = np.argsort(-scores[:n], kind="stable")
                order = [int(i) for i in by_score if scores[i] >= 0.0]
                self._launch(self._filter(order, stop_at_first=True))
        else:
            knobs = check_box(action, len(KNOBS), mode)
            if isinstance(knobs, str):
                self._invalid(knobs)
                self._launch([])
            else:
                self._launch(self._knob_batch(knobs))
        reward, comps = self._tracker.collect()
        obs = self._observe()
        terminated = truncated = False
        if self._ended:
            terminated, truncated = self._terminated, not self._terminated
        return obs, reward, terminated, truncated, self._info(comps)

    def action_masks(self) -> np.ndarray:
        """Valid actions now (a fresh bool array; see the class docstring for the layout per mode)."""
        k, n = self.K, len(self._slots)
        if self.mode == "select":
            return np.concatenate((self._ok, self._false[: k - n], self._true))
        if self.mode == "subset":
            m2 = np.zeros((k, 2), dtype=bool)
            m2[:, 0] = True
            m2[:n, 1] = self._ok
            return m2.reshape(-1)
        return np.concatenate((self._ok, self._false[: k - n]))

    def summary(self) -> dict[str, Any]:
        """The run summary of the current episode so far (complete once the episode has ended)."""
        if self._ended and self._summary is not None:
            return self._summary
        return summarize(self.engine, self._spec.get("name", "custom"), "agent", time.perf_counter() - self._wall0)

    def render(self):
        from llmsched_gym.env.render import render_ansi, render_rgb

        if self.render_mode == "ansi":
            return render_ansi(self)
        if self.render_mode == "rgb_array":
            return render_rgb(self)
        return None

    # ------------------------------------------------------------------------------------------
    # episode setup
    def _setup_episode(self, e: Engine) -> None:
        wl = e.workload
        kv = e.kv
        self._n = max(len(wl), 1)
        self._bs = kv.block_size
        self._pad = kv.block_size - 1
        self._emit = 1 if e.config.prefill_emits_token else 0
        self._cap_tokens = kv.capacity_tokens
        self._cap_blocks = kv.capacity_blocks
        self._target = e.prefill_target
        self._gen = e.generated
        self._kvt = e.kv_tokens
        self._pred = wl.predicted_output
        self._prompt = wl.prompt_tokens
        self._arrival = wl.arrival_s
        self._arrival_list = wl.arrival_s.tolist()
        lat = e.latency
        timed = not getattr(lat, "needs_composition", False)
        unit = lat.batch_time(0, 0, 0, 1, 1) if timed else 0.0
        if not unit > 0 and timed:
            unit = lat.batch_time(1, 1, 1, 0, 0)
        self._unit = unit if unit > 0 else 1.0
        self._inv_unit = 1.0 / self._unit
        self._inv_log_time = 1.0 / math.log1p(obs_mod.TIME_RANGE)
        self._inv_log_cap = 1.0 / math.log1p(self._cap_tokens)
        self._inv_log_n = 1.0 / math.log1p(self._n)
        self._rate_window = obs_mod.RATE_WINDOW * self._unit
        self._tbl = obs_mod.token_scale(self._cap_tokens)
        self._fp_run = FutureProfile(self._cap_tokens, len(wl))
        self._fp = FutureProfile(self._cap_tokens, len(wl))
        self._prefix = kv.enabled
        self._multi_client = wl.n_clients > 1
        has_ttft = np.isfinite(wl.ttft_slo_s)
        self._has_ttft = bool(has_ttft.any())
        if self._has_ttft:
            slo = np.where(has_ttft, wl.ttft_slo_s, 1.0)
            self._ttft_mask = has_ttft
            self._deadline = wl.arrival_s + slo
            self._deadline_key = np.where(has_ttft, self._deadline, np.inf)
            self._inv_slo = np.where(has_ttft, 1.0 / slo, 0.0)
        # per-request values that change only when the request is preempted (see _refresh_request):
        # KV blocks its admission needs now, its Eq. (1) line as a candidate, its static features
        target = wl.prompt_tokens
        self._need = (target + (self._emit + self._pad)) // self._bs
        rem = np.maximum(self._pred, 1)
        self._cand_c = rem + (1 - self._emit)
        self._cand_b = target + (self._emit - 1 + self._pad)
        st = np.zeros((len(wl), len(obs_mod.QUEUE_FEATURES)), np.float32)
        st[:, _F["present"]] = 1.0
        st[:, _F["prompt"]] = self._tbl[np.minimum(target, self._cap_tokens)]
        st[:, _F["predicted_output"]] = self._tbl[np.minimum(self._pred, self._cap_tokens)]
        st[:, _F["uncertainty"]] = obs_mod.predictor_spread(self._spec["workload"].get("predictor"), self._pred)
        st[:, _F["task_class"]] = wl.task_class
        st[:, _F["slo_slack"]] = 1.0
        # one more all-zero row pads empty slots; age, prefix hit, service deficit and SLO slack are
        # filled in once per decision boundary for the requests the slots may show (_window)
        self._rows = np.vstack((st, np.zeros((1, st.shape[1]), np.float32)))
        self._room = np.zeros(len(wl))
        self._pad_ids = [len(wl)] * self.K
        self._empty_pad = np.full(self.K, len(wl), np.int64)
        self._arrival_u = wl.arrival_s * self._inv_unit
        self._ones = np.ones(self.K, bool)
        self._last_admit_s = e.clock
        self._last_iter_s = 0.0
        self._bid = 0
        self._summary: dict[str, Any] | None = None
        self._terminated = False
        self._slots: list[int] = []
        self._ok = np.zeros(0, bool)
        self._any = False
        self._sel: list[int] = []
        self._sel_set: set[int] = set()

    def _refresh_request(self, rid: int) -> None:
        """A preempted request's prefill target, remaining output or swap state changed."""
        e = self.engine
        target = int(self._target[rid])
        rem = max(int(self._pred[rid] - self._gen[rid]), 1)
        if e.swapped[rid]:
            self._need[rid] = (int(self._kvt[rid]) + 1 + self._pad) // self._bs
        else:
            self._need[rid] = (target + self._emit + self._pad) // self._bs
        self._cand_c[rid] = rem + 1 - self._emit
        self._cand_b[rid] = target + self._emit - 1 + self._pad
        st = self._rows[rid]
        st[_F["prompt"]] = self._tbl[min(target, self._cap_tokens)]
        st[_F["predicted_output"]] = self._tbl[min(max(int(self._pred[rid] - self._gen[rid]), 0), self._cap_tokens)]

    # ------------------------------------------------------------------------------------------
    # the loop between decisions
    def _advance(self) -> None:
        """Simulate until the agent has something to decide, or the episode ends."""
        e = self.engine
        while e.poll():
            self._boundary()
            if self._any:
                if self.render_mode == "rgb_array":
                    self._history.append((e.clock, e.kv.used_blocks / self._cap_blocks, len(e.waiting)))
                return
            if e.running:
                hold = self.admission != "future" or not e.waiting
                self._execute(BatchPlan(hold=hold))
            elif e.next_idx < e.n:
                self._execute(BatchPlan(idle=True))
            else:
                self._execute(BatchPlan.admit([self._slots[0]]))
        self._end_episode()

    def _end_episode(self) -> None:
        e = self.engine
        self._ended = True
        self._terminated = e.stop_reason == "all requests finished"
        self._summary = summarize(e, self._spec.get("name", "custom"), "agent", time.perf_counter() - self._wall0)
        self._boundary()

    def _execute(self, plan: BatchPlan) -> None:
        e = self.engine
        t0, it0 = e.clock, e.n_iterations
        e.execute(plan)
        if e.n_iterations > it0:
            self._last_iter_s = (e.clock - t0) / (e.n_iterations - it0)

    def _launch(self, ids: list[int]) -> None:
        e = self.engine
        if ids:
            plan = BatchPlan.admit(ids)
            self._last_admit_s = e.clock
        elif e.running:
            plan = BatchPlan()
        elif e.next_idx < e.n:
            plan = BatchPlan(idle=True)
        else:
            plan = BatchPlan.admit([self._slots[0]])
            self._last_admit_s = e.clock
        self._execute(plan)
        self._advance()

    def _invalid(self, message: str) -> None:
        if self.invalid_action == "raise":
            raise InvalidActionError(message)
        self._n_invalid += 1

    # ------------------------------------------------------------------------------------------
    # a decision boundary: residents, free memory, slots and admissibility
    def _boundary(self) -> None:
        e = self.engine
        self._bid += 1
        self._sel = []
        self._sel_set = set()
        self._sel_blocks = 0
        self._sel_hist = [0] * _N_BINS
        self._sel_c: list[int] = []
        self._sel_b: list[int] = []
        self._sel_peaks = 0
        self._residents_ok = False
        self._profile_ok = False
        self._row_upto = self._room_upto = 0
        self._g_base = None
        running = e.running
        if self._bs == 1:
            growth = len(running) - e.n_in_prefill
        elif running:
            run = np.array(running, np.int64)
            if e.n_in_prefill:
                run = run[e.prefilled[run] >= self._target[run]]
            growth = int(np.count_nonzero(self._kvt[run] % self._bs == 0))
        else:
            growth = 0
        self._free = self._cap_blocks - e.kv.used_blocks - growth
        w = e.waiting
        if not w:
            self._queue = self._slots = []
            self._qpos = 0
            self._ids_pad = self._empty_pad
            self._ids = self._ids_pad[:0]
            self._fits_now = self._fits_future = self._ok = self._false[:0]
            self._any = False
            return
        if self.order == "arrival" or len(w) <= 1:
            self._queue = w
        else:
            ids = np.array(w, np.int64)
            if self.order == "shortest":
                key = self._cand_c[ids]
            elif self.order == "prompt":
                key = self._target[ids]
            else:
                key = self._deadline_key[ids] if self._has_ttft else np.zeros(len(ids))
            self._queue = ids[np.argsort(key, kind="stable")].tolist()
        slots = self._queue[: self.K]
        self._qpos = len(slots)
        self._fill_slots(slots)

    def _residents(self) -> None:
        """Arrays of the running requests (KV, remaining-output histogram) and their Eq. (1)
        profile (lines sorted by completion point)."""
        if self._residents_ok:
            return
        self._residents_ok = True
        e = self.engine
        run = np.array(e.running, np.int64)
        kv = self._kvt[run]
        rem = np.maximum(self._pred[run] - self._gen[run], 1)
        self._n_run = len(run)
        self._run_hist = np.bincount(_EDGES_ARRAY.searchsorted(rem, side="right"), minlength=_N_BINS)
        self._run_hist_list = self._run_hist.tolist()
        # sort the lines by completion point: one sort of (c, base) packed into an int64
        packed = np.sort((rem << 32) | (kv + self._pad))
        self._line_c = packed >> 32
        self._line_b = packed & 0xFFFFFFFF
        self._fp_run.build(self._line_c, self._line_b)
        r = np.zeros(len(obs_mod.RUNNING_FEATURES), np.float32)
        n = len(run)
        if n:
            r[0] = math.log1p(n) * self._inv_log_cap
            r[1] = min(e.kv.used_blocks / self._cap_blocks, 2.0)
            r[2:2 + _N_BINS] = self._run_hist * (1.0 / n)
            r[2 + _N_BINS] = min(self._fp_run.peak / self._cap_tokens, 2.0)
        self._run_obs = r

    def _window(self, covered: int) -> tuple[np.ndarray | None, int]:
        """Queue entries the slots may show before the caches filled up to ``covered`` run out
        (``None`` while they last); caches are filled K entries ahead, so that a run of selections
        (each shifts the slots by one) needs no refill."""
        need = self.K + len(self._sel)
        if need <= covered:
            return None, covered
        return np.array(self._queue[: need + self.K], np.int64), need + self.K

    def _rooms(self, ids: np.ndarray) -> np.ndarray:
        """Eq. (1) room of requests ``ids`` (slots) against the running requests (cached per boundary)."""
        new, self._room_upto = self._window(self._room_upto)
        if new is not None:
            self._residents()
            self._room[new] = self._fp_run.room(self._cand_c[new], self._cand_b[new])
        return self._room[ids]

    def _future_fits(self, ids: np.ndarray) -> np.ndarray:
        """The ``future`` rule for requests ``ids`` given the running requests and the batch so far.

        No room against the running requests alone is final (chosen requests only add memory);
        room for every chosen request's peak ``base + c`` held throughout is sufficient. The exact
        profile with the chosen requests' lines is built only when some request falls between."""
        room = self._rooms(ids)
        sure = room >= self._sel_peaks
        if not self._sel_c:
            return sure
        unsure = (room >= 0) > sure
        if not unsure.any():
            return sure
        if not self._profile_ok:
            lc = np.concatenate((self._line_c, self._sel_c))
            lb = np.concatenate((self._line_b, self._sel_b))
            order = lc.argsort(kind="stable")
            self._fp.build(lc[order], lb[order])
            self._profile_ok = True
        cand = ids[unsure]
        sure[unsure] = self._fp.fits(self._cand_c[cand], self._cand_b[cand])
        return sure

    def _fill_slots(self, slots: list[int]) -> None:
        """Show ``slots`` (queue entries not chosen yet) and evaluate the admission rule on them."""
        k = self.K
        self._slots = slots
        n = len(slots)
        # padded with the all-zero feature row, so one gather builds the queue observation
        self._ids_pad = np.array(slots + self._pad_ids[: k - n] if n < k else slots, np.int64)
        ids = self._ids = self._ids_pad[:n]
        self._fits_now = fits = self._need[ids] <= self._free - self._sel_blocks
        self._fits_future = None
        if self.admission == "current":
            ok = fits
        elif self.admission == "none":
            ok = self._ones[:n]
        else:
            ok = self._fits_future = self._future_fits(ids)
        self._ok = ok
        self._any = np.count_nonzero(ok) > 0

    def _select(self, slot: int) -> None:
        slots = self._slots
        rid = slots[slot]
        self._sel.append(rid)
        self._sel_set.add(rid)
        self._take(rid)
        # the slots shift up by one and the next queue entry (never chosen yet) enters at the end
        slots = slots.copy()
        del slots[slot]
        if self._qpos < len(self._queue):
            slots.append(self._queue[self._qpos])
            self._qpos += 1
        self._fill_slots(slots)

    def _take(self, rid: int) -> None:
        """Reserve ``rid``'s KV and add its Eq. (1) line to the batch being formed."""
        c, b = int(self._cand_c[rid]), int(self._cand_b[rid])
        self._sel_blocks += int(self._need[rid])
        self._sel_c.append(c)
        self._sel_b.append(b)
        self._sel_peaks += c + b
        self._sel_hist[bisect.bisect_right(_EDGES, c - 1 + self._emit)] += 1
        self._profile_ok = False

    def _admissible(self, rid: int) -> bool:
        rule = self.admission
        if rule == "current":
            return int(self._need[rid]) <= self._free - self._sel_blocks
        if rule == "future":
            return bool(self._future_fits(np.array([rid]))[0])
        return True

    def _filter(self, slots: list[int], stop_at_first: bool) -> list[int]:
        """Admit ``slots`` in the given order while the admission rule allows (skipping or stopping)."""
        admitted: list[int] = []
        for s in slots:
            rid = self._slots[s]
            if self._admissible(rid):
                admitted.append(rid)
                self._take(rid)
            elif stop_at_first:
                break
        return admitted

    def _knob_batch(self, knobs: np.ndarray) -> list[int]:
        alpha, budget = knob_values(knobs, self._cap_tokens)
        limit = (1.0 - alpha) * self._cap_tokens
        used = self.engine.kv.used_tokens
        bs = self._bs
        order, tokens, reserved = [], 0, 0
        for s, rid in enumerate(self._slots):
            p = int(self._target[rid])
            need = int(self._need[rid]) * bs
            if used + reserved + need > limit or tokens + p > budget:
                break
            order.append(s)
            tokens += p
            reserved += need
        return self._filter(order, stop_at_first=True)

    # ------------------------------------------------------------------------------------------
    # observation and info
    def _observe(self):
        e = self.engine
        n = len(self._slots)
        now = e.clock
        if n:
            ids = self._ids
            new, self._row_upto = self._window(self._row_upto)
            if new is not None:
                self._fill_rows(new, now)
        q = self._rows.take(self._ids_pad, axis=0)
        if n:
            q[:n, _F["fits_now"]] = self._fits_now
            ff = self._fits_future
            if ff is None:
                # not the admission rule: the chosen requests count at their peak throughout
                ff = self._fits_future = self._rooms(ids) >= self._sel_peaks
            q[:n, _F["fits_future"]] = ff
        self._residents()
        n_sel = len(self._sel)
        if n_sel:
            r = self._run_obs.copy()
            n_res = self._n_run + n_sel
            r[0] = math.log1p(n_res) * self._inv_log_cap
            r[1] = min((e.kv.used_blocks + self._sel_blocks) / self._cap_blocks, 2.0)
            inv = 1.0 / n_res
            r[2:2 + _N_BINS] = [(a + b) * inv for a, b in zip(self._run_hist_list, self._sel_hist, strict=True)]
            r[3 + _N_BINS] = math.log1p(n_sel) * self._inv_log_cap
        else:
            r = self._run_obs.copy()
        gb = self._g_base
        if gb is None:  # all but the queue length are constant while a batch forms
            recent = e.next_idx - bisect.bisect_left(self._arrival_list, now - self._rate_window, 0, e.next_idx)
            gb = self._g_base = (
                min(e.kv.used_blocks / self._cap_blocks, 2.0),
                math.log1p(recent) * self._inv_log_n,
                min(math.log1p((now - self._last_admit_s) * self._inv_unit) * self._inv_log_time, 1.0),
                min(math.log1p(self._last_iter_s * self._inv_unit) * self._inv_log_time, 1.0),
                e.next_idx / self._n,
            )
        g = np.array((gb[0], math.log1p(len(e.waiting) - n_sel) * self._inv_log_n, *gb[1:]), np.float32)
        if self.flat:
            return np.concatenate((q.reshape(-1), r, g))
        return {"queue": q.reshape(-1), "running": r, "globals": g}

    def _fill_rows(self, ids: np.ndarray, now: float) -> None:
        """The boundary-dependent queue features of requests ``ids`` (constant while a batch forms)."""
        e, rows = self.engine, self._rows
        age = np.log1p(now * self._inv_unit - self._arrival_u[ids])
        age *= self._inv_log_time
        rows[ids, _F["age"]] = np.minimum(age, 1.0, out=age)
        if self._prefix:
            rows[ids, _F["prefix_hit"]] = [e.kv.match_tokens(r) / self._prompt[r] for r in ids.tolist()]
        if self._multi_client:
            rows[ids, _F["service_deficit"]] = self._deficit(ids)
        if self._has_ttft:
            slack = np.clip((self._deadline[ids] - now) * self._inv_slo[ids], -1.0, 1.0)
            rows[ids, _F["slo_slack"]] = np.where(self._ttft_mask[ids], slack, 1.0)

    def _deficit(self, ids: np.ndarray) -> np.ndarray:
        e = self.engine
        wl = e.workload
        sv = client_service(e) / wl.client_weight
        active = np.bincount(wl.client[: e.next_idx], minlength=wl.n_clients) > 0
        top = float(sv[active].max()) if active.any() else 0.0
        return np.clip((top - sv[wl.client[ids]]) / (top + 1.0), 0.0, 1.0)

    def _info(self, comps: dict[str, float] | None) -> dict[str, Any]:
        info: dict[str, Any] = {
            "action_mask": self.action_masks().view(np.int8),
            "reward_components": comps if comps is not None else self._zero_components(),
            "invalid_actions": self._n_invalid,
            "clock_s": self.engine.clock,
        }
        if self._ended:
            info["summary"] = copy.deepcopy(self._summary)
        return info

    def _zero_components(self) -> dict[str, float]:
        return self._zeros.copy()


class _AgentScheduler(Scheduler):
    """The env as the engine's Scheduler: it forms no plan itself (the env drives the engine) but
    feeds the reward tracker and forwards the engine's hooks to an attached expert."""

    name = "agent"

    def __init__(self, env: LLMSchedEnv) -> None:
        self.env = env
        self.engine_overrides: dict[str, Any] = {}

    def wants(self, hook: str) -> bool:  # type: ignore[override]
        if hook in ("on_finish", "on_preempt"):
            return True
        expert = self.env._expert
        return expert is not None and type(expert).wants(hook)

    def reset(self, config, rng: np.random.Generator) -> None:
        super().reset(config, rng)
        if self.env._expert is not None:
            # the expert gets the policy stream simulate() would give it
            self.env._expert.reset(config, rng)

    def schedule(self, view: EngineView) -> BatchPlan:
        raise RuntimeError("the LLMSched-v0 adapter is driven by env.step(), not engine.run()")

    def on_arrival(self, req_id: int, view: EngineView) -> bool:
        ok = self.env._expert.on_arrival(req_id, view)
        if not ok:
            self.env._tracker.on_reject(req_id)
        return ok

    def on_tokens(self, req_ids: np.ndarray, n: int, view: EngineView) -> None:
        self.env._expert.on_tokens(req_ids, n, view)

    def on_prefill(self, req_id: int, n_tokens: int, view: EngineView) -> None:
        self.env._expert.on_prefill(req_id, n_tokens, view)

    def on_preempt(self, req_id: int, view: EngineView) -> None:
        self.env._refresh_request(req_id)
        expert = self.env._expert
        if expert is not None and type(expert).wants("on_preempt"):
            expert.on_preempt(req_id, view)

    def on_finish(self, req_id: int, view: EngineView) -> None:
        self.env._tracker.on_finish(req_id, view.now)
        expert = self.env._expert
        if expert is not None and type(expert).wants("on_finish"):
            expert.on_finish(req_id, view)

    def reject_reason(self, req_id: int) -> str:
        expert = self.env._expert
        return expert.reject_reason(req_id) if expert is not None else super().reject_reason(req_id)
