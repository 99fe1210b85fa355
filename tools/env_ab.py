"""Same-process A/B of ``LLMSched-v1`` env steps: the working tree against an earlier commit.

On a shared or virtualised machine the speed of one process drifts by 20% or more between runs,
even in CPU seconds, so two separate ``llmsched bench --only env`` runs cannot tell a 1.2x change
from noise. This tool imports both versions into one process and alternates chunks of steps
between them, so both see the same machine at the same moments:

1. ``git archive REV`` exports ``llmsched_gym`` and ``baselines`` of REV into a scratch folder,
   renamed ``llmsched_gym_ab`` and ``baselines_ab`` (every import rewritten), so the two versions
   load side by side;
2. each version builds its env (1,000-request episodes, K = 32 slots, its own default action mode
   and admission rule unless given) and steps it with uniformly random valid actions, as
   ``llmsched bench --only env`` does, resetting at the end of each episode;
3. chunks of ``--chunk`` steps alternate between the two (the order flips every round), timed in
   CPU seconds; the summary is steps per CPU second of each and their ratio (sum, and the median
   of the per-round ratios).

Run from the repository root (the traces are looked up relative to it)::

    python tools/env_ab.py 192ae4d --rounds 40 jaillet-high azure-conv
"""

from __future__ import annotations

import argparse
import importlib
import io
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

PACKAGES = ("llmsched_gym", "baselines")


def export(rev: str, dest: Path) -> None:
    """``llmsched_gym`` and ``baselines`` of ``rev`` under ``dest``, renamed with an ``_ab`` suffix."""
    tar = subprocess.run(["git", "archive", rev, *PACKAGES], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(dest, filter="data")
    pattern = re.compile(r"\b(" + "|".join(PACKAGES) + r")\b")
    for pkg in PACKAGES:
        for f in (dest / pkg).rglob("*.py"):
            f.write_text(pattern.sub(r"\1_ab", f.read_text()))
        (dest / pkg).rename(dest / f"{pkg}_ab")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("rev", help="the earlier commit to compare with (e.g. 192ae4d)")
    p.add_argument("scenarios", nargs="*", default=["jaillet-high", "azure-conv"])
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--chunk", type=int, default=500, help="steps per timed chunk")
    p.add_argument("--old-admission", default=None, help="admission rule of the old env (default: its own)")
    args = p.parse_intermixed_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        export(args.rev, Path(tmp))
        sys.path.insert(0, tmp)
        sides = {"old": importlib.import_module("llmsched_gym_ab.env.bench"),
                 "new": importlib.import_module("llmsched_gym.env.bench")}
        for sc in args.scenarios:
            runs = {}
            for name, mod in sides.items():
                kw = {"admission": args.old_admission} if name == "old" and args.old_admission else {}
                env = mod.LLMSchedEnv(sc, n_requests=1000, K=32, **kw)
                env.reset(seed=0)
                runs[name] = (mod, env, np.random.default_rng(0), [])
            for r in range(args.rounds):
                for name in ("old", "new") if r % 2 else ("new", "old"):
                    mod, env, rng, times = runs[name]
                    t0 = time.process_time()
                    for _ in range(args.chunk):
                        _, _, terminated, truncated, _ = env.step(mod.random_masked_action(env, rng))
                        if terminated or truncated:
                            env.reset()
                    times.append(time.process_time() - t0)
            old, new = np.array(runs["old"][3]), np.array(runs["new"][3])
            steps = args.rounds * args.chunk
            print(f"{sc}: {args.rev} {steps / old.sum():,.0f} steps/CPU-s, working tree {steps / new.sum():,.0f} "
                  f"steps/CPU-s: {old.sum() / new.sum():.2f}x (median per round {np.median(old / new):.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
