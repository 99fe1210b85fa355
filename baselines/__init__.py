"""Reference scheduling policies: one file per policy family, all implementing the engine's
:class:`~llmsched_gym.core.scheduler.Scheduler`. ``make_policy(name, **params)`` builds one.

:data:`POLICIES` is the catalogue: each name's ``module:Class`` and its parameters with their
defaults. ``available()``, ``policy_params()`` and ``llmsched list`` read only the catalogue; a
policy's module is imported when the policy is built, so a run imports the one it uses (and not,
say, scipy for Echo's estimator fit). A new baseline costs one file and one line here; a test
checks that every line matches its class. Policies registered with ``@register`` outside this
package (plug-ins) are available too, once their module is imported.
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple

from .base import REGISTRY, NotApplicable, PolicyError, check_applicable, policy_label, register


class PolicyEntry(NamedTuple):
    """Where a policy lives (``module:Class`` in this package) and its parameters' defaults."""

    target: str
    params: dict[str, Any]


_ECHO = {"max_prefills": 0, "max_batched_tokens": 8192, "max_num_seqs": 256, "chunk_size": 0}
_ECHO_E = {**_ECHO, "estimator": "paper", "deadline": "separate"}
_ECHO_S = {**_ECHO_E, "max_prefills": 1, "benefit_cached": True, "max_moves": 0, "candidates": 32, "bucket_base": 256}
_PREFIX = {"memory": "reserve", "max_batch": 0, "max_prefill_tokens": 0}
_LPM = {**_PREFIX, "ties": "random", "hit_metric": "absolute"}
_FAIR = {"admit_every": 10, "memory": "reserve", "batch_max_tokens": -1, "max_running": 1000}
_COUNTER = {**_FAIR, "w_p": 1.0, "w_q": 2.0, "cost": "linear", "charge_recompute": False}
_VTC = {**_COUNTER, "lift_when_idle": True}
_MCSF = {"on_fail": "break", "oracle": False}
_SJF = {"admission": "peak", "max_num_seqs": 0, "oracle": False}

POLICIES: dict[str, PolicyEntry] = {
    "fcfs": PolicyEntry("fcfs:FCFS", {"admission": "fit", "max_batch": 0}),
    "vllm-v1": PolicyEntry("vllm:VLLMV1", {"max_num_batched_tokens": 8192, "max_num_seqs": 256,
                                           "long_prefill_token_threshold": 0, "watermark": 0.01}),
    "vllm-v0": PolicyEntry("vllm:VLLMV0", {"max_num_batched_tokens": 4096, "max_num_seqs": 256, "watermark": 0.01}),
    "sarathi": PolicyEntry("sarathi:Sarathi", {"chunk_size": 512, "max_num_seqs": 128, "watermark": 0.01}),
    "static": PolicyEntry("static:Static", {"order": "fcfs", "chunk_size": 512, "max_num_seqs": 128, "quantum": 1,
                                            "watermark": 0.01, "prompt_weight": 0.0}),
    "mcsf": PolicyEntry("mcsf:MCSF", _MCSF),
    "semi-online": PolicyEntry("mcsf:SemiOnline", _MCSF),
    "sjf": PolicyEntry("sjf:SJF", _SJF),
    "srpt": PolicyEntry("sjf:SRPT", {**_SJF, "preemptive": True}),
    "alpha-greedy": PolicyEntry("alpha_protection:AlphaGreedy", {"alpha": 0.25}),
    "alpha-beta": PolicyEntry("alpha_protection:AlphaBeta", {"alpha": 0.2, "beta": 0.1}),
    "wait": PolicyEntry("wait:WAIT", {"rule": "fluid", "c": 0.0, "batch_size": 256, "thresholds": [], "rates": []}),
    "fcfs-greedy-lifo": PolicyEntry("wait:FCFSGreedyLIFO", {}),
    "nested-wait": PolicyEntry("nested_wait:NestedWAIT", {"rule": "ratio", "batch_size": 256, "gamma": 1.0,
                                                          "slack": 0.1, "delta": 0.01, "thresholds": [],
                                                          "boundaries": [], "width": 0, "segments": 0}),
    "echo-bs": PolicyEntry("echo:EchoBS", _ECHO),
    "echo-bs-e": PolicyEntry("echo:EchoBSE", _ECHO_E),
    "echo-bs-e-s": PolicyEntry("echo:EchoBSES", _ECHO_S),
    "echo": PolicyEntry("echo:Echo", {**_ECHO_S, "window_s": 3600.0, "k_sigma": 2.0}),
    "lpm": PolicyEntry("klpm:LPM", _LPM),
    "k-lpm": PolicyEntry("klpm:KLPM", {**_LPM, "k": 2, "reset_on_empty": False}),
    "sglang-lpm": PolicyEntry("klpm:SGLangLPM", {**_PREFIX, "fcfs_above": 128, "in_batch_threshold": 32}),
    "vtc": PolicyEntry("vtc:VTC", _VTC),
    "vtc-weighted": PolicyEntry("vtc:WeightedVTC", {**_VTC, "weights": None}),
    "vtc-predict": PolicyEntry("vtc:PredictVTC", {**_VTC, "predictor": "last5", "noise": 0.5}),
    "vtc-oracle": PolicyEntry("vtc:OracleVTC", _VTC),
    "lcf": PolicyEntry("vtc:LCF", _COUNTER),
    "drr": PolicyEntry("vtc:DRR", {**_COUNTER, "quantum": 512.0}),
    "rpm": PolicyEntry("vtc:RPM", {**_FAIR, "limit": 5, "window_s": 60.0, "window": "sliding"}),
}


def available() -> list[str]:
    """Every policy name: the catalogue's and any plug-in's registered since."""
    return sorted(set(POLICIES) | set(REGISTRY))


def _unknown(name: Any) -> PolicyError:
    return PolicyError(f"policy: unknown {name!r}; allowed: {', '.join(available())}")


def policy_params(name: str) -> dict[str, Any]:
    """The parameters ``name`` accepts, with their defaults (imports nothing for a catalogued policy)."""
    if name in POLICIES:
        return dict(POLICIES[name].params)
    if name in REGISTRY:
        return dict(REGISTRY[name].params)
    raise _unknown(name)


def policy_class(name: str) -> type:
    """The Scheduler class of ``name``, importing its module on first use."""
    if name not in REGISTRY:
        if not isinstance(name, str) or name not in POLICIES:
            raise _unknown(name)
        module, _, cls = POLICIES[name].target.partition(":")
        importlib.import_module(f"{__name__}.{module}")
        if name not in REGISTRY:
            raise PolicyError(f"policy {name!r}: {POLICIES[name].target} did not register it")
    return REGISTRY[name]


def make_policy(name: str, **params: Any):
    """Build the policy ``name`` with ``params`` (unknown names and bad values: PolicyError)."""
    return policy_class(name)(**params)


def _split_params(text: str) -> list[str]:
    """``k=v,k=[1,2],k=v`` split at the commas outside brackets and braces."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def parse_spec(spec: str | dict[str, Any], flag: str = "policy") -> str | dict[str, Any]:
    """A policy spec as every command takes it: ``NAME`` or ``NAME:key=value,key=value`` (values
    parsed as ``--set`` values: ``sarathi:chunk_size=256``, ``wait:thresholds=[1,2]``), or a dict
    ``{"name": NAME, **params}`` (returned as a copy).

    :returns: ``NAME`` when there are no parameters, else ``{"name": NAME, **params}``.
    :raises PolicyError: a malformed spec (one line starting with ``flag``).
    """
    if isinstance(spec, dict):
        if not isinstance(spec.get("name"), str):
            raise PolicyError(f"{flag}: expected {{'name': NAME, ...}}, got {spec!r}")
        return dict(spec)
    if not isinstance(spec, str) or not spec.strip():
        raise PolicyError(f"{flag}: expected NAME or NAME:key=value,..., got {spec!r}")
    from llmsched_gym.config import ConfigError, parse_sets

    name, sep, params = spec.strip().partition(":")
    if not sep:
        return name
    try:
        parsed = parse_sets(_split_params(params), f"{flag} {spec.strip()!r}:")
    except ConfigError as e:
        raise PolicyError(str(e)) from None
    return {"name": name.strip(), **parsed} if parsed else name.strip()


def validate_spec(spec: str | dict[str, Any], flag: str = "policy") -> str | dict[str, Any]:
    """:func:`parse_spec`, then build the policy once, so an unknown name, an unknown parameter or
    a bad value fails here, in one line, before any run starts.

    >>> validate_spec("sarathi:chunk_size=256")
    {'name': 'sarathi', 'chunk_size': 256}

    :raises PolicyError: ``--policy 'sarathi:chunksize=256': policy.chunksize: unknown parameter
        of 'sarathi'; allowed: chunk_size, max_num_seqs, watermark``.
    """
    parsed = parse_spec(spec, flag)
    name, params = (parsed, {}) if isinstance(parsed, str) else (parsed["name"], {k: v for k, v in parsed.items()
                                                                                 if k != "name"})
    try:
        make_policy(name, **params)
    except PolicyError as e:
        raise PolicyError(f"{flag} {_show(spec)}: {e}") from None
    return parsed


def _show(spec: str | dict[str, Any]) -> str:
    return repr(spec) if isinstance(spec, str) else repr(spec.get("name", spec))


def applicable(policy_spec: Any, information: str) -> tuple[bool, str]:
    """Whether a policy can run on a task with the information model ``information``
    (``clairvoyant``, ``predicted`` or ``blind``), and if not the one-line reason, without
    running it (the benchmark lists not-applicable entrants this way).

    :param policy_spec: a name (``"sjf"``), ``"NAME:key=value,..."``, ``{"name": ..., **params}``
        or a built Scheduler.
    :returns: ``(True, "")`` or ``(False, "sjf needs output-length predictions; the task is blind")``.
    :raises PolicyError: on an unknown policy or a bad parameter.
    """
    from llmsched_gym.core.scheduler import Scheduler

    if isinstance(policy_spec, Scheduler):
        policy = policy_spec
    else:
        policy_spec = parse_spec(policy_spec)
        if isinstance(policy_spec, dict):
            params = dict(policy_spec)
            policy = make_policy(params.pop("name"), **params)
        else:
            policy = make_policy(policy_spec)
    try:
        check_applicable(policy, information)
    except NotApplicable as e:
        return False, str(e)
    return True, ""


__all__ = ["POLICIES", "REGISTRY", "NotApplicable", "PolicyEntry", "PolicyError", "applicable", "available",
           "check_applicable", "make_policy", "parse_spec", "policy_class", "policy_label", "policy_params", "register",
           "validate_spec"]
