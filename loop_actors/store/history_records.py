"""An invocation's committed events as ``loop-actors history --json`` prints them.

One record a line, each with its chain hash and the one before it, so that an export
(or a stream of them, ``GET /api/invocations/{id}/events``) can be verified without
this package.
"""

from __future__ import annotations

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
from loop_actors._errors import InvocationNotFoundError
from loop_actors.store.store import EventStore


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


def history_records(
    store: EventStore, invocation_id: str, *, after: int = 0
) -> list[dict[str, Any]]:
    """The ``history --json`` records of an invocation's events after position ``after`` (blocking).

    Reads only those events and the one at ``after`` (for its chain hash). ``after``
    past the last event gives no records.

    Raises:
        InvocationNotFoundError: no such invocation.
    """
    start = max(after - 1, 0)
    try:
        events = store.events(invocation_id, after=start)
    except InvocationNotFoundError:
        if start == 0:
            raise
        store.events(invocation_id, after=0)  # raises when there is no such invocation
        return []
    forms: dict[int, StoredForm] = {}
    store.stored_entries(invocation_id, forms=forms, after=start)
    previous = GENESIS
    records = []
    for event in events:
        if event.originator_version > after:
            records.append(event_record(event, previous, forms.get(event.originator_version)))
        previous = event.chain_hash
    return records


__all__ = ["event_record", "history_records"]
