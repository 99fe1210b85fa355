"""The latency-model interface, :class:`LatencyModel`, and the registry of spec kinds behind
:func:`make_latency`.

Every kind of spec (``unit``, ``linear``, ..., ``vidur``, a plug-in's ``gpu``) is registered with
:func:`register_latency` by the module that defines its model: the built-in ones by the modules of
this package, ``vidur``/``profile`` by :mod:`llmsched_gym.core.profile`, ``gpu`` by
:mod:`llmsched_gym.backends.gpu`. This module imports none of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


class LatencyModel:
    """Base class: ``batch_time`` for one iteration, ``decode_times`` for many decode-only ones."""

    name = "base"

    def batch_time(
        self, prefill_tokens: int, prefill_ctx_tokens: int, n_prefill: int, n_decode: int, decode_ctx_tokens: int
    ) -> float:
        """Seconds (or rounds) one iteration of this shape takes."""
        raise NotImplementedError

    def decode_times(self, n_decode: int, decode_ctx_tokens: np.ndarray) -> np.ndarray:
        """``batch_time(0, 0, 0, n_decode, c)`` for every ``c`` in ``decode_ctx_tokens``, bit for bit."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"



LatencyFactory = Callable[[str], "LatencyModel | None"]
"""Builds a model from the text after ``KIND:`` (stripped; ``""`` when the spec is the bare kind), or
returns None when that text is not a spec of its kind (``make_latency`` then lists the allowed specs)."""
DictFactory = Callable[[dict[str, Any]], "LatencyModel | None"]
"""Builds a model from a dict spec's keys other than ``type`` (None: not a dict spec of its kind)."""


@dataclass(frozen=True)
class LatencyKind:
    """One registered spec kind: how to build it and what ``llmsched list`` shows for it."""

    factory: LatencyFactory
    listing: Mapping[str, str]
    from_dict: DictFactory | None = None


LATENCY_KINDS: dict[str, LatencyKind] = {}
"""Every spec kind ``make_latency`` knows, in registration order (built-ins first, then
:mod:`llmsched_gym.core.profile`'s and the plug-ins', e.g. ``gpu`` from
:mod:`llmsched_gym.backends.gpu`)."""


def register_latency(kind: str, factory: LatencyFactory, description: str, *,
                     listing: Mapping[str, str] | None = None, from_dict: DictFactory | None = None) -> None:
    """Let ``make_latency("KIND:ARGS")`` build a model: ``factory("ARGS")``.

    :param kind: the spec's prefix (case-insensitive); registering a kind again replaces it.
    :param factory: called with the text after ``KIND:``, stripped (``""`` for a bare ``KIND``);
        returns the model, or None when the text is not a spec of this kind.
    :param description: one line for ``llmsched list`` (listed as ``KIND:...``).
    :param listing: what ``llmsched list`` shows instead (named presets or a spec template -> a line each).
    :param from_dict: builds the model of a dict spec ``{"type": KIND, ...}`` from its other keys;
        without it a dict spec of this kind is an error.

    Core modules import no plug-in; a plug-in registers its kinds when its package is imported
    (``llmsched_gym`` imports its bundled back-ends).
    """
    LATENCY_KINDS[kind.lower()] = LatencyKind(factory, dict(listing or {f"{kind.lower()}:...": description}),
                                              from_dict)


def kv_args(text: str, allowed: Sequence[str], kind: str) -> dict[str, float]:
    """``key=value,...`` options of a spec, each a finite number; errors name the kind and the key."""
    out: dict[str, float] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in allowed:
            raise ValueError(f"latency: {kind} takes {', '.join(f'{a}=...' for a in allowed)}; got {item!r}")
        try:
            out[key] = float(value)
        except ValueError:
            raise ValueError(f"latency: {kind} {key}: expected a number, got {value.strip()!r}") from None
        if not math.isfinite(out[key]):
            raise ValueError(f"latency: {kind} {key}: expected a finite number, got {value.strip()!r}")
    return out


_ALLOWED = (
    "unit, linear[:d0=..,d1=..], piecewise[:c=..,a=..,b0=..], affine[:COEFF=..,...], "
    "roofline:MODEL/GPU[,mfu=..,mbu=..,overhead_s=..], calibrated:MODEL/GPU, vidur:GPU/MODEL[,tp=N], "
    "profile:PATH_OR_DIR[,tp=N], table:PATH, KIND:... of a plug-in (gpu), or a dict with 'type'"
)


def _from_dict(spec: Mapping[str, Any]) -> LatencyModel:
    args = dict(spec)
    kind = str(args.pop("type", ""))
    for key, value in args.items():  # a coefficient of 1e400 (inf) would turn every time into inf or nan
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"latency.{key}: expected a finite number, got {value!r}")
    entry = LATENCY_KINDS.get(kind)
    if entry is not None and entry.from_dict is not None:
        try:
            model = entry.from_dict(args)
        except TypeError as e:
            raise ValueError(f"latency: bad arguments for {kind!r}: {e}") from None
        if model is not None:
            return model
    raise ValueError(f"latency: unknown model {dict(spec)!r}; allowed: {_ALLOWED}")


def by_name(kind: str) -> DictFactory:
    """The dict form of a kind whose spec is a name plus options: ``{"type": KIND, "name": N, "k": v}``
    is ``KIND:N,k=v``."""
    def build(args: dict[str, Any]) -> LatencyModel | None:
        if "name" not in args:
            return None
        opts = "".join(f",{k}={v}" for k, v in args.items() if k != "name")
        return make_latency(f"{kind}:{args['name']}{opts}")
    return build


def make_latency(spec: str | Mapping[str, Any] | LatencyModel) -> LatencyModel:
    """Build a latency model from a spec string, a dict, or pass an instance through.

    Strings (case-insensitive except the path)::

        unit
        linear                                  linear:d0=0.01,d1=2.6e-7
        piecewise                               piecewise:c=0.01,a=8.6e-5,b0=96
        affine                                  affine:decode_base_s=0.02,decode_per_kv_s=1e-6
        roofline:llama-2-7b/a100                roofline:llama-3-8b/h100,mfu=0.6,overhead_s=0.002
        llama-2-7b/a100                         (same as roofline:llama-2-7b/a100)
        calibrated:llama-2-7b/a100              (vidur:a100/llama-2-7b's form, offline: the roofline
                                                 fitted to its measurements as the linear part)
        vidur:a100/llama-2-7b                   vidur:a100/llama-2-70b,tp=2
        profile:PATH/mlp.csv                    profile:PATH_DIR,tp=2,gpu=a100,overhead_s=0.001
        table:runs/profile/a100.csv
        gpu:llama-3-8b                          (a plug-in: times each batch on the local GPU; needs torch)

    Omitted keys keep the class defaults. Dicts use ``{"type": "linear", "d0": 0.01}``,
    ``{"type": "roofline", "model": "llama-3-8b", "gpu": "h100", "mfu": 0.6}``,
    ``{"type": "table", "path": ...}``. Every model's ``name`` is a spec that rebuilds it.
    """
    if isinstance(spec, LatencyModel):
        return spec
    if isinstance(spec, Mapping):
        return _from_dict(spec)
    if not isinstance(spec, str):
        raise ValueError(f"latency: expected a spec string, dict or LatencyModel, got {type(spec).__name__}")
    kind, _, rest = spec.strip().partition(":")
    kind = kind.lower()
    if kind not in LATENCY_KINDS and "/" in kind and not rest:  # MODEL/GPU: a roofline
        kind, rest = "roofline", kind
    entry = LATENCY_KINDS.get(kind)
    model = None if entry is None else entry.factory(rest.strip())
    if model is None:
        raise ValueError(f"latency: unknown model {spec!r}; allowed: {_ALLOWED}")
    return model


def list_latency_presets() -> dict[str, str]:
    """Named latency specs with a one-line description each (for ``llmsched list``)."""
    presets: dict[str, str] = {}
    for entry in LATENCY_KINDS.values():
        presets.update(entry.listing)
    return presets
