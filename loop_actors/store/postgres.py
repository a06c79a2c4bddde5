"""The event store on PostgreSQL: eventsourcing's recorders, with what the store needs of them.

``StoreUrl.environment()`` names :class:`PostgresStoreFactory` for a
``postgresql://`` URL; eventsourcing builds the store's recorders with it. This
module is imported only then, so psycopg (the ``postgres`` extra) is needed only
by a store on PostgreSQL.

Everything here blocks (psycopg 3's sync API: its async layer is asyncio's); it
runs in the Journal's thread and in the StoreReader's worker threads, each
taking a connection from eventsourcing's pool for one transaction.
"""

from __future__ import annotations

import contextlib
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, TypeVar
from uuid import UUID

import psycopg
import psycopg_pool
from eventsourcing.persistence import (
    Notification,
    NotSupportedError,
    OperationalError,
    PersistenceError,
    StoredEvent,
)
from eventsourcing.postgres import (
    PostgresAggregateRecorder,
    PostgresApplicationRecorder,
    PostgresDatastore,
    PostgresFactory,
)
from eventsourcing.utils import strtobool
from psycopg import Cursor
from psycopg.rows import DictRow, TupleRow, tuple_row
from psycopg.sql import Composable

from loop_actors._errors import StoreUnavailableError
from loop_actors.store.queue import NewRow, write_start_rows
from loop_actors.store.recorder import CopiedRow, StoreTables
from loop_actors.store.schema import SECRETS_TABLE
from loop_actors.store.secrets import SealedRows
from loop_actors.store.sql import Cursor as StatementCursor
from loop_actors.store.sql import PlaceholderCursor
from projections.dialect import Dialect

SCHEMA_LOCK_KEY = zlib.crc32(b"loop-actors schema")
"""The advisory lock that serialises creating tables: two processes that open a new
database at once would otherwise race in PostgreSQL's catalogue (``CREATE TABLE IF NOT
EXISTS`` and ``CREATE TYPE`` both fail on a name created meanwhile)."""

_SERVER_GONE = frozenset({"57P01", "57P02", "57P03"})
"""admin_shutdown, crash_shutdown, cannot_connect_now: the server went away (or is not back)."""

T = TypeVar("T")

READ_ONLY_SETTING = "POSTGRES_READ_ONLY"
"""This factory's own setting: every transaction of the store's connections is read-only."""


def is_connection_failure(error: BaseException) -> bool:
    """Whether a psycopg error means the connection (or the server) is gone.

    ``error`` is eventsourcing's translated error or psycopg's own. A failure the
    server reported about the statement (a SQLSTATE outside connection classes)
    is not one.
    """
    cause = error if isinstance(error, psycopg.Error) else error.__cause__
    if not isinstance(cause, psycopg.OperationalError):
        return False
    if isinstance(cause, psycopg_pool.PoolTimeout):
        return True
    state = cause.sqlstate
    return state is None or state.startswith("08") or state in _SERVER_GONE


def _holds_lock(curs: Cursor[Any]) -> None:
    """Take the schema lock for the rest of the transaction (see :data:`SCHEMA_LOCK_KEY`)."""
    curs.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK_KEY,))


class _CreatesTablesOnce:
    """``create_table`` in one transaction under the schema lock: safe for racing processes.

    eventsourcing's own runs ``CREATE TYPE`` in a transaction of its own, then the
    tables; two processes doing so at once can both pass "if not exists" and one
    fails in the catalogue. Here each statement runs under :data:`SCHEMA_LOCK_KEY`,
    and a type that exists is not created again.
    """

    datastore: PostgresDatastore
    sql_create_statements: list[Any]
    stored_event_type_name: str
    events_table_name: str

    def create_table(self) -> None:
        """Create the tables (and their type) unless the table exists; wait for locks boundedly.

        A table that exists is left alone: its statements all ran in one transaction.
        (Even ``CREATE INDEX IF NOT EXISTS`` waits for a lock on the table, which a
        writer holds while it inserts.)
        """
        with self.datastore.transaction(commit=True) as curs:
            curs.execute(
                "SELECT set_config('lock_timeout', %s, true)",
                (f"{max(1, self.datastore.lock_timeout)}s",),
            )
            curs.execute(
                "SELECT to_regclass(%s) IS NOT NULL",
                (f'"{self.datastore.schema}"."{self.events_table_name}"',),
            )
            row = curs.fetchone()
            if row is None or not next(iter(row.values())):
                self._create(curs)
        self.datastore.register_type_adapters()

    def _create(self, curs: Cursor[DictRow]) -> None:
        _holds_lock(curs)
        for statement in self.sql_create_statements:
            if "CREATE TYPE" in statement.as_string():
                curs.execute(
                    "SELECT 1 FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
                    "WHERE n.nspname = %s AND t.typname = %s",
                    (self.datastore.schema, self.stored_event_type_name),
                )
                if curs.fetchone() is not None:
                    continue
            curs.execute(statement, prepare=False)


class _RetriesStaleConnections:
    """Reads (and snapshot writes) without eventsourcing's retry decorator, bounded by the pool.

    eventsourcing retries every read ten times, 0.2 s apart, each waiting for the
    pool's connect timeout: with the server away, one read took some twenty
    seconds. Here a read is tried again at once only on a pooled connection that
    broke (the server restarted since it was opened), and fails within
    ``connect_timeout`` when the server is away.
    """

    datastore: PostgresDatastore
    _RECONNECTS: ClassVar[int] = 3
    """Extra attempts, beyond the pool's size, on pooled connections found broken."""

    def _stale_connection(self, error: OperationalError, attempt: int) -> bool:
        """Whether a failed read or write met a pooled connection that broke: try another.

        Not when the pool could not give a connection in time (the server is away:
        waiting again would only wait longer), nor after the pool's size of tries.
        """
        return (
            is_connection_failure(error)
            and not isinstance(error.__cause__, psycopg_pool.PoolTimeout)
            and attempt + 1 < self.datastore.pool.max_size + self._RECONNECTS
        )

    def select_events(
        self,
        originator_id: UUID | str,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> Sequence[StoredEvent]:
        """Read an aggregate's rows, events or snapshots (eventsourcing's query; see ``_read``)."""
        rows: Sequence[StoredEvent] = self._read(
            PostgresAggregateRecorder.select_events.__wrapped__,
            originator_id,
            gt=gt,
            lte=lte,
            desc=desc,
            limit=limit,
        )
        return rows

    def _read(self, read: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one of eventsourcing's undecorated methods; again at once on a stale connection."""
        attempt = 0
        while True:
            try:
                return read(self, *args, **kwargs)
            except OperationalError as error:
                if not self._stale_connection(error, attempt):
                    raise self._explained(error) from error.__cause__
                attempt += 1

    def _explained(self, error: OperationalError) -> OperationalError:
        """The pool's "couldn't get a connection after 5.00 sec", saying which server."""
        if not isinstance(error.__cause__, psycopg_pool.PoolTimeout):
            return error
        kwargs = self.datastore.pool.kwargs
        where = (
            f"{kwargs.get('host')}:{kwargs.get('port')}/{kwargs.get('dbname')}"
            if isinstance(kwargs, dict)
            else "the server"
        )
        return OperationalError(
            f"no connection to PostgreSQL at {where} within {self.datastore.pool.timeout:g} s "
            "(connect_timeout): is the server running?"
        )


class SnapshotRecorder(_RetriesStaleConnections, _CreatesTablesOnce, PostgresAggregateRecorder):
    """eventsourcing's aggregate recorder (the snapshots' table), created race-free."""

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        """Write snapshot rows (a duplicate is eventsourcing's ``IntegrityError``)."""
        self._read(PostgresAggregateRecorder.insert_events.__wrapped__, stored_events, **kwargs)
        return None


class LeanPostgresRecorder(
    StoreTables, _RetriesStaleConnections, _CreatesTablesOnce, PostgresApplicationRecorder
):
    """eventsourcing's PostgreSQL application recorder, with the store's extra reads and writes.

    It gives what ``LeanSQLiteRecorder`` gives a SQLite store: the store's identity
    (:meth:`store_identity`), :meth:`first_position_of`, :meth:`has_events_table`
    and the audit's row queries; an insert of many invocations' rows in one
    transaction (the Journal's group commit) with a bounded wait for the lock.

    The insert is eventsourcing's default path, unchanged: in one transaction,
    ``LOCK TABLE ... IN EXCLUSIVE MODE`` (so that rows become visible in the
    order of their notification ids, and a follower never skips one), ``NOTIFY``,
    one ``INSERT ... SELECT FROM unnest(...)`` of every row, ``RETURNING`` their
    ids. ``POSTGRES_ENABLE_DB_FUNCTIONS`` (an insert function that takes no table
    lock) is never used, whatever the environment says: with it, followers were
    measured to skip events under concurrent writers. The differences:

    - the wait for the table lock is the caller's (``lock_wait_s``, else the URL's
      ``lock_timeout``), set with ``SET LOCAL lock_timeout`` in the transaction;
    - eventsourcing retries a failed insert ten times, 0.2 s apart; here a failure
      goes back to the caller (the Journal retries lock failures within its own
      window, and answers the rest) except one: a connection found broken before
      ``COMMIT`` was sent (a pooled connection to a server that restarted), which
      is retried at once on another connection, since nothing of it was written.
      A connection lost while ``COMMIT`` was on its way is reported: whether the
      rows were written is then unknown, and only reading the store can tell.

    Errors are eventsourcing's: ``IntegrityError`` for a position already taken
    (``UniqueViolation`` on ``(originator_id, originator_version)``),
    ``OperationalError`` for a lock not granted in time or a lost connection
    (psycopg's error, with its SQLSTATE, is the ``__cause__``).
    """

    dialect = Dialect.postgresql

    def __init__(
        self, datastore: PostgresDatastore, *, events_table_name: str = "stored_events"
    ) -> None:
        """Check eventsourcing's insert path and drop its insert function from the schema.

        Raises:
            eventsourcing.persistence.NotSupportedError: eventsourcing's lock
                statements have another shape (an upgrade changed them).
        """
        super().__init__(datastore, events_table_name=events_table_name)
        datastore.enable_db_functions = False
        del self.sql_create_statements[self.create_insert_function_statement_index]
        statements = [
            s.as_string() if isinstance(s, Composable) else str(s)
            for s in self.lock_table_statements
        ]
        if len(statements) != 2 or not (
            statements[0].startswith("SET LOCAL lock_timeout")
            and "IN EXCLUSIVE MODE" in statements[1]
        ):
            raise NotSupportedError(f"unexpected lock statements: {statements!r}")
        self._call = threading.local()
        self._quoted_schema = self.dialect.quoted(datastore.schema)

    # ----------------------------------------------------------------- writes

    def insert_events(
        self,
        stored_events: Sequence[StoredEvent],
        *,
        lock_wait_s: float | None = None,
        queue_rows: Sequence[NewRow] = (),
        **kwargs: Any,
    ) -> Sequence[int] | None:
        """Insert the rows in one transaction; return their notification ids, in order.

        ``lock_wait_s`` bounds the wait for the events table's lock (default: the
        URL's ``lock_timeout``). ``queue_rows`` (the work queue's rows of the
        invocations these rows start, with their holders' registrations) are written in
        the same transaction, at the server's time (the queue's clock); a row whose
        invocation has one already is left as it is.

        Raises:
            eventsourcing.persistence.IntegrityError: a position is already taken.
            eventsourcing.persistence.OperationalError: the lock was not granted in
                time, or the connection was lost (see the class docstring).
            eventsourcing.persistence.PersistenceError: any other failure.
        """
        if not stored_events:
            return []
        wait = self.datastore.lock_timeout if lock_wait_s is None else lock_wait_s
        # eventsourcing's insert path, without its retry decorator.
        insert = PostgresApplicationRecorder.insert_events.__wrapped__
        attempt = 0
        while True:
            # At least 1 ms: PostgreSQL reads a lock_timeout of 0 as "wait forever".
            self._call.lock_wait_ms = max(1, int(wait * 1000))
            self._call.reached_commit = False
            try:
                ids = insert(self, stored_events, queue_rows=queue_rows, **kwargs)
            except OperationalError as error:
                if self._call.reached_commit or not self._stale_connection(error, attempt):
                    raise self._explained(error) from error.__cause__
                attempt += 1
                continue
            return list(ids or [])

    def _lock_table(self, curs: Cursor[DictRow]) -> None:
        """Eventsourcing's table lock, waiting at most this call's ``lock_wait_s``."""
        curs.execute(
            "SELECT set_config('lock_timeout', %s, true)",
            (f"{self._call.lock_wait_ms}ms",),
            prepare=True,
        )
        for statement in self.lock_table_statements[1:]:
            curs.execute(statement, prepare=True)

    def _fetch_ids_after_insert_events(
        self,
        curs: Cursor[DictRow],
        stored_events: Sequence[StoredEvent],
        *,
        queue_rows: Sequence[NewRow] = (),
        **kwargs: Any,
    ) -> Sequence[int] | None:
        ids = super()._fetch_ids_after_insert_events(curs, stored_events, **kwargs)
        if queue_rows:
            self._insert_queue_rows(curs, queue_rows)
        # Every row is in; only COMMIT is left to send. A failure from here on is
        # ambiguous (written or not): it must not be retried blindly.
        self._call.reached_commit = True
        return ids

    def _insert_queue_rows(self, curs: Cursor[DictRow], rows: Sequence[NewRow]) -> None:
        """Write the queue's rows of the invocations just inserted, in their transaction."""
        with curs.connection.cursor(row_factory=tuple_row) as own:
            cursor = PlaceholderCursor(own, self.dialect)
            cursor.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
            now = float(cursor.fetchone()[0])
            write_start_rows(cursor, rows, now, name=self._table, can_return=True)

    # ----------------------------------------------------------------- reads

    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        """Read rows in notification order (eventsourcing's query; see :meth:`_read`)."""
        return self._read(
            PostgresApplicationRecorder.select_notifications.__wrapped__,
            start,
            limit,
            stop,
            topics,
            inclusive_of_start=inclusive_of_start,
        )

    def max_notification_id(self) -> int | None:
        """Read the last notification id (eventsourcing's query; see :meth:`_read`)."""
        last: int | None = self._read(PostgresApplicationRecorder.max_notification_id.__wrapped__)
        return last

    # ----------------------------------------------------------------- the store's own

    @contextlib.contextmanager
    def _cursor(self, *, commit: bool = False) -> Iterator[Cursor[TupleRow]]:
        """A transaction's cursor with tuple rows (the pool's connections make dict rows)."""
        with self.datastore.get_connection() as conn, conn.transaction(force_rollback=not commit):
            yield conn.cursor(row_factory=tuple_row)

    def _reading(self) -> contextlib.AbstractContextManager[PlaceholderCursor]:
        """A read transaction (rolled back), its cursor taking ``?`` statements."""
        return self._placeholders(commit=False, creates=False)

    def _writing(
        self, *, creates: bool = False
    ) -> contextlib.AbstractContextManager[PlaceholderCursor]:
        """A transaction that commits; ``creates`` takes the schema lock first."""
        return self._placeholders(commit=True, creates=creates)

    @contextlib.contextmanager
    def _placeholders(self, *, commit: bool, creates: bool) -> Iterator[PlaceholderCursor]:
        with self._cursor(commit=commit) as curs:
            if creates:
                _holds_lock(curs)
            yield PlaceholderCursor(curs, self.dialect)

    def _table(self, name: str) -> str:
        """``"schema"."name"``: the store's schema, quoted."""
        return f"{self._quoted_schema}.{self.dialect.quoted(name)}"

    def insert_copied_rows(self, rows: Sequence[CopiedRow]) -> None:
        """Write rows copied from another store, keeping their notification ids (one transaction).

        Under the events table's lock, as every insert; the id sequence then goes on
        after the largest id.

        Raises:
            eventsourcing.persistence.IntegrityError: a position or an id is taken.
            eventsourcing.persistence.OperationalError: the lock was not granted, or
                the connection was lost.
        """
        table = self._table(self.events_table_name)
        with self._cursor(commit=True) as curs:
            curs.execute(
                "SELECT set_config('lock_timeout', %s, true)",
                (f"{max(1, self.datastore.lock_timeout)}s",),
            )
            curs.execute(self.lock_table_statements[1])
            cursor = PlaceholderCursor(curs, self.dialect)
            cursor.executemany(
                f"INSERT INTO {table} (notification_id, originator_id, originator_version, "  # noqa: S608
                "topic, state) VALUES (?, ?, ?, ?, ?)",
                rows,
            )
            cursor.execute(
                "SELECT setval(pg_get_serial_sequence(?, 'notification_id'), "  # noqa: S608
                f"(SELECT MAX(notification_id) FROM {table}))",
                (table,),
            )

    def close(self) -> None:
        """Nothing of its own to close: the pool closes with eventsourcing's factory."""


class PostgresStoreFactory(PostgresFactory):
    """The PostgreSQL factory of eventsourcing, building the store's recorders.

    It also gives every pooled connection libpq's ``connect_timeout`` (eventsourcing
    only bounds the wait for a pooled connection), makes the pool reconnect promptly
    once a server that went away is back, and, for a store opened read-only,
    ``default_transaction_read_only``: nothing can be written through it.
    """

    application_recorder_class = LeanPostgresRecorder
    aggregate_recorder_class = SnapshotRecorder

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        kwargs = self.datastore.pool.kwargs
        assert isinstance(kwargs, dict)
        timeout = int(self.env.get(self.POSTGRES_CONNECT_TIMEOUT) or 5)
        kwargs["connect_timeout"] = timeout
        # psycopg_pool keeps re-trying a lost connection with backoff (1, 2, 4, ... s)
        # for five minutes, holding its slot: after an outage of a few seconds the
        # next try may come long after the server is back. Giving up after the
        # connect timeout frees the slot, and the next request connects at once.
        self.datastore.pool.reconnect_timeout = float(timeout)
        kwargs["application_name"] = "loop-actors"
        if strtobool(self.env.get(READ_ONLY_SETTING) or "no"):
            kwargs["options"] = "-c default_transaction_read_only=on"


class PostgresSealedTable(SealedRows):
    """The secret store's sealed rows in the store's PostgreSQL database (``loop_actors_secrets``).

    Uses the store's connection pool; the table is created on first use, under
    the schema lock. Errors are eventsourcing's ``PersistenceError``.
    """

    def __init__(self, datastore: PostgresDatastore) -> None:
        quoted = Dialect.postgresql.quoted
        super().__init__(Dialect.postgresql, f"{quoted(datastore.schema)}.{quoted(SECRETS_TABLE)}")
        self._datastore = datastore

    @contextlib.contextmanager
    def _transaction(self, *, creates: bool) -> Iterator[StatementCursor]:
        with (
            self._datastore.get_connection() as conn,
            conn.transaction(),
        ):
            curs = conn.cursor(row_factory=tuple_row)
            if creates:
                _holds_lock(curs)
            yield PlaceholderCursor(curs, self.dialect)


# ----------------------------------------------------------------- opening


def check_server(
    *,
    host: str,
    port: int,
    dbname: str,
    user: str,
    password: str,
    connect_timeout_s: int,
    where: str,
) -> None:
    """Connect once, to turn "cannot open" into one clear line (the pool's errors are vague).

    ``where`` is how messages name the database (``host:port/dbname``). The
    password is never part of a message.

    Raises:
        StoreUnavailableError: the server cannot be reached, refuses the user or
            password, or has no such database.
    """
    try:
        with psycopg.connect(
            host=host,
            port=port,
            dbname=dbname,
            user=user,
            password=password,
            connect_timeout=connect_timeout_s,
            application_name="loop-actors",
        ):
            pass
    except psycopg.Error as error:
        raise StoreUnavailableError(
            connect_failure(error, host=host, port=port, dbname=dbname, user=user, where=where)
        ) from None


def connect_failure(
    error: BaseException, *, host: str, port: int, dbname: str, user: str, where: str
) -> str:
    """One line saying why a connection to PostgreSQL failed (never the password)."""
    text = str(error)
    lower = text.lower()
    server = f"PostgreSQL at {where}"
    if "password authentication failed" in lower:
        return f"{server} refused the password of user {user!r} (wrong credentials)"
    if "no password supplied" in lower or "password is required" in lower:
        return (
            f"{server} asks for the password of user {user!r} and none was given "
            "(in the URL, PGPASSWORD or ~/.pgpass)"
        )
    if f'role "{user.lower()}" does not exist' in lower or (
        "role" in lower and "does not exist" in lower
    ):
        return f"{server} has no user {user!r} (wrong credentials)"
    if "no pg_hba.conf entry" in lower:
        return f"{server} does not let user {user!r} connect from here (pg_hba.conf)"
    if "database" in lower and "does not exist" in lower:
        return (
            f"{server}: the server has no database {dbname!r} "
            f'(create it first: CREATE DATABASE "{dbname}")'
        )
    if "starting up" in lower or "shutting down" in lower or "recovery mode" in lower:
        return f"{server} is starting up or shutting down: try again in a moment"
    reason = _last_reason(text)
    return f"cannot reach PostgreSQL at {host}:{port} ({reason}): is the server running there?"


def _last_reason(text: str) -> str:
    """The reason libpq gives, without its address preamble and hints: "Connection refused"."""
    first = text.strip().splitlines()[0] if text.strip() else "no answer"
    reason = first.rsplit("failed: ", 1)[-1].strip()
    return reason.rstrip(".") or "no answer"


def translated(error: PersistenceError, where: str) -> str:
    """A store failure on PostgreSQL as one line naming the server."""
    if is_connection_failure(error):
        return f"lost the connection to PostgreSQL at {where}: {_last_reason(str(error))}"
    return f"PostgreSQL at {where} failed: {_last_reason(str(error))}"


__all__ = [
    "LeanPostgresRecorder",
    "PostgresSealedTable",
    "PostgresStoreFactory",
    "SnapshotRecorder",
    "check_server",
    "is_connection_failure",
]
