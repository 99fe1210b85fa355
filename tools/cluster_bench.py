"""Cluster-level figures: the published router orderings on their workloads, and
the cost per request from 1 to 64 replicas. Prints one JSON line per run (and a table at the end).

    PYTHONPATH=$PWD python tools/cluster_bench.py llmd [--requests-per-level 2400]
    PYTHONPATH=$PWD python tools/cluster_bench.py sglang
    PYTHONPATH=$PWD python tools/cluster_bench.py vidur
    PYTHONPATH=$PWD python tools/cluster_bench.py speed [--replicas 1 64] [--requests 20000]
    PYTHONPATH=$PWD python tools/cluster_bench.py floor --router lor [--replicas 1 2 8 16 64]

* llmd: llm-d's prefix-heavy benchmark (llm-d blog, "KV-cache wins you can see", 2025): 8
  replicas, 150 groups of 6,000-token system prompts, a 1,200-token question and 250 output tokens
  per request (question and output lengths are our choice), Poisson at rising QPS; routers llm-d
  (precise prefix), llm-d-approx, llm-d-load (queue + KV only) and random; P90 TTFT.
  ``--kv-tokens 100000`` makes the groups' prefixes (900,000 tokens) outgrow the cluster's KV
  (800,000), the regime where an approximate index drifts from the caches it guesses.
* sglang: the same traffic and the Mooncake conversation trace, round-robin vs SGLang's
  cache-aware router: prefix hit rate and throughput.
* vidur: LOR vs round-robin on the azure-conv trace at rising load (time_scale), 4 replicas.
* llumnix: live migration (Sun et al., OSDI 2024) on and off behind Llumnix's dispatch and
  round-robin: 4 replicas of the ``mooncake-conv`` engine with 40,000 KV tokens each
  (``--kv-tokens``), prompts of 1,000 and outputs of 600 tokens on average, both Gamma with
  coefficient of variation 2 (a few very long requests load single replicas), Poisson at
  ``--qps``; P99 TTFT and E2E, preemptions, migrations (``--figure`` writes a PNG).
* speed: CPU time per request (process time) at N replicas with N times the arrival rate of one
  (``--rate-per-replica``, default 8/s; 150 groups of 1,000-token system prompts, 200-token
  questions and outputs, ``--lengths``; vLLM v1 replicas of the ``mooncake-conv`` scenario), wall time and the
  peak memory (RSS) of the process. ``--per-replica P`` gives every replica the same workload
  (N x P requests), so the cost per request at N replicas compares with one replica's. Each size
  first runs untimed with 20 requests per replica (the process's one-time costs, about 5 ms, would
  otherwise fall on the first size: 19 us a request at 1 x 300), and the garbage of earlier runs is
  collected before each timed one (a full collection of it, about 20 ms after a 64-replica run,
  would otherwise land in a later timing: 60 us a request at 1 x 300). ``--repeat R`` runs each size R
  times and reports the median run (one replica x 300 requests takes 30 ms: on a shared machine a single
  run of it was seen at 100 to 170 us a request). The scale
  run (64 replicas, 1M requests, one core):

      nice -n 10 python tools/cluster_bench.py speed --replicas 64 --requests 1000000 --router lor

* floor: where the cost per request of a cluster goes (``--router lor``, ``--per-replica``, default 300):
  the cluster beside the same placement run as plain engines one after another (``sequential``)
  and interleaved window by window (``interleaved``: each replica stepped to every routing point in
  turn, as the cluster visits them, without routing, intake or deferred runs: the memory-access
  pattern alone), rounds interleaved; all three runs are checked to take the same iterations.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import time
from functools import partial
from types import SimpleNamespace

import numpy as np

from llmsched_gym.cluster_sim import make_cluster, simulate_cluster
from llmsched_gym.core.cluster import few_collections
from llmsched_gym.core.sessions import prefix_groups


def _row(tag: str, r, **extra) -> dict:
    s = r.summary
    out = {"run": tag, **extra, "n": s["n_arrived"], "completed": s["n_completed"],
           "p90_ttft_s": round(s["ttft_s"]["p90"], 4), "mean_ttft_s": round(s["ttft_s"]["mean"], 4),
           "p90_e2e_s": round(s["e2e_s"]["p90"], 3), "mean_e2e_s": round(s["e2e_s"]["mean"], 3),
           "throughput_tok_s": round(s["throughput_tokens_per_s"], 1),
           "prefix_hit_rate": round(s["cluster"]["prefix_hit_rate"], 4),
           "load_imbalance": round(s["cluster"]["load_imbalance"], 3), "wall_s": round(s["wall_time_s"], 1)}
    print(json.dumps(out), flush=True)
    return out


def _kv(args) -> dict:
    return {"engine.kv_capacity_tokens": args.kv_tokens} if args.kv_tokens else {}


def llmd(args) -> None:
    for qps in args.qps:
        wl = prefix_groups(args.requests_per_level, qps, 150, 6000, 1200, 250, rng=args.seed)
        for router in ("llm-d", "llm-d-approx", "llm-d-load", "random"):
            r = simulate_cluster("mooncake-conv", "vllm-v1", router, 8, args.seed, workload=wl, overrides=_kv(args))
            _row("llmd", r, router=router, qps=qps, kv_tokens=args.kv_tokens or "scenario")


def sglang(args) -> None:
    for qps in args.qps:
        wl = prefix_groups(args.requests_per_level, qps, 150, 6000, 1200, 250, rng=args.seed)
        for router in ("round-robin", "sglang-cache-aware"):
            _row("sglang-groups", simulate_cluster("mooncake-conv", "vllm-v1", router, 8, args.seed, workload=wl,
                                                   overrides=_kv(args)), router=router, qps=qps)
    for router in ("round-robin", "sglang-cache-aware"):
        r = simulate_cluster("mooncake-conv", "vllm-v1", router, 8, args.seed,
                             overrides={"workload.trace.window": "head", "workload.n_requests": args.requests_per_level})
        _row("sglang-mooncake", r, router=router)


def vidur(args) -> None:
    for scale in (1.0, 0.5, 0.3, 0.2):
        for router in ("round-robin", "lor"):
            r = simulate_cluster("azure-conv", "vllm-v1", router, 4, args.seed,
                                 overrides={"workload.n_requests": args.requests_per_level,
                                            "workload.trace.time_scale": scale})
            _row("vidur", r, router=router, time_scale=scale)


def llumnix(args) -> None:
    """Tail latency with and without live migration on a skewed workload (heavy-tailed lengths)."""
    rows = []
    mig = {"interval_s": 0.05, "threshold": 1000.0}
    for rate in args.qps:
        wl = prefix_groups(args.requests_per_level, rate, 1, 0, 1000, 600, rng=args.seed, length_cv=2.0)
        for router in ("llumnix", "round-robin"):
            for m in (None, mig):
                r = simulate_cluster("mooncake-conv", "vllm-v1", router, 4, args.seed, workload=wl, migration=m,
                                     overrides={"engine.kv_capacity_tokens": args.kv_tokens or 40_000})
                s = r.summary
                rows.append(_row("llumnix", r, router=router, qps=rate, migration=m is not None,
                                 p99_ttft_s=round(s["ttft_s"]["p99"], 3), p99_e2e_s=round(s["e2e_s"]["p99"], 2),
                                 preemptions=s["preemptions"],
                                 migrations=s["cluster"].get("migration", {}).get("migrations", 0)))
    if args.figure:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
        for ax, key, title in ((axes[0], "p99_ttft_s", "P99 TTFT (s)"), (axes[1], "p99_e2e_s", "P99 E2E latency (s)")):
            for router, color in (("llumnix", "C0"), ("round-robin", "C1")):
                for m, style in ((False, "--"), (True, "-")):
                    pts = [(x["qps"], x[key]) for x in rows if x["router"] == router and x["migration"] == m]
                    ax.plot(*zip(*pts, strict=True), style, color=color, marker="o",
                            label=f"{router} dispatch, {'with' if m else 'no'} migration")
            ax.set_yscale("log")
            ax.set_xlabel("arrival rate (requests/s, 4 replicas)")
            ax.set_title(title)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        fig.suptitle("Live migration (Llumnix, OSDI 2024): Llama-3.1-8B / H100 replicas with 40k KV tokens, "
                     "lengths Gamma cv 2", fontsize=9)
        fig.tight_layout()
        fig.savefig(args.figure, dpi=120)
        print("figure:", args.figure)


def _speed_cluster(args, n: int, total: int):
    """The speed workload (``total`` requests at ``n`` times the per-replica rate) and a function
    that builds its cluster of ``n`` replicas afresh (speed and floor)."""
    system, question, output = args.lengths
    wl = prefix_groups(total, args.rate_per_replica * n, 150, system, question, output, rng=args.seed)
    return wl, lambda: make_cluster("mooncake-conv", "vllm-v1", args.router, n, args.seed, workload=wl,
                                    refresh_s=args.refresh_s)[0]


def speed(args) -> None:
    cluster = partial(_speed_cluster, args)
    for n in args.replicas:  # untimed warm-up: the process's one-time costs (imports on first use, the
        cluster(n, 20 * n)[1]().run()  # scenario's files, caches) would otherwise load the first size alone
    for n in args.replicas:
        wl, build = cluster(n, args.per_replica * n if args.per_replica else args.requests)
        runs = []
        for _ in range(args.repeat):
            gc.collect()  # the earlier runs' garbage: a full collection of it would land in this timing
            w0, c0 = time.perf_counter(), time.process_time()
            c = build()
            c.run()
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
            runs.append((cpu, wall, c.summary("speed", "vllm-v1", wall)))
            del c
        cpu, wall, s = sorted(runs, key=lambda x: x[0])[len(runs) // 2]  # the median run (of --repeat)
        _row("speed", SimpleNamespace(summary=s), replicas=n, router=args.router, refresh_s=args.refresh_s,
             cpu_s=round(cpu, 1), cpu_us_per_request=round(1e6 * cpu / len(wl), 1),
             cpu_us_per_request_runs=[round(1e6 * x[0] / len(wl), 1) for x in runs],
             requests_per_cpu_s=round(len(wl) / cpu), requests_per_wall_s=round(len(wl) / wall),
             iterations=s["iterations"],
             peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1))


def floor(args) -> None:
    """Where a load-aware cluster's cost per request goes: the cluster run beside the same
    placement (each replica's requests as the router placed them) run as plain engines, one after
    another and interleaved window by window (every replica stepped to each ``refresh_s`` point in
    turn, as the cluster visits them, with no routing, intake or deferred runs: the memory-access
    pattern alone). Rounds interleave the three."""
    for n in args.replicas:
        _floor(args, n)


def _floor(args, n: int) -> None:
    import copy

    from llmsched_gym.core.engine import Engine

    wl, cluster = _speed_cluster(args, n, (args.per_replica or 300) * n)
    c = cluster()
    c.run()
    placement = [np.flatnonzero(c.placement == r) for r in range(n)]

    def engines() -> list[Engine]:
        return [Engine(wl.take(ids), rep.config, rep.latency, copy.deepcopy(rep.scheduler), seed=args.seed)
                for ids, rep in zip(placement, c.replicas, strict=True)]

    def sequential(todo: list[Engine]) -> None:
        for e in todo:
            e.run()

    def interleaved(todo: list[Engine]) -> None:
        t = args.refresh_s
        while todo:
            for e in todo:
                sched, view = e.scheduler, e.view
                while e.clock < t and e.poll():
                    e.execute(sched.schedule(view))
            todo = [e for e in todo if not e.done]
            t += args.refresh_s

    def routed(_: list[Engine]) -> None:
        c = cluster()
        c.run()
        iterations.add(sum(e.n_iterations for e in c.engines))

    times: dict[str, list[float]] = {"cluster": [], "interleaved": [], "sequential": []}
    iterations: set[int] = set()
    for _ in range(args.rounds):
        for name, fn in (("cluster", routed), ("interleaved", interleaved), ("sequential", sequential)):
            todo = engines() if fn is not routed else []
            gc.collect()  # as in speed: no earlier run's garbage collected inside this timing
            with few_collections():  # as Cluster.run collects
                c0 = time.process_time()
                fn(todo)
                times[name].append(1e6 * (time.process_time() - c0) / len(wl))
            if todo:
                iterations.add(sum(e.n_iterations for e in todo))
    if len(iterations) != 1:  # a replica's run equals a plain engine given the same requests
        raise SystemExit(f"floor: the runs differ (iterations {sorted(iterations)})")
    print(json.dumps({"run": "floor", "replicas": n, "router": args.router, "per_replica": args.per_replica or 300,
                      "iterations": iterations.pop(),
                      **{f"{k}_us_per_request": [round(x, 1) for x in v] for k, v in times.items()}}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("llmd", "sglang", "vidur", "llumnix", "speed", "floor"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--qps", type=float, nargs="+", default=[5.0, 15.0, 30.0, 60.0])
    p.add_argument("--requests-per-level", type=int, default=2400)
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 64])
    p.add_argument("--requests", type=int, default=20000, help="speed: requests in all (see --per-replica)")
    p.add_argument("--per-replica", type=int, default=0,
                   help="speed: requests per replica (N replicas get N times as many; 0: --requests in all)")
    p.add_argument("--router", default="round-robin")
    p.add_argument("--rate-per-replica", type=float, default=8.0)
    p.add_argument("--kv-tokens", type=int, default=0,
                   help="KV capacity per replica (0: the scenario's 447,952); llmd/sglang only")
    p.add_argument("--refresh-s", type=float, default=0.1)
    p.add_argument("--lengths", type=int, nargs=3, default=[1000, 200, 200], metavar=("SYSTEM", "QUESTION", "OUTPUT"),
                   help="speed/floor: mean tokens of a group's system prompt, a question and an output "
                        "(llm-d's benchmark: 6000 1200 250)")
    p.add_argument("--figure", default="", help="llumnix: write the figure (PNG) here")
    p.add_argument("--rounds", type=int, default=3, help="floor: interleaved rounds")
    p.add_argument("--repeat", type=int, default=1,
                   help="speed: runs of each size; the median run is reported (a short run, such as one replica "
                        "x 300 requests, 30 ms, can land in a slow moment of a shared machine)")
    args = p.parse_args()
    np.seterr(all="ignore")
    {"llmd": llmd, "sglang": sglang, "vidur": vidur, "llumnix": llumnix, "speed": speed, "floor": floor}[args.what](args)


if __name__ == "__main__":
    main()
