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

import os
import sys
from collections.abc import Sequence

from loop_actors.cli.exit_codes import ExitCode
from loop_actors.cli.parser import (
    LOG_FORMAT_ENV,
    LOG_FORMATS,
    LOG_LEVEL_ENV,
    LOG_LEVELS,
    build_parser,
)


def _log_setting(given: str | None, env: str, allowed: Sequence[str], default: str) -> str:
    """The option's value, else the environment's (checked), else ``default``.

    Raises:
        ValueError: the environment variable holds no allowed value.
    """
    if given is not None:
        return given
    value = os.environ.get(env, "").strip().lower()
    if not value:
        return default
    if value not in allowed:
        raise ValueError(f"${env} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``loop-actors`` console script."""
    args = build_parser().parse_args(argv)
    try:
        log_format = _log_setting(args.log_format, LOG_FORMAT_ENV, LOG_FORMATS, "text")
        log_level = _log_setting(args.log_level, LOG_LEVEL_ENV, LOG_LEVELS, "warning")
    except ValueError as error:
        print(f"loop-actors: error: {error}", file=sys.stderr)
        return ExitCode.USAGE_ERROR
    # Imported after parsing: --version and --help exit before, importing no trio.
    from loop_actors._logs import LogFormat, logging_to_stderr  # noqa: PLC0415 - see above
    from loop_actors.cli.failures import run_command  # noqa: PLC0415 - see above

    with logging_to_stderr(LogFormat(log_format), log_level):
        return run_command(args)
