"""Scenarios: a workload spec, engine settings and a batch-time model, as plain data (YAML).

A scenario is a mapping with four sections, and a fifth for a cluster::

    workload:  the spec of :func:`llmsched_gym.core.workload.build_workload` (or ``explicit``
               arrays for hand-made instances)
    engine:    fields of :class:`llmsched_gym.core.engine.EngineConfig`
    latency:   a :func:`llmsched_gym.core.latency.make_latency` spec
    policy:    the default policy name (``--policy`` overrides it)
    cluster:   optional: N replicas of that engine behind a router
               (:func:`llmsched_gym.config.check_cluster`; run by ``llmsched cluster run`` and
               :func:`llmsched_gym.cluster_sim.simulate_cluster`, refused by the one-engine paths)

plus ``description`` and ``paper`` (where it comes from). The built-in scenarios are the YAML files
in ``llmsched_gym/scenarios/``; ``llmsched list --scenario NAME --show`` prints one to start from,
and ``--scenario my.yml`` (or ``gymnasium.make(..., scenario="my.yml")``) runs a file with the same
schema, checked by :func:`llmsched_gym.config.check_scenario`. Override any leaf with a dotted key
(``--set workload.n_requests=500 --set engine.kv_capacity_tokens=20000``); values are parsed as
YAML scalars. ``--scenario trace:azure:PATH`` (or ``trace:vtc:``, ``trace:csv:``, ``trace:jsonl:``,
``trace:sharegpt:``) runs a trace file on the ``azure-conv`` engine settings and predictor.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import numpy as np

from llmsched_gym.config import (
    ConfigError,
    apply_overrides,
    check_scenario,
    load_yaml,
    single_engine,
    yaml_load,
)
from llmsched_gym.core.engine import EngineConfig
from llmsched_gym.core.latency import LatencyModel, make_latency
from llmsched_gym.core.request import Workload, WorkloadError

SCENARIO_DIR = Path(__file__).resolve().parent.parent / "scenarios"
SCENARIO_SUFFIXES = (".yml", ".yaml")
SCENARIOS: dict[str, dict[str, Any]] = {
    p.stem: yaml_load(p.read_text(encoding="utf-8")) for p in sorted(SCENARIO_DIR.glob("*.yml"))
}
"""The built-in scenarios by name (``llmsched_gym/scenarios/NAME.yml``)."""
DEFAULT_SCENARIO = "azure-conv"
_FIELD_FIRST = re.compile(r"^[A-Za-z_][\w.\[\]]*: ")


class ScenarioError(ConfigError):
    """Unknown scenario or bad scenario field."""


def list_scenarios() -> dict[str, str]:
    return {k: v["description"] for k, v in SCENARIOS.items()}


def load_scenario_file(path: str | Path) -> dict[str, Any]:
    """A scenario from a YAML file (the schema of the built-in ones); its name is the file's stem
    unless the file sets ``name``."""
    spec = load_yaml(path, "scenario")
    if not isinstance(spec, dict):
        raise ScenarioError(f"scenario: {path}: expected a mapping with workload, engine, latency, policy, "
                            f"got {type(spec).__name__}")
    return {"name": Path(path).stem, **spec}


def get_scenario(name: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The checked scenario dict for ``name`` (a built-in name, a ``.yml`` file or
    ``trace:FORMAT:PATH``), with dotted ``overrides`` applied.

    :raises ConfigError: on an unknown name, an unreadable file or any field that fails the schema.
    """
    if not isinstance(name, str):
        raise ScenarioError(f"scenario: expected a name (llmsched list), a .yml file or a mapping, got {name!r}")
    if name.startswith("trace:"):
        try:
            _, fmt, path = name.split(":", 2)
        except ValueError:
            raise ScenarioError(f"scenario: {name!r} should look like trace:FORMAT:PATH") from None
        base = copy.deepcopy(SCENARIOS[DEFAULT_SCENARIO])
        base["description"] = f"{fmt} trace {path} on the {DEFAULT_SCENARIO} engine settings"
        # the trace replaces the requests; the predictor (the information model) stays azure-conv's
        base["workload"] = {"trace": {"format": fmt, "path": path}, **{
            k: v for k, v in base["workload"].items() if k == "predictor"}}
        spec = base
    elif name in SCENARIOS:
        spec = SCENARIOS[name]
    elif name.endswith(SCENARIO_SUFFIXES):
        spec = load_scenario_file(name)
    else:
        raise ScenarioError(
            f"scenario: unknown {name!r}; allowed: {', '.join(SCENARIOS)}, a .yml file or trace:FORMAT:PATH"
        )
    spec = check_scenario(apply_overrides(spec, overrides))
    spec.setdefault("name", name)
    return spec


def resolve_scenario(scenario: str | dict[str, Any], overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """:func:`get_scenario` for a name or file, or a checked copy of a scenario mapping (named
    ``custom`` unless it has a name), with ``overrides`` applied."""
    if isinstance(scenario, str):
        return get_scenario(scenario, overrides)
    if not isinstance(scenario, dict):
        raise ScenarioError(f"scenario: expected a name (llmsched list), a .yml file or a mapping, "
                            f"got {scenario!r}")
    spec = check_scenario(apply_overrides(scenario, overrides))
    spec.setdefault("name", "custom")
    return spec


class _Block(dict):
    """A mapping written in block style (the top level and the sections)."""


def _leaf(v: Any) -> bool:
    """A plain value or a (nested) list of plain values: written on one line."""
    return not isinstance(v, dict | list) or (isinstance(v, list) and all(_leaf(x) for x in v))


def _flat(v: Any) -> bool:
    """A plain value or a list of plain values: a mapping of these is written on one line."""
    return not isinstance(v, dict | list) or (isinstance(v, list) and not any(isinstance(x, dict | list) for x in v))


def scenario_yaml(spec: dict[str, Any]) -> str:
    """``spec`` as a YAML scenario file (what ``llmsched list --scenario NAME --show`` prints):
    sections in block style, mappings and lists of plain values on one line, long text folded.
    Loading the text gives ``spec`` back (without its ``name``, which a file takes from its stem)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(_Block, lambda d, m: d.represent_mapping("tag:yaml.org,2002:map", m.items(), False))
    Dumper.add_representer(dict, lambda d, m: d.represent_mapping("tag:yaml.org,2002:map", m.items(),
                                                                  all(_flat(v) for v in m.values())))
    Dumper.add_representer(list, lambda d, x: d.represent_sequence("tag:yaml.org,2002:seq", x, _leaf(x)))
    Dumper.add_representer(str, lambda d, t: d.represent_scalar("tag:yaml.org,2002:str", t,
                                                                ">" if len(t) > 80 else None))
    body = _Block({k: _Block(v) if isinstance(v, dict) else v for k, v in spec.items() if k != "name"})
    return yaml.dump(body, Dumper=Dumper, sort_keys=False, width=100, allow_unicode=True)


def build_scenario(spec: dict[str, Any], seed: int, checked: bool = False) -> tuple[Workload, EngineConfig,
                                                                                   LatencyModel]:
    """Materialise a scenario dict into a workload, an engine config and a latency model.

    :param checked: ``spec`` comes from :func:`resolve_scenario` or :func:`get_scenario` (or
        :func:`~llmsched_gym.config.check_scenario`) unchanged since: it is not checked again, and
        its engine section becomes an :class:`EngineConfig` marked as checked (the engine does
        not check it again either).
    """
    from llmsched_gym.core.workload import build_workload

    if not checked:
        spec = check_scenario(spec)
    single_engine(spec)  # a cluster runs through llmsched_gym.cluster_sim, which takes its section off
    wspec = spec["workload"]
    try:
        if "explicit" in wspec:
            from llmsched_gym.core.workload import explicit_workload

            workload = explicit_workload(wspec["explicit"])
            if "predictor" in wspec:  # a hand-made instance under another information model
                workload = _explicit_predictor(workload, wspec["predictor"], seed)
        else:
            workload = build_workload(wspec, seed)
    except WorkloadError as e:
        # build_workload names the field inside the section (arrival.rate); say which section
        raise WorkloadError(f"workload.{e}" if _FIELD_FIRST.match(str(e)) else str(e)) from None
    config = EngineConfig.checked(spec.get("engine", {}))
    try:
        latency = make_latency(spec.get("latency", "unit"))
    except ValueError as e:  # make_latency's messages name the field; make them the project's error type
        raise ConfigError(str(e)) from None
    return workload, config, latency


def _explicit_predictor(workload: Workload, spec: Any, seed: int) -> Workload:
    """``workload.predictor`` beside ``explicit`` arrays: the predictor's lengths replace any
    explicit ``predicted_output`` and its information model goes into ``meta``."""
    from llmsched_gym.core.information import information_of_predictor
    from llmsched_gym.core.workload.predictors import _PREDICTORS, predict
    from llmsched_gym.core.workload.spec import _field, _typed

    kind, p = _typed(spec, "predictor", _PREDICTORS)
    with _field("predictor"):
        pred = predict(workload, kind, np.random.default_rng([seed, 0x9E37]), **p)
    out = workload.with_(predicted_output=pred)
    out.meta = {**workload.meta, "information": information_of_predictor(kind)}
    return out


__all__ = [
    "DEFAULT_SCENARIO", "SCENARIOS", "ScenarioError", "WorkloadError", "build_scenario", "get_scenario",
    "list_scenarios",
]
