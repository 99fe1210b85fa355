"""``llmsched train | evaluate | compare``: the arguments; the work is :mod:`agents.train` and
:mod:`agents.evaluate`'s.

The RL stack (torch, stable-baselines3, matplotlib) is imported inside the command functions only,
so ``llmsched list`` stays fast.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from llmsched_gym.config import ConfigError
from llmsched_gym.parallel import add_arguments as add_parallel_arguments

TRUST_HELP = ("also load SB3 .zip models, vecnormalize pickles and RLlib's rl_module/ checkpoints: unpickling runs "
              "any code they carry, so only for files you trust (the default reads only .json + .safetensors)")


def _sets(items: list[str] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    from llmsched_gym.config import parse_sets, split_policy_sets

    return split_policy_sets(parse_sets(items))


def _hp(items: list[str] | None) -> dict[str, Any]:
    from llmsched_gym.config import parse_sets

    return parse_sets(items, "--hp")


def _loads(text: str) -> list[float]:
    try:
        loads = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"loads: {text!r} is not a list of numbers like 0.8,1,1.2") from None
    if not loads or any(x <= 0 for x in loads):
        raise ConfigError(f"loads: {text!r} must be positive numbers")
    return loads


def _policies(text: str | None) -> list[str]:
    from baselines import available

    if text is None or text == "all":
        return available()
    if text == "none":
        return []
    names = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in names if p not in available()]
    if unknown:
        raise ConfigError(f"policies: unknown {unknown[0]!r}; allowed: all, none, {', '.join(available())}")
    return names


def _specs(specs: list[str] | None) -> list[str]:
    """``--policy NAME[:key=value,...]`` entrants, each validated before anything runs; a run is
    labelled by its spec as given (``sarathi:chunk_size=256``)."""
    from baselines import validate_spec

    for spec in specs or []:
        validate_spec(spec, "--policy")
    return list(specs or [])


class _BenchmarkTasks(Mapping):
    """``llmsched_gym.benchmark.TASKS`` by name, imported at the first look (a run whose recipe names
    no task and that scores nothing never imports the benchmark)."""

    def __init__(self) -> None:
        self._tasks: dict[str, Any] | None = None

    def _get(self) -> dict[str, Any]:
        if self._tasks is None:
            from llmsched_gym.benchmark import TASKS

            self._tasks = {t.name: t for t in TASKS}
        return self._tasks

    def __getitem__(self, name: str) -> Any:
        return self._get()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


def _hindsight(*args: Any, **kwargs: Any) -> Any:
    """:func:`llmsched_gym.hindsight.hindsight`, imported when a learning curve first asks."""
    from llmsched_gym.hindsight import hindsight

    return hindsight(*args, **kwargs)


def _route_hindsight(*args: Any, **kwargs: Any) -> Any:
    """:func:`llmsched_gym.route_hindsight.route_hindsight`, imported when a learning curve first asks."""
    from llmsched_gym.route_hindsight import route_hindsight

    return route_hindsight(*args, **kwargs)


def curve_setup() -> Any:
    """The learning curve's tasks and hindsight search (application layer) for
    :func:`agents.train.train`, each imported when first used (~0.02 CPU-s that a run with
    ``--score-every 0`` and no task does not need)."""
    from agents.curves import CurveSetup

    return CurveSetup(tasks=_BenchmarkTasks(), hindsight=_hindsight, route_hindsight=_route_hindsight)


# what TensorBoard's file layer imports only for remote log folders (s3://, fsspec URLs): boto3 and
# botocore alone cost ~0.05 CPU-s of every `llmsched train`, whose logs are local run folders
_REMOTE_FS_MODULES = ("boto3", "botocore", "botocore.exceptions", "fsspec")


def _import_rl_stack() -> None:
    """Import torch, Stable-Baselines3 and the training module the cheap way, for a process that
    trains and ends (``llmsched train``).

    * No collections while they import: their ~200k objects would be walked by every full
      collection on the way (0.15-0.3 CPU-s); imports make no cyclic garbage worth collecting.
      Then ``gc.freeze()``: this process ends after training, so the objects of the imported
      modules go to the collector's permanent generation, and neither the full collections during
      training nor the interpreter's exit walk them again (0.3-0.8 CPU-s of a short run).
    * SB3's logger imports TensorBoard, whose file layer imports boto3 (and fsspec) when they are
      installed, for ``s3://`` log folders. Not needed here: they are blocked while TensorBoard
      imports (it then reads and writes local files only, as every run folder is), and importable
      again afterwards.
    """
    import gc

    blocked = [m for m in _REMOTE_FS_MODULES if m not in sys.modules]
    gc.disable()
    try:
        for m in blocked:
            sys.modules[m] = None  # type: ignore[assignment]  (import raises ImportError)
        import stable_baselines3  # noqa: F401  (with torch and TensorBoard: before the freeze below)

        import agents.train  # noqa: F401
    finally:
        for m in blocked:
            if sys.modules.get(m, 0) is None:
                del sys.modules[m]
        gc.freeze()
        gc.enable()


def cmd_train(args: argparse.Namespace) -> int:
    from llmsched_gym.config import check_output_dir, check_run_name

    check_run_name(args.name)
    check_output_dir(args.out, "--out")
    if args.bc_from is not None and args.bc_from.strip().lower() != "none":
        from baselines import validate_spec

        validate_spec(args.bc_from, "--bc-from")
    _import_rl_stack()
    from agents.train import TrainConfig, train

    overrides, _ = _sets(args.set)
    env_kwargs = {"action_mode": args.action_mode, "admission": args.admission, "K": args.K, "order": args.order}
    cfg = TrainConfig(
        scenario=args.scenario, name=args.name, out=args.out, algo=args.algo, timesteps=args.timesteps,
        seed=args.seed, n_envs=args.n_envs, vec=args.vec, overrides=overrides,
        env_kwargs={k: v for k, v in env_kwargs.items() if v is not None},
        hyperparams=_hp(args.hp), hyperparams_file=args.hyperparams, bc_from=args.bc_from,
        bc_episodes=args.bc_episodes, bc_epochs=args.bc_epochs, resume=args.resume,
        trust_model=args.trust_model, checkpoint_every=args.checkpoint_every, score_every=args.score_every,
        progress=not args.no_progress, torch_threads=args.threads, max_minutes=args.max_minutes,
        validation_requests=args.validation_requests,
    )
    meta = train(cfg, curve_setup())
    v = meta["validation"]
    print(f"trained {meta['name']}: {meta['timesteps']} steps in {meta['learn_wall_s']:.0f}s "
          f"({meta['episodes']} episodes); saved in {Path(args.out) / meta['name']}")
    if v["final_agent"]:
        sel = v.get("selection") or {}
        print(f"validation (seed 99): agent Mean E2EL {v['final_agent']['mean_e2el_ms']:.4g} ms; best_model: "
              f"{sel.get('metric', 'serving.mean_e2el_ms')} x{sel.get('best_rel_vs_best', math.nan):.3f} of the best baseline")
    return 0


def _evaluate_like(args: argparse.Namespace, models: list[str], default_out: str) -> int:
    missing = [m for m in models if not Path(m).exists()]
    if missing:
        raise ValueError(f"--model: {missing[0]}: no such path (give a run folder or a model .zip)")
    from agents.evaluate import compare
    from agents.report import parse_seeds
    from llmsched_gym.config import check_output_dir
    from llmsched_gym.parallel import settings_from

    overrides, policy_params = _sets(args.set)
    scenario = args.scenario
    if scenario is None:
        import json

        runs = [Path(m) if Path(m).is_dir() else Path(m).parent for m in models]
        metas = [json.loads((r / "run.json").read_text()) for r in runs if (r / "run.json").exists()]
        if not metas:
            raise ConfigError("scenario: give --scenario (no run.json names one)")
        scenario = metas[0]["scenario"]
    out = args.out or str(Path(default_out) / (Path(models[0]).name if models else scenario))
    check_output_dir(out, "--out")
    names = _policies(args.policies) + _specs(args.policy)
    compare(scenario, parse_seeds(args.seeds), _loads(args.loads), names, models, overrides,
            policy_params, out, plots=not args.no_plots, best=getattr(args, "best", False), quiet=args.quiet,
            settings=settings_from(args), trust_model=getattr(args, "trust_model", False))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    return _evaluate_like(args, args.model or [], "runs/eval")


def cmd_compare(args: argparse.Namespace) -> int:
    return _evaluate_like(args, [], "runs/compare")


def _common_eval(sp: argparse.ArgumentParser, seeds: str, policies: str | None) -> None:
    sp.add_argument("--seeds", default=seeds, help="workload seeds, e.g. 100-104 or 1,3,5")
    sp.add_argument("--loads", default="1", help="arrival-rate multipliers, e.g. 0.8,1,1.2")
    sp.add_argument("--policies", default=policies, help="baselines: comma list, 'all' or 'none'")
    sp.add_argument("--policy", action="append", metavar="NAME[:k=v,...]",
                    help="a parameterised baseline to run as well, as `run --policy` takes it (repeatable)")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="scenario override (workload.X, engine.X, latency) or policy.X for the baselines that take X")
    sp.add_argument("--out", default=None, help="report folder (default: runs/eval/MODEL or runs/compare/SCENARIO)")
    sp.add_argument("--no-plots", action="store_true", help="write no PNG plots (faster; no matplotlib needed)")
    sp.add_argument("--quiet", action="store_true", help="print no table")
    add_parallel_arguments(sp)


def add_subcommands(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """Add ``train``, ``evaluate`` and ``compare`` to the ``llmsched`` parser's subcommands."""
    from_file = "(default: the hyperparameter file's entry for the scenario)"
    sp = sub.add_parser("train", help="train a PPO agent on LLMSched-v1", formatter_class=formatter)
    sp.add_argument("--scenario", default="jaillet-low", help="scenario to train on (`llmsched list`)")
    sp.add_argument("--name", default=None, help="run name (default: SCENARIO-MODE-sSEED)")
    sp.add_argument("--out", default="runs/train", help="parent folder of the run folder")
    sp.add_argument("--algo", default=None, choices=["maskable-ppo", "ppo"],
                    help="default: maskable-ppo, ppo for the priority/knob/tune modes")
    sp.add_argument("--timesteps", type=int, default=None, help=f"environment steps to learn for {from_file}")
    sp.add_argument("--seed", type=int, default=0, help="seeds the model and the training workloads")
    sp.add_argument("--n-envs", type=int, default=None, help=f"parallel training environments {from_file}")
    sp.add_argument("--vec", default="native", choices=["native", "dummy", "subproc"],
                    help="native: every environment in one vector env in this process (fastest); dummy: SB3's "
                         "DummyVecEnv of single envs; subproc: one subprocess each (same results)")
    sp.add_argument("--action-mode", default=None, choices=["select", "subset", "priority", "knob", "meta", "tune"],
                    help=f"what the agent decides each step {from_file}")
    sp.add_argument("--admission", default=None, choices=["current", "future", "none"],
                    help=f"memory rule behind the action mask {from_file}")
    sp.add_argument("--K", type=int, default=None, help=f"queue slots the agent sees {from_file}")
    sp.add_argument("--order", default=None, choices=["arrival", "shortest", "prompt", "deadline"],
                    help=f"canonical order of the queue slots {from_file}")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="scenario override for training episodes")
    sp.add_argument("--hp", action="append", metavar="KEY=VALUE", help="hyperparameter override (n_steps=256)")
    sp.add_argument("--hyperparams", default=None, metavar="YAML",
                    help="a hyperparameter file instead of agents/hyperparams/maskable_ppo.yml (or ppo.yml)")
    sp.add_argument("--bc-from", default=None, metavar="POLICY",
                    help="behaviour-clone this baseline first (NAME or NAME:key=value,...; 'none' overrides "
                         "the hyperparameter file's bc entry)")
    sp.add_argument("--bc-episodes", type=int, default=None, help="demonstration episodes (default: the file's, else 4)")
    sp.add_argument("--bc-epochs", type=int, default=None, help="cloning epochs (default: the file's, else 10)")
    sp.add_argument("--resume", default=None, help="checkpoint (.json) or run folder to continue from")
    sp.add_argument("--trust-model", action="store_true", help=TRUST_HELP)
    sp.add_argument("--checkpoint-every", type=int, default=10_000, help="timesteps between checkpoints")
    sp.add_argument("--score-every", type=int, default=1,
                    help="rollouts between validation scores against the baselines (0 = never)")
    sp.add_argument("--validation-requests", type=int, default=None,
                    help="requests of the validation workload (default: the file's, else the training size)")
    sp.add_argument("--threads", type=int, default=1, help="torch threads")
    sp.add_argument("--max-minutes", type=float, default=None,
                    help="stop learning after this much wall time (default: no limit)")
    sp.add_argument("--no-progress", action="store_true", help="print no progress bar")
    sp.set_defaults(func=cmd_train, quick_exit=True)

    sp = sub.add_parser("evaluate", help="agents and baselines on held-out seeds, with a report",
                        formatter_class=formatter)
    sp.add_argument("--model", action="append", help="run folder or agent file (.json) (repeatable)")
    sp.add_argument("--scenario", default=None, help="default: the model's training scenario")
    sp.add_argument("--best", action="store_true", help="use best_model instead of model")
    sp.add_argument("--trust-model", action="store_true", help=TRUST_HELP)
    _common_eval(sp, "100-104", "all")
    sp.set_defaults(func=cmd_evaluate)

    sp = sub.add_parser("compare", help="baselines on the same seeded workloads, with a report",
                        formatter_class=formatter)
    sp.add_argument("--scenario", default="azure-conv", help="scenario name (`llmsched list`)")
    _common_eval(sp, "0-4", "all")
    sp.set_defaults(func=cmd_compare)
