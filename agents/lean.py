"""PPO whose update loop does Stable-Baselines3's arithmetic with less Python around it.

:class:`LeanPPO` is ``stable_baselines3.PPO`` with :meth:`LeanPPO.train` rewritten: the same
epochs, the same minibatches (drawn from NumPy's global generator exactly as
``RolloutBuffer.get`` draws them), the same losses, gradient clipping, optimizer steps and logged
scalars, so that the weights, the optimizer state and every logged value after any number of
updates equal SB3's bit for bit (``tests/test_lean.py`` checks it against ``PPO`` itself). What it
saves, per minibatch of the ``azure-conv`` recipe (256 samples, a few milliseconds each):

* the rollout buffer becomes tensors once per update (``torch.from_numpy`` over the flattened
  arrays, no copy) and a minibatch is one ``index_select`` per array, instead of SB3's NumPy
  fancy indexing, ``np.ndarray.flatten`` and ``torch.tensor`` copies per array and minibatch;
* the parameter list is built once per update, not once per ``clip_grad_norm_`` call;
* the rollouts (:meth:`LeanPPO.collect_rollouts`, SB3's loop) run the policy's forward passes
  under ``torch.inference_mode`` rather than ``torch.no_grad`` (the same kernels, without
  autograd's view and version tracking) and without ``torch.distributions``' argument checks
  (the update keeps them).

Everything it does not special-case (a buffer other than SB3's ``RolloutBuffer`` /
``DictRolloutBuffer``) goes to ``PPO.train``. The class is saved and loaded as ``ppo``
(:func:`agents.storage.algo_class`): the agent files do not change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.utils import explained_variance, obs_as_tensor
from stable_baselines3.common.vec_env import VecEnv
from torch.nn import functional as F

from agents.optim import Adam

_FIELDS = ("actions", "values", "log_probs", "advantages", "returns")


def _as_tensors(buf: RolloutBuffer | DictRolloutBuffer) -> tuple[dict[str, th.Tensor] | th.Tensor, list[th.Tensor]]:
    """The flattened buffer as tensors sharing its memory: the observations (a dict for a
    ``DictRolloutBuffer``) and ``actions`` (float32), ``values``, ``log_probs``, ``advantages``,
    ``returns`` (1-D): what ``_get_samples`` would copy out of it, before the indexing."""
    if not buf.generator_ready:  # RolloutBuffer.get's own preparation, once per rollout
        if isinstance(buf.observations, dict):
            for key, obs in buf.observations.items():
                buf.observations[key] = buf.swap_and_flatten(obs)
        else:
            buf.observations = buf.swap_and_flatten(buf.observations)
        for name in _FIELDS:
            buf.__dict__[name] = buf.swap_and_flatten(buf.__dict__[name])
        buf.generator_ready = True
    if isinstance(buf.observations, dict):
        obs: dict[str, th.Tensor] | th.Tensor = {k: th.from_numpy(v) for k, v in buf.observations.items()}
    else:
        obs = th.from_numpy(buf.observations)
    rest = [th.from_numpy(buf.actions.astype(np.float32, copy=False))]
    rest += [th.from_numpy(buf.__dict__[name].reshape(-1)) for name in _FIELDS[1:]]
    return obs, rest


def _plain_step(optimizer: th.optim.Optimizer) -> Callable[[th.optim.Optimizer], Any] | None:
    """:class:`agents.optim.Adam`'s ``step`` without the wrapper that ``torch.optim.Optimizer``
    puts around it (a profiler range and the step hooks), or None: another optimizer, or a hook
    registered (then :meth:`LeanPPO.train` calls ``zero_grad``, ``clip_grad_norm_`` and ``step``)."""
    from torch.optim import optimizer as torch_optimizer

    step = getattr(type(optimizer).step, "__wrapped__", None)
    if (not isinstance(optimizer, Adam) or step is None or optimizer._optimizer_step_pre_hooks
            or optimizer._optimizer_step_post_hooks or torch_optimizer._global_optimizer_pre_hooks
            or torch_optimizer._global_optimizer_post_hooks):
        return None
    return step


def _clip_grad_norm(params: list[th.Tensor], max_norm: float) -> None:
    """``torch.nn.utils.clip_grad_norm_(params, max_norm)`` (2-norm, float32 CPU tensors, the
    foreach kernels it picks for them): the same norm and the same scaled gradients, without its
    grouping by device and type."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    with th.no_grad():
        total = th.linalg.vector_norm(th.stack(th._foreach_norm(grads, 2.0)), 2.0)
        th._foreach_mul_(grads, th.clamp(float(max_norm) / (total + 1e-6), max=1.0))


class LeanPPO(PPO):
    """``stable_baselines3.PPO`` with a leaner :meth:`train` (same results; module docstring)."""

    def collect_rollouts(self, env: VecEnv, callback: BaseCallback, rollout_buffer: RolloutBuffer,
                         n_rollout_steps: int) -> bool:
        """SB3's ``OnPolicyAlgorithm.collect_rollouts`` (the same steps, callbacks, timeout
        bootstrapping and buffer), with the policy's forward passes under ``torch.inference_mode``
        instead of ``torch.no_grad``: the same kernels and values without autograd's view and
        version tracking (about a tenth of a rollout forward pass of the azure-conv recipe). The
        tensors they return only become NumPy arrays. Their distributions skip
        ``torch.distributions``' argument checks (another twelfth; no value changes): the update
        (:meth:`train`) keeps them, so a NaN in the policy still stops training there, at the
        latest one rollout later."""
        assert self._last_obs is not None, "No previous observation was provided"
        dist = th.distributions.Distribution
        checks = dist._validate_args
        dist.set_default_validate_args(False)
        try:
            return self._collect(env, callback, rollout_buffer, n_rollout_steps)
        finally:
            dist.set_default_validate_args(checks)

    def _collect(self, env: VecEnv, callback: BaseCallback, rollout_buffer: RolloutBuffer, n_rollout_steps: int) -> bool:
        """:meth:`collect_rollouts`' loop."""
        self.policy.set_training_mode(False)
        n_steps = 0
        rollout_buffer.reset()
        if self.use_sde:
            self.policy.reset_noise(env.num_envs)
        callback.on_rollout_start()
        box, discrete = isinstance(self.action_space, spaces.Box), isinstance(self.action_space, spaces.Discrete)
        while n_steps < n_rollout_steps:
            if self.use_sde and self.sde_sample_freq > 0 and n_steps % self.sde_sample_freq == 0:
                self.policy.reset_noise(env.num_envs)
            with th.inference_mode():
                obs_tensor = obs_as_tensor(self._last_obs, self.device)  # type: ignore[arg-type]
                actions, values, log_probs = self.policy(obs_tensor)
            actions = actions.cpu().numpy()
            clipped_actions = actions
            if box:
                if self.policy.squash_output:
                    clipped_actions = self.policy.unscale_action(clipped_actions)
                else:
                    clipped_actions = np.clip(actions, self.action_space.low, self.action_space.high)
            new_obs, rewards, dones, infos = env.step(clipped_actions)
            self.num_timesteps += env.num_envs
            callback.update_locals(locals())
            if not callback.on_step():
                return False
            self._update_info_buffer(infos, dones)
            n_steps += 1
            if discrete:
                actions = actions.reshape(-1, 1)
            for idx, done in enumerate(dones):  # timeouts: bootstrap with the value function
                if (done and infos[idx].get("terminal_observation") is not None
                        and infos[idx].get("TimeLimit.truncated", False)):
                    terminal_obs = self.policy.obs_to_tensor(infos[idx]["terminal_observation"])[0]
                    with th.inference_mode():
                        terminal_value = self.policy.predict_values(terminal_obs)[0]  # type: ignore[arg-type]
                    rewards[idx] += self.gamma * terminal_value
            rollout_buffer.add(self._last_obs, actions, rewards, self._last_episode_starts,  # type: ignore[arg-type]
                               values, log_probs)
            self._last_obs = new_obs  # type: ignore[assignment]
            self._last_episode_starts = dones
        with th.inference_mode():
            values = self.policy.predict_values(obs_as_tensor(new_obs, self.device))  # type: ignore[arg-type]
        rollout_buffer.compute_returns_and_advantage(last_values=values, dones=dones)
        callback.update_locals(locals())
        callback.on_rollout_end()
        return True

    def train(self) -> None:
        """One update on the rollout buffer: ``PPO.train``'s epochs, minibatches, losses and logs."""
        buf = self.rollout_buffer
        if type(buf) not in (RolloutBuffer, DictRolloutBuffer) or buf.device.type != "cpu" or not buf.full:
            return super().train()
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        clip_range = self.clip_range(self._current_progress_remaining)  # type: ignore[operator]
        clip_range_vf = None
        if self.clip_range_vf is not None:
            clip_range_vf = self.clip_range_vf(self._current_progress_remaining)  # type: ignore[operator]

        entropy_losses, pg_losses, value_losses, clip_fractions = [], [], [], []
        approx_kl_divs: list = []
        n = buf.buffer_size * buf.n_envs
        batch_size = self.batch_size
        discrete = isinstance(self.action_space, spaces.Discrete)
        policy, optimizer = self.policy, self.policy.optimizer
        params = list(policy.parameters())
        plain = _plain_step(optimizer)
        opt_params = [p for group in optimizer.param_groups for p in group["params"]]
        obs_all, (act_all, val_all, logp_all, adv_all, ret_all) = None, (None,) * 5
        loss = None
        continue_training = True
        for epoch in range(self.n_epochs):
            approx_kl_divs = []
            indices = np.random.permutation(n)  # RolloutBuffer.get's draw, one per epoch
            if obs_all is None:
                obs_all, (act_all, val_all, logp_all, adv_all, ret_all) = _as_tensors(buf)
            for start in range(0, n, batch_size):
                idx = th.from_numpy(indices[start:start + batch_size])
                if isinstance(obs_all, dict):
                    observations = {k: v.index_select(0, idx) for k, v in obs_all.items()}
                else:
                    observations = obs_all.index_select(0, idx)
                actions = act_all.index_select(0, idx)
                old_values, old_log_prob = val_all.index_select(0, idx), logp_all.index_select(0, idx)
                advantages, returns = adv_all.index_select(0, idx), ret_all.index_select(0, idx)
                if discrete:
                    actions = actions.long().flatten()

                values, log_prob, entropy = policy.evaluate_actions(observations, actions)
                values = values.flatten()
                if self.normalize_advantage and len(advantages) > 1:
                    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
                ratio = th.exp(log_prob - old_log_prob)
                policy_loss_1 = advantages * ratio
                policy_loss_2 = advantages * th.clamp(ratio, 1 - clip_range, 1 + clip_range)
                policy_loss = -th.min(policy_loss_1, policy_loss_2).mean()
                pg_losses.append(policy_loss.item())
                clip_fractions.append(th.mean((th.abs(ratio - 1) > clip_range).float()).item())
                if clip_range_vf is None:
                    values_pred = values
                else:
                    values_pred = old_values + th.clamp(values - old_values, -clip_range_vf, clip_range_vf)
                value_loss = F.mse_loss(returns, values_pred)
                value_losses.append(value_loss.item())
                entropy_loss = -th.mean(-log_prob) if entropy is None else -th.mean(entropy)
                entropy_losses.append(entropy_loss.item())
                loss = policy_loss + self.ent_coef * entropy_loss + self.vf_coef * value_loss
                with th.no_grad():
                    log_ratio = log_prob - old_log_prob
                    approx_kl_div = th.mean((th.exp(log_ratio) - 1) - log_ratio).cpu().numpy()
                    approx_kl_divs.append(approx_kl_div)
                if self.target_kl is not None and approx_kl_div > 1.5 * self.target_kl:
                    continue_training = False
                    if self.verbose >= 1:
                        print(f"Early stopping at step {epoch} due to reaching max kl: {approx_kl_div:.2f}")
                    break
                if plain:  # optimizer.zero_grad(), clip_grad_norm_, step() without their wrappers
                    for p in opt_params:
                        p.grad = None
                    loss.backward()
                    _clip_grad_norm(params, self.max_grad_norm)
                    plain(optimizer)
                else:
                    optimizer.zero_grad()
                    loss.backward()
                    th.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
                    optimizer.step()
            self._n_updates += 1
            if not continue_training:
                break

        explained_var = explained_variance(buf.values.flatten(), buf.returns.flatten())
        self.logger.record("train/entropy_loss", np.mean(entropy_losses))
        self.logger.record("train/policy_gradient_loss", np.mean(pg_losses))
        self.logger.record("train/value_loss", np.mean(value_losses))
        self.logger.record("train/approx_kl", np.mean(approx_kl_divs))
        self.logger.record("train/clip_fraction", np.mean(clip_fractions))
        self.logger.record("train/loss", loss.item())  # type: ignore[union-attr]
        self.logger.record("train/explained_variance", explained_var)
        if hasattr(self.policy, "log_std"):
            self.logger.record("train/std", th.exp(self.policy.log_std).mean().item())
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/clip_range", clip_range)
        if clip_range_vf is not None:
            self.logger.record("train/clip_range_vf", clip_range_vf)


__all__ = ["LeanPPO"]
