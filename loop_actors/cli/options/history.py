"""The options of ``history``."""

from __future__ import annotations

import argparse

from loop_actors.cli.parser import AddArguments, db_option


def _add_history(history: argparse.ArgumentParser) -> None:
    history.add_argument("invocation_id", metavar="ID")
    history.add_argument("--json", action="store_true", help="one JSON object a line")
    db_option(history)


ARGUMENTS: dict[str, AddArguments] = {"history": _add_history}
