"""The real-GPU backend on CPU with the ``tiny`` model: paging, replay, calibration."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(2)

import torch.nn.functional as F  # noqa: E402

from llmsched_gym.backends.gpu.backend import (  # noqa: E402
    PROFILE_COLUMNS,
    CalibrationGrid,
    FusedAffineLatency,
    GPULatency,
    calibrate,
    hbm_bound_decode_s,
    release_schedule,
    replay,
)
from llmsched_gym.backends.gpu.config import get_config  # noqa: E402
from llmsched_gym.backends.gpu.executor import KVPoolExhausted, LlamaExecutor  # noqa: E402
from llmsched_gym.core import latency  # noqa: E402

TINY = get_config("tiny")


@pytest.fixture(scope="module")
def executor() -> LlamaExecutor:
    return LlamaExecutor(TINY, device="cpu", num_blocks=64, block_size=16)


def test_presets_have_the_published_kv_sizes_and_unknown_names_list_the_allowed_ones():
    assert get_config("llama-2-7b").kv_bytes_per_token() == 524_288
    assert get_config("llama-3-8b").kv_bytes_per_token() == 131_072
    assert 6.6e9 < get_config("llama-2-7b").n_params() < 6.8e9
    with pytest.raises(ValueError, match="allowed: llama-2-7b, llama-3-8b, llama-3.2-1b, tiny"):
        get_config("gpt-5")


def test_import_does_not_load_torch():
    code = "import sys, llmsched_gym.backends.gpu.backend, llmsched_gym.cli.gpu; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_mixed_batch_allocates_kv_on_first_appearance_and_release_frees_it(executor):
    assert tuple(executor.k_pool[0].shape) == (64, 16, TINY.n_kv_heads, TINY.head_dim)
    assert len(executor.k_pool) == len(executor.v_pool) == TINY.n_layers
    prefill, decode = [(1, 40, 0), (2, 10, 20)], [(3, 33), (4, 0)]
    logits = executor.forward_tokens(prefill, decode, torch.randint(TINY.vocab, (52,)))
    assert logits.shape == (4, TINY.vocab) and torch.isfinite(logits).all()
    assert {r: len(t) for r, t in executor.block_tables.items()} == {1: 3, 2: 2, 3: 3, 4: 1}
    assert executor.n_free_blocks() == 64 - 9
    assert executor.execute([], [(1, 40), (2, 30), (3, 34), (4, 1)]) > 0
    assert executor.lengths == {1: 41, 2: 31, 3: 35, 4: 2}
    for rid in (1, 2, 3, 4):
        executor.release(rid)
    assert executor.n_free_blocks() == 64 and not executor.block_tables
    with pytest.raises(KVPoolExhausted, match="KV pool exhausted"):
        executor.execute([(5, 65 * 16, 0)], [])
    executor.release(5)


def test_gpu_latency_is_a_composition_model_timed_by_the_executor():
    model = GPULatency("tiny", device="cpu", num_blocks=32)
    assert model.needs_composition and isinstance(model, latency.LatencyModel)
    assert model.time_batch([(0, 30, 0)], [(1, 12)]) > 0
    model.release(0)
    model.release(1)
    assert model.executor.n_free_blocks() == 32
    with pytest.raises(NotImplementedError, match="time_batch"):
        model.batch_time(30, 30, 1, 1, 12)


def _reference_logits(ex: LlamaExecutor, ids: torch.Tensor) -> torch.Tensor:
    """The same weights run over one contiguous sequence with plain causal attention."""
    c, n = ex.config, len(ids)
    group = c.n_heads // c.n_kv_heads
    angles = torch.arange(n, dtype=torch.float32)[:, None] * ex.inv_freq[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]

    def rope(t: torch.Tensor) -> torch.Tensor:
        t1, t2 = t.chunk(2, dim=-1)
        return torch.cat((t1 * cos - t2 * sin, t2 * cos + t1 * sin), dim=-1)

    x = ex.embed[ids]
    for w in ex.layers:
        h = F.rms_norm(x, (c.hidden,), w["attn_norm"], eps=1e-5)
        q, k, v = (h @ w["wqkv"]).split(
            (c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.n_kv_heads * c.head_dim), dim=-1
        )
        q = rope(q.view(n, c.n_heads, c.head_dim)).transpose(0, 1)
        k = rope(k.view(n, c.n_kv_heads, c.head_dim)).transpose(0, 1).repeat_interleave(group, dim=0)
        v = v.view(n, c.n_kv_heads, c.head_dim).transpose(0, 1).repeat_interleave(group, dim=0)
        x = (
            x
            + F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(n, -1) @ w["wo"]
        )
        gate, up = (F.rms_norm(x, (c.hidden,), w["mlp_norm"], eps=1e-5) @ w["w_gate_up"]).chunk(2, dim=-1)
        x = x + (F.silu(gate) * up) @ w["w_down"]
    return F.rms_norm(x, (c.hidden,), ex.final_norm, eps=1e-5) @ ex.lm_head


def test_paged_kv_gather_equals_contiguous_attention_for_one_request(executor):
    """Chunked prefill then decode through scattered blocks, with another request's chunks
    interleaved in the same batches, gives the logits of one contiguous causal pass."""
    ids = torch.randint(TINY.vocab, (35,), generator=torch.Generator().manual_seed(1))
    other = torch.randint(TINY.vocab, (40,))
    got = [
        executor.forward_tokens([(7, 20, 0), (8, 17, 0)], [], torch.cat((ids[:20], other[:17])))[0],
        executor.forward_tokens([(8, 23, 17), (7, 12, 20)], [], torch.cat((other[17:], ids[20:32])))[1],
    ]
    for pos in (32, 33, 34):
        got.append(
            executor.forward_tokens([], [(8, pos + 8), (7, pos)], torch.stack((other[0], ids[pos])))[1]
        )
    table = executor.block_tables[7]
    assert table != list(range(table[0], table[0] + len(table)))  # the request's blocks are scattered
    ref = _reference_logits(executor, ids)[[19, 31, 32, 33, 34]]
    got = torch.stack(got)
    assert torch.linalg.norm(got - ref) / torch.linalg.norm(ref) < 1e-4
    executor.release(7)
    executor.release(8)


def test_decode_attention_in_bounded_groups_gives_the_logits_of_one_group():
    """Eight decodes of different contexts: with a 48-slot bound they run in several groups
    sorted by context (none over the bound unless alone); the logits equal the one-group run's."""
    contexts = [5, 40, 12, 33, 7, 21, 64, 2]
    out = []
    for bound in (10**6, 48):
        ex = LlamaExecutor(TINY, device="cpu", num_blocks=64, block_size=16, decode_chunk_tokens=bound)
        groups = ex._decode_chunks([c + 1 for c in contexts])
        out.append(ex.forward_tokens([], [(i, c) for i, c in enumerate(contexts)],
                                     torch.arange(len(contexts)) % TINY.vocab))
        if bound == 48:
            assert len(groups) > 1 and sorted(i for g in groups for i in g) == list(range(len(contexts)))
            for g in groups:
                longest = max(contexts[i] + 1 for i in g)
                assert len(g) * longest <= 48 or len(g) == 1
                assert [contexts[i] for i in g] == sorted(contexts[i] for i in g)
        else:
            assert len(groups) == 1
    assert torch.linalg.norm(out[0] - out[1]) / torch.linalg.norm(out[0]) < 1e-5


def _write_synthetic_log(path) -> None:
    """Three requests: chunked prefill, a cached prefix, a preemption with recompute, an idle gap."""
    batches = [
        {"prefill": [[0, 24, 0], [1, 16, 8]], "decode": []},
        {"prefill": [[2, 20, 0]], "decode": [[0, 24], [1, 24]]},
        {"prefill": [[2, 10, 20]], "decode": [[0, 25], [1, 25]]},
        {"prefill": [], "decode": [[0, 26], [1, 26], [2, 30]]},
        {"prefill": [[1, 27, 0]], "decode": [[0, 27], [2, 31]]},
        {"prefill": [], "decode": [[0, 28], [1, 27], [2, 32]]},
        {"prefill": [], "decode": [[1, 28]]},
    ]
    columns = (
        "t_start,duration,n_prefill_tokens,n_cached_prefix_tokens,n_decode,sum_context_tokens,"
        "kv_used,kv_capacity,n_waiting,n_running,n_preempted"
    ).split(",")
    t = 0.0
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for i, b in enumerate(batches):
            duration = 0.002 + 1e-5 * sum(n for _, n, _ in b["prefill"])
            n_tokens = sum(n for _, n, _ in b["prefill"])
            ctx = sum(c + n for _, n, c in b["prefill"]) + sum(c for _, c in b["decode"])
            cached, preempted = 8 * (i == 0), int(i == 4)
            w.writerow([t, duration, n_tokens, cached, len(b["decode"]), ctx, ctx, 4096, 0, 3, preempted])
            t += duration + (0.01 if i == 2 else 0.0)
    path.with_suffix(".batches.jsonl").write_text("".join(json.dumps(b) + "\n" for b in batches))


def test_release_schedule_frees_a_preempted_request_before_its_recompute(tmp_path):
    log = tmp_path / "iters.csv"
    _write_synthetic_log(log)
    batches = [json.loads(line) for line in log.with_suffix(".batches.jsonl").read_text().splitlines()]
    assert release_schedule(batches) == [[], [], [], [1], [], [0, 2], [1]]


def test_replay_of_a_synthetic_log_reports_errors_end_to_end_and_noise_band(tmp_path):
    log = tmp_path / "iters.csv"
    _write_synthetic_log(log)
    affine = FusedAffineLatency(0.002, 1e-5, 1e-4, 1e-7)
    summary = replay(
        log,
        "tiny",
        "cpu",
        tmp_path / "out",
        models=[latency.UnitLatency(), affine],
        executor_kwargs={"num_blocks": 16},
    )
    assert summary["iterations"] == 7 and summary["composition_mismatches"] == 0
    assert set(summary["models"]) == {"log", "unit", "affine"}
    for stats in summary["models"].values():
        assert stats["mape"] >= 0 and stats["p90_abs_err_s"] >= stats["p50_abs_err_s"] >= 0
        assert stats["end_to_end"]["measured_end_s"] > summary["measured_makespan_s"]  # the idle gap is kept
    assert 0 <= summary["noise_band"]["p50"] <= summary["noise_band"]["p90"]
    assert json.loads((tmp_path / "out" / "replay.json").read_text()) == summary
    with (tmp_path / "out" / "replay.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 7 and float(rows[0]["measured_0_s"]) > 0 and float(rows[0]["pred_unit_s"]) == 1.0


def test_calibration_writes_the_profile_csv_contract_and_the_table_model_loads_it(tmp_path):
    grid = CalibrationGrid(
        prefill_tokens=(16, 64, 128), n_decode=(1, 4), ctx_per_seq=(32, 128), n_mixed=4, repeats=1
    )
    summary = calibrate("tiny", "cpu", tmp_path, grid=grid, executor_kwargs={"num_blocks": 64})
    with (tmp_path / "profile.csv").open() as f:
        assert f.readline().strip() == ",".join(PROFILE_COLUMNS)
        assert PROFILE_COLUMNS == (
            "prefill_tokens",
            "prefill_ctx_tokens",
            "n_prefill",
            "n_decode",
            "decode_ctx_tokens",
            "time_s",
        )
        rows = list(csv.reader(f))
    assert len(rows) == summary["profile_rows"] == 3 + 2 * 2
    assert sum(int(r[3]) == 0 for r in rows) == 3 and all(float(r[5]) > 0 for r in rows)
    assert summary["heldout_rows"] == 4 and summary["heldout_mape"]["affine"] >= 0
    assert len(summary["decode_vs_hbm_bound"]) == 4
    assert json.loads((tmp_path / "calibration.json").read_text())["affine"] == summary["affine"]
    if not hasattr(latency, "TableLatency"):
        pytest.skip("llmsched_gym.core.latency.TableLatency is not implemented yet")
    table = latency.TableLatency.from_csv(tmp_path / "profile.csv")
    assert table.batch_time(64, 64, 1, 0, 0) > 0
    assert summary["heldout_mape"]["table"] is not None


def test_affine_decode_times_equal_batch_time_bit_for_bit():
    model = FusedAffineLatency(1e-3, 2e-5, 3e-4, 7e-8)
    ctx = np.array([0, 17, 4096, 123457])
    assert model.decode_times(9, ctx).tolist() == [model.batch_time(0, 0, 0, 9, int(c)) for c in ctx]


def test_hbm_bound_counts_weights_plus_kv_once():
    cfg = get_config("llama-2-7b")
    weights_only = hbm_bound_decode_s(cfg, batch=1, ctx=0, bandwidth=1e12)
    assert weights_only == pytest.approx(2 * (cfg.n_params() - cfg.vocab * cfg.hidden) / 1e12)
    assert hbm_bound_decode_s(cfg, 8, 1000, 1e12) - weights_only == pytest.approx(8 * 1000 * 524_288 / 1e12)


# --- without a GPU: one line, never a silent full-size CPU model ---------------------------------


@pytest.fixture
def no_gpu(monkeypatch):
    """A machine whose torch sees no CUDA device (whatever this one has)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    built: list[str] = []
    real_init = LlamaExecutor.__init__

    def spy(self, config, *args, **kwargs):
        built.append(config.name)
        real_init(self, config, *args, **kwargs)

    monkeypatch.setattr(LlamaExecutor, "__init__", spy)
    return built


def test_a_full_size_model_without_a_gpu_is_refused_before_any_weight_is_built(no_gpu):
    from llmsched_gym.backends.gpu.backend import NoGPUError, make_executor

    for model in ("llama-3-8b", "llama-2-7b", "llama-3.2-1b"):
        with pytest.raises(NoGPUError, match=rf"gpu:{model}: no CUDA GPU found .*tiny model.*CPU for tests"):
            make_executor(model)
    with pytest.raises(NoGPUError, match="device 'cuda': no CUDA GPU found"):
        make_executor("tiny", "cuda")
    assert no_gpu == []
    ex = make_executor("tiny", num_blocks=64)  # the toy shape runs on the CPU without asking
    assert ex.device.type == "cpu" and no_gpu == ["tiny"]


def test_an_explicit_cpu_device_needs_the_memory_for_the_float32_weights(no_gpu, monkeypatch):
    from llmsched_gym.backends.gpu import backend
    from llmsched_gym.backends.gpu.backend import NoGPUError, resolve_device

    monkeypatch.setattr(backend, "_free_memory_bytes", lambda: 8 * 2**30)
    cfg = get_config("llama-3-8b")  # 8.0e9 parameters: 30 GiB in float32
    with pytest.raises(NoGPUError, match="device 'cpu': llama-3-8b needs about 30 GiB .* 8 GiB are free"):
        resolve_device(cfg, "cpu")
    monkeypatch.setattr(backend, "_free_memory_bytes", lambda: 64 * 2**30)
    assert resolve_device(cfg, "cpu") == "cpu"
    assert no_gpu == []


def test_the_gpu_env_and_commands_say_so_in_one_line_without_a_gpu(no_gpu, tmp_path, capsys):
    import gymnasium as gym

    import llmsched_gym  # noqa: F401  (registers the ids)
    from llmsched_gym.cli import main
    from llmsched_gym.cli.gpu import main as gpu_main
    from llmsched_gym.config import ConfigError

    env = gym.make("LLMSchedGPU-v1", n_requests=5)
    with pytest.raises(ConfigError, match="gpu:llama-3-8b: no CUDA GPU found"):
        env.reset(seed=0)
    log = tmp_path / "it.csv"
    assert main(["run", "--scenario", "jaillet-low", "--set", "workload.n_requests=5", "--quiet",
                 "--log-iterations", str(log), "--log-batches"]) == 0
    for argv in (["run", "--scenario", "jaillet-low", "--latency", "gpu:llama-3-8b", "--quiet"],
                 ["gpu", "calibrate", "--model", "llama-2-7b", "--out", str(tmp_path / "c")],
                 ["gpu", "replay", str(log), "--model", "llama-3-8b", "--out", str(tmp_path / "r")],
                 ["gpu", "calibrate", "--model", "tiny", "--device", "cuda", "--out", str(tmp_path / "c")]):
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "no CUDA GPU found" in err and "tiny" in err, (argv, err)
        if argv[0] == "gpu":  # the standalone entry point of the GPU machine says the same
            assert gpu_main(argv) == 2
            assert capsys.readouterr().err == err
    assert no_gpu == []
