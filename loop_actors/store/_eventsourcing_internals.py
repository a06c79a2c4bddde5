"""The one door to eventsourcing's internals that the store relies on.

eventsourcing documents its applications, recorders and datastores, not how
its SQLite connection pool picks a journal mode, nor how its frozen ``Notification``
keeps its fields. What the store needs of such
undocumented behaviour is written here, once, so that an upgrade of
eventsourcing that changes it fails in one place: ``tests/store/test_eventsourcing_internals.py``
checks every member named in :data:`RELIED_ON` still exists with the shape
used (the PostgreSQL recorder's overrides and ``projections/sql.py``'s use of
the SQLite connection are listed there too; ``projections`` may not import
``loop_actors``, so its two uses stay in place and are checked from here).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit
from uuid import UUID

from eventsourcing.persistence import Notification
from eventsourcing.sqlite import SQLiteConnectionPool


@dataclass(frozen=True)
class PrivateMember:
    """One undocumented member of eventsourcing that loop-actors uses or overrides.

    Attributes:
        module: the module that defines ``owner``.
        owner: the class.
        member: the attribute or method name.
        parameters: a method's parameter names, as ``inspect.signature`` gives
            them; None for a plain attribute.
        used_by: where loop-actors (or ``projections``) relies on it, and how.
    """

    module: str
    owner: str
    member: str
    parameters: tuple[str, ...] | None
    used_by: str


RELIED_ON: tuple[PrivateMember, ...] = (
    PrivateMember(
        "eventsourcing.sqlite",
        "SQLiteConnectionPool",
        "is_journal_mode_wal",
        None,
        "keep_journal_mode, here: set so that a read-only open keeps the journal mode",
    ),
    PrivateMember(
        "eventsourcing.sqlite",
        "SQLiteConnectionPool",
        "_create_connection",
        ("self",),
        "projections/sql.py overrides it to set its connections' synchronous pragma",
    ),
    PrivateMember(
        "eventsourcing.sqlite",
        "SQLiteConnection",
        "__init__",
        ("self", "sqlite_conn", "max_age"),
        "projections/sql.py reads the sqlite3 connection it keeps as _sqlite_conn",
    ),
    PrivateMember(
        "eventsourcing.postgres",
        "PostgresApplicationRecorder",
        "_lock_table",
        ("self", "curs"),
        "store/postgres.py overrides it to bound the wait for the table lock",
    ),
    PrivateMember(
        "eventsourcing.postgres",
        "PostgresApplicationRecorder",
        "_fetch_ids_after_insert_events",
        ("self", "curs", "stored_events", "_"),
        "store/postgres.py overrides it to note that only COMMIT is left to send",
    ),
    PrivateMember(
        "eventsourcing.postgres",
        "PostgresApplicationRecorder",
        "lock_table_statements",
        None,
        "store/postgres.py runs its statements after its own lock_timeout",
    ),
)
"""The members of eventsourcing used outside its documented interface."""


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


def notification(
    row_id: int, originator_id: UUID | str, originator_version: int, topic: str, state: bytes
) -> Notification:
    """``Notification(id=row_id, ...)`` without the frozen dataclass's ``__init__``.

    The same fields in the same order in its ``__dict__`` (so equal, and alike in every
    way), set at once instead of by five ``object.__setattr__`` calls: a read model's
    catch-up reads every row. Used only when :data:`NOTIFICATIONS_SET_AT_ONCE`.
    """
    made = _new_object(Notification)
    made.__dict__.update(
        originator_id=originator_id,
        originator_version=originator_version,
        topic=topic,
        state=state,
        id=row_id,
    )
    return made


_new_object = object.__new__


def _fields_set_at_once() -> bool:
    """Whether :func:`notification` makes what ``Notification(...)`` makes (it has for 9.5).

    A ``Notification`` whose class holds its fields in slots, or runs code when made,
    could not be made so: eventsourcing's own reads are used then.
    """
    built = Notification(originator_id="x", originator_version=1, topic="t", state=b"s", id=2)
    if hasattr(Notification, "__post_init__") or not hasattr(built, "__dict__"):
        return False
    made = notification(2, "x", 1, "t", b"s")
    return made == built and list(vars(made).items()) == list(vars(built).items())


NOTIFICATIONS_SET_AT_ONCE = _fields_set_at_once()
"""Whether this eventsourcing's ``Notification`` can be made by :func:`notification`."""
