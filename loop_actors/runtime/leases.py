"""Holding leases from trio: the queue's one thread, the heartbeat, and what a run is told.

A :class:`LeaseKeeper` belongs to one Runtime (a worker's, or a plain run's). It
registers the process as a holder, takes and gives back leases, and renews them
on a heartbeat. Each lease it holds is a :class:`HeldLease`, which the
Controller of that invocation consults: before each commit (a lost lease
commits nothing), before starting tool calls (a lease that could not be renewed
starts no write) and after each commit (a holder that shuts down stops there).
The rules are :mod:`aggregates.lease`'s; this module only does the I/O.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache, partial
from pathlib import Path
from typing import Any, Generic, TypeVar
from uuid import uuid4

import trio

from aggregates.lease import (
    HolderKind,
    HolderRow,
    QueueStatus,
    Refuse,
    Release,
    Take,
    heartbeat_every,
    holder_gone,
    may_start_calls,
)
from loop_actors._logs import BackgroundLoop, fields, package_logger
from loop_actors.runtime.outage import StoreOutages
from loop_actors.store.journal import loop_idle
from loop_actors.store.queue import Claimed, NewRow, QueueBusyError, WorkQueue
from loop_actors.telemetry.otel import watch_leases

log = package_logger(__name__)

T = TypeVar("T")
R = TypeVar("R")

MAX_BATCH = 2_000
"""The most leases released in one transaction.

With thousands of runs ending at once, a transaction per row queued them on the queue's
one thread, and the heartbeat's renewal waited behind them until the leases were too
old to start a call (every run ended ``lease_lost``). (A new run's row is written with
its start, in the Journal's transaction.)"""


class LeaseDrained(Exception):
    """Raised by a run at a commit when its holder is shutting down: it stops there.

    Nothing is lost: the invocation stands at that commit, its lease is given
    back, and another worker (or a resume) continues from there.
    """


@dataclass
class HeldLease:
    """One lease this process holds, as the run of that invocation sees it."""

    invocation_id: str
    holder: str
    epoch: int
    lease_s: float
    valid_until: float
    """Until when the lease surely runs (this process's monotonic clock)."""
    lost: bool = False
    """The heartbeat found it taken over (or the row gone): commit nothing more."""
    draining: bool = False
    """The holder shuts down: stop after the next commit."""
    abandoned: bool = False
    """The holder stops at once: a cancelled run records nothing (another takes it over)."""
    released: trio.Event | None = None
    """Given back in the background: set once that release was written (or failed, and
    waits for the next heartbeat)."""

    def may_start_calls(self) -> bool:
        """Whether a tool call may start now: the lease is held and was renewed recently."""
        return not self.lost and may_start_calls(
            now=time.monotonic(), valid_until=self.valid_until, lease_s=self.lease_s
        )


_Release = tuple[HeldLease, Release, str | None]
"""A lease to give back, how the row is left, and its note."""


@dataclass
class _Waiting(Generic[R]):
    """One request in a :class:`_Grouped` batch, and its answer once written."""

    done: trio.Event = field(default_factory=trio.Event)
    result: R | None = None
    error: Exception | None = None


class _Grouped(Generic[T, R]):
    """Queue writes of one kind that share a transaction: group commit for the queue.

    Each caller waits for the next transaction that carries its request. One task
    writes, in the queue's thread: everything that arrived while the previous batch
    was out goes in the next one. So a burst of submits adds hundreds of rows with one
    transaction, and one fsync, instead of one each; one alone is written at once.
    """

    def __init__(
        self,
        keeper: LeaseKeeper,
        write: Callable[[Sequence[T]], list[R]],
        *,
        most: int = 1024,
    ) -> None:
        self._keeper = keeper
        self._write = write
        self._most = most
        self._waiting: list[tuple[T, _Waiting[R]]] = []
        self._writing = False

    async def __call__(self, request: T) -> R:
        """Write ``request`` with the next batch and return its answer.

        Raises:
            Exception: whatever the batch's write raised (no request of it was written).

        Cancellation: a checkpoint; cancelled, the request may still be written.
        """
        waiting: _Waiting[R] = _Waiting()
        self._waiting.append((request, waiting))
        if not self._writing:
            self._writing = True
            nursery = self._keeper.nursery
            assert nursery is not None
            nursery.start_soon(self._write_batches)
        await waiting.done.wait()
        if waiting.error is not None:
            raise waiting.error
        return waiting.result  # type: ignore[return-value]

    async def _write_batches(self) -> None:
        try:
            # Shielded: a closing runtime still writes what its runs handed over (each
            # write is bounded by the store's own timeouts).
            with trio.CancelScope(shield=True):
                while self._waiting:
                    batch, self._waiting = (
                        self._waiting[: self._most],
                        self._waiting[self._most :],
                    )
                    try:
                        answers = await self._keeper.call(
                            self._write, [request for request, _ in batch]
                        )
                    except Exception as error:  # each caller handles it, as for its own write
                        for _, waiting in batch:
                            waiting.error = error
                    else:
                        for (_, waiting), answer in zip(batch, answers, strict=True):
                            waiting.result = answer
                    for _, waiting in batch:
                        waiting.done.set()
        finally:
            self._writing = False


@cache
def machine_identity() -> str:
    """Host, boot and pid namespace: processes with the same identity can see each other's pids."""
    boot = ""
    with contextlib.suppress(OSError):
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    namespace = ""
    with contextlib.suppress(OSError):
        namespace = str(os.stat("/proc/self/ns/pid").st_ino)
    return f"{socket.gethostname()}/{boot}/{namespace}"


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (None where /proc does not say)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    return stat[stat.rindex(")") + 2 :].split()


def process_start(pid: int) -> str | None:
    """When a process started, as the kernel counts it (None where /proc does not say)."""
    fields = _stat_fields(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None  # field 22


def process_alive(pid: int, started: str | None) -> bool:
    """Whether process ``pid`` (which started at ``started``, when known) still runs.

    A zombie (killed, not yet waited for by its parent) is not alive.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, as another user
    fields = _stat_fields(pid)
    if fields is None:
        return True  # no /proc: the signal check is all there is
    if fields[0] in ("Z", "X"):  # field 3, the state: zombie or dead
        return False
    return started is None or len(fields) <= 19 or fields[19] == started


def is_gone(holder: HolderRow | None, now: float) -> bool:
    """Whether a registered holder is gone, as this machine can tell."""
    if holder is None:
        return False
    same = holder.machine == machine_identity()
    alive = process_alive(holder.pid, holder.pid_start) if same else True
    return holder_gone(holder, now=now, same_machine=same, process_alive=alive)


def new_holder_id(kind: HolderKind) -> str:
    """A holder id that says where it runs: ``worker:HOST:PID:RANDOM``."""
    return f"{kind.value}:{socket.gethostname()}:{os.getpid()}:{uuid4().hex[:8]}"


@dataclass
class HolderRegistration:
    """Whether a holder is registered in the queue, kept by a runtime between its opens.

    A runtime that stays open between calls (``Runtime.run_sync`` after ``run_sync``)
    registers once, and deregisters when it closes; each call's :class:`LeaseKeeper`
    shares this. Between calls no heartbeat runs: a registration older than half a
    lease is written again at the next call's first lease (:meth:`expire_if_stale`),
    before any other process could take the holder for gone (its heartbeat a lease
    old) and the next heartbeat comes a third of a lease later.
    """

    holder: str
    registered: bool = False
    renewed_at: float = 0.0
    """When it was last registered or renewed (this process's monotonic clock)."""

    def expire_if_stale(self, lease_s: float, now: float) -> None:
        """Have the next lease register again if the last renewal is half a lease old."""
        if self.registered and now - self.renewed_at > lease_s / 2:
            self.registered = False


@dataclass
class LeaseKeeper:
    """The leases of one Runtime: taken, renewed on a heartbeat, given back."""

    queue: WorkQueue
    holder: str
    kind: HolderKind
    lease_s: float
    agents: list[str] = field(default_factory=list)
    concurrency: int = 1
    held: dict[str, HeldLease] = field(default_factory=dict)
    reap: bool = False
    """Expire the leases of holders that are gone, at each heartbeat (workers do)."""
    nursery: trio.Nursery | None = None
    """Where background releases run (the runtime's)."""
    holder_state: HolderRegistration | None = None
    """Whether the holder is registered (shared with the runtime's later opens, and of
    the same holder); a new one, unregistered, when not given."""
    shared_outages: StoreOutages | None = None
    """The runtime's outage tracker, kept between its calls (a new one when not given)."""
    _unreleased: dict[str, tuple[HeldLease, Release, str | None]] = field(default_factory=dict)
    """Releases that failed (the store did not answer): tried again at each heartbeat, at close."""
    _limiter: trio.CapacityLimiter = field(default_factory=lambda: trio.CapacityLimiter(1))
    _failures: int = 0
    _registration: HolderRow | None = None
    """This process's registration, made once (every start carries it until one commits)."""
    _releases: list[_Release] = field(default_factory=list)
    """Leases to give back in the background: one transaction for all of them."""
    _releasing: bool = False
    _pending_releases: dict[str, HeldLease] = field(default_factory=dict)
    """The last lease of each invocation given back in the background, until it is written."""
    _enqueues: _Grouped[NewRow, bool] = field(init=False)
    outages: StoreOutages = field(init=False)
    """What this runtime's tasks found of its store (an outage is logged once, here)."""

    def __post_init__(self) -> None:
        """Group the rows of submits that come together into shared transactions."""
        self._enqueues = _Grouped(self, self.queue.enqueue_many)
        self.outages = self.shared_outages or StoreOutages(lease_s=self.lease_s)
        if self.holder_state is None:
            self.holder_state = HolderRegistration(self.holder)
        watch_leases(self)  # loop_actors.leases.held, observed when metrics are collected

    @property
    def _registered(self) -> bool:
        assert self.holder_state is not None
        return self.holder_state.registered

    @_registered.setter
    def _registered(self, registered: bool) -> None:
        assert self.holder_state is not None
        self.holder_state.registered = registered
        if registered:
            self.holder_state.renewed_at = time.monotonic()

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a queue operation in the queue's one thread."""
        return await trio.to_thread.run_sync(partial(fn, *args, **kwargs), limiter=self._limiter)

    async def _call_quick(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A quick queue write (not flushed): on the trio thread if nothing would wait for it.

        As the Journal writes a commit inline: when the loop is idle (``loop_idle``), the
        queue's thread is not busy and the database's lock is free, it is written at once
        (a fraction of a millisecond, against two hand-overs between threads); otherwise,
        or when the lock is taken, in the queue's thread as any other.
        """
        if self.queue.writes_at_once and not self._limiter.borrowed_tokens and loop_idle():
            try:
                return self.queue.at_once(partial(fn, *args, **kwargs))
            except QueueBusyError:
                pass
        return await self.call(fn, *args, **kwargs)

    def registration(self) -> HolderRow:
        """This process's row as a holder (the queue sets its times when it writes it)."""
        if self._registration is None:
            self._registration = self._make_registration()
        return self._registration

    def _make_registration(self) -> HolderRow:
        pid = os.getpid()
        return HolderRow(
            holder=self.holder,
            kind=self.kind,
            host=socket.gethostname(),
            machine=machine_identity(),
            pid=pid,
            pid_start=process_start(pid),
            started_at=0.0,
            heartbeat_at=0.0,
            lease_s=self.lease_s,
            agents=self.agents,
            concurrency=self.concurrency,
        )

    async def register(self) -> None:
        """Register this process as a holder (once)."""
        if self._registered:
            return
        await self.call(self.queue.register, self.registration())
        self._registered = True

    async def aclose(self, *, deregister: bool = True) -> None:
        """Give back what could not be released yet, then deregister (bounded, shielded).

        ``deregister=False`` leaves the holder registered (a runtime kept open between
        calls deregisters when it closes).

        Never raises: what cannot be written now is logged, and runs out by itself (a
        lease within ``lease_s``; a holder's row once its heartbeat is that old).
        """
        if self._unreleased:
            left = list(self._unreleased)
            with trio.move_on_after(10, shield=True):
                try:
                    await self._retry_releases()
                except QueueBusyError:
                    log.info(
                        "the store is down: %d lease(s) not given back at close (the first: "
                        "%s); they run out within %g s",
                        len(left),
                        left[0],
                        self.lease_s,
                    )
                except Exception as error:
                    doing = f"giving back {len(left)} lease(s) at close (the first: {left[0]})"
                    if not self.outages.failed(doing, error):
                        log.warning(
                            "cannot give back %d lease(s) at close (the first: %s); they run "
                            "out within %g s",
                            len(left),
                            left[0],
                            self.lease_s,
                            exc_info=True,
                        )
        if not deregister or not self._registered:
            return
        with trio.move_on_after(5, shield=True):
            try:
                await self._write_unless_down(self.queue.deregister, self.holder)
            except QueueBusyError:
                log.info(
                    "the store is down: holder %s not deregistered; its row is forgotten "
                    "once its heartbeat is %g s old",
                    self.holder,
                    self.lease_s,
                )
            except Exception as error:
                if not self.outages.failed(f"deregistering holder {self.holder}", error):
                    log.warning("cannot deregister holder %s", self.holder, exc_info=True)
        self._registered = False

    async def enqueue(
        self,
        invocation_id: str,
        agent_name: str,
        *,
        agent_ref: str | None = None,
        status: QueueStatus = QueueStatus.RUNNABLE,
    ) -> bool:
        """Add an invocation's row (with others added at the same time); False if it had one.

        Raises:
            StoreUnavailableError: the queue cannot be written; adding again is safe.

        Cancellation: a checkpoint; cancelled, the row may still be added.
        """
        return await self._enqueues(NewRow(invocation_id, agent_name, agent_ref, status))

    def _hold(self, invocation_id: str, epoch: int, sent: float) -> HeldLease:
        lease = HeldLease(
            invocation_id=invocation_id,
            holder=self.holder,
            epoch=epoch,
            lease_s=self.lease_s,
            valid_until=sent + self.lease_s,
        )
        self.held[invocation_id] = lease
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "lease of %s acquired (epoch %d)",
                invocation_id,
                epoch,
                extra=fields(invocation_id=invocation_id, holder=self.holder, epoch=epoch),
            )
        return lease

    def new_row(self, invocation_id: str, agent_name: str) -> NewRow:
        """The queue row of an invocation this process starts and drives: claimed by it.

        Committed with the invocation's ``InvocationStarted`` (``Journal.commit``), with
        this process's registration as a holder until it is registered: a process that
        dies at any moment after the start leaves a row that a worker on its machine
        takes over at once (it sees the holder gone), and any worker once the lease ran out.
        """
        return NewRow.held(
            invocation_id,
            agent_name,
            holder=self.holder,
            lease_s=self.lease_s,
            registration=None if self._registered else self.registration(),
        )

    def hold_new(self, row: NewRow, *, sent: float) -> HeldLease:
        """Hold the lease of an invocation whose start committed ``row`` (:meth:`new_row`).

        ``sent``: when the start's commit was sent (this process's monotonic clock); the
        row's lease runs from its write, later, so the lease surely runs until ``sent``
        plus ``lease_s``. A registration written with the row registered this process.
        """
        if row.registration is not None:
            self._registered = True
        return self._hold(row.invocation_id, 0, sent)

    async def acquire(
        self, invocation_id: str, agent_name: str, *, take_over: bool
    ) -> tuple[HeldLease, Take] | Refuse:
        """Take the lease of an existing invocation, or say who holds it."""
        await self.register()
        sent = time.monotonic()
        verdict = await self.call(
            self.queue.acquire,
            invocation_id,
            agent_name,
            holder=self.holder,
            lease_s=self.lease_s,
            take_over=take_over,
            gone=is_gone,
        )
        if isinstance(verdict, Refuse):
            return verdict
        return self._hold(invocation_id, verdict.epoch, sent), verdict

    async def claim(self, agent_names: list[str], limit: int) -> list[tuple[HeldLease, Claimed]]:
        """Claim up to ``limit`` runnable invocations of these agents."""
        await self.register()
        sent = time.monotonic()
        claimed = await self.call(
            self.queue.claim,
            holder=self.holder,
            agent_names=agent_names,
            limit=limit,
            lease_s=self.lease_s,
        )
        return [(self._hold(c.invocation_id, c.epoch, sent), c) for c in claimed]

    def release_soon(self, lease: HeldLease, release: Release, note: str | None = None) -> None:
        """Stop renewing a lease and give it back in the background (the caller goes on).

        A release that waits for a locked store does not hold up the run's outcome;
        the runtime waits for it when it closes. The leases of runs that end meanwhile
        are given back together, in one transaction.
        """
        self._drop(lease)
        lease.released = trio.Event()
        self._pending_releases[lease.invocation_id] = lease
        self._releases.append((lease, release, note))
        if not self._releasing:
            self._releasing = True
            assert self.nursery is not None
            self.nursery.start_soon(self._write_releases)

    async def _write_releases(self) -> None:
        try:
            while self._releases:
                batch, self._releases = self._releases[:MAX_BATCH], self._releases[MAX_BATCH:]
                try:
                    await self._release_all(batch)
                finally:
                    self._released(batch)
        finally:
            self._releasing = False
            self._released(self._releases)  # cancelled (the runtime closes): nobody waits

    def _released(self, batch: Sequence[_Release]) -> None:
        """The background releases of ``batch`` are written (or failed): wake who waits."""
        for lease, _, _ in batch:
            if lease.released is not None:
                lease.released.set()
            if self._pending_releases.get(lease.invocation_id) is lease:
                del self._pending_releases[lease.invocation_id]

    async def wait_released(self, invocation_id: str) -> None:
        """Wait until the lease of an invocation given back in the background is written.

        Returns at once when none of it is pending. Whoever moves the row of an
        invocation that a run of this runtime just stopped driving (an approval, a
        cancel) waits for it first: else it finds the row still claimed, and that
        release then leaves the row as the run left it. A release that failed waits for
        the next heartbeat (:meth:`rest_unreleased_as`).

        Cancellation: a checkpoint while it waits; the release is written regardless.
        """
        lease = self._pending_releases.get(invocation_id)
        if lease is not None and lease.released is not None:
            await lease.released.wait()

    def rest_unreleased_as(
        self, invocation_id: str, status: QueueStatus, *, only_from: Sequence[QueueStatus]
    ) -> bool:
        """Have a release of an invocation that failed leave its row ``status`` when retried.

        Only a release that would have left the row in one of ``only_from``: the
        invocation moved on since (an approval made it runnable, a cancel ended it).
        Returns whether there was one.
        """
        item = self._unreleased.get(invocation_id)
        if item is None or item[1].status not in only_from:
            return False
        self._unreleased[invocation_id] = (item[0], Release(status=status), None)
        return True

    async def release(self, lease: HeldLease, release: Release, note: str | None = None) -> None:
        """Give a lease back (bounded, shielded); a failure leaves it to expire."""
        self._drop(lease)
        await self._release_all([(lease, release, note)])

    async def _release_all(self, batch: list[_Release]) -> None:
        """Give leases back (bounded, shielded); those that fail wait for the next heartbeat."""
        with trio.move_on_after(10, shield=True):
            try:
                released = await self._give_back(batch)
            except QueueBusyError:
                log.debug(
                    "the store is down: %d lease(s) (the first: %s) not given back now; tried "
                    "again at the next heartbeat (else they run out in %g s)",
                    len(batch),
                    batch[0][0].invocation_id,
                    self.lease_s,
                )
                for item in batch:
                    self._unreleased[item[0].invocation_id] = item
                return
            except Exception as error:
                if not self.outages.failed("giving back leases", error):
                    self.outages.throttle.caught(
                        log,
                        BackgroundLoop.LEASE_RELEASE,
                        error,
                        "cannot release %d lease(s) (the first: %s); tried again at the next "
                        "heartbeat (else they expire in %g s)",
                        len(batch),
                        batch[0][0].invocation_id,
                        self.lease_s,
                    )
                for item in batch:
                    self._unreleased[item[0].invocation_id] = item
                return
            self.outages.answered()
            for lease, _, _ in batch:
                if lease.invocation_id not in released:
                    log.info(
                        "the lease of %s was no longer held at release",
                        lease.invocation_id,
                        extra=fields(invocation_id=lease.invocation_id, epoch=lease.epoch),
                    )

    async def _give_back(self, batch: list[_Release]) -> set[str]:
        """Release the leases, in one transaction (not flushed); the ids released.

        Raises:
            QueueBusyError: the store is down and the write would wait; nothing written.
        """
        released: set[str] = await self._write_unless_down(
            self.queue.release_many,
            [(lease.invocation_id, lease.epoch, release, note) for lease, release, note in batch],
            holder=self.holder,
        )
        return released

    async def _write_unless_down(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A write nothing must wait for (a release, a deregistration), bounded while down.

        While the store is down (the last thing tried on it failed: a commit, a renewal)
        the write is tried once at once on SQLite, without waiting for the lock: each
        would otherwise wait the store's whole lock timeout, one after the other, before
        a run's outcome is answered. Leases not given back run out
        within ``lease_s``, a holder's row once its heartbeat is that old.

        Raises:
            QueueBusyError: the store is down and the write would have to wait for
                SQLite's lock; nothing written.
        """
        if not self.outages.down or not self.queue.writes_at_once:
            # PostgreSQL: a connection of the pool may be stale after a restart, and the
            # next try on a new one works; a server still down answers within the URL's
            # connect_timeout.
            return await self._call_quick(fn, *args, **kwargs)
        return self.queue.at_once(partial(fn, *args, **kwargs))

    async def _retry_releases(self) -> None:
        if not self._unreleased:
            return
        batch = list(self._unreleased.values())
        await self._give_back(batch)
        for lease, _, _ in batch:
            self._unreleased.pop(lease.invocation_id, None)

    def _drop(self, lease: HeldLease) -> None:
        """Stop renewing ``lease`` (not a newer lease of the same invocation)."""
        if self.held.get(lease.invocation_id) is lease:
            del self.held[lease.invocation_id]

    def forget(self, lease: HeldLease) -> None:
        """Stop renewing a lease that was lost (another holder owns the row)."""
        self._drop(lease)

    async def run_heartbeat(
        self, *, task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Renew every held lease each third of a lease; mark those found taken over lost.

        Beats keep their cadence however long one takes (a renewal of thousands of
        leases on a busy process takes seconds); one that ends late is followed at once.
        """
        with trio.CancelScope() as scope:
            task_status.started(scope)
            every = heartbeat_every(self.lease_s)
            due = trio.current_time() + every
            while True:
                await trio.sleep_until(due)
                await self.beat()
                due = max(due + every, trio.current_time())

    async def beat(self) -> None:
        """One heartbeat: renew the held leases (and reap gone holders, for a worker)."""
        if not self.held and not self._registered and not self._unreleased:
            return
        sent = time.monotonic()
        try:
            await self.register()
            with contextlib.suppress(QueueBusyError):  # store down: the renewal below asks
                await self._retry_releases()
            leases = list(self.held.values())
            kept = await self.call(
                self.queue.renew,
                holder=self.holder,
                leases=[(lease.invocation_id, lease.epoch) for lease in leases],
                lease_s=self.lease_s,
            )
            if self.reap:
                reaped = await self.call(self.queue.reap, is_gone)
                if reaped:
                    log.warning(
                        "holders gone, their leases expired: %s",
                        ", ".join(reaped),
                        extra=fields(holder=self.holder),
                    )
        except Exception as error:
            self._failures += 1
            if not self.outages.failed("renewing leases", error):
                self.outages.throttle.caught(
                    log,
                    BackgroundLoop.HEARTBEAT,
                    error,
                    "cannot renew %d lease(s) (%d failed heartbeats); no call starts on a "
                    "lease that may have run out",
                    len(self.held),
                    self._failures,
                )
            return
        self._failures = 0
        self.outages.answered()
        assert self.holder_state is not None
        self.holder_state.renewed_at = sent
        for lease in leases:
            if lease.invocation_id in kept:
                lease.valid_until = sent + self.lease_s
            elif self.held.get(lease.invocation_id) is lease:
                lease.lost = True
                log.warning(
                    "the lease of %s (epoch %d) was taken over; its run stops at its next step",
                    lease.invocation_id,
                    lease.epoch,
                    extra=fields(
                        invocation_id=lease.invocation_id, holder=self.holder, epoch=lease.epoch
                    ),
                )


@dataclass(frozen=True)
class LeaseHolder:
    """How a runtime holds leases: as a run (the default) or as a worker serving agents."""

    kind: HolderKind = HolderKind.RUN
    agents: tuple[str, ...] = ()
    """The agents a worker serves (shown by ``loop-actors workers``)."""
    concurrency: int = 1
    """How many invocations it drives at once, at most."""
    reap: bool = False
    """Whether it expires the leases of holders that died on its machine (workers do)."""
