"""What the commands that only read share: the store opened read-only, and notes."""

from __future__ import annotations

import sys

from loop_actors.store.store import EventStore
from loop_actors.store.url import resolve_db_url


def note(text: str) -> None:
    """Print ``loop-actors: note: TEXT`` on stderr."""
    print(f"loop-actors: note: {text}", file=sys.stderr)


def open_for_reading(db: str | None) -> EventStore:
    """The store, opened read-only: the commands that only read never write it."""
    store = EventStore(resolve_db_url(db), create=False, read_only=True)
    for text in store.notes:
        note(text)
    return store
