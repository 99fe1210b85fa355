"""``LLMSchedCluster-v0``: routing as an RL task. The agent picks a replica for each arriving
request of a cluster (:mod:`llmsched_gym.core.cluster`); the replicas run their own scheduler.

    env = gymnasium.make("llmsched_gym:LLMSchedCluster-v0", scenario="mooncake-conv", n_replicas=8,
                         expert="llm-d", overrides={"workload.n_requests": 2000})
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(env.unwrapped.expert_action())

* **Action**: ``Discrete(N)``, the replica. ``info["action_mask"]`` (and :meth:`action_masks`, the
  name ``sb3_contrib``'s ``MaskablePPO`` calls) marks the replicas whose KV can hold the request at
  all (all of them when none can: the request is then rejected wherever it goes).
* **Observation**: ``Box(N * 5 + 2)``, float32 in [0, 1e6]: per replica its queued requests / 32, running
  requests / 256, KV headroom (free fraction), queued prompt tokens / KV capacity and the share of
  this request's prompt its prefix cache holds now; then this request's prompt tokens / the largest
  KV capacity and its predicted output / 1024 (0 when the information model hides it). Load
  signals are the cluster's (``refresh_s``: exact at 0, else snapshots).
* **End**: the last step's ``info["summary"]`` is the cluster summary (:meth:`summary`, the
  ``serving`` block as ``simulate_cluster``'s), what training and evaluation read.
* **Reward**: the ``latency`` component of ``LLMSched-v1``: minus the request-seconds spent in the
  system since the previous decision (requests arrived by then and not yet completed or rejected),
  so an episode's rewards sum to minus the summary's ``total_latency_s`` when every request
  completes (the last step adds the time of requests left unfinished).
* **Experts**: :meth:`expert_action` is the attached router's choice for the current request
  (``expert=``, any name of :data:`baselines.routers.ROUTERS`; by default the scenario's
  ``cluster.router``). Following it at every step
  reproduces ``simulate_cluster`` with that router exactly (same seed: the router is the cluster's
  own, with its own seeded stream). The router's state (a round-robin counter, prefix trees) is
  built from its own choices, so after the agent departs from it the expert is approximate.

With one replica there is nothing to decide: the episode ends at ``reset`` (``terminated`` at the
first step is not reached; ``info["done"]`` is True).

**Disaggregated serving** (``pools=``, as :func:`~llmsched_gym.cluster_sim.simulate_cluster`
takes them; :mod:`llmsched_gym.core.disagg`): the agent picks a pair for each arrival.

* **Action**: ``Discrete(N * N)``, ``a = p * N + d``: prefill on replica ``p``, decode on ``d``;
  ``p == d`` runs the request whole on ``d`` (no transfer), so the agent is the decider too. The
  mask allows ``d`` among the decode-capable replicas (``decode``, ``mixed``) whose KV holds the
  request, and ``p`` among the prefill-capable ones (``prefill``, ``mixed``) that hold it, or
  ``p == d``. A pair the roles rule out (``d`` a prefill replica, or ``p`` a decode replica
  other than ``d``) is replaced by the lowest allowed pair.
* **Observation**: ``Box(N * 7 + 2)``: the five features above per replica, then its role
  (0 prefill, 0.5 mixed, 1 decode) and the requests bound for it as decode replica and not yet
  there (prefilling, waiting for room or in transfer) / 32; then the two request features.
* **Reward**: as above, request-seconds in the system (TTFT at the prefill's first token,
  completion on the decode replica).
* **Expert**: the pair router (``expert`` for both pools, the pools' ``router`` keys, and
  ``decider``; or ``expert="splitwise-mixed"``); following :meth:`expert_action` reproduces ``simulate_cluster(..., pools=...)``
  exactly.
"""

from __future__ import annotations

import bisect
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from llmsched_gym.config import ConfigError
from llmsched_gym.core.cluster import DEFAULT_REFRESH_S
from llmsched_gym.core.information import BLIND, information_of

FEATURES = 5
POOL_FEATURES = FEATURES + 2
ROLE_CODE = {"prefill": 0.0, "mixed": 0.5, "decode": 1.0}
OBS_HIGH = 1e6
"""Observations are clipped to [0, OBS_HIGH]."""


class LLMSchedClusterEnv(gym.Env):
    """The routing env (see the module docstring).

    :param scenario: a scenario name, ``.yml`` file or dict (as ``LLMSched-v1``).
    :param n_replicas: N (default: the scenario's ``cluster.n_replicas``, else 8; with pools, their total).
    :param policy: the replicas' scheduler (default: the scenario's).
    :param expert: the router :meth:`expert_action` follows (default: the scenario's
        ``cluster.router`` with its parameters, else round-robin).
    :param refresh_s: load-signal refresh interval (0 = exact; default: the scenario's
        ``cluster.refresh_s``, else :data:`~llmsched_gym.core.cluster.DEFAULT_REFRESH_S`).
    :param overrides: dotted scenario overrides.
    :param router_params: the expert router's parameters.
    :param pools: disaggregated serving: the pools (see the module docstring).
    :param transfer: the KV link of the pools.
    :param decider: the expert's decider (the agent decides through ``p == d``).
    """

    metadata = {"render_modes": []}

    def __init__(self, scenario: str | dict = "mooncake-conv", n_replicas: int | None = None, policy: str | dict | None = None,
                 expert: str | None = None, refresh_s: float | None = None,
                 overrides: dict[str, Any] | None = None, router_params: dict[str, Any] | None = None,
                 pools: dict[str, dict[str, Any]] | None = None, transfer: dict[str, Any] | None = None,
                 decider: str | dict[str, Any] = "always") -> None:
        from baselines.route_pair import PAIR_ROUTERS
        from baselines.routers import ROUTERS
        from llmsched_gym.cluster_sim import cluster_settings
        from llmsched_gym.core.scenarios import resolve_scenario

        spec = resolve_scenario(scenario, overrides)
        self.information = information_of(spec)
        """What the observation tells of output lengths (``clairvoyant``, ``predicted``, ``blind``)."""
        if pools is None:  # the scenario's cluster section fills what the arguments leave open
            declared = spec.get("cluster") or {}
            if isinstance(expert, str) and expert not in ROUTERS:
                raise ConfigError(f"expert: unknown router {expert!r}; allowed: {', '.join(ROUTERS)}")
            if n_replicas is not None and (not isinstance(n_replicas, int) or isinstance(n_replicas, bool)
                                           or not 1 <= n_replicas <= 4096):
                raise ConfigError(f"n_replicas: expected an integer in 1..4096, got {n_replicas!r}")
            n_given = n_replicas if n_replicas is not None else declared.get("n_replicas", 8)
            c = cluster_settings(spec, expert, n_given, router_params, refresh_s)
            n_replicas, refresh_s = c["n_replicas"], c["refresh_s"]
            expert, router_params = c["router"], c["router_params"] or router_params
        expert = "round-robin" if expert is None else expert
        refresh_s = DEFAULT_REFRESH_S if refresh_s is None else refresh_s
        allowed = list(ROUTERS) + (list(PAIR_ROUTERS) if pools is not None else [])
        if expert not in allowed:
            raise ConfigError(f"expert: unknown router {expert!r}; allowed: {', '.join(allowed)}")
        self.pools, self.transfer, self.decider = pools, transfer, decider
        if pools is not None:  # the pools' sizes fix N (validated in full at reset)
            sizes = [p.get("n", 1) if isinstance(p, dict) else 0 for p in (pools.values() if isinstance(pools, dict)
                                                                           else [])]
            n_pool = sum(x for x in sizes if isinstance(x, int) and not isinstance(x, bool))
            if n_pool < 1:
                raise ConfigError(f"pools: expected a mapping of prefill, decode (and mixed) pools, got {pools!r}")
            n_replicas = n_pool if n_replicas is None else n_replicas
        n_replicas = 8 if n_replicas is None else n_replicas
        if not isinstance(n_replicas, int) or isinstance(n_replicas, bool) or not 1 <= n_replicas <= 4096:
            raise ConfigError(f"n_replicas: expected an integer in 1..4096, got {n_replicas!r}")
        self.scenario, self.n_replicas, self.policy, self.expert = scenario, n_replicas, policy, expert
        self.refresh_s, self.overrides, self.router_params = refresh_s, overrides, router_params
        n = n_replicas
        if pools is None:
            self.action_space = spaces.Discrete(n)
            self.observation_space = spaces.Box(0.0, OBS_HIGH, (n * FEATURES + 2,), np.float32)
        else:
            self.action_space = spaces.Discrete(n * n)
            self.observation_space = spaces.Box(0.0, OBS_HIGH, (n * POOL_FEATURES + 2,), np.float32)
        self.cluster = None
        self._steps = None
        self._rid = -1

    # ---- episode ----------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        from llmsched_gym.cluster_sim import make_cluster

        ep_seed = int(self.np_random.integers(2**31)) if seed is None else int(seed)
        if self.pools is None:
            self.cluster, self._spec = make_cluster(self.scenario, self.policy, self.expert, self.n_replicas, ep_seed,
                                                    self.overrides, self.router_params, self.refresh_s)
        else:
            self.cluster, self._spec = make_cluster(self.scenario, self.policy, self.expert, self.n_replicas, ep_seed,
                                                    self.overrides, self.router_params, None, None, None,
                                                    self.pools, self.transfer, self.decider)
        c = self.cluster
        self._arrival = c.workload.arrival_s.tolist()
        self._arrival_cum = np.concatenate(([0.0], np.cumsum(c.workload.arrival_s)))
        self._blind = information_of(c.workload) == BLIND
        self._cap = float(c.view.kv_capacity.max())
        self._lat = 0.0  # request-seconds accrued up to the previous decision
        self._expert_for = -1
        self._steps = c.decisions()
        self._next(None)
        return self._obs(), self._info()

    def step(self, action):
        if self._rid < 0:
            raise RuntimeError("step(): the episode has ended; call reset()")
        a, n = int(action), self.n_replicas
        if self.pools is None:
            if not 0 <= a < n:
                raise ValueError(f"action: {action!r} is not a replica in 0..{n - 1}")
            self._next(a)
        else:
            if not 0 <= a < n * n:
                raise ValueError(f"action: {action!r} is not a pair p * {n} + d in 0..{n * n - 1}")
            p, d = divmod(a, n)
            c = self.cluster
            if d not in c.decode_idx or (p != d and p not in c.prefill_idx):  # no such pair: the lowest allowed
                p, d = divmod(int(np.flatnonzero(self._pair_mask())[0]), n)
            self._next((p, d))
        lat = self._latency(done=self._rid < 0)
        reward, self._lat = -(lat - self._lat), lat
        return self._obs(), float(reward), self._rid < 0, False, self._info()

    def _next(self, action: int | tuple[int, int] | None) -> None:
        try:
            self._rid = next(self._steps) if action is None else self._steps.send(action)
        except StopIteration:
            self._rid = -1

    def _latency(self, done: bool) -> float:
        """Request-seconds in the system up to the current routing time (every request's, to its
        end, once the episode is done)."""
        c = self.cluster
        t = float("inf") if done else c.view.now
        if self.pools is not None:
            return c.records().request_seconds(t)
        arrived = len(self._arrival) if done else bisect.bisect_right(self._arrival, t)
        total = 0.0
        ended = 0
        for e, ids in zip(c.engines, c.ids, strict=True):
            cs = e.completion_s
            fin = cs[cs <= t] if not done else cs[np.isfinite(cs)]
            total += float(fin.sum())
            ended += len(fin)
            rej = e.state == 4
            if rej.any():
                total += float(c.workload.arrival_s[ids[rej]].sum())
                ended += int(rej.sum())
            if done:  # unfinished requests count to their replica's end
                open_ = (e.state == 1) | (e.state == 2)
                total += float(e.clock) * int(open_.sum())
                ended += int(open_.sum())
        in_system = 0.0 if done else (arrived - ended) * t
        return total + in_system - float(self._arrival_cum[arrived])

    # ---- observation, mask, experts -----------------------------------------------------------
    def _obs(self) -> np.ndarray:
        out = np.zeros(self.observation_space.shape, np.float32)
        if self._rid < 0:
            return out
        v, rid = self.cluster.view, self._rid
        prompt = float(v.prompt_tokens[rid])
        k = FEATURES if self.pools is None else POOL_FEATURES
        f = out[: self.n_replicas * k].reshape(self.n_replicas, k)
        f[:, 0] = v.waiting / 32.0
        f[:, 1] = v.running / 256.0
        f[:, 2] = 1.0 - v.kv_used / v.kv_capacity
        f[:, 3] = v.waiting_tokens / v.kv_capacity
        f[:, 4] = v.prefix_hit(rid) / prompt
        if self.pools is not None:
            c = self.cluster
            f[:, 5] = [ROLE_CODE[x] for x in c.roles]
            f[:, 6] = c.bound / 32.0
        out[-2] = prompt / self._cap
        out[-1] = 0.0 if self._blind else float(v.predicted_output[rid]) / 1024.0
        return np.clip(out, 0.0, OBS_HIGH, out=out)

    def action_masks(self) -> np.ndarray:
        """Replicas that can take the current request (all when none can, or the episode ended);
        with pools, the allowed pairs ``p * N + d`` (see the module docstring)."""
        n = self.n_replicas
        if self.pools is not None:
            return self._pair_mask()
        if self._rid < 0:
            return np.ones(n, bool)
        ok = self.cluster.view.can_take(self._rid)
        return ok if ok.any() else np.ones(n, bool)

    def _pair_mask(self) -> np.ndarray:
        c, n = self.cluster, self.n_replicas
        pre, dec = np.zeros(n, bool), np.zeros(n, bool)
        pre[c.prefill_idx], dec[c.decode_idx] = True, True
        if self._rid >= 0:
            fits = c.view.can_take(self._rid)
            if (dec & fits).any():
                pre, dec = pre & fits, dec & fits
        m = pre[:, None] & dec[None, :]
        m[np.arange(n), np.arange(n)] = dec
        return m.reshape(-1)

    def _info(self) -> dict[str, Any]:
        info = {"action_mask": self.action_masks(), "request": self._rid, "done": self._rid < 0,
                "now": self.cluster.view.now}
        if self._rid < 0:  # the episode's end: its cluster summary (as LLMSched-v1's last info)
            info["summary"] = self.summary()
        return info

    def expert_action(self, strict: bool = True) -> int:
        """The attached router's replica for the current request (asked once per request).

        With ``strict`` a choice outside the action mask raises ``ValueError``; otherwise it
        becomes the first allowed replica."""
        if self._rid < 0:
            raise RuntimeError("expert_action(): the episode has ended; call reset()")
        if self._expert_for != self._rid:
            c = self.cluster
            if self.pools is None:
                self._expert = int(c.router.route(self._rid, c.view))
            else:
                p, d = c.router.route(self._rid, c.pview, c.dview)
                dd = c.decode_idx[int(d)]
                self._expert = (dd if p is None else c.prefill_idx[int(p)]) * self.n_replicas + dd
            self._expert_for = self._rid
        mask = self.action_masks()
        if not mask[self._expert]:
            if strict:
                what = "replica" if self.pools is None else "pair (p * N + d)"
                raise ValueError(f"expert {self.expert!r}: {what} {self._expert} cannot take request {self._rid}")
            return int(np.flatnonzero(mask)[0])
        return self._expert

    def summary(self) -> dict[str, Any]:
        """The cluster summary of the finished episode."""
        return self.cluster.summary(self._spec.get("name", "custom"), self.cluster.engines[0].scheduler.name)
