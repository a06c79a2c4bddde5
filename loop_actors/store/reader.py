"""The one owner of blocking store reads on the trio side.

The event store blocks (SQLite); trio code never calls it directly. Writes go
through the Journal's thread; every read goes through a :class:`StoreReader`,
which runs it in a worker thread (at most ``MAX_CONCURRENT_READS`` at once, so
a burst of resumes does not start a thread per invocation) and abandons the
thread when the caller is cancelled: a read changes nothing, so giving up on it
is always safe.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import trio
from eventsourcing.persistence import PersistenceError

from aggregates.audit_coverage import snapshot_problems
from aggregates.effect import Effect
from aggregates.events import fold
from aggregates.invocation import Invocation, InvocationEvent
from aggregates.ledger_check import (
    cut_history_problem,
    orphaned_effects_after_snapshot,
    orphans_problem,
)
from aggregates.requests import CancelRequest
from loop_actors._errors import InvocationNotFoundError
from loop_actors._logs import package_logger
from loop_actors.store.store import EventStore

log = package_logger(__name__)

MAX_CONCURRENT_READS = 8
"""Worker threads reading the store at once."""

IDLE_WAIT_S = 10.0
"""How long closing waits for abandoned reads to finish before the store is closed."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class DriveReads:
    """What a claimed run reads before it drives, read with others' in one trip to a thread.

    The invocation as its events make it, why its stored history cannot be driven
    (None: it can), its cancel request if someone made one, and the store's head
    read before that request was looked up: a cancel request recorded after
    ``position`` was not seen here (``Runtime._drive`` looks again if the runtime's
    watcher went past it before the run was registered).
    """

    invocation: Invocation
    history_problem: str | None
    cancel_request: CancelRequest | None
    position: int


def history_problem_of(
    invocation_id: str,
    events: list[InvocationEvent],
    snapshots: list[tuple[int, object]],
    effects: Callable[[], list[Effect]],
) -> str | None:
    """Why an invocation's stored history disagrees with its newest snapshot or its ledger.

    ``effects`` gives its ledger entries (read only when its snapshot agrees).
    """
    for version, why in snapshot_problems(events, snapshots):
        return (
            f"invocation {invocation_id}'s snapshot at version {version} does not match "
            f"its events: {why}; nothing was run (check the store with: "
            "loop-actors audit verify)"
        )
    return cut_history_problem(invocation_id, events, effects())


class StoreReader:
    """Async, cancellable reads of one :class:`EventStore`."""

    def __init__(self, store: EventStore) -> None:
        """Read ``store`` from trio."""
        self.store = store
        self._limiter = trio.CapacityLimiter(MAX_CONCURRENT_READS)
        self._running = 0
        self._idle = threading.Condition()

    async def call(self, read: Callable[[], T]) -> T:
        """Run a blocking read of the store in a worker thread.

        Cancellation: a checkpoint; the thread is abandoned (its result dropped).
        """
        return await trio.to_thread.run_sync(
            self._counted, read, abandon_on_cancel=True, limiter=self._limiter
        )

    def _counted(self, read: Callable[[], T]) -> T:
        with self._idle:
            self._running += 1
        try:
            return read()
        finally:
            with self._idle:
                self._running -= 1
                self._idle.notify_all()

    async def aclose(self) -> None:
        """Wait (shielded, bounded) until no read runs; the store may then be closed.

        Cancellation: shielded; at most ``IDLE_WAIT_S``.
        """
        with self._idle:
            if self._running == 0:  # the usual case: no thread to wait in
                return
        with trio.CancelScope(shield=True):
            idle = await trio.to_thread.run_sync(self.wait_idle)
        if not idle:
            log.warning("store reads still running after %.0f s; closing anyway", IDLE_WAIT_S)

    def wait_idle(self, timeout_s: float = IDLE_WAIT_S) -> bool:
        """Block until no read runs (abandoned ones included): the store may then close.

        Returns False when reads were still running after ``timeout_s``.
        """
        with self._idle:
            return self._idle.wait_for(lambda: self._running == 0, timeout=timeout_s)

    async def invocation(self, invocation_id: str) -> Invocation:
        """The invocation as its events make it (``InvocationNotFoundError`` if none).

        Cancellation: as :meth:`call`.
        """
        return await self.call(lambda: self.store.get(invocation_id))

    async def invocation_to_resume(self, invocation_id: str) -> Invocation:
        """:meth:`invocation`, for a run that goes on from it (``EventStore.get_to_resume``).

        The store notes whether it vouches for the snapshot the invocation was loaded
        from, and :meth:`history_problem` given the returned object then reads neither
        that snapshot nor anything before it again.

        Cancellation: as :meth:`call`.
        """
        return await self.call(lambda: self.store.get_to_resume(invocation_id))

    async def events(self, invocation_id: str) -> list[InvocationEvent]:
        """Every committed event of an invocation (``InvocationNotFoundError`` if none).

        Cancellation: as :meth:`call`.
        """
        return await self.call(lambda: self.store.events(invocation_id))

    async def effects(self, keys: list[str]) -> dict[str, Effect | None]:
        """The ledger entries of these effect keys (None for a key never prepared).

        Cancellation: as :meth:`call`.
        """
        return await self.call(lambda: {key: self.store.get_effect(key) for key in keys})

    async def history_problem(
        self, invocation_id: str, loaded: Invocation | None = None
    ) -> str | None:
        """Why the invocation's stored history disagrees with its snapshots or ledger, or None.

        ``loaded``: the invocation as it was just loaded (read again when not given, or
        when its version is not the stored one's).

        What it reads is in proportion to what it must check. An invocation whose newest
        snapshot the store vouches for (``EventStore.vouches_for``: its seal holds
        against the stored event at its version, and no event before it is missing) is
        checked from that snapshot on: its events after it (the tail the load replayed),
        and its ledger's entries against the tail's batches and the loaded turns
        (``aggregates.ledger_check.orphaned_effects_after_snapshot``). When ``loaded``
        came from :meth:`invocation_to_resume` and the store vouched for its snapshot
        then, the store checks again only what could have changed since (the event at
        the snapshot's version, the count of events up to it: ``EventStore.vouched_tail``),
        without reading the snapshot a second time. Any other (no snapshot, one written
        before seals, one whose seal does not hold, rows missing before it) is checked
        as a whole: every event replayed and compared with the snapshot, the ledger
        against every batch (:func:`history_problem_of`), which names what is wrong.
        Edits of events before a vouched snapshot that leave every row in place are the
        audit's to find (``loop-actors audit verify``), as edits of any stored event
        always were.

        Cancellation: as :meth:`call`.
        """
        store = self.store

        def check() -> str | None:
            if loaded is not None:
                vouched = store.vouched_tail(loaded)
                if vouched is not None:
                    version, tail = vouched
                    if (tail[-1].originator_version if tail else version) == loaded.version:
                        return orphans_problem(
                            invocation_id,
                            orphaned_effects_after_snapshot(
                                loaded, tail, store.effects_of(invocation_id)
                            ),
                            loaded.version,
                        )
            snapshot = store.newest_snapshot_row(invocation_id)
            if snapshot is not None and store.vouches_for(snapshot):
                tail = store.events_after(invocation_id, snapshot.originator_version)
                version = tail[-1].originator_version if tail else snapshot.originator_version
                invocation = loaded
                if invocation is None or invocation.version != version:
                    invocation = store.get(invocation_id)
                orphans = orphaned_effects_after_snapshot(
                    invocation, tail, store.effects_of(invocation_id)
                )
                return orphans_problem(invocation_id, orphans, version)
            events = store.events(invocation_id)
            # The snapshot the invocation was loaded from (``audit verify`` checks them all).
            snapshots = store.newest_snapshot(invocation_id)
            return history_problem_of(
                invocation_id, events, snapshots, lambda: store.effects_of(invocation_id)
            )

        return await self.call(check)

    async def before_drive(
        self, invocation_ids: Sequence[str]
    ) -> dict[str, DriveReads | Exception]:
        """What each invocation's run reads before it drives, in one trip to a thread.

        For each: what :meth:`invocation`, :meth:`history_problem` and
        :meth:`cancel_request` would read, its events read once for its state and
        for the check. An invocation that cannot be read gets the exception its read
        raised (``InvocationNotFoundError``, a damaged row...); a store that cannot be
        read at all raises, as :meth:`call` does.

        Cancellation: as :meth:`call`.
        """
        store = self.store

        def read_all() -> dict[str, DriveReads | Exception]:
            # The head first: a cancel request recorded after it is not in what follows.
            position = store.head()
            events_of = store.events_of(invocation_ids)
            snapshots_of = store.newest_snapshots(invocation_ids)
            requests_of = store.cancel_requests_of(invocation_ids)
            effects_of = store.effects_of_many(invocation_ids)
            found: dict[str, DriveReads | Exception] = {}
            for invocation_id in invocation_ids:
                events, request = events_of[invocation_id], requests_of[invocation_id]
                if isinstance(events, Exception):
                    found[invocation_id] = events
                    continue
                if isinstance(request, Exception):
                    found[invocation_id] = request
                    continue
                snapshots = snapshots_of[invocation_id]
                try:
                    if snapshots:  # loaded from its snapshot, as resume loads it
                        invocation = store.get(invocation_id)
                    else:  # what ``store.get`` folds when there is no snapshot
                        invocation = fold(None, events)
                        if not isinstance(invocation, Invocation):
                            raise InvocationNotFoundError(invocation_id)
                    problem = history_problem_of(
                        invocation_id,
                        events,
                        snapshots,
                        partial(effects_of.__getitem__, invocation_id),
                    )
                except PersistenceError:
                    raise  # the store, not this invocation: nothing more can be read
                except Exception as error:  # this one cannot be read (damaged...): others can
                    found[invocation_id] = error
                    continue
                found[invocation_id] = DriveReads(
                    invocation=invocation,
                    history_problem=problem,
                    cancel_request=request,
                    position=position,
                )
            return found

        return await self.call(read_all)

    async def open_effects(self) -> list[Effect]:
        """Every effect still dispatched or of unknown outcome.

        Cancellation: as :meth:`call`.
        """
        return await self.call(self.store.open_effects)

    async def paused_for_reconciliation(self) -> list[Invocation]:
        """Every invocation paused ``reconciliation_required`` now (``EventStore``'s answer).

        Cancellation: as :meth:`call`.
        """
        return await self.call(self.store.paused_for_reconciliation)

    async def cancel_request(self, invocation_id: str) -> CancelRequest | None:
        """The invocation's cancel request, if someone made one.

        Cancellation: as :meth:`call`.
        """
        return await self.call(lambda: self.store.cancel_request(invocation_id))

    async def cancel_requests_after(self, position: int) -> tuple[list[str], int]:
        """Invocation ids with a cancel request after a position, and the next position.

        Cancellation: as :meth:`call`.
        """
        return await self.call(lambda: self.store.cancel_requests_after(position))

    async def head(self) -> int:
        """The last notification id.

        Cancellation: as :meth:`call`.
        """
        return await self.call(self.store.head)
