"""The options of ``trace export``."""

from __future__ import annotations

import argparse

from loop_actors.cli.parser import AddArguments, CliParser, db_option


def _add_trace(trace_cmd: argparse.ArgumentParser) -> None:
    actions = trace_cmd.add_subparsers(dest="trace_command", required=True, parser_class=CliParser)
    export = actions.add_parser(
        "export",
        help="send an invocation's spans (and those of its children and handoff), rebuilt "
        "from its history, "
        "to an OTLP/HTTP endpoint or an OTLP/JSON file: the same trace and span ids as when "
        "it ran",
    )
    export.add_argument("invocation_id", metavar="ID")
    target = export.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--otlp",
        metavar="URL",
        help="the OTLP/HTTP endpoint (http://host:4318 sends to /v1/traces)",
    )
    target.add_argument(
        "--out",
        metavar="FILE",
        help="write them to FILE as OTLP/JSON instead (one line; - for stdout)",
    )
    export.add_argument(
        "--content",
        action="store_true",
        help="include goal, decisions, tool arguments and outputs, as stored (redacted)",
    )
    db_option(export)


ARGUMENTS: dict[str, AddArguments] = {"trace": _add_trace}
