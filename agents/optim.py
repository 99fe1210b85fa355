"""The optimizer of the PPO policies: torch's Adam without the start-up cost of ``torch._dynamo``.

``torch.optim.Adam`` wraps ``add_param_group``, ``zero_grad``, ``state_dict``,
``load_state_dict`` and ``step`` so that ``torch.compile`` does not trace into them; the wrappers
import ``torch._dynamo`` on their first call, about 0.7 s of CPU time (sympy, the FX and
distributed packages), which is a quarter of the start-up of ``llmsched train`` and of every
process that loads an agent. Nothing here is compiled, so :class:`Adam` calls the same methods
unwrapped: the arithmetic is torch's own (``torch.optim.adam``'s single-tensor or foreach kernels,
chosen as torch chooses them) and the parameters after any number of steps equal
``torch.optim.Adam``'s bit for bit (tests/test_agents.py checks it).

Do not use it inside ``torch.compile``: the compiler would trace into the optimizer's step.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

_STEP = inspect.unwrap(torch.optim.Adam.step)


class Adam(torch.optim.Adam):
    """``torch.optim.Adam`` (same arguments, same updates) whose methods never import
    ``torch._dynamo``; SB3 takes it as ``policy_kwargs["optimizer_class"]``."""

    add_param_group = inspect.unwrap(torch.optim.Optimizer.add_param_group)
    zero_grad = inspect.unwrap(torch.optim.Optimizer.zero_grad)
    state_dict = inspect.unwrap(torch.optim.Optimizer.state_dict)
    load_state_dict = inspect.unwrap(torch.optim.Optimizer.load_state_dict)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One Adam step, with gradients off as in ``torch.optim.Adam.step`` (unless the
        optimizer is ``differentiable``)."""
        prev = torch.is_grad_enabled()
        try:
            torch.set_grad_enabled(self.defaults["differentiable"])
            return _STEP(self, closure)
        finally:
            torch.set_grad_enabled(prev)


__all__ = ["Adam"]
