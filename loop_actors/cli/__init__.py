"""The ``loop-actors`` command line: a module per command group, imported when it runs.

``main`` is the console script's entry point; :class:`ExitCode` names its exit codes.
"""

from __future__ import annotations

from loop_actors.cli.entry import main as main
from loop_actors.cli.exit_codes import ExitCode as ExitCode

__all__ = ["ExitCode", "main"]
