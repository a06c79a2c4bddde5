"""The event store: eventsourcing's Application on a SQLite file (default) or in-memory database.

All methods here block; trio code reaches them through the Journal (writes) or
``trio.to_thread.run_sync`` (reads), never directly from the trio thread.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import sqlite3
import stat
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache, lru_cache
from pathlib import Path
from typing import Any, ClassVar, cast
from urllib.parse import parse_qs, urlsplit
from uuid import UUID, uuid4

from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.persistence import (
    DatabaseError,
    IntegrityError,
    InterfaceError,
    Mapper,
    NotSupportedError,
    OperationalError,
    PersistenceError,
    StoredEvent,
    Transcoder,
)
from eventsourcing.sqlite import (
    SQLITE3_DEFAULT_LOCK_TIMEOUT,
    SQLiteApplicationRecorder,
    SQLiteDatastore,
)
from eventsourcing.utils import TopicError, get_topic, resolve_topic
from pydantic_core import to_json

from aggregates.audit_coverage import event_classes
from aggregates.effect import Effect, EffectPrepared
from aggregates.events import DomainEvent, fold
from aggregates.ids import CANCEL_REQUEST_PREFIX
from aggregates.invocation import (
    Invocation,
    InvocationEvent,
    InvocationSnapshot,
    InvocationStarted,
)
from aggregates.requests import (
    CancelRequest,
    CancelRequested,
    cancel_request_id,
)
from loop_actors._errors import (
    InvocationNotFoundError,
    StoreCipherError,
    StoreReadOnlyError,
    StoreUnavailableError,
    StoreUrlError,
)

DEFAULT_DB_URL = "sqlite:///loop-actors.db"
"""The embedded default: a SQLite file in the current directory."""

DB_URL_ENV = "LOOP_ACTORS_DB"

DEFAULT_SNAPSHOT_INTERVAL = 100
"""An invocation is snapshotted every this many events."""

DEFAULT_LOCK_RETRY_S = 2.0
"""How long the Journal retries a commit that failed on a locked database (``lock_retry``)."""


_IN_COLUMNS = {"originator_id", "originator_version"}
_TOPICS: dict[type, str] = {}


def _topic_of(cls: type) -> str:
    topic = _TOPICS.get(cls)
    if topic is None:
        topic = _TOPICS[cls] = get_topic(cls)
    return topic


@cache
def _event_topics() -> frozenset[str]:
    """The topics of every loop-actors event class: all a store's event rows may name."""
    return frozenset(_topic_of(cls) for cls in event_classes())


@cache
def _class_of(topic: str) -> type[DomainEvent]:
    return cast("type[DomainEvent]", resolve_topic(topic))


class PydanticEventMapper(Mapper[str]):
    """Maps pydantic events to stored records with pydantic's own JSON codec.

    Honours eventsourcing's compressor and cipher settings (``COMPRESSOR_TOPIC``,
    ``CIPHER_TOPIC``/``CIPHER_KEY``) exactly as the default mapper does.
    """

    def to_stored_event(self, domain_event: Any) -> StoredEvent:
        """Encode one event."""
        # The id and version live in their own columns, and every optional field
        # defaults to None (a test checks this), so neither is repeated in the state.
        state = domain_event.model_dump_json(exclude=_IN_COLUMNS, exclude_none=True).encode()
        if self.compressor:
            state = self.compressor.compress(state)
        if self.cipher:
            state = self.cipher.encrypt(state)
        return StoredEvent(
            originator_id=domain_event.originator_id,
            originator_version=domain_event.originator_version,
            topic=_topic_of(type(domain_event)),
            state=state,
        )

    def to_domain_event(self, stored_event: StoredEvent) -> Any:
        """Decode one event, validating it against its class."""
        state = stored_event.state
        if self.cipher:
            state = self.cipher.decrypt(state)
        if self.compressor:
            state = self.compressor.decompress(state)
        # Put the id and version back at the front of the JSON object, so that
        # pydantic parses and validates the whole record in one (Rust) pass. (The
        # envelope is built by hand: json.dumps of a dict cost as much as the parse.)
        envelope = b"".join(
            (
                b'{"originator_id":',
                to_json(str(stored_event.originator_id)),
                b',"originator_version":',
                b"%d" % stored_event.originator_version,
            )
        )
        rest = state.strip()[1:]
        joined = envelope + (b"," + rest if rest.strip() != b"}" else b"}")
        return _class_of(stored_event.topic).model_validate_json(joined)


class _UnusedTranscoder(Transcoder):
    """The mapper above encodes with pydantic; eventsourcing still wants a transcoder."""

    def encode(self, obj: Any) -> bytes:
        raise NotImplementedError

    def decode(self, data: bytes) -> Any:
        raise NotImplementedError


class InvocationApplication(Application[str]):
    """The eventsourcing application that holds every invocation's events."""

    name = "LoopActors"
    env: ClassVar[dict[str, str]] = {"ORIGINATOR_ID_TYPE": "text", "IS_SNAPSHOTTING_ENABLED": "y"}

    def construct_mapper(self) -> Mapper[str]:
        """Use the pydantic mapper, with the configured cipher and compressor.

        Raises:
            StoreCipherError: the cipher cannot be made (its key is missing, or its
                package is not installed).
        """
        try:
            cipher = self.factory.cipher()
        except (TopicError, ImportError) as error:
            raise StoreCipherError(
                f"cannot load the store's cipher: {error} (the cipher's package is not "
                "installed; for eventsourcing's AESCipher: pip install 'loop-actors[crypto]')"
            ) from error
        except (OSError, ValueError) as error:  # eventsourcing: "'CIPHER_KEY' not in env"
            raise StoreCipherError(
                f"cannot make the store's cipher: {error} (set CIPHER_KEY to the key the "
                "store was written with)"
            ) from error
        return PydanticEventMapper(
            transcoder=_UnusedTranscoder(),
            cipher=cipher,
            compressor=self.factory.compressor(),
        )


@dataclass(frozen=True)
class StoreUrl:
    """A parsed database URL: ``sqlite:///relative.db``, ``sqlite:////abs.db`` or ``memory://``.

    Options: ``lock_timeout`` (whole seconds, at least 1; SQLite files only) is how
    long one write waits for SQLite's lock (its busy timeout); ``lock_retry``
    (seconds, fractions allowed, 0 for none) is how long the Journal goes on
    retrying a commit that failed on a lock, with backoff, before it answers that
    the commit failed.
    And ``mode=ro`` for a store that this
    process must only read (an auditor's evidence copy): read commands open it
    read-only, and every command that writes is refused.
    """

    url: str
    kind: str
    path: Path | None = None
    lock_timeout_s: int | None = None
    lock_retry_s: float = DEFAULT_LOCK_RETRY_S

    @property
    def lock_wait_s(self) -> float:
        """How long one write waits for the lock: ``lock_timeout``, else eventsourcing's default."""
        return float(self.lock_timeout_s or SQLITE3_DEFAULT_LOCK_TIMEOUT)

    read_only: bool = False

    @classmethod
    def parse(cls, url: str) -> StoreUrl:
        """Parse and check a database URL (no I/O).

        Raises:
            StoreUrlError: when the URL is not one this runtime can open.
        """
        parts = urlsplit(url)
        query = parse_qs(parts.query, keep_blank_values=True)  # "lock_timeout=" is refused
        unknown = set(query) - {"lock_timeout", "lock_retry", "mode"}
        if unknown:
            raise StoreUrlError(f"unknown database URL option(s) {sorted(unknown)} in {url!r}")
        lock_retry = DEFAULT_LOCK_RETRY_S
        if "lock_retry" in query:
            try:
                lock_retry = float(query["lock_retry"][-1])
            except ValueError:
                raise StoreUrlError(f"lock_retry must be a number of seconds in {url!r}") from None
            if not math.isfinite(lock_retry) or lock_retry < 0:
                raise StoreUrlError(f"lock_retry must be 0 or more seconds in {url!r}")
        lock_timeout: int | None = None
        if "lock_timeout" in query:
            try:
                lock_timeout = int(query["lock_timeout"][-1])
            except ValueError:
                raise StoreUrlError(f"lock_timeout must be whole seconds in {url!r}") from None
            if lock_timeout < 1:
                raise StoreUrlError(f"lock_timeout must be at least 1 second in {url!r}")
        read_only = False
        if "mode" in query:
            if query["mode"] != ["ro"]:
                raise StoreUrlError(f"the only database URL mode is mode=ro, in {url!r}")
            read_only = True
        # urlsplit reads "sqlite:/x.db" and "sqlite:x.db" as paths too: refuse what
        # is not spelled with the two slashes, rather than guess which file was meant.
        spelled_with_slashes = url[len(parts.scheme) + 1 :].startswith("//")
        if parts.scheme == "memory":
            if not spelled_with_slashes or parts.netloc or parts.path:
                raise StoreUrlError(f"an in-memory database is memory://, got {url!r}")
            if read_only:
                raise StoreUrlError(f"an in-memory store cannot be read-only, in {url!r}")
            return cls(url=url, kind="memory", lock_retry_s=lock_retry)
        if parts.scheme == "sqlite":
            if parts.netloc or not spelled_with_slashes:
                raise StoreUrlError(
                    f"a SQLite URL has three slashes, sqlite:///relative.db or "
                    f"sqlite:////absolute.db, got {url!r}"
                )
            raw_path = parts.path[1:] if parts.path.startswith("/") else parts.path
            if not raw_path or raw_path.endswith("/"):
                raise StoreUrlError(f"no database file in {url!r}")
            return cls(
                url=url,
                kind="sqlite",
                path=Path(raw_path),
                lock_timeout_s=lock_timeout,
                lock_retry_s=lock_retry,
                read_only=read_only,
            )
        raise StoreUrlError(
            f"unsupported database URL {url!r}: use sqlite:///path/to/file.db or memory://"
        )

    def environment(self) -> dict[str, str]:
        """The eventsourcing environment for this URL: SQLite with the lean recorder.

        For ``memory://``, each call names a new in-memory database, shared by
        the connections of one store and by no other store; it lasts until the
        store's last connection closes.
        """
        env = {
            "PERSISTENCE_MODULE": "eventsourcing.sqlite",
            "APPLICATION_RECORDER_TOPIC": get_topic(LeanSQLiteRecorder),
        }
        if self.kind == "memory":
            env["SQLITE_DBNAME"] = f"file:loop-actors-{uuid4().hex}?mode=memory&cache=shared"
            return env
        assert self.path is not None
        env["SQLITE_DBNAME"] = str(self.path)
        if self.lock_timeout_s is not None:
            env["SQLITE_LOCK_TIMEOUT"] = str(self.lock_timeout_s)
        return env

    def read_only_environment(self, db_uri: str) -> dict[str, str]:
        """The environment that reads the SQLite database ``db_uri`` and creates no table."""
        env = self.environment()
        env["SQLITE_DBNAME"] = db_uri
        env["CREATE_TABLE"] = "n"
        return env


def _protected(path: Path) -> bool:
    """Whether ``path`` must not be written: no write permission, or no write bit at all.

    The second test is for root, whom the permission check lets write anything:
    a file or folder that nobody may write (``chmod a-w``) is read-only to
    root here too, as ``rm`` treats a write-protected file.
    """
    try:
        mode = path.stat().st_mode
    except OSError:
        return False  # absent: whoever opens it reports that
    return not os.access(path, os.W_OK) or not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)


def sqlite_write_refusal(path: Path) -> str | None:
    """Why this process must not write the SQLite database at ``path``; None when it may.

    A WAL database also needs its ``-wal`` and ``-shm`` files next to it, so a
    folder that cannot be written refuses too, unless both already exist and
    can be written.
    """
    folder = path.parent
    if path.exists():
        if _protected(path):
            return f"{path} is read-only (mode {stat.S_IMODE(path.stat().st_mode):04o})"
        sidecars = [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm")]
        if all(sidecar.exists() and not _protected(sidecar) for sidecar in sidecars):
            return None
    if folder.is_dir() and _protected(folder):
        return (
            f"its folder {folder} is read-only "
            f"(SQLite writes {path.name}-wal and {path.name}-shm next to it)"
        )
    return None


STORE_TABLE = "loop_actors_store"
"""The table of a store's identity: one row, created with the store."""


class LeanSQLiteRecorder(SQLiteApplicationRecorder):
    """eventsourcing's SQLite application recorder with a lean insert: every store's write path.

    Both kinds of store are SQLite databases (``memory://`` is an in-memory one),
    and this is their recorder, so there is one write path, the one production
    uses. It is the only place this runtime goes around eventsourcing: the reads
    (``select_events``, ``select_notifications``, ``max_notification_id``) are
    eventsourcing's own, inherited unchanged; ``insert_events`` is replaced. The
    class is checked with eventsourcing's own recorder test cases
    (``tests/test_store_recorder_contract.py``), on a file and in memory.

    The insert writes the rows eventsourcing's recorder writes (its table, its
    insert statement; the row id is the notification id), with the same
    durability (WAL, ``synchronous=FULL``), on a connection of its own, without
    the recorder's per-transaction overhead: a new cursor per transaction, and a
    statement cache of one statement (the pool passes ``cached_statements=True``),
    so that ``BEGIN`` and ``INSERT`` evict each other and the insert is parsed
    again on every commit. Measured with ``bench/turn_overhead.py``: see
    docs/performance.md.

    A transaction is one multi-row ``INSERT`` when its rows fit in one statement
    (SQLite makes a single statement atomic and durable on its own), else
    ``BEGIN IMMEDIATE``, statements of ``rows_per_insert`` rows, ``COMMIT``. Two
    costs pull in opposite directions under load, both because of the GIL
    (docs/performance.md, section 4):

    - the sqlite3 module lets go of the GIL around every statement, and while the
      trio thread is busy, taking it back can take milliseconds: one statement a
      row made a transaction of a few hundred rows take hundreds of milliseconds;
    - binding a statement's parameters holds the GIL in C, where the trio thread
      cannot take it back: statements of up to 1,024 rows cut the time of a
      transaction further but cost about a tenth of the turns per second.

    ``MAX_ROWS_PER_INSERT`` rows a statement keeps both the number of waits and
    the length of each hold small.

    In memory, each insert holds the datastore pool's writer slot, the lock
    eventsourcing's own writes (snapshots) take: there the pool also makes readers
    and the writer exclude each other, and that is what the insert needs:
    connections to one in-memory database share its cache, and a write while a
    read is open fails at once with "database table is locked" (SQLite's busy
    timeout does not retry those; the contract's concurrent test fails so without
    the slot). On a file, WAL lets reads go on during a write and SQLite's lock
    (with its busy timeout) orders this connection's writes with every other
    connection's, eventsourcing's included; an insert holds a lock of this
    recorder only, which keeps its one connection to one thread at a time (the
    pool's slot cost about 4 us a commit, on the Journal's thread).

    Errors are eventsourcing's: ``IntegrityError`` for a position already taken
    (another writer appended first), ``OperationalError`` for a locked or broken
    database. A failed transaction is rolled back: nothing of it is written.
    """

    MAX_ROWS_PER_INSERT = 128
    """The most rows in one ``INSERT`` (also bounded by SQLite's limit on parameters)."""

    def __init__(
        self, datastore: SQLiteDatastore, events_table_name: str = "stored_events"
    ) -> None:
        """Check eventsourcing's insert statement and open the insert's own connection.

        The multi-row statements repeat the row of eventsourcing's one-row insert,
        ``INSERT INTO <table> VALUES (?,?,?,?)``.

        Raises:
            eventsourcing.persistence.NotSupportedError: eventsourcing's insert
                statement has another shape (an upgrade changed it).
            eventsourcing.persistence.InterfaceError: the database cannot be opened.
        """
        super().__init__(datastore, events_table_name)
        row = "(?,?,?,?)"
        statement = self.insert_events_statement
        if not statement.replace(" ", "").endswith("VALUES" + row):
            raise NotSupportedError(f"unexpected insert statement: {statement!r}")
        prefix = statement[: statement.rindex("(")]
        self._insert_for = lru_cache(maxsize=self.MAX_ROWS_PER_INSERT)(
            lambda rows: prefix + ",".join([row] * rows)
        )
        pool = datastore.pool
        try:
            # The pool's database name, opened as the pool opens it (a URI for
            # memory), so that both connections reach the same database.
            self._connection = sqlite3.connect(
                pool.db_name,
                uri=True,
                isolation_level=None,  # autocommit: one statement is one transaction
                check_same_thread=False,  # opened on one thread, used by the writer thread
                cached_statements=self.MAX_ROWS_PER_INSERT + 8,  # every size, BEGIN, COMMIT
                timeout=pool.lock_timeout or SQLITE3_DEFAULT_LOCK_TIMEOUT,
            )
            self._connection.execute("PRAGMA synchronous=FULL")
            parameters = self._connection.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        except sqlite3.Error as error:
            raise InterfaceError(error) from error
        self.rows_per_insert = max(1, min(self.MAX_ROWS_PER_INSERT, parameters // 4))
        self._busy_timeout_ms = int((pool.lock_timeout or SQLITE3_DEFAULT_LOCK_TIMEOUT) * 1000)
        self._cursor = self._connection.cursor()
        self._memory = bool(pool.is_sqlite_memory_mode)
        self._lock = threading.Lock()

    def insert_events(
        self,
        stored_events: Sequence[StoredEvent],
        *,
        lock_wait_s: float | None = None,
        **kwargs: Any,
    ) -> Sequence[int] | None:
        """Insert the rows in one transaction; return their notification ids, in order.

        ``lock_wait_s`` shortens the wait for SQLite's write lock for this insert
        (default: the connection's busy timeout, the URL's ``lock_timeout``); the
        Journal uses it so that its retries end when its retry window does.

        Raises:
            eventsourcing.persistence.IntegrityError: a position is already taken.
            eventsourcing.persistence.OperationalError: the database is locked or broken.
            eventsourcing.persistence.DatabaseError: any other failure of the database.
        """
        if not stored_events:
            return []
        with self._writer_slot():
            if lock_wait_s is None:
                last = self._append(stored_events)
            else:
                self._set_busy_timeout(min(self._busy_timeout_ms, int(lock_wait_s * 1000)))
                try:
                    last = self._append(stored_events)
                finally:
                    self._set_busy_timeout(self._busy_timeout_ms)
        # SQLite writes one transaction at a time and gives each new row the
        # largest row id so far plus one: the rows' ids are consecutive.
        return list(range(last - len(stored_events) + 1, last + 1))

    def _writer_slot(self) -> contextlib.AbstractContextManager[object]:
        """What an insert holds: the pool's writer slot in memory, this connection's lock on a file.

        In memory the pool's slot is what keeps readers out (class docstring). On a
        file, WAL lets reads go on and SQLite's own lock orders this connection's
        writes with any other connection's (eventsourcing's snapshots included); what
        is left to hold is the insert's one connection to one thread at a time, a
        plain lock (the pool's slot cost about 4 us a commit: docs/performance.md).
        """
        if self._memory:
            return self.datastore.get_connection(commit=True)
        return self._lock

    def _set_busy_timeout(self, milliseconds: int) -> None:
        try:
            self._connection.execute(f"PRAGMA busy_timeout = {max(0, milliseconds)}")
        except sqlite3.Error as error:
            raise OperationalError(error) from error

    def _append(self, stored: Sequence[StoredEvent]) -> int:
        cursor = self._cursor
        try:
            if len(stored) <= self.rows_per_insert:
                self._insert(stored)
                position = cursor.lastrowid
            else:
                cursor.execute("BEGIN IMMEDIATE")
                try:
                    for start in range(0, len(stored), self.rows_per_insert):
                        self._insert(stored[start : start + self.rows_per_insert])
                    position = cursor.lastrowid
                    cursor.execute("COMMIT")
                except BaseException:
                    if self._connection.in_transaction:
                        self._connection.rollback()
                    raise
        except sqlite3.IntegrityError as error:
            raise IntegrityError(error) from error
        except sqlite3.OperationalError as error:
            raise OperationalError(error) from error
        except sqlite3.Error as error:
            raise DatabaseError(error) from error
        assert position is not None  # an INSERT that succeeded sets it
        return position

    def _insert(self, rows: Sequence[StoredEvent]) -> None:
        parameters: list[object] = []
        for record in rows:
            originator_id = record.originator_id
            parameters += (
                originator_id.hex if isinstance(originator_id, UUID) else originator_id,
                record.originator_version,
                record.topic,
                record.state,
            )
        self._cursor.execute(self._insert_for(len(rows)), parameters)

    def store_identity(self, *, create: bool) -> str | None:
        """The store's identity, created first when ``create`` and there is none yet.

        The identity is a UUID in a one-row table of the store's own database,
        written once: processes that race to create it all read the one that
        was inserted first (the row's key admits one row). Without ``create``
        (a read-only store), a store older than identities has none: None.

        Raises:
            eventsourcing.persistence.OperationalError: the database is locked or broken.
        """
        cursor = self._connection.cursor()
        try:
            found = self._select_identity(cursor)
            if found is not None or not create:
                return found
            with self._writer_slot():
                cursor.execute(
                    "CREATE TABLE IF NOT EXISTS loop_actors_store ("
                    "singleton INTEGER PRIMARY KEY CHECK (singleton = 1), "
                    "store_id TEXT NOT NULL, created_at TEXT NOT NULL)"
                )
                cursor.execute(
                    "INSERT OR IGNORE INTO loop_actors_store (singleton, store_id, created_at) "
                    "VALUES (1, ?, ?)",
                    (str(uuid4()), datetime.now(UTC).isoformat()),
                )
            found = self._select_identity(cursor)
        except sqlite3.OperationalError as error:
            raise OperationalError(error) from error
        assert found is not None  # the insert above, or another process's, made the row
        return found

    @staticmethod
    def _select_identity(cursor: sqlite3.Cursor) -> str | None:
        exists = cursor.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (STORE_TABLE,)
        ).fetchone()
        if exists is None:
            return None
        row = cursor.execute("SELECT store_id FROM loop_actors_store").fetchone()
        return None if row is None else str(row[0])

    def first_position_of(self, originator_id: str) -> int | None:
        """The notification id of an aggregate's first stored row (None when it has none).

        Raises:
            eventsourcing.persistence.OperationalError: the database is locked or broken.
        """
        statement = f"SELECT MIN(rowid) FROM {self.events_table_name} WHERE originator_id = ?"  # noqa: S608 (the table name is eventsourcing's)
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute(statement, (originator_id,))
            row = cursor.fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def has_events_table(self) -> bool:
        """Whether the database has the events table (a read-only open cannot create it)."""
        row = self._connection.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
            (self.events_table_name,),
        ).fetchone()
        return row is not None

    def close(self) -> None:
        """Close the insert's connection (the pool's close with eventsourcing's factory)."""
        self._connection.close()


def resolve_db_url(explicit: str | None) -> str:
    """The database URL: the explicit one, else ``$LOOP_ACTORS_DB``, else the default file."""
    return explicit or os.environ.get(DB_URL_ENV) or DEFAULT_DB_URL


class EventStore:
    """Blocking access to the invocations in one database.

    Attributes:
        store_id: the store's identity, created with it (see
            ``LeanSQLiteRecorder.store_identity``); read models record it and are
            never answered from another store's. None only for a store opened
            read-only that was created before identities existed.
        read_only: opened read-only: nothing is written to the database, and
            ``append`` is refused.
        write_refusal: why this process must not write the store (a read-only
            file or folder, or ``mode=ro`` in the URL); None when it may.
        notes: what a read-only open had to do to read the store (for the CLI's
            stderr).
    """

    def __init__(
        self,
        url: str,
        *,
        create: bool = True,
        read_only: bool = False,
        snapshot_interval: int = DEFAULT_SNAPSHOT_INTERVAL,
    ) -> None:
        """Open (and, with ``create``, initialise) the database at ``url``.

        With ``read_only`` the database must exist and is only read: opened with
        SQLite's ``mode=ro``, no table is created, and nothing is written to it.
        Without it, a store that may not be written (``sqlite_write_refusal``, or
        ``mode=ro`` in the URL) is refused. A store that nobody may write and
        that has no write-ahead log is opened ``immutable`` (SQLite then writes
        nothing next to it either); one that has a log is read from a copy in a
        temporary folder, since SQLite cannot read a log without writing its
        index beside it.

        Raises:
            StoreUrlError: the URL is malformed.
            StoreReadOnlyError: a writing open of a store this process must not write.
            StoreUnavailableError: the database cannot be opened or created.
        """
        self.url = StoreUrl.parse(url)
        self.snapshot_interval = snapshot_interval
        self.read_only = read_only
        self.write_refusal: str | None = None
        self.notes: list[str] = []
        self._copy: Path | None = None
        environment = self.url.environment()
        if self.url.kind == "sqlite":
            assert self.url.path is not None
            path = self.url.path
            if (self.read_only or not create) and not path.exists():
                raise StoreUnavailableError(f"no database at {path}")
            self._check_sqlite_path(path, create=create and not self.read_only)
            self.write_refusal = (
                f"the URL {url} says mode=ro" if self.url.read_only else sqlite_write_refusal(path)
            )
            if self.read_only:
                environment = self.url.read_only_environment(self._read_only_uri(path))
            elif self.write_refusal is not None:
                raise StoreReadOnlyError(
                    f"cannot write to {path}: {self.write_refusal}; the commands that only "
                    "read (history, audit verify, show, list, metrics, effects) work on it"
                )
        else:
            self.read_only = False  # an in-memory store is this process's own
        try:
            self.app = InvocationApplication(env=environment)
        except (PersistenceError, sqlite3.Error, OSError) as error:
            self._remove_copy()
            raise StoreUnavailableError(f"cannot open {url}: {error}") from error
        recorder = self.app.recorder
        assert isinstance(recorder, LeanSQLiteRecorder)  # the environment above names it
        self._recorder = recorder
        try:
            if self.read_only and not recorder.has_events_table():
                raise StoreUnavailableError(
                    f"{self.url.path} is not a loop-actors store: it has no events table"
                )
            self.store_id = recorder.store_identity(create=not self.read_only)
            self._check_cipher()
        except (PersistenceError, sqlite3.Error) as error:
            self.close()
            raise StoreUnavailableError(f"cannot open {url}: {error}") from error
        except BaseException:
            self.close()
            raise

    def _check_cipher(self) -> None:
        """Decode the first stored event: a wrong or missing key fails here, typed.

        Raises:
            StoreCipherError: the first event cannot be decrypted with the configured
                cipher, or it is encrypted (or compressed) and no cipher is configured.
        """
        try:
            first = self._recorder.select_notifications(start=None, limit=1)
        except (PersistenceError, sqlite3.Error) as error:
            raise StoreUnavailableError(f"cannot read {self.url.url}: {error}") from error
        if not first:
            return
        mapper = self.app.mapper
        try:
            mapper.to_domain_event(first[0])
        except Exception as error:
            plain = first[0].state.lstrip().startswith(b"{")
            if mapper.cipher is not None:
                raise StoreCipherError(
                    f"cannot decrypt the events of {self.url.url} with this CIPHER_KEY "
                    f"({type(error).__name__}: {error}): set the key the store was written "
                    + ("with" if not plain else "with, or unset CIPHER_TOPIC: it is not encrypted")
                ) from error
            if not plain and mapper.compressor is None:
                raise StoreCipherError(
                    f"the events of {self.url.url} are encrypted (or compressed): set "
                    "CIPHER_TOPIC and CIPHER_KEY (and COMPRESSOR_TOPIC) as when it was written"
                ) from error
            # A readable-looking first row that does not decode is the audit's business.

    def _read_only_uri(self, path: Path) -> str:
        """The SQLite URI that reads ``path`` without writing it (see ``__init__``)."""
        uri = path.absolute().as_uri()
        wal = path.with_name(path.name + "-wal")
        has_log = wal.exists() and wal.stat().st_size > 0
        if self.write_refusal is None or path.with_name(path.name + "-shm").exists():
            # Others may be writing it (or did, and left the index): read it as SQLite
            # reads a live database, without taking a write lock.
            return f"{uri}?mode=ro"
        if not has_log:
            # Nobody may change it: SQLite need not look for writers, and writes nothing.
            return f"{uri}?mode=ro&immutable=1"
        folder = Path(tempfile.mkdtemp(prefix="loop-actors-read-only-"))
        self._copy = folder
        copy = folder / path.name
        shutil.copyfile(path, copy)
        shutil.copyfile(wal, folder / wal.name)
        self.notes.append(
            f"{path} cannot be written and has a write-ahead log ({wal.name}), which SQLite "
            f"cannot read in place without writing beside it: reading a copy in {folder}"
        )
        return f"{copy.as_uri()}?mode=ro"

    @staticmethod
    def _check_sqlite_path(path: Path, *, create: bool) -> None:
        parent = path.parent if str(path.parent) else Path()
        if not parent.is_dir():
            raise StoreUnavailableError(f"cannot open {path}: folder {parent} does not exist")
        if path.exists() and path.is_dir():
            raise StoreUnavailableError(f"cannot open {path}: it is a folder")
        if create and not path.exists() and not os.access(parent, os.W_OK):
            raise StoreUnavailableError(f"cannot create {path}: folder {parent} is not writable")

    def _remove_copy(self) -> None:
        if self._copy is not None:
            shutil.rmtree(self._copy, ignore_errors=True)
            self._copy = None

    def close(self) -> None:
        """Close the connections (and remove a read-only open's copy)."""
        self._recorder.close()
        self.app.close()
        self._remove_copy()

    # ----------------------------------------------------------------- writes

    def append(self, events: Sequence[DomainEvent], *, lock_wait_s: float | None = None) -> int:
        """Append events atomically (one transaction); return the last notification id.

        ``lock_wait_s``: wait at most this long (and never longer than the URL's
        ``lock_timeout``) for a database another connection has locked.

        Raises:
            eventsourcing.persistence.IntegrityError: a position is already taken
                (another writer appended first); nothing was written.
            eventsourcing.persistence.PersistenceError: the database failed.
            StoreReadOnlyError: the store is open read-only.
        """
        if self.read_only:
            raise StoreReadOnlyError(f"{self.url.url} is open read-only: nothing can be appended")
        # Application.save would do the same after per-object runtime Protocol
        # checks, which cost more than the mapping itself.
        to_stored = self.app.mapper.to_stored_event
        ids = self._recorder.insert_events(
            [to_stored(event) for event in events], lock_wait_s=lock_wait_s
        )
        self._snapshot_long_histories(events)
        return ids[-1] if ids else 0

    def _snapshot_long_histories(self, events: Sequence[DomainEvent]) -> None:
        """Snapshot each invocation whose history just crossed a multiple of the interval.

        Reading an invocation then replays at most ``snapshot_interval`` events.
        A failed snapshot loses nothing (the events are committed): it is retried
        at the next interval.
        """
        interval = self.snapshot_interval
        crossed = {
            event.originator_id: event.originator_version
            for event in events
            if isinstance(event, InvocationEvent) and event.originator_version % interval == 0
        }
        for invocation_id, version in crossed.items():
            with contextlib.suppress(PersistenceError):
                self.app.take_snapshot(invocation_id, version=version, projector_func=fold)

    # ----------------------------------------------------------------- reads

    def get(self, invocation_id: str) -> Invocation:
        """Rebuild an invocation from its events.

        Raises:
            InvocationNotFoundError: no such invocation.
        """
        try:
            invocation = self.app.repository.get(invocation_id, projector_func=fold)
        except AggregateNotFoundError:
            raise InvocationNotFoundError(invocation_id) from None
        if not isinstance(invocation, Invocation):
            raise InvocationNotFoundError(invocation_id)
        return invocation

    def get_effect(self, key: str) -> Effect | None:
        """The ledger entry of an effect key, or None when it was never prepared."""
        try:
            effect = self.app.repository.get(key, projector_func=fold)
        except AggregateNotFoundError:
            return None
        return effect if isinstance(effect, Effect) else None

    def effects_of(self, invocation_id: str) -> list[Effect]:
        """Every ledger entry recorded for an invocation, oldest first (for resume's check).

        Reads the ``EffectPrepared`` notifications from the invocation's first stored
        row on (an effect is always prepared after its invocation started).
        """
        start = self._recorder.first_position_of(invocation_id)
        if start is None:
            return []
        found: list[Effect] = []
        position = start - 1
        while True:
            notifications = self._recorder.select_notifications(
                start=position,
                limit=500,
                topics=[_topic_of(EffectPrepared)],
                inclusive_of_start=False,
            )
            for notification in notifications:
                prepared = self.app.mapper.to_domain_event(notification)
                if isinstance(prepared, EffectPrepared) and prepared.invocation_id == invocation_id:
                    effect = self.get_effect(str(notification.originator_id))
                    if effect is not None:
                        found.append(effect)
            if len(notifications) < 500:
                return found
            position = notifications[-1].id

    def _created(self, created_type: type) -> list[str]:
        """Ids of every aggregate created with that event type, in creation order."""
        ids: list[str] = []
        position = 0
        while True:
            notifications = self._recorder.select_notifications(
                start=position,
                limit=500,
                topics=[_topic_of(created_type)],
                inclusive_of_start=False,
            )
            ids.extend(str(n.originator_id) for n in notifications)
            if len(notifications) < 500:
                return ids
            position = notifications[-1].id

    def cancel_request(self, invocation_id: str) -> CancelRequest | None:
        """The invocation's cancel request, if someone made one."""
        try:
            request = self.app.repository.get(cancel_request_id(invocation_id), projector_func=fold)
        except AggregateNotFoundError:
            return None
        return request if isinstance(request, CancelRequest) else None

    def cancel_requests_after(self, position: int) -> tuple[list[str], int]:
        """Invocation ids with a cancel request recorded after a notification position.

        Returns the ids and the position to continue from.
        """
        notifications = self._recorder.select_notifications(
            start=position,
            limit=500,
            topics=[_topic_of(CancelRequested)],
            inclusive_of_start=False,
        )
        ids = [str(n.originator_id).removeprefix(CANCEL_REQUEST_PREFIX) for n in notifications]
        return ids, notifications[-1].id if notifications else position

    def head(self) -> int:
        """The last notification id (0 for an empty store)."""
        return self._recorder.max_notification_id() or 0

    def invocation_ids(self) -> list[str]:
        """Every invocation id, oldest first."""
        return self._created(InvocationStarted)

    def open_effects(self) -> list[Effect]:
        """Every effect still dispatched or of unknown outcome, oldest first."""
        found: list[Effect] = []
        for key in self._created(EffectPrepared):
            effect = self.get_effect(key)
            if effect is not None and effect.is_open:
                found.append(effect)
        return found

    def stored_entries(self, aggregate_id: str) -> list[tuple[int, DomainEvent | Exception]]:
        """An aggregate's stored events as (position, event), undecodable rows as exceptions.

        For the audit: nothing is validated beyond decoding, and no row is skipped.
        A row whose topic names no loop-actors event class is not decoded (decoding
        would import the module it names): it is reported as unreadable.
        """
        entries: list[tuple[int, DomainEvent | Exception]] = []
        for record in self._recorder.select_events(aggregate_id):
            entries.append((record.originator_version, self._decode_audited(record)))
        return entries

    def _decode_audited(self, record: StoredEvent) -> Any:
        if record.topic not in _event_topics():
            return ValueError(f"its topic {record.topic!r} names no loop-actors event class")
        try:
            return self.app.mapper.to_domain_event(record)
        except Exception as error:  # a tampered row is reported, not raised
            return error

    def log_rows(self, page: int = 500) -> Iterator[tuple[int, str, int, str, bytes]]:
        """Every stored event row in notification order: (id, originator, version, topic, state).

        The state is the bytes as stored (encrypted or compressed if the store is).
        """
        position = 0
        while True:
            notifications = self._recorder.select_notifications(
                start=position, limit=page, inclusive_of_start=False
            )
            for n in notifications:
                yield n.id, str(n.originator_id), n.originator_version, n.topic, bytes(n.state)
            if len(notifications) < page:
                return
            position = notifications[-1].id

    def audit_aggregate_ids(self) -> list[str]:
        """The id of every aggregate with a stored row, in the order of its first row."""
        statement = (
            f"SELECT originator_id FROM {self._recorder.events_table_name} "  # noqa: S608 (eventsourcing's table)
            "GROUP BY originator_id ORDER BY MIN(rowid)"
        )
        with self._recorder.datastore.transaction(commit=False) as cursor:
            cursor.execute(statement)
            return [str(row[0]) for row in cursor.fetchall()]

    def audit_row_counts(self) -> tuple[int, int]:
        """How many event rows and snapshot rows the store holds."""
        events = f"SELECT COUNT(*) FROM {self._recorder.events_table_name}"  # noqa: S608
        with self._recorder.datastore.transaction(commit=False) as cursor:
            cursor.execute(events)
            event_rows = int(cursor.fetchone()[0])
            table = self._snapshot_table()
            snapshot_rows = 0
            if table is not None:
                cursor.execute(f"SELECT COUNT(*) FROM {table}")  # noqa: S608
                snapshot_rows = int(cursor.fetchone()[0])
        return event_rows, snapshot_rows

    def _snapshot_table(self) -> str | None:
        """The snapshots' table, when the store has one (a read-only open creates none)."""
        snapshots = self.app.snapshots
        if snapshots is None:
            return None
        name = str(getattr(snapshots.recorder, "events_table_name", "stored_snapshots"))
        with self._recorder.datastore.transaction(commit=False) as cursor:
            cursor.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
            return name if cursor.fetchone() is not None else None

    def stored_snapshots(self, aggregate_id: str | None = None) -> dict[str, list[tuple[int, Any]]]:
        """Every stored snapshot (or one aggregate's) as {id: [(version, snapshot or exception)]}.

        A row whose topic is not the invocation snapshot's is not decoded (reported
        as an exception), as for :meth:`stored_entries`.
        """
        table = self._snapshot_table()
        if table is None:
            return {}
        where = "" if aggregate_id is None else "WHERE originator_id = ? "
        statement = (
            f"SELECT originator_id, originator_version, topic, state FROM {table} {where}"  # noqa: S608
            "ORDER BY originator_id, originator_version"
        )
        with self._recorder.datastore.transaction(commit=False) as cursor:
            cursor.execute(statement, () if aggregate_id is None else (aggregate_id,))
            rows = cursor.fetchall()
        found: dict[str, list[tuple[int, Any]]] = {}
        for originator_id, version, topic, state in rows:
            record = StoredEvent(
                originator_id=str(originator_id),
                originator_version=int(version),
                topic=str(topic),
                state=bytes(state),
            )
            snapshot: Any
            if record.topic != _topic_of(InvocationSnapshot):
                snapshot = ValueError(f"its topic {record.topic!r} is not an invocation snapshot's")
            else:
                try:
                    snapshot = self.app.mapper.to_domain_event(record)
                except Exception as error:  # a tampered row is reported, not raised
                    snapshot = error
            found.setdefault(str(originator_id), []).append((record.originator_version, snapshot))
        return found

    def events(self, invocation_id: str) -> list[InvocationEvent]:
        """Every committed event of an invocation, in order.

        Raises:
            InvocationNotFoundError: no such invocation.
        """
        stored = self._recorder.select_events(invocation_id)
        if not stored:
            raise InvocationNotFoundError(invocation_id)
        return [
            cast("InvocationEvent", self.app.mapper.to_domain_event(record)) for record in stored
        ]
