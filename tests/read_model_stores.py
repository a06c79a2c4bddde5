"""Read models on both stores: SQLite files, and the event store's own PostgreSQL database.

Until the runtime writes to PostgreSQL, a PostgreSQL event store for these tests is
an eventsourcing ``PostgresApplicationRecorder`` (our application, our mapper) into
which the events of a SQLite store are copied in their order: the read models then
read its notification log and live in the same database, as they do for a store
on PostgreSQL.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

from eventsourcing.application import Application
from eventsourcing.persistence import StoredEvent

from loop_actors._store import EventStore, InvocationApplication

BACKENDS = ["sqlite", "postgresql"]
"""The parameter of the tests that run on both stores."""


def postgres_application(url: str) -> Application[Any]:
    """Our eventsourcing application on the PostgreSQL database at ``url``."""
    parts = urlsplit(url)
    return InvocationApplication(
        env={
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": unquote(parts.path.lstrip("/")),
            "POSTGRES_HOST": parts.hostname or "localhost",
            "POSTGRES_PORT": str(parts.port or 5432),
            "POSTGRES_USER": unquote(parts.username or ""),
            "POSTGRES_PASSWORD": unquote(parts.password or ""),
        }
    )


def copy_events(store: EventStore, application: Application[Any], *, after: int = 0) -> int:
    """Copy the store's events past position ``after`` into ``application``, in order.

    Returns the store's position reached.
    """
    recorder = store.app.recorder
    position = after
    while notifications := recorder.select_notifications(
        start=position, limit=500, inclusive_of_start=False
    ):
        application.recorder.insert_events(
            [
                StoredEvent(
                    originator_id=n.originator_id,
                    originator_version=n.originator_version,
                    topic=n.topic,
                    state=n.state,
                )
                for n in notifications
            ]
        )
        position = notifications[-1].id
    return position
