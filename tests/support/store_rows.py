"""What a store holds, read directly (no runtime opened): its invocations' ids, its queue rows."""

from __future__ import annotations

from aggregates.lease import QueueRow
from loop_actors.store.store import EventStore


def queue_rows(db_url: str) -> dict[str, QueueRow]:
    """Every row of the store's queue, by invocation id (SQLite or PostgreSQL)."""
    store = EventStore(db_url, create=False)
    try:
        queue = store.open_queue()
        try:
            rows, _ = queue.rows(limit=None)
        finally:
            queue.close()
    finally:
        store.close()
    return {row.invocation_id: row for row in rows}


def stored_ids(db_url: str) -> list[str]:
    """The ids of the store's invocations, sorted."""
    store = EventStore(db_url, create=False)
    try:
        return sorted(store.invocation_ids())
    finally:
        store.close()
