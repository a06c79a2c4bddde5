"""The ``loop-actors`` command: parse, run the command's group, turn errors into exit codes.

Exit codes (:class:`~loop_actors.cli.exit_codes.ExitCode`): 0 completed, 3 paused, 4 any
other terminal reason, 2 bad usage or input (nothing written), 1 internal error, 6
another process drives the invocation: it holds its lease (``resume --take-over`` fences
it off), or this run stopped ``lease_lost``;
``reconcile``: 0 nothing waits, 3 the sweeper will retry something, 5 an effect needs
a person (``effects resolve``).

Only the parser is imported up front, and a command's options when it is parsed
(``loop_actors.cli.options``, standard library only); its group's module, and with it
trio and eventsourcing, once it runs. So ``--version``, ``--help`` and
``<command> --help`` stay quick.
"""

from __future__ import annotations

from collections.abc import Sequence

from loop_actors.cli.parser import build_parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``loop-actors`` console script."""
    args = build_parser().parse_args(argv)
    # Imported after parsing: --version and --help exit before, importing no trio.
    from loop_actors.cli.failures import run_command  # noqa: PLC0415 - see above

    return run_command(args)
