"""The ``store copy`` command: copy a store into an empty one and check the copy."""

from __future__ import annotations

import argparse
import sys

from loop_actors.audit.store_copy import copy_store
from loop_actors.cli.exit_codes import ExitCode


def run(args: argparse.Namespace) -> int:
    """``store copy --from URL --to URL``: exit 0 when the copy equals its source, else 4."""
    report = copy_store(args.source, args.target, progress=None if args.json else _copied)
    if args.json:
        print(report.model_dump_json())
    else:
        print(
            f"copied {report.copied} rows"
            + (f" after the {report.already} already there" if report.already else "")
            + f" and {report.snapshots} snapshots"
            + (f" and {report.secrets} sealed secrets" if report.secrets else "")
            + f" from {report.source} to {report.target}"
        )
        same = "the same as the source's" if report.same_as_source else "NOT the source's"
        print(f"log: {report.size} rows, head {report.head} ({same})")
        print(f"audit of the copy: {report.intact} intact, {report.broken} broken")
    return ExitCode.OK if report.ok else ExitCode.TAMPERED


def _copied(rows: int) -> None:
    if rows % 10_000 == 0:
        print(f"loop-actors: {rows} rows copied", file=sys.stderr)
