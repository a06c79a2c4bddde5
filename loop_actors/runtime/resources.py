"""What a Runtime keeps open between calls: the parts that outlive one ``trio.run``.

``Runtime.run_sync`` starts a trio event loop for each call. The store's connections,
the work queue's, the secret store's table, the read models' database, the checkpoint
writer's thread and the holder's registration in the queue are not bound to an event
loop: a runtime opens them at its first call and keeps them (:class:`Resources`) until
it is closed, instead of paying for opening and closing them on every call. What is
bound to an event loop (the nursery and its heartbeat and watcher tasks, the Journal,
the reader, MCP sessions) is opened and closed with each call.

Kept resources belong to the process that opened them: a forked child never uses (nor
closes) its parent's connections and threads. :func:`abandon` keeps them referenced in
the child, so that they are not finalised there either (SQLite's documentation: a
connection must not be carried across ``fork()``), and the child opens its own.
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from loop_actors._logs import package_logger
from loop_actors.audit.checkpointer import Checkpointer, CheckpointSettings, open_checkpointer
from loop_actors.runtime.leases import HolderRegistration
from loop_actors.runtime.outage import StoreOutages
from loop_actors.store.journal import Journal
from loop_actors.store.queue import QueueBusyError, WorkQueue
from loop_actors.store.read_models import open_runner
from loop_actors.store.secrets import SecretStore
from loop_actors.store.store import EventStore
from loop_actors.telemetry.otel import db_system_name, record_transaction
from projections import ProjectionRunner

log = package_logger(__name__)

_ABANDONED: list[Resources] = []
"""Resources a forked child inherited from its parent: kept referenced, never used or closed."""


@dataclass(frozen=True)
class ResourceSettings:
    """What a runtime opens its resources with (its constructor's arguments)."""

    db_url: str
    follow_projections: bool
    views: str | None
    checkpoints: CheckpointSettings | None
    lease_s: float


@dataclass(eq=False)
class Resources:
    """The parts of an open runtime that outlive one event loop (see the module).

    Every method blocks. ``in_use`` is set while a call of the runtime uses them
    (by that call, in its thread): they are then not closed at interpreter exit.
    """

    store: EventStore
    journal: Journal
    """The one writer; its thread outlives the calls, each call's event loop is served in turn."""
    queue: WorkQueue
    secrets: SecretStore
    runner: ProjectionRunner | None
    checkpointer: Checkpointer | None
    registration: HolderRegistration
    outages: StoreOutages
    """What the runtime's calls found of the store (an outage is warned about once)."""
    pid: int = field(default_factory=os.getpid)
    """The process that opened them (the only one that may use or close them)."""
    cancels_seen_to: int | None = None
    """Where the last call's cancel watcher stood: the next call's watcher starts there."""
    in_use: bool = False
    closed: bool = False
    _closing: threading.Lock = field(default_factory=threading.Lock)

    @property
    def of_this_process(self) -> bool:
        """Whether this process opened them (False in a forked child)."""
        return self.pid == os.getpid()

    def register_as(self, holder: str) -> None:
        """Use another holder id from now on (a Worker's): the previous one is deregistered.

        A failure to deregister is logged: that registration runs out by itself (its
        heartbeat stops).
        """
        previous = self.registration
        if previous.registered:
            try:
                self.queue.deregister(previous.holder)
            except Exception:
                log.warning("cannot deregister holder %s", previous.holder, exc_info=True)
        self.registration = HolderRegistration(holder)

    def close(self) -> None:
        """Deregister the holder, stop the checkpoint writer, close every connection (once).

        Does nothing in a process that did not open them (a forked child), or when
        they are already closed. What fails to close is logged, and the rest is closed.
        """
        if not self.of_this_process:
            return
        with self._closing:
            if self.closed:
                return
            self.closed = True
        self._stop_journal_and_deregister()
        steps: list[tuple[str, Any]] = []
        if self.checkpointer is not None:
            steps.append(("writing the last checkpoint", self.checkpointer.close))
        if self.runner is not None:
            steps.append(("closing the read models", self.runner.close))
        steps += [
            ("closing the work queue", self.queue.close),
            ("closing the secret store", self.secrets.close),
            ("closing the store", self.store.close),
        ]
        for doing, step in steps:
            try:
                step()
            except Exception:  # the others are closed all the same
                log.warning("%s failed while closing the runtime", doing, exc_info=True)

    def _stop_journal_and_deregister(self) -> None:
        """Stop the Journal, then deregister the holder (before the checkpoint is written).

        A store that cannot be used is warned about once (the calls' outages are these).
        """
        try:
            self.journal.stop()
        except Exception:  # the rest is closed all the same
            log.warning("stopping the Journal failed while closing the runtime", exc_info=True)
        registration = self.registration
        if not registration.registered:
            return
        registration.registered = False
        try:
            if self.outages.down and self.queue.writes_at_once:  # SQLite's lock: no wait
                self.queue.at_once(partial(self.queue.deregister, registration.holder))
            else:
                self.queue.deregister(registration.holder)
        except QueueBusyError:
            log.info(
                "the store is down: holder %s not deregistered; its row is forgotten once "
                "its heartbeat is %g s old",
                registration.holder,
                self.outages.lease_s,
            )
        except Exception as error:
            doing = f"deregistering holder {registration.holder}"
            if not self.outages.failed(doing, error):
                log.warning("cannot deregister holder %s", registration.holder, exc_info=True)

    def close_at_exit(self) -> None:
        """Close them at interpreter exit (or when their runtime is collected), if unused.

        A call still running then (in another thread) keeps them: closing the store
        under it would fail its commits; the process ends with them open.
        """
        if self.in_use and self.of_this_process:
            log.warning(
                "a runtime's store %s was still in use at exit: not closed",
                self.store.url.display,
            )
            return
        self.close()


def open_resources(settings: ResourceSettings, secrets: SecretStore, holder: str) -> Resources:
    """Open a runtime's store and what else outlives one call (blocking).

    Raises:
        StoreUnavailableError: the store (or its queue, or the read models' database)
            cannot be opened.
        CheckpointError: the checkpoint directory or key cannot be used.

    Whatever was opened before a failure is closed again.
    """
    store = EventStore(settings.db_url)
    opened: list[Any] = [store.close]
    try:
        cipher = store.app.mapper.cipher
        secrets.open(store.sealed_table() if cipher else None, cipher)
        opened.append(secrets.close)
        runner = None
        if settings.follow_projections:
            runner = open_runner(store, settings.views)
            opened.append(runner.close)
        queue = store.open_queue()
        opened.append(queue.close)
        checkpointer = None
        if settings.checkpoints is not None:
            checkpointer = open_checkpointer(store, settings.checkpoints)
            opened.append(checkpointer.close)
        journal = Journal(
            store,
            after_commit=checkpointer.note_commits if checkpointer else None,
            on_transaction=partial(record_transaction, db_system_name(store.url.kind)),
        )
        journal.start()
    except BaseException:
        for close in reversed(opened):
            try:
                close()
            except Exception:
                log.warning("cannot close what was opened before the failure", exc_info=True)
        raise
    return Resources(
        store=store,
        journal=journal,
        queue=queue,
        secrets=secrets,
        runner=runner,
        checkpointer=checkpointer,
        registration=HolderRegistration(holder),
        outages=StoreOutages(lease_s=settings.lease_s),
    )


def close_when_collected(owner: Any, resources: Resources) -> weakref.finalize[..., None]:
    """Close ``resources`` when ``owner`` is garbage collected, or at interpreter exit."""
    return weakref.finalize(owner, resources.close_at_exit)


def abandon(resources: Resources, finalizer: weakref.finalize[..., None] | None) -> None:
    """Drop a parent's resources in a forked child: never used, closed nor finalised here."""
    if finalizer is not None:
        finalizer.detach()
    resources.secrets.detach()
    _ABANDONED.append(resources)
