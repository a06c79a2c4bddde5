"""Where a store's read models live, and opening them (blocking; no trio).

Following the store live, from trio, is ``loop_actors.store.views``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from uuid import uuid4

from loop_actors._errors import StoreReadOnlyError, StoreUnavailableError
from loop_actors._faults import CrashPoint, fault_point
from loop_actors.store.store import EventStore
from loop_actors.store.url import sqlite_write_refusal
from projections import ForeignReadModelsError, Projection, ProjectionRunner, default_projections
from projections.runner import DEFAULT_BATCH_SIZE
from projections.sql import is_postgres_url, postgres_location

_NO_VALUES: dict[object, None] = {}
"""Empty, always: its ``get`` gives None for anything (a C call, no Python frame)."""


def _bind_none_directly() -> None:
    """Have sqlite3 bind None as NULL through an adapter: the same NULL, without a failed lookup.

    sqlite3 binds an exact ``int``, ``float`` or ``str`` as it is, but looks every other
    parameter up for an adapter, None included: in its registry, then as
    ``PrepareProtocol.__adapt__``, an attribute lookup on a type that fails with a
    formatted ``AttributeError`` each time (about 0.15 us a None; a catch-up binds about
    four an event). With an adapter registered for None the first lookup finds it, and
    the adapter gives None back, which sqlite3 binds as NULL as before. Registered
    once per process (when the runtime is imported), unless the process registered one for
    None itself. (Here, not in ``projections``: that package does not import ``sqlite3``.)
    """
    key = (type(None), sqlite3.PrepareProtocol)
    if key not in getattr(sqlite3, "adapters", {key: None}):
        sqlite3.register_adapter(type(None), _NO_VALUES.get)


_bind_none_directly()


def views_location(store: EventStore, explicit: str | None = None) -> str:
    """The read models' database for a store.

    By default, for a SQLite store, a file next to the event store (``x.db`` →
    ``x.views.db``), so that building read models never holds the event store's
    write lock; for ``memory://``, an in-memory database private to this process;
    for a PostgreSQL store, the store's own database (its URL), where the read
    models' tables and tracking rows sit beside the events. ``explicit`` (``--views``)
    is a SQLite file, or a ``postgresql://`` URL.
    """
    if explicit:
        return explicit
    if store.url.kind == "memory":
        return _in_memory()
    if store.url.kind == "postgresql":
        return store.url.url
    assert store.url.path is not None
    path = store.url.path
    return str(path.with_name(f"{path.stem}.views{path.suffix or '.db'}"))


def _shown(location: str) -> str:
    """A read models' location for a message: a PostgreSQL URL without its password."""
    return postgres_location(location) if is_postgres_url(location) else location


def _in_memory() -> str:
    return f"file:loop-actors-views-{uuid4().hex}?mode=memory&cache=shared"


def open_runner(
    store: EventStore,
    views: str | None = None,
    projections: Sequence[Projection] | None = None,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> ProjectionRunner:
    """A projection runner for the store's read models (blocking: opens a database).

    The read models record the store's identity: read models of another store
    (the store was deleted and created again) are emptied and rebuilt.

    Raises:
        StoreUnavailableError: the read models' database cannot be opened, or
            belongs to another store and cannot be rebuilt.
    """
    location = views_location(store, views)
    if not location.startswith("file:") and not is_postgres_url(location):
        folder = Path(location).parent
        if not folder.is_dir():
            raise StoreUnavailableError(f"cannot open read models at {location}: no such folder")
    try:
        return ProjectionRunner(
            store.app,
            location,
            projections if projections is not None else default_projections(),
            batch_size=batch_size,
            after_batch=lambda name, position: fault_point(CrashPoint.PROJECTION_BATCH_APPLIED),
            store_id=store.store_id,
        )
    except ForeignReadModelsError as error:
        raise StoreUnavailableError(str(error)) from error
    except Exception as error:
        shown = postgres_location(location) if is_postgres_url(location) else location
        raise StoreUnavailableError(f"cannot open read models at {shown}: {error}") from error


def read_models_refusal(store: EventStore, views: str | None = None) -> str | None:
    """Why the store's read models cannot be kept where they live; None when they can.

    They cannot when the read models' file (or its folder) cannot be written;
    when the store itself is read-only and no ``views`` were chosen (an
    evidence copy gets nothing written next to it); and when a store opened
    read-only has no identity to check them against (it predates identities).
    """
    if store.url.kind == "memory":
        return None
    location = views_location(store, views)
    if store.store_id is None:
        return (
            f"{store.url.path or 'the store'} has no store identity (it was created by an "
            "older version and is opened read-only), so the read models in "
            f"{_shown(location)} cannot be checked against it"
        )
    if views is None and store.write_refusal is not None:
        return f"the store cannot be written ({store.write_refusal})"
    if location.startswith("file:") or is_postgres_url(location):
        return None  # PostgreSQL says itself, when the read models are opened
    refusal = sqlite_write_refusal(Path(location))
    return None if refusal is None else f"the read models cannot be written ({refusal})"


def open_read_runner(
    store: EventStore,
    views: str | None,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    note: Callable[[str], None],
) -> ProjectionRunner:
    """Read models for a command that only reads: where they live, else in memory.

    When they cannot be kept where they live (``read_models_refusal``), they are
    built in memory for this one command, and ``note`` is told why.

    Raises:
        StoreUnavailableError: the read models' database cannot be opened.
    """
    refusal = read_models_refusal(store, views)
    if refusal is None:
        return open_runner(store, views, batch_size=batch_size)
    note(f"{refusal}: building the read models in memory for this command")
    return open_runner(store, _in_memory(), batch_size=batch_size)


def open_writable_runner(
    store: EventStore, views: str | None, *, batch_size: int = DEFAULT_BATCH_SIZE
) -> ProjectionRunner:
    """Read models for a command that is about them (``projections``): where they live.

    Raises:
        StoreReadOnlyError: they cannot be kept there (``read_models_refusal``).
        StoreUnavailableError: the read models' database cannot be opened.
    """
    refusal = read_models_refusal(store, views)
    if refusal is not None:
        raise StoreReadOnlyError(
            f"{refusal}: `loop-actors projections` works on the read models kept in "
            f"{_shown(views_location(store, views))}; show, list, metrics and effects build them "
            "in memory instead (or give --views FILE in a folder that can be written)"
        )
    return open_runner(store, views, batch_size=batch_size)


__all__ = [
    "open_read_runner",
    "open_runner",
    "open_writable_runner",
    "read_models_refusal",
    "views_location",
]
