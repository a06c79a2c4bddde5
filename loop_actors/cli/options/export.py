"""The options of ``export``."""

from __future__ import annotations

import argparse

from loop_actors.cli.parser import AddArguments, views_option


def _add_export(export: argparse.ArgumentParser) -> None:
    export.add_argument("invocation_id", metavar="ID")
    export.add_argument(
        "--html",
        required=True,
        metavar="FILE",
        help="write one self-contained HTML file: the trajectory, the effect ledger, the "
        "approvals and the audit of its chains",
    )
    views_option(export)


ARGUMENTS: dict[str, AddArguments] = {"export": _add_export}
