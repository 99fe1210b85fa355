"""Batch-time models, model/GPU specs and the profile-table contract."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsched_gym.core.latency import (
    PROFILE_COLUMNS,
    ROOFLINE_PRESETS,
    AffineLatency,
    LatencyModel,
    LinearKVLatency,
    PiecewiseLatency,
    RooflineLatency,
    TableLatency,
    UnitLatency,
    fit_affine,
    fit_linear,
    list_latency_presets,
    make_latency,
)
from llmsched_gym.core.models import (
    get_gpu,
    get_model,
    kv_capacity_tokens,
    preset_capacity_tokens,
)


def _profile_rows() -> list[tuple[int, int, int, int, int, float]]:
    """A synthetic profile from the roofline: a full decode grid, a scattered line, a prefill curve."""
    truth = make_latency("roofline:llama-3-8b/h100")
    rows = []
    for n in (1, 8, 32, 128):
        for c in (64, 512, 2048, 8192):
            rows.append((0, 0, 0, n, n * c, truth.batch_time(0, 0, 0, n, n * c)))
    rows += [(0, 0, 0, 256, 256 * c, truth.batch_time(0, 0, 0, 256, 256 * c)) for c in (100, 3000)]
    for p in (16, 128, 512, 2048, 8192):
        rows.append((p, p, 1, 0, 0, truth.batch_time(p, p, 1, 0, 0)))
    rows.append((128, 128, 1, 0, 0, rows[-4][5] + 0.002))  # a duplicate point: averaged
    return rows


TABLE = TableLatency.from_rows(_profile_rows())

ALL_MODELS: list[LatencyModel] = [
    UnitLatency(),
    LinearKVLatency(),
    LinearKVLatency(0.0123, 3.3e-7),
    PiecewiseLatency(),
    AffineLatency(),
    TABLE,
    *(make_latency(name) for name in ROOFLINE_PRESETS),
]


def _bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).view(np.int64)


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.name)
@settings(max_examples=60, deadline=None)
@given(
    n_decode=st.integers(1, 1024),
    per_seq=st.lists(st.integers(0, 40_000), min_size=1, max_size=40),
)
def test_decode_times_equal_batch_time_bit_for_bit(model, n_decode, per_seq):
    ctx = np.array([n_decode * c + j for j, c in enumerate(per_seq)], dtype=np.int64)
    vec = model.decode_times(n_decode, ctx)
    scalar = np.array([model.batch_time(0, 0, 0, n_decode, int(c)) for c in ctx])
    assert vec.shape == ctx.shape
    np.testing.assert_array_equal(_bits(vec), _bits(scalar))


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.name)
def test_batch_time_is_a_python_float_and_non_negative(model):
    for shape in [(0, 0, 0, 1, 10), (512, 512, 1, 0, 0), (300, 1300, 2, 40, 40_000), (1, 1, 1, 1, 0)]:
        t = model.batch_time(*shape)
        assert type(t) is float and t >= 0.0


# --- models and GPUs -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, kv_bytes",
    [("Llama-2-70B", 327_680), ("Llama-3-8B", 131_072), ("Llama-2-7B", 524_288), ("llama-3.1-8b", 131_072)],
)
def test_kv_bytes_per_token_counts_kv_heads_not_query_heads(name, kv_bytes):
    assert get_model(name).kv_bytes_per_token == kv_bytes


def test_reference_capacities_are_the_papers_numbers():
    assert preset_capacity_tokens("Llama-2-7B", "A100-80GB") == 118_784 == 7_424 * 16
    assert preset_capacity_tokens("llama-2-70b", "a100x2") == 16_492
    # No reference: the formula.
    assert preset_capacity_tokens("Llama-3-8B", "H100") == kv_capacity_tokens("Llama-3-8B", "H100-SXM")


def test_capacity_formula_is_close_to_vidur_and_rounded_to_blocks():
    derived = kv_capacity_tokens("Llama-2-7B", "A100")
    assert derived % 16 == 0
    assert abs(derived - 118_784) / 118_784 < 0.02
    assert kv_capacity_tokens("Llama-2-7B", "A100", mem_util=0.5) < derived
    assert kv_capacity_tokens("Llama-3-8B", "A100") > 3 * derived  # GQA: 4x fewer KV bytes


def test_capacity_raises_when_weights_do_not_fit():
    with pytest.raises(ValueError, match="Llama-2-70B does not fit on A10G"):
        kv_capacity_tokens("Llama-2-70B", "A10G")


def test_unknown_names_raise_one_line_listing_allowed():
    with pytest.raises(ValueError) as e:
        get_model("gpt-5")
    assert "\n" not in str(e.value) and "Llama-2-7B" in str(e.value) and "Llama-3.2-1B" in str(e.value)
    with pytest.raises(ValueError, match=r"gpu: unknown 'tpu'.*A100-80GB.*L20"):
        get_gpu("tpu")
    assert get_gpu("H200").name == get_gpu("h200").name == "H200"


# --- individual models -----------------------------------------------------------------------


def test_linear_counts_prefill_context_decode_context_and_new_tokens():
    m = LinearKVLatency(0.01, 1e-6)
    assert m.batch_time(100, 150, 1, 4, 1000) == pytest.approx(0.01 + 1e-6 * (150 + 1000 + 4))


def test_piecewise_is_flat_below_b0_and_linear_above():
    m = PiecewiseLatency(c=0.01, a=1e-4, b0=100)
    assert m.batch_time(0, 0, 0, 1, 5) == m.batch_time(0, 0, 0, 100, 10**6) == 0.01
    assert m.batch_time(50, 50, 1, 150, 0) == pytest.approx(0.01 + 1e-4 * 100)


def test_affine_defaults_are_seed_002_fit_and_mixed_batch_is_the_sum():
    m = AffineLatency()
    decode_ms = 16.3 + 0.245 * 19 + 0.00202 * 19 * 300
    prefill_ms = 35.7 + 0.21 * 19 + 0.2086 * 19 * 256
    assert m.batch_time(0, 0, 0, 19, 19 * 299) * 1e3 == pytest.approx(decode_ms)
    assert m.batch_time(19 * 256, 19 * 256, 19, 0, 0) * 1e3 == pytest.approx(prefill_ms)
    assert m.batch_time(19 * 256, 19 * 256, 19, 19, 19 * 299) * 1e3 == pytest.approx(decode_ms + prefill_ms)


def test_roofline_llama2_7b_a100_decode_step_is_7_to_10_ms():
    m = make_latency("roofline:llama-2-7b/a100")
    assert 7e-3 <= m.batch_time(0, 0, 0, 1, 128) <= 10e-3


@pytest.mark.parametrize(
    "preset, lo_ms, hi_ms",
    [
        ("roofline:llama-2-7b/a100", 15, 30),  # batch 32 x 1k context: KV read adds ~10 ms
        ("roofline:llama-3-8b/a100", 10, 20),  # GQA: the same batch costs little KV
        ("roofline:llama-3-8b/h100", 6, 12),
        ("roofline:llama-3-8b/h200", 5, 9),
        ("roofline:llama-2-70b/2xa100", 35, 60),
    ],
)
def test_roofline_decode_step_ranges(preset, lo_ms, hi_ms):
    assert lo_ms <= 1e3 * make_latency(preset).batch_time(0, 0, 0, 32, 32 * 1000) <= hi_ms


def test_roofline_prefill_is_compute_bound_and_grows_with_tokens():
    m = RooflineLatency("llama-2-7b", "a100")
    short, long = m.batch_time(512, 512, 1, 0, 0), m.batch_time(4096, 4096, 1, 0, 0)
    assert long > 7 * short
    # 2 x 6.7e9 x 4096 FLOP at 156 TFLOP/s, plus attention: 0.35-0.45 s.
    assert 0.35 < long < 0.45
    # A cached prefix makes the chunk attend to more keys: slower than the bare chunk.
    assert m.batch_time(512, 4096, 1, 0, 0) > short


def test_roofline_faster_gpu_is_faster():
    a100, h100, h200 = (make_latency(f"roofline:llama-3-8b/{g}") for g in ("a100", "h100", "h200"))
    for shape in [(0, 0, 0, 64, 64 * 2000), (2048, 2048, 1, 0, 0)]:
        assert a100.batch_time(*shape) > h100.batch_time(*shape) >= h200.batch_time(*shape)


# --- the profile table -----------------------------------------------------------------------


def test_table_is_exact_at_measured_points():
    for p, pc, n_pre, nd, dc, t in _profile_rows():
        if p == 128:
            continue  # the duplicated point: checked below
        assert TABLE.batch_time(p, pc, n_pre, nd, dc) == t


def test_table_averages_duplicate_prefill_points():
    rows = [r for r in _profile_rows() if r[0] == 128]
    assert TABLE.batch_time(128, 128, 1, 0, 0) == pytest.approx((rows[0][5] + rows[1][5]) / 2)


def test_table_interpolates_bilinearly_inside_the_grid():
    rows = {(r[3], r[4] // r[3]): r[5] for r in _profile_rows() if r[0] == 0}
    t00, t01, t10, t11 = rows[8, 512], rows[8, 2048], rows[32, 512], rows[32, 2048]
    # n = 20 is half way from 8 to 32; ctx 1280 is half way from 512 to 2048.
    expected = (t00 + t01 + t10 + t11) / 4
    assert TABLE.batch_time(0, 0, 0, 20, 20 * 1280) == pytest.approx(expected, rel=1e-12)


def test_table_extrapolates_linearly_and_clamps_at_zero():
    rows = [(0, 0, 0, 1, 100, 0.010), (0, 0, 0, 1, 200, 0.012), (10, 10, 1, 0, 0, 0.02), (20, 20, 1, 0, 0, 0.03)]
    m = TableLatency.from_rows(rows)
    assert m.batch_time(0, 0, 0, 1, 400) == pytest.approx(0.016)
    assert m.batch_time(40, 40, 1, 0, 0) == pytest.approx(0.05)
    assert m.batch_time(0, 0, 0, 1, 0) == pytest.approx(0.008)
    steep = TableLatency.from_rows([(0, 0, 0, 1, 100, 0.001), (0, 0, 0, 1, 200, 0.011), *rows[2:]])
    assert steep.batch_time(0, 0, 0, 1, 0) == 0.0
    # A single decode line is used for every n_decode.
    assert m.batch_time(0, 0, 0, 7, 7 * 150) == pytest.approx(0.011)


def test_table_mixed_batch_adds_parts_minus_base():
    t_dec = TABLE.batch_time(0, 0, 0, 32, 32 * 2048)
    t_pre = TABLE.batch_time(512, 512, 1, 0, 0)
    t_base = min(r[5] for r in _profile_rows())
    assert TABLE.batch_time(512, 512, 1, 32, 32 * 2048) == pytest.approx(t_dec + t_pre - t_base)


def test_table_csv_round_trip(tmp_path):
    path = tmp_path / "profile.csv"
    TABLE.to_csv(path)
    assert path.read_text().splitlines()[0] == ",".join(PROFILE_COLUMNS)
    again = TableLatency.from_csv(path)
    assert again.rows == TABLE.rows
    assert again.name == f"table:{path}"
    ctx = np.arange(0, 100_000, 997)
    np.testing.assert_array_equal(_bits(again.decode_times(48, ctx)), _bits(TABLE.decode_times(48, ctx)))


def test_table_csv_ignores_extra_columns(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text(
        "prefill_tokens,prefill_ctx_tokens,n_prefill,n_decode,decode_ctx_tokens,time_s,gpu\n"
        "0,0,0,4,400,0.02,h100\n16,16,1,0,0,0.03,h100\n"
    )
    assert TableLatency.from_csv(path).batch_time(0, 0, 0, 4, 400) == 0.02


@pytest.mark.parametrize(
    "body, message",
    [
        ("0,0,0,4,400,0.02\n16,16,1,x,0,0.03\n", r"p\.csv:3: column 'n_decode': expected a non-negative integer, got 'x'"),
        ("0,0,0,4,400,0.02\n16,16,1,0,0\n", r"p\.csv:3: expected 6 fields, got 5"),
        ("0,0,0,4,-400,0.02\n", r"p\.csv:2: column 'decode_ctx_tokens'"),
        ("0,0,0,4,400,nan\n", r"p\.csv:2: column 'time_s'"),
        ("0,0,0,0,0,0.01\n", r"p\.csv:2: column 'n_decode': an empty batch"),
    ],
)
def test_malformed_profile_names_file_line_and_column(tmp_path, body, message):
    path = tmp_path / "p.csv"
    path.write_text(",".join(PROFILE_COLUMNS) + "\n" + body)
    with pytest.raises(ValueError, match=message) as e:
        TableLatency.from_csv(path)
    assert "\n" not in str(e.value)


def test_profile_with_wrong_header_or_missing_kinds(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("prefill_tokens,n_decode,time_s\n0,4,0.02\n")
    with pytest.raises(ValueError, match=r"p\.csv:1: missing column 'prefill_ctx_tokens'"):
        TableLatency.from_csv(path)
    with pytest.raises(ValueError, match="needs prefill-only rows"):
        TableLatency.from_rows([(0, 0, 0, 4, 400, 0.02)])


def test_from_rows_accepts_mappings():
    rows = [dict(zip(PROFILE_COLUMNS, r, strict=True)) for r in _profile_rows()]
    assert TableLatency.from_rows(rows).rows == TABLE.rows


# --- fitting ---------------------------------------------------------------------------------


def test_fit_affine_recovers_an_affine_profile():
    truth = AffineLatency(0.03, 2e-4, 1.5e-4, 0.0, 0.015, 3e-4, 2e-6)
    rows = [(p, p, k, 0, 0, truth.batch_time(p, p, k, 0, 0)) for p in (64, 512, 4096) for k in (1, 4)]
    rows += [(0, 0, 0, n, n * c, truth.batch_time(0, 0, 0, n, n * c)) for n in (1, 16, 64) for c in (100, 2000)]
    fit = fit_affine(rows)
    for k in AffineLatency.COEFFS:
        assert getattr(fit, k) == pytest.approx(getattr(truth, k), rel=1e-6, abs=1e-12)


def test_fit_linear_recovers_d0_d1():
    truth = LinearKVLatency(0.011, 2.7e-7)
    rows = [(0, 0, 0, n, n * c, truth.batch_time(0, 0, 0, n, n * c)) for n in (1, 8, 64) for c in (10, 1000)]
    fit = fit_linear(rows)
    assert (fit.d0, fit.d1) == (pytest.approx(0.011), pytest.approx(2.7e-7))


# --- make_latency ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, cls",
    [
        ("unit", UnitLatency),
        ("linear", LinearKVLatency),
        ("linear:d0=0.01,d1=2.6e-7", LinearKVLatency),
        ("piecewise:b0=64", PiecewiseLatency),
        ("affine", AffineLatency),
        ("affine:decode_base_s=0.02", AffineLatency),
        ("roofline:llama-2-7b/a100", RooflineLatency),
        ("roofline:Llama-3-8B/H100-SXM,mfu=0.6", RooflineLatency),
        ("llama-2-70b/2xa100", RooflineLatency),
        ({"type": "linear", "d0": 0.02}, LinearKVLatency),
        ({"type": "roofline", "model": "llama-3-8b", "gpu": "h200"}, RooflineLatency),
        ({"type": "unit"}, UnitLatency),
    ],
)
def test_make_latency_parses_specs_and_names_rebuild_the_model(spec, cls):
    m = make_latency(spec)
    assert type(m) is cls
    again = make_latency(m.name)
    assert again.name == m.name
    assert again.batch_time(300, 900, 2, 17, 17_000) == m.batch_time(300, 900, 2, 17, 17_000)


def test_make_latency_values_and_passthrough():
    m = make_latency("linear:d0=0.02, d1=1e-6")
    assert (m.d0, m.d1) == (0.02, 1e-6)
    assert make_latency(m) is m
    assert make_latency("roofline:llama-3-8b/h100,mfu=0.6").mfu == 0.6
    assert make_latency("roofline:llama-2-7b/a100-80gb").name == "roofline:llama-2-7b/a100"


def test_make_latency_table_path(tmp_path):
    path = tmp_path / "profile.csv"
    TABLE.to_csv(path)
    assert make_latency(f"table:{path}").rows == TABLE.rows
    assert make_latency({"type": "table", "path": str(path)}).rows == TABLE.rows


@pytest.mark.parametrize(
    "spec, message",
    [
        ("fast", r"latency: unknown model 'fast'; allowed: unit, linear"),
        ("linear:d2=1", r"latency: linear takes d0=\.\.\., d1=\.\.\.; got 'd2=1'"),
        ("linear:d0=abc", r"latency: linear d0: expected a number, got 'abc'"),
        ("roofline:gpt-9/a100", r"model: unknown 'gpt-9'; allowed: Llama-2-7B"),
        ("roofline:llama-2-7b/tpu", r"gpu: unknown 'tpu'"),
        ("roofline:llama-2-7b", r"latency: unknown model"),
        ("roofline:llama-2-7b/a100,mfu=2", r"latency: roofline needs 0 < mfu"),
        ({"type": "linear", "d9": 1}, r"latency: bad arguments for 'linear'"),
        ({"type": "quantum"}, r"latency: unknown model"),
        (3.0, r"latency: expected a spec string"),
    ],
)
def test_make_latency_errors_are_one_line(spec, message):
    with pytest.raises(ValueError, match=message) as e:
        make_latency(spec)
    assert "\n" not in str(e.value)


def test_list_latency_presets_build():
    presets = list_latency_presets()
    for name in ROOFLINE_PRESETS:
        assert name in presets
    # templates (table:PATH, vidur:GPU/MODEL, a plug-in's gpu:...) name a form, not a model
    concrete = [n for n in presets if not any(c.isupper() for c in n) and "..." not in n]
    assert {"table:PATH", "vidur:GPU/MODEL[,tp=N]", "gpu:..."} <= set(presets) - set(concrete)
    for name in concrete:
        assert make_latency(name).name == name or make_latency(name).name.split(":")[0] == name.split(":")[0]
    assert all(isinstance(v, str) and v for v in presets.values())
    assert not any(math.isnan(make_latency(n).batch_time(1, 1, 1, 1, 1)) for n in concrete)


def test_gpu_executor_shapes_are_the_core_model_specs():
    """One table of Llama shapes: the GPU executor's presets are built from core.models.MODELS, and
    the parameter count its shape implies matches the published count the roofline uses (0.05%)."""
    from llmsched_gym.backends.gpu.config import PRESETS
    from llmsched_gym.core.models import MODELS

    for name in ("llama-2-7b", "llama-3-8b", "llama-3.2-1b"):
        cfg, spec = PRESETS[name], MODELS[name]
        assert (cfg.n_layers, cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn, cfg.vocab) == (
            spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.head_dim, spec.ffn, spec.vocab)
        assert cfg.kv_bytes_per_token() == spec.kv_bytes_per_token
        assert abs(cfg.n_params() / spec.params - 1) < 5e-4
    assert PRESETS["llama-3.2-1b"].tie_embeddings and not PRESETS["llama-3-8b"].tie_embeddings


def test_the_shipped_h100_profiles_load_as_table_models_and_reproduce_their_rows():
    """docs/gpu/*/profile.csv (measured on an H100 by `llmsched gpu calibrate`) is the documented
    input of `--latency table:PATH`: every measured row comes back exactly, and prefill time grows
    with the prompt above the launch-bound floor."""
    import csv
    from pathlib import Path

    from llmsched_gym.core.latency import make_latency

    root = Path(__file__).resolve().parents[1] / "docs" / "gpu"
    keys = ("prefill_tokens", "prefill_ctx_tokens", "n_prefill", "n_decode", "decode_ctx_tokens")
    for folder in ("h100-llama-2-7b", "h100-llama-3-8b"):
        path = root / folder / "profile.csv"
        model = make_latency(f"table:{path}")
        rows = list(csv.DictReader(path.open()))
        assert len(rows) >= 50
        for r in rows:
            assert model.batch_time(*(int(r[k]) for k in keys)) == pytest.approx(float(r["time_s"]), rel=1e-12)
        prefill = {int(r["prefill_tokens"]): float(r["time_s"]) for r in rows if int(r["n_prefill"]) == 1}
        assert prefill[4096] > 3 * prefill[1024] > 3 * prefill[64]
