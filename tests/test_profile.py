"""Latency grounded in measured GPU profiles: the Vidur profile model, the calibrated roofline
presets, the latency registry, and ``llmsched fidelity``."""

from __future__ import annotations

import ast
import csv
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmsched_gym import data
from llmsched_gym.cli import main
from llmsched_gym.core import profile as prof_mod
from llmsched_gym.core.latency import (
    CALIBRATED_PRESETS,
    LATENCY_KINDS,
    CalibratedLatency,
    LatencyModel,
    RooflineLatency,
    TableLatency,
    calibrated,
    make_latency,
    register_latency,
)
from llmsched_gym.core.models import get_gpu, get_model
from llmsched_gym.core.profile import (
    VIDUR_LAYER_OPS,
    ProfileError,
    ProfileLatency,
    find_profile,
    fit_roofline,
    loo_errors,
    monotone,
    read_vidur_mlp,
)
from llmsched_gym.fidelity import FITTED, GROUNDED, GROUNDED_LOO, import_profile, run_fidelity

PROFILES = Path(__file__).resolve().parents[1].parent / "shared" / "profiles"
SHARED = [("vidur:a100/llama-2-7b", (1, 2, 4)), ("vidur:a100/llama-2-70b", (1, 2, 4)),
          ("vidur:a100/llama-3-8b", (1, 2, 4)), ("vidur:h100/llama-2-7b", (1, 2, 4)),
          ("vidur:h100/llama-2-70b", (1, 2, 4)), ("vidur:a40/llama-2-7b", (1, 2, 4))]

# Llama-2-7B's shape; per-layer medians in ms: the four projections cost `proj` and the five
# small operators `small` each, so a layer costs proj + 5 * small.
SHAPE = {"n_head": 32, "n_kv_head": 32, "n_embd": 4096, "n_expanded_embd": 11008, "vocab_size": 32768,
         "use_gated_mlp": True}
PROJ = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")


def layer_ms(tokens: int, tp: int) -> tuple[float, float, float]:
    """(projection ms each, small-op ms each, embedding ms) of the constructed profile."""
    return (0.05 + 0.001 * tokens) / tp, 0.01, 0.2


def write_vidur(path: Path, points: list[tuple[int, int]], dup: tuple[int, int] | None = None) -> Path:
    """A Vidur-format mlp.csv (only the median columns the reader needs) under ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    f = path / "mlp.csv"
    cols = [f"time_stats.{op}.median" for op in ("emb", *VIDUR_LAYER_OPS)]
    with f.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*cols, *SHAPE, "num_tokens", "num_tensor_parallel_workers"])
        rows = list(points) + ([dup] if dup else [])
        for i, (n, tp) in enumerate(rows):
            p, s, e = layer_ms(n, tp)
            if dup and i == len(rows) - 1:
                p *= 1.1  # a repeated measurement 10% slower in its projections
            w.writerow([e, *(p if op in PROJ else s for op in VIDUR_LAYER_OPS), *SHAPE.values(), n, tp])
    return f


def expected_seconds(n: int, tp: int, proj_scale: float = 1.0) -> float:
    p, s, e = layer_ms(n, tp)
    return (32 * (4 * p * proj_scale + 5 * s) + e) * 1e-3


@pytest.fixture
def vidur_dir(tmp_path: Path) -> Path:
    d = tmp_path / "a100" / "meta-llama" / "Llama-2-7b-hf"
    write_vidur(d, [(n, tp) for tp in (1, 2) for n in (1, 64, 512, 4096)], dup=(64, 1))
    return d


def test_read_vidur_mlp_sums_layers_and_identifies_model_gpu(vidur_dir: Path):
    profiles = read_vidur_mlp(str(vidur_dir))
    assert sorted(profiles) == [1, 2]
    p1 = profiles[1]
    assert p1.model.name == "Llama-2-7B" and p1.gpu.name == "A100-80GB" and p1.tp == 1
    assert list(p1.tokens) == [1, 64, 512, 4096]
    assert p1.seconds[0] == pytest.approx(expected_seconds(1, 1), rel=1e-12)
    # the duplicate at 64 tokens is averaged with the first measurement
    assert p1.seconds[1] == pytest.approx((expected_seconds(64, 1) + expected_seconds(64, 1, 1.1)) / 2, rel=1e-12)
    assert profiles[2].seconds[3] == pytest.approx(expected_seconds(4096, 2), rel=1e-12)
    # stream_mbu: the projections' weight bytes over their time at one token, per TP rank
    m, g = get_model("llama-2-7b"), get_gpu("a100")
    proj_bytes = (m.hidden * 3 * m.hidden + m.hidden * m.hidden + 3 * m.hidden * m.ffn) * 2
    assert p1.stream_mbu == pytest.approx(min(1.0, proj_bytes / (4 * 0.051e-3) / g.hbm_bytes_s), rel=1e-12)
    assert profiles[2].stream_mbu == pytest.approx(min(1.0, proj_bytes / 2 / (4 * 0.051e-3 / 2) / g.hbm_bytes_s))


def test_profile_latency_formula(vidur_dir: Path):
    m = make_latency(f"profile:{vidur_dir},mfu=0.5,mbu=0.8,overhead_s=0.001")
    assert isinstance(m, ProfileLatency) and m.name == f"profile:{vidur_dir},mfu=0.5,mbu=0.8,overhead_s=0.001"
    spec, gpu = get_model("llama-2-7b"), get_gpu("a100")
    s_pair = 4 * 32 * 32 * 128 / (gpu.peak_flops * 0.5)
    s_kv = spec.kv_bytes_per_token / (gpu.hbm_bytes_s * 0.8)
    # a 512-token prefill over 512 tokens of context: causal pairs 512*512 - 512^2/2 + 512/2
    pairs = 512 * 512 - 0.5 * 512 * 512 + 256
    lin = m.profile.seconds[2]
    attn = max(s_pair * pairs, s_kv * (512 + 512))
    assert m.batch_time(512, 512, 1, 0, 0) == pytest.approx(lin + attn + 0.001, rel=1e-12)
    # between measured points the linear part is interpolated
    mid = m.profile.seconds[2] + (m.profile.seconds[3] - m.profile.seconds[2]) * (1000 - 512) / (4096 - 512)
    assert m.linear_time(1000) == pytest.approx(mid, rel=1e-12)
    # TP 2: the linear part is the TP-2 curve, attention splits over two GPUs, all-reduce added
    m2 = make_latency(f"profile:{vidur_dir},tp=2,mfu=0.5,mbu=0.8")
    comm = 2 * 32 * (10e-6 + 2 * (2 - 1) / 2 * 64 * 4096 * 2 / 300e9)
    attn2 = max(s_pair / 2 * (64 * 100 + 64), s_kv / 2 * (64 * 100 + 64))
    assert m2.batch_time(0, 0, 0, 64, 64 * 100) == pytest.approx(m2.profile.seconds[1] + attn2 + comm, rel=1e-12)
    # default efficiencies: mfu from the fitted roofline, mbu the projections' streaming bandwidth
    d = make_latency(f"profile:{vidur_dir}")
    assert d.mfu == fit_roofline(d.profile).mfu and d.mbu == d.profile.stream_mbu


def test_monotone_pools_dips_in_relative_error():
    pooled = (3 / 9 + 2 / 4) / (1 / 9 + 1 / 4)
    assert monotone(np.array([1.0, 3.0, 2.0, 4.0])).tolist() == [1.0, pooled, pooled, 4.0]
    assert monotone(np.array([1.0, 2.0, 5.0])).tolist() == [1.0, 2.0, 5.0]
    y = np.array([5.0, 1.0, 1.0, 7.0, 6.0, 6.5])
    m = monotone(y)
    assert np.all(np.diff(m) >= 0) and m[0] == m[1] == m[2] and m[3] == m[4] < m[5] == 6.5


@given(n=st.integers(1, 10_000), ctx=st.lists(st.integers(0, 300_000), min_size=1, max_size=20), tp=st.sampled_from([1, 2]))
def test_profile_decode_times_bit_identical(n, ctx, tp, tmp_path_factory):
    d = tmp_path_factory.getbasetemp() / "a100" / "meta-llama" / "Llama-2-7b-hf"
    if not (d / "mlp.csv").exists():
        write_vidur(d, [(k, t) for t in (1, 2) for k in (1, 64, 512, 4096)])
    m = make_latency(f"profile:{d},tp={tp}")
    a = m.decode_times(n, np.array(ctx, dtype=np.float64))
    assert a.tolist() == [m.batch_time(0, 0, 0, n, c) for c in ctx]


def test_profile_errors_name_the_field(tmp_path: Path, vidur_dir: Path, capsys):
    with pytest.raises(ProfileError, match="tp=4 not measured; allowed: 1, 2"):
        make_latency(f"profile:{vidur_dir},tp=4")
    with pytest.raises(ProfileError, match="takes tp=.*got 'bogus=1'"):
        make_latency(f"profile:{vidur_dir},bogus=1")
    with pytest.raises(ProfileError, match="file not found"):
        make_latency(f"profile:{tmp_path / 'nope'}")
    huge = tmp_path / "huge" / "mlp.csv"  # a sparse file: its size is checked before a byte is read
    huge.parent.mkdir()
    with huge.open("wb") as f:
        f.truncate(300 * 2**20)
    with pytest.raises(ProfileError, match=r"314,572,800 bytes, more than the 268,435,456 a profile may have"):
        make_latency(f"profile:{huge.parent}")
    bad = tmp_path / "x" / "mlp.csv"
    bad.parent.mkdir()
    bad.write_text("num_tokens,foo\n1,2\n")
    with pytest.raises(ProfileError, match="missing column 'time_stats.emb.median'"):
        make_latency(f"profile:{bad}")
    nogpu = write_vidur(tmp_path / "somewhere", [(1, 1), (8, 1)])
    with pytest.raises(ProfileError, match="cannot tell the GPU"):
        make_latency(f"profile:{nogpu}")
    assert make_latency(f"profile:{nogpu},gpu=h100").profile.gpu.name == "H100-SXM"
    with pytest.raises(ProfileError, match="unknown profile 'vidur:b200/llama-2-7b'; allowed: vidur:a100/llama-2-7b"):
        make_latency("vidur:b200/llama-2-7b")
    assert main(["run", "--scenario", "klpm-toy", "--latency", f"profile:{vidur_dir},tp=3", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tp=3 not measured" in err[0]


def test_vidur_names_resolve_through_the_data_cache_or_fall_back(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setattr(data, "shared_roots", lambda: [])
    monkeypatch.setenv("LLMSCHED_DATA", str(tmp_path / "cache"))
    monkeypatch.setattr(calibrated, "_NOTIFIED", set())
    # not found: the scenarios' stand-in is the roofline calibrated on that profile, said once
    assert make_latency("vidur:a100/llama-2-7b").name == "calibrated:llama-2-7b/a100"
    assert make_latency("vidur:A100/llama-2-7b").name == "calibrated:llama-2-7b/a100"
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["vidur:a100/llama-2-7b: measured profile not found, using calibrated:llama-2-7b/a100 (the "
                   "roofline fitted to it as the linear part, MAPE 3.9%); `llmsched data download vidur:a100/llama-2-7b`"]
    assert make_latency("vidur:a100/llama-2-70b,tp=2").name == "calibrated:llama-2-70b/2xa100"
    with pytest.raises(ValueError, match="no calibrated preset stands in"):
        make_latency("vidur:a100/llama-2-70b,tp=4")
    # found in the cache, where `llmsched data download` puts it
    folder = tmp_path / "cache" / "profiles" / "vidur" / "a100" / "meta-llama" / "Llama-2-7b-hf"
    write_vidur(folder, [(1, 1), (64, 1), (512, 1)])
    assert find_profile("vidur:a100/llama-2-7b") == folder
    m = make_latency("vidur:a100/llama-2-7b")
    assert isinstance(m, ProfileLatency) and m.name == "vidur:a100/llama-2-7b"


def test_latency_registry_and_core_imports_no_plugin():
    class Twice(LatencyModel):
        def __init__(self, k: str) -> None:
            self.k = float(k)
            self.name = f"twice:{k}"

        def batch_time(self, *shape: int) -> float:
            return self.k * 2

    register_latency("twice", Twice, "test model")
    try:
        assert make_latency("twice:3").batch_time(1, 1, 1, 0, 0) == 6.0
        assert "gpu" in LATENCY_KINDS  # the GPU back-end registered itself when llmsched_gym was imported
        assert {"vidur", "profile"} <= set(LATENCY_KINDS)  # and core.profile its two kinds
    finally:
        LATENCY_KINDS.pop("twice")
    core = Path(prof_mod.__file__).parent
    for f in core.rglob("*.py"):  # core/ and its packages (latency/, workload/)
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom | ast.Import):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                assert not any("backends" in n for n in names), f"{f.name} imports {names}"


def test_calibrated_presets_build_with_their_factors():
    for name, p in CALIBRATED_PRESETS.items():
        m = make_latency(name)
        assert isinstance(m, CalibratedLatency) and m.name == name and m.preset is p
        assert isinstance(m.roofline, RooflineLatency)
        assert (m.roofline.mfu, m.roofline.mbu, m.roofline.overhead_s) == (p.mfu, p.mbu, p.overhead_s)
        assert (m.mfu, m.mbu, m.overhead_s) == (p.mfu, p.stream_mbu, 0.0)
        assert f"MAPE {p.mape:.1%}" in p.describe() and f"KV at mbu {p.stream_mbu:.2f}" in p.describe()
    with pytest.raises(ValueError, match="allowed: calibrated:llama-2-7b/a100"):
        make_latency("calibrated:llama-2-7b/b200")


def test_calibrated_is_the_profile_model_with_the_fitted_roofline_as_linear_part(vidur_dir: Path):
    """``calibrated:`` sums the same terms as the profile model: only the linear part differs,
    and it is the fitted roofline at context 0 (the function the fit minimised the error of)."""
    p = CALIBRATED_PRESETS["calibrated:llama-2-7b/a100"]
    c = make_latency("calibrated:llama-2-7b/a100")
    v = make_latency(f"profile:{vidur_dir},mfu={p.mfu},mbu={p.stream_mbu}")
    spec, gpu = get_model("llama-2-7b"), get_gpu("a100")
    for n in (1, 7, 136, 512, 3000):
        assert c.linear_time(n) == prof_mod.roofline_linear(spec, gpu, p.mfu, p.mbu, p.overhead_s, np.array([n]))[0]
    shapes = [(256, 2256, 1, 32, 32 * 1000), (512, 512, 1, 0, 0), (0, 0, 0, 64, 64 * 4000), (300, 4000, 3, 5, 900)]
    for shape in shapes:
        tokens = shape[0] + shape[3]
        rest_c = c.batch_time(*shape) - c.linear_time(tokens)
        assert rest_c == pytest.approx(v.batch_time(*shape) - v.linear_time(tokens), rel=1e-9)
    # prefill 256 at context 2,000 + 32 decodes at 1,000 each: linear + attention, summed
    s_pair = 4 * 32 * 32 * 128 / (gpu.peak_flops * p.mfu)
    s_kv = spec.kv_bytes_per_token / (gpu.hbm_bytes_s * p.stream_mbu)
    pairs = 32 * 1000 + 32 + 256 * 2256 - 0.5 * 256 * 256 + 128
    attn = max(s_pair * pairs, s_kv * (2256 + 32000 + 288))
    assert c.batch_time(256, 2256, 1, 32, 32000) == pytest.approx(c.linear_time(288) + attn, rel=1e-12)
    assert c.batch_time(256, 2256, 1, 32, 32000) > c.roofline.batch_time(256, 2256, 1, 32, 32000)
    # tensor parallel: the all-reduce of the profile model is added
    p2 = CALIBRATED_PRESETS["calibrated:llama-2-70b/2xa100"]
    c2 = make_latency("calibrated:llama-2-70b/2xa100")
    m70 = get_model("llama-2-70b")
    comm = 2 * 80 * (10e-6 + 2 * (2 - 1) / 2 * 64 * m70.hidden * 2 / 300e9)
    attn2 = m70.kv_bytes_per_token / (get_gpu("a100x2").hbm_bytes_s * p2.stream_mbu) * (64 * 100 + 64)
    assert c2.batch_time(0, 0, 0, 64, 6400) == pytest.approx(c2.linear_time(64) + attn2 + comm, rel=1e-12)


@given(n=st.integers(1, 10_000), ctx=st.lists(st.integers(0, 300_000), min_size=1, max_size=20),
       name=st.sampled_from(sorted(CALIBRATED_PRESETS)))
def test_calibrated_decode_times_bit_identical(n, ctx, name):
    m = make_latency(name)
    assert m.decode_times(n, np.array(ctx, dtype=np.float64)).tolist() == [m.batch_time(0, 0, 0, n, c) for c in ctx]


def test_fidelity_report_and_import(tmp_path: Path, vidur_dir: Path):
    res = run_fidelity([str(vidur_dir)], ["linear:d0=0.01,d1=0"], (1,), None, tmp_path / "fid", plots=False)
    (r,) = res["profiles"]
    assert r["tp"] == 1 and set(r["models"]) >= {GROUNDED, GROUNDED_LOO, FITTED, "linear:d0=0.01,d1=0.0",
                                                   "calibrated:llama-2-7b/a100", "roofline:llama-2-7b/a100"}
    lin = r["models"]["linear:d0=0.01,d1=0.0"]
    want = [0.01 / expected_seconds(1, 1) - 1, 0.01 / r_s - 1 if (r_s := res_sec(vidur_dir, 1)) else 0,
            0.01 / expected_seconds(512, 1) - 1, 0.01 / expected_seconds(4096, 1) - 1]
    assert lin["per_point"]["rel_err"] == pytest.approx(want, rel=1e-9)
    assert lin["mape"] == pytest.approx(np.mean(np.abs(want)), rel=1e-9)
    assert lin["worst_at"] == 4096 and lin["worst"] == pytest.approx(want[3])
    assert r["models"][FITTED]["mape"] == pytest.approx(fit_roofline(read_vidur_mlp(str(vidur_dir))[1]).mape)
    loo = loo_errors(read_vidur_mlp(str(vidur_dir))[1])
    assert r["models"][GROUNDED_LOO]["mape"] == pytest.approx(np.mean(np.abs(loo))) and len(loo) == 2
    assert r["models"][GROUNDED]["mape"] < 1e-12  # the constructed profile is already non-decreasing
    md = (tmp_path / "fid" / "fidelity.md").read_text()
    assert "| `linear:d0=0.01,d1=0.0` | 4 |" in md
    assert json.loads((tmp_path / "fid" / "fidelity.json").read_text())["profiles"][0]["label"] == r["label"]
    # import: the table reproduces the profile model at its rows
    out = import_profile(str(vidur_dir), tmp_path / "t.csv")
    table, model = TableLatency.from_csv(out), make_latency(f"profile:{vidur_dir}")
    assert table.batch_time(512, 512, 1, 0, 0) == model.batch_time(512, 512, 1, 0, 0)
    assert table.batch_time(0, 0, 0, 32, 32 * 1024) == model.batch_time(0, 0, 0, 32, 32 * 1024)


def res_sec(d: Path, tp: int) -> float:
    """Measured seconds at 64 tokens of the constructed profile (the averaged duplicate)."""
    return (expected_seconds(64, tp) + expected_seconds(64, tp, 1.1)) / 2


def test_fidelity_scores_measured_iterations(tmp_path: Path, capsys):
    log = tmp_path / "replay.csv"
    log.write_text("iteration,prefill_tokens,prefill_ctx_tokens,n_prefill,n_decode,decode_ctx_tokens,"
                   "measured_0_s,measured_1_s\n0,100,100,1,0,0,0.02,0.03\n1,0,0,0,4,400,0.01,0.01\n2,0,0,0,0,0,0,0\n")
    res = run_fidelity(None, ["linear:d0=0.01,d1=0.0001"], replay=[str(log)], out=None)
    s = res["iteration_logs"][0]["models"]["linear:d0=0.01,d1=0.0001"]
    # predictions 0.01 + 1e-4 * 100 = 0.02 vs 0.025, and 0.01 + 1e-4 * 404 = 0.0504 vs 0.01
    assert s["per_point"]["rel_err"] == pytest.approx([0.02 / 0.025 - 1, 0.0504 / 0.01 - 1])
    assert s["worst_iteration"] == 1 and s["makespan_rel_err"] == pytest.approx(0.0704 / 0.035 - 1)
    assert main(["fidelity", "--replay", str(log), "--latency", "linear", "--out", str(tmp_path / "f")]) == 0
    assert main(["fidelity", "--tp", "x", "--out", str(tmp_path / "f")]) == 2
    bad = tmp_path / "bad.csv"
    bad.write_text("prefill_tokens,n_decode\n1,1\n")
    assert main(["fidelity", "--replay", str(bad), "--out", str(tmp_path / "f")]) == 2
    assert "missing 'prefill_ctx_tokens'" in capsys.readouterr().err


# --- against the shared measurements (skipped when ../shared/profiles is absent) ---------------


@pytest.fixture
def shared_profiles(monkeypatch) -> None:
    if not PROFILES.is_dir():
        pytest.skip("../shared/profiles is absent")
    monkeypatch.setattr(data, "shared_roots", lambda: [PROFILES.parent])


@pytest.mark.parametrize(("name", "tps"), SHARED)
def test_grounded_linear_part_within_5_percent(shared_profiles, name: str, tps: tuple[int, ...]):
    """The issue's bar: the grounded model's linear part within 5% MAPE over 1 to 8,192 tokens
    at the measured points and leave-one-out (each point predicted from its neighbours); the
    roofline fitted to the same profile is stated next to it in ``llmsched fidelity``."""
    for tp in tps:
        m = make_latency(f"{name},tp={tp}")
        p = m.profile
        model = np.array([m.linear_time(float(n)) for n in p.tokens])
        assert np.all(np.diff(model) >= 0) and model.tolist() == monotone(p.seconds).tolist()
        # past the largest measured batch it keeps growing at the upper half's slope
        top = p.tokens[-1]
        assert m.linear_time(2 * top) - model[-1] == pytest.approx(
            top * (model[-1] - m.linear_time(top / 2)) / (top / 2), rel=0.05)
        assert np.mean(np.abs(model / p.seconds - 1)) <= 0.05, (name, tp)
        assert np.mean(np.abs(loo_errors(p))) <= 0.05, (name, tp)
        assert fit_roofline(p).mape <= 0.07, (name, tp)


def test_calibrated_presets_refit_from_the_profiles(shared_profiles):
    for name, p in CALIBRATED_PRESETS.items():
        prof = read_vidur_mlp(str(find_profile(p.profile)))[p.tp]
        assert prof.stream_mbu == pytest.approx(p.stream_mbu, abs=1e-4), name
        fit = fit_roofline(prof)
        assert fit.mfu == pytest.approx(p.mfu, abs=1e-3) and fit.mbu == pytest.approx(p.mbu, abs=1e-3), name
        assert fit.overhead_s == pytest.approx(p.overhead_s, abs=1e-5) and fit.mape == pytest.approx(p.mape, abs=5e-4)
        assert fit.worst == pytest.approx(p.worst, abs=2e-3) and fit.worst_tokens == p.worst_tokens


MIXED = [(q, q + ctx, 1, nd, nd * c) for q in (64, 256, 512, 1024, 2048) for ctx in (0, 2000, 8000)
         for nd in (1, 8, 32, 128) for c in (128, 1000, 4000)]
"""Mixed batches: a prefill chunk (64 to 2,048 tokens, after 0 to 8,000 of context) with 1 to 128
decodes of 128 to 4,000 tokens of context each."""


@pytest.mark.parametrize("name", [k for k, p in CALIBRATED_PRESETS.items() if not p.note])
def test_calibrated_agrees_with_the_profile_model_on_mixed_batches(shared_profiles, name: str):
    """The offline stand-in within 10% of the profile model it stands in for, on average over
    mixed batches (2.4-7.4% on Vidur's six profiles; single batches differ by up to 26%, where
    the measured linear part steps between kernel tiles and the fitted roofline is smooth)."""
    p = CALIBRATED_PRESETS[name]
    c, v = make_latency(name), make_latency(p.profile + (f",tp={p.tp}" if p.tp > 1 else ""))
    assert isinstance(v, ProfileLatency)
    err = np.array([c.batch_time(*s) / v.batch_time(*s) - 1.0 for s in MIXED])
    assert np.mean(np.abs(err)) <= 0.10, (name, np.mean(np.abs(err)))
    assert np.max(np.abs(err)) <= 0.30, (name, np.max(np.abs(err)))
