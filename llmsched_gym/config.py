"""Configuration: ``--set`` overrides, the one schema every setting is checked against, and the
checks on files the user names (YAML inputs, output paths).

Everything a user configures goes through here before anything runs:

* :func:`parse_sets` turns ``KEY=VALUE`` strings into a dict (values parsed as YAML scalars);
  :func:`apply_overrides` sets the dotted keys in a copy of a scenario.
* :func:`check_scenario` checks a scenario dict (the built-in ones, a ``--scenario my.yml`` file,
  or either after ``--set``) against :data:`SCENARIO` and :data:`ENGINE`: types, ranges and
  enumerations. The workload section is checked by
  :func:`~llmsched_gym.core.workload.build_workload`, the latency section by
  :func:`~llmsched_gym.core.latency.make_latency`, policy parameters by each policy's ``params``
  (:func:`coerce_like`); their messages carry the same dotted paths.
* :func:`check_hyperparams` does the same for an entry of ``agents/hyperparams/*.yml``.
* :func:`merge_engine_overrides` is the one rule for a policy's ``engine_overrides``.
* :func:`check_output_file`, :func:`check_output_dir` and :func:`check_run_name` reject output
  paths that cannot be written before a run starts, instead of after it.

Every violation raises :class:`ConfigError` with one line: the dotted field, the value and what is
allowed (``engine.block_size: expected an integer >= 1, got 'x'``). ``llmsched`` prints that line
and exits with status 2; it never shows a traceback for input like this.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


class ConfigError(ValueError):
    """Bad user input: a setting, scenario, policy parameter, workload or file that cannot be used.

    The message is one line naming the field (dotted path), the value and what is allowed. Every
    input error of the project derives from it (``ScenarioError``, ``PolicyError``,
    ``WorkloadError``), so ``except ConfigError`` catches all of them.
    """


# ---------------------------------------------------------------------------------------------
# the schema


_KIND_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
               "list": "a list", "dict": "a mapping"}


@dataclass(frozen=True)
class Setting:
    """One setting: its kind, its range or choices, and whether ``null`` is allowed.

    :param kind: ``int``, ``float``, ``bool``, ``str``, ``list``, ``dict``, or a tuple of them
        (``("str", "dict")``: either). Integers accept integral floats (``1e4``); numbers are
        finite; ``bool`` accepts only ``true``/``false`` (never a truthy string or a number).
    :param gt, ge, le, lt: bounds of a number.
    :param choices: the allowed strings.
    :param nullable: ``null`` (``None``) is allowed.
    """

    kind: str | tuple[str, ...]
    gt: float | None = None
    ge: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[str, ...] = ()
    nullable: bool = False

    def allowed(self) -> str:
        """What the setting accepts, in words (``an integer >= 1``, ``null or a number > 0``)."""
        if self.choices:
            text = "one of " + ", ".join(self.choices)
        else:
            kinds = (self.kind,) if isinstance(self.kind, str) else self.kind
            text = " or ".join(_KIND_WORDS[k] for k in kinds)
            lo = ("(", self.gt) if self.gt is not None else ("[", self.ge) if self.ge is not None else None
            hi = (")", self.lt) if self.lt is not None else ("]", self.le) if self.le is not None else None
            if lo and hi:
                text += f" in {lo[0]}{_num(lo[1])}, {_num(hi[1])}{hi[0]}"
            elif lo:
                text += f" {'>' if lo[0] == '(' else '>='} {_num(lo[1])}"
            elif hi:
                text += f" {'<' if hi[0] == ')' else '<='} {_num(hi[1])}"
        return f"null or {text}" if self.nullable else text

    def check(self, path: str, value: Any) -> Any:
        """``value`` in its canonical type (``1e4`` -> ``10000`` for an integer), or ConfigError."""
        if value is None and self.nullable:
            return None
        kinds = (self.kind,) if isinstance(self.kind, str) else self.kind
        for kind in kinds:
            ok, v = _as_kind(kind, value)
            if ok and self._in_range(v):
                return v
        raise ConfigError(f"{path}: expected {self.allowed()}, got {_show(value)}")

    def _in_range(self, v: Any) -> bool:
        if self.choices:
            return v in self.choices
        if not isinstance(v, int | float):
            return True
        return ((self.gt is None or v > self.gt) and (self.ge is None or v >= self.ge)
                and (self.lt is None or v < self.lt) and (self.le is None or v <= self.le))


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def _as_kind(kind: str, value: Any) -> tuple[bool, Any]:
    is_bool = isinstance(value, bool | np.bool_)
    if kind == "bool":
        return is_bool, bool(value) if is_bool else value
    if kind in ("int", "float"):
        if is_bool or not isinstance(value, int | float | np.integer | np.floating):
            return False, value
        if isinstance(value, int | np.integer):  # exact; beyond int64 nothing downstream can hold it
            return abs(int(value)) < 2**63, int(value) if kind == "int" else float(value) if abs(value) < 2**63 else value
        x = float(value)
        if not math.isfinite(x) or (kind == "int" and not (x.is_integer() and abs(x) < 2**63)):
            return False, value
        return True, int(x) if kind == "int" else x
    if kind == "str":
        return isinstance(value, str), value
    if kind == "list":
        return isinstance(value, list | tuple), list(value) if isinstance(value, list | tuple) else value
    if kind == "dict":
        return isinstance(value, Mapping), value
    raise AssertionError(f"unknown kind {kind!r}")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _name(key: str) -> str:
    """A user-typed key as it appears in a message: as is, or quoted if it has unprintable
    characters (a message stays one line)."""
    return key if key.isprintable() else repr(key)


def coerce_like(path: str, value: Any, default: Any) -> Any:
    """Check ``value`` against the type of ``default`` (a policy parameter or env setting): a
    ``bool`` default takes only true/false, an ``int`` one an integer, a ``float`` one any finite
    number, a ``str`` one a string, a list one a list; a ``None`` default takes anything."""
    if default is None or value is None:
        return value
    for kind, types in (("bool", (bool,)), ("int", (int,)), ("float", (float,)), ("str", (str,)),
                        ("list", (list, tuple)), ("dict", (dict,))):
        if isinstance(default, types):
            return Setting(kind).check(path, value)
    return value


def check_section(path: str, section: Any, schema: Mapping[str, Setting]) -> dict[str, Any]:
    """Check a mapping against ``schema``: unknown keys and bad values raise ConfigError."""
    if not isinstance(section, Mapping):
        raise ConfigError(f"{path}: expected a mapping of {', '.join(schema)}, got {_show(section)}")
    out: dict[str, Any] = {}
    for key, value in section.items():
        if key not in schema:
            raise ConfigError(f"{path}.{_name(str(key))}: unknown field; allowed: {', '.join(schema)}")
        out[key] = schema[key].check(f"{path}.{key}", value)
    return out


#: Overflow handlers and preemption modes of the engine (see :mod:`llmsched_gym.core.engine`).
OVERFLOW_HANDLERS = ("forbid", "clear_all", "clear_bernoulli", "preempt_lifo_recompute", "swap")
PREEMPT_MODES = ("recompute", "restart", "swap")

#: The engine section: one entry per field of :class:`~llmsched_gym.core.engine.EngineConfig`.
ENGINE: dict[str, Setting] = {
    "kv_capacity_tokens": Setting("int", ge=1),
    "block_size": Setting("int", ge=1),
    "prefill_emits_token": Setting("bool"),
    "overflow": Setting("str", choices=OVERFLOW_HANDLERS),
    "overflow_beta": Setting("float", gt=0, le=1),
    "preempt_mode": Setting("str", choices=PREEMPT_MODES),
    "swap_gb_s": Setting("float", gt=0),
    "kv_bytes_per_token": Setting("int", ge=1),
    "prefix_cache": Setting("bool"),
    "prefix_cap_prompt_minus_one": Setting("bool"),
    "horizon_s": Setting("float", gt=0, nullable=True),
    "max_iterations": Setting("int", ge=1, nullable=True),
    "stall_iterations": Setting("int", ge=0),
    "latency_noise_cv": Setting("float", ge=0, le=10),
    "fast_forward": Setting("bool"),
}

MAX_REQUESTS = 100_000_000
"""Largest ``n_requests`` of a workload: the engine keeps about 1 KB per request, so a larger run
would exhaust memory instead of failing with a message."""

#: Top-level workload fields checked here (build_workload checks the rest of the section).
WORKLOAD: dict[str, Setting] = {
    "n_requests": Setting("int", ge=0, le=MAX_REQUESTS, nullable=True),
    "horizon_s": Setting("float", gt=0, nullable=True),
}

#: The top level of a scenario (a built-in one, a ``--scenario my.yml`` file, or a dict).
SCENARIO: dict[str, Setting] = {
    "description": Setting("str"),
    "paper": Setting("str"),
    "name": Setting("str"),
    "workload": Setting("dict"),
    "engine": Setting("dict"),
    "latency": Setting(("str", "dict")),
    "policy": Setting(("str", "dict")),
    "cluster": Setting("dict"),
    "slo": Setting("dict"),
}

MAX_REPLICAS = 4096
"""Most replicas a cluster may have (each is an engine with its own per-request arrays)."""

#: A scenario's ``cluster:`` section (:mod:`llmsched_gym.core.cluster`; ``llmsched cluster run``).
CLUSTER: dict[str, Setting] = {
    "n_replicas": Setting("int", ge=1, le=MAX_REPLICAS),
    "router": Setting("str"),  # a router name, or NAME:key=value,... (baselines.routers.ROUTERS)
    "router_params": Setting("dict"),
    "refresh_s": Setting("float", ge=0),
    "replicas": Setting("dict"),  # replica index -> the fields below, replacing the scenario's
    "migration": Setting("dict", nullable=True),  # Llumnix's live migration (core.cluster.Migration's fields)
    # disaggregated serving (core.disagg, simulate_cluster's pools/transfer/decider, checked where built)
    "pools": Setting("dict", nullable=True),  # prefill, decode (and mixed): {n, latency, engine, policy, router, model, tp}
    "transfer": Setting("dict"),  # the KV link: bandwidth_gb_s, base_s, shared_link, link, first_token
    "decider": Setting(("str", "dict")),  # always, never, {kind: prompt_len, min}, {kind: prefix_hit, min_uncached}
}
#: One entry of ``cluster.replicas``: what differs on that replica.
REPLICA: dict[str, Setting] = {
    "policy": Setting(("str", "dict")),
    "latency": Setting(("str", "dict")),
    "engine": Setting("dict"),
}

#: The ``slo`` section: latency targets of every request, in seconds (DistServe's TTFT and TPOT
#: SLOs, Zhong et al., OSDI 2024, section 2); the run's summary then carries the attainment.
SLO: dict[str, Setting] = {
    "ttft_s": Setting("float", gt=0),
    "tpot_s": Setting("float", gt=0),
}


def check_slo(section: Any, path: str = "slo") -> dict[str, float]:
    """The ``slo`` section checked: ``ttft_s`` and/or ``tpot_s``, each a number of seconds > 0."""
    out = check_section(path, section, SLO)
    if not out:
        raise ConfigError(f"{path}: expected ttft_s and/or tpot_s (seconds), got an empty section")
    return {k: float(v) for k, v in out.items()}


def check_engine(section: Any, path: str = "engine") -> dict[str, Any]:
    """The engine section with every value checked and in its canonical type, and the fields checked
    together where one bounds another (a KV cache of at least one block)."""
    out = check_section(path, section, ENGINE)
    cap, block = out.get("kv_capacity_tokens"), out.get("block_size")
    if cap is not None and block is not None and cap < block:  # no block at all: nothing could ever run
        raise ConfigError(f"{path}.kv_capacity_tokens: {cap} is less than one block ({path}.block_size {block})")
    return out


def check_scenario(spec: Any) -> dict[str, Any]:
    """A checked copy of a scenario: the top-level keys, the engine section and the policy entry.

    :raises ConfigError: on the first violation, naming its dotted field.
    """
    if not isinstance(spec, Mapping):
        raise ConfigError(f"scenario: expected a mapping with {', '.join(SCENARIO)}, got {_show(spec)}")
    out = check_section("scenario", spec, SCENARIO)
    out = {k: out[k] for k in spec}  # the caller's order
    if "workload" not in out:
        raise ConfigError("scenario.workload: missing; a scenario needs a workload section")
    out["workload"] = dict(out["workload"])
    for key, setting in WORKLOAD.items():
        if key in out["workload"]:
            out["workload"][key] = setting.check(f"workload.{key}", out["workload"][key])
    if "engine" in out:
        # every field, and the capacity against the block size when both are set (against the
        # defaults: EngineConfig.checked, when the engine is built)
        out["engine"] = check_engine(out["engine"])
    if "slo" in out:
        out["slo"] = check_slo(out["slo"])
    policy = out.get("policy")
    if isinstance(policy, Mapping):
        name = policy.get("name")
        if name is not None and not isinstance(name, str):
            raise ConfigError(f"policy.name: expected a policy name (a string), got {_show(name)}")
    if "cluster" in out:
        out["cluster"] = check_cluster(out["cluster"])
    return out


def check_cluster(section: Any, path: str = "cluster") -> dict[str, Any]:
    """A checked copy of a scenario's ``cluster:`` section (:data:`CLUSTER`): the replica count, the
    router (its name and parameters are checked where the router is built, by
    :func:`baselines.routers.make_router`), the load-signal refresh interval and per-replica
    overrides (:data:`REPLICA`), keyed by replica index (an integer, or its digits as a string,
    as ``--set cluster.replicas.2.latency=...`` gives it) in ``0 .. n_replicas - 1``, and live
    migration (``migration: {interval_s, threshold, bandwidth_gb_s, base_s, tp}``; its fields are
    checked by :meth:`llmsched_gym.core.cluster.Migration.of`; ``null``: none).

    >>> check_cluster({"n_replicas": 2, "replicas": {"1": {"engine": {"kv_capacity_tokens": 8000}}}})
    {'n_replicas': 2, 'replicas': {1: {'engine': {'kv_capacity_tokens': 8000}}}}
    """
    out = check_section(path, section, CLUSTER)
    n = out.get("n_replicas", 1)
    replicas: dict[int, dict[str, Any]] = {}
    for key, value in out.get("replicas", {}).items():
        index = key if isinstance(key, int) and not isinstance(key, bool) else None
        if isinstance(key, str) and key.strip().isdigit():
            index = int(key)
        if index is None or not 0 <= index < n:
            raise ConfigError(f"{path}.replicas.{_name(str(key))}: not a replica index; allowed: 0 .. {n - 1} "
                              f"({path}.n_replicas is {n})")
        entry = check_section(f"{path}.replicas.{index}", value, REPLICA)
        if "engine" in entry:
            entry["engine"] = check_engine(entry["engine"], f"{path}.replicas.{index}.engine")
        replicas[index] = {**replicas.get(index, {}), **entry}  # 2 and "2" (a --set) both name replica 2
    if "replicas" in out:
        out["replicas"] = dict(sorted(replicas.items()))
    return out


def single_engine(spec: Mapping[str, Any]) -> None:
    """Raise ConfigError if the checked scenario ``spec`` declares a cluster that one engine cannot
    run (more than one replica, or per-replica overrides): ``llmsched run``, ``simulate()`` and
    ``LLMSched-v1`` serve one engine; ``llmsched cluster run``, ``simulate_cluster()`` and
    ``LLMSchedCluster-v0`` serve the cluster. A ``cluster:`` section of one replica without
    overrides is the plain engine (its router has nothing to choose)."""
    c = spec.get("cluster") or {}
    n = c.get("n_replicas", 1)
    if c.get("pools"):
        raise ConfigError("cluster.pools: this scenario declares prefill/decode pools, which one engine cannot serve; "
                          "run it with `llmsched cluster run` (simulate_cluster()) or `llmsched goodput`, or as one "
                          "engine with --set cluster.pools=null")
    if n > 1 or c.get("replicas"):
        what = f"a cluster of {n} replicas" if n > 1 else "a replica with overrides of its own (cluster.replicas)"
        one = "--set cluster.n_replicas=1" + (" --set cluster.replicas={}" if c.get("replicas") else "")
        raise ConfigError(f"cluster.n_replicas: this scenario declares {what}, which one engine cannot serve; run "
                          "it with `llmsched cluster run` (simulate_cluster(), LLMSchedCluster-v0), or as one "
                          f"engine with {one}")


#: An entry of ``agents/hyperparams/*.yml`` (rl-zoo layout); ``--hp KEY=VALUE`` is checked the same way.
HYPERPARAMS: dict[str, Setting] = {
    "n_timesteps": Setting("int", ge=1),
    "policy": Setting("str"),
    "n_envs": Setting("int", ge=1, le=256),
    "n_steps": Setting("int", ge=1, le=2**20),
    "batch_size": Setting("int", ge=1, le=2**20),
    "n_epochs": Setting("int", ge=1, le=10_000),
    "gamma": Setting("float", ge=0, le=1),
    "gae_lambda": Setting("float", ge=0, le=1),
    "learning_rate": Setting("float", gt=0),
    "ent_coef": Setting("float", ge=0),
    "clip_range": Setting("float", gt=0),
    "vf_coef": Setting("float", ge=0),
    "max_grad_norm": Setting("float", gt=0),
    "normalize": Setting("dict"),
    "policy_kwargs": Setting("dict"),
    "env_kwargs": Setting("dict"),
    "bc": Setting("dict"),
    "validation_requests": Setting("int", ge=1, le=MAX_REQUESTS),
    "action_bias": Setting(("float", "list"), ge=-1, le=1),  # a list: one per action dimension
    "task": Setting("str"),  # the benchmark task the validation curve scores (its metric and workload)
    "curves": Setting("dict"),
    "input_baseline": Setting("dict"),
    "slot_head": Setting("bool"),  # one learned function scores every slot (agents/heads.py)
    "route_prior": Setting("dict"),  # routing: the replica scores' starting weights (agents/heads.py replica_head)
}
LINEAR_SCHEDULE_KEYS = ("learning_rate", "clip_range")
"""Hyperparameters that may also be ``lin_START``: a linear decay from START to 0 (rl-zoo's notation)."""
NORMALIZE: dict[str, Setting] = {
    "norm_obs": Setting("bool"),
    "norm_reward": Setting("bool"),
    "norm_obs_keys": Setting("list"),
    "clip_obs": Setting("float", gt=0),
    "clip_reward": Setting("float", gt=0),
}
CURVES: dict[str, Setting] = {
    "hindsight_sims": Setting("int", ge=0, le=10_000),  # the learning curve's hindsight line (0: none)
}
INPUT_BASELINE: dict[str, Setting] = {
    "group_size": Setting("int", ge=2, le=256),  # envs per workload (agents/input_baseline.py)
}
BEHAVIOUR_CLONING: dict[str, Setting] = {
    "from": Setting("str", nullable=True),
    "episodes": Setting("int", ge=1),
    "epochs": Setting("int", ge=1),
}


MAX_WIDTH = 4096
"""Widest layer a policy network may have (``net_arch``, the features extractor's sizes); the
project's recipes use 16-256. Checked before the network is built: a width of 10^9 would try to
allocate terabytes."""
MAX_LAYERS = 16
"""Most layers in one list of layer widths."""


def check_network_sizes(path: str, value: Any) -> None:
    """Every integer in ``policy_kwargs`` (layer widths and sizes, nested in lists and mappings) is
    at most :data:`MAX_WIDTH`, and every list of them has at most :data:`MAX_LAYERS` entries."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            check_network_sizes(f"{path}.{_name(str(k))}", v)
    elif isinstance(value, list | tuple):
        if len(value) > MAX_LAYERS:
            raise ConfigError(f"{path}: {len(value)} layers; at most {MAX_LAYERS}")
        for i, v in enumerate(value):
            check_network_sizes(f"{path}[{i}]", v)
    elif isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_) and value > MAX_WIDTH:
        raise ConfigError(f"{path}: a layer of {int(value):,} units (about {4 * int(value) ** 2 / 2**30:.3g} GiB of "
                          f"weights from one such layer to the next); at most {MAX_WIDTH:,}")


def check_hyperparams(entry: Any, path: str = "hyperparams") -> dict[str, Any]:
    """A checked copy of a hyperparameter entry (every key optional)."""
    scheduled = {}
    if isinstance(entry, Mapping):
        scheduled = {k: v for k, v in entry.items()
                     if k in LINEAR_SCHEDULE_KEYS and isinstance(v, str) and v.startswith("lin_")}
        entry = {k: v for k, v in entry.items() if k not in scheduled}
    for key, value in scheduled.items():
        ok, start = _as_kind("float", parse_value(value[4:]))
        if not ok or start <= 0:
            raise ConfigError(f"{path}.{key}: expected {HYPERPARAMS[key].allowed()} or lin_START (a linear decay "
                              f"from START > 0), got {value!r}")
    out = {**check_section(path, entry, HYPERPARAMS), **scheduled}
    if "policy_kwargs" in out:
        check_network_sizes(f"{path}.policy_kwargs", out["policy_kwargs"])
    if "normalize" in out:
        out["normalize"] = check_section(f"{path}.normalize", out["normalize"], NORMALIZE)
    if "bc" in out:
        out["bc"] = check_section(f"{path}.bc", out["bc"], BEHAVIOUR_CLONING)
    for key, section in (("curves", CURVES), ("input_baseline", INPUT_BASELINE)):
        if key in out:
            out[key] = check_section(f"{path}.{key}", out[key], section)
    if "env_kwargs" in out and "overrides" in out["env_kwargs"]:
        ov = out["env_kwargs"]["overrides"]
        if not isinstance(ov, Mapping):
            raise ConfigError(f"{path}.env_kwargs.overrides: expected a mapping of --set keys, got {_show(ov)}")
    return out


# ---------------------------------------------------------------------------------------------
# --set overrides


MAX_YAML_NODES = 1_000_000
"""Most values a YAML document may expand to once its aliases (``*name``) are followed: a few
aliases nested ten deep (a "billion laughs") would otherwise make a small file expand beyond memory
wherever the configuration is walked."""
MAX_YAML_BYTES = 16 * 2**20
"""Largest YAML file read (scenarios, hyperparameters): a genuine one is a few kB."""


def _yaml_loader() -> type:
    """PyYAML's safe loader (the C one when built), stricter and closer to YAML 1.2:

    * ``1e-4`` reads as a float (YAML 1.1 wants ``1.0e-4``, so ``learning_rate: 1e-4`` would
      otherwise arrive as the string ``'1e-4'``);
    * only ``true``/``false`` (any case) are booleans: ``yes``, ``no``, ``on``, ``off`` stay strings, so
      ``prefill_emits_token: yes`` is an error naming the field instead of a silent ``true``;
    * a key given twice in one mapping is an error (:class:`ConfigError` naming the key and its
      line), not the first value silently dropped.
    """
    import re

    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    loader = type("Loader", (base,), {})
    loader.yaml_implicit_resolvers = {  # type: ignore[attr-defined]
        k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:bool"]
        for k, v in base.yaml_implicit_resolvers.items()}
    loader.add_implicit_resolver(  # type: ignore[attr-defined]
        "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
    loader.add_implicit_resolver(  # type: ignore[attr-defined]
        "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
        list("-+0123456789."))

    def construct_mapping(self: Any, node: Any, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # << : *base (merged by the base method)
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                raise ConfigError(f"line {key_node.start_mark.line + 1}: a mapping key must be a scalar, "
                                  f"got {_show(key)}") from None
            if key in seen:
                raise ConfigError(f"{_name(str(key))}: given twice in one mapping (lines {seen[key]} and "
                                  f"{key_node.start_mark.line + 1}); keep one")
            seen[key] = key_node.start_mark.line + 1
        return base.construct_mapping(self, node, deep)

    loader.construct_mapping = construct_mapping  # type: ignore[attr-defined]
    return loader


def _expanded_size(value: Any, limit: int) -> int:
    """How many values ``value`` holds once every shared (aliased) part is counted each time it
    appears; stops counting past ``limit``. Linear in the distinct objects (sizes are memoised)."""
    memo: dict[int, int] = {}

    def size(v: Any) -> int:
        if not isinstance(v, dict | list):
            return 1
        key = id(v)
        if key not in memo:
            memo[key] = limit + 1  # a cycle counts as too large
            items = v.values() if isinstance(v, dict) else v
            total = 1
            for x in items:
                total += size(x)
                if total > limit:
                    break
            memo[key] = min(total, limit + 1)
        return memo[key]

    return size(value)


_LOADER: type | None = None


def yaml_load(text: str) -> Any:
    """``yaml.safe_load`` with the stricter rules of :func:`_yaml_loader`, refusing a document that
    expands to more than :data:`MAX_YAML_NODES` values through its aliases."""
    import yaml

    global _LOADER
    if _LOADER is None:
        _LOADER = _yaml_loader()
    data = yaml.load(text, Loader=_LOADER)  # noqa: S506 (a SafeLoader subclass)
    if "*" in text and _expanded_size(data, MAX_YAML_NODES) > MAX_YAML_NODES:
        raise ConfigError(f"YAML: its aliases (*name) expand to more than {MAX_YAML_NODES:,} values; write the "
                          "values out or use fewer nested aliases")
    return data


def parse_value(text: str) -> Any:
    """Parse a ``--set`` value as a YAML scalar: numbers (``1e-4`` too), booleans, null, lists;
    anything else stays the string it was."""
    import yaml

    try:
        return yaml_load(text)
    except yaml.YAMLError:
        return text


def parse_sets(items: Iterable[str] | None, flag: str = "--set") -> dict[str, Any]:
    """``KEY=VALUE`` strings to a dict, values parsed by :func:`parse_value`.

    >>> parse_sets(["engine.block_size=16", "engine.overflow=forbid"])
    {'engine.block_size': 16, 'engine.overflow': 'forbid'}
    """
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{flag} {_name(item)}: expected KEY=VALUE")
        out[key.strip()] = parse_value(value)
    return out


def split_policy_sets(sets: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(scenario overrides, policy parameters)``: ``policy.X`` keys become parameter ``X``."""
    policy = {k.split(".", 1)[1]: v for k, v in sets.items() if k.startswith("policy.")}
    rest = {k: v for k, v in sets.items() if not k.startswith("policy.")}
    return rest, policy


SECTIONS = ("workload", "engine", "latency", "policy", "cluster", "description", "paper", "slo")


def apply_overrides(spec: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """Set dotted keys (``engine.block_size``) in a copy of ``spec``.

    String values are parsed as by ``--set``. ``engine.X`` must name an engine field; a key may
    only descend into a mapping (``engine.block_size.x`` is an error), except that
    ``policy.X`` turns a policy name into ``{"name": NAME, "X": value}``.

    :raises ConfigError: naming the key.
    """
    if not isinstance(spec, Mapping):
        raise ConfigError(f"scenario: expected a mapping with {', '.join(SCENARIO)}, got {_show(spec)}")
    out = copy.deepcopy(dict(spec))
    if overrides is not None and not isinstance(overrides, Mapping):
        raise ConfigError(f"overrides: expected a mapping of dotted keys to values, got {_show(overrides)}")
    for key, value in (overrides or {}).items():
        if not isinstance(key, str) or not key or any(not p for p in key.split(".")):
            raise ConfigError(f"overrides: {_show(key)} is not a dotted key like engine.block_size")
        if isinstance(value, str):
            value = parse_value(value)
        name = _name(key)
        parts = key.split(".")
        if parts[0] not in SECTIONS:
            raise ConfigError(f"{name}: unknown section {parts[0]!r}; allowed: {', '.join(SECTIONS)}")
        if parts[0] == "engine" and (len(parts) != 2 or parts[1] not in ENGINE):
            raise ConfigError(f"{name}: unknown engine field; allowed: {', '.join('engine.' + f for f in ENGINE)}")
        if parts[0] in ("description", "paper") and len(parts) != 1:
            raise ConfigError(f"{name}: {parts[0]} is a string, not a section")
        node: Any = out
        for i, p in enumerate(parts[:-1]):
            child = node.get(p)
            if child is None:
                child = node[p] = {}
            elif isinstance(child, str) and i == 0 and p == "policy":
                child = node[p] = {"name": child}
            elif not isinstance(child, dict):
                where = ".".join(parts[: i + 1])
                raise ConfigError(f"{name}: {_name(where)} is {_show(child)}, not a section; set {where}=VALUE instead")
            node = child
        node[parts[-1]] = value
    return out


def explicit_engine_keys(overrides: Mapping[str, Any] | None) -> set[str]:
    """Engine fields set explicitly by ``overrides`` (``engine.X`` keys)."""
    return {k.split(".", 1)[1] for k in (overrides or {}) if isinstance(k, str) and k.startswith("engine.")}


def merge_engine_overrides(engine: Mapping[str, Any], policy_overrides: Mapping[str, Any] | None,
                           explicit: Iterable[str] = ()) -> dict[str, Any]:
    """The engine fields a run uses: the scenario's, then the policy's ``engine_overrides``
    (:attr:`~llmsched_gym.core.scheduler.Scheduler.engine_overrides`, e.g. vLLM's LIFO preemption
    with recompute), except the fields the user set explicitly (``--set engine.X``), which win."""
    keep = set(explicit)
    merged = dict(engine)
    merged.update({k: v for k, v in (policy_overrides or {}).items() if k not in keep})
    return merged


# ---------------------------------------------------------------------------------------------
# files the user names


def read_text_bounded(path: str | os.PathLike[str], what: str, limit: int, encoding: str = "utf-8-sig") -> str:
    """The text of a regular file of at most ``limit`` bytes; anything else (a missing file, a folder,
    a device such as ``/dev/zero``, a larger file, undecodable bytes) is one ConfigError line naming
    ``what`` and the file. Symbolic links are followed (to a regular file)."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise ConfigError(f"{what}: {p}: no such file") from None
    except OSError as e:
        raise ConfigError(f"{what}: {p}: {e.strerror}") from None
    import stat

    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{what}: {p}: is a directory, expected a file")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{what}: {p}: not a regular file (a device or pipe is never read)")
    if st.st_size > limit:
        raise ConfigError(f"{what}: {p}: {st.st_size:,} bytes, more than the {limit:,} this file may have")
    try:
        with p.open("rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise ConfigError(f"{what}: {p}: {e.strerror}") from None
    if len(data) > limit:
        raise ConfigError(f"{what}: {p}: more than the {limit:,} bytes this file may have")
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what}: {p}: not UTF-8 text (byte {e.start})") from None


def load_yaml(path: str | os.PathLike[str], what: str) -> Any:
    """The parsed YAML of ``path`` (:func:`yaml_load`'s rules, at most :data:`MAX_YAML_BYTES`); a
    missing file, undecodable bytes, a duplicated key or a syntax error is one ConfigError line
    naming ``what``, the file and (for a syntax error) the line."""
    import yaml

    p = Path(path)
    text = read_text_bounded(p, what, MAX_YAML_BYTES)
    try:
        return yaml_load(text)
    except ConfigError as e:
        raise ConfigError(f"{what}: {p}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise ConfigError(f"{what}: {p}:{where}: YAML syntax error ({problem})") from None
    except RecursionError:
        raise ConfigError(f"{what}: {p}: nested too deeply") from None


def _first_existing(p: Path) -> Path:
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _probe_writable(d: Path) -> bool:
    """Whether a file can be created in folder ``d`` (tried, then removed: ``os.access`` says yes to
    root even on a read-only file system or ``/proc``)."""
    import tempfile

    try:
        with tempfile.TemporaryFile(dir=d, prefix=".llmsched-probe-"):
            return True
    except OSError:
        return False


def _check_parent(p: Path, flag: str) -> None:
    anc = _first_existing(p.parent if str(p.parent) else Path("."))
    if not anc.is_dir():
        raise ConfigError(f"{flag}: {p}: {anc} is a file, not a directory")
    if not os.access(anc, os.W_OK | os.X_OK) or not _probe_writable(anc):
        raise ConfigError(f"{flag}: {p}: {anc} is not writable")


def check_output_file(path: str | os.PathLike[str] | None, flag: str) -> None:
    """Raise ConfigError unless ``path`` can be written as a file (before a run, not after it):
    it must not be a directory or a dangling symbolic link, a relative path must not lead outside
    the working folder through a symbolic link, and the folder it goes into (its nearest existing
    ancestor) must be writable: a file is created there and removed to make sure."""
    if path is None:
        return
    p = Path(path)
    if p.is_symlink() and not p.exists():
        raise ConfigError(f"{flag}: {p} is a symbolic link to {os.readlink(p)}, which does not exist")
    if p.is_dir():
        raise ConfigError(f"{flag}: {p} is a directory, expected a file path")
    if p.exists() and not p.is_file():
        raise ConfigError(f"{flag}: {p} is not a regular file (a device or pipe is never written)")
    if p.exists() and not os.access(p, os.W_OK):
        raise ConfigError(f"{flag}: {p} exists and is not writable")
    _check_relative(p, flag)
    _check_parent(p.resolve(), flag)


def _check_relative(p: Path, flag: str) -> None:
    """A relative output path must stay, with symbolic links followed, inside the working folder: a
    link planted in a shared folder (``out/link -> /elsewhere``) would otherwise redirect the write.
    An absolute path is taken as the user typed it."""
    if p.is_absolute():
        return
    resolved, cwd = p.resolve(), Path.cwd().resolve()
    if not resolved.is_relative_to(cwd):
        raise ConfigError(f"{flag}: {p} leads to {resolved} through a symbolic link, outside the working folder "
                          f"{cwd}; give that absolute path if it is meant")


MAX_SCANNED = 100_000
"""Most entries of an existing output folder :func:`check_output_dir` inspects for symbolic links."""


def _escaping_link(root: Path) -> tuple[Path, Path] | None:
    """The first symbolic link under ``root`` (an existing folder) that resolves outside it, with its
    target; ``None`` when every link stays inside."""
    top = root.resolve()
    seen = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            seen += 1
            if seen > MAX_SCANNED:
                return None
            q = Path(dirpath) / name
            if q.is_symlink():
                target = q.resolve()
                if not target.is_relative_to(top):
                    return q, target
    return None


def check_output_dir(path: str | os.PathLike[str] | None, flag: str) -> None:
    """Raise ConfigError unless ``path`` is, or can be created as, a writable directory (a file is
    created and removed to make sure) in which nothing already there leads outside: a symbolic link
    inside it that resolves elsewhere would make the run write there."""
    if path is None:
        return
    p = Path(path)
    if p.is_symlink() and not p.exists():
        raise ConfigError(f"{flag}: {p} is a symbolic link to {os.readlink(p)}, which does not exist")
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{flag}: {p} is a file, expected a directory")
    _check_relative(p, flag)
    if p.exists():
        if not os.access(p, os.W_OK | os.X_OK) or not _probe_writable(p):
            raise ConfigError(f"{flag}: {p} is not writable")
        link = _escaping_link(p)
        if link is not None:
            raise ConfigError(f"{flag}: {link[0]} is a symbolic link to {link[1]}, outside {p}; outputs are written "
                              "only inside the output folder")
        return
    _check_parent(p.absolute(), flag)


SAFE_NAME = r"[A-Za-z0-9][A-Za-z0-9._+=@,-]{0,127}"
"""A run name (``--name``): letters, digits and ``. _ + = @ , -``, starting with a letter or digit, at
most 128 characters; one folder name, never a path, a hidden name or a control character."""


def check_run_name(name: str | None, flag: str = "--name") -> None:
    """A run name matches :data:`SAFE_NAME`, so ``OUT/NAME`` is one plain folder inside ``OUT``."""
    import re

    if name is None:
        return
    if not isinstance(name, str) or not re.fullmatch(SAFE_NAME, name):
        raise ConfigError(f"{flag}: {_show(name)} must be a plain folder name: letters, digits and . _ + = @ , - "
                          "(starting with a letter or digit, at most 128 characters; no '/', '..' or absolute path)")


def safe_run_name(text: str) -> str:
    """``text`` (a default run name built from a scenario, which may be a file path or
    ``trace:FORMAT:PATH``) made a :data:`SAFE_NAME`: every other character becomes ``_``.

    >>> safe_run_name("trace:csv:../t.csv-select-s0")
    'trace_csv_.._t.csv-select-s0'
    """
    import re

    name = re.sub(r"[^A-Za-z0-9._+=@,-]", "_", text).lstrip("._-+=@,")[:128]
    return name or "run"


def run_folder(out: str | os.PathLike[str], name: str, flag: str = "--name") -> Path:
    """``OUT/NAME``, checked before anything is written: the name is safe (:func:`check_run_name`),
    the folder, with symbolic links followed, lies inside ``OUT`` (a link at ``OUT/NAME`` pointing
    elsewhere is refused), and it is writable (:func:`check_output_dir`)."""
    check_run_name(name, flag)
    check_output_dir(out, "--out")
    root = Path(out)
    run_dir = root / name
    resolved, top = run_dir.resolve(), root.resolve()
    if not resolved.is_relative_to(top) or resolved == top:
        raise ConfigError(f"{flag}: {run_dir} resolves to {resolved}, outside --out {top} (a symbolic link?); "
                          "outputs are written only inside the output folder")
    check_output_dir(run_dir, flag)
    return run_dir


def check_distinct(outputs: Mapping[str, str | os.PathLike[str] | None]) -> None:
    """Refuse two output flags naming one file (symbolic links followed): the second would overwrite
    the first. ``outputs`` maps each flag to its path (``None``: not given)."""
    seen: dict[Path, str] = {}
    for flag, path in outputs.items():
        if path is None:
            continue
        key = Path(path).resolve()
        if key in seen:
            raise ConfigError(f"{flag}: {path} is the file {seen[key]} writes too; give each output its own path")
        seen[key] = flag


__all__ = [
    "CLUSTER", "ENGINE", "HYPERPARAMS", "MAX_LAYERS", "MAX_REPLICAS", "REPLICA", "MAX_REQUESTS", "MAX_WIDTH", "OVERFLOW_HANDLERS", "PREEMPT_MODES", "SCENARIO", "WORKLOAD", "ConfigError", "Setting",
    "MAX_YAML_BYTES", "MAX_YAML_NODES", "SAFE_NAME", "apply_overrides", "check_cluster", "check_distinct", "check_engine", "check_network_sizes", "check_hyperparams", "check_output_dir", "check_output_file",
    "check_run_name", "check_scenario", "check_section", "coerce_like", "explicit_engine_keys", "load_yaml",
    "merge_engine_overrides", "parse_sets", "parse_value", "read_text_bounded", "run_folder", "safe_run_name",
    "single_engine", "split_policy_sets", "yaml_load",
]
