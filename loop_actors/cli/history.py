"""The ``history`` command: an invocation's committed events, as text or JSON lines."""

from __future__ import annotations

import argparse
import json
from typing import Any

from loop_actors._terminal import terminal_safe
from loop_actors.cli.exit_codes import ExitCode
from loop_actors.cli.reading import open_for_reading
from loop_actors.store.history_records import event_record, history_records


def record_line(record: dict[str, Any]) -> str:
    """A history record as one readable line (``history``, ``watch``), escaped for the terminal."""
    data = json.dumps(record["data"], separators=(",", ":"), sort_keys=True)
    if len(data) > 160:
        data = data[:159] + "…"
    return terminal_safe(
        f"{record['position']:>4}  {record['timestamp']}  {record['type']:<18} {data}"
    )


def run(args: argparse.Namespace) -> int:
    """``history ID``: print the events, one a line."""
    store = open_for_reading(args.db)
    try:
        if args.json:
            for record in history_records(store, args.invocation_id):
                print(json.dumps(record, ensure_ascii=False))
            return ExitCode.OK
        events = store.events(args.invocation_id)
    finally:
        store.close()
    for event in events:
        print(record_line(event_record(event, "")))
    return ExitCode.OK
