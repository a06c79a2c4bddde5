"""The read models' SQL, written once for SQLite and PostgreSQL.

A read model writes its SQL in the SQLite style with ``?`` placeholders and the
portable parts of SQL: ``TEXT``, ``BIGINT`` and ``DOUBLE PRECISION`` columns,
``INSERT ... ON CONFLICT (...) DO UPDATE SET c = excluded.c`` for an upsert.
What the two engines do differently is in :class:`Dialect`, and the
:class:`ViewCursor` a read model is given turns ``?`` into psycopg's ``%s`` on
PostgreSQL; its ``insert_rows`` writes (or upserts) many rows with one statement.

Where the read models live is a :class:`ViewDatabase`: a SQLite file (or
in-memory database) with eventsourcing's ``SQLiteTrackingRecorder``, or a
PostgreSQL database (the event store's own) with eventsourcing's
``PostgresTrackingRecorder``. Either way a batch's rows and its tracking rows are
written in one transaction.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar
from urllib.parse import unquote, urlsplit

from eventsourcing.persistence import IntegrityError, OperationalError, Tracking
from eventsourcing.sqlite import (
    SQLiteConnection,
    SQLiteConnectionPool,
    SQLiteCursor,
    SQLiteDatastore,
    SQLiteTrackingRecorder,
    SQLiteTransaction,
)

from projections.dialect import POSTGRESQL, SQLITE, Dialect, marks

STORE_TABLE = "read_model_store"
"""The identity of the store the read models were built from: one row."""

SKIPPED_TABLE = "read_model_skipped"
"""The stored rows each read model could not decode and went past: (name, notification id)."""

SKIPPED_COLUMNS = (
    "name",
    "notification_id",
    "originator_id",
    "originator_version",
    "topic",
    "problem",
)
"""Its columns, in the order a row of it is written."""

POSTGRES_TRACKING_TABLE = "read_model_tracking"
"""The read models' tracking table on PostgreSQL (``tracking`` on SQLite, eventsourcing's name
there; on PostgreSQL the table sits beside the event store's, so it gets a name of its own)."""


class Row(dict[str, Any]):
    """A PostgreSQL row read by a read model: by column name, or by index as SQLite's rows."""

    __slots__ = ("_values",)

    def __init__(self, names: Sequence[str], values: Sequence[Any]) -> None:
        """The row of ``values``, one per column of ``names``."""
        super().__init__(zip(names, values, strict=True))
        self._values = tuple(values)

    def __getitem__(self, key: str | int) -> Any:
        """A column by name, or by position (``row[0]``)."""
        if isinstance(key, int):
            return self._values[key]
        return super().__getitem__(key)


class ViewCursor(SQLiteCursor):
    """The cursor a read model gets: in its batch's transaction, on SQLite or PostgreSQL.

    ``execute``, ``executemany``, ``fetchone``, ``fetchall`` and ``rowcount`` as in
    DB-API; statements use ``?`` placeholders on both engines (see :class:`Dialect`);
    rows are read by column name (``row["tool"]``) or position (``row[0]``).
    ``dialect`` says which engine it is, ``cache`` is this runner's memory for this
    read model (see :class:`projections.ReadModel`).

    It is an eventsourcing ``SQLiteCursor`` so that read models written when the
    cursor was one (``apply(self, cursor: SQLiteCursor, ...)``) keep running and
    type-checking; on PostgreSQL it wraps a psycopg cursor.
    """

    def __init__(
        self,
        raw: Any,
        dialect: Dialect,
        cache: dict[str, Any] | None = None,
        column_types: dict[str, dict[str, str]] | None = None,
    ) -> None:
        """Wrap ``raw``, a sqlite3 or psycopg cursor in an open transaction."""
        super().__init__(raw)
        self.raw = raw
        self.dialect = dialect
        self.cache: dict[str, Any] = {} if cache is None else cache
        self.column_types: dict[str, dict[str, str]] = {} if column_types is None else column_types
        """PostgreSQL: each table's column types, read once (its database's)."""

    def execute(self, statement: str, params: Sequence[Any] | dict[str, Any] = ()) -> None:  # type: ignore[override]
        """Run one statement."""
        self.raw.execute(self.dialect.sql(statement), params)

    def executemany(self, statement: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement for each row of parameters."""
        if rows:
            self.raw.executemany(self.dialect.sql(statement), rows)

    def insert_rows(
        self,
        table: str,
        columns: Sequence[str],
        rows: Sequence[Sequence[Any]],
        *,
        key: Sequence[str] = (),
        update: str | None = None,
    ) -> None:
        """INSERT ``rows`` into ``table``, all with one statement.

        On SQLite one prepared statement is stepped for every row; on PostgreSQL the
        statement takes each column as one typed array (``unnest``): a round trip and a
        plan for the lot, instead of a row execution each.

        With ``key``, a row whose key is taken updates that row instead: its
        ``columns`` other than the key get the new values, or ``update`` (a SET
        list such as ``calls = t.calls + excluded.calls``) says how. Without it, a
        taken key fails the statement (and the batch). Used to update rows known to
        exist, it writes only ``columns`` (the others keep their values).
        """
        if not rows:
            return
        head = f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
        if key:
            changes = update or ", ".join(f"{c} = excluded.{c}" for c in columns if c not in key)
            tail = f" ON CONFLICT ({', '.join(key)}) DO UPDATE SET {changes}"
        else:
            tail = ""
        if self.dialect is POSTGRESQL:
            # One statement for all the rows, each column one array: a few round trips
            # and one plan, instead of a row execution each.
            arrays = self._arrays(table, columns)
            self.raw.execute(
                f"INSERT INTO {table} ({', '.join(columns)}) SELECT * FROM unnest({arrays})"
                + tail.replace("%", "%%"),
                [list(column) for column in zip(*rows, strict=True)],
            )
            return
        one = f"({marks(len(columns))})"
        # One statement, prepared once and stepped for every row.
        self.raw.executemany(head + one + tail, rows)

    def update_rows(
        self,
        table: str,
        columns: Sequence[str],
        key: Sequence[str],
        rows: Sequence[Sequence[Any]],
    ) -> None:
        """UPDATE ``columns`` of the rows of ``table`` with these ``key`` values.

        Each of ``rows`` is the new values of ``columns``, then the row's key values.
        """
        if not rows:
            return
        if self.dialect is POSTGRESQL:  # one statement for all the rows (see insert_rows)
            names = [*columns, *key]
            self.raw.execute(
                f"UPDATE {table} AS t SET {', '.join(f'{c} = v.{c}' for c in columns)} "
                f"FROM unnest({self._arrays(table, names)}) AS v ({', '.join(names)}) "
                f"WHERE {' AND '.join(f't.{k} = v.{k}' for k in key)}",
                [list(column) for column in zip(*rows, strict=True)],
            )
            return
        self.raw.executemany(
            f"UPDATE {table} SET {', '.join(f'{c} = ?' for c in columns)} "
            f"WHERE {' AND '.join(f'{k} = ?' for k in key)}",
            rows,
        )

    def _arrays(self, table: str, columns: Sequence[str]) -> str:
        """``%s::text[], %s::bigint[], ...``: one typed array parameter per column."""
        types = self.column_types.get(table)
        if types is None:
            self.raw.execute(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_name = %s AND table_schema = current_schema()",
                [table],
            )
            types = self.column_types[table] = {row[0]: row[1] for row in self.raw.fetchall()}
        return ", ".join(f"%s::{types[c]}[]" for c in columns)

    def fetchone(self) -> Any:
        """The next row, or None."""
        return self.raw.fetchone()

    def fetchall(self) -> Any:
        """The remaining rows."""
        return self.raw.fetchall()

    @property
    def rowcount(self) -> int:
        """The rows the last statement changed."""
        return int(self.raw.rowcount)

    def query(self, statement: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Run a SELECT and return its rows as dicts."""
        self.raw.execute(self.dialect.sql(statement), params)
        return [dict(row) for row in self.raw.fetchall()]


# --------------------------------------------------------------------------- where they live


class ViewDatabase:
    """The read models' database: its tracking rows, its transactions, its dialect."""

    dialect: ClassVar[Dialect]
    tracking_table: str
    location: str
    """Where it is, for messages (a PostgreSQL URL without its password)."""

    def create(self, statements: Sequence[str]) -> None:
        """Create the tracking table, the store's table and ``statements`` (idempotent)."""
        raise NotImplementedError

    def write(self) -> contextlib.AbstractContextManager[ViewCursor]:
        """A write transaction: committed when the block ends, rolled back if it raises."""
        raise NotImplementedError

    def read(self) -> contextlib.AbstractContextManager[ViewCursor]:
        """A read-only transaction."""
        raise NotImplementedError

    def record(self, cursor: ViewCursor, name: str, position: int) -> None:
        """Record ``name``'s position in the open transaction (eventsourcing's tracking row).

        Raises:
            IntegrityError: the recorded position is already at or past ``position``.
        """
        raise NotImplementedError

    def position(self, name: str) -> int | None:
        """The position recorded for ``name`` (None if none)."""
        raise NotImplementedError

    def close(self) -> None:
        """Close its connections."""
        raise NotImplementedError


class _SQLiteTrackingStore(SQLiteTrackingRecorder):
    """eventsourcing's tracking table, with the read models' tables created alongside."""

    def __init__(self, datastore: SQLiteDatastore, statements: Sequence[str]) -> None:
        self.statements = list(statements)
        super().__init__(datastore)

    def construct_create_table_statements(self) -> list[str]:
        return [*super().construct_create_table_statements(), *self.statements]


class _ViewConnectionPool(SQLiteConnectionPool):
    """SQLite connections with ``synchronous=NORMAL``: a view commit is atomic, not fsync'd.

    In WAL mode a commit at NORMAL can be lost to a power failure, never torn: the
    batch's rows and its tracking row go back together, and the next catch-up
    applies the batch again. Read models are rebuilt from the store, so they do
    not pay an fsync per batch (a few ms each on a busy VM, as much as applying
    the batch).
    """

    def _create_connection(self) -> SQLiteConnection:
        connection = super()._create_connection()
        # eventsourcing does not expose the sqlite3 connection; its pragma is ours to set.
        connection._sqlite_conn.execute("PRAGMA synchronous=NORMAL")
        return connection


class _ImmediateTransaction(SQLiteTransaction):
    """``BEGIN IMMEDIATE``: the write lock is taken first, so the positions read are current."""

    def __enter__(self) -> SQLiteCursor:
        cursor = self.connection.cursor()
        cursor.execute("BEGIN IMMEDIATE")
        return cursor


class SQLiteViews(ViewDatabase):
    """Read models in a SQLite file or in-memory database (a path or a SQLite URI)."""

    dialect = SQLITE
    tracking_table = "tracking"

    def __init__(self, path: str) -> None:
        """Open ``path`` (the tables are made by :meth:`create`)."""
        self.location = path
        self.datastore = SQLiteDatastore(path)
        if not self.datastore.pool.is_sqlite_memory_mode:
            self.datastore.pool = _ViewConnectionPool(db_name=path)
        self.recorder: _SQLiteTrackingStore | None = None

    def create(self, statements: Sequence[str]) -> None:
        """Create the tracking table and the read models' tables."""
        try:
            self.recorder = _SQLiteTrackingStore(self.datastore, statements)
            self.recorder.create_table()
        except IntegrityError:
            # Another process created the tracking table between eventsourcing's check
            # and its insert of the table's migration row: the table is there now.
            self.recorder = _SQLiteTrackingStore(self.datastore, statements)
            self.recorder.create_table()

    @contextlib.contextmanager
    def write(self) -> Iterator[ViewCursor]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT``."""
        with (
            self.datastore.get_connection(commit=True) as connection,
            _ImmediateTransaction(connection, commit=True) as cursor,
            cursor as raw,
        ):
            yield ViewCursor(raw, SQLITE)

    @contextlib.contextmanager
    def read(self) -> Iterator[ViewCursor]:
        """A deferred transaction, rolled back."""
        with self.datastore.transaction(commit=False) as cursor, cursor as raw:
            yield ViewCursor(raw, SQLITE)

    def record(self, cursor: ViewCursor, name: str, position: int) -> None:
        """Record it with eventsourcing's tracking insert, in the open transaction."""
        assert self.recorder is not None
        self.recorder._insert_tracking(cursor.raw, Tracking(name, position))

    def position(self, name: str) -> int | None:
        """The position, from eventsourcing's ``max_tracking_id``."""
        assert self.recorder is not None
        return self.recorder.max_tracking_id(name)

    def close(self) -> None:
        """Close the pool."""
        self.datastore.close()


def is_postgres_url(location: str) -> bool:
    """Whether ``location`` names a PostgreSQL database (``postgresql://...``)."""
    return location.startswith(("postgresql://", "postgres://"))


def postgres_location(url: str) -> str:
    """``url`` without its password, for messages."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    user = f"{unquote(parts.username)}@" if parts.username else ""
    return f"{parts.scheme}://{user}{host}{port}{parts.path}"


class PostgresViews(ViewDatabase):
    """Read models in a PostgreSQL database, with eventsourcing's ``PostgresTrackingRecorder``.

    The tables are created under an advisory lock, so processes that open the
    read models at once do not race on ``CREATE TABLE IF NOT EXISTS``.
    """

    dialect = POSTGRESQL
    tracking_table = POSTGRES_TRACKING_TABLE
    CREATE_LOCK: ClassVar[int] = 0x6C61_7276  # "larv": loop-actors read views
    """The advisory lock key held while the read models' tables are created."""

    def __init__(self, url: str, *, schema: str = "") -> None:
        """Open a small pool on ``url`` (``postgresql://user:password@host:port/dbname``)."""
        from eventsourcing.postgres import PostgresDatastore  # noqa: PLC0415 - the postgres extra

        parts = urlsplit(url)
        self.location = postgres_location(url)
        self.datastore = PostgresDatastore(
            dbname=unquote(parts.path.lstrip("/")),
            host=parts.hostname or "localhost",
            port=parts.port or 5432,
            user=unquote(parts.username or ""),
            password=unquote(parts.password or "") or os.environ.get("PGPASSWORD", ""),
            pool_size=1,
            max_overflow=2,
            schema=schema,
            connect_timeout=5.0,
        )
        self.recorder: Any = None
        self.column_types: dict[str, dict[str, str]] = {}

    def create(self, statements: Sequence[str]) -> None:
        """Create the tracking table and the read models' tables, under the advisory lock.

        Raises:
            OperationalError: the server cannot be reached or refuses the connection
                (libpq's reason, first line).
        """
        from eventsourcing.postgres import PostgresTrackingRecorder  # noqa: PLC0415 - the extra
        from psycopg.sql import SQL, Composed  # noqa: PLC0415 - the postgres extra

        self._probe()
        # Opened here, once: eventsourcing would open it (and wait) in every call, and
        # psycopg's pool asserts when two threads wait for it at once.
        self.datastore.pool.open(wait=True, timeout=5.0)
        lock = self.CREATE_LOCK

        class TrackingStore(PostgresTrackingRecorder):
            def _create_table(self, curs: Any) -> None:
                curs.execute("SELECT pg_advisory_xact_lock(%s)", (lock,))
                super()._create_table(curs)

        for attempt in (1, 2):
            recorder = TrackingStore(self.datastore, tracking_table_name=self.tracking_table)
            recorder.sql_create_statements.extend(Composed([SQL(s)]) for s in statements)
            try:
                recorder.create_table()
            except IntegrityError:
                # eventsourcing looked for the tracking table before the lock: another
                # process created it meanwhile, and the migration row is there. Again.
                if attempt == 2:
                    raise
                continue
            self.recorder = recorder
            return

    def _probe(self) -> None:
        """Connect once, directly: the pool would only say that it timed out, and retry."""
        import psycopg  # noqa: PLC0415 - the postgres extra

        kwargs = self.datastore.pool.kwargs
        assert isinstance(kwargs, dict)
        try:
            psycopg.connect(
                **{k: v for k, v in kwargs.items() if k != "row_factory"}, connect_timeout=5
            ).close()
        except psycopg.Error as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error)
            raise OperationalError(f"cannot connect: {reason}") from error

    @contextlib.contextmanager
    def write(self) -> Iterator[ViewCursor]:
        """One transaction, committed when the block ends."""
        with self.datastore.transaction(commit=True) as raw:
            raw.row_factory = _rows
            yield ViewCursor(raw, POSTGRESQL, column_types=self.column_types)

    @contextlib.contextmanager
    def read(self) -> Iterator[ViewCursor]:
        """One transaction, rolled back."""
        with self.datastore.transaction(commit=False) as raw:
            raw.row_factory = _rows
            yield ViewCursor(raw, POSTGRESQL)

    def record(self, cursor: ViewCursor, name: str, position: int) -> None:
        """Record it with eventsourcing's tracking insert, in the open transaction."""
        self.recorder._insert_tracking(cursor.raw, Tracking(name, position))

    def position(self, name: str) -> int | None:
        """The position, from eventsourcing's ``max_tracking_id``."""
        found = self.recorder.max_tracking_id(name)
        return None if found is None else int(found)

    def close(self) -> None:
        """Close the pool."""
        self.datastore.close()


def _rows(cursor: Any) -> Callable[[Sequence[Any]], Row]:
    """A psycopg row factory for :class:`Row`."""
    names = [column.name for column in cursor.description or ()]

    def make(values: Sequence[Any]) -> Row:
        return Row(names, values)

    return make


def open_view_database(location: str) -> ViewDatabase:
    """The read models' database at ``location``: a PostgreSQL URL, else a SQLite path or URI."""
    if is_postgres_url(location):
        return PostgresViews(location)
    return SQLiteViews(location)


__all__ = [
    "POSTGRESQL",
    "SKIPPED_TABLE",
    "SQLITE",
    "STORE_TABLE",
    "Dialect",
    "IntegrityError",
    "PostgresViews",
    "Row",
    "SQLiteViews",
    "ViewCursor",
    "ViewDatabase",
    "is_postgres_url",
    "marks",
    "open_view_database",
]
