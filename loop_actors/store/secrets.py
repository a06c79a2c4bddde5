"""The secret store: the real values of redacted arguments and outputs that a run still needs.

The event store holds ``[redacted]`` where a tool declares a value sensitive.
A run that pauses (for an approval, say) and is resumed later, perhaps in
another process, still needs the real arguments to run the approved call, and
the model still needs to see what it was told. Those values are kept here,
keyed by invocation, step and call, and deleted when the invocation ends.

* With a cipher configured for the store (eventsourcing's ``CIPHER_TOPIC`` and
  ``CIPHER_KEY``), a SQLite or PostgreSQL store keeps them in a table of its own
  in the same database (``loop_actors_secrets``), each value sealed with that
  cipher: approve → resume works across processes, and nothing is in clear on disk.
* Without a cipher (or on ``memory://``), they are kept in the memory of the
  ``Runtime`` object only: a resume by the same runtime has them; one in another
  process does not, and such a call gets a result saying so instead of running.

Every method blocks (the sealed table is in the database): trio code calls them through
``trio.to_thread.run_sync``, except :meth:`SecretStore.keep` and
:meth:`SecretStore.lookup`, which only touch memory.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

from loop_actors._logs import package_logger
from loop_actors.store.schema import SECRETS_TABLE, secrets_table_definition
from loop_actors.store.sql import Cursor
from projections.dialect import Dialect

if TYPE_CHECKING:
    from aggregates.turn import KeptSecret

log = package_logger(__name__)

Kind = Literal["arguments", "output"]
SecretKey = tuple[int, str, Kind]
"""(step, call id, kind)."""

MISSING: Any = object()
"""What :meth:`SecretStore.lookup` returns for a value it does not hold."""


class Cipher(Protocol):
    """eventsourcing's cipher interface."""

    def encrypt(self, plaintext: bytes) -> bytes:
        """Seal."""

    def decrypt(self, ciphertext: bytes) -> bytes:
        """Unseal."""


class SealedTable(Protocol):
    """The rows of sealed values in a store's database (SQLite here, PostgreSQL in ``_postgres``).

    Each method raises the database's error when it fails.
    """

    def select(self, invocation_id: str) -> list[tuple[int, str, str, bytes]]:
        """(step, call id, kind, sealed value) of an invocation's rows."""

    def upsert(self, rows: Sequence[tuple[str, int, str, str, bytes]]) -> None:
        """Write rows (invocation id, step, call id, kind, sealed), replacing equal keys."""

    def delete(self, invocation_id: str) -> None:
        """Delete an invocation's rows."""

    def close(self) -> None:
        """Close what the table opened."""


class SealedRows:
    """The sealed rows in a table of the store's database, each statement written once.

    A subclass gives the transactions (:meth:`_transaction`); the table is created in
    the first one. Each method raises the database's error when it fails.
    """

    def __init__(self, dialect: Dialect, table: str) -> None:
        self.dialect = dialect
        self._name = table
        self._created = False

    def _transaction(self, *, creates: bool) -> contextlib.AbstractContextManager[Cursor]:
        """One transaction, committed when it ends without an error (``creates``: the first)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def _rows(self) -> Iterator[Cursor]:
        creates = not self._created
        with self._transaction(creates=creates) as cursor:
            if creates:
                cursor.execute(secrets_table_definition(self.dialect, self._name))
            yield cursor
        self._created = True

    def select(self, invocation_id: str) -> list[tuple[int, str, str, bytes]]:
        """(step, call id, kind, sealed value) of an invocation's rows."""
        with self._rows() as cursor:
            cursor.execute(
                f"SELECT step, call_id, kind, sealed FROM {self._name} WHERE invocation_id = ?",  # noqa: S608
                (invocation_id,),
            )
            rows = cursor.fetchall()
        return [(int(a), str(b), str(c), bytes(d)) for a, b, c, d in rows]

    def upsert(self, rows: Sequence[tuple[str, int, str, str, bytes]]) -> None:
        """Write rows (invocation id, step, call id, kind, sealed), replacing equal keys."""
        with self._rows() as cursor:
            cursor.executemany(
                f"INSERT INTO {self._name} VALUES (?, ?, ?, ?, ?) "  # noqa: S608
                "ON CONFLICT (invocation_id, step, call_id, kind) "
                "DO UPDATE SET sealed = excluded.sealed",
                rows,
            )

    def delete(self, invocation_id: str) -> None:
        """Delete an invocation's rows."""
        with self._rows() as cursor:
            cursor.execute(f"DELETE FROM {self._name} WHERE invocation_id = ?", (invocation_id,))  # noqa: S608

    def close(self) -> None:
        """Close what the table opened (nothing, unless a subclass opened a connection)."""


class SqliteSealedTable(SealedRows):
    """The sealed rows in the store's SQLite file (none for ``memory://``: ``path`` None)."""

    def __init__(self, path: Path | None) -> None:
        super().__init__(Dialect.sqlite, SECRETS_TABLE)
        self.path = path
        self._connection: sqlite3.Connection | None = None

    @contextlib.contextmanager
    def _transaction(self, *, creates: bool) -> Iterator[Cursor]:
        assert self.path is not None
        if self._connection is None:
            self._connection = sqlite3.connect(self.path, check_same_thread=False, timeout=5.0)
        with self._connection as connection:  # commits, or rolls back on an error
            cursor = connection.cursor()
            try:
                yield cursor
            finally:
                cursor.close()

    def close(self) -> None:
        """Close the file."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class SecretStore:
    """Real values of redacted data, by invocation; sealed in the database when a cipher is set."""

    def __init__(self, table: SealedTable | None = None, cipher: Cipher | None = None) -> None:
        """Keep secrets in memory, or sealed in ``table`` (the store's) with ``cipher``."""
        self._values: dict[str, dict[SecretKey, Any]] = {}
        self._unsaved: dict[str, list[KeptSecret]] = {}
        self._loaded: set[str] = set()
        self._lock = threading.Lock()
        self._table = table if cipher is not None else None
        self._cipher = cipher

    @property
    def sealed(self) -> bool:
        """True when secrets outlive this process (sealed in the store's database)."""
        return self._table is not None

    def open(self, table: SealedTable | None, cipher: Cipher | None) -> None:
        """Point at a store (a Runtime opening its store); sealed when both are given."""
        with self._lock:
            self.close()
            self._table = table if cipher is not None else None
            self._cipher = cipher
            self._loaded.clear()

    # ----------------------------------------------------------------- memory

    def keep(self, invocation_id: str, secrets: list[KeptSecret]) -> None:
        """Hold secrets in memory (``save`` writes them when the store is sealed)."""
        if not secrets:
            return
        with self._lock:
            values = self._values.setdefault(invocation_id, {})
            for secret in secrets:
                values[(secret.step, secret.call_id, secret.kind)] = secret.value
            if self._table is not None:
                self._unsaved.setdefault(invocation_id, []).extend(secrets)

    def lookup(self, invocation_id: str, step: int, call_id: str, kind: Kind) -> Any:
        """The real value, or :data:`MISSING`."""
        return self._values.get(invocation_id, {}).get((step, call_id, kind), MISSING)

    def has_unsaved(self, invocation_id: str) -> bool:
        """True when :meth:`save` has something to write."""
        return bool(self._unsaved.get(invocation_id))

    # ----------------------------------------------------------------- blocking

    def load(self, invocation_id: str) -> None:
        """Read an invocation's sealed secrets into memory (once per opening)."""
        if self._table is None or invocation_id in self._loaded:
            return
        assert self._cipher is not None
        with self._lock:
            rows = self._table.select(invocation_id)
            values = self._values.setdefault(invocation_id, {})
            for step, call_id, kind, sealed in rows:
                values[(step, call_id, cast("Kind", kind))] = json.loads(
                    self._cipher.decrypt(sealed)
                )
            self._loaded.add(invocation_id)

    def save(self, invocation_id: str) -> None:
        """Write the secrets held for an invocation, sealed (before the events that need them).

        Raises:
            sqlite3.Error | eventsourcing.persistence.PersistenceError: the database
                cannot be written (the caller's commit then fails too).
        """
        with self._lock:
            pending = self._unsaved.pop(invocation_id, [])
            if not pending or self._table is None:
                return
            assert self._cipher is not None
            try:
                self._table.upsert(
                    [
                        (
                            invocation_id,
                            s.step,
                            s.call_id,
                            s.kind,
                            self._cipher.encrypt(json.dumps(s.value).encode()),
                        )
                        for s in pending
                    ]
                )
            except BaseException:
                self._unsaved.setdefault(invocation_id, [])[:0] = pending
                raise

    def forget(self, invocation_id: str) -> None:
        """Delete an invocation's secrets (it has ended); a failure is logged, not raised."""
        with self._lock:
            self._values.pop(invocation_id, None)
            self._unsaved.pop(invocation_id, None)
            if self._table is None:
                return
            try:
                self._table.delete(invocation_id)
            except Exception:
                # The values are sealed; a later end of the same invocation retries.
                log.warning(
                    "could not delete the sealed secrets of %s", invocation_id, exc_info=True
                )

    def close(self) -> None:
        """Close the table (memory values stay: a runtime reopened in-process keeps them)."""
        if self._table is not None:
            self._table.close()

    def detach(self) -> None:
        """Forget the table without closing it: a forked child's, whose connection is its parent's.

        Memory values stay; values not saved yet stay unsaved. The lock is made anew
        (another thread of the parent may have held it when the process forked).
        """
        self._lock = threading.Lock()
        self._table = None
        self._loaded.clear()
