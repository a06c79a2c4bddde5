"""The options of ``schedule add|list|pause|resume|remove``.

The literals below are ``aggregates.schedules``' values (a test checks that they
agree): written here so that these options import nothing heavy.
"""

from __future__ import annotations

import argparse

from loop_actors.cli.parser import AddArguments, CliParser, db_option

OVERLAPS = ["skip", "queue", "allow"]
"""The values of ``aggregates.schedules.Overlap``, in its order."""
CATCH_UPS = ["none", "one", "all"]
"""The values of ``aggregates.schedules.CatchUp``, in its order."""
DEFAULT_OVERLAP = "skip"
DEFAULT_CATCH_UP = "one"
DEFAULT_TIME_ZONE = "UTC"


def _add_schedule(schedule: argparse.ArgumentParser) -> None:
    actions = schedule.add_subparsers(
        dest="schedule_command", required=True, parser_class=CliParser
    )
    add = actions.add_parser(
        "add", help="add a schedule: workers serving the agent submit a run at each due time"
    )
    add.add_argument("name", metavar="NAME", help="its name, part of its runs' ids (NAME@TIME)")
    add.add_argument(
        "--agent",
        dest="schedule_agent",
        required=True,
        metavar="MODULE:ATTR",
        help="the agent its runs run (a worker serving it runs the schedule)",
    )
    add.add_argument("--goal", required=True, help="each run's goal")
    timing = add.add_mutually_exclusive_group(required=True)
    timing.add_argument(
        "--every",
        metavar="N{s,m,h}",
        help="due every N seconds, minutes or hours (15m: at :00, :15, :30 and :45 UTC)",
    )
    timing.add_argument(
        "--cron",
        metavar='"M H DOM MON DOW"',
        help='due when the five cron fields match the wall-clock time of --tz ("0 9 * * 1-5")',
    )
    add.add_argument(
        "--tz",
        metavar="ZONE",
        help=f"the IANA time zone --cron is read in (default {DEFAULT_TIME_ZONE})",
    )
    add.add_argument(
        "--overlap",
        choices=OVERLAPS,
        default=DEFAULT_OVERLAP,
        help="while the previous run has not ended: skip the due time, queue it until the "
        f"previous one ended, or allow runs side by side (default {DEFAULT_OVERLAP})",
    )
    add.add_argument(
        "--catch-up",
        choices=CATCH_UPS,
        default=DEFAULT_CATCH_UP,
        help="due times missed while no worker ran: run none, the latest one, or all "
        f"(default {DEFAULT_CATCH_UP})",
    )
    _json_option(add)
    db_option(add, shared=True)
    listing = actions.add_parser("list", help="every schedule, with its next due time")
    _json_option(listing, "one JSON object a schedule, a line")
    db_option(listing, shared=True)
    for verb, text in (
        ("pause", "pause a schedule: its due times pass unrun until it is resumed"),
        ("resume", "resume a paused schedule, from its next due time on"),
        ("remove", "remove a schedule (its runs are left as they are)"),
    ):
        sub = actions.add_parser(verb, help=text)
        sub.add_argument("name", metavar="NAME", help="the schedule's name")
        if verb != "remove":
            _json_option(sub)
        db_option(sub, shared=True)


def _json_option(sub: argparse.ArgumentParser, text: str = "print the schedule as JSON") -> None:
    sub.add_argument("--json", action="store_true", help=text)


ARGUMENTS: dict[str, AddArguments] = {"schedule": _add_schedule}
