"""The ``llmsched`` command: ``llmsched --help`` lists the subcommands.

The command layer, on top of everything and imported by nothing of the project: this module is
the entry point (:func:`main`, also ``python -m llmsched_gym.cli``); each module beside it adds its
subcommands with ``add_subcommands(sub, formatter)`` (:func:`build_parser`) and calls the work in
the packages below (:mod:`llmsched_gym.sim`, :mod:`llmsched_gym.benchmark`, :mod:`agents.train`,
:mod:`llmsched_gym.reproduce`, ...); :mod:`llmsched_gym.cli.help` is the ``--help`` formatter.

``list``, ``run`` and ``bench`` need only NumPy; ``train``/``evaluate``/``compare`` import the RL
stack and ``gpu`` imports torch, each only when invoked. Errors in user input are printed as one
line (``error: FIELD: ...``) with exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

from llmsched_gym.cli.help import HelpFormatter
from llmsched_gym.config import ConfigError


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llmsched-gym")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """``--version``: the installed version, looked up only when asked (importlib.metadata costs
    ~10 ms of every start otherwise)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(f"llmsched-gym {_version()}")
        parser.exit()


class _Parser(argparse.ArgumentParser):
    """argparse with the project's one-line errors: ``error: llmsched train: argument --K: invalid
    int value: 'true' (llmsched train --help)`` instead of the usage block and the message (the
    subcommand parsers are of this class too)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {' '.join(message.split())} ({self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``llmsched`` parser: each subcommand module of this package adds its subcommands
    (``add_subcommands(sub, formatter)``), in the order ``llmsched --help`` lists them."""
    # imported here so that ``python -m llmsched_gym.cli.gpu`` runs a module not yet imported
    from llmsched_gym.cli import agents, apps, cluster, data, goodput, gpu, reproduce, run

    p = _Parser(prog="llmsched", description="LLM inference scheduling gym and simulator",
                formatter_class=HelpFormatter)
    p.add_argument("--version", action=_VersionAction)
    sub = p.add_subparsers(dest="command", required=True)
    for module in (run, cluster, apps, goodput, data, agents, gpu, reproduce):
        module.add_subcommands(sub, HelpFormatter)
    return p


_PACKAGES = ("llmsched_gym", "agents", "baselines")


def _where(tb: Any) -> str:
    """``module.function (file:line)`` of the innermost frame of the project in a traceback."""
    import traceback

    frames = [f for f in traceback.extract_tb(tb) if any(f"/{p}/" in f.filename.replace("\\", "/") for p in _PACKAGES)]
    if not frames:
        return "outside the project's code"
    f = frames[-1]
    path = f.filename.replace("\\", "/")
    short = next((path[path.rindex(f"/{p}/") + 1:] for p in _PACKAGES if f"/{p}/" in path), path)
    return f"{f.name} ({short}:{f.lineno})"


def main(argv: list[str] | None = None) -> int:
    """Run ``llmsched ARGV``; returns the exit status.

    0: done. 2: bad input (a file, flag or setting), printed as one line ``error: FIELD: ...``, or
    out of memory (one line naming where the memory ran out). 130: interrupted. 70: an internal
    error, a bug: one line saying so, where it happened and that it should be reported
    (``LLMSCHED_DEBUG=1`` shows the traceback instead).
    """
    import os

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except KeyboardInterrupt:
        return 130
    except (ConfigError, ValueError, KeyError, OSError) as e:
        # ConfigError is every input error the project raises (one line naming the field); the
        # others are library errors about the same input (a file that cannot be read)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"error: {msg}", file=sys.stderr)
        return 2
    except MemoryError as e:
        print(f"error: out of memory in {_where(e.__traceback__)}: a size in the input is too large for this "
              "machine (workload.n_requests, K, network widths, n_steps); make it smaller", file=sys.stderr)
        return 2
    except Exception as e:  # a bug: say so in one line, never a bare traceback
        if os.environ.get("LLMSCHED_DEBUG"):
            raise
        msg = " ".join(str(e).split())[:200]
        print(f"error: internal error ({type(e).__name__}: {msg}) in {_where(e.__traceback__)}; please report it "
              "to the project's issue tracker with the command and this line (LLMSCHED_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 70
    if argv is None and not rc and getattr(args, "quick_exit", False) and sys.getprofile() is None \
            and sys.gettrace() is None:  # a profiler, coverage or a debugger sees the normal exit
        _exit_now()
    return rc or 0


def _exit_now() -> NoReturn:
    """End the process with status 0 without the interpreter's teardown (a command that set
    ``quick_exit`` and succeeded, run as the ``llmsched`` process itself: ``main()`` without
    ``argv``, with no profiler or tracer installed, so ``python -m cProfile``, coverage and
    debuggers still get the interpreter's normal exit and write their results). Such a command (``llmsched train``) has closed its files; what remains is freeing
    the heap of torch and its imports object by object and running their finalizers, about
    0.1 CPU-s that change nothing on disk. Standard output and error are flushed first."""
    import os

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing left to write to
            pass
    os._exit(0)

