"""The options of ``store copy``."""

from __future__ import annotations

import argparse

from loop_actors.cli.parser import DB_HELP, AddArguments, CliParser


def _add_store(store: argparse.ArgumentParser) -> None:
    store_commands = store.add_subparsers(
        dest="store_command", required=True, parser_class=CliParser
    )
    copy = store_commands.add_parser(
        "copy",
        help="copy every event (with its id, in order) and snapshot into an empty store, "
        "then check that its audit and log head equal the source's",
    )
    copy.add_argument("--from", dest="source", metavar="URL", required=True, help=DB_HELP)
    copy.add_argument("--to", dest="target", metavar="URL", required=True, help=DB_HELP)
    copy.add_argument("--json", action="store_true", help="print the report as JSON")


ARGUMENTS: dict[str, AddArguments] = {"store": _add_store}
