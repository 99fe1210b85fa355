"""``LLMSched-v1``: the Gymnasium environment (its class docstring is the manual).

The env is put together from parts, each in its module: the arguments' checks
(:mod:`~llmsched_gym.env.settings`), the decision point (:mod:`~llmsched_gym.env.decision`), the
action modes (:mod:`~llmsched_gym.env.modes`), which reach the episode only through its engine
driver (:mod:`~llmsched_gym.env.driver`), the observation (:mod:`~llmsched_gym.env.observation`),
the reward (:mod:`~llmsched_gym.env.reward`), the engine's scheduler adapter
(:mod:`~llmsched_gym.env.adapter`) and the expert replay (:mod:`~llmsched_gym.env.experts`).
"""

from __future__ import annotations

import copy
import time
from typing import Any

import gymnasium as gym
import numpy as np

from llmsched_gym.config import ConfigError, explicit_engine_keys
from llmsched_gym.core.engine import Engine
from llmsched_gym.core.information import BLIND, information_of
from llmsched_gym.core.metrics import summarize
from llmsched_gym.core.scenarios import resolve_scenario
from llmsched_gym.core.scheduler import Scheduler
from llmsched_gym.env import ENV_ID
from llmsched_gym.env.actions import DEFAULT_BUDGETS, check_budgets
from llmsched_gym.env.adapter import AgentScheduler
from llmsched_gym.env.decision import DecisionPoint
from llmsched_gym.env.driver import Driver
from llmsched_gym.env.experts import ExpertReplay
from llmsched_gym.env.modes import make_mode
from llmsched_gym.env.observation import ObservationBuilder
from llmsched_gym.env.reward import RewardTracker, parse_weights
from llmsched_gym.env.settings import (
    RENDER_MODES,
    check_args,
    check_information,
    mode_policies,
    scenario_overrides,
)
from llmsched_gym.sim import scenario_engine


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

    ``queue``: ``K x 12`` values, slot-major (feature ``f`` of slot ``i`` at ``12 i +
    f``); an empty slot is all zeros.

    ===  ==================  ===========  ===================================================================================================================================================
    i    name                range        meaning
    ===  ==================  ===========  ===================================================================================================================================================
    0    present             [0, 1]       1 if a request occupies the slot (all other features are 0 when not)
    1    prompt              [0, 1]       tokens to prefill (prompt, + generated after a recompute preemption), log-scaled
    2    predicted_output    [0, 1]       predicted output tokens still to generate, log-scaled (blind: tokens generated so far, non-zero after a recompute preemption)
    3    uncertainty         [0, 1]       relative spread of the predictor (0 oracle, x for noisy(x), min(sigma, 1) for lognormal, bucket width; blind: 1)
    4    age                 [0, 1]       time since arrival, log-scaled
    5    prefix_hit          [0, 1]       fraction of the prompt the prefix cache would serve now
    6    service_deficit     [0, 1]       (max client service - this client's) / (max + 1), weighted service
    7    task_class          [0, 1]       0 online, 1 offline
    8    slo_slack           [-1, 1]      (TTFT deadline - now) / TTFT SLO, clipped; 1 without a TTFT SLO
    9    fits_now            [0, 1]       1 if it passes the 'current' admission rule given the batch so far
    10   fits_future         [0, 1]       1 if it passes the 'future' (MC-SF Eq. (1)) rule given the batch so far (chosen requests counted at their peak unless admission='future'; blind: 0)
    11   prefilled           [0, 1]       fraction of the prompt whose KV is already computed (a swapped-out request keeps it)
    ===  ==================  ===========  ===================================================================================================================================================

    ``running``: about the running requests (less those chosen for preemption) plus those chosen
    for the batch being formed.

    ===  ==================  ===========  ================================================================================================================================================================
    i    name                range        meaning
    ===  ==================  ===========  ================================================================================================================================================================
    0    count               [0, 1]       running requests + requests chosen for this batch, log1p(n) / log1p(M)
    1    kv_used             [0, 2]       (KV used + KV reserved by the batch being formed) / capacity
    2    remaining_hist_0    [0, 1]       fraction of them with predicted remaining output in [1, 2) (blind: tokens generated so far, in [0, 2))
    3    remaining_hist_1    [0, 1]       fraction of them with predicted remaining output in [2, 8) (blind: tokens generated so far, in [2, 8))
    4    remaining_hist_2    [0, 1]       fraction of them with predicted remaining output in [8, 32) (blind: tokens generated so far, in [8, 32))
    5    remaining_hist_3    [0, 1]       fraction of them with predicted remaining output in [32, 128) (blind: tokens generated so far, in [32, 128))
    6    remaining_hist_4    [0, 1]       fraction of them with predicted remaining output in [128, 512) (blind: tokens generated so far, in [128, 512))
    7    remaining_hist_5    [0, 1]       fraction of them with predicted remaining output in [512, 2048) (blind: tokens generated so far, in [512, 2048))
    8    remaining_hist_6    [0, 1]       fraction of them with predicted remaining output in [2048, 8192) (blind: tokens generated so far, in [2048, 8192))
    9    remaining_hist_7    [0, 1]       fraction of them with predicted remaining output in [8192, inf) (blind: tokens generated so far, in [8192, inf))
    10   future_peak         [0, 2]       predicted future KV peak of the running requests alone (Eq. (1)) / capacity (blind: 0)
    11   selected            [0, 1]       requests chosen for this batch so far (select mode), log1p(n) / log1p(M)
    12   prefilling          [0, 1]       running requests with an unfinished (chunked) prefill, log1p(n) / log1p(M)
    13   prefill_owed        [0, 2]       prompt tokens those still have to prefill, log-scaled
    14   preempting          [0, 1]       running requests chosen for preemption in the batch being formed, log1p(n) / log1p(M)
    15   batch_tokens        [0, 2]       tokens the batch being formed computes with an unlimited budget (decodes + prompt tokens owed by unfinished prefills + the chosen requests' prompts), log-scaled
    ===  ==================  ===========  ================================================================================================================================================================

    ``globals``:

    ===  =====================  ===========  ===============================================================================================
    i    name                   range        meaning
    ===  =====================  ===========  ===============================================================================================
    0    kv_used                [0, 2]       KV used / capacity (above 1 only after an overflow a clear handler left)
    1    queue_len              [0, 1]       waiting requests not chosen yet, log1p(n) / log1p(N requests)
    2    arrival_rate           [0, 1]       arrivals in the last RATE_WINDOW time units, log1p(n) / log1p(N requests)
    3    since_batch            [0, 1]       time since the last batch that admitted a request, log-scaled
    4    last_iteration         [0, 1]       duration of the last iteration, log-scaled
    5    arrived                [0, 1]       fraction of the episode's requests that have arrived
    6    last_prefill_tokens    [0, 2]       prompt tokens the last iteration prefilled, log-scaled
    7    last_decode_tokens     [0, 2]       requests the last iteration decoded, log-scaled
    8    budget                 [0, 2]       token budget of the last batch, log-scaled; 2 when unlimited
    9    backlog                [0, 2]       prompt tokens the waiting requests still have to prefill, log-scaled (> 1: more than the cache)
    10   stall                  [0, 1]       time since the running request that waited longest last got a token or a chunk, log-scaled
    ===  =====================  ===========  ===============================================================================================

    ``budgets`` (``select`` mode): one value per launch action, the latency model's prediction of
    the batch's duration with that budget (decodes first, then the unfinished prefills and the
    chosen requests' prompts), ``log1p(t / u) / log1p(1e6)``.

    **Reward** (``reward``: a dict of weights, default ``{"latency": 1.0}``; see
    ``llmsched_gym.env.reward``): the weighted sum of the step's components, measured over the
    iterations simulated since the previous step. ``latency``: minus the request-seconds spent in
    the system (sums exactly to minus the summary's ``total_latency_s`` when every request
    completes); ``throughput``: output tokens generated; ``eviction``: minus tokens recomputed after
    preemptions and clears; ``slo``: minus requests that missed their TTFT/TPOT SLO; ``fairness``:
    minus Sheng et al. 2024's per-tick service difference between clients (over the trailing 60 s)
    times the step's duration; ``ttft_tail`` (only when weighted, ``{"weight": w, "threshold_s":
    c}``): minus the seconds requests waited for their first token beyond ``c`` (sums to minus
    ``sum_i max(0, TTFT_i - c)``, a conditional-value-at-risk surrogate of a TTFT percentile). Steps that only
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

    **Experts.** ``expert=`` attaches a policy (registered name, ``{"name": ..., **params}`` or a
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
    * ``candidates``: ``meta`` mode's policies (names or ``{"name": ..., **params}``).
    * ``base``, ``tune``: ``tune`` mode's policy and ``{parameter: [low, high]}``.
    * ``decide_every_s``: ``meta`` and ``tune`` only: after a decision the next one comes no
      sooner than this many simulated seconds later; the boundaries in between run the chosen
      candidate, or the base policy with the chosen parameters (default: every boundary at which a
      request waits or a prefill is unfinished). Fewer, longer steps: each step's reward then
      covers about the same stretch of time whatever the action, so that a per-step discount or
      GAE does not favour actions that merely make iterations shorter.
    * ``n_requests``, ``horizon_s``: episode length (``workload.n_requests``, ``engine.horizon_s``).
    * ``overrides``: dotted scenario overrides, as ``--set`` (``{"engine.kv_capacity_tokens": 8000}``).
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

    **Version history.** ``LLMSched-v1``: information models; under ``blind`` the
    output-length features are replaced as above and prediction-based choices are refused or
    masked; ``info["information"]`` and ``info["env"]`` on every step, ``summary["env"]``; with a
    clairvoyant or predicted scenario the observations, masks and rewards are v0's. A later v1 release
    changed the ``fairness`` component (its old sum was fixed by the workload; see
    :mod:`~llmsched_gym.env.reward`): rewards with a fairness weight, and
    ``info["reward_components"]["fairness"]`` of multi-client workloads, differ from before.
    ``LLMSched-v0``: the first version (its default action mode became ``select`` without a
    version change); retired: ``gymnasium.make("LLMSched-v0")`` raises Gymnasium's
    ``DeprecatedEnv`` naming v1. Note that the built-in ``azure-conv`` became ``predicted`` at the
    same time (a log-normal predictor error; it was clairvoyant), which changes its episodes under
    any version: ``overrides={"workload.predictor": {"type": "oracle"}}`` is the old task.
    """

    metadata = {"render_modes": list(RENDER_MODES), "render_fps": 8}

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
        decide_every_s: float | None = None,
        overrides: dict[str, Any] | None = None,
        flat: bool = False,
        invalid_action: str = "noop",
        invalid_penalty: float = 0.0,
        expert: str | dict | Scheduler | None = None,
        latency: str | dict | None = None,
        render_mode: str | None = None,
    ) -> None:
        a = check_args(action_mode=action_mode, order=order, admission=admission, invalid_action=invalid_action,
                       K=K, budget=budget, max_num_seqs=max_num_seqs, render_mode=render_mode,
                       invalid_penalty=invalid_penalty, flat=flat, n_requests=n_requests, horizon_s=horizon_s,
                       decide_every_s=decide_every_s,
                       overrides={} if overrides is None else overrides)
        self.mode, self.K, self.order, self.admission = action_mode, a["K"], order, admission
        self.budgets = check_budgets(budgets)
        self.budget, self.flat, self.invalid_penalty = a["budget"], a["flat"], a["invalid_penalty"]
        self.invalid_action, self.render_mode = invalid_action, render_mode
        self.weights = parse_weights(reward)
        self._overrides = scenario_overrides(a["overrides"], a["n_requests"], a["horizon_s"], latency)
        self.scenario = resolve_scenario(scenario, self._overrides)
        self.information = information_of(self.scenario)
        check_information(order, admission, self.information)
        pols = mode_policies(action_mode, candidates, base, tune, self.scenario.get("name", ""), self.information)
        self.switch, self.base, self.tune = pols.switch, pols.base, pols.tune
        self.dp = DecisionPoint(self.K, order, admission, a["max_num_seqs"])
        self.driver = Driver(self.dp, invalid_action == "raise", record=render_mode == "rgb_array")
        if a["decide_every_s"] is not None and action_mode not in ("meta", "tune"):
            raise ConfigError(f"decide_every_s: only the meta and tune action modes hold a decision, "
                              f"not {action_mode!r}")
        self._mode = make_mode(action_mode, self.driver, self.dp, self.K, budgets=self.budgets, budget=self.budget,
                               blind=self.information == BLIND, switch=self.switch, base=self.base, tune=self.tune,
                               decide_every_s=a["decide_every_s"])
        self.action_space = self._mode.space
        self._obs = ObservationBuilder(self.K, self.flat, self.budgets if action_mode == "select" else None)
        self.observation_space = self._obs.space
        self._tracker = RewardTracker(self.weights)
        self._adapter = AgentScheduler(self._tracker, self._refresh_request)
        self._experts = ExpertReplay(self._mode, self.information)
        self.set_expert(expert)
        self.engine: Engine | None = None
        self.episode_seed: int | None = None
        self._episode = 0
        self._ended = True

    # ------------------------------------------------------------------------------------------
    # experts
    def set_expert(self, expert: str | dict | Scheduler | None) -> None:
        """Attach ``expert`` from the next :meth:`reset` on (its hooks and engine overrides apply)."""
        pol = self._experts.attach(expert, self.switch)
        delegate = self.switch or self.base or pol
        self._adapter.attach(delegate, self.scenario.get("engine", {}).get("overflow", "forbid"))

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
        return self._experts.action(policy, strict, self.dp.bid)

    def fallback_action(self):
        """The launch action of the current mode (what an inexpressible expert plan becomes)."""
        return self._mode.fallback()

    # ------------------------------------------------------------------------------------------
    # gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.episode_seed = int(seed) if seed is not None else int(self.np_random.integers(2**31 - 1))
        self._episode += 1
        if self.engine is not None:  # free the last episode now, not at the next cyclic collection
            self.engine.close()
            self.engine = None
        self._wall0 = time.perf_counter()
        self.engine = e = scenario_engine(self.scenario, self._adapter, self.episode_seed,
                                          explicit_engine_keys(self._overrides))
        mode, driver = self._mode, self.driver
        driver.start(e, self.budgets[0] if self.mode == "select" else self.budget, mode.decides, mode.between)
        mode.start()
        self._obs.setup(e, self.dp, self.information, self.scenario["workload"].get("predictor"))
        self._tracker.reset(e)
        self._zeros = {"latency": 0.0, "throughput": 0.0, "eviction": 0.0, "slo": 0.0, "fairness": 0.0}
        if self._tracker.has_slo:
            self._zeros["slo_online"] = self._zeros["slo_offline"] = 0.0
        if self._tracker.has_tail:
            self._zeros["ttft_tail"] = 0.0
        self._experts.start(e, self._episode, self.episode_seed)
        self._summary: dict[str, Any] | None = None
        self._return = 0.0
        self._steps = 0
        self._ended = False
        driver.advance()
        self._check_end()
        self._ended_in_reset = self._ended
        return self._observe(), self._info(None)

    def step(self, action):
        reward, terminated, truncated, comps = self._step(action)
        return self._observe(), reward, terminated, truncated, self._info(comps)

    def _step(self, action, ranked: list[int] | None = None) -> tuple[float, bool, bool, dict[str, float] | None]:
        """:meth:`step` without the observation and the info (the vector env builds those itself):
        the reward, terminated, truncated and the reward components (``None``: all zero).
        ``ranked``: ``priority`` mode, ``action`` already checked and ranked
        (:func:`~llmsched_gym.env.modes.rank_scores`)."""
        if self.engine is None:
            raise RuntimeError("step() before reset()")
        if self._ended:
            if not self._ended_in_reset:
                raise RuntimeError("step() after the episode ended; call reset()")
            # the episode ended during reset (nothing to decide at all)
            self._ended_in_reset = False
            return 0.0, self._terminated, not self._terminated, None
        driver = self.driver
        bid, invalid0 = self.dp.bid, driver.n_invalid
        if ranked is None:
            self._mode.step(action)
        else:
            self._mode.admit_ranked(ranked)
        self._steps += 1
        if driver.ended:
            self._check_end()
        if self.dp.bid == bid and not self._ended:  # still forming the same batch
            reward = -self.invalid_penalty * (driver.n_invalid - invalid0)
            self._return += reward
            return reward, False, False, None
        reward, comps = self._tracker.collect()
        reward -= self.invalid_penalty * (driver.n_invalid - invalid0)
        self._return += reward
        if self._ended:
            return reward, self._terminated, not self._terminated, comps
        return reward, False, False, comps

    def _check_end(self) -> None:
        """Once the driver's episode has ended: terminated or truncated, and the summary."""
        if self.driver.ended and not self._ended:
            self._ended = True
            self._terminated = self.engine.stop_reason == "all requests finished"
            self._summary = self._summarize()

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
        s = summarize(self.engine, self.scenario.get("name", "custom"), "agent", time.perf_counter() - self._wall0)
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
            return render_ansi(self.engine, self.dp, not self._ended)
        if self.render_mode == "rgb_array":
            return render_rgb(self.driver.history)
        return None

    # ------------------------------------------------------------------------------------------
    # what the other parts read
    def _refresh_request(self, rid: int) -> None:
        """A preempted request's tables (the engine's ``on_preempt`` hook, through the adapter)."""
        self.dp.refresh(rid)
        self._obs.refresh(rid)

    def _observe(self):
        return self._obs.observe(self.driver.recent)

    def _info(self, comps: dict[str, float] | None) -> dict[str, Any]:
        info: dict[str, Any] = {
            "action_mask": self._mode.info_mask(),
            "reward_components": comps if comps is not None else self._zeros.copy(),
            "invalid_actions": self.driver.n_invalid,
            "clock_s": self.engine.clock,
            "information": self.information,
            "env": ENV_ID,
        }
        if self._ended:
            info["summary"] = copy.deepcopy(self._summary)
            info["episode_stats"] = {"r": self._return, "l": self._steps,
                                     "t": round(time.perf_counter() - self._wall0, 6)}
        return info
