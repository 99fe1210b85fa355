"""The optimizer of the PPO policies: torch's Adam without the start-up cost of ``torch._dynamo``,
and with one flat update instead of one per parameter.

``torch.optim.Adam`` wraps ``add_param_group``, ``zero_grad``, ``state_dict``,
``load_state_dict`` and ``step`` so that ``torch.compile`` does not trace into them; the wrappers
import ``torch._dynamo`` on their first call, about 0.7 s of CPU time (sympy, the FX and
distributed packages), which is a quarter of the start-up of ``llmsched train`` and of every
process that loads an agent. Nothing here is compiled, so :class:`Adam` calls the same methods
unwrapped: the arithmetic is torch's own and the parameters after any number of steps equal
``torch.optim.Adam``'s bit for bit (tests/test_optim.py checks it).

**Flat steps.** Torch's CPU Adam runs eight tensor operations per parameter (about 0.4 ms of a
PPO minibatch for the policies' 19 small tensors, most of it dispatch). Adam is elementwise, so
with the plain settings (one parameter group, no ``amsgrad``, ``weight_decay``, ``maximize``,
``foreach``, ``fused``, ``capturable`` or ``differentiable``; float32 CPU tensors that all have
gradients) :class:`Adam` keeps the parameters and the moment estimates as views of three flat
buffers and runs the same eight operations once over the buffers, after one copy of the gradients
into a fourth. Each parameter starts on a 64-byte boundary, as a tensor of its own would: MKL's
matrix-vector products (a 1 x 64 value head on a batch of 2) round differently when the weight is
not aligned, which changed learning in ``select`` mode before the buffers were padded. The optimizer state is still torch's (``state[p]["exp_avg"]`` is ``p``'s view of
the buffer), so ``state_dict`` and ``load_state_dict`` are unchanged; any other case, or a step
where some parameter has no gradient, takes torch's per-parameter step.

Do not use it inside ``torch.compile``: the compiler would trace into the optimizer's step.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

_STEP = inspect.unwrap(torch.optim.Adam.step)
_ALIGN = 16  # float32 elements in 64 bytes
_PLAIN = {"amsgrad": False, "weight_decay": 0, "maximize": False, "capturable": False, "differentiable": False,
          "decoupled_weight_decay": False}


class _Flat:
    """The flat buffers of one parameter group (see the module docstring)."""

    def __init__(self, params: list[torch.Tensor], state: dict, step: float) -> None:
        # each parameter starts on a 64-byte boundary, as torch's allocator places a tensor of its
        # own: MKL's matrix-vector products (a value head's 1 x n weight) round differently at
        # other alignments; the gaps stay zero (zero gradient, moments and update)
        starts, total = [], 0
        for p in params:
            starts.append(total)
            total += -(-p.numel() // _ALIGN) * _ALIGN
        self.params = params
        self.value = torch.zeros(total, dtype=torch.float32)
        self.grad = torch.zeros(total, dtype=torch.float32)
        self.m = torch.zeros(total, dtype=torch.float32)
        self.v = torch.zeros(total, dtype=torch.float32)
        self.steps = torch.full((len(params),), step, dtype=torch.float32)
        self.step = step
        self.grads: list[torch.Tensor] = []
        for i, (p, off) in enumerate(zip(params, starts, strict=True)):
            n = p.numel()
            view = self.value[off:off + n].view_as(p)
            view.copy_(p.detach())
            st = state.get(p)
            m, v = self.m[off:off + n].view_as(p), self.v[off:off + n].view_as(p)
            if st:
                m.copy_(st["exp_avg"])
                v.copy_(st["exp_avg_sq"])
            p.data = view
            state[p] = {"step": self.steps[i], "exp_avg": m, "exp_avg_sq": v}
            self.grads.append(self.grad[off:off + n].view_as(p))
        self.views = [state[p]["exp_avg"] for p in params]
        self.ptrs = [p.data_ptr() for p in params]

    def intact(self, state: dict) -> bool:
        """Whether the parameters and their state are still this object's views (nothing replaced
        them: a ``load_state_dict``, an assignment to ``p.data`` or to ``state[p]``)."""
        for p, ptr, view in zip(self.params, self.ptrs, self.views, strict=True):
            st = state.get(p)
            if p.data_ptr() != ptr or st is None or st.get("exp_avg") is not view:
                return False
        return True


class Adam(torch.optim.Adam):
    """``torch.optim.Adam`` (same arguments, same updates) whose methods never import
    ``torch._dynamo`` and whose plain steps run once over flat buffers; SB3 takes it as
    ``policy_kwargs["optimizer_class"]``."""

    add_param_group = inspect.unwrap(torch.optim.Optimizer.add_param_group)
    zero_grad = inspect.unwrap(torch.optim.Optimizer.zero_grad)
    state_dict = inspect.unwrap(torch.optim.Optimizer.state_dict)
    _load_state_dict = inspect.unwrap(torch.optim.Optimizer.load_state_dict)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """``torch.optim.Optimizer.load_state_dict`` (the flat buffers are rebuilt at the next step)."""
        self.__dict__.pop("_flat", None)
        self._load_state_dict(state_dict)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One Adam step, with gradients off as in ``torch.optim.Adam.step`` (unless the
        optimizer is ``differentiable``): flat when it can be (module docstring)."""
        prev = torch.is_grad_enabled()
        try:
            torch.set_grad_enabled(self.defaults["differentiable"])
            if closure is None and self._flat_step():
                return None
            self.__dict__.pop("_flat", None)  # per parameter from here: the buffers are rebuilt if needed
            return _STEP(self, closure)
        finally:
            torch.set_grad_enabled(prev)

    def _flat_step(self) -> bool:
        """The flat step, if this step can be one; False (nothing done) otherwise."""
        if len(self.param_groups) != 1:
            return False
        group = self.param_groups[0]
        params = group["params"]
        grads = [p.grad for p in params]
        beta1, beta2 = group["betas"]
        lr, eps = group["lr"], group["eps"]
        if (any(g is None or g.is_sparse for g in grads)  # checked before any buffer is (re)built
                or isinstance(lr, torch.Tensor) or isinstance(beta1, torch.Tensor)):
            return False
        flat: _Flat | None = self.__dict__.get("_flat")
        if flat is None or flat.params is not params or not flat.intact(self.state):
            flat = self._flatten(group)
            if flat is None:
                return False
        torch._foreach_copy_(flat.grads, grads)
        flat.steps += 1
        flat.step += 1.0
        step = flat.step
        flat.m.lerp_(flat.grad, 1 - beta1)
        flat.v.mul_(beta2).addcmul_(flat.grad, flat.grad, value=1 - beta2)
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        step_size = lr / bias_correction1
        bias_correction2_sqrt = bias_correction2**0.5
        denom = (flat.v.sqrt() / bias_correction2_sqrt).add_(eps)
        flat.value.addcdiv_(flat.m, denom, value=-step_size)
        return True

    def _flatten(self, group: dict[str, Any]) -> _Flat | None:
        """Flat buffers for ``group`` when its settings, tensors and state allow (module docstring)."""
        if any(group.get(k, v) != v for k, v in _PLAIN.items()) or group.get("foreach") or group.get("fused"):
            return None
        params = group["params"]
        if not params or any(p.device.type != "cpu" or p.dtype != torch.float32 or p.is_sparse
                             or not p.requires_grad for p in params):
            return None
        steps = set()
        for p in params:
            st = self.state.get(p)
            if not st:
                steps.add(0.0)
            elif set(st) != {"step", "exp_avg", "exp_avg_sq"} or st["exp_avg"].dtype != torch.float32:
                return None
            else:
                steps.add(float(st["step"]))
        if len(steps) != 1:
            return None
        flat = _Flat(params, self.state, steps.pop())
        self._flat = flat
        return flat


__all__ = ["Adam"]
