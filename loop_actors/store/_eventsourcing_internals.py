"""The one door to eventsourcing's internals that the store relies on.

eventsourcing documents its applications, recorders and datastores, not how
its SQLite connection pool picks a journal mode. What the store needs of such
undocumented behaviour is written here, once, so that an upgrade of
eventsourcing that changes it fails in one place: ``tests/test_eventsourcing_internals.py``
checks every member named in :data:`RELIED_ON` still exists with the shape
used here.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from eventsourcing.sqlite import SQLiteConnectionPool

RELIED_ON: tuple[tuple[type, str], ...] = (
    (SQLiteConnectionPool, "is_journal_mode_wal"),
    (SQLiteConnectionPool, "_create_connection"),
)
"""The members of eventsourcing used through this module (class, member name)."""


def is_read_only_uri(db_name: str) -> bool:
    """Whether an SQLite database name is a ``file:`` URI that opens it ``mode=ro``."""
    if not db_name.startswith("file:"):
        return False
    return "ro" in parse_qs(urlsplit(db_name).query).get("mode", [])


def keep_journal_mode(pool: SQLiteConnectionPool) -> None:
    """Make the pool's connections leave the database's journal mode as it is.

    eventsourcing's pool runs ``PRAGMA journal_mode=WAL`` on the first
    connection it opens to a file whose journal mode is another (a backup copy
    made with ``VACUUM INTO`` is a rollback-journal file): a write, which a
    ``mode=ro`` connection refuses with "attempt to write a readonly database".
    A reader has no reason to change the mode, and the pool skips the switch
    once it believes the mode is WAL already.
    """
    pool.is_journal_mode_wal = True
