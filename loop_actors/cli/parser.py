"""The ``loop-actors`` argument parser, whose commands' options are added lazily.

The top-level parser knows each command's name, one-line help and command group. A
command's options are added by its group's options module
(``loop_actors.cli.options.<group>``) when that command is parsed or its help
printed; the group's own module (``loop_actors.cli.<group>``), which imports trio and
eventsourcing, is imported only when the command runs. So ``loop-actors --version``,
``--help`` and ``<command> --help`` import neither trio nor eventsourcing nor pydantic:
this module and the options modules import only the standard library.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn, Protocol, cast

from loop_actors._version import __version__
from loop_actors.cli.exit_codes import ExitCode

DB_HELP = "sqlite:///path.db, postgresql://user:password@host:port/dbname or memory://"

CHECKPOINT_DIR_ENV = "LOOP_ACTORS_CHECKPOINT_DIR"
CHECKPOINT_KEY_ENV = "LOOP_ACTORS_CHECKPOINT_KEY"
CHECKPOINT_EVERY_ENV = "LOOP_ACTORS_CHECKPOINT_EVERY"
DEFAULT_CHECKPOINT_EVERY = 100
"""The checkpointer's variables and default (``loop_actors.audit.checkpointer``'s; a test
checks that they agree), written here so that the options import nothing heavy."""

COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("demo", "demo", "run seed 000's example agent and show its trajectory"),
    ("run", "invocations", "run an Agent given as MODULE:ATTR"),
    (
        "resume",
        "invocations",
        "continue an invocation from its committed events (after a crash or pause)",
    ),
    ("approve", "invocations", "approve the batch an invocation waits with"),
    ("deny", "invocations", "deny the batch an invocation waits with"),
    ("clarify", "invocations", "answer the question an invocation asked"),
    ("cancel", "invocations", "ask an invocation to stop (recorded; honoured by any worker)"),
    ("wake", "invocations", "wake a sleeping invocation now (before its wake time, if need be)"),
    (
        "reconcile",
        "invocations",
        "settle open effects with their services; resume invocations paused for it",
    ),
    ("audit", "audit", "verify the tamper-evident history"),
    ("store", "store", "copy a store (e.g. from SQLite to PostgreSQL)"),
    ("show", "read_models", "an invocation's trajectory, as a tree"),
    ("list", "read_models", "invocations, newest first"),
    ("metrics", "read_models", "counts and distributions by group"),
    (
        "effects",
        "effects",
        "open effects (dispatched or outcome unknown), oldest first; "
        "'effects resolve KEY' settles one by hand",
    ),
    ("projections", "read_models", "the read models"),
    (
        "eval",
        "evaluation",
        "run a cases file's cases as invocations and score their trajectories "
        "('eval schema', 'eval compare A B')",
    ),
    (
        "submit",
        "submit",
        "record new invocations as runnable, for workers to run (--goal, or --goals FILE); "
        "print their ids",
    ),
    ("worker", "queue", "claim runnable invocations of these agents and run them, many at once"),
    ("workers", "queue", "live lease holders (workers and runs), their leases, last heartbeat"),
    (
        "schedule",
        "schedules",
        "run an agent on a schedule ('schedule add NAME --agent MODULE:ATTR --goal TEXT "
        "--every 15m'; list, pause, resume, remove): workers submit each due run once",
    ),
    ("history", "history", "print an invocation's committed events"),
    (
        "trace",
        "trace",
        "send an invocation's OpenTelemetry spans, rebuilt from its history "
        "('trace export ID --otlp URL')",
    ),
    (
        "watch",
        "console",
        "follow an invocation's committed events as they come, until it ends",
    ),
    (
        "export",
        "export",
        "one self-contained HTML file of an invocation: trajectory, effect ledger, "
        "approvals, audit",
    ),
    (
        "serve",
        "console",
        "the operator console: invocations, trajectories, approvals inbox, live streams, "
        "a JSON API (the console extra)",
    ),
    (
        "replay",
        "replay",
        "re-drive recorded invocations under an agent, calling nothing; report departures",
    ),
    (
        "fork",
        "fork",
        "a new invocation from a past step of another (nothing re-executed), then live",
    ),
)
"""Every command in the order ``--help`` lists them: name, group, help.

The group names the module that runs it (``loop_actors.cli.<group>``) and the one that
adds its options (``loop_actors.cli.options.<group>``).
"""

AddArguments = Callable[[argparse.ArgumentParser], None]


class CommandOptions(Protocol):
    """A module of ``loop_actors.cli.options``: the options of a group's commands."""

    ARGUMENTS: Mapping[str, AddArguments]
    """Each command's function that adds its options (and sub-commands) to its parser."""


class CommandGroup(Protocol):
    """A module of this package that runs some commands."""

    def run(self, args: argparse.Namespace) -> int:
        """Run the parsed command; return its exit code."""
        ...


def command_options(name: str) -> CommandOptions:
    """The module ``loop_actors.cli.options.<name>`` (it imports nothing heavy)."""
    return cast(CommandOptions, importlib.import_module(f"loop_actors.cli.options.{name}"))


def command_group(name: str) -> CommandGroup:
    """The module ``loop_actors.cli.<name>``, imported now (it imports trio, eventsourcing)."""
    return cast(CommandGroup, importlib.import_module(f"loop_actors.cli.{name}"))


class CliParser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line and exits 2.

    Given ``add_arguments``, it adds them the first time it parses (or prints help).
    Every command's parser, sub-commands' too (``audit verify``), takes the log options
    (:func:`log_options`); given there, they override those given before the command.
    """

    def __init__(
        self,
        *args: Any,
        add_arguments: AddArguments | None = None,
        top: bool = False,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self._add_arguments = add_arguments
        log_options(self, default=None if top else argparse.SUPPRESS)

    def _complete(self) -> None:
        if self._add_arguments is not None:
            add_arguments, self._add_arguments = self._add_arguments, None
            add_arguments(self)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """Add the lazy arguments, then parse as argparse does."""
        self._complete()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        """The help, with the lazy arguments."""
        self._complete()
        return super().format_help()

    def format_usage(self) -> str:
        """The usage line, with the lazy arguments."""
        self._complete()
        return super().format_usage()

    def error(self, message: str) -> NoReturn:
        """Print a one-line usage error and exit 2."""
        self.exit(ExitCode.USAGE_ERROR, f"{self.prog}: error: {message} (see --help)\n")


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


SHARED_DB_HELP = "sqlite:///path.db or postgresql://user:password@host:port/dbname"
"""For the commands whose store other processes must share (``memory://`` is refused)."""


def db_option(sub: argparse.ArgumentParser, *, shared: bool = False) -> None:
    """The ``--db URL`` option (``shared``: a store other processes use, never ``memory://``)."""
    sub.add_argument("--db", metavar="URL", help=SHARED_DB_HELP if shared else DB_HELP)


def views_option(sub: argparse.ArgumentParser) -> None:
    """The ``--db URL`` and ``--views FILE`` options of the commands that read read models."""
    db_option(sub)
    sub.add_argument(
        "--views", metavar="FILE", help="the read models' SQLite file (default: X.views.db)"
    )


def checkpoint_options(sub: argparse.ArgumentParser) -> None:
    """The options of every command that runs invocations: automatic checkpoints."""
    sub.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help=f"write checkpoints of the log to DIR, outside the store (${CHECKPOINT_DIR_ENV})",
    )
    sub.add_argument(
        "--checkpoint-key",
        metavar="KEYFILE",
        help=f"sign them with this private key file (${CHECKPOINT_KEY_ENV})",
    )
    sub.add_argument(
        "--checkpoint-every",
        metavar="N",
        type=positive_int,
        help=f"and after every N commits when no run ends (${CHECKPOINT_EVERY_ENV}; "
        f"default {DEFAULT_CHECKPOINT_EVERY})",
    )


LOG_FORMAT_ENV = "LOOP_ACTORS_LOG_FORMAT"
LOG_LEVEL_ENV = "LOOP_ACTORS_LOG_LEVEL"
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
"""``--log-format`` and ``--log-level`` values (``loop_actors._logs``'s; a test checks)."""


def log_level(text: str) -> str:
    """An argparse type: a logging level's name, in either case."""
    level = text.lower()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(LOG_LEVELS)}, got {text!r}")
    return level


def log_options(parser: argparse.ArgumentParser, *, default: object) -> None:
    """``--log-format`` and ``--log-level``: taken before the command or after it."""
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=default,
        help=f"how log records are written to stderr: text (the message, then "
        f"[level logger field=value ...]) or json (one object a line); ${LOG_FORMAT_ENV}, "
        "else text",
    )
    parser.add_argument(
        "--log-level",
        type=log_level,
        metavar="LEVEL",
        default=default,
        help=f"the least severe records written: {', '.join(LOG_LEVELS)} "
        f"(${LOG_LEVEL_ENV}, else warning)",
    )


def _lazy_arguments(group: str, command: str) -> AddArguments:
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        command_options(group).ARGUMENTS[command](parser)

    return add_arguments


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``loop-actors``; each parsed command's ``group`` is its module's name."""
    parser = CliParser(
        top=True,
        prog="loop-actors",
        description="Run, inspect and audit event-sourced agent loops.",
        epilog="Database: --db URL, else $LOOP_ACTORS_DB, else sqlite:///loop-actors.db. "
        "Exit codes: 0 completed, 3 paused, 4 other terminal reason, 2 bad usage, 1 internal, "
        "6 another process drives the invocation (holds its lease, or lease_lost); "
        "reconcile: 5 an effect needs a person.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=CliParser)
    for name, group, text in COMMANDS:
        sub = commands.add_parser(name, help=text, add_arguments=_lazy_arguments(group, name))
        sub.set_defaults(group=group)
    return parser
