"""Sheng et al. 2024 ("Fairness in Serving Large Language Models", VTC) reproduction: the
Table 2 analogue on the 27-client arena trace (``vtc-arena``; section 5.3), linear cost
``w_p = 1, w_q = 2``, per-tick Max/Avg/Var service difference and (in + out) throughput from
:mod:`llmsched_gym.core.fairness`, with the paper's table beside it.

Departure: the batch-time model is the affine fit to Sheng et al.'s A10G profile in our engine, not S-LoRA on an A10G,
so absolute throughputs and differences are compared as orderings (VTC fairer than FCFS/LCF at
equal throughput; RPM(5) fairest but much slower), not as numbers. FCFS is the paper's: FCFS order
on the same admission loop as VTC (``rpm`` with no limit), not the preempting ``fcfs`` policy.
Tables 3-6 (profiled cost, overloaded synthetic clients) follow the table rows of Table 2.
"""

from __future__ import annotations

from typing import Any

from llmsched_gym.core.scenarios import get_scenario
from llmsched_gym.reproduce.report import (
    PaperReport,
    Plot,
    Row,
    missing_policies,
    not_comparable,
    ordering_verdict,
)
from llmsched_gym.sim import simulate

TABLE2: dict[str, tuple[float, float, float, float]] = {
    "FCFS": (759.97, 433.53, 32112.00, 777), "LCF": (750.49, 323.82, 29088.90, 778),
    "VTC": (368.40, 251.66, 6549.16, 779), "VTC(predict)": (365.47, 240.33, 5321.62, 773),
    "VTC(oracle)": (329.46, 227.51, 4475.76, 781), "RPM(5)": (143.86, 83.58, 1020.46, 340),
    "RPM(20)": (446.76, 195.71, 7449.79, 694), "RPM(30)": (693.66, 309.45, 24221.31, 747),
}
"""The paper's Table 2: Max Diff, Avg Diff, Diff Var, throughput (in + out tokens/s)."""

TABLE3: dict[str, tuple[float, float, float, float]] = {
    "FCFS": (743.23, 457.29, 26645.42, 777), "LCF": (709.35, 384.78, 23299.20, 778),
    "VTC": (707.35, 368.74, 21918.67, 780), "VTC(predict)": (617.22, 337.05, 11803.41, 778),
    "VTC(oracle)": (387.43, 277.18, 4541.57, 783), "RPM(5)": (230.78, 151.00, 823.15, 340),
    "RPM(20)": (445.34, 270.51, 5938.52, 694), "RPM(30)": (801.16, 377.22, 25980.39, 747),
}
"""Table 3: the real trace with the profiled cost ``h`` (counters and differences)."""

PROFILED = "profiled-artifact"
"""The profiled ``h`` of Tables 3-4: the artifact's coefficients (the paper's printed ones / 10), whose
scale matches the tables' values (the printed ones give differences about 10x larger)."""

LOAD_SCALE = 1.08
"""Tables 4-6 rates are multiplied by this: our A10G fit serves about 967 tokens/s of 256/256
requests where the paper's runs served 893 (Table 5), so the same load keeps the lighter client
backlogged through the 600 s of ticks, as in the paper (unscaled, it runs dry near 570 s and the
last tick's difference dominates Max Diff)."""

SYNTHETIC: dict[str, tuple[str, list[float], str, dict[str, tuple[float, float, float, float]]]] = {
    "Table 4": ("2 overloaded clients (90/180 rpm), profiled h", [90.0, 180.0], "profiled-artifact",
                {"FCFS": (323.18, 317.13, 15.98, 876), "VTC": (137.27, 74.87, 2819.40, 900),
                 "VTC(oracle)": (4.28, 0.34, 0.91, 893)}),
    "Table 5": ("2 overloaded clients (90/180 rpm), linear cost", [90.0, 180.0], "linear",
                {"VTC": (192.88, 103.77, 6981.24, 893), "VTC(+-50%)": (33.98, 12.54, 111.94, 904),
                 "VTC(oracle)": (5.87, 0.51, 1.71, 895)}),
    "Table 6": ("8 overloaded clients (24 x 3, 36 x 5 rpm), linear cost", [24.0] * 3 + [36.0] * 5, "linear",
                {"VTC": (322.16, 162.20, 5151.49, 875), "VTC(+-50%)": (99.43, 66.32, 487.10, 875),
                 "VTC(oracle)": (43.23, 36.34, 56.52, 875)}),
}
"""Tables 4-6: (workload, per-client rpm, cost, {scheduler: Max/Avg/Var diff, throughput})."""

POLICIES: dict[str, tuple[str, dict[str, Any]]] = {
    "FCFS": ("rpm", {"limit": 0}), "LCF": ("lcf", {}), "VTC": ("vtc", {}), "VTC(predict)": ("vtc-predict", {}),
    "VTC(oracle)": ("vtc-oracle", {}), "RPM(5)": ("rpm", {"limit": 5}), "RPM(20)": ("rpm", {"limit": 20}),
    "RPM(30)": ("rpm", {"limit": 30}), "VTC(+-50%)": ("vtc-predict", {"predictor": "noisy", "noise": 0.5}),
}
"""FCFS is ``rpm`` without a limit: the paper's FCFS on the same LightLLM admission loop as VTC
(reservation check, admission every K = 10 steps); the plain ``fcfs`` policy admits on a fit check
and preempts, which S-LoRA's FCFS never does."""
COUNTER_POLICIES = ("lcf", "vtc", "vtc-predict", "vtc-oracle")
"""Policies whose decisions depend on the cost function (the others are rerun only for Table 2)."""


def overload_scenario(rates_rpm: list[float]) -> dict[str, Any]:
    """The artifact's ``overload`` family: uniformly spaced arrivals per client (``rates_rpm`` times
    :data:`LOAD_SCALE`) for 6 minutes, 256/256 tokens, on the ``vtc-arena`` engine (A10G fit,
    10,000-token pool)."""
    spec = get_scenario("vtc-arena")
    spec["name"] = "vtc-overload"
    spec["workload"] = {"clients": [{"arrival": {"type": "deterministic", "rate": LOAD_SCALE * r / 60.0}}
                                    for r in rates_rpm],
                        "horizon_s": 360.0, "prompt": 256, "output": 256}
    return spec


def _table_verdict(ours: tuple[float, ...], paper: tuple[float, ...]) -> str:
    """Max and Avg Diff within 20% and throughput within 10% of the paper's (Var is too noisy)."""
    ok = all(abs(o - p) <= tol * p for o, p, tol in zip(ours, paper, (0.2, 0.2, float("inf"), 0.1), strict=True))
    return "reproduced" if ok else "not reproduced (our batch-time model and engine; see the orderings)"


def _diffs(r: Any, cost: str) -> tuple[float, float, float, float]:
    from llmsched_gym.core.fairness import fairness_report, make_cost

    f = fairness_report(r, cost=make_cost(cost))
    t = f["tick_diff"]
    return t["max"], t["avg"], t["var"], f["throughput_in_out_tokens_per_s"]


def _numbers(x: tuple[float, ...], digits: str = ".4g") -> str:
    return " / ".join(format(v, digits) for v in x)


def table3_rows(runs: dict[str, Any]) -> list[Row]:
    """Table 3: the real trace with the profiled cost h; the counter policies are rerun charging h,
    FCFS and RPM (cost-blind) reuse their Table 2 runs; differences measured in h."""
    rows: list[Row] = []
    ours: dict[str, tuple[float, float, float, float]] = {}
    for label, paper in TABLE3.items():
        policy, params = POLICIES[label]
        if label not in runs:
            continue
        r = simulate("vtc-arena", {"name": policy, **params, "cost": PROFILED}, 0) \
            if policy in COUNTER_POLICIES else runs[label]
        ours[label] = _diffs(r, PROFILED)
        rows.append(Row(f"Table 3 {label} (profiled h): Max/Avg/Var diff, throughput", _numbers(paper, "g"),
                        _numbers(ours[label]), _table_verdict(ours[label], paper)))
    if {"VTC", "VTC(predict)", "VTC(oracle)"} <= set(ours):
        v, p, o = (ours[k][0] for k in ("VTC", "VTC(predict)", "VTC(oracle)"))
        rows.append(Row("Table 3: length information helps under h: Max Diff VTC(oracle) < VTC(predict) < VTC",
                        "387 < 617 < 707", f"{o:.4g} < {p:.4g} < {v:.4g}", ordering_verdict(o < p < v)))
    return rows


def synthetic_rows(table: str, what: str, rates: list[float], cost: str,
                   paper_rows: dict[str, tuple[float, float, float, float]]) -> list[Row]:
    """Tables 4-6: the overloaded ``overload`` workloads, FCFS / VTC / VTC(+-50%) / VTC(oracle)."""
    spec = overload_scenario(rates)
    rows: list[Row] = []
    ours: dict[str, tuple[float, float, float, float]] = {}
    for label, paper in paper_rows.items():
        policy, params = POLICIES[label]
        if missing_policies([policy]):
            rows.append(Row(f"{table} {label}", _numbers(paper, "g"), "-",
                            not_comparable(f"policy {policy} not available")))
            continue
        extra = {"cost": cost} if policy in COUNTER_POLICIES else {}
        ours[label] = _diffs(simulate(spec, {"name": policy, **params, **extra}, 0), cost)
        rows.append(Row(f"{table} {label} ({what}): Max/Avg/Var diff, throughput", _numbers(paper, "g"),
                        _numbers(ours[label]), _table_verdict(ours[label], paper)))
    labels = list(paper_rows)  # the paper's order: least to most length information
    if set(labels) <= set(ours):
        mx = [ours[k][0] for k in labels]
        rows.append(Row(f"{table}: Max Diff falls with more length information ({' > '.join(labels)})",
                        " > ".join(f"{paper_rows[k][0]:g}" for k in labels),
                        " > ".join(f"{x:.4g}" for x in mx),
                        ordering_verdict(all(a > b for a, b in zip(mx, mx[1:], strict=False)))))
    return rows


def run(quick: bool = False) -> PaperReport:
    from llmsched_gym.core.fairness import fairness_report

    ours: dict[str, tuple[float, float, float, float]] = {}
    rows: list[Row] = []
    curves: dict[str, tuple[list[float], list[float]]] = {}
    runs: dict[str, Any] = {}
    for label, paper in TABLE2.items():
        policy, params = POLICIES[label]
        if missing_policies([policy]):
            rows.append(Row(f"Table 2 {label}: Max/Avg/Var diff, throughput", " / ".join(f"{x:g}" for x in paper),
                            "-", not_comparable(f"policy {policy} not available")))
            continue
        r = runs[label] = simulate("vtc-arena", {"name": policy, **params}, 0)
        f = fairness_report(r)
        t = f["tick_diff"]
        ours[label] = (t["max"], t["avg"], t["var"], f["throughput_in_out_tokens_per_s"])
        rows.append(Row(f"Table 2 {label}: Max/Avg/Var diff, throughput", " / ".join(f"{x:g}" for x in paper),
                        " / ".join(f"{x:.4g}" for x in ours[label]),
                        _table_verdict(ours[label], paper)))
        gap = f["service_over_time"]
        per = gap["per_client"]
        curves[label] = (gap["t_s"], [max(c[i] for c in per) - min(c[i] for c in per) for i in range(len(gap["t_s"]))])

    def order(name: str, claim: str, paper: str, ok: Any, txt: str) -> None:
        rows.append(Row(claim, paper, txt, ordering_verdict(bool(ok))))

    if {"FCFS", "VTC", "LCF"} <= set(ours):
        order("vtc", "VTC has a smaller Max Diff than FCFS and LCF", "368 < 750, 760",
              ours["VTC"][0] < min(ours["FCFS"][0], ours["LCF"][0]),
              f"{ours['VTC'][0]:.4g} vs FCFS {ours['FCFS'][0]:.4g}, LCF {ours['LCF'][0]:.4g}")
        order("vtc", "VTC has a smaller Avg Diff than FCFS", "252 < 434", ours["VTC"][1] < ours["FCFS"][1],
              f"{ours['VTC'][1]:.4g} vs {ours['FCFS'][1]:.4g}")
        order("vtc", "VTC's throughput is within 2% of FCFS's (work conserving)", "779 vs 777",
              abs(ours["VTC"][3] - ours["FCFS"][3]) <= 0.02 * ours["FCFS"][3],
              f"{ours['VTC'][3]:.4g} vs {ours['FCFS'][3]:.4g}")
    if {"RPM(5)", "VTC"} <= set(ours):
        order("rpm", "RPM(5) is fairest but loses throughput (about 340 vs 779)", "340 / 779 = 0.44",
              ours["RPM(5)"][0] < ours["VTC"][0] and ours["RPM(5)"][3] < 0.8 * ours["VTC"][3],
              f"Max Diff {ours['RPM(5)'][0]:.4g}; throughput ratio {ours['RPM(5)'][3] / ours['VTC'][3]:.3g}")
    if {"RPM(5)", "RPM(20)", "RPM(30)"} <= set(ours):
        order("rpm", "RPM throughput rises with the limit (340 -> 694 -> 747)", "increasing",
              ours["RPM(5)"][3] < ours["RPM(20)"][3] <= ours["RPM(30)"][3] * 1.001,
              " -> ".join(f"{ours[k][3]:.4g}" for k in ("RPM(5)", "RPM(20)", "RPM(30)")))
    if {"VTC(oracle)", "VTC"} <= set(ours):
        order("oracle", "VTC(oracle) has a smaller Max Diff than VTC", "329 < 368",
              ours["VTC(oracle)"][0] < ours["VTC"][0], f"{ours['VTC(oracle)'][0]:.4g} vs {ours['VTC'][0]:.4g}")
    rows += table3_rows(runs)
    for table, (what, rates, cost, paper_rows) in SYNTHETIC.items():
        rows += synthetic_rows(table, what, rates, cost, paper_rows)
    plots = [Plot("accumulated_gap", "Max - min accumulated client service (linear cost)", "time (s)",
                  "service gap (cost units)", curves)] if curves else []
    from llmsched_gym.data import synthetic_note

    tag = next((synthetic_note(r.summary.get("workload_source")) for r in runs.values()), "")
    return PaperReport("vtc", f"VTC (Sheng et al. 2024){tag}", rows, plots,
                       notes=["The vtc-arena trace is small (1,500 requests) and the overload workloads are 6 "
                              "minutes of arrivals, so quick and full runs are identical.",
                              "Diff values: the artifact's per-tick definition (llmsched_gym.core.fairness), in the "
                              "cost the table uses (linear w_p = 1, w_q = 2, or the paper's profiled h).",
                              "Tables 4-6 run the artifact's overload workloads (uniform arrivals, 256/256 tokens, "
                              f"6 minutes, rates x {LOAD_SCALE} to keep the paper's load on our faster fit) on the "
                              "vtc-arena engine; VTC(+-50%) is vtc-predict with the noisy predictor (true length x "
                              "U(0.5, 1.5), App. B.3).",
                              "Profiled h (Tables 3-4): the artifact's coefficients, the paper's printed ones / 10; "
                              "the tables' values are on that scale."],
                       config="vtc-arena (Tables 2-3) and the overload workloads (Tables 4-6), seed 0")
