"""Where the read models live, and following the store live from trio."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from uuid import uuid4

import trio

from loop_actors._errors import StoreUnavailableError
from loop_actors._faults import CrashPoint, fault_point
from loop_actors._store import EventStore
from projections import Projection, ProjectionRunner, default_projections

FOLLOW_POLL_S = 1.0
"""A follower also catches up this often, for commits made by other processes."""


def views_location(store: EventStore, explicit: str | None = None) -> str:
    """The read models' SQLite database for a store.

    By default a file next to the event store (``x.db`` → ``x.views.db``), so
    that building read models never holds the event store's write lock; for
    ``memory://``, an in-memory database private to this process.
    """
    if explicit:
        return explicit
    if store.url.kind == "memory":
        return f"file:loop-actors-views-{uuid4().hex}?mode=memory&cache=shared"
    assert store.url.path is not None
    path = store.url.path
    return str(path.with_name(f"{path.stem}.views{path.suffix or '.db'}"))


def open_runner(
    store: EventStore,
    views: str | None = None,
    projections: Sequence[Projection] | None = None,
    *,
    batch_size: int = 500,
) -> ProjectionRunner:
    """A projection runner for the store's read models (blocking: opens a database).

    Raises:
        StoreUnavailableError: the read models' database cannot be opened.
    """
    location = views_location(store, views)
    if not location.startswith("file:"):
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
        )
    except Exception as error:
        raise StoreUnavailableError(f"cannot open read models at {location}: {error}") from error


async def run_projection_follower(
    runner: ProjectionRunner,
    wake: trio.MemoryReceiveChannel[None],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Keep read models caught up: after each commit the Journal reports, and every second.

    Catch-up runs in a worker thread (it is blocking SQLite work); commits that
    arrive meanwhile coalesce into the next round.

    Cancellation: returns when cancelled; a catch-up in flight finishes in its
    thread (its transaction is atomic either way).
    """
    async with wake:
        task_status.started()
        while True:
            await trio.to_thread.run_sync(runner.catch_up)
            with trio.move_on_after(FOLLOW_POLL_S):
                try:
                    await wake.receive()
                except trio.EndOfChannel:
                    return
            while True:  # coalesce the wake-ups that piled up
                try:
                    wake.receive_nowait()
                except trio.WouldBlock:
                    break
                except trio.EndOfChannel:
                    await trio.to_thread.run_sync(runner.catch_up)
                    return


__all__ = ["open_runner", "run_projection_follower", "views_location"]
