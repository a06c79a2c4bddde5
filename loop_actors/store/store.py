"""The event store: eventsourcing's Application on SQLite (default), in memory or on PostgreSQL.

All methods here block; trio code reaches them through the Journal (writes) or
``trio.to_thread.run_sync`` (reads), never directly from the trio thread.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import tempfile
import types
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.domain import EventSourcingError
from eventsourcing.persistence import EventStore as SnapshotStore
from eventsourcing.persistence import (
    Mapper,
    PersistenceError,
    StoredEvent,
)
from eventsourcing.utils import TopicError

from aggregates.audit import (
    StoredForm,
    split_stored,
    topic_of,
    unpack_state,
)
from aggregates.audit_coverage import (
    EFFECT,
    INVOCATION,
    AggregateKind,
    sequence_problem,
    snapshot_seal_holds,
)
from aggregates.decisions import TerminalReason
from aggregates.effect import Effect, EffectPrepared
from aggregates.errors import AggregateError
from aggregates.events import DomainEvent, fold
from aggregates.ids import CANCEL_REQUEST_PREFIX
from aggregates.invocation import (
    Invocation,
    InvocationEvent,
    InvocationSnapshot,
    InvocationStarted,
    Paused,
)
from aggregates.requests import (
    CancelRequest,
    CancelRequested,
    cancel_request_id,
)
from loop_actors._errors import (
    InconsistentHistoryError,
    InvocationNotFoundError,
    StoreCipherError,
    StoreReadOnlyError,
    StoreUnavailableError,
)
from loop_actors._logs import BackgroundLoop, Throttle, package_logger
from loop_actors.store.mapper import (
    PydanticEventMapper,
    SnapshotMapper,
    UnusedTranscoder,
    event_topics,
)
from loop_actors.store.recorder import StoreRecorder
from loop_actors.store.secrets import SealedTable, SqliteSealedTable
from loop_actors.store.sqlite_recorder import LeanSQLiteRecorder
from loop_actors.store.url import APPLICATION_NAME, StoreUrl, sqlite_write_refusal

if TYPE_CHECKING:  # imported by open_queue: a reading command opens no queue (issue 32)
    from loop_actors.store.queue import NewRow, WorkQueue

DEFAULT_SNAPSHOT_INTERVAL = 100
"""An invocation is snapshotted every this many events."""


@dataclass(frozen=True, slots=True)
class _Vouched:
    """What :meth:`EventStore.get_to_resume` noted of an invocation it loaded.

    ``loaded`` is the object it returned (the note goes when the object does); the
    snapshot it was loaded from, at ``version``, was sealed after the stored event there,
    whose chain hash was ``event_hash``.
    """

    loaded: weakref.ref[Invocation]
    version: int
    event_hash: str


log = package_logger(__name__)


class InvocationApplication(Application[str]):
    """The eventsourcing application that holds every invocation's events."""

    name = APPLICATION_NAME
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
            transcoder=UnusedTranscoder(),
            cipher=cipher,
            compressor=self.factory.compressor(),
        )

    def construct_snapshot_store(self) -> SnapshotStore[str]:
        """The snapshots' store, read with :class:`SnapshotMapper` (turns read when needed)."""
        store = super().construct_snapshot_store()
        mapper = self.mapper
        store.mapper = SnapshotMapper(
            transcoder=mapper.transcoder, cipher=mapper.cipher, compressor=mapper.compressor
        )
        return store


def _postgres() -> types.ModuleType:
    """The PostgreSQL recorders' module, imported when a store on PostgreSQL first opens.

    Raises:
        StoreUnavailableError: psycopg (the ``postgres`` extra) is not installed.
    """
    try:
        from loop_actors.store import postgres as module  # noqa: PLC0415 - psycopg is an extra
    except ImportError as error:
        raise StoreUnavailableError(
            f"a PostgreSQL store needs psycopg ({error}): pip install 'loop-actors[postgres]'"
        ) from None
    return module


def _reads_as_json_object(state: bytes) -> bool:
    """Whether a stored event's bytes are a JSON object, as an unencrypted store writes them.

    Not just its first byte: a ciphertext starts with ``{`` once in 256 stores. A packed
    state is read as the JSON state it encodes.
    """
    try:
        return isinstance(json.loads(unpack_state(state)), dict)
    except (ValueError, UnicodeDecodeError):
        return False


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
        self.throttle = Throttle()
        """How its failed snapshots are logged (at most once a minute per error class)."""
        self.read_only = read_only
        self.write_refusal: str | None = None
        self.notes: list[str] = []
        self._copy: Path | None = None
        environment = self.url.environment()
        shown = self.url.display
        if self.url.kind == "sqlite":
            assert self.url.path is not None
            path = self.url.path
            if (self.read_only or not create) and not path.exists():
                raise StoreUnavailableError(f"no database at {path}")
            self._check_sqlite_path(path, create=create and not self.read_only)
            self.write_refusal = (
                f"the URL {shown} says mode=ro"
                if self.url.read_only
                else sqlite_write_refusal(path)
            )
            if self.read_only:
                environment = self.url.read_only_environment(self._read_only_uri(path))
            elif self.write_refusal is not None:
                raise StoreReadOnlyError(
                    f"cannot write to {path}: {self.write_refusal}; the commands that only "
                    "read (history, audit verify, show, list, metrics, effects) work on it"
                )
        elif self.url.kind == "postgresql":
            environment = self._postgres_environment(create=create)
        else:
            self.read_only = False  # an in-memory store is this process's own
        try:
            self.app = InvocationApplication(env=environment)
        except (PersistenceError, sqlite3.Error, OSError) as error:
            self._remove_copy()
            raise StoreUnavailableError(self._cannot(f"cannot open {shown}", error)) from error
        recorder = self.app.recorder
        if self.url.kind == "postgresql":
            # The environment names it.
            assert isinstance(recorder, _postgres().LeanPostgresRecorder)
        else:
            assert isinstance(recorder, LeanSQLiteRecorder)  # the environment names it
        self._recorder: StoreRecorder = recorder
        self._vouched: dict[str, _Vouched] = {}
        self._snapshot_table_seen = False
        try:
            if (self.read_only or not create) and not recorder.has_events_table():
                where = self.url.path if self.url.kind == "sqlite" else self.url.server
                raise StoreUnavailableError(
                    f"{where} is not a loop-actors store: it has no events table"
                )
            self.store_id = recorder.store_identity(create=not self.read_only)
            if not self.read_only:
                recorder.create_queue_tables()
                if hasattr(recorder, "create_effect_index"):
                    recorder.create_effect_index(topic_of(EffectPrepared))
            self._check_cipher()
        except (PersistenceError, sqlite3.Error) as error:
            self.close()
            raise StoreUnavailableError(self._cannot(f"cannot open {shown}", error)) from error
        except BaseException:
            self.close()
            raise

    def _postgres_environment(self, *, create: bool) -> dict[str, str]:
        """Check psycopg and the server, then the environment of a PostgreSQL store.

        Raises:
            StoreUnavailableError: psycopg is not installed, or the server cannot
                be reached, refuses the credentials, or has no such database.
            StoreReadOnlyError: a writing open of a URL that says ``mode=ro``.
        """
        url = self.url
        if url.read_only:
            self.write_refusal = f"the URL {url.display} says mode=ro"
        if not self.read_only and self.write_refusal is not None:
            raise StoreReadOnlyError(
                f"cannot write to {url.server}: {self.write_refusal}; the commands that only "
                "read (history, audit verify, show, list, metrics, effects) work on it"
            )
        postgres = _postgres()
        environment = self.url.read_only_environment() if self.read_only else url.environment()
        assert url.host is not None
        assert url.port is not None
        assert url.dbname is not None
        assert url.user is not None
        postgres.check_server(
            host=url.host,
            port=url.port,
            dbname=url.dbname,
            user=url.user,
            password=environment["POSTGRES_PASSWORD"],
            connect_timeout_s=url.connect_timeout_s,
            where=url.server,
        )
        if not create:
            environment["CREATE_TABLE"] = "n"
        return environment

    def _cannot(self, what: str, error: BaseException) -> str:
        """``what: why`` in one line, naming the server and never the password."""
        if self.url.kind == "postgresql" and isinstance(error, PersistenceError):
            return self.url.scrub(f"{what}: {_postgres().translated(error, self.url.server)}")
        return self.url.scrub(f"{what}: {error}")

    @property
    def contiguous_ids(self) -> bool:
        """Whether notification ids have no holes unless rows were deleted.

        True on SQLite (a row id is the largest so far plus one). False on
        PostgreSQL: a transaction that rolls back (a conflict) has used values of
        the ``notification_id`` sequence, which no row will have; the audit's
        chain, not the ids, tells a deleted row there.
        """
        return self.url.kind != "postgresql"

    def sealed_table(self) -> SealedTable:
        """Where the secret store seals its values: a table of this store's own database."""
        if self.url.kind == "postgresql":
            datastore = getattr(self._recorder, "datastore", None)
            assert datastore is not None
            table: SealedTable = _postgres().PostgresSealedTable(datastore)
            return table
        if self.url.kind == "memory":
            return SqliteSealedTable(None)
        assert self.url.path is not None
        return SqliteSealedTable(self.url.path)

    def _check_cipher(self) -> None:
        """Decode the first stored event: a wrong or missing key fails here, typed.

        Raises:
            StoreCipherError: the first event cannot be decrypted with the configured
                cipher, or it is encrypted (or compressed) and no cipher is configured.
        """
        try:
            first = self._recorder.select_notifications(start=None, limit=1)
        except (PersistenceError, sqlite3.Error) as error:
            raise StoreUnavailableError(
                self._cannot(f"cannot read {self.url.display}", error)
            ) from error
        if not first:
            return
        mapper = self.app.mapper
        try:
            mapper.to_domain_event(first[0])
        except Exception as unreadable:
            # What the cipher (or the decoding) raised, rather than the mapper's own error.
            cause = unreadable.__cause__
            why = cause if isinstance(cause, Exception) else unreadable
            plain = _reads_as_json_object(first[0].state)
            if mapper.cipher is not None:
                raise StoreCipherError(
                    f"cannot decrypt the events of {self.url.display} with this CIPHER_KEY "
                    f"({type(why).__name__}: {why}): set the key the store was written "
                    + ("with" if not plain else "with, or unset CIPHER_TOPIC: it is not encrypted")
                ) from why
            if not plain and mapper.compressor is None:
                raise StoreCipherError(
                    f"the events of {self.url.display} are encrypted (or compressed): set "
                    "CIPHER_TOPIC and CIPHER_KEY (and COMPRESSOR_TOPIC) as when it was written"
                ) from why
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

    def open_queue(self) -> WorkQueue:
        """The store's work queue, in its own database (its tables were created with the store).

        On SQLite its own connection to the file; in memory the store's own database,
        on the store's connection; on PostgreSQL its own connection to the server.

        Raises:
            StoreUnavailableError: the queue's database cannot be opened.
        """
        from loop_actors.store.queue import PostgresQueue, SQLiteQueue  # noqa: PLC0415

        if self.url.kind == "postgresql":
            return PostgresQueue(self.url.url)
        if self.url.kind == "memory":
            assert isinstance(self._recorder, LeanSQLiteRecorder)
            return self._recorder.memory_queue()
        assert self.url.path is not None
        return SQLiteQueue(
            str(self.url.path), timeout_s=self.url.lock_wait_s, read_only=self.read_only
        )

    def close(self) -> None:
        """Close the connections (and remove a read-only open's copy)."""
        self._recorder.close()
        self.app.close()
        self._remove_copy()

    # ----------------------------------------------------------------- writes

    def append(
        self,
        events: Sequence[DomainEvent],
        *,
        lock_wait_s: float | None = None,
        queue_rows: Sequence[NewRow] = (),
    ) -> int:
        """Append events atomically (one transaction); return the last notification id.

        ``lock_wait_s``: wait at most this long (and never longer than the URL's
        ``lock_timeout``) for a database another connection has locked.

        ``queue_rows``: the work queue's rows of the invocations these events start,
        written in the same transaction (a row whose invocation has one is left as it
        is). An invocation started so is never without its row, however soon the
        process that started it dies.

        Raises:
            eventsourcing.persistence.IntegrityError: a position is already taken
                (another writer appended first); nothing was written.
            eventsourcing.persistence.PersistenceError: the database failed.
            StoreReadOnlyError: the store is open read-only.
        """
        if self.read_only:
            raise StoreReadOnlyError(
                f"{self.url.display} is open read-only: nothing can be appended"
            )
        # Application.save would do the same after per-object runtime Protocol
        # checks, which cost more than the mapping itself.
        to_stored = self.app.mapper.to_stored_event
        ids = self._recorder.insert_events(
            [to_stored(event) for event in events], lock_wait_s=lock_wait_s, queue_rows=queue_rows
        )
        self._snapshot_long_histories(events)
        return ids[-1] if ids else 0

    def snapshots_due(self, events: Sequence[DomainEvent]) -> dict[str, int]:
        """The invocations whose history these events take to a multiple of the interval.

        Appending them takes a snapshot of each (invocation id: version), which reads
        the store: the Journal does not append those on the trio thread.
        """
        interval = self.snapshot_interval
        return {
            event.originator_id: event.originator_version
            for event in events
            if isinstance(event, InvocationEvent) and event.originator_version % interval == 0
        }

    def _snapshot_long_histories(self, events: Sequence[DomainEvent]) -> None:
        """Snapshot each invocation whose history just crossed a multiple of the interval.

        Reading an invocation then replays at most ``snapshot_interval`` events.
        A failed snapshot loses nothing (the events are committed): it is retried
        at the next interval.
        """
        for invocation_id, version in self.snapshots_due(events).items():
            try:
                self.app.take_snapshot(invocation_id, version=version, projector_func=fold)
            except PersistenceError as error:
                self.throttle.caught(
                    log,
                    BackgroundLoop.JOURNAL,
                    error,
                    "no snapshot of %s at version %d (the events are committed; retried at "
                    "the next interval): %s",
                    invocation_id,
                    version,
                    error,
                    exc_info=False,
                    invocation_id=invocation_id,
                )

    # ----------------------------------------------------------------- reads

    def get(self, invocation_id: str) -> Invocation:
        """Rebuild an invocation from its events.

        Raises:
            InvocationNotFoundError: no such invocation.
            UnreadableEventError: one of its stored rows cannot be read.
            InconsistentHistoryError: its stored events are not a history it can be
                rebuilt from (rows deleted from the middle or its first, an event its
                transitions refuse): they were changed by hand.
        """
        return self._loaded(
            invocation_id, lambda: self.app.repository.get(invocation_id, projector_func=fold)
        )

    def get_to_resume(self, invocation_id: str) -> Invocation:
        """:meth:`get`, noting whether the store vouches for the snapshot it started from.

        Loaded as :meth:`get` loads it (the newest snapshot, then the events after it),
        with the stored event at the snapshot's version read in the same statement. When
        the snapshot's seal holds against that event (:meth:`vouches_for`), the store
        notes, for as long as the returned object lives, the snapshot's version and that
        event's hash: :meth:`vouched_tail` then checks what the run goes on from without
        reading or hashing the snapshot again (resume's history check, issue 32).

        Raises:
            As :meth:`get`.
        """
        return self._loaded(invocation_id, lambda: self._load_noting_seal(invocation_id))

    def _loaded(self, invocation_id: str, load: Callable[[], Any]) -> Invocation:
        """The invocation ``load`` rebuilds, its failures told as :meth:`get` tells them."""
        try:
            invocation = load()
        except AggregateNotFoundError:
            raise InvocationNotFoundError(invocation_id) from None
        except (PersistenceError, InconsistentHistoryError):
            raise
        except (EventSourcingError, AggregateError, AssertionError) as error:
            # What replaying a history cut or edited by hand raises: eventsourcing's
            # version checks (and its assertion that a first event creates the
            # aggregate), or the aggregate's transitions.
            raise self._unreplayable(invocation_id, INVOCATION, error) from error
        if not isinstance(invocation, Invocation):
            raise InvocationNotFoundError(invocation_id)
        return invocation

    def _load_noting_seal(self, invocation_id: str) -> Any:
        """What eventsourcing's repository rebuilds, and the note of :meth:`get_to_resume`."""
        row = self.newest_snapshot_row(invocation_id)
        if row is None:  # nothing to vouch for: the check replays every event
            return self.app.repository.get(invocation_id, projector_func=fold)
        snapshots = self.app.snapshots
        assert snapshots is not None  # it has a snapshot row
        version = row.originator_version
        rows = self._recorder.select_events(invocation_id, gt=version - 1)
        at = rows[0] if rows and rows[0].originator_version == version else None
        mapper = self.app.mapper
        start = cast("DomainEvent", snapshots.mapper.to_domain_event(row))
        tail = (
            cast("DomainEvent", mapper.to_domain_event(r))
            for r in rows
            if r.originator_version > version
        )
        invocation = fold(None, chain([start], tail))
        if at is not None and isinstance(invocation, Invocation):
            event_hash = self._chain_hash(at)
            if event_hash is not None and self._seal_holds(row, event_hash):
                self._note_vouched(invocation, version, event_hash)
        return invocation

    def _note_vouched(self, invocation: Invocation, version: int, event_hash: str) -> None:
        """Note that ``invocation`` was loaded from a snapshot the store vouched for."""
        key = invocation.id
        vouched = self._vouched

        def forget(ref: weakref.ref[Invocation]) -> None:  # the object is gone
            noted = vouched.get(key)
            if noted is not None and noted.loaded is ref:
                vouched.pop(key, None)

        vouched[key] = _Vouched(weakref.ref(invocation, forget), version, event_hash)

    def vouched_tail(self, invocation: Invocation) -> tuple[int, list[InvocationEvent]] | None:
        """The vouched snapshot ``invocation`` was loaded from: its version and the events after.

        For an invocation :meth:`get_to_resume` loaded from a snapshot whose seal held,
        while the store still vouches for that snapshot: the stored event at its version
        carries the hash the seal was checked against (the same event, not changed or
        deleted since), and every event up to it is stored (none deleted before it), as
        :meth:`vouches_for` requires of a snapshot row. None otherwise (another object,
        no vouched snapshot, a row changed or deleted since): the caller checks what it
        would check without.
        """
        noted = self._vouched.get(invocation.id)
        if noted is None or noted.loaded() is not invocation:
            return None
        version = noted.version
        rows = self._recorder.select_events(invocation.id, gt=version - 1)
        if not rows or rows[0].originator_version != version:
            return None
        if self._chain_hash(rows[0]) != noted.event_hash:
            return None
        if self._recorder.count_versions_to(invocation.id, version) != version:
            return None
        mapper = self.app.mapper
        return version, [cast("InvocationEvent", mapper.to_domain_event(r)) for r in rows[1:]]

    def get_effect(self, key: str) -> Effect | None:
        """The ledger entry of an effect key, or None when it was never prepared.

        Raises:
            UnreadableEventError, InconsistentHistoryError: as :meth:`get` (the error's
                ``invocation_id`` is the effect key).
        """
        try:
            effect = self.app.repository.get(key, projector_func=fold)
        except AggregateNotFoundError:
            return None
        except (PersistenceError, InconsistentHistoryError):
            raise
        except (EventSourcingError, AggregateError, AssertionError) as error:  # as in get
            raise self._unreplayable(key, EFFECT, error) from error
        return effect if isinstance(effect, Effect) else None

    def _unreplayable(
        self, aggregate_id: str, kind: AggregateKind, error: BaseException
    ) -> InconsistentHistoryError:
        """The refusal of an aggregate whose stored events could not be replayed."""
        stored = self._recorder.select_events(aggregate_id)
        events = [cast("DomainEvent", self.app.mapper.to_domain_event(r)) for r in stored]
        found = sequence_problem(kind, events)
        if found is None:  # not a fault of the rows themselves: say what was raised
            why = f"{type(error).__name__}: {error}"
        else:
            where, why = found
            why = why if why.startswith("position") else f"position {where}: {why}"
        what = "invocation" if kind is INVOCATION else "effect ledger entry"
        return InconsistentHistoryError(
            aggregate_id,
            f"{what} {aggregate_id}'s stored history cannot be replayed: {why}; "
            "nothing was run (check the store with: loop-actors audit verify)",
        )

    def effects_of(self, invocation_id: str) -> list[Effect]:
        """Every ledger entry recorded for an invocation, oldest first (for resume's check).

        Looks them up in the index of ``EffectPrepared`` rows by invocation, so the
        time does not grow with the store. A store whose states are not plain JSON
        (encrypted or compressed), or one opened read-only that has no index, reads the
        ``EffectPrepared`` notifications from the invocation's first stored row on
        instead (an effect is always prepared after its invocation started).
        """
        return self.effects_of_many([invocation_id])[invocation_id]

    def effects_of_many(self, invocation_ids: Sequence[str]) -> dict[str, list[Effect]]:
        """What :meth:`effects_of` gives for each of these invocations (by the index at once)."""
        found: dict[str, list[Effect]] = {}
        for invocation_id, keys in self.effect_keys_of_many(invocation_ids).items():
            effects = [self.get_effect(key) for key in keys]
            found[invocation_id] = [effect for effect in effects if effect is not None]
        return found

    def effect_keys_of_many(self, invocation_ids: Sequence[str]) -> dict[str, list[str]]:
        """The keys of every ledger entry recorded for each invocation, oldest first.

        Found as :meth:`effects_of` finds the entries, without reading the entries
        themselves (the audit checks each one's chain on its own).
        """
        mapper = self.app.mapper
        by_index = getattr(self._recorder, "effect_keys_of_many", None)
        if by_index is not None and mapper.cipher is None and mapper.compressor is None:
            keys_of = by_index(invocation_ids, topic_of(EffectPrepared))
            if keys_of is not None:
                return {i: list(keys_of.get(i, [])) for i in invocation_ids}
        return {i: self._effect_keys_by_scan(i) for i in invocation_ids}

    def effects_of_by_scan(self, invocation_id: str) -> list[Effect]:
        """:meth:`effects_of` without the index: every ``EffectPrepared`` since it started."""
        effects = [self.get_effect(key) for key in self._effect_keys_by_scan(invocation_id)]
        return [effect for effect in effects if effect is not None]

    def _effect_keys_by_scan(self, invocation_id: str) -> list[str]:
        """The keys of the invocation's ``EffectPrepared`` rows, read since it started."""
        start = self._recorder.first_position_of(invocation_id)
        if start is None:
            return []
        found: list[str] = []
        position = start - 1
        while True:
            notifications = self._recorder.select_notifications(
                start=position,
                limit=500,
                topics=[topic_of(EffectPrepared)],
                inclusive_of_start=False,
            )
            for notification in notifications:
                prepared = self.app.mapper.to_domain_event(notification)
                if isinstance(prepared, EffectPrepared) and prepared.invocation_id == invocation_id:
                    found.append(str(notification.originator_id))
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
                topics=[topic_of(created_type)],
                inclusive_of_start=False,
            )
            ids.extend(str(n.originator_id) for n in notifications)
            if len(notifications) < 500:
                return ids
            position = notifications[-1].id

    def paused_for_reconciliation(self) -> list[Invocation]:
        """Every invocation paused ``reconciliation_required`` now, in the order it paused first.

        Found from the ``Paused`` rows that say so (whatever became of their effects: a
        write the service did not know after its last dispatch is ``prepared``, not
        open), each invocation read as it stands now.
        """
        candidates: dict[str, None] = {}
        position = 0
        while True:
            notifications = self._recorder.select_notifications(
                start=position, limit=500, topics=[topic_of(Paused)], inclusive_of_start=False
            )
            for notification in notifications:
                paused = self.app.mapper.to_domain_event(notification)
                if (
                    isinstance(paused, Paused)
                    and paused.reason is TerminalReason.RECONCILIATION_REQUIRED
                ):
                    candidates[str(notification.originator_id)] = None
            if len(notifications) < 500:
                break
            position = notifications[-1].id
        found = [self.get(invocation_id) for invocation_id in candidates]
        return [invocation for invocation in found if invocation.paused_for_reconciliation]

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
            topics=[topic_of(CancelRequested)],
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

    def stored_entries(
        self, aggregate_id: str, *, forms: dict[int, StoredForm] | None = None, after: int = 0
    ) -> list[tuple[int, DomainEvent | Exception]]:
        """An aggregate's stored events as (position, event), undecodable rows as exceptions.

        For the audit: nothing is validated beyond decoding, and no row is skipped.
        A row whose topic names no loop-actors event class is not decoded (decoding
        would import the module it names): it is reported as unreadable. With
        ``forms``, each decoded row's topic and plaintext state are put there by position.
        With ``after``, only the rows after that position.
        """
        entries: list[tuple[int, DomainEvent | Exception]] = []
        for record in self._recorder.select_events(aggregate_id, gt=after or None):
            event, plain = self._decode_audited(record)
            entries.append((record.originator_version, event))
            if forms is not None and plain is not None:
                forms[record.originator_version] = StoredForm(record.topic, plain)
        return entries

    def _decode_audited(self, record: StoredEvent) -> tuple[Any, bytes | None]:
        """The event (or the exception decoding raised) and its plaintext state, if decoded.

        The row is decrypted, decompressed and unpacked once for both.
        """
        if record.topic not in event_topics():
            return ValueError(f"its topic {record.topic!r} names no loop-actors event class"), None
        mapper = cast("PydanticEventMapper", self.app.mapper)
        try:
            plain = mapper.plain_state(record)
            return mapper.decode_plain(record, plain), plain
        except Exception as error:  # a tampered row is reported, not raised
            return error, None

    def log_rows(
        self, page: int = 500, *, after: int = 0
    ) -> Iterator[tuple[int, str, int, str, bytes]]:
        """Every stored event row in notification order: (id, originator, version, topic, state).

        The state is the bytes as stored (encrypted or compressed if the store is).
        With ``after``, only the rows whose notification id is larger.
        """
        position = after
        while True:
            notifications = self._recorder.select_notifications(
                start=position, limit=page, inclusive_of_start=False
            )
            for n in notifications:
                yield n.id, str(n.originator_id), n.originator_version, n.topic, bytes(n.state)
            if len(notifications) < page:
                return
            position = notifications[-1].id

    def notifications_after(
        self, after: int, *, limit: int = 500, topics: Sequence[str] = ()
    ) -> list[tuple[int, str, int, str]]:
        """Rows after notification id ``after``, in log order: (id, originator, version, topic).

        With ``topics``, only rows of those topics. At most ``limit`` rows.
        """
        notifications = self._recorder.select_notifications(
            start=after, limit=limit, topics=topics, inclusive_of_start=False
        )
        return [(n.id, str(n.originator_id), n.originator_version, n.topic) for n in notifications]

    def copy_in(self, rows: Sequence[tuple[int, str, int, str, bytes]]) -> None:
        """Write rows of another store's log as they were stored, with their ids (one transaction).

        Raises:
            StoreReadOnlyError: the store is open read-only.
            eventsourcing.persistence.PersistenceError: the database failed, or an id
                or position is taken.
        """
        if self.read_only:
            raise StoreReadOnlyError(f"{self.url.display} is open read-only: nothing can be copied")
        self._recorder.insert_copied_rows(rows)

    def snapshot_rows(self) -> list[tuple[str, int, str, bytes]]:
        """Every stored snapshot row as stored: (id, version, topic, state)."""
        table = self._snapshot_table()
        return [] if table is None else self._recorder.select_rows(table, None)

    def copy_snapshots_in(self, rows: Sequence[tuple[str, int, str, bytes]]) -> None:
        """Write another store's snapshot rows as they were stored."""
        snapshots = self.app.snapshots
        if snapshots is None or not rows:
            return
        snapshots.recorder.insert_events(
            [
                StoredEvent(originator_id=a, originator_version=b, topic=c, state=d)
                for a, b, c, d in rows
            ]
        )

    def sealed_rows(self) -> list[tuple[str, int, str, str, bytes]]:
        """The sealed secrets of paused invocations, as stored (for ``store copy``)."""
        return self._recorder.select_sealed_rows()

    def adopt_identity(self, store_id: str) -> None:
        """Take over another store's identity: this store is a copy of it (``store copy``)."""
        self._recorder.replace_identity(store_id)
        self.store_id = store_id

    def audit_aggregate_ids(self) -> list[str]:
        """The id of every aggregate with a stored row, in the order of its first row."""
        return self._recorder.aggregate_ids_in_first_row_order()

    def audit_row_counts(self) -> tuple[int, int]:
        """How many event rows and snapshot rows the store holds."""
        event_rows = self._recorder.count_rows(self._recorder.events_table_name)
        table = self._snapshot_table()
        snapshot_rows = 0 if table is None else self._recorder.count_rows(table)
        return event_rows, snapshot_rows

    def _snapshot_table(self) -> str | None:
        """The snapshots' table, when the store has one (a read-only open creates none)."""
        snapshots = self.app.snapshots
        if snapshots is None:
            return None
        name = str(getattr(snapshots.recorder, "events_table_name", "stored_snapshots"))
        if not self._snapshot_table_seen:  # once seen, it stays: no command drops it
            self._snapshot_table_seen = self._recorder.has_table(name)
        return name if self._snapshot_table_seen else None

    def stored_snapshots(self, aggregate_id: str | None = None) -> dict[str, list[tuple[int, Any]]]:
        """Every stored snapshot (or one aggregate's) as {id: [(version, snapshot or exception)]}.

        A row whose topic is not the invocation snapshot's is not decoded (reported
        as an exception), as for :meth:`stored_entries`.
        """
        table = self._snapshot_table()
        if table is None:
            return {}
        found: dict[str, list[tuple[int, Any]]] = {}
        for originator_id, version, topic, state in self._recorder.select_rows(table, aggregate_id):
            record = StoredEvent(
                originator_id=originator_id, originator_version=version, topic=topic, state=state
            )
            found.setdefault(originator_id, []).append((version, self._decoded_snapshot(record)))
        return found

    def newest_snapshot(self, invocation_id: str) -> list[tuple[int, Any]]:
        """The snapshot loading the invocation starts from, as [(version, snapshot or exception)].

        Empty when it has none. Decoded as :meth:`stored_snapshots` decodes them (every
        turn validated).
        """
        snapshots = self.app.snapshots
        if snapshots is None or self._snapshot_table() is None:
            return []
        rows = snapshots.recorder.select_events(invocation_id, desc=True, limit=1)
        return [(record.originator_version, self._decoded_snapshot(record)) for record in rows]

    def newest_snapshot_row(self, invocation_id: str) -> StoredEvent | None:
        """The row of the snapshot loading the invocation starts from, not decoded (None: none)."""
        snapshots = self.app.snapshots
        if snapshots is None or self._snapshot_table() is None:
            return None
        rows = snapshots.recorder.select_events(invocation_id, desc=True, limit=1)
        return rows[0] if rows else None

    def vouches_for(self, record: StoredEvent) -> bool:
        """Whether the store vouches for a snapshot row: resume may trust it without a replay.

        It does when the snapshot's seal holds against the stored event at its version
        (it is, byte for byte, the snapshot written after that event:
        ``aggregates.audit_coverage.snapshot_seal_holds``) and every event of the
        invocation up to that version is stored (none was deleted before it). Never for a
        snapshot written before seals, nor for a row that cannot be read.
        """
        invocation_id = str(record.originator_id)
        version = record.originator_version
        rows = self._recorder.select_events(invocation_id, gt=version - 1, lte=version)
        event_hash = self._chain_hash(rows[0]) if len(rows) == 1 else None
        if event_hash is None or not self._seal_holds(record, event_hash):
            return False
        return self._recorder.count_versions_to(invocation_id, version) == version

    def _chain_hash(self, row: StoredEvent) -> str | None:
        """The chain hash a stored event carries (None: none, or a row that cannot be read)."""
        mapper = cast("PydanticEventMapper", self.app.mapper)
        try:
            split = split_stored(mapper.plain_state(row))
        except (PersistenceError, sqlite3.Error):
            raise  # the store, not the row: nothing more can be read
        except Exception:  # a row that does not decrypt or unpack: the replay says why
            return None
        return None if split is None else split[0]

    def _seal_holds(self, record: StoredEvent, event_hash: str) -> bool:
        """Whether a snapshot row's seal holds against the event hash at its version."""
        mapper = cast("PydanticEventMapper", self.app.mapper)
        try:
            plain = mapper.plain_state(record)
        except (PersistenceError, sqlite3.Error):
            raise
        except Exception:  # as in _chain_hash
            return False
        return snapshot_seal_holds(
            str(record.originator_id), record.originator_version, record.topic, plain, event_hash
        )

    def events_after(self, invocation_id: str, version: int) -> list[InvocationEvent]:
        """The invocation's committed events after ``version``, in order."""
        stored = self._recorder.select_events(invocation_id, gt=version)
        return [
            cast("InvocationEvent", self.app.mapper.to_domain_event(record)) for record in stored
        ]

    def _decoded_snapshot(self, record: StoredEvent) -> Any:
        """A stored snapshot, or the exception that decoding it raised (a tampered row)."""
        if record.topic != topic_of(InvocationSnapshot):
            return ValueError(f"its topic {record.topic!r} is not an invocation snapshot's")
        try:
            return self.app.mapper.to_domain_event(record)
        except Exception as error:  # a tampered row is reported, not raised
            return error

    def events_of(
        self, invocation_ids: Sequence[str]
    ) -> dict[str, list[InvocationEvent] | Exception]:
        """What :meth:`events` gives for each of these invocations, read in one transaction.

        An invocation without rows gets ``InvocationNotFoundError``, one whose rows do
        not decode the exception that decoding raised; the others are not affected.
        """
        rows = self._stored_events_of(invocation_ids)
        mapper = self.app.mapper
        found: dict[str, list[InvocationEvent] | Exception] = {}
        for invocation_id in invocation_ids:
            stored = rows.get(invocation_id)
            if not stored:
                found[invocation_id] = InvocationNotFoundError(invocation_id)
                continue
            try:
                found[invocation_id] = [
                    cast("InvocationEvent", mapper.to_domain_event(record)) for record in stored
                ]
            except Exception as error:  # a damaged row: this invocation's, not the others'
                found[invocation_id] = error
        return found

    def invocations_of(self, invocation_ids: Sequence[str]) -> dict[str, Invocation | Exception]:
        """The invocations these ids name, each folded from its events, read in one transaction.

        An id that names no invocation is left out; one whose rows do not decode, or do
        not fold into an invocation, gets the exception that says so (the others are
        not affected). Every event is read (a snapshot is not looked for): for the
        invocations a submission finds already there, mostly just started.
        """
        found: dict[str, Invocation | Exception] = {}
        for invocation_id, events in self.events_of(invocation_ids).items():
            if isinstance(events, InvocationNotFoundError):
                continue
            if isinstance(events, Exception):
                found[invocation_id] = events
                continue
            try:
                invocation = fold(None, events)
            except (EventSourcingError, AggregateError, AssertionError) as error:
                found[invocation_id] = self._unreplayable(invocation_id, INVOCATION, error)
                continue
            found[invocation_id] = (
                invocation
                if isinstance(invocation, Invocation)
                else InvocationNotFoundError(invocation_id)
            )
        return found

    def _stored_events_of(self, originator_ids: Sequence[str]) -> dict[str, list[StoredEvent]]:
        """The stored rows of these aggregates, by aggregate, in version order (one read)."""
        rows: dict[str, list[StoredEvent]] = {}
        for originator_id, version, topic, state in self._recorder.select_rows_of(
            self._recorder.events_table_name, originator_ids
        ):
            rows.setdefault(originator_id, []).append(
                StoredEvent(
                    originator_id=originator_id,
                    originator_version=version,
                    topic=topic,
                    state=state,
                )
            )
        return rows

    def newest_snapshots(self, invocation_ids: Sequence[str]) -> dict[str, list[tuple[int, Any]]]:
        """What :meth:`newest_snapshot` gives for each of these invocations, in one read."""
        table = self._snapshot_table()
        found: dict[str, list[tuple[int, Any]]] = {key: [] for key in invocation_ids}
        if self.app.snapshots is None or table is None:
            return found
        newest: dict[str, tuple[str, int, str, bytes]] = {}
        for row in self._recorder.select_rows_of(table, invocation_ids):
            newest[row[0]] = row  # by version: the last is the newest
        for originator_id, (_, version, topic, state) in newest.items():
            record = StoredEvent(
                originator_id=originator_id, originator_version=version, topic=topic, state=state
            )
            found[originator_id] = [(version, self._decoded_snapshot(record))]
        return found

    def cancel_requests_of(
        self, invocation_ids: Sequence[str]
    ) -> dict[str, CancelRequest | Exception | None]:
        """What :meth:`cancel_request` gives for each of these invocations, in one read."""
        by_request = {cancel_request_id(i): i for i in invocation_ids}
        rows = self._stored_events_of(list(by_request))
        mapper = self.app.mapper
        found: dict[str, CancelRequest | Exception | None] = dict.fromkeys(invocation_ids)
        for request_id, stored in rows.items():
            try:
                request = fold(
                    None, [cast("DomainEvent", mapper.to_domain_event(r)) for r in stored]
                )
            except Exception as error:  # a damaged row: this request's, not the others'
                found[by_request[request_id]] = error
                continue
            found[by_request[request_id]] = request if isinstance(request, CancelRequest) else None
        return found

    def events(
        self, invocation_id: str, *, after: int = 0, limit: int | None = None
    ) -> list[InvocationEvent]:
        """Every committed event of an invocation, in order (``after`` it, at most ``limit``).

        Raises:
            InvocationNotFoundError: no such invocation (or, with ``after``, no event
                after that position).
        """
        stored = self._recorder.select_events(invocation_id, gt=after or None, limit=limit)
        if not stored:
            raise InvocationNotFoundError(invocation_id)
        return [
            cast("InvocationEvent", self.app.mapper.to_domain_event(record)) for record in stored
        ]
