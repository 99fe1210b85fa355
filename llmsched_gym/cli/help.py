"""The ``--help`` formatter every ``llmsched`` subcommand uses.

A leaf module: the command layer (:mod:`llmsched_gym.cli`) and the modules that register
subcommands with it (``add_subcommands(sub)``) both import it from here, so that nothing below
the command layer imports the command layer.
"""

from __future__ import annotations

import argparse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows each option's default, except for flags, repeatable options that start
    empty, and options whose help text says what leaving them out means (default ``None``)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or isinstance(action.default, bool) or action.default == []:
            return action.help
        return super()._get_help_string(action)
