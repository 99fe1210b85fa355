"""Batch-time models: how long one engine iteration takes.

Every model is a pure function of the batch's shape (noise is applied by the engine, indexed by
iteration number, so fast-forward and step-by-step runs draw the same noise):

* ``prefill_tokens``: new prompt tokens computed this iteration (sum of chunks);
* ``prefill_ctx_tokens``: sum over the prefill requests of their context after the chunk
  (cached prefix + earlier chunks + this chunk), for the attention cost;
* ``n_prefill``: number of requests with a prefill chunk in the batch;
* ``n_decode``: number of decode tokens (one per decoding request);
* ``decode_ctx_tokens``: sum over decoding requests of the tokens they attend to (their KV
  before this iteration).

``decode_times`` is the vectorised decode-only case used by fast-forward; it must equal
``batch_time(0, 0, 0, n_decode, c)`` element by element, bit for bit. Every model therefore
writes its decode-only arithmetic twice, once on Python floats and once on NumPy arrays, with
the same operations in the same order (IEEE add/multiply/divide are correctly rounded in both,
and NumPy does not fuse them). Integer token counts are exact in float64 below 2**53.

Models (``make_latency`` spec in brackets; each instance's ``name`` is a spec that rebuilds it):

=====================  ================================================================
``unit``               every iteration takes 1 (the theory papers' rounds)
``linear``             ``d0 + d1 * KV tokens in the batch`` (Ao et al. 2025, Eq. 1)
``piecewise``          ``c + a * max(0, tokens - b0)`` (Li et al. 2025, cited by Ao et al. 2025)
``affine``             separate prefill and decode fits (Sheng et al. 2024's A10G profile)
``roofline:M/G``       max(compute, memory) + overhead from model and GPU specs
``calibrated:M/G``     ``vidur:G/M``'s form, linear part = the roofline fitted to it
``vidur:G/M``          measured linear part + modelled attention (:mod:`.profile`)
``profile:PATH``       the same from a Vidur-format ``mlp.csv``
``table:PATH``         interpolation in a measured profile (the GPU backend's CSV)
``KIND:...``           a plug-in's model (``gpu:MODEL``, :func:`register_latency`)
=====================  ================================================================

Modules: :mod:`~llmsched_gym.core.latency.base` (the interface, the registry of spec kinds and
:func:`make_latency`), :mod:`~llmsched_gym.core.latency.analytic`, :mod:`~llmsched_gym.core.latency.roofline`,
:mod:`~llmsched_gym.core.latency.calibrated`, :mod:`~llmsched_gym.core.latency.table` and
:mod:`~llmsched_gym.core.latency.fit`; this package re-exports their public names. Importing it registers the
built-in kinds.
"""

from llmsched_gym.core.latency.analytic import AffineLatency, LinearKVLatency, PiecewiseLatency, UnitLatency
from llmsched_gym.core.latency.base import (
    LATENCY_KINDS,
    LatencyFactory,
    LatencyKind,
    LatencyModel,
    list_latency_presets,
    make_latency,
    register_latency,
)
from llmsched_gym.core.latency.calibrated import CALIBRATED_PRESETS, CalibratedLatency, CalibratedPreset
from llmsched_gym.core.latency.fit import fit_affine, fit_linear
from llmsched_gym.core.latency.roofline import (
    ALLREDUCE_LATENCY_S,
    ROOFLINE_PRESETS,
    RooflineLatency,
    SummedLatency,
    attention_pairs,
)
from llmsched_gym.core.latency.table import PROFILE_COLUMNS, ProfileRow, TableLatency

__all__ = [
    "ALLREDUCE_LATENCY_S", "CALIBRATED_PRESETS", "LATENCY_KINDS", "PROFILE_COLUMNS", "ROOFLINE_PRESETS",
    "AffineLatency", "CalibratedLatency", "CalibratedPreset", "LatencyFactory", "LatencyKind", "LatencyModel",
    "LinearKVLatency", "PiecewiseLatency", "ProfileRow", "RooflineLatency", "SummedLatency", "TableLatency",
    "UnitLatency", "attention_pairs", "fit_affine", "fit_linear", "list_latency_presets", "make_latency",
    "register_latency",
]
