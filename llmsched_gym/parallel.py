"""Run the cells of a sweep in parallel: local processes (``--jobs N``) or a Ray cluster (``--backend ray``).

A sweep (``compare``, ``evaluate``, ``benchmark``, ``reproduce``) is a list of independent cells,
one (scenario, policy or agent, seed, load) each. :func:`run_cells` runs ``fn`` on every cell and
returns one :class:`Outcome` per cell **in the cells' order**, whatever order they finished in, so
a parallel sweep writes the same outputs as the serial one (only the measured ``wall_time_s``
differs). A cell that raises does not stop the others: its outcome carries the error, and the
caller reports it by the cell's name.

* ``jobs=1`` (the default) runs the cells one after the other in this process;
* ``jobs=N`` runs them in ``N`` worker processes (``forkserver``: a clean interpreter that imports
  the simulator once, then forks a worker per slot; no state is inherited from the caller);
* ``backend="ray"`` submits one Ray task per cell: to a local Ray instance with ``jobs`` CPUs (all
  of them by default), or to the cluster at ``address`` (``auto`` after ``ray start --head``).
  Ray is an optional extra: ``pip install -e ".[ray]"``.

``fn`` must be importable by name (a module-level function) and its cells picklable.

A sweep configured once by the command line reaches the loops deep inside a paper reproduction
through :func:`configured` and :func:`current`, without threading three parameters through every
function.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

BACKENDS = ("local", "ray")
RAY_MISSING = 'backend: ray is not installed; install the extra with: pip install -e ".[ray]"'


@dataclass(frozen=True)
class Cell:
    """One task of a sweep: ``name`` is how it is reported (``sjf seed 3 load 1``), ``args`` what
    ``fn`` receives."""

    name: str
    args: Any


@dataclass(frozen=True)
class Outcome:
    """What one cell produced: ``value``, or ``error`` (``"TypeName: first line"``) if it raised."""

    name: str
    value: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Settings:
    """How sweeps run: ``jobs`` workers (``None``: 1 locally, every CPU on Ray), the backend, the
    Ray address (``None``: start a local instance) and whether to draw a progress bar (stderr)."""

    jobs: int | None = None
    backend: str = "local"
    address: str | None = None
    progress: bool = False


_current = Settings()


def current() -> Settings:
    """The settings :func:`configured` installed (by default: serial, silent)."""
    return _current


@contextlib.contextmanager
def configured(settings: Settings) -> Iterator[Settings]:
    """Run the enclosed sweeps with ``settings`` (``llmsched reproduce --jobs 2`` wraps the paper's code)."""
    global _current
    check_settings(settings.jobs, settings.backend)
    previous, _current = _current, settings
    try:
        yield settings
    finally:
        _current = previous


def check_settings(jobs: int | None, backend: str) -> None:
    """One-line errors for a bad ``--jobs``/``--backend``, and for Ray when the extra is missing."""
    if jobs is not None and jobs < 1:
        raise ValueError(f"jobs: {jobs} must be at least 1")
    if backend not in BACKENDS:
        raise ValueError(f"backend: {backend!r} is not one of {', '.join(BACKENDS)}")
    if backend == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ValueError(RAY_MISSING) from None


def error_text(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def _guarded(fn: Callable[[Any], Any], args: Any) -> tuple[Any, str | None]:
    """``fn(args)`` with its exception turned into text (a worker's exception need not unpickle)."""
    try:
        return fn(args), None
    except Exception as e:  # noqa: BLE001 (reported by the cell's name; the other cells go on)
        return None, error_text(e)


def run_cells(cells: Sequence[Cell], fn: Callable[[Any], Any], settings: Settings | None = None,
              label: str = "cells") -> list[Outcome]:
    """``fn(cell.args)`` for every cell; the outcomes in the cells' order.

    :param settings: jobs, backend and address (default: :func:`current`).
    :param label: the progress bar's title.
    """
    s = settings or current()
    check_settings(s.jobs, s.backend)
    results: list[tuple[Any, str | None] | None] = [None] * len(cells)
    with _progress(label, len(cells), s.progress) as advance:
        if s.backend == "ray":
            _run_ray(cells, fn, s, results, advance)
        elif (s.jobs or 1) == 1 or len(cells) <= 1:
            for i, cell in enumerate(cells):
                results[i] = _guarded(fn, cell.args)
                advance()
        else:
            _run_processes(cells, fn, min(s.jobs or 1, len(cells)), results, advance)
    return [Outcome(c.name, *r) for c, r in zip(cells, results, strict=True)]  # type: ignore[misc]


def failures(outcomes: Sequence[Outcome]) -> str:
    """``"2 of 16 cells failed: sjf seed 3 load 1 (ValueError: ...); ..."`` (empty if none did)."""
    bad = [o for o in outcomes if not o.ok]
    if not bad:
        return ""
    return f"{len(bad)} of {len(outcomes)} cells failed: " + "; ".join(f"{o.name} ({o.error})" for o in bad)


def values(outcomes: Sequence[Outcome]) -> list[Any]:
    """Every value, or a one-line error naming each failed cell (for sweeps that need all of them)."""
    msg = failures(outcomes)
    if msg:
        raise RuntimeError(msg)
    return [o.value for o in outcomes]


@contextlib.contextmanager
def _progress(label: str, total: int, show: bool) -> Iterator[Callable[[], None]]:
    if not show or total == 0:
        yield lambda: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(label, total=total)
        yield lambda: bar.advance(task)


def _run_processes(cells: Sequence[Cell], fn: Callable[[Any], Any], jobs: int,
                   results: list, advance: Callable[[], None]) -> None:
    import multiprocessing  # here, not at the top: with concurrent.futures ~40 ms of every `llmsched` start
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

    # forkserver: workers fork from a fresh interpreter that has imported the simulator once, so
    # start-up is cheap and nothing of the caller's state (threads, open files) leaks into them
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["llmsched_gym.sim"])
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        pending: dict[Future, int] = {pool.submit(_guarded, fn, c.args): i for i, c in enumerate(cells)}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                i = pending.pop(fut)
                try:
                    results[i] = fut.result()
                except Exception as e:  # noqa: BLE001 (a worker that died, e.g. out of memory)
                    results[i] = (None, error_text(e))
                advance()


def _run_ray(cells: Sequence[Cell], fn: Callable[[Any], Any], s: Settings, results: list,
             advance: Callable[[], None]) -> None:
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address=s.address, num_cpus=None if s.address else s.jobs, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(_guarded)
        refs = [task.remote(fn, c.args) for c in cells]
        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    results[index[ref]] = ray.get(ref)
                except Exception as e:  # noqa: BLE001 (a worker that died or a node that left)
                    results[index[ref]] = (None, error_text(e))
                advance()
    finally:
        if started:
            ray.shutdown()


def add_arguments(parser: Any) -> None:
    """``--jobs``, ``--backend`` and ``--address`` on a sweep command's parser."""
    parser.add_argument("--jobs", type=int, default=None,
                        help="cells run at once: local worker processes (default 1), or Ray CPUs (default all)")
    parser.add_argument("--backend", default="local", choices=BACKENDS,
                        help='local processes, or Ray tasks (pip install -e ".[ray]")')
    parser.add_argument("--address", default=None,
                        help="Ray cluster to join (auto: the one `ray start --head` started); default: a local one")


def settings_from(args: Any, progress: bool = True) -> Settings:
    """The :class:`Settings` of parsed ``--jobs/--backend/--address`` (checked: one-line errors)."""
    if args.address is not None and args.backend != "ray":
        raise ValueError("address: --address needs --backend ray")
    s = Settings(args.jobs, args.backend, args.address, progress)
    check_settings(s.jobs, s.backend)
    return s
