"""What a store holds, read directly (no runtime opened): its invocations' ids, its queue rows."""

from __future__ import annotations

from aggregates.lease import QueueRow
from loop_actors.store.queue import open_queue
from loop_actors.store.store import EventStore
from loop_actors.store.url import StoreUrl


def queue_rows(db_url: str) -> dict[str, QueueRow]:
    """Every row of the store's queue, by invocation id (SQLite or PostgreSQL)."""
    url = StoreUrl.parse(db_url)
    target = str(url.path) if url.kind == "sqlite" else url.url
    queue = open_queue(url.kind, target)
    try:
        rows, _ = queue.rows(limit=None)
    finally:
        queue.close()
    return {row.invocation_id: row for row in rows}


def stored_ids(db_url: str) -> list[str]:
    """The ids of the store's invocations, sorted."""
    store = EventStore(db_url, create=False)
    try:
        return sorted(store.invocation_ids())
    finally:
        store.close()
