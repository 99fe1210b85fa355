"""Information models: what a scheduler may know about a request's output length.

A deployed server does not know how many tokens a request will generate. A scenario therefore
states what its policies (and the env's agent) may read, through its workload's ``predictor``:

==================  ======================  ================================================
information model   ``workload.predictor``  what policies read
==================  ======================  ================================================
``clairvoyant``     ``oracle`` (default)    the true output lengths (a paper's model that
                                            assumes known lengths, or an upper reference)
``predicted``       any other predictor     ``view.predicted_output``: a predictor with a
                                            stated error (``lognormal``, ``noisy``,
                                            ``bucketed``); the true lengths are hidden
``blind``           ``none``                no output-length information at all: prompt
                                            length, age, tokens generated so far, service
==================  ======================  ================================================

:func:`information_of` reads the model of a scenario, a workload spec or a built workload, and
every run summary carries it (``summary["information"]``). The engine enforces it: under
``predicted`` and ``blind`` a policy's ``view.workload`` is a :class:`GuardedWorkload` whose
``output_tokens`` raises :class:`InformationError`, and under ``blind`` ``view.predicted_output``
raises too. The engine itself, the metrics and the rewards keep the true lengths (they describe
what happened, not what a policy knew).

A policy declares what it reads with ``Scheduler.needs()`` (one of :data:`NEEDS`); a policy whose
need the task's model does not provide is not applicable there (:func:`reason_not_applicable`).
"""

from __future__ import annotations

from typing import Any

from llmsched_gym.config import ConfigError

CLAIRVOYANT, PREDICTED, BLIND = "clairvoyant", "predicted", "blind"
INFORMATION_MODELS = (CLAIRVOYANT, PREDICTED, BLIND)
"""The three information models, from most to least informed."""

NEEDS = ("nothing", "predicted", "true")
"""What a policy reads about output lengths: nothing, the predictions, or the true lengths."""

_PROVIDES = {CLAIRVOYANT: frozenset(NEEDS), PREDICTED: frozenset(("nothing", "predicted")),
             BLIND: frozenset(("nothing",))}
_NEED_WORDS = {"predicted": "output-length predictions", "true": "the true output lengths"}


class InformationError(ConfigError):
    """A policy read output-length information its task's information model hides."""


def information_of_predictor(kind: str | None) -> str:
    """The information model a predictor type gives: ``oracle`` (or none given) ->
    clairvoyant, ``none`` -> blind, any other -> predicted."""
    if kind is None or kind == "oracle":
        return CLAIRVOYANT
    return BLIND if kind == "none" else PREDICTED


def information_of(obj: Any) -> str:
    """The information model of a scenario (its dict; :func:`~llmsched_gym.core.scenarios.get_scenario`
    turns a name or file into one), a workload spec, or a workload.

    >>> information_of({"workload": {"trace": {"format": "azure"}, "predictor": {"type": "none"}}})
    'blind'

    A built :class:`~llmsched_gym.core.request.Workload` records its model in
    ``meta["information"]`` (set by :func:`~llmsched_gym.core.workload.build_workload`); a workload
    made by hand without it is clairvoyant (its ``predicted_output`` defaults to the true lengths).
    """
    from llmsched_gym.core.request import Workload

    if isinstance(obj, GuardedWorkload):
        return obj.information
    if isinstance(obj, Workload):
        info = obj.meta.get("information", CLAIRVOYANT)
        return info if info in INFORMATION_MODELS else CLAIRVOYANT
    if not isinstance(obj, dict):
        raise ConfigError(f"information: expected a scenario, a workload spec or a Workload, got {obj!r}")
    spec = obj.get("workload", obj)
    pred = spec.get("predictor") if isinstance(spec, dict) else None
    return information_of_predictor(pred.get("type") if isinstance(pred, dict) else None)


def provides(information: str, need: str) -> bool:
    """Whether the information model ``information`` provides what a policy ``need``\\ s."""
    if information not in _PROVIDES:
        raise ConfigError(f"information: unknown {information!r}; allowed: {', '.join(INFORMATION_MODELS)}")
    if need not in NEEDS:
        raise ConfigError(f"needs: unknown {need!r}; allowed: {', '.join(NEEDS)}")
    return need in _PROVIDES[information]


def reason_not_applicable(label: str, need: str, information: str) -> str | None:
    """``None`` if a policy labelled ``label`` that needs ``need`` can run under ``information``,
    else the one-line reason (``"sjf needs output-length predictions; the task is blind"``)."""
    if provides(information, need):
        return None
    return f"{label} needs {_NEED_WORDS[need]}; the task is {information}"


class GuardedWorkload:
    """A policy's window on a :class:`~llmsched_gym.core.request.Workload` under the
    ``predicted`` or ``blind`` model: every field reads through, except ``output_tokens``
    (and, under ``blind``, ``predicted_output``), which raise :class:`InformationError`, and the
    copying methods (``take``, ``with_``, ``sorted``), which would hand out the true lengths."""

    __slots__ = ("_wl", "information")

    def __init__(self, workload: Any, information: str) -> None:
        self._wl = workload
        self.information = information

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in self.__slots__:  # copy/pickle probe an empty instance
            raise AttributeError(name)
        if name == "output_tokens" or (name == "predicted_output" and self.information == BLIND):
            raise InformationError(hidden_message(name, self.information))
        if name in ("take", "with_", "sorted"):
            raise InformationError(f"workload.{name}: a policy cannot copy the workload under the "
                                   f"{self.information!r} information model (it holds the true output lengths)")
        return getattr(self._wl, name)

    def __len__(self) -> int:
        return len(self._wl)

    def __repr__(self) -> str:
        return f"GuardedWorkload({len(self._wl)} requests, information={self.information!r})"


def hidden_message(name: str, information: str) -> str:
    """The one-line error of a read that ``information`` forbids."""
    if name == "output_tokens":
        hint = "read view.predicted_output" if information == PREDICTED else "no output-length information exists"
        return f"workload.output_tokens: the true output lengths are hidden under the {information!r} information model ({hint})"
    return (f"predicted_output: there are no output-length predictions under the {information!r} information model "
            "(the policy must work from prompt length, age and tokens generated)")


__all__ = ["BLIND", "CLAIRVOYANT", "INFORMATION_MODELS", "NEEDS", "PREDICTED", "GuardedWorkload", "InformationError",
           "information_of", "information_of_predictor", "provides", "reason_not_applicable"]
