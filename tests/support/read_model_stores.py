"""Read models on both stores: SQLite files, and the event store's own PostgreSQL database.

Until the runtime writes to PostgreSQL, a PostgreSQL event store for these tests is
an eventsourcing ``PostgresApplicationRecorder`` (our application, our mapper) into
which the events of a SQLite store are copied in their order: the read models then
read its notification log and live in the same database, as they do for a store
on PostgreSQL.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import psycopg
from eventsourcing.application import Application
from eventsourcing.persistence import StoredEvent

from loop_actors.store.store import EventStore, InvocationApplication
from projections import Projection, ProjectionRunner, default_projections

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


class ReadModelDatabases:
    """A test's read models on one backend, by name: SQLite files, or PostgreSQL databases.

    On PostgreSQL each name is a fresh database holding a copy of the store's
    events (``sync`` copies the ones added since) and its read models.
    """

    def __init__(self, backend: str, folder: Path, admin_url: str | None) -> None:
        self.backend = backend
        self.folder = folder
        self.admin_url = admin_url
        self.copies: dict[str, tuple[str, Application[Any], int]] = {}

    def open(
        self,
        store: EventStore,
        name: str,
        projections: Sequence[Projection] | None = None,
        *,
        batch_size: int = 500,
        after_batch: Callable[[str, int], None] | None = None,
    ) -> ProjectionRunner:
        """A runner on the read models ``name`` of ``store`` (its events copied first)."""
        chosen = list(projections) if projections is not None else default_projections()
        if self.backend == "sqlite":
            return ProjectionRunner(
                store.app,
                str(self.folder / f"{name}.db"),
                chosen,
                batch_size=batch_size,
                after_batch=after_batch,
                store_id=store.store_id,
            )
        self.sync(store)
        if name not in self.copies:
            url = self._create_database()
            application = postgres_application(url)
            self.copies[name] = (url, application, copy_events(store, application))
        url, application, _ = self.copies[name]
        return ProjectionRunner(
            application,
            url,
            chosen,
            batch_size=batch_size,
            after_batch=after_batch,
            store_id=store.store_id,
        )

    def sync(self, store: EventStore) -> None:
        """Copy the events the store got since into every PostgreSQL copy."""
        for name, (url, application, position) in list(self.copies.items()):
            self.copies[name] = (url, application, copy_events(store, application, after=position))

    def _create_database(self) -> str:
        assert self.admin_url is not None
        name = f"la_test_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=5) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return urlunsplit(urlsplit(self.admin_url)._replace(path=f"/{name}"))

    def raw(self, url: str) -> psycopg.Connection[Any]:
        """An autocommit connection to one of the copies (to change it behind the runner)."""
        return psycopg.connect(url, autocommit=True, connect_timeout=5)

    def close(self) -> None:
        """Close the copies and drop their databases."""
        for url, application, _ in self.copies.values():
            application.close()
            name = urlsplit(url).path.lstrip("/")
            assert self.admin_url is not None
            with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=5) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.copies.clear()


def dump_tables(
    runner: ProjectionRunner, tables: Sequence[str]
) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of ``tables``, sorted: to compare two sets of read models on one backend."""
    return {
        table: sorted(
            (tuple(row.values()) for row in runner.query(f"SELECT * FROM {table}")),  # noqa: S608
            key=repr,
        )
        for table in tables
    }
