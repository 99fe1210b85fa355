"""``llmsched reproduce PAPER [--quick] [--out DIR]`` and ``llmsched optimum --scenario S``.

``reproduce`` runs one paper's experiments (``llmsched_gym/reproduce/PAPER.py``; Jaillet et al.
2025's sweep is ``jaillet.run_sweep``, adapted here with the optimum rows, the Thm 6.2 instances and a
calibrated low demand) and writes ``runs/reproduce/PAPER/report.md`` with plots. ``optimum`` builds a round-mode instance from a scenario's workload (arrival round
``floor(arrival_s / round_s)``, true output lengths, ``M = engine.kv_capacity_tokens``) and
solves the hindsight optimum of Jaillet et al. 2025 (Appendix B.1), optionally next to a policy's run.
"""

from __future__ import annotations

import argparse
import importlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llmsched_gym.config import ConfigError
from llmsched_gym.parallel import Settings, configured, settings_from
from llmsched_gym.parallel import add_arguments as add_parallel_arguments
from llmsched_gym.reproduce import PAPERS
from llmsched_gym.reproduce.report import (
    PaperReport,
    Plot,
    Row,
    fmt,
    missing_policies,
    not_comparable,
    ordering_verdict,
    policy_vs_optimum,
    within,
    write_report,
)

# --- Jaillet et al. 2025 adapter ------------------------------------------------------------------------


def ip_vs_exhaustive(n_instances: int, seed: int = 0) -> tuple[int, int]:
    """(agreements, instances): the IP's TEL equals exhaustive search on random tiny instances."""
    from llmsched_gym.optimum import Instance, solve_exhaustive, solve_ip

    rng = np.random.default_rng(seed)
    agree = 0
    for _ in range(n_instances):
        n = int(rng.integers(2, 6))
        inst = Instance(arrival=np.sort(rng.integers(0, 5, n)), prompt=rng.integers(1, 4, n),
                        output=rng.integers(1, 6, n), M=int(rng.integers(9, 16)))
        agree += solve_ip(inst).tel == solve_exhaustive(inst).tel
    return agree, n_instances


def mcsf_ratios(n_instances: int, n: int = 8, seed: int = 0) -> list[float]:
    """MC-SF's TEL / OPT on random small online instances (Poisson-like arrivals, M = 20)."""
    from llmsched_gym.optimum import Instance

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_instances):
        inst = Instance(arrival=np.sort(rng.integers(0, 2 * n, n)), prompt=rng.integers(1, 5, n),
                        output=rng.integers(1, 9, n), M=20)
        out.append(policy_vs_optimum(inst, "mcsf")["ratio_to_opt"])
    return out


def adversarial_mcsf_ratios(eps: float, Ms: list[int]) -> list[float]:
    """MC-SF's TEL (engine, round mode) over the TEL of Thm 6.2's offline strategy A3 on the
    :func:`~llmsched_gym.optimum.adversarial_deterministic` instance for each ``M`` (MC-SF starts
    the lone long request at round 0, so the adversary's ``t' = 0``). A3's TEL bounds OPT above,
    so each value is a lower bound on MC-SF's ratio to the optimum."""
    from llmsched_gym.optimum import adversarial_deterministic, adversarial_wait_schedule, total_latency
    from llmsched_gym.reproduce.report import paper_tel, round_mode_scenario
    from llmsched_gym.sim import simulate

    out = []
    for M in Ms:
        inst = adversarial_deterministic(M, eps)
        tel = paper_tel(simulate(round_mode_scenario(inst), "mcsf", 0).summary)
        out.append(tel / total_latency(inst, adversarial_wait_schedule(inst)))
    return out


@dataclass(frozen=True)
class Demand:
    """One Figure 5 demand level as the report runs it."""

    label: str
    rate: float
    paper_ratio: str  # the paper's best-benchmark / MC-SF slope statement
    paper_slopes: str
    paper_alpha: float  # smallest loop-free alpha
    best_alpha: tuple[float, float]  # the alpha range the alpha sweep finds best (Figs 9/12)
    good_beta: tuple[float, float]  # the beta range that performs well (Figs 10/13)
    note: str = ""


DEMANDS = (
    Demand("high", 50.0, "about 3x", "MC-SF ~1/6, best benchmark ~1/2", 0.21, (0.15, 0.25), (0.05, 0.25)),
    Demand("low", 10.0, "at least 8x", "MC-SF ~1/800, best benchmark ~1/100", 0.24, (0.10, 0.25), (0.05, 0.20),
           "the paper's rate; under our batch times nothing is overloaded here"),
    Demand("low, calibrated", 20.0, "at least 8x", "MC-SF ~1/800, best benchmark ~1/100", 0.24, (0.10, 0.25),
           (0.05, 0.20), "our analogue of the paper's low demand: the rate at which our MC-SF's slope is about "
           "the paper's 1/800 s per arrival (a scan with seed 0 and N = 2000, 6000, 10000 gave 3.8e-4 at lambda = "
           "15, 8.5e-4 at 20, 3.5e-3 at 30; 9.0e-4 at 20 with the plain roofline batch times it was first chosen "
           "under), i.e. MC-SF near-stable with the memory near its limit; only the rate "
           "is calibrated, on MC-SF alone, so the benchmark slopes and the ratio remain a test"),
)
"""Jaillet et al. 2025's two demand levels, plus the calibrated low demand (see the report's notes)."""


def _ratio_verdict(d: Demand, ratio: float, mcsf_slope: float, bench_slope: float) -> str:
    if mcsf_slope <= 0 or bench_slope <= 0 or mcsf_slope < 1e-4 * bench_slope:
        return not_comparable("latency does not grow with N at this rate under our batch times (slopes <= 0 or "
                              "MC-SF's negligible): the system is not overloaded, so the slope ratio is "
                              "meaningless; see the calibrated low demand")
    if d.paper_ratio.startswith("at least"):
        return ordering_verdict(ratio >= 8.0) + ("" if ratio >= 8.0 or ratio < 7.2 else
                                                 f": {100 * (1 - ratio / 8):.0f}% short of 8x")
    return within(ratio, 3.0, 0.34)


def _lat(x: float) -> str:
    return "loops" if math.isinf(x) else fmt(x)


def _sweep_rows(d: Demand, sw: dict[str, Any]) -> list[Row]:
    rows = []
    best = {b: min(v, key=v.get) for b, v in sw["alpha"].items()}
    lo, hi = d.best_alpha
    rows.append(Row(f"{d.label} demand (Fig. {'9' if d.rate == 50 else '12'}): alpha in [{lo}, {hi}] gives the "
                    "lowest latency at beta = 0.1 and 0.2", f"[{lo}, {hi}]",
                    "; ".join(f"beta = {b}: best alpha {a} ({', '.join(f'{x}: {_lat(y)}' for x, y in sw['alpha'][b].items())} s)"
                              for b, a in best.items()),
                    ordering_verdict(all(lo <= a <= hi for a in best.values()))))
    drop = {b: v[0.05] / min(x for a, x in v.items() if a >= 0.1) for b, v in sw["alpha"].items()}
    rows.append(Row(f"{d.label} demand: alpha < 0.1 degrades sharply (alpha = 0.05 over the best alpha >= 0.1)",
                    "sharp drop (no number)", ", ".join(f"beta = {b}: " + ("loops" if math.isinf(r) else f"{fmt(r)}x") for b, r in drop.items()),
                    ordering_verdict(all(r > 1.1 for r in drop.values()))))
    lo, hi = d.good_beta
    spread = {a: max(y for b, y in v.items() if lo <= b <= hi) / min(v.values()) for a, v in sw["beta"].items()}
    rows.append(Row(f"{d.label} demand (Fig. {'10' if d.rate == 50 else '13'}): beta in [{lo}, {hi}] performs "
                    "well (worst within 10% of the best beta) at alpha = 0.1 and 0.2", f"[{lo}, {hi}]",
                    "; ".join(f"alpha = {a}: worst / best {fmt(r)} ({', '.join(f'{x}: {_lat(y)}' for x, y in sw['beta'][a].items())} s)"
                              for a, r in spread.items()),
                    ordering_verdict(all(r <= 1.1 for r in spread.values()))))
    return rows


def run_jaillet(quick: bool = False) -> PaperReport:
    """Jaillet et al. 2025: Figure 5 slopes and ratios, smallest loop-free alpha, alpha/beta sweeps,
    optimum references and the Thm 6.2 instances."""
    from llmsched_gym.core.scenarios import get_scenario
    from llmsched_gym.optimum import adversarial_ratio_lower_bound

    rows: list[Row] = []
    plots: list[Plot] = []
    notes = [f"The batch times are {get_scenario('jaillet-high')['latency']} (Llama-2-70B on 2xA100: our "
             "offline stand-in of the profile model built on Vidur's A100 measurements at TP 2, where the paper ran "
             "Vidur itself), and the lengths are lognormal fits of the LMSYS mean/median, so absolute slopes differ (and the paper's own "
             "1/6 s per arrival contradicts its 200 s claim, erratum E6): the slope ratios and orderings are "
             "compared."]
    missing = missing_policies(["mcsf", "alpha-greedy", "alpha-beta"])
    jaillet = None
    if not missing:
        try:
            jaillet = importlib.import_module("llmsched_gym.reproduce.jaillet")
        except ImportError:
            missing = ["llmsched_gym.reproduce.jaillet"]
    n_values = [1000, 2000, 3000] if quick else [1000, 2000, 4000, 6000, 8000, 10000]
    seeds = [0] if quick else [0, 1, 2]
    for d in DEMANDS:
        if d.note:
            notes.append(f"{d.label} demand (lambda = {d.rate:g}): {d.note}.")
        if jaillet is None:
            reason = not_comparable(f"policy {missing[0]} not available")
            rows.append(Row(f"{d.label} demand: best benchmark slope / MC-SF slope", d.paper_ratio, "-", reason))
            continue
        sw = jaillet.run_sweep(d.rate, n_values, seeds, quick=quick)
        ratio = sw["slope_ratio_best_benchmark_to_mcsf"]
        pol = sw["policies"]
        mcsf_slope = pol["mcsf"]["slope"]
        best = sw["best_benchmark"]
        slopes = ", ".join(f"{k} {v['slope']:.3g}" for k, v in pol.items())
        verdict = _ratio_verdict(d, ratio, mcsf_slope, pol[best]["slope"] if best else 0.0)
        overloaded = not verdict.startswith("not comparable")
        rows.append(Row(f"{d.label} demand (lambda = {d.rate:g}): best benchmark slope / MC-SF slope (Fig. 5)",
                        f"{d.paper_ratio} ({d.paper_slopes} s/arrival)",
                        f"{ratio:.3g} (best {best}; slopes s/arrival: {slopes})", verdict))
        rows.append(Row(f"{d.label} demand: MC-SF has the smallest latency slope", "ordering",
                        f"MC-SF {mcsf_slope:.3g} vs best benchmark {pol[best]['slope'] if best else float('nan'):.3g}",
                        ordering_verdict(all(mcsf_slope <= v["slope"] for v in pol.values())) if overloaded else
                        not_comparable("not overloaded: every slope is about 0")))
        last = pol["mcsf"]["runs"][-1]
        peak = max(r["kv_peak_frac"] for r in last)
        mean = float(np.mean([r["kv_mean_frac"] for r in last]))
        rows.append(Row(f"{d.label} demand: MC-SF's memory stays within M (Fig. {'8' if d.rate == 50 else '11'})"
                        + ("" if d.rate == 50 else ", near the limit most of the time"),
                        "<= M" + ("" if d.rate == 50 else ", near M"),
                        f"peak {peak:.3f} M, time-average {mean:.2f} M (N = {n_values[-1]})",
                        ordering_verdict(peak <= 1.0) if d.rate == 50 else
                        ordering_verdict(peak <= 1.0 and mean >= 0.5)
                        + ("" if mean >= 0.5 or overloaded else
                           ": the memory is mostly idle because this rate does not overload our batch times")))
        if d.rate != 50:
            rows.append(Row(f"{d.label} demand: best benchmarks are (alpha = 0.2, beta = 0.2) and (0.2, 0.1)",
                            "(0.2, 0.2), (0.2, 0.1)", f"best {best}",
                            ordering_verdict(best in ("alpha=0.2,beta=0.2", "alpha=0.2,beta=0.1")) if overloaded
                            else not_comparable("not overloaded: every slope is about 0")))
        plots.append(Plot(f"fig5_{d.label.replace(', ', '_')}", f"Fig. 5 analogue, lambda = {d.rate:g}",
                          "N (arrivals)", "mean E2E latency (s)",
                          {k: (n_values, v["mean_e2e_s"]) for k, v in pol.items()}))
        scan = sw["loop_scan"]
        if scan is None:
            rows.append(Row(f"{d.label} demand: smallest loop-free alpha (alpha-greedy)", fmt(d.paper_alpha), "-",
                            not_comparable("loop scan runs only in the full version")))
        else:
            a = scan["smallest_loop_free_alpha"]
            looping = scan["looping"]
            verdict = (not_comparable("no alpha loops at this rate (the memory never fills), so there is no "
                                      "threshold to compare") if not looping else
                       ordering_verdict(a is not None and abs(a - d.paper_alpha) <= 0.03)
                       + ("" if a is not None and abs(a - d.paper_alpha) <= 0.03 else
                          ": where clear-all starts to loop depends on how close the protected admissions fill "
                          "M, i.e. on the length distribution and batch timing, which are ours"))
            rows.append(Row(f"{d.label} demand: smallest loop-free alpha (alpha-greedy, grid 0.01, N = {scan['n_requests']})",
                            fmt(d.paper_alpha), f"{a} (looping: {looping[0]}..{looping[-1]})" if looping else f"{a}",
                            verdict))
        if not quick and d.rate != 10.0:
            rows += _sweep_rows(d, jaillet.param_sweeps(d.rate, n_values[-1], seeds[0]))
    agree, total = ip_vs_exhaustive(10 if quick else 50)
    rows.append(Row("IP (Appendix B.1, linearised) equals exhaustive search on random tiny instances", "exact (ours)",
                    f"{agree}/{total}", ordering_verdict(agree == total)))
    if missing_policies(["mcsf"]):
        rows.append(Row("MC-SF ratio to the hindsight optimum", "about 1.005-1.05 (later versions)", "-",
                        not_comparable("policy mcsf not available")))
    else:
        r = mcsf_ratios(10 if quick else 60)
        rows.append(Row("MC-SF TEL / OPT on random small online instances (n = 8, M = 20; exact OPT by the IP)",
                        "about 1.047 online, 1.005 all-at-once (later versions, not this seed)",
                        f"mean {np.mean(r):.4f}, max {np.max(r):.4f}, min {np.min(r):.4f} over {len(r)} instances",
                        not_comparable("the later version's instances are larger (not solvable exactly here); ours "
                                       "are random tiny ones") if np.mean(r) > 1.05 else
                        ordering_verdict(min(r) >= 1)))
        eps, Ms = 0.1, [160, 320, 640, 1280, 2560]
        ar = adversarial_mcsf_ratios(eps, Ms)
        lbs = [adversarial_ratio_lower_bound(M, eps) for M in Ms]
        rows.append(Row(f"Thm 6.2 instances (eps = {eps}): MC-SF's ratio grows with M towards 1/eps "
                        "(ours: MC-SF TEL / TEL of the offline strategy A3, a lower bound on its ratio to OPT)",
                        "CR >= min(A1, A2) / A3 -> 1/eps = 10; " + ", ".join(f"{b:.3g}" for b in lbs),
                        ", ".join(f"M={M}: {x:.3g}" for M, x in zip(Ms, ar, strict=True)),
                        ordering_verdict(all(x < y for x, y in zip(ar, ar[1:], strict=False))
                                         and all(x >= b for x, b in zip(ar, lbs, strict=True)))))
    eps = 0.1
    big = (100, 1000, 10000, 100000)
    lbs = [adversarial_ratio_lower_bound(M, eps) for M in big]
    rows.append(Row(f"Thm 6.2: the bound min(A1, A2) / A3 itself grows to 1/eps (eps = {eps})", "-> 10",
                    ", ".join(f"M={M}: {b:.3g}" for M, b in zip(big, lbs, strict=True)),
                    ordering_verdict(all(x < y for x, y in zip(lbs, lbs[1:], strict=False)) and lbs[-1] > 9)))
    return PaperReport("jaillet", "MC-SF (Jaillet et al. 2025)", rows, plots, notes,
                       config=f"jaillet-high / jaillet-low (and lambda = 20), N = {n_values}, seeds {seeds}"
                       + ("" if quick else f"; alpha/beta sweeps at N = {n_values[-1]}, seed {seeds[0]}"))


# --- commands -------------------------------------------------------------------------------------


def run_paper(paper: str, quick: bool, out: str | Path | None = None, settings: Settings | None = None) -> Path:
    """Run one paper's reproduction and write its report; returns the report path. ``settings``
    (jobs, backend) run its sweeps in parallel where the paper's module has them as one
    (:func:`llmsched_gym.reproduce.jaillet.run_many`); the report is the same."""
    if paper not in PAPERS:
        raise ConfigError(f"reproduce: unknown paper {paper!r}; allowed: {', '.join(PAPERS)}")
    t0 = time.perf_counter()
    with configured(settings or Settings()):
        if paper == "jaillet":
            report = run_jaillet(quick)
        else:
            report = importlib.import_module(f"llmsched_gym.reproduce.{paper}").run(quick)
    elapsed = time.perf_counter() - t0
    path = write_report(report, Path(out) if out else Path("runs/reproduce") / paper, elapsed, quick)
    # the report's title names the paper and, when a trace was missing, its synthetic stand-in
    print(f"{paper} ({report.title}): {sum(r.verdict == 'reproduced' for r in report.rows)}/{len(report.rows)} "
          "rows reproduced; "
          f"took {elapsed:.1f} s; report: {path}")
    return path


def cmd_reproduce(args: argparse.Namespace) -> int:
    from llmsched_gym.config import check_output_dir

    check_output_dir(args.out, "--out")
    run_paper(args.paper, args.quick, args.out, settings_from(args))
    return 0


def optimum_for_scenario(scenario: str, sets: dict[str, Any], method: str = "auto", seed: int = 0,
                         round_s: float = 1.0, policy: str | None = None) -> dict[str, Any]:
    """The hindsight optimum of ``scenario``'s workload as a round-mode instance (and, with
    ``policy``, that policy's round-mode TEL, regret and ratio)."""
    from llmsched_gym.core.scenarios import build_scenario, get_scenario
    from llmsched_gym.optimum import solve_optimum
    from llmsched_gym.reproduce.report import instance_from_workload

    spec = get_scenario(scenario, {k: v for k, v in sets.items() if not k.startswith("policy.")})
    workload, config, _ = build_scenario(spec, seed)
    inst = instance_from_workload(workload, config.kv_capacity_tokens, round_s)
    opt = solve_optimum(inst, method=method)  # type: ignore[arg-type]
    out: dict[str, Any] = {"n": inst.n, "M": inst.M, "method": opt.method, "status": opt.status, "tel": opt.tel,
                           "ael": opt.ael, "lower_bound": opt.lower_bound, "wall_s": opt.wall_s,
                           "starts": None if opt.starts is None else [int(s) for s in opt.starts]}
    if policy is not None:
        s = policy_vs_optimum(inst, policy, method)
        out.update({k: s[k] for k in ("regret", "ratio_to_opt") if k in s})
        out["policy"] = policy
    return out


def cmd_optimum(args: argparse.Namespace) -> int:
    from llmsched_gym.config import parse_sets

    res = optimum_for_scenario(args.scenario, parse_sets(args.set), args.method, args.seed, args.round_s,
                               args.policy)
    print(f"instance: {res['n']} requests, KV capacity M = {res['M']:,} tokens, "
          f"one round = {args.round_s:g} s of arrival time")
    print(f"solver: {res['method']}, status {res['status']}, {res['wall_s']:.2f} s")
    if res["tel"] is None:
        print("optimum: no feasible schedule found")
    else:
        print(f"optimal total end-to-end latency (TEL): {res['tel']:,} rounds")
        print(f"optimal mean end-to-end latency (AEL = TEL / n): {fmt(res['ael'])} rounds")
    print(f"lower bound on the optimal TEL: {fmt(res['lower_bound'])} rounds")
    if res.get("policy"):
        print(f"{res['policy']}: regret {fmt(res.get('regret'))} rounds per request (its AEL minus the optimal AEL), "
              f"ratio to the optimum {fmt(res.get('ratio_to_opt'))} (its TEL / the optimal TEL)")
    if res["starts"] is not None:
        print(f"optimal start round of each request: {res['starts']}")
    return 0


def add_subcommands(sub: Any) -> None:
    """Register ``reproduce`` and ``optimum`` on the main CLI's subparsers."""
    from llmsched_gym.help import HelpFormatter

    sp = sub.add_parser("reproduce", help="reproduce a paper's results: " + ", ".join(PAPERS),
                        formatter_class=HelpFormatter)
    sp.add_argument("paper", help="one of " + ", ".join(PAPERS) + " (docs/papers.md)")
    sp.add_argument("--quick", action="store_true", help="reduced version (under 2 minutes)")
    sp.add_argument("--out", default=None, help="report folder (default: runs/reproduce/PAPER)")
    add_parallel_arguments(sp)
    sp.set_defaults(func=cmd_reproduce)

    sp = sub.add_parser("optimum", help="hindsight optimum of a small round-mode instance (Jaillet et al. 2025, Appendix B.1)",
                        formatter_class=HelpFormatter)
    sp.add_argument("--scenario", required=True, help="scenario whose workload becomes the instance")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="scenario overrides (repeatable)")
    sp.add_argument("--method", choices=("auto", "ip", "exhaustive"), default="auto",
                    help="integer program, exhaustive search (up to 8 requests), or auto: the one that fits")
    sp.add_argument("--seed", type=int, default=0, help="workload seed")
    sp.add_argument("--round-s", type=float, default=1.0, help="seconds of arrival time per round")
    sp.add_argument("--policy", default=None, help="also run this policy in round mode and report its ratio")
    sp.set_defaults(func=cmd_optimum)
