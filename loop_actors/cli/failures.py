"""How a parsed command runs: its group's ``run``, an error as one line and an exit code."""

from __future__ import annotations

import argparse
import sys

from aggregates.values import describe_error
from loop_actors._errors import (
    InconsistentHistoryError,
    LeaseHeldError,
    UsageError,
    single_exception,
)
from loop_actors._terminal import terminal_safe
from loop_actors.cli.exit_codes import ExitCode
from loop_actors.cli.parser import command_group
from loop_actors.store.url import redacted_url


def _error(text: object, *, internal: bool = False) -> None:
    """``loop-actors: error: TEXT`` on stderr: made terminal-safe, any URL's password hidden."""
    kind = "internal error" if internal else "error"
    print(f"loop-actors: {kind}: {redacted_url(terminal_safe(text))}", file=sys.stderr)


def run_command(args: argparse.Namespace) -> int:
    """Run the parsed command; an error is one line on stderr and its exit code."""
    try:
        try:
            return command_group(args.group).run(args)
        except BaseExceptionGroup as group:
            raise single_exception(group) from None
    except LeaseHeldError as error:
        _error(error)
        return ExitCode.LEASE_HELD
    except UsageError as error:
        _error(error)
        return ExitCode.USAGE_ERROR
    except InconsistentHistoryError as error:
        _error(error)
        return ExitCode.TAMPERED
    except BrokenPipeError:  # the reader (e.g. `head`) went away: not an error of ours
        sys.stderr.close()
        return ExitCode.OK
    except KeyboardInterrupt:
        print("loop-actors: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except Exception as error:  # the last line of defence: one line, exit 1
        from loop_actors.runtime.outage import is_outage, one_line  # noqa: PLC0415 - rare

        if is_outage(error):  # the database went away before the command could finish
            _error(f"the store cannot be used: {one_line(error)}")
            return ExitCode.USAGE_ERROR
        _error(describe_error(error), internal=True)
        return ExitCode.INTERNAL_ERROR
