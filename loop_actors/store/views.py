"""Where the read models live, and following the store live from trio."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from uuid import uuid4

import trio

from aggregates.decisions import Frozen
from loop_actors._errors import StoreReadOnlyError, StoreUnavailableError
from loop_actors._faults import CrashPoint, fault_point
from loop_actors.store.store import EventStore
from loop_actors.store.url import sqlite_write_refusal
from projections import ForeignReadModelsError, Projection, ProjectionRunner, default_projections
from projections.runner import DEFAULT_BATCH_SIZE, CatchUpReport
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


FOLLOW_POLL_S = 1.0
"""A follower also catches up this often, for commits made by other processes."""


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


FOLLOW_RETRY_FIRST_S = 1.0
"""After a failed catch-up the follower waits this long before it tries again..."""

FOLLOW_RETRY_MAX_S = 60.0
"""...twice as long after each further failure, at most this long."""

FOLLOW_LOG_EVERY_S = 300.0
"""While the read models stay stale, a failure is logged again at most this often."""

log = logging.getLogger(__name__)


def follow_retry_s(failures: int, *, first_s: float, max_s: float) -> float:
    """How long the follower waits after ``failures`` catch-ups failed in a row (at least 1).

    ``first_s``, then doubled for each further failure, never more than ``max_s``.
    """
    if failures < 1:
        raise ValueError("a retry follows at least one failure")
    return float(min(max_s, first_s * 2.0 ** min(failures - 1, 62)))


class ReadModelsStatus(Frozen):
    """Where a runtime's followed read models stand (``Runtime.read_models_status()``)."""

    stale: bool
    """True while the last catch-up failed: the read models are not kept up to date."""
    position: int
    """The last event every read model has applied, at the last catch-up that succeeded."""
    failures: int
    """Catch-ups failed in a row since the last one that succeeded (0 while not stale)."""
    last_error: str | None
    """While stale, the last failure (its type and message); None otherwise."""
    retry_in_s: float | None
    """While stale, the wait before the next try, as last chosen; None otherwise."""
    skipped: int = 0
    """Stored rows the read models went past in this runtime's catch-ups: they cannot be
    decoded (``loop-actors projections status`` lists every one). Not stale for that."""


class FollowerHealth:
    """What the projection follower last saw, kept for whoever asks (the runtime).

    The follower writes it and the runtime reads it, both in the one trio thread.
    """

    def __init__(self, *, first_retry_s: float, max_retry_s: float) -> None:
        """A follower that has not caught up yet: not stale, at position 0."""
        self.first_retry_s = first_retry_s
        self.max_retry_s = max_retry_s
        self.status = ReadModelsStatus(
            stale=False, position=0, failures=0, last_error=None, retry_in_s=None
        )
        """The last status (replaced, never changed in place)."""
        self._logged_at: float | None = None

    def caught_up(self, reports: Sequence[CatchUpReport]) -> None:
        """A catch-up succeeded: not stale, at the position every read model reached.

        Rows it went past (they cannot be decoded; the runner logged each) are counted.
        """
        failures = self.status.failures
        position = min((r.position for r in reports), default=self.status.position)
        skipped = self.status.skipped + max((r.skipped for r in reports), default=0)
        self.status = ReadModelsStatus(
            stale=False,
            position=position,
            failures=0,
            last_error=None,
            retry_in_s=None,
            skipped=skipped,
        )
        if failures:
            self._logged_at = None
            log.info(
                "read models caught up again after %d failed catch-ups, at position %d",
                failures,
                position,
                extra={"failures": failures, "position": position},
            )

    def failed(self, error: Exception, now: float) -> float:
        """A catch-up failed at trio time ``now``: stale; log it (rate-limited).

        Returns:
            How long to wait before the next try.
        """
        failures = self.status.failures + 1
        retry_s = follow_retry_s(failures, first_s=self.first_retry_s, max_s=self.max_retry_s)
        self.status = ReadModelsStatus(
            stale=True,
            position=self.status.position,
            failures=failures,
            last_error=f"{type(error).__name__}: {error}",
            retry_in_s=retry_s,
            skipped=self.status.skipped,
        )
        fields = {"failures": failures, "position": self.status.position, "retry_in_s": retry_s}
        if self._logged_at is None:
            self._logged_at = now
            log.error(
                "read models could not catch up; runs go on, the read models stay at "
                "position %d (stale) and are tried again in %.3g s",
                self.status.position,
                retry_s,
                exc_info=error,
                extra=fields,
            )
        elif now - self._logged_at >= FOLLOW_LOG_EVERY_S:
            self._logged_at = now
            log.error(
                "read models still stale after %d failed catch-ups (%s); tried again in %.3g s",
                failures,
                self.status.last_error,
                retry_s,
                extra=fields,
            )
        return retry_s


async def _catch_up(runner: ProjectionRunner, health: FollowerHealth) -> float | None:
    """One catch-up in a worker thread; its failure goes to ``health``, never up.

    Returns:
        None when it succeeded, else how long to wait before the next try.
    """
    try:
        reports = await trio.to_thread.run_sync(runner.catch_up)
    except Exception as error:  # a read model's failure must never end a run: kept, logged
        return health.failed(error, trio.current_time())
    health.caught_up(reports)
    return None


async def _wait_for_commits(
    wake: trio.MemoryReceiveChannel[None], seconds: float, *, until_woken: bool
) -> tuple[bool, bool]:
    """Wait ``seconds`` (or, with ``until_woken``, until a wake-up); wake-ups coalesce.

    Returns:
        Whether a wake-up came, and whether the channel is still open.
    """
    woken = False
    with trio.move_on_after(seconds):
        while True:
            try:
                await wake.receive()
            except trio.EndOfChannel:
                return woken, False
            woken = True
            if until_woken:
                break
    while True:  # coalesce the wake-ups that piled up
        try:
            wake.receive_nowait()
        except trio.WouldBlock:
            return woken, True
        except trio.EndOfChannel:
            return woken, False
        woken = True


async def run_projection_follower(
    runner: ProjectionRunner,
    wake: trio.MemoryReceiveChannel[None],
    *,
    health: FollowerHealth | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Keep read models caught up: after each commit the Journal reports, and every second.

    Catch-up runs in a worker thread (it is blocking database work); commits that
    arrive meanwhile coalesce into the next round. A catch-up that fails (a read
    model raising on an event, a full disk) never ends the follower: the read models
    keep their last good position, ``health`` records them stale and logs it
    (rate-limited), and the follower tries again after a bounded backoff
    (``FOLLOW_RETRY_FIRST_S`` doubling up to ``FOLLOW_RETRY_MAX_S``; commits meanwhile
    do not shorten it), until one succeeds. When ``wake`` closes, it catches up one
    last time if a commit came (or the read models are stale) and returns.

    Cancellation: returns when cancelled, backing off included; a catch-up in flight
    finishes in its thread (its transaction is atomic either way).
    """
    if health is None:
        health = FollowerHealth(first_retry_s=FOLLOW_RETRY_FIRST_S, max_retry_s=FOLLOW_RETRY_MAX_S)
    async with wake:
        task_status.started()
        while True:
            retry_s = await _catch_up(runner, health)
            woken, still_open = await _wait_for_commits(
                wake,
                FOLLOW_POLL_S if retry_s is None else retry_s,
                until_woken=retry_s is None,
            )
            if not still_open:
                if woken or health.status.stale:
                    await _catch_up(runner, health)
                return


__all__ = [
    "FollowerHealth",
    "ReadModelsStatus",
    "follow_retry_s",
    "open_read_runner",
    "open_runner",
    "open_writable_runner",
    "read_models_refusal",
    "run_projection_follower",
    "views_location",
]
