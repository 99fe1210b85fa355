"""``calibrated:MODEL/GPU``: the profile model's form with a roofline fitted to a measured Vidur
profile as its linear part (presets and their fitted data), and the stand-in for a profile
that is not found."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from llmsched_gym.core.latency.base import by_name, register_latency
from llmsched_gym.core.latency.roofline import RooflineLatency, SummedLatency


@dataclass(frozen=True)
class CalibratedPreset:
    """A ``calibrated:MODEL/GPU`` preset: efficiencies fitted to a measured Vidur profile.

    :param model: model name.
    :param gpu: GPU name (a multi-GPU name is the tensor-parallel group).
    :param profile: the Vidur profile fitted (``vidur:GPU/MODEL``) at tensor-parallel degree ``tp``.
    :param mfu: fraction of peak FLOP/s, ``mbu`` of HBM bandwidth and ``overhead_s`` fixed seconds
        of the roofline fitted to the profile's linear part
        (:func:`llmsched_gym.core.profile.fit_roofline`); ``mfu`` is also attention's.
    :param stream_mbu: the profile's ``stream_mbu`` (:class:`~llmsched_gym.core.profile.LinearProfile`):
        the KV read/write's fraction of HBM bandwidth, as in the profile model.
    :param mape: mean absolute percentage error of the fitted linear part over the profile's
        1 to 8,192 tokens (a fraction); ``worst`` the largest, at ``worst_tokens`` tokens.
    :param note: where the efficiencies come from when not from this pair's own profile.
    """

    model: str
    gpu: str
    profile: str
    tp: int
    mfu: float
    mbu: float
    overhead_s: float
    stream_mbu: float
    mape: float
    worst: float
    worst_tokens: int
    note: str = ""

    def describe(self) -> str:
        fit = (f"MAPE {self.mape:.1%}, worst {self.worst:.0%} at {self.worst_tokens} tokens against {self.profile}"
               + (f" TP {self.tp}" if self.tp > 1 else ""))
        return (f"{self.model} on {self.gpu}: the profile model with a fitted linear part (roofline, mfu "
                f"{self.mfu:.3f}, mbu {self.mbu:.2f}, {self.overhead_s * 1e3:.2f} ms) + attention (KV at mbu "
                f"{self.stream_mbu:.2f})" + (" + all-reduce" if self.tp > 1 else "") + "; "
                + (f"{self.note}; on that profile: " if self.note else "linear part: ") + fit)


CALIBRATED_PRESETS: dict[str, CalibratedPreset] = {
    # fit_roofline and stream_mbu of Vidur's profiles (microsoft/vidur 7d47513,
    # data/profiling/compute); a test re-derives them when ../shared/profiles is present. mbu ends
    # at its bound 1: the decode floor cannot tell bandwidth from fixed cost, and the fit puts the
    # rest of it in overhead_s.
    "calibrated:llama-2-7b/a100": CalibratedPreset(
        "Llama-2-7B", "A100-80GB", "vidur:a100/llama-2-7b", 1, 0.6780, 1.0, 3.0764e-3, 0.7463, 0.0386, 0.333, 136),
    "calibrated:llama-2-70b/2xa100": CalibratedPreset(
        "Llama-2-70B", "A100x2", "vidur:a100/llama-2-70b", 2, 0.7148, 1.0, 2.3574e-2, 0.7933, 0.0386, 0.274, 1),
    "calibrated:llama-3-8b/a100": CalibratedPreset(
        "Llama-3-8B", "A100-80GB", "vidur:a100/llama-3-8b", 1, 0.7635, 1.0, 4.4450e-3, 0.7751, 0.0362, 0.270, 1),
    "calibrated:llama-2-7b/h100": CalibratedPreset(
        "Llama-2-7B", "H100-SXM", "vidur:h100/llama-2-7b", 1, 0.6773, 1.0, 3.3263e-3, 0.7745, 0.0567, 0.342, 2),
    "calibrated:llama-2-70b/2xh100": CalibratedPreset(
        "Llama-2-70B", "H100x2", "vidur:h100/llama-2-70b", 2, 0.6569, 1.0, 9.2892e-3, 0.8688, 0.0618, 0.323, 520),
    "calibrated:llama-2-7b/a40": CalibratedPreset(
        "Llama-2-7B", "A40", "vidur:a40/llama-2-7b", 1, 0.7350, 1.0, 1.0821e-2, 0.7999, 0.0388, 0.261, 1),
    "calibrated:llama-3.1-8b/h100": CalibratedPreset(
        "Llama-3.1-8B", "H100-SXM", "vidur:h100/llama-2-7b", 1, 0.6773, 1.0, 3.3263e-3, 0.7745, 0.0567, 0.342, 2,
        "efficiencies of Llama-2-7B on H100 (Vidur has no Llama-3 profile on H100)"),
}
"""``calibrated:MODEL/GPU``: the offline stand-in of the profile model ``vidur:GPU/MODEL``
(:class:`CalibratedLatency`), the same on every machine and with nothing to download."""


class CalibratedLatency(SummedLatency):
    """``calibrated:MODEL/GPU``: the profile model's form with the measured linear part replaced
    by the roofline fitted to it (:data:`CALIBRATED_PRESETS`):

    * linear part: :class:`RooflineLatency` with the preset's ``mfu``, ``mbu``, ``overhead_s`` at
      context 0, ``max(compute, weights) + overhead_s`` (within 3.6-6.2% MAPE of the measurements);
    * attention: FLOPs at the preset's ``mfu``, KV bytes at its ``stream_mbu``;
    * tensor-parallel all-reduce as in the profile model;

    summed (:class:`SummedLatency`), as :class:`~llmsched_gym.core.profile.ProfileLatency` sums them.

    :param name: a key of :data:`CALIBRATED_PRESETS`.
    """

    def __init__(self, name: str) -> None:
        key = "calibrated:" + name.strip().lower().removeprefix("calibrated:")
        p = CALIBRATED_PRESETS.get(key)
        if p is None:
            raise ValueError(f"latency: unknown calibrated preset {key!r}; allowed: {', '.join(CALIBRATED_PRESETS)}")
        self.preset = p
        self.roofline = RooflineLatency(p.model, p.gpu, p.mfu, p.mbu, p.overhead_s)
        super().__init__(self.roofline.model, self.roofline.gpu, p.mfu, p.stream_mbu, 0.0)
        self.name = key

    def linear_time(self, tokens: float) -> float:
        """The fitted roofline's time for ``tokens`` tokens at context 0 (seconds)."""
        return self.roofline.batch_time(0, 0, 0, tokens, 0)  # type: ignore[arg-type]


_NOTIFIED: set[str] = set()


def calibrated_fallback(profile: str, tp: int) -> CalibratedLatency:
    """Stand-in for a Vidur profile no copy is found of: its ``calibrated:`` preset (the same
    form, with the roofline fitted to that profile as the linear part), said once per process on
    stderr (as a missing trace's synthetic stand-in is)."""
    for key, p in CALIBRATED_PRESETS.items():
        if p.profile == f"vidur:{profile.strip().lower()}" and p.tp == tp and not p.note:
            if profile not in _NOTIFIED:
                _NOTIFIED.add(profile)
                print(f"vidur:{profile}: measured profile not found, using {key} (the roofline fitted to it as "
                      f"the linear part, MAPE {p.mape:.1%}); `llmsched data download vidur:{profile}`",
                      file=sys.stderr)
            return CalibratedLatency(key)
    raise ValueError(f"latency: vidur:{profile},tp={tp}: mlp.csv not found and no calibrated preset stands in; "
                     f"`llmsched data download vidur:{profile}`")



register_latency("calibrated", lambda rest: CalibratedLatency(rest) if rest else None, "",
                 listing={name: p.describe() for name, p in CALIBRATED_PRESETS.items()},
                 from_dict=by_name("calibrated"))
