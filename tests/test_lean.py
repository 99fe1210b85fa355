"""agents.lean.LeanPPO: SB3's PPO updates bit for bit; agents.optim.Adam's flat steps; slot_max."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from conftest import quiet

torch = pytest.importorskip("torch")
pytest.importorskip("sb3_contrib")

from stable_baselines3 import PPO  # noqa: E402

from agents.lean import LeanPPO  # noqa: E402
from agents.optim import Adam  # noqa: E402


def _learn(cls, flat: bool, **kw):
    """128 steps of priority mode on 2 envs (a ``Box`` observation when ``flat``, else the
    ``Dict``), our Adam; returns the model and the scalars it logged at its last update."""
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.vec_env import DummyVecEnv

    from agents.envs import make_env
    from agents.storage import with_optimizer

    def env():
        return make_env("jaillet-low", {"K": 4, "action_mode": "priority", "flat": flat}, {"workload.n_requests": 40})

    venv = DummyVecEnv([env, env])
    model = cls("MlpPolicy" if flat else "MultiInputPolicy", venv, n_steps=32, batch_size=24, n_epochs=3, seed=5,
                device="cpu", policy_kwargs=with_optimizer({"net_arch": [16]}), **kw)
    logged: dict[str, float] = {}

    class Capture(Logger):
        def record(self, key, value, exclude=None):
            logged[key] = value

    model.set_logger(Capture(None, []))
    model.learn(128)
    return model, logged


@pytest.mark.filterwarnings("ignore:You have specified a mini-batch size")  # partial minibatches on purpose
@pytest.mark.parametrize("flat", [False, True])
@pytest.mark.parametrize("kw", [{}, {"clip_range_vf": 0.1, "target_kl": 0.002, "ent_coef": 0.01}])
def test_lean_ppo_learns_exactly_what_sb3s_ppo_learns(flat, kw):
    """Weights, optimizer state, the NumPy generator's draws and every logged scalar equal after
    four updates with partial last minibatches (64 samples in batches of 24), with and without
    the value clipping and early stopping branches."""
    np.random.seed(11)
    ours, log_ours = _learn(LeanPPO, flat, **kw)
    draw_ours = np.random.random()
    np.random.seed(11)
    theirs, log_theirs = _learn(PPO, flat, **kw)
    assert np.random.random() == draw_ours  # the same minibatch permutations were drawn
    a, b = ours.policy.state_dict(), theirs.policy.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = ours.policy.optimizer.state_dict()["state"], theirs.policy.optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])
    assert log_ours.keys() == log_theirs.keys() and "train/value_loss" in log_ours
    for key, value in log_theirs.items():
        if key.startswith("time/"):  # wall clock
            continue
        assert log_ours[key] == value or (np.isnan(value) and np.isnan(log_ours[key])), key
    if kw:
        assert "train/clip_range_vf" in log_ours


def test_lean_ppo_rollouts_bootstrap_truncated_episodes_like_sb3():
    """Episodes cut by a 7-step time limit: the rollouts (forward passes under inference mode)
    bootstrap the truncated steps' rewards with the value function exactly as SB3's do."""
    from gymnasium.wrappers import TimeLimit
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    from agents.envs import make_env
    from agents.storage import with_optimizer

    def env():
        inner = make_env("jaillet-low", {"K": 4, "action_mode": "priority"}, {"workload.n_requests": 40}).unwrapped
        return Monitor(TimeLimit(inner, 7))

    weights, rewards = [], []
    for cls in (LeanPPO, PPO):
        np.random.seed(1)
        model = cls("MultiInputPolicy", DummyVecEnv([env, env]), n_steps=32, batch_size=32, n_epochs=2, seed=5,
                    device="cpu", policy_kwargs=with_optimizer({"net_arch": [16]}))
        quiet(model).learn(96)
        weights.append(model.policy.state_dict())
        rewards.append(model.rollout_buffer.rewards.copy())
        assert len(model.ep_info_buffer) >= 8  # many truncated episodes
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert np.array_equal(rewards[0], rewards[1])


def test_rollouts_skip_the_distribution_checks_and_the_update_still_stops_at_a_nan():
    """The rollouts' Gaussian heads run without torch.distributions' argument checks (restored
    afterwards); a NaN in the policy is then refused by the update's own checks."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    from agents.envs import make_env
    from agents.storage import with_optimizer

    def env():
        return make_env("jaillet-low", {"K": 4, "action_mode": "priority"}, {"workload.n_requests": 40})

    dist = torch.distributions.Distribution
    assert dist._validate_args
    model = LeanPPO("MultiInputPolicy", DummyVecEnv([env, env]), n_steps=16, batch_size=32, n_epochs=1, seed=5,
                    device="cpu", policy_kwargs=with_optimizer({"net_arch": [16]}))
    seen = []
    forward = model.policy.forward

    def spy(*args, **kwargs):
        seen.append(dist._validate_args)
        return forward(*args, **kwargs)

    model.policy.forward = spy
    model.learn(32)
    assert seen == [False] * 16 and dist._validate_args  # unchecked in the rollouts only
    with torch.no_grad():
        model.policy.action_net.bias.fill_(float("nan"))
    with pytest.raises(ValueError, match="loc"):
        model.learn(32, reset_num_timesteps=False)
    assert dist._validate_args


def test_ppo_agents_are_built_as_lean_ppo_and_keep_their_algo_name():
    from agents.storage import algo_class, algo_name

    cls = algo_class("ppo")
    assert cls is LeanPPO and issubclass(cls, PPO)
    assert algo_name(object.__new__(cls)) == "ppo"


def _net() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))


def _step(net: torch.nn.Module, opt: torch.optim.Optimizer, g: torch.Generator, skip: int | None = None) -> None:
    x = torch.randn(32, 6, generator=g)
    opt.zero_grad()
    net(x).pow(2).mean().backward()
    if skip is not None:  # a parameter without a gradient this step: torch's Adam skips it
        list(net.parameters())[skip].grad = None
    opt.step()


def test_flat_adam_keeps_parameters_and_moments_as_views_of_its_buffers():
    net = _net()
    opt = Adam(net.parameters(), lr=1e-3, eps=1e-5)
    _step(net, opt, torch.Generator().manual_seed(0))
    flat = opt._flat
    params = list(net.parameters())
    assert sum(p.numel() for p in params) <= flat.value.numel()
    for p in params:
        assert p.untyped_storage().data_ptr() == flat.value.untyped_storage().data_ptr()
        # where torch's allocator would put a tensor of its own (MKL's matrix-vector products
        # round differently at other alignments)
        assert p.data_ptr() % 64 == 0
        st = opt.state[p]
        assert st["exp_avg"].untyped_storage().data_ptr() == flat.m.untyped_storage().data_ptr()
        assert float(st["step"]) == 1.0 and st["exp_avg"].shape == p.shape


def test_flat_adam_equals_torch_adam_through_skipped_parameters_and_state_reloads():
    """A step where one parameter has no gradient goes per parameter (torch skips that one: its
    step count falls behind, so the flat buffers cannot come back); a reload of the state rebuilds
    them. Every step equals torch's Adam."""
    ours, theirs = _net(), _net()
    a, b = Adam(ours.parameters(), lr=1e-2, eps=1e-5), torch.optim.Adam(theirs.parameters(), lr=1e-2, eps=1e-5)
    ga, gb = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)

    def same() -> bool:
        return all(torch.equal(p, q) for p, q in zip(ours.parameters(), theirs.parameters(), strict=True))

    for _ in range(3):
        _step(ours, a, ga)
        _step(theirs, b, gb)
    assert "_flat" in a.__dict__ and same()
    _step(ours, a, ga, skip=1)
    _step(theirs, b, gb, skip=1)
    assert "_flat" not in a.__dict__ and same()
    for _ in range(2):  # uneven step counts: per parameter from now on
        _step(ours, a, ga)
        _step(theirs, b, gb)
    assert "_flat" not in a.__dict__ and same()
    # a fresh optimizer loading torch's (even) state goes flat again and continues identically
    c, d = _net(), _net()
    oc, od = Adam(c.parameters(), lr=1e-2, eps=1e-5), torch.optim.Adam(d.parameters(), lr=1e-2, eps=1e-5)
    gc_, gd = torch.Generator().manual_seed(2), torch.Generator().manual_seed(2)
    for _ in range(2):
        _step(c, oc, gc_)
        _step(d, od, gd)
    oc.load_state_dict(copy.deepcopy(od.state_dict()))
    assert "_flat" not in oc.__dict__
    for _ in range(3):
        _step(c, oc, gc_)
        _step(d, od, gd)
    assert "_flat" in oc.__dict__
    assert all(torch.equal(p, q) for p, q in zip(c.parameters(), d.parameters(), strict=True))
    assert all(torch.equal(oc.state_dict()["state"][i][k], od.state_dict()["state"][i][k])
               for i in od.state_dict()["state"] for k in ("step", "exp_avg", "exp_avg_sq"))


def test_flat_adam_survives_a_parameter_load_and_a_replaced_tensor():
    """``load_state_dict`` on the module copies into the views (still flat); a parameter whose
    tensor is replaced (``p.data = ...``) makes the next step rebuild the buffers around it."""
    ours, theirs = _net(), _net()
    a, b = Adam(ours.parameters(), lr=1e-2, eps=1e-5), torch.optim.Adam(theirs.parameters(), lr=1e-2, eps=1e-5)
    ga, gb = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    _step(ours, a, ga)
    _step(theirs, b, gb)
    flat = a._flat
    ours.load_state_dict(theirs.state_dict())
    _step(ours, a, ga)
    _step(theirs, b, gb)
    assert a._flat is flat
    first = next(ours.parameters())
    first.data = first.data.clone()
    next(theirs.parameters()).data = next(theirs.parameters()).data.clone()
    _step(ours, a, ga)
    _step(theirs, b, gb)
    assert a._flat is not flat
    assert all(torch.equal(p, q) for p, q in zip(ours.parameters(), theirs.parameters(), strict=True))


def test_slot_max_is_torch_max_with_and_without_autograd():
    from agents.features import slot_max

    torch.manual_seed(0)
    h = torch.relu(torch.randn(8, 5, 3))
    h[:, 3:] = 0.0  # ties at zero, as empty slots make them
    h[0, 1] = h[0, 0]  # and a tie at a positive value
    with torch.no_grad():
        assert torch.equal(slot_max(h), h.max(1).values)
    x = h.clone().requires_grad_()
    y = h.clone().requires_grad_()
    g = torch.randn(8, 3)
    slot_max(x).backward(g)
    y.max(1).values.backward(g)
    assert torch.equal(x.grad, y.grad)


def _table_features(ext, obs):
    """The set encoder as it was computed before the occupied-rows path: the ``(B, K, D)`` table
    of slot embeddings with zeros in the empty slots, pooled by ``sum`` and ``torch.max``, the slot
    scores of the whole table times the occupancy (``agents.features`` before this change)."""
    q = obs["queue"].reshape(-1, ext.n_slots, ext.n_slot_features)
    present = q.abs().sum(-1) > 0
    occupied = present.unsqueeze(-1).to(q.dtype)
    if bool(present.all()):
        h = ext.slot(q)
    else:
        h = q.new_zeros(q.shape[0], ext.n_slots, ext.slot_dim)
        h[present] = ext.slot(q[present])
    parts = [h.sum(1) / occupied.sum(1).clamp(min=1.0), h.max(1).values, ext.running(obs["running"]),
             ext.globals(obs["globals"])]
    if ext.slot_score is not None:
        parts.append((ext.slot_score(h) * occupied).flatten(1))
    return torch.cat(parts, dim=1)


def _rows_compute_as_in_the_table(ext) -> bool:
    """Whether this machine's BLAS gives the slot-score layer's product of some rows the same bits
    alone as inside the whole table (forward and input gradient): the rows path's bit-identity
    rests on it (true of MKL on the CPUs we measured; another BLAS or vector width may block the
    rows differently)."""
    if ext.slot_score is None:
        return True
    g = torch.Generator().manual_seed(11)
    table = torch.randn(64 * ext.n_slots, ext.slot_dim, generator=g)
    grad = torch.randn(64 * ext.n_slots, ext.slot_score.out_features, generator=g)
    keep = torch.rand(64 * ext.n_slots, generator=g) < 0.3
    w, b = ext.slot_score.weight.detach(), ext.slot_score.bias.detach()
    same_fwd = torch.equal(torch.nn.functional.linear(table, w, b)[keep], torch.nn.functional.linear(table[keep], w, b))
    return same_fwd and torch.equal((grad @ w)[keep], grad[keep] @ w)


def _bits(t):
    return t.contiguous().view(torch.int32)  # equal bits: also the sign of every zero


@pytest.mark.parametrize("case", ["sparse", "ties", "empty", "full", "no-scores", "zero-scores"])
def test_set_encoder_rows_path_equals_the_table_bit_for_bit(case):
    """With autograd the encoder pools the occupied slots' rows (``_RowMax``, ``_RowScores``);
    its features and every parameter's gradient equal the table's in every bit: empty slots,
    equal embeddings in one sample (the max's gradient to the first), an empty and a full queue,
    no slot scores, zero slot-score weights (``slot_head``) with the empty slots' zeros' signs."""
    from gymnasium import spaces

    from agents.features import QueueSetExtractor

    b, k, f = 64, 6, 3
    space = spaces.Dict({"queue": spaces.Box(0, 1, (k, f), np.float32), "running": spaces.Box(0, 1, (4,), np.float32),
                         "globals": spaces.Box(0, 1, (2,), np.float32)})
    torch.manual_seed(3)
    ext = QueueSetExtractor(space, slot_hidden=(16, 8), context_hidden=(4,), slot_out=0 if case == "no-scores" else 2)
    rng = np.random.default_rng(7)
    q = rng.uniform(-1, 1, (b, k, f)).astype(np.float32)
    n = rng.integers(0, k + 1, b)
    q[np.arange(k)[None, :] >= n[:, None]] = 0.0  # the env fills the first n slots
    if case == "ties":
        q[:, 2] = q[:, 0]  # a request shown twice: equal embeddings, maxima tied
    elif case == "empty":
        q[:] = 0.0
    elif case == "full":
        q = rng.uniform(-1, 1, (b, k, f)).astype(np.float32)
    elif case == "zero-scores":
        with torch.no_grad():
            ext.slot_score.weight.zero_()
            ext.slot_score.bias.copy_(torch.tensor([0.0, -0.5]))
    obs = {"queue": torch.as_tensor(q.reshape(b, -1)), "running": torch.rand(b, 4), "globals": torch.rand(b, 2)}
    w = torch.randn(b, ext.features_dim)
    got = []
    for forward in (ext, lambda o: _table_features(ext, o)):
        ext.zero_grad(set_to_none=True)
        out = forward(obs)
        out.backward(w)
        got.append((out.detach(), [p.grad.clone() for p in ext.parameters()]))
    (rows, g_rows), (table, g_table) = got
    if _rows_compute_as_in_the_table(ext):
        assert torch.equal(_bits(rows), _bits(table))
        assert all(torch.equal(_bits(x), _bits(y)) for x, y in zip(g_rows, g_table, strict=True))
    else:  # another BLAS blocks a row's product differently alone: equal to the last bits only
        torch.testing.assert_close(rows, table, rtol=1e-5, atol=1e-6)
        for x, y in zip(g_rows, g_table, strict=True):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # the rollouts' path (the table, amax)
        assert torch.equal(_bits(ext(obs)), _bits(table))
    if case == "ties":
        assert ext._table is not None and torch.count_nonzero(ext._table) == 0  # left as zeros


def test_lean_clip_equals_torch_clip_grad_norm():
    """``_clip_grad_norm``: torch's norm and scaled gradients, parameters without a gradient skipped."""
    from agents.lean import _clip_grad_norm

    torch.manual_seed(2)
    for scale in (0.01, 10.0):  # below and above the limit
        ps = [torch.nn.Parameter(torch.randn(s)) for s in [(3, 4), (4,), (5,), (2, 2)]]
        for p in ps[:3]:
            p.grad = torch.randn_like(p) * scale
        qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
        for p, q in zip(ps, qs, strict=True):
            q.grad = None if p.grad is None else p.grad.clone()
        before = [p.grad.clone() for p in ps[:3]]
        _clip_grad_norm(ps, 0.5)
        torch.nn.utils.clip_grad_norm_(qs, 0.5)
        assert ps[3].grad is None
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(ps[:3], qs[:3], strict=True))
        norm = float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in ps[:3]])))
        if scale < 1:  # under the limit: unchanged
            assert all(torch.equal(p.grad, g) for p, g in zip(ps[:3], before, strict=True))
        else:
            assert norm == pytest.approx(0.5, rel=1e-5)


@pytest.mark.filterwarnings("ignore:You have specified a mini-batch size")  # partial minibatches on purpose
def test_lean_update_calls_the_optimizers_hooks_when_there_are_any():
    """With a step hook registered the update goes through ``zero_grad`` and the wrapped ``step``
    (the hook sees every step) and learns what it learns without one."""
    from agents.lean import _plain_step

    np.random.seed(11)
    plain, _ = _learn(LeanPPO, False)
    assert _plain_step(plain.policy.optimizer) is not None
    calls = []
    original = LeanPPO._setup_model

    def with_hook(self):
        original(self)
        self.policy.optimizer.register_step_pre_hook(lambda opt, args, kwargs: calls.append(1))

    np.random.seed(11)
    LeanPPO._setup_model = with_hook
    try:
        hooked, _ = _learn(LeanPPO, False)
    finally:
        LeanPPO._setup_model = original
    assert _plain_step(hooked.policy.optimizer) is None
    assert len(calls) == 2 * 3 * 3  # 2 updates x 3 epochs x 3 minibatches (64 samples, batches of 24)
    a, b = plain.policy.state_dict(), hooked.policy.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
