"""The ``loop-actors`` command line: a module per command group, imported when it runs.

``main`` is the console script's entry point; :class:`ExitCode` names its exit codes.
"""

from __future__ import annotations

from collections.abc import Sequence

from loop_actors.cli.exit_codes import ExitCode as ExitCode

__all__ = ["ExitCode", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``loop-actors`` with ``argv`` (default: ``sys.argv[1:]``); return its exit code."""
    # Not imported at the top: ``python -m loop_actors.cli.main`` runs that module as
    # __main__, which must not be imported already (runpy warns of it).
    from loop_actors.cli.main import main as run_main  # noqa: PLC0415 - see above

    return run_main(argv)
