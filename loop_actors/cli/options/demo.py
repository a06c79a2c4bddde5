"""The options of ``demo``."""

from __future__ import annotations

import argparse

from loop_actors.cli.parser import AddArguments, checkpoint_options, db_option


def _add_demo(demo: argparse.ArgumentParser) -> None:
    db_option(demo)
    checkpoint_options(demo)


ARGUMENTS: dict[str, AddArguments] = {"demo": _add_demo}
