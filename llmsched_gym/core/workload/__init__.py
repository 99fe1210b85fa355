"""Seeded workload generators: arrival processes, length samplers, clients, task classes, prefixes.

Everything is pre-sampled into NumPy arrays (see :class:`~llmsched_gym.core.request.Workload`).
The building blocks compose by hand::

    rng = np.random.default_rng(0)
    t = poisson(50.0, n=1000, rng=rng)                       # sorted arrival times
    wl = Workload(t, lognormal(40.62, 11, len(t), rng), lognormal(85.32, 45, len(t), rng))
    wl = wl.with_(predicted_output=predict(wl, "noisy", rng, x=0.2))

or from a declarative spec (what scenarios use)::

    build_workload({"arrival": {"type": "poisson", "rate": 50}, "n_requests": 1000,
                    "prompt": {"type": "lognormal", "mean": 40.62, "median": 11},
                    "output": {"type": "lognormal", "mean": 85.32, "median": 45}}, seed=0)

Arrival processes return sorted ``float64`` arrays and take ``n`` (number of requests), ``horizon_s``
(keep arrivals with ``t < horizon_s``) or both (whichever bound is hit first). Length samplers
return ``int64`` arrays clipped to ``[1, max_tokens]``. Generators that need more than arrivals
and lengths (typed mixtures, Definition 4 queues, clients, task classes) return a ``Workload``.

Spec of :func:`build_workload` (every key optional unless said; unknown keys raise
:class:`WorkloadError` naming the field and the allowed keys):

``n_requests`` (int >= 0), ``horizon_s`` (float > 0)
    Bounds of the workload; at least one is needed unless the arrival process, the ``users``
    prefix model or the trace fixes the count.
``arrival`` (mapping, ``type`` plus its parameters)
    ``poisson``: ``rate``. ``gamma``: ``rate``, ``cv`` (inter-arrival coefficient of variation;
    Gamma shape ``1/cv**2``). ``deterministic``: ``rate`` (arrivals at ``k/rate``, k = 1, 2, ...).
    ``all_at_zero``: no parameters (needs ``n_requests``). ``on_off``: ``rate_on``, ``on_s``,
    ``off_s`` (Poisson during ON windows, starting ON at t = 0). ``piecewise``: ``rates``,
    ``boundaries_s`` (``len(rates) - 1`` increasing breakpoints; the last rate holds on).
    ``diurnal``: ``mean_rate``, ``amplitude`` (in [0, 1]), ``period_s``, optional ``peak_s``
    (rate ``mean_rate * (1 + amplitude * cos(2 pi (t - peak_s) / period_s))``; peak/trough
    ratio ``(1 + a) / (1 - a)``, so 6x is ``a = 5/7``). ``round_counts``: integer arrival counts
    per round (times are round indices 0, 1, ...; ``horizon_s`` counts rounds), ``dist`` one of
    ``binomial`` (``B``, ``p``), ``uniform`` (``B``: uniform on {0..B}) or ``pmf`` (``pmf``: the
    probabilities of 0, 1, 2, ... arrivals).
    Default: Poisson at the sum of the ``types`` rates when ``types`` is given.
``prompt``, ``output`` (length spec)
    An int (every request gets it) or a mapping: ``fixed`` (``value``), ``uniform`` (``lo``,
    ``hi``, inclusive), ``lognormal`` (``mean``, ``median``: mu = ln median,
    sigma = sqrt(2 ln(mean / median))), ``zipf`` (``a`` > 1), ``empirical`` (``values``, or
    ``path`` plus ``column`` of a CSV file, resampled with replacement). Every mapping also takes
    ``max`` (clip to at most this many tokens). Defaults: ``prompt`` is required except with
    ``types``, ``users`` or ``trace``; ``output`` likewise, except with ``users`` where it is 1.
``types`` (list of ``{"rate", "prompt", "output"}``)
    Ao et al. 2025's prompt types: type j arrives as a Poisson process of rate ``rate`` with lengths
    ``prompt`` and ``output`` (ints or length specs); sets ``type_id``. With an explicit
    ``arrival`` the rates only set the mix.
``clients`` (list of ``{"rate" or "arrival", "weight", "prompt", "output"}``)
    One stream per client (Poisson at ``rate`` unless ``arrival`` is given), merged by time;
    client i gets id i and weight ``weight`` (default 1). ``prompt``/``output`` default to the
    top-level ones. Excludes a top-level ``arrival`` and ``types``.
``classes`` (mapping: ``offline``, ``ttft_slo_s``, ``tpot_slo_s``)
    Echo (Wang et al. 2025): the main stream is online with the given SLOs (defaults 1 s and 0.05 s);
    ``offline`` is a spec (``n_requests``, ``prompt``, ``output``, ``prefix``) whose requests all
    arrive at t = 0 with infinite SLOs.
``prefix`` (mapping)
    ``{"type": "system", "groups": G, "tokens": S, "weights": [...]}``: each request picks one
    of G system prompts (uniformly or by ``weights``) of S tokens, prepended to its prompt; each
    stream (each client, the offline pool) gets its own G prompts.
    ``{"type": "users", "users", "k", "user_tokens", "doc_tokens", "base_tokens", "s",
    "shuffle"}``: Dexter et al. 2025's Definition 4 queue (see :func:`regular_shuffled_queue`); an explicit
    ``arrival`` replaces the regular slots ``s, 2s, ...``.
    ``{"type": "sessions", "groups", "tokens", "question_tokens", "output_tokens", "turns",
    "think_s", "length_cv"}``: llm-d's prefix-heavy benchmark traffic (see
    :func:`~llmsched_gym.core.sessions.prefix_groups`): sessions of ``turns`` turns (default 1)
    start as a Poisson process (``arrival: {type: poisson, rate}``, the request rate), each in one
    of ``groups`` groups whose ``tokens``-token system prompt starts every prompt; turn k repeats
    the earlier questions and answers (``think_s`` apart). ``n_requests`` is required;
    ``prompt``, ``output`` and ``types`` are not allowed.
``predictor`` (mapping)
    ``oracle``, ``lognormal`` (``sigma``), ``noisy`` (``x``), ``bucketed`` (``edges``, ``point`` =
    ``upper`` | ``mid``) or ``none``: see :func:`predict`. Default: oracle. The predictor sets the
    scenario's information model (:mod:`llmsched_gym.core.information`): ``oracle`` is
    clairvoyant, ``none`` is blind, any other is predicted; ``meta["information"]`` records it.
``trace`` (mapping: ``format``, ``path``, ``on_zero``, ``time_scale``)
    Load requests from a file (``format``: ``azure``, ``vtc``, ``csv``, ``jsonl``, ``sharegpt``;
    see :mod:`llmsched_gym.core.traces`). ``path`` is a file, or a known trace's name
    (``azure-conv``, ``vtc-arena``) looked up by :func:`llmsched_gym.data.resolve_data`: the
    cache that ``llmsched data download`` fills, then ``../shared/traces``. Without ``path``
    (the ``azure`` and ``vtc`` formats) a missing trace falls back to
    :func:`~llmsched_gym.core.traces.synthetic_azure_conv` or
    :func:`~llmsched_gym.core.traces.synthetic_vtc_arena`, with one line on stderr, and
    ``meta["workload_source"]`` says which ran (``kind`` ``trace`` with the file's ``sha256``, or
    ``synthetic``).
    An ``arrival`` replaces the trace's timestamps (required for ``sharegpt``); ``time_scale``
    multiplies them (0.5 doubles the rate). ``n_requests``/``horizon_s`` cut the trace: from its
    first row (``window: head``, the default) or from a seeded start row (``window: random``,
    arrivals shifted to start at 0), so that different seeds give different workloads. ``part``
    (``[start, end]``, fractions of the rows, default ``[0, 1]``) keeps only that part of the trace
    first, so that training and test windows can come from disjoint parts.

Modules: :mod:`~llmsched_gym.core.workload.arrivals`, :mod:`~llmsched_gym.core.workload.lengths`,
:mod:`~llmsched_gym.core.workload.structured`, :mod:`~llmsched_gym.core.workload.predictors`,
:mod:`~llmsched_gym.core.workload.spec` (the builder) and :mod:`~llmsched_gym.core.workload.checks`
(argument checks); this package re-exports their public names.

Randomness: each part of the spec draws from its own stream derived from ``(seed, field path)``,
so the same seed gives identical arrays, and changing, say, the predictor leaves the arrivals and
lengths unchanged (common random numbers across scenario variants).
"""

from llmsched_gym.core.request import OFFLINE, ONLINE, Segments, Workload, WorkloadError
from llmsched_gym.core.workload.arrivals import (
    MAX_CV,
    MAX_ROUND_B,
    all_at_zero,
    deterministic,
    diurnal,
    gamma,
    on_off,
    piecewise,
    poisson,
    round_counts,
    thinned,
)
from llmsched_gym.core.workload.checks import RngLike
from llmsched_gym.core.workload.lengths import empirical, fixed, lognormal, lognormal_params, uniform, zipf
from llmsched_gym.core.workload.predictors import (
    RANKER_SIGMA,
    RANKER_TAU,
    kendall_tau,
    predict,
    sigma_for_tau,
)
from llmsched_gym.core.workload.spec import build_workload, explicit_workload
from llmsched_gym.core.workload.structured import (
    merge,
    merge_clients,
    regular_shuffled_queue,
    shared_system_prompts,
    typed_mixture,
    with_task_classes,
)

__all__ = [
    "MAX_CV", "MAX_ROUND_B", "OFFLINE", "ONLINE", "RANKER_SIGMA", "RANKER_TAU", "RngLike", "Segments", "Workload",
    "WorkloadError", "all_at_zero", "build_workload", "deterministic", "diurnal", "empirical", "explicit_workload",
    "fixed", "gamma", "kendall_tau", "lognormal", "lognormal_params", "merge", "merge_clients", "on_off",
    "piecewise", "poisson", "predict", "regular_shuffled_queue", "round_counts", "shared_system_prompts",
    "sigma_for_tau", "thinned", "typed_mixture", "uniform", "with_task_classes", "zipf",
]
