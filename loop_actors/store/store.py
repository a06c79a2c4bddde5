"""The event store: eventsourcing's Application on SQLite (default), in memory or on PostgreSQL.

All methods here block; trio code reaches them through the Journal (writes) or
``trio.to_thread.run_sync`` (reads), never directly from the trio thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import shutil
import sqlite3
import stat
import tempfile
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache, lru_cache
from pathlib import Path
from typing import Any, ClassVar, Protocol, cast
from urllib.parse import parse_qs, unquote, urlsplit
from uuid import UUID, uuid4

from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.persistence import (
    DatabaseError,
    IntegrityError,
    InterfaceError,
    Mapper,
    Notification,
    NotSupportedError,
    OperationalError,
    PersistenceError,
    StoredEvent,
    Transcoder,
)
from eventsourcing.persistence import EventStore as SnapshotStore
from eventsourcing.sqlite import (
    SQLITE3_DEFAULT_LOCK_TIMEOUT,
    SQLiteApplicationRecorder,
    SQLiteDatastore,
)
from eventsourcing.utils import TopicError, get_topic, resolve_topic

from aggregates.audit import (
    AUDIT_FORMAT,
    StoredForm,
    event_body,
    pack_body,
    stored_state,
    topic_of,
    unpack_parts,
    unpack_state,
)
from aggregates.audit_coverage import event_classes
from aggregates.effect import Effect, EffectPrepared
from aggregates.events import DomainEvent, fold, stored_body
from aggregates.ids import CANCEL_REQUEST_PREFIX
from aggregates.invocation import (
    LAZY_TURNS,
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
from loop_actors.store._eventsourcing_internals import is_read_only_uri, keep_journal_mode
from loop_actors.store.secrets import SealedTable, SqliteSealedTable

DEFAULT_DB_URL = "sqlite:///loop-actors.db"
"""The embedded default: a SQLite file in the current directory."""

DB_URL_ENV = "LOOP_ACTORS_DB"

POSTGRES_FACTORY_TOPIC = "loop_actors.store.postgres:PostgresStoreFactory"
"""eventsourcing's factory for a PostgreSQL store (resolved by eventsourcing when one opens:
psycopg is imported only then)."""

DEFAULT_SNAPSHOT_INTERVAL = 100
"""An invocation is snapshotted every this many events."""

DEFAULT_LOCK_RETRY_S = 2.0
"""How long the Journal retries a commit that failed on a locked database (``lock_retry``)."""

ROWS_OF_CHUNK = 500
"""Aggregate ids a statement of ``select_rows_of`` names (well under SQLite's bound parameters)."""

log = logging.getLogger(__name__)


_IN_COLUMNS = {"originator_id", "originator_version"}
_JSON_ROWS = frozenset({get_topic(EffectPrepared)})
"""Topics whose rows stay JSON: the effect index reads their ``invocation_id`` in SQL."""


@cache
def _event_topics() -> frozenset[str]:
    """The topics of every loop-actors event class: all a store's event rows may name."""
    return frozenset(topic_of(cls) for cls in event_classes())


@cache
def _class_of(topic: str) -> type[DomainEvent]:
    return cast("type[DomainEvent]", resolve_topic(topic))


def _validator_of(topic: str) -> Callable[..., Any]:
    """``model_validate_json`` of the topic's class, without its Python wrapper.

    Its validator's own ``validate_json``, once the class is built (the wrapper is about
    a third of a small event's decoding).
    """
    found = _VALIDATORS.get(topic)
    if found is None:
        cls = _class_of(topic)
        if not cls.__pydantic_complete__:  # not built yet: pydantic builds it on first use
            return cls.model_validate_json
        found = _VALIDATORS[topic] = cls.__pydantic_validator__.validate_json
    return found


_VALIDATORS: dict[str, Callable[..., Any]] = {}

_ascii_string: Callable[[str], str] = json.encoder.encode_basestring_ascii
"""A str as a JSON string with ASCII escapes (C; what ``json.dumps`` calls)."""
_SMALL = 1_000
_VERSIONS = tuple(b"%d" % n for n in range(_SMALL))
"""An event's version as JSON, for the versions most events have."""


class PydanticEventMapper(Mapper[str]):
    """Maps pydantic events to stored records with pydantic's own JSON codec.

    Honours eventsourcing's compressor and cipher settings (``COMPRESSOR_TOPIC``,
    ``CIPHER_TOPIC``/``CIPHER_KEY``) exactly as the default mapper does.

    A state of audit format 2 is stored packed (``aggregates.audit.pack_state``: its
    hash in 32 bytes, its body compressed with a preset dictionary), except the rows
    SQL reads as JSON (:data:`_JSON_ROWS`); reading unpacks it back to the JSON state
    its hash is documented over. See docs/reference/audit-format.md.
    """

    def to_stored_event(self, domain_event: Any) -> StoredEvent:
        """Encode one event.

        An event of audit format 2 is stored as its hash, then the body it was hashed
        over, byte for byte (``aggregates.audit``): a new event's body is the one its
        aggregate kept, so it is not encoded twice. Both are packed (the hash in 32
        bytes, the body compressed) but in the rows SQL reads as JSON.
        """
        # The id and version live in their own columns, and every optional field
        # defaults to None (a test checks this), so neither is repeated in the state.
        topic = topic_of(type(domain_event))
        if getattr(domain_event, "audit_format", None) == AUDIT_FORMAT:
            body = stored_body(domain_event) or event_body(domain_event)
            packed = None
            if topic not in _JSON_ROWS:
                # Compressed only where nothing else does it, and never under a cipher
                # (the length of a compressed body says something about its content).
                deflate = not (self.compressor or self.cipher)
                packed = pack_body(domain_event.chain_hash, body, deflate=deflate)
            state = stored_state(domain_event.chain_hash, body) if packed is None else packed
        else:
            state = domain_event.model_dump_json(exclude=_IN_COLUMNS, exclude_none=True).encode()
        if self.compressor:
            state = self.compressor.compress(state)
        if self.cipher:
            state = self.cipher.encrypt(state)
        return StoredEvent(
            originator_id=domain_event.originator_id,
            originator_version=domain_event.originator_version,
            topic=topic,
            state=state,
        )

    def plain_state(self, stored_event: StoredEvent) -> bytes:
        """A row's state decrypted, decompressed and unpacked: the bytes its audit hash covers.

        Raises:
            aggregates.audit.PackedStateError: the row is packed and its body is damaged.
        """
        state = stored_event.state
        if self.cipher:
            state = self.cipher.decrypt(state)
        if self.compressor:
            state = self.compressor.decompress(state)
        return unpack_state(state)

    def to_domain_event(self, stored_event: StoredEvent) -> Any:
        """Decode one event, validating it against its class.

        What ``decode_plain(stored_event, plain_state(stored_event))`` does, with a packed
        state's hash and body joined into the JSON pydantic reads once (not first into
        the plain state, then again).
        """
        state = stored_event.state
        if self.cipher:
            state = self.cipher.decrypt(state)
        if self.compressor:
            state = self.compressor.decompress(state)
        parts = unpack_parts(state)
        if parts is None:
            return self.decode_plain(stored_event, state)
        digest, body = parts
        return self._validate(stored_event, b',"chain_hash":"', digest, b'",', memoryview(body)[1:])

    def decode_plain(self, stored_event: StoredEvent, state: bytes) -> Any:
        """Decode one event from its :meth:`plain_state` (given), validating it."""
        body = state.strip()
        if len(body) < 64 and body[1:].strip() == b"}":  # an empty object
            return self._validate(stored_event, b"}")
        # One copy of the state (a snapshot's is hundreds of KB: each copy costs).
        return self._validate(stored_event, b",", memoryview(body)[1:])

    def _validate(self, stored_event: StoredEvent, *rest: bytes | memoryview) -> Any:
        """Validate the JSON object of the event's id and version, then ``rest`` (its members).

        The id and version go back at the front of the JSON object, so that pydantic
        parses and validates the whole record in one (Rust) pass. (The object is built
        by hand: json.dumps of a dict cost as much as the parse.)
        """
        version = stored_event.originator_version
        joined = b"".join(
            (
                b'{"originator_id":',
                # JSON with ASCII escapes: what pydantic reads back is the same string.
                _ascii_string(str(stored_event.originator_id)).encode(),
                b',"originator_version":',
                _VERSIONS[version] if 0 <= version < _SMALL else b"%d" % version,
                *rest,
            )
        )
        topic = stored_event.topic
        validate = _VALIDATORS.get(topic) or _validator_of(topic)
        return validate(joined, context=self.context)

    context: ClassVar[str | None] = None
    """The validation context events are decoded with (see ``_SnapshotMapper``)."""


class _SnapshotMapper(PydanticEventMapper):
    """The mapper of the snapshots an invocation is loaded from: its turns stay as stored.

    Each turn is validated when it is first read (``aggregates.invocation.Turns``);
    everything else is validated now. ``audit verify`` and resume's check read
    snapshots with the application's own mapper, which validates every turn.
    """

    context = LAZY_TURNS


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

    def construct_snapshot_store(self) -> SnapshotStore[str]:
        """The snapshots' store, read with :class:`_SnapshotMapper` (turns read when needed)."""
        store = super().construct_snapshot_store()
        mapper = self.mapper
        store.mapper = _SnapshotMapper(
            transcoder=mapper.transcoder, cipher=mapper.cipher, compressor=mapper.compressor
        )
        return store


_PASSWORD_IN_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/@:?#]*:)[^/@?#]*@")


def redacted_url(url: str) -> str:
    """The URL with its password (if any) replaced by ``***``: what messages show."""
    return _PASSWORD_IN_URL.sub(r"\1***@", url)


_POSTGRES_OPTIONS = frozenset(
    {"lock_timeout", "lock_retry", "mode", "connect_timeout", "pool_size"}
)
_SQLITE_OPTIONS = frozenset({"lock_timeout", "lock_retry", "mode"})

DEFAULT_CONNECT_TIMEOUT_S = 5
"""How long opening a PostgreSQL connection may take (``connect_timeout``)."""

DEFAULT_POOL_SIZE = 10
"""The most connections one PostgreSQL store opens (``pool_size``)."""


def _whole_seconds(query: dict[str, list[str]], name: str, shown: str) -> int | None:
    if name not in query:
        return None
    try:
        value = int(query[name][-1])
    except ValueError:
        raise StoreUrlError(f"{name} must be whole seconds in {shown!r}") from None
    if value < 1:
        raise StoreUrlError(f"{name} must be at least 1 second in {shown!r}")
    return value


@dataclass(frozen=True)
class StoreUrl:
    """A parsed database URL: a SQLite file, an in-memory database, or PostgreSQL.

    ``sqlite:///relative.db``, ``sqlite:////abs.db``, ``memory://``, or
    ``postgresql://user:password@host:port/dbname`` (also ``postgres://``).

    Options: ``lock_timeout`` (whole seconds, at least 1; SQLite files and
    PostgreSQL) is how long one write waits for the database's write lock
    (SQLite's busy timeout; PostgreSQL's ``lock_timeout`` on the events table's
    lock); ``lock_retry`` (seconds, fractions allowed, 0 for none) is how long the
    Journal goes on retrying a commit that failed on a lock, with backoff, before
    it answers that the commit failed.
    And ``mode=ro`` for a store that this
    process must only read (an auditor's evidence copy): read commands open it
    read-only, and every command that writes is refused.
    PostgreSQL only: ``connect_timeout`` (whole seconds, default 5) bounds
    opening a connection and waiting for one from the pool; ``pool_size`` (at
    least 1, default 10) is the most connections the store opens.

    The password is kept out of ``repr`` and of every message (see :attr:`display`).
    """

    url: str = field(repr=False)
    kind: str
    path: Path | None = None
    lock_timeout_s: int | None = None
    lock_retry_s: float = DEFAULT_LOCK_RETRY_S
    read_only: bool = False
    host: str | None = None
    port: int | None = None
    dbname: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    connect_timeout_s: int = DEFAULT_CONNECT_TIMEOUT_S
    pool_size: int = DEFAULT_POOL_SIZE

    @property
    def lock_wait_s(self) -> float:
        """How long one write waits for the lock: ``lock_timeout``, else eventsourcing's default."""
        return float(self.lock_timeout_s or SQLITE3_DEFAULT_LOCK_TIMEOUT)

    @property
    def display(self) -> str:
        """The URL as messages show it: without its password."""
        return redacted_url(self.url)

    @property
    def server(self) -> str:
        """``host:port/dbname`` of a PostgreSQL store (the URL for the others), for messages."""
        if self.kind != "postgresql":
            return self.display
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        return f"{host}:{self.port}/{self.dbname}"

    def scrub(self, text: str) -> str:
        """``text`` with this URL's password (and any URL's) replaced by ``***``."""
        text = redacted_url(text)
        if self.password:
            text = text.replace(self.password, "***")
        return text

    @classmethod
    def parse(cls, url: str) -> StoreUrl:
        """Parse and check a database URL (no I/O).

        Raises:
            StoreUrlError: when the URL is not one this runtime can open.
        """
        shown = redacted_url(url)
        parts = urlsplit(url)
        postgres = parts.scheme in ("postgresql", "postgres")
        query = parse_qs(parts.query, keep_blank_values=True)  # "lock_timeout=" is refused
        unknown = set(query) - (_POSTGRES_OPTIONS if postgres else _SQLITE_OPTIONS)
        if unknown:
            raise StoreUrlError(f"unknown database URL option(s) {sorted(unknown)} in {shown!r}")
        lock_retry = DEFAULT_LOCK_RETRY_S
        if "lock_retry" in query:
            try:
                lock_retry = float(query["lock_retry"][-1])
            except ValueError:
                raise StoreUrlError(
                    f"lock_retry must be a number of seconds in {shown!r}"
                ) from None
            if not math.isfinite(lock_retry) or lock_retry < 0:
                raise StoreUrlError(f"lock_retry must be 0 or more seconds in {shown!r}")
        lock_timeout = _whole_seconds(query, "lock_timeout", shown)
        read_only = False
        if "mode" in query:
            if query["mode"] != ["ro"]:
                raise StoreUrlError(f"the only database URL mode is mode=ro, in {shown!r}")
            read_only = True
        # urlsplit reads "sqlite:/x.db" and "sqlite:x.db" as paths too: refuse what
        # is not spelled with the two slashes, rather than guess which file was meant.
        spelled_with_slashes = url[len(parts.scheme) + 1 :].startswith("//")
        if postgres:
            return cls._parse_postgres(
                url,
                shown,
                query,
                spelled_with_slashes=spelled_with_slashes,
                lock_timeout=lock_timeout,
                lock_retry=lock_retry,
                read_only=read_only,
            )
        if parts.scheme == "memory":
            if not spelled_with_slashes or parts.netloc or parts.path:
                raise StoreUrlError(f"an in-memory database is memory://, got {shown!r}")
            if read_only:
                raise StoreUrlError(f"an in-memory store cannot be read-only, in {shown!r}")
            return cls(url=url, kind="memory", lock_retry_s=lock_retry)
        if parts.scheme == "sqlite":
            if parts.netloc or not spelled_with_slashes:
                raise StoreUrlError(
                    f"a SQLite URL has three slashes, sqlite:///relative.db or "
                    f"sqlite:////absolute.db, got {shown!r}"
                )
            raw_path = parts.path[1:] if parts.path.startswith("/") else parts.path
            if not raw_path or raw_path.endswith("/"):
                raise StoreUrlError(f"no database file in {shown!r}")
            return cls(
                url=url,
                kind="sqlite",
                path=Path(raw_path),
                lock_timeout_s=lock_timeout,
                lock_retry_s=lock_retry,
                read_only=read_only,
            )
        raise StoreUrlError(
            f"unsupported database URL {shown!r}: use sqlite:///path/to/file.db, memory:// "
            "or postgresql://user:password@host:port/dbname"
        )

    @classmethod
    def _parse_postgres(
        cls,
        url: str,
        shown: str,
        query: dict[str, list[str]],
        *,
        spelled_with_slashes: bool,
        lock_timeout: int | None,
        lock_retry: float,
        read_only: bool,
    ) -> StoreUrl:
        form = "postgresql://user:password@host:port/dbname"
        parts = urlsplit(url)
        if not spelled_with_slashes or not parts.netloc:
            raise StoreUrlError(f"a PostgreSQL URL is {form}, got {shown!r}")
        if parts.fragment:
            raise StoreUrlError(f"a PostgreSQL URL has no #fragment, in {shown!r}")
        try:
            port = parts.port if parts.port is not None else 5432
        except ValueError:
            raise StoreUrlError(f"the port must be a number from 1 to 65535 in {shown!r}") from None
        if port == 0:
            raise StoreUrlError(f"the port must be a number from 1 to 65535 in {shown!r}")
        host = parts.hostname
        if not host:
            raise StoreUrlError(f"no host in {shown!r} (a PostgreSQL URL is {form})")
        user = unquote(parts.username) if parts.username else ""
        if not user:
            raise StoreUrlError(f"no user in {shown!r} (a PostgreSQL URL is {form})")
        dbname = unquote(parts.path[1:]) if parts.path.startswith("/") else ""
        if not dbname or "/" in dbname:
            raise StoreUrlError(f"no database name in {shown!r} (a PostgreSQL URL is {form})")
        password = unquote(parts.password) if parts.password is not None else None
        pool_size = DEFAULT_POOL_SIZE
        if "pool_size" in query:
            try:
                pool_size = int(query["pool_size"][-1])
            except ValueError:
                raise StoreUrlError(f"pool_size must be a whole number in {shown!r}") from None
            if pool_size < 1:
                raise StoreUrlError(f"pool_size must be at least 1 in {shown!r}")
        connect_timeout = _whole_seconds(query, "connect_timeout", shown)
        return cls(
            url=url,
            kind="postgresql",
            lock_timeout_s=lock_timeout,
            lock_retry_s=lock_retry,
            read_only=read_only,
            host=host,
            port=port,
            dbname=dbname,
            user=user,
            password=password,
            connect_timeout_s=connect_timeout or DEFAULT_CONNECT_TIMEOUT_S,
            pool_size=pool_size,
        )

    def environment(self) -> dict[str, str]:
        """The eventsourcing environment for this URL: SQLite or PostgreSQL, with the lean recorder.

        For ``memory://``, each call names a new in-memory database, shared by
        the connections of one store and by no other store; it lasts until the
        store's last connection closes.
        """
        if self.kind == "postgresql":
            return self._postgres_environment(read_only=False)
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

    def _postgres_environment(self, *, read_only: bool) -> dict[str, str]:
        """The PostgreSQL settings of eventsourcing, under the application's own prefix too.

        The prefixed keys (``LOOPACTORS_POSTGRES_...``) are the ones eventsourcing
        reads first, so a variable of that name in the process's environment cannot
        point the store somewhere else or turn on ``POSTGRES_ENABLE_DB_FUNCTIONS``.
        """
        assert self.host is not None
        assert self.dbname is not None
        assert self.user is not None
        password = self.password
        if password is None:
            password = os.environ.get("PGPASSWORD", "")  # libpq's own variable
        settings = {
            "PERSISTENCE_MODULE": POSTGRES_FACTORY_TOPIC,
            "POSTGRES_HOST": self.host,
            "POSTGRES_PORT": str(self.port),
            "POSTGRES_DBNAME": self.dbname,
            "POSTGRES_USER": self.user,
            "POSTGRES_PASSWORD": password,
            "POSTGRES_CONNECT_TIMEOUT": str(self.connect_timeout_s),
            "POSTGRES_LOCK_TIMEOUT": str(self.lock_timeout_s or int(self.lock_wait_s)),
            "POSTGRES_POOL_SIZE": str(min(2, self.pool_size)),
            "POSTGRES_MAX_OVERFLOW": str(max(0, self.pool_size - 2)),
            "POSTGRES_ENABLE_DB_FUNCTIONS": "n",
            "POSTGRES_SCHEMA": "public",
            "CREATE_TABLE": "n" if read_only else "y",
            "POSTGRES_READ_ONLY": "y" if read_only else "n",
        }
        prefix = InvocationApplication.name.upper() + "_"
        return {**settings, **{prefix + key: value for key, value in settings.items()}}

    def read_only_environment(self, db_uri: str = "") -> dict[str, str]:
        """The environment that reads the database and creates no table (SQLite: at ``db_uri``).

        On PostgreSQL every transaction of the store's connections is read-only
        (``default_transaction_read_only``).
        """
        if self.kind == "postgresql":
            return self._postgres_environment(read_only=True)
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


def _notification(
    row_id: int, originator_id: UUID | str, originator_version: int, topic: str, state: bytes
) -> Notification:
    """``Notification(id=row_id, ...)`` without the frozen dataclass's ``__init__``.

    The same fields in the same order in its ``__dict__`` (so equal, and alike in every
    way), set at once instead of by five ``object.__setattr__`` calls.
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
    """Whether :func:`_notification` makes what ``Notification(...)`` makes (it has for 9.5).

    A ``Notification`` whose class holds its fields in slots, or runs code when made,
    could not be made so: eventsourcing's own reads are used then.
    """
    built = Notification(originator_id="x", originator_version=1, topic="t", state=b"s", id=2)
    if hasattr(Notification, "__post_init__") or not hasattr(built, "__dict__"):
        return False
    made = _notification(2, "x", 1, "t", b"s")
    return made == built and list(vars(made).items()) == list(vars(built).items())


_FAST_NOTIFICATIONS = _fields_set_at_once()


class LeanSQLiteRecorder(SQLiteApplicationRecorder):
    """eventsourcing's SQLite application recorder with a lean insert: every store's write path.

    Both kinds of store are SQLite databases (``memory://`` is an in-memory one),
    and this is their recorder, so there is one write path, the one production
    uses. It is the only place this runtime goes around eventsourcing: the reads
    ``select_events`` and ``max_notification_id`` are eventsourcing's own, inherited
    unchanged; ``select_notifications`` runs eventsourcing's statement and makes the same
    notifications more cheaply; ``insert_events`` is replaced. The
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
        if is_read_only_uri(pool.db_name):
            # A read-only open reads the file as it is, whatever its journal mode.
            keep_journal_mode(pool)
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

    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        """The notifications eventsourcing's ``select_notifications`` reads, by its statement.

        Read as plain tuples, each notification made with its fields at once
        (:func:`_notification`): eventsourcing reads each row as a ``sqlite3.Row`` by
        column name and builds each frozen dataclass through its ``__init__``, about
        0.65 us a row (a read model's catch-up reads every row).
        """
        if not _FAST_NOTIFICATIONS:  # pragma: no cover - an eventsourcing that changed them
            return super().select_notifications(
                start, limit, stop, topics, inclusive_of_start=inclusive_of_start
            )
        params: list[int | str] = []
        clauses: list[str] = []
        if start is not None:
            params.append(start)
            clauses.append("rowid>=? " if inclusive_of_start else "rowid>? ")
        if stop is not None:
            params.append(stop)
            clauses.append("rowid<=? ")
        if topics:
            params += list(topics)
            clauses.append(f"topic IN ({','.join('?' * len(topics))}) ")
        params.append(limit)
        where = "WHERE " + "AND ".join(clauses) if clauses else ""
        table = self.events_table_name  # eventsourcing's name, never user text
        statement = f"SELECT rowid, * FROM {table} {where}ORDER BY rowid LIMIT ?"  # noqa: S608
        uuids = self.datastore.originator_id_type == "uuid"
        with self.datastore.transaction(commit=False) as cursor:
            cursor.sqlite_cursor.row_factory = None  # this cursor's rows: tuples
            cursor.execute(statement, params)
            rows = cursor.fetchall()
        if uuids:
            return [_notification(i, UUID(o), v, t, state) for i, o, v, t, state in rows]
        return [_notification(i, o, v, t, state) for i, o, v, t, state in rows]

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

    EFFECT_INDEX = "loop_actors_effects_by_invocation"
    """The index of ``EffectPrepared`` rows by the invocation they belong to."""

    _INVOCATION_OF_ROW = (
        "(CASE WHEN json_valid(CAST(state AS TEXT)) "
        "THEN json_extract(CAST(state AS TEXT), '$.invocation_id') END)"
    )
    """The invocation id inside a row's JSON state (NULL for a state that is not JSON)."""

    def create_effect_index(self, topic: str) -> None:
        """Index the rows of ``topic`` (``EffectPrepared``) by their invocation, if not yet.

        A partial index on an expression: SQLite keeps it in the insert's own
        statement (for the rows of that topic only), and builds it once over an
        existing store. The topic is written into the statement (a partial index is
        used only by a query that names the same literal).

        Raises:
            eventsourcing.persistence.OperationalError: the database is locked or broken.
        """
        if "'" in topic:  # pragma: no cover - an eventsourcing topic never has one
            raise ValueError(f"unexpected topic {topic!r}")
        statement = (
            f"CREATE INDEX IF NOT EXISTS {self.EFFECT_INDEX} ON {self.events_table_name} "
            f"({self._INVOCATION_OF_ROW}) WHERE topic = '{topic}'"
        )
        try:
            with self._writer_slot():
                self._connection.execute(statement)
        except sqlite3.OperationalError as error:
            raise OperationalError(error) from error

    def effect_keys_of(self, invocation_id: str, topic: str) -> list[str] | None:
        """The ids of the ``topic`` rows that name ``invocation_id``, oldest first, by the index.

        None when the store has no such index (a read-only store made before it):
        the caller reads the rows instead.

        Raises:
            eventsourcing.persistence.OperationalError: the database is locked or broken.
        """
        keys_of = self.effect_keys_of_many([invocation_id], topic)
        return None if keys_of is None else keys_of[invocation_id]

    def effect_keys_of_many(
        self, invocation_ids: Sequence[str], topic: str
    ) -> dict[str, list[str]] | None:
        """:meth:`effect_keys_of` for each of these invocations, in one read transaction."""
        found: dict[str, list[str]] = {i: [] for i in invocation_ids}
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?",
                (self.EFFECT_INDEX,),
            )
            if cursor.fetchone() is None:
                return None
            for start in range(0, len(invocation_ids), ROWS_OF_CHUNK):
                chunk = invocation_ids[start : start + ROWS_OF_CHUNK]
                cursor.execute(
                    f"SELECT {self._INVOCATION_OF_ROW}, originator_id "  # noqa: S608 (eventsourcing's table, a constant topic)
                    f"FROM {self.events_table_name} WHERE topic = '{topic}' AND "
                    f"{self._INVOCATION_OF_ROW} IN ({','.join('?' * len(chunk))}) ORDER BY rowid",
                    tuple(chunk),
                )
                for invocation_id, key in cursor.fetchall():
                    found[str(invocation_id)].append(str(key))
        return found

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

    def has_table(self, name: str) -> bool:
        """Whether the database has a table of that name."""
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
            return cursor.fetchone() is not None

    def aggregate_ids_in_first_row_order(self) -> list[str]:
        """The id of every aggregate with a stored row, in the order of its first row."""
        statement = (
            f"SELECT originator_id FROM {self.events_table_name} "  # noqa: S608 (eventsourcing's table)
            "GROUP BY originator_id ORDER BY MIN(rowid)"
        )
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute(statement)
            return [str(row[0]) for row in cursor.fetchall()]

    def count_rows(self, table: str) -> int:
        """How many rows a table of the store holds."""
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute(f"SELECT COUNT(*) FROM {table}")  # noqa: S608 (eventsourcing's tables)
            return int(cursor.fetchone()[0])

    def select_rows(
        self, table: str, originator_id: str | None
    ) -> list[tuple[str, int, str, bytes]]:
        """(id, version, topic, state) of a snapshots table's rows (one aggregate's, or all)."""
        where = "" if originator_id is None else "WHERE originator_id = ? "
        statement = (
            f"SELECT originator_id, originator_version, topic, state FROM {table} {where}"  # noqa: S608
            "ORDER BY originator_id, originator_version"
        )
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute(statement, () if originator_id is None else (originator_id,))
            rows = cursor.fetchall()
        return [(str(a), int(b), str(c), bytes(d)) for a, b, c, d in rows]

    def select_rows_of(
        self, table: str, originator_ids: Sequence[str]
    ) -> list[tuple[str, int, str, bytes]]:
        """(id, version, topic, state) of the rows of these aggregates, in one read transaction.

        By id, then version; a few hundred ids a statement.
        """
        found: list[tuple[str, int, str, bytes]] = []
        with self.datastore.transaction(commit=False) as cursor:
            for start in range(0, len(originator_ids), ROWS_OF_CHUNK):
                chunk = originator_ids[start : start + ROWS_OF_CHUNK]
                cursor.execute(
                    f"SELECT originator_id, originator_version, topic, state FROM {table} "  # noqa: S608 (eventsourcing's tables)
                    f"WHERE originator_id IN ({','.join('?' * len(chunk))}) "
                    "ORDER BY originator_id, originator_version",
                    tuple(chunk),
                )
                found += [(str(a), int(b), str(c), bytes(d)) for a, b, c, d in cursor.fetchall()]
        return found

    def insert_copied_rows(self, rows: Sequence[tuple[int, str, int, str, bytes]]) -> None:
        """Write rows copied from another store, keeping their notification ids (one transaction).

        Rows are (notification id, originator id, version, topic, state as stored).

        Raises:
            eventsourcing.persistence.IntegrityError: a position or an id is taken.
            eventsourcing.persistence.OperationalError: the database is locked or broken.
        """
        statement = (
            f"INSERT INTO {self.events_table_name} "  # noqa: S608 (eventsourcing's table)
            "(rowid, originator_id, originator_version, topic, state) VALUES (?, ?, ?, ?, ?)"
        )
        with self._writer_slot():
            try:
                self._cursor.execute("BEGIN IMMEDIATE")
                try:
                    self._cursor.executemany(statement, rows)
                    self._cursor.execute("COMMIT")
                except BaseException:
                    if self._connection.in_transaction:
                        self._connection.rollback()
                    raise
            except sqlite3.IntegrityError as error:
                raise IntegrityError(error) from error
            except sqlite3.OperationalError as error:
                raise OperationalError(error) from error

    def select_sealed_rows(self) -> list[tuple[str, int, str, str, bytes]]:
        """Every row of the sealed secrets' table, as stored (none when it has no such table)."""
        if not self.has_table("loop_actors_secrets"):
            return []
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute(
                "SELECT invocation_id, step, call_id, kind, sealed FROM loop_actors_secrets "
                "ORDER BY invocation_id, step, call_id, kind"
            )
            rows = cursor.fetchall()
        return [(str(a), int(b), str(c), str(d), bytes(e)) for a, b, c, d, e in rows]

    def replace_identity(self, store_id: str) -> None:
        """Give the store another's identity (a copy of that store takes it over)."""
        with self._writer_slot():
            try:
                self._connection.execute("UPDATE loop_actors_store SET store_id = ?", (store_id,))
            except sqlite3.OperationalError as error:
                raise OperationalError(error) from error

    def close(self) -> None:
        """Close the insert's connection (the pool's close with eventsourcing's factory)."""
        self._connection.close()


class StoreRecorder(Protocol):
    """What the store needs of its recorder: ``LeanSQLiteRecorder`` or ``LeanPostgresRecorder``."""

    events_table_name: str

    def insert_events(
        self, stored_events: Sequence[StoredEvent], *, lock_wait_s: float | None = None
    ) -> Sequence[int] | None:
        """Insert rows in one transaction; return their notification ids."""

    def select_events(self, originator_id: str) -> Sequence[StoredEvent]:
        """An aggregate's rows, in version order."""

    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        """Rows in notification order."""

    def max_notification_id(self) -> int | None:
        """The last notification id."""

    def store_identity(self, *, create: bool) -> str | None:
        """The store's identity (created first with ``create``)."""

    def first_position_of(self, originator_id: str) -> int | None:
        """The notification id of an aggregate's first row."""

    def has_events_table(self) -> bool:
        """Whether the events table exists."""

    def has_table(self, name: str) -> bool:
        """Whether a table exists."""

    def aggregate_ids_in_first_row_order(self) -> list[str]:
        """Every aggregate id, in the order of its first row."""

    def count_rows(self, table: str) -> int:
        """How many rows a table holds."""

    def select_rows(
        self, table: str, originator_id: str | None
    ) -> list[tuple[str, int, str, bytes]]:
        """A snapshots table's rows."""

    def select_rows_of(
        self, table: str, originator_ids: Sequence[str]
    ) -> list[tuple[str, int, str, bytes]]:
        """The rows of these aggregates in a table (events or snapshots), by id and version."""

    def insert_copied_rows(self, rows: Sequence[tuple[int, str, int, str, bytes]]) -> None:
        """Write rows copied from another store, keeping their notification ids."""

    def replace_identity(self, store_id: str) -> None:
        """Take another store's identity."""

    def select_sealed_rows(self) -> list[tuple[str, int, str, str, bytes]]:
        """Every row of the sealed secrets' table, as stored."""

    def close(self) -> None:
        """Close what the recorder opened itself."""


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
        try:
            if (self.read_only or not create) and not recorder.has_events_table():
                where = self.url.path if self.url.kind == "sqlite" else self.url.server
                raise StoreUnavailableError(
                    f"{where} is not a loop-actors store: it has no events table"
                )
            self.store_id = recorder.store_identity(create=not self.read_only)
            if not self.read_only and hasattr(recorder, "create_effect_index"):
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
        except Exception as error:
            plain = _reads_as_json_object(first[0].state)
            if mapper.cipher is not None:
                raise StoreCipherError(
                    f"cannot decrypt the events of {self.url.display} with this CIPHER_KEY "
                    f"({type(error).__name__}: {error}): set the key the store was written "
                    + ("with" if not plain else "with, or unset CIPHER_TOPIC: it is not encrypted")
                ) from error
            if not plain and mapper.compressor is None:
                raise StoreCipherError(
                    f"the events of {self.url.display} are encrypted (or compressed): set "
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
            raise StoreReadOnlyError(
                f"{self.url.display} is open read-only: nothing can be appended"
            )
        # Application.save would do the same after per-object runtime Protocol
        # checks, which cost more than the mapping itself.
        to_stored = self.app.mapper.to_stored_event
        ids = self._recorder.insert_events(
            [to_stored(event) for event in events], lock_wait_s=lock_wait_s
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
                log.warning(
                    "no snapshot of %s at version %d (the events are committed; retried at "
                    "the next interval): %s",
                    invocation_id,
                    version,
                    error,
                )

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

        Looks them up in the index of ``EffectPrepared`` rows by invocation, so the
        time does not grow with the store. A store whose states are not plain JSON
        (encrypted or compressed), or one opened read-only that has no index, reads the
        ``EffectPrepared`` notifications from the invocation's first stored row on
        instead (an effect is always prepared after its invocation started).
        """
        return self.effects_of_many([invocation_id])[invocation_id]

    def effects_of_many(self, invocation_ids: Sequence[str]) -> dict[str, list[Effect]]:
        """What :meth:`effects_of` gives for each of these invocations (by the index at once)."""
        mapper = self.app.mapper
        by_index = getattr(self._recorder, "effect_keys_of_many", None)
        if by_index is not None and mapper.cipher is None and mapper.compressor is None:
            keys_of = by_index(invocation_ids, topic_of(EffectPrepared))
            if keys_of is not None:
                found: dict[str, list[Effect]] = {}
                for invocation_id, keys in keys_of.items():
                    effects = [self.get_effect(key) for key in keys]
                    found[invocation_id] = [effect for effect in effects if effect is not None]
                return found
        return {i: self.effects_of_by_scan(i) for i in invocation_ids}

    def effects_of_by_scan(self, invocation_id: str) -> list[Effect]:
        """:meth:`effects_of` without the index: every ``EffectPrepared`` since it started."""
        start = self._recorder.first_position_of(invocation_id)
        if start is None:
            return []
        found: list[Effect] = []
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
                topics=[topic_of(created_type)],
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
        self, aggregate_id: str, *, forms: dict[int, StoredForm] | None = None
    ) -> list[tuple[int, DomainEvent | Exception]]:
        """An aggregate's stored events as (position, event), undecodable rows as exceptions.

        For the audit: nothing is validated beyond decoding, and no row is skipped.
        A row whose topic names no loop-actors event class is not decoded (decoding
        would import the module it names): it is reported as unreadable. With
        ``forms``, each decoded row's topic and plaintext state are put there by position.
        """
        entries: list[tuple[int, DomainEvent | Exception]] = []
        for record in self._recorder.select_events(aggregate_id):
            event, plain = self._decode_audited(record)
            entries.append((record.originator_version, event))
            if forms is not None and plain is not None:
                forms[record.originator_version] = StoredForm(record.topic, plain)
        return entries

    def _decode_audited(self, record: StoredEvent) -> tuple[Any, bytes | None]:
        """The event (or the exception decoding raised) and its plaintext state, if decoded.

        The row is decrypted, decompressed and unpacked once for both.
        """
        if record.topic not in _event_topics():
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
        return name if self._recorder.has_table(name) else None

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
