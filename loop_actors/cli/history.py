"""The ``history`` command: an invocation's committed events, as text or JSON lines."""

from __future__ import annotations

import argparse
import json
from typing import Any

from aggregates.audit import (
    AUDIT_FORMAT,
    GENESIS,
    StoredForm,
    canonical_record,
    event_body,
    record_data,
    split_stored,
    topic_of,
)
from aggregates.invocation import InvocationEvent
from loop_actors._terminal import terminal_safe
from loop_actors.cli.exit_codes import ExitCode
from loop_actors.cli.reading import open_for_reading


def event_record(
    event: InvocationEvent, previous_hash: str, form: StoredForm | None = None
) -> dict[str, Any]:
    """One history line: the event's record, its chain hash and the previous one.

    ``position`` is the event's place in its invocation. For an event of audit format 1,
    ``data`` is the canonical data that the hash covers; for format 2 the line also
    has ``format``, ``topic`` and ``stored``, the body exactly as stored (``form``, the
    row as read), which is what the hash covers (see ``aggregates.audit``). Either way
    the export can be verified without this package.
    """
    record = canonical_record(event)
    if getattr(event, "audit_format", None) == AUDIT_FORMAT:
        split = split_stored(form.state) if form is not None else None
        body = split[1] if split is not None else event_body(event)
        record["data"], record["timestamp"] = record_data(json.loads(body))
        record["format"] = AUDIT_FORMAT
        record["topic"] = form.topic if form is not None else topic_of(type(event))
        record["stored"] = body.decode()
    record["invocation_id"] = event.originator_id
    record["hash"] = event.chain_hash
    record["previous_hash"] = previous_hash
    return record


def _event_line(event: InvocationEvent) -> str:
    record = event_record(event, "")
    data = json.dumps(record["data"], separators=(",", ":"), sort_keys=True)
    if len(data) > 160:
        data = data[:159] + "…"
    return terminal_safe(
        f"{record['position']:>4}  {record['timestamp']}  {record['type']:<18} {data}"
    )


def run(args: argparse.Namespace) -> int:
    """``history ID``: print the events, one a line."""
    store = open_for_reading(args.db)
    forms: dict[int, StoredForm] = {}
    try:
        events = store.events(args.invocation_id)
        if args.json:
            store.stored_entries(args.invocation_id, forms=forms)
    finally:
        store.close()
    previous = GENESIS
    for event in events:
        if args.json:
            record = event_record(event, previous, forms.get(event.originator_version))
            print(json.dumps(record, ensure_ascii=False))
        else:
            print(_event_line(event))
        previous = event.chain_hash
    return ExitCode.OK
