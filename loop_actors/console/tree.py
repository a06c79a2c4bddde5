"""A whole tree's committed events in commit order: an invocation and every one below it.

``GET /api/invocations/{id}/tree/events`` streams them: each event's SSE ``id`` is its
place in the store's log (its notification id), one number across the tree, so that
``Last-Event-ID`` resumes the tree as it resumes one invocation. An invocation joins
the tree when its ``InvocationStarted`` names a member as its parent; the log holds
that event before any other of the child's, so no event of a child is passed over.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aggregates.invocation import InvocationStarted
from loop_actors.store.history_records import history_records
from loop_actors.store.store import EventStore

PAGE = 500
"""Log rows read at a time."""


@dataclass
class TreeCursor:
    """Where a tree's stream is: the members known, and the last log row looked at."""

    root_id: str
    after: int
    members: set[str] = field(default_factory=set)
    ended: bool = False
    """True once the root's ``Terminated`` was given."""


def open_tree(store: EventStore, root_id: str, *, after: int) -> TreeCursor:
    """The cursor of the tree of ``root_id`` at log row ``after``: its members started by then.

    Raises:
        InvocationNotFoundError: no such invocation.
    """
    store.events(root_id, limit=1)  # raises when there is none
    cursor = TreeCursor(root_id, after=0, members={root_id})
    while True:  # the children started up to ``after``, in log order
        rows = store.notifications_after(cursor.after, limit=PAGE, topics=[InvocationStarted.TOPIC])
        rows = [row for row in rows if row[0] <= after]
        for _, originator, _, _ in rows:
            _join_if_child(store, cursor, originator)
        if len(rows) < PAGE:
            break
        cursor.after = rows[-1][0]
    cursor.after = after
    return cursor


def tree_records(
    store: EventStore, cursor: TreeCursor
) -> tuple[list[tuple[int, dict[str, Any]]], bool]:
    """The tree's records in the next page of the log (blocking), each with its log row.

    Each record is the ``history --json`` line of the event. Moves the cursor; the flag
    says whether the page was full (more rows may follow at once).
    """
    found: list[tuple[int, dict[str, Any]]] = []
    rows = store.notifications_after(cursor.after, limit=PAGE)
    for notification_id, originator, version, topic in rows:
        if topic == InvocationStarted.TOPIC and originator not in cursor.members:
            _join_if_child(store, cursor, originator)
        if originator in cursor.members:
            record = history_records(store, originator, after=version - 1)[0]
            found.append((notification_id, record))
            if originator == cursor.root_id and record["type"] == "Terminated":
                cursor.ended = True
        cursor.after = notification_id
        if cursor.ended:
            break
    return found, len(rows) == PAGE


def _join_if_child(store: EventStore, cursor: TreeCursor, invocation_id: str) -> None:
    (first,) = store.events(invocation_id, limit=1)
    parent = first.parent if isinstance(first, InvocationStarted) else None
    if parent is not None and parent.parent_id in cursor.members:
        cursor.members.add(invocation_id)
