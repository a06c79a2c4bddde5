"""A store's URL: what it names (a SQLite file, memory, a PostgreSQL server), checked once.

``StoreUrl.parse`` turns ``sqlite:///path``, ``memory://`` or ``postgresql://...`` into
the typed options the store opens with, and the eventsourcing environment that
opens it; messages show a URL through :func:`redacted_url` (never its password).
"""

from __future__ import annotations

import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit
from uuid import uuid4

from eventsourcing.sqlite import SQLITE3_DEFAULT_LOCK_TIMEOUT
from eventsourcing.utils import get_topic

from loop_actors._errors import StoreUrlError
from loop_actors.store.sqlite_recorder import LeanSQLiteRecorder

DEFAULT_DB_URL = "sqlite:///loop-actors.db"
"""The embedded default: a SQLite file in the current directory."""

DB_URL_ENV = "LOOP_ACTORS_DB"

APPLICATION_NAME = "LoopActors"
"""The eventsourcing application's name (``InvocationApplication.name``): its settings in the
environment may carry it as a prefix."""

DEFAULT_LOCK_RETRY_S = 2.0
"""How long the Journal retries a commit that failed on a locked database (``lock_retry``)."""

POSTGRES_FACTORY_TOPIC = "loop_actors.store.postgres:PostgresStoreFactory"
"""eventsourcing's factory for a PostgreSQL store (resolved by eventsourcing when one opens:
psycopg is imported only then)."""


def resolve_db_url(explicit: str | None) -> str:
    """The database URL: the explicit one, else ``$LOOP_ACTORS_DB``, else the default file."""
    return explicit or os.environ.get(DB_URL_ENV) or DEFAULT_DB_URL


# scheme://user:password@: the password runs to the last "@" before the host, as
# urllib reads it (a password may hold an unquoted "@" or ":").
_PASSWORD_IN_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/@:?#\s]*:)[^/?#\s]*@")


def redacted_url(text: str) -> str:
    """The URL (or every URL in a text) with its password replaced by ``***``: what messages show.

    ``postgresql://app:secret@db/agents`` is shown ``postgresql://app:***@db/agents``.
    """
    return _PASSWORD_IN_URL.sub(r"\1***@", text)


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
        prefix = APPLICATION_NAME.upper() + "_"
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
