"""How a parsed command runs: its group's ``run``, an error as one line and an exit code."""

from __future__ import annotations

import argparse
import sys

from aggregates.values import describe_error
from loop_actors._errors import InconsistentHistoryError, LeaseHeldError, UsageError
from loop_actors._render import terminal_safe
from loop_actors.cli.exit_codes import ExitCode
from loop_actors.cli.parser import command_group
from loop_actors.runtime.controller import single_exception


def run_command(args: argparse.Namespace) -> int:
    """Run the parsed command; an error is one line on stderr and its exit code."""
    try:
        try:
            return command_group(args.group).run(args)
        except BaseExceptionGroup as group:
            raise single_exception(group) from None
    except LeaseHeldError as error:
        print(f"loop-actors: error: {terminal_safe(error)}", file=sys.stderr)
        return ExitCode.LEASE_HELD
    except UsageError as error:
        print(f"loop-actors: error: {terminal_safe(error)}", file=sys.stderr)
        return ExitCode.USAGE_ERROR
    except InconsistentHistoryError as error:
        print(f"loop-actors: error: {terminal_safe(error)}", file=sys.stderr)
        return ExitCode.TAMPERED
    except BrokenPipeError:  # the reader (e.g. `head`) went away: not an error of ours
        sys.stderr.close()
        return ExitCode.OK
    except KeyboardInterrupt:
        print("loop-actors: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except Exception as error:  # the last line of defence: one line, exit 1
        print(
            f"loop-actors: internal error: {terminal_safe(describe_error(error))}",
            file=sys.stderr,
        )
        return ExitCode.INTERNAL_ERROR
