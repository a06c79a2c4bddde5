"""The Runtime: opens the store, runs the Journal, and drives controllers."""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

import trio
from pydantic import JsonValue

from aggregates.fork import ForkPoint, ForkWrites
from aggregates.invocation import Invocation, InvocationEvent
from aggregates.lease import DEFAULT_LEASE_S, HolderKind, check_lease_s
from aggregates.rate_limits import RateLimit
from aggregates.revalidation import MalformedValueError, revalidated
from aggregates.schedules import (
    CatchUp,
    Overlap,
    Schedule,
    ScheduleSpecError,
    check_schedule_name,
    new_schedule,
    parse_timing,
    paused,
    resumed,
    scheduled_invocation_id,
)
from loop_actors._errors import (
    RuntimeBusyError,
    ScheduleError,
    ScheduleExistsError,
    ScheduleNotFoundError,
    UsageError,
    single_exception,
)
from loop_actors._logs import package_logger
from loop_actors._statistics import (
    ErrorSeen,
    RunCounters,
    RuntimeStatistics,
    error_seen,
    later,
)
from loop_actors.agent.agent import Agent
from loop_actors.agent.mcp import open_mcp_sessions
from loop_actors.audit.checkpointer import Checkpointer, CheckpointSettings
from loop_actors.runtime.arguments import StartRequest, check_invocation_id, check_texts
from loop_actors.runtime.decisions import HumanDecisions, ResolvedEffect
from loop_actors.runtime.driver import CancelResult, Driver
from loop_actors.runtime.fork import Forked, check_fork_arguments, parse_writes
from loop_actors.runtime.fork import fork as fork_invocation
from loop_actors.runtime.gc_policy import GcHold, GcPolicy
from loop_actors.runtime.handoffs import follow_handoffs
from loop_actors.runtime.leases import LeaseHolder, LeaseKeeper, new_holder_id
from loop_actors.runtime.outcome import Outcome
from loop_actors.runtime.quota import SharedQuota, check_rate_limits
from loop_actors.runtime.reconcile_sweep import (
    NeedsPerson,
    ReconcileReport,
    ReconcileSweep,
    unaskable_reason,
)
from loop_actors.runtime.replay import (
    ReplayClock,
    ReplayFilter,
    ReplayMatch,
    ReplayReport,
    replay_all,
)
from loop_actors.runtime.resources import (
    Resources,
    ResourceSettings,
    abandon,
    close_when_collected,
    open_resources,
)
from loop_actors.runtime.slots import DEFAULT_WORK_SLOTS, WorkSlots
from loop_actors.runtime.submission import (
    DEFAULT_SUBMIT_CHUNK,
    ChunkDone,
    Submission,
    check_chunk_size,
    submission_requests,
)
from loop_actors.store.queue import WorkQueue
from loop_actors.store.reader import StoreReader
from loop_actors.store.secrets import SecretStore
from loop_actors.store.url import StoreUrl, resolve_db_url
from loop_actors.store.views import (
    FOLLOW_RETRY_FIRST_S,
    FOLLOW_RETRY_MAX_S,
    FollowerHealth,
    ReadModelsStatus,
    run_projection_follower,
)
from loop_actors.telemetry import current_trace_parent
from projections import ProjectionRunner

if TYPE_CHECKING:
    from loop_actors.audit.resume_check import CheckedLog

T = TypeVar("T")

log = package_logger(__name__)


def _utc_now() -> datetime:
    return datetime.now(UTC)


async def _run_in(scope: trio.CancelScope, run: Callable[[], Awaitable[object]]) -> None:
    """Run ``run()`` inside ``scope`` (a task started with ``start_soon``, stopped by the scope)."""
    with scope:
        await run()


class Runtime:
    """Runs agents against an event store.

    ``Runtime(url)`` is cheap and does no I/O. Use ``async with runtime:`` to
    share one store and one Journal (group commit) between many concurrent
    runs. A call outside that block (``await runtime.run(...)``, or ``run_sync``,
    the blocking form for scripts) opens the store at the runtime's first call and
    keeps it for the next, until :meth:`close` (or the end of ``with runtime:``, the
    runtime's collection, interpreter exit). One call at a time: a call from another
    thread meanwhile raises :class:`RuntimeBusyError`.
    """

    def __init__(
        self,
        db_url: str | None = None,
        *,
        now: Callable[[], datetime] = _utc_now,
        follow_projections: bool = False,
        views: str | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        checkpoint_key: str | os.PathLike[str] | None = None,
        checkpoint_every: int | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        gc_policy: GcPolicy | None = None,
        work_slots: int | None = DEFAULT_WORK_SLOTS,
        rate_limits: Sequence[RateLimit] = (),
    ) -> None:
        """Prepare a runtime on ``db_url`` (default: ``$LOOP_ACTORS_DB`` or ``sqlite:///loop-actors.db``).

        With ``checkpoint_dir`` (default ``$LOOP_ACTORS_CHECKPOINT_DIR``) the runtime
        writes checkpoints of the store's log there while it is open: after each
        commit that ends a run (terminated or paused), after every ``checkpoint_every``
        commits otherwise (default ``$LOOP_ACTORS_CHECKPOINT_EVERY``, else 100), and
        when it closes; each names the one before, and is signed with the private key
        file ``checkpoint_key`` (default ``$LOOP_ACTORS_CHECKPOINT_KEY``) when one is
        given. See docs/how-to/keep-checkpoints-outside-the-store.md.

        ``lease_s``: how long the lease on an invocation this runtime drives lasts
        without a heartbeat (renewed every third of it); another process may take the
        invocation over once it ran out.

        ``gc_policy``: how Python's cyclic garbage collector runs while the runtime is
        open (default ``$LOOP_ACTORS_GC``, else ``GcPolicy.HOSTING``: thresholds raised
        so that it runs several hundred times less often, put back when the runtime
        closes; ``GcPolicy.UNCHANGED`` leaves them alone).

        ``work_slots``: at most this many of its runs do the runtime's own part of a
        turn at once (deciding, committing, handing out calls; default 128, ``None``
        for no limit); the others wait in order, runs back from their tools first. A
        run waiting for its model, tools, policy or verifier holds no slot. With
        thousands of runs in flight this finishes a turn that has begun before starting
        another, so that the runs do not stay bunched (docs/explanation/work-slots.md).

        ``rate_limits``: what the providers allow, per ``(provider, model)``
        (:class:`RateLimit`). Their state is kept in the store, so every run of every
        runtime and worker on it shares them: each model call of a model adapter for
        that provider and model waits for its quota before it is sent
        (docs/how-to/share-rate-limits-across-workers.md).

        Raises:
            StoreUrlError: the URL is malformed.
            UsageError: ``checkpoint_every`` is not a whole number of at least 1, or a
                checkpoint key or interval is given without a directory; ``lease_s``
                is not a number of seconds, at least 1; ``gc_policy`` (or
                ``$LOOP_ACTORS_GC``) names no policy; ``work_slots`` is not a whole
                number of at least 1 (or None); ``rate_limits`` holds something that
                is not a ``RateLimit``, or two for one model.
        """
        self.rate_limits = check_rate_limits(rate_limits)
        """The shared rate limits, by ``(provider, model)``."""
        self.quota: SharedQuota | None = None
        """The shared rate limits' gate while the runtime is open with some (else None)."""
        self.db_url = resolve_db_url(db_url)
        StoreUrl.parse(self.db_url)
        self.checkpoints = CheckpointSettings.resolve(
            checkpoint_dir, checkpoint_key, checkpoint_every
        )
        """Where checkpoints are written (None: nowhere)."""
        self.checkpointer: Checkpointer | None = None
        self._checked_log: CheckedLog | None = None
        """The newest checkpoint a resume found the log to agree with (``check_before_resume``)."""
        """The checkpoint writer, while the runtime is open with checkpoints."""
        problem = check_lease_s(lease_s)
        if problem is not None:
            raise UsageError(problem)
        self.lease_s = float(lease_s)
        self.gc_policy = GcPolicy.resolve(gc_policy)
        """How the garbage collector runs while the runtime is open."""
        self.work_slots = None if work_slots is None else WorkSlots(work_slots)
        """The runs' work slots (None: no limit)."""
        self.holder = LeaseHolder()
        """How this runtime holds leases (a ``Worker`` sets its own before opening it)."""
        self.holder_id = new_holder_id(HolderKind.RUN)
        """This runtime's name as a lease holder (``kind:host:pid:random``)."""
        self._now = now
        self._exit_stack: AsyncExitStack | None = None
        """What stops the running call's parts (or the ``async with`` block's); else None."""
        self._driver: Driver | None = None
        """What the open runtime drives invocations with; None while closed."""
        self._resources: Resources | None = None
        """What stays open between calls (the store, the queue...); None until the first."""
        self._finalizer: weakref.finalize[..., None] | None = None
        """Closes ``_resources`` when this runtime is collected, or at interpreter exit."""
        self._busy = threading.Lock()
        """Held by the one call (or ``async with`` block) that uses the runtime now."""
        self._owner: int | None = None
        """The thread that holds ``_busy``."""
        self._busy_with = ""
        """That thread's name, for the error a call from another thread gets."""
        self._pid = os.getpid()
        """The process the runtime's resources belong to (a forked child opens its own)."""
        self._secrets = SecretStore()
        """Real values of redacted data that paused runs still need (see ``_secrets``)."""
        self.follow_projections = follow_projections
        self.views = views
        self.projections: ProjectionRunner | None = None
        """The read models, while the runtime is open with ``follow_projections=True``."""
        self._read_models: FollowerHealth | None = None
        """What the read models' follower last saw, while it runs."""
        self._runs = RunCounters()
        """Its drives, counted across its opens (``statistics()``)."""
        self._sleeping = 0
        """Invocations :meth:`resume_when_due` waits for now."""
        self._last_error: ErrorSeen | None = None
        """The last error caught while it was open before (``statistics()`` once closed)."""

    # ----------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Runtime:
        """Open the store and start the Journal; closed again, all of it, on exit.

        What a runtime kept open from earlier calls (``run_sync``) is used, and closed
        on exit too.

        Raises:
            StoreUnavailableError: the database cannot be opened.
            RuntimeBusyError: a call of this runtime runs in another thread.
            UsageError: the runtime is already open (``async with`` inside ``async with``).

        Cancellation: a checkpoint; cancelled while opening, whatever was opened
        is closed again and nothing is recorded.
        """
        if self._exit_stack is not None and self._owner == threading.get_ident():
            raise UsageError("this runtime is already open")
        await self._open_call()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the Journal (after it answered every commit) and close the store.

        Cancellation: the Journal's shutdown is shielded (every commit handed to it
        is answered); the background tasks are cancelled.
        """
        if self._exit_stack is None:
            return
        await self._close_call(exc_type, exc, tb, keep=False)

    def __enter__(self) -> Runtime:
        """Open the store for the ``with`` block's calls (``run_sync`` and the other blocking ones).

        Raises:
            StoreUnavailableError: the database cannot be opened.
            RuntimeBusyError: a call of this runtime runs in another thread.
        """
        self.open_sync()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close what the runtime kept open: :meth:`close`."""
        self.close()

    def open_sync(self) -> None:
        """Open the store now (blocking) rather than at the first call; nothing if it is open.

        Raises:
            StoreUnavailableError: the database cannot be opened.
            RuntimeBusyError: a call of this runtime runs in another thread.
        """
        self._claim()
        try:
            self._kept_resources()
        finally:
            self._release()

    def close(self) -> None:
        """Close what the runtime kept open between calls (blocking); it opens again when used.

        Deregisters its lease holder, stops the checkpoint writer (writing a last
        checkpoint), closes the work queue, the read models and the store. Safe to
        call twice, and on a runtime that never opened. A runtime left open is closed
        when it is garbage collected, or at interpreter exit.

        Raises:
            RuntimeBusyError: a call of this runtime is running (in any thread).
        """
        self._claim()
        try:
            resources, self._resources = self._resources, None
            finalizer, self._finalizer = self._finalizer, None
            if finalizer is not None:
                finalizer.detach()
            if resources is not None:
                resources.close()
        finally:
            self._release()

    def _claim(self) -> None:
        """Take this runtime for a call in this thread, or refuse: one call at a time.

        Raises:
            RuntimeBusyError: a call of this runtime runs (in another thread, or in
                this one: ``close`` or ``with`` inside a call).
        """
        if self._pid != os.getpid():
            self._forget_parent()
        if not self._busy.acquire(blocking=False):
            raise RuntimeBusyError(self._busy_with)
        self._owner = threading.get_ident()
        self._busy_with = threading.current_thread().name

    def _release(self) -> None:
        self._owner = None
        self._busy.release()

    def _forget_parent(self) -> None:
        """In a forked child: drop what the parent opened (never used nor closed here)."""
        if self._resources is not None:
            abandon(self._resources, self._finalizer)
        self._resources, self._finalizer = None, None
        self._exit_stack, self._driver = None, None
        self._busy = threading.Lock()
        self._owner = None
        self._pid = os.getpid()
        self.holder_id = new_holder_id(self.holder.kind)

    def _kept_resources(self) -> Resources:
        """The resources kept open, opened now if there are none (blocking; claimed first)."""
        if self._resources is None or self._resources.closed:
            settings = ResourceSettings(
                db_url=self.db_url,
                follow_projections=self.follow_projections,
                views=self.views,
                checkpoints=self.checkpoints,
                lease_s=self.lease_s,
            )
            resources = open_resources(settings, self._secrets, self.holder_id)
            self._resources = resources
            self._finalizer = close_when_collected(self, resources)
        return self._resources

    async def _open_call(self) -> None:
        """Claim the runtime, open (or reuse) its resources, and start the call's parts.

        Raises:
            RuntimeBusyError: a call of this runtime runs in another thread.
            StoreUnavailableError: the database cannot be opened.

        Cancellation: a checkpoint; cancelled, what this call opened is closed again
        (the resources stay kept, or closed if they were opened by it and failed).
        """
        self._claim()
        opened = False
        try:
            if self._resources is None or self._resources.closed:
                await trio.to_thread.run_sync(self._kept_resources)
                opened = True
            resources = self._resources
            assert resources is not None
            stack = await self._start_call(resources)
        except BaseException:
            try:
                if opened:  # nothing was kept before this call: nothing is kept after it
                    await self._close_resources()
            finally:
                self._release()
            raise
        self._exit_stack = stack

    async def _close_resources(self) -> None:
        """Close what the runtime kept open (shielded: it always finishes)."""
        resources, self._resources = self._resources, None
        finalizer, self._finalizer = self._finalizer, None
        if finalizer is not None:
            finalizer.detach()
        if resources is not None:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(resources.close)

    async def _close_call(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        *,
        keep: bool,
    ) -> None:
        """Stop the call's parts; close the resources too unless ``keep``; release the runtime."""
        stack, self._exit_stack = self._exit_stack, None
        self._last_error = self.statistics().last_error
        driver, self._driver = self._driver, None
        self.quota = None
        self.projections = None
        self._read_models = None
        self.checkpointer = None
        resources = self._resources
        try:
            assert stack is not None
            try:
                await stack.__aexit__(exc_type, exc, tb)
            except BaseExceptionGroup as group:
                # The Journal's nursery wraps whatever the body raised; give the caller
                # the body's own exception rather than a group of one.
                raise single_exception(group) from None
            finally:
                if resources is not None:
                    resources.in_use = False
                    if driver is not None:
                        resources.cancels_seen_to = driver.cancels_seen_to
                    if not keep:
                        await self._close_resources()
        finally:
            self._release()

    async def _start_call(self, resources: Resources) -> AsyncExitStack:
        """Start what one call (or one ``async with`` block) needs on top of the resources.

        The nursery with the heartbeat and the cancel watcher, the reader, the MCP
        sessions, the Journal and the read models' follower are bound to the running
        event loop: each call has its own. Returns the stack that stops them.
        """
        store = resources.store
        if resources.registration.holder != self.holder_id:  # a Worker names its own holder
            await trio.to_thread.run_sync(resources.register_as, self.holder_id)
        resources.registration.expire_if_stale(self.lease_s, time.monotonic())
        stack = AsyncExitStack()
        try:
            resources.in_use = True
            gc_hold = GcHold(self.gc_policy)
            gc_hold.take()
            stack.callback(gc_hold.give_back)  # last: after everything else has closed
            leases = LeaseKeeper(
                resources.queue,
                holder=self.holder_id,
                kind=self.holder.kind,
                lease_s=self.lease_s,
                agents=list(self.holder.agents),
                concurrency=self.holder.concurrency,
                reap=self.holder.reap,
                holder_state=resources.registration,
                shared_outages=resources.outages,
            )
            # After the nursery: the releases written in the background are done by then,
            # and one that failed is tried once more. The holder stays registered: the
            # resources deregister it when they close.
            stack.push_async_callback(partial(leases.aclose, deregister=False))
            nursery = await stack.enter_async_context(trio.open_nursery())
            leases.nursery = nursery
            # Started without waiting for it (its first beat is a third of a lease away):
            # a short call does not pay a pass of the scheduler for it.
            heartbeat = trio.CancelScope()
            nursery.start_soon(_run_in, heartbeat, leases.run_heartbeat)
            stack.callback(heartbeat.cancel)
            committed: trio.MemorySendChannel[None] | None = None
            runner = resources.runner
            if runner is not None:
                # A buffer of one: a pending wake-up already covers every later commit.
                # The Journal closes it when it stops, which ends the follower.
                committed, wake = trio.open_memory_channel[None](1)
                health = FollowerHealth(
                    first_retry_s=FOLLOW_RETRY_FIRST_S, max_retry_s=FOLLOW_RETRY_MAX_S
                )
                await nursery.start(partial(run_projection_follower, runner, wake, health=health))
                self.projections, self._read_models = runner, health
            reads = StoreReader(store)
            stack.push_async_callback(reads.aclose)  # before the store closes: no read left running
            # MCP server sessions (stdio server processes) live as long as the call.
            mcp_sessions = await stack.enter_async_context(open_mcp_sessions())
            checkpointer = resources.checkpointer
            # Ends first on exit: it answers every commit it took (and closes
            # ``committed``, which ends the follower); its thread stays for the next call.
            journal = await stack.enter_async_context(resources.journal.serving(committed))
            quota = SharedQuota(self.rate_limits, leases) if self.rate_limits else None
            driver = Driver(
                store=store,
                journal=journal,
                reads=reads,
                leases=leases,
                mcp=mcp_sessions,
                secrets=self._secrets,
                now=self._now,
                work_slots=self.work_slots,
                runs=self._runs,
                quota=quota,
            )
            # Runs are signalled from the first run on; stopped first when the runtime closes.
            start = resources.cancels_seen_to
            if start is None:  # the first call: it reads where the store's log stands first
                watcher: trio.CancelScope = await nursery.start(driver.run_cancel_watcher)
            else:  # a later call goes on from where the last one's watcher stood
                driver.cancels_seen_to = start
                watcher = trio.CancelScope()
                nursery.start_soon(
                    _run_in, watcher, partial(driver.run_cancel_watcher, start=start)
                )
            stack.callback(watcher.cancel)
        except BaseException:
            self.projections, self._read_models = None, None
            try:
                await stack.aclose()
            finally:
                resources.in_use = False
            raise
        self._driver = driver
        self.quota = quota
        self.checkpointer = checkpointer
        return stack

    def statistics(self) -> RuntimeStatistics:
        """What it drives now and has done since it was made: a frozen snapshot, cheap to take.

        Runs in flight, drives begun and stopped (by reason), leases held, whether the
        store is down, its Journal's statistics (while its store is open, between calls
        too) and the last error one of its tasks or its Journal caught: its class, loop
        and time, never its message (docs/reference/api.md#statistics).
        """
        runs = self._runs
        driver = self._driver
        resources = self._resources
        if resources is not None and resources.closed:
            resources = None
        journal = resources.journal.statistics() if resources is not None else None
        last_error = self._last_error
        if resources is not None:
            last_error = later(
                last_error,
                error_seen(resources.outages.throttle.last_error),
                error_seen(resources.journal.throttle.last_error),
                journal.last_error if journal is not None else None,
            )
        return RuntimeStatistics(
            open=driver is not None,
            runs_in_flight=len(driver.running) if driver is not None else 0,
            runs_started=runs.started,
            runs_resumed=runs.resumed,
            runs_paused=runs.paused,
            runs_ended=runs.ended,
            runs_sleeping=self._sleeping,
            stops_by_reason=dict(runs.stops),
            leases_held=len(driver.leases.held) if driver is not None else 0,
            quota=self.quota.statistics() if self.quota is not None else None,
            store_down=resources.outages.down if resources is not None else False,
            journal=journal,
            last_error=last_error,
        )

    def read_models_status(self) -> ReadModelsStatus | None:
        """Where the followed read models stand; None unless open with ``follow_projections``.

        A read model that fails (raises on an event; its database is full) never ends
        a run: the follower logs it, keeps the read models at their last good
        position, reports them ``stale`` here, and tries again with a bounded backoff
        until they catch up (docs/how-to/supervise-read-models.md).
        """
        return None if self._read_models is None else self._read_models.status

    # ----------------------------------------------------------------- runs

    async def run(
        self,
        agent: Agent,
        goal: str,
        *,
        invocation_id: str | None = None,
        task_class: str | None = None,
        actor: str | None = None,
        tenant: str | None = None,
    ) -> Outcome:
        """Start an invocation of ``agent`` on ``goal`` and drive it to a pause or an end.

        ``actor`` and ``tenant`` are recorded and given to the agent's policy.
        ``invocation_id`` lets the caller choose the id. Starting an id that
        already exists never starts a second invocation: if it stopped with the
        same goal, its recorded outcome is returned and nothing runs; otherwise
        :class:`InvocationExistsError` is raised.

        Raises:
            UsageError: a malformed argument (nothing is written), an id in the
                runtime's own namespaces (``cancel:…``, ``eff-…``) or with a
                control character.
            InvocationExistsError: the id is taken by another goal or a run that has not stopped.
            StoreUnavailableError: the database cannot be opened.

        Cancellation: cancelling the calling scope records the invocation as
        ``cancelled`` (unfinished calls get ``cancelled`` results) and re-raises.
        """
        request = StartRequest(
            agent=agent,
            goal=goal,
            invocation_id=invocation_id,
            task_class=task_class,
            actor=actor,
            tenant=tenant,
            trace_parent=current_trace_parent(),
        )
        request.check("run")

        async def start(driver: Driver) -> Outcome:
            outcome = await driver.start(request=request)
            return await follow_handoffs(driver, outcome, agent)

        return await self.with_driver(start)

    async def resume(
        self,
        invocation_id: str,
        agent: Agent,
        *,
        allow_catalogue_change: bool = False,
        allow_settings_change: bool = False,
        take_over: bool = False,
    ) -> Outcome:
        """Continue an invocation from its committed events, after a crash or a pause.

        The resume holds the invocation's lease while it drives it. While another
        process holds a live lease on it (a worker, or a run still going), the resume
        is refused with :class:`LeaseHeldError`, unless ``take_over``: then the
        holder is fenced off (``LeaseAcquired`` is recorded, so its next append is
        refused and it stops ``lease_lost``). A holder whose process is gone from this
        machine is taken over at once.

        A run that stopped ``checkpoint_failed`` recorded nothing after its last
        commit, so it is resumed like one that crashed there.

        What happens depends on what was last committed (DESIGN.md, Resume):
        after ``InvocationStarted`` or ``ResultsCommitted`` the model is asked
        again; after ``BatchDispatched`` without results the reads run again and
        each write is settled through the effect ledger and its service
        (committed: its receipt; rejected: an error; not found: dispatched again
        with the same effect key; unreachable: paused ``reconciliation_required``);
        a terminated invocation returns its outcome and nothing runs; one paused
        for approval or clarification returns its pause.

        Raises:
            InvocationNotFoundError: no such invocation.
            UsageError: ``agent`` is not the agent that started it.
            LeaseHeldError: another process holds a live lease on it (nothing ran).
            CatalogueChangedError: a tool it used was removed or its schema changed,
                unless ``allow_catalogue_change``.
            SettingsChangedError: the agent's approval rules changed, unless
                ``allow_settings_change``.
            InconsistentHistoryError: the effect ledger holds writes that no stored
                dispatched batch of the invocation names (its history was cut), its
                history ends with a decision always stored with what follows it, its
                stored events cannot be replayed (rows deleted from the middle, an
                event its transitions refuse), or a stored snapshot of it differs
                from the replay of its events (forged); nothing runs.
            UnreadableEventError: one of its stored rows cannot be read (its topic
                names no loop-actors event class, or its state does not decode);
                nothing runs.

        The budget (its deadline included) and the settings recorded when the
        invocation started are followed, whatever ``agent`` says now: the agent
        gives the model, the tools, the verifier and the policy. With
        ``allow_settings_change`` the agent's current budget and settings are
        used from now on, and ``SettingsChanged`` records it.

        Cancellation: as :meth:`run`.
        """
        if not isinstance(agent, Agent):
            raise UsageError(f"resume() needs an Agent, got {type(agent).__name__}")
        resume = partial(
            Driver.resume,
            invocation_id=invocation_id,
            agent=agent,
            allow_catalogue_change=allow_catalogue_change,
            allow_settings_change=allow_settings_change,
            take_over=take_over,
        )

        async def resume_and_follow(driver: Driver) -> Outcome:
            if self.checkpoints is not None:
                await self._check_against_checkpoints(driver, invocation_id, self.checkpoints)
            return await follow_handoffs(driver, await resume(driver), agent)

        return await self.with_driver(resume_and_follow)

    async def resume_when_due(
        self,
        invocation_id: str,
        agent: Agent,
        *,
        allow_catalogue_change: bool = False,
        allow_settings_change: bool = False,
        take_over: bool = False,
    ) -> Outcome:
        """:meth:`resume`, and while the invocation sleeps, wait in this process and wake it.

        For a runtime in one process with no worker: each time the drive ends
        ``sleeping`` (or ``rate_limited``: it waits for quota), it sleeps (trio's clock)
        until ``wake_at`` by the runtime's ``now``, then resumes, which records the wake
        and drives it on; it returns the first outcome that is not a sleep. The
        invocation stays durable meanwhile: if this process dies, a worker (or a later
        ``resume``) wakes it when it is due. This process holds no lease while it waits:
        a worker may take the invocation when it is due (this resume then finds it
        driven, or raises ``LeaseHeldError``), and a ``wake`` from another process is
        driven on by a worker or a ``resume``, not by this wait (which ends at
        ``wake_at``).

        Raises:
            As :meth:`resume`.

        Cancellation: a checkpoint; cancelled while it waits, nothing is recorded (the
        invocation still sleeps).
        """
        while True:
            outcome = await self.resume(
                invocation_id,
                agent,
                allow_catalogue_change=allow_catalogue_change,
                allow_settings_change=allow_settings_change,
                take_over=take_over,
            )
            if outcome.wake_at is None:  # not asleep (sleeping, or rate_limited)
                return outcome
            invocation_id = outcome.invocation_id
            left = (outcome.wake_at - self._now()).total_seconds()
            self._sleeping += 1
            try:
                await trio.sleep(max(0.0, left))
            finally:
                self._sleeping -= 1

    async def wake(self, invocation_id: str, *, by: str | None = None) -> bool:
        """Wake a sleeping invocation now: :meth:`HumanDecisions.wake` (True: it was early)."""
        return await self._decisions().wake(invocation_id, by=by)

    async def _check_against_checkpoints(
        self, driver: Driver, invocation_id: str, settings: CheckpointSettings
    ) -> None:
        """A resume of a runtime given checkpoints checks the invocation against them first.

        Raises:
            InconsistentHistoryError: a chain of its tree is broken, or the store does
                not agree with the checkpoints (``check_before_resume``); nothing runs.
        """
        from loop_actors.audit.resume_check import check_before_resume  # noqa: PLC0415

        self._checked_log = await driver.reads.call(
            partial(check_before_resume, driver.store, invocation_id, settings, self._checked_log)
        )

    def _decisions(self) -> HumanDecisions:
        # Made for each call, not kept: a runtime that referred to itself would be freed
        # only by the cycle collector, and it closes what it kept open when it is freed.
        return HumanDecisions(self, self._now)

    async def approve(
        self, invocation_id: str, *, digest: str, by: str, note: str | None = None
    ) -> None:
        """Approve the batch an invocation paused for: :meth:`HumanDecisions.approve`."""
        await self._decisions().approve(invocation_id, digest=digest, by=by, note=note)

    async def deny(self, invocation_id: str, *, by: str, reason: str) -> None:
        """Deny the batch an invocation paused for: :meth:`HumanDecisions.deny`."""
        await self._decisions().deny(invocation_id, by=by, reason=reason)

    async def clarify(self, invocation_id: str, *, answer: str, by: str | None = None) -> None:
        """Answer the question an invocation paused with: :meth:`HumanDecisions.clarify`."""
        await self._decisions().clarify(invocation_id, answer=answer, by=by)

    async def resolve_effect(
        self,
        effect_key: str,
        *,
        committed: bool = False,
        rejected: bool = False,
        receipt: JsonValue = None,
        reason: str | None = None,
        by: str,
        agent: Agent | None = None,
    ) -> ResolvedEffect:
        """Settle an open effect by hand: :meth:`HumanDecisions.resolve_effect`."""
        return await self._decisions().resolve_effect(
            effect_key,
            committed=committed,
            rejected=rejected,
            receipt=receipt,
            reason=reason,
            by=by,
            agent=agent,
        )

    async def reconcile(
        self, agent: Agent, *, invocation_ids: Collection[str] | None = None
    ) -> ReconcileReport:
        """Sweep the effect ledger for ``agent``'s invocations: :meth:`ReconcileSweep.run`.

        ``invocation_ids``: only these of them (None: all).
        """
        return await ReconcileSweep(self).run(agent, invocation_ids=invocation_ids)

    def cancel(self, invocation_id: str, *, detail: str | None = None) -> bool:
        """Ask a run of this runtime to stop; it ends ``cancelled`` and starts no new call.

        In-process only and not recorded; :meth:`request_cancel` records the request
        so that a run in any process (or a later resume) honours it.
        Returns False when no run of that id is in progress here.
        """
        return self._driver is not None and self._driver.cancel(invocation_id, detail=detail)

    def resume_sync(
        self,
        invocation_id: str,
        agent: Agent,
        *,
        allow_catalogue_change: bool = False,
        allow_settings_change: bool = False,
        take_over: bool = False,
    ) -> Outcome:
        """Blocking :meth:`resume` for scripts (starts its own trio event loop).

        A Ctrl-C stops it with ``KeyboardInterrupt`` (delivered at a checkpoint of
        the run, never inside a tool's or model's code).
        """
        return trio.run(
            partial(
                self.resume,
                invocation_id,
                agent,
                allow_catalogue_change=allow_catalogue_change,
                allow_settings_change=allow_settings_change,
                take_over=take_over,
            ),
            restrict_keyboard_interrupt_to_checkpoints=True,
        )

    def run_sync(
        self,
        agent: Agent,
        goal: str,
        *,
        invocation_id: str | None = None,
        task_class: str | None = None,
        actor: str | None = None,
        tenant: str | None = None,
    ) -> Outcome:
        """Blocking :meth:`run` for scripts (starts its own trio event loop).

        A Ctrl-C stops it with ``KeyboardInterrupt`` (delivered at a checkpoint of
        the run, never inside a tool's or model's code).
        """
        return trio.run(
            partial(
                self.run,
                agent,
                goal,
                invocation_id=invocation_id,
                task_class=task_class,
                actor=actor,
                tenant=tenant,
            ),
            restrict_keyboard_interrupt_to_checkpoints=True,
        )

    async def request_cancel(
        self, invocation_id: str, *, by: str | None = None, reason: str | None = None
    ) -> CancelResult:
        """Record a cancel request (``CancelRequested``) that every worker honours.

        A run in this runtime stops at once; a run in another process notices
        within about a second (its runtime watches for requests); an invocation
        that is paused is ended here (``cancelled``); one that is not running
        anywhere ends ``cancelled`` when it is resumed. In-flight writes finish or
        are marked ``outcome_unknown``; no new call starts.

        Raises:
            InvocationNotFoundError: no such invocation.
            StoreUnavailableError: the request (or the end of a paused invocation)
                could not be committed; asking again is safe.

        Cancellation: a checkpoint before the request is handed to the Journal;
        after that it is waited for. Cancelled, the request is recorded or not;
        asking again is safe (a request already recorded is not recorded twice).
        """
        check_texts(by=by, reason=reason)
        return await self.with_driver(
            partial(Driver.request_cancel, invocation_id=invocation_id, by=by, reason=reason)
        )

    @property
    def store_id(self) -> str | None:
        """The identity of the open store (a UUID created with it); None while closed."""
        return self._driver.store.store_id if self._driver is not None else None

    @property
    def running(self) -> Sequence[str]:
        """The ids of invocations this runtime is driving now."""
        return list(self._driver.running) if self._driver is not None else []

    # ----------------------------------------------------------------- reads

    async def history(self, invocation_id: str) -> list[InvocationEvent]:
        """Every committed event of an invocation, in order.

        Raises:
            InvocationNotFoundError: no such invocation.
            UnreadableEventError: one of its stored rows cannot be read.

        Cancellation: a checkpoint; the read's thread is abandoned (nothing changes).
        """
        return await self.with_driver(lambda driver: driver.reads.events(invocation_id))

    async def load(self, invocation_id: str) -> Invocation:
        """The invocation as its committed events make it.

        Raises:
            InvocationNotFoundError: no such invocation.

        Cancellation: a checkpoint; the read's thread is abandoned (nothing changes).
        """
        return await self.with_driver(lambda driver: driver.reads.invocation(invocation_id))

    # ----------------------------------------------------------------- replay

    async def replay(
        self,
        agent: Agent,
        invocation_ids: Sequence[str] = (),
        *,
        every: bool = False,
        where: ReplayFilter | None = None,
        match: ReplayMatch | str = ReplayMatch.STRICT,
        assume_approved: bool = False,
        check: bool = False,
        into: str = "memory://",
    ) -> ReplayReport:
        """Re-drive recorded invocations of this store under ``agent``; report each departure.

        Each invocation is driven again in a store of its own (``into``, an empty
        store: ``memory://`` by default), under ``agent`` (the same tools by name;
        its budget, policies, approval rules, verifier and compaction may differ), by
        a model that answers the recorded decisions and tools that answer the recorded
        results: no model, tool function or service is called, and nothing is written
        to this store. The recorded approvals, denials and answers are given again;
        with ``assume_approved``, a batch that waits for approval only in the replay is
        approved too, to show what comes after. ``every``: every invocation of the
        store (oldest first), else ``invocation_ids``; ``where`` keeps those that meet
        its conditions. ``check`` (``replay --check`` in CI): ``agent`` is the unchanged
        agent, and a recorded tool removed or changed, or other settings, are reported
        too. A history that no longer loads is reported (``event_shape``), never
        raised. See docs/explanation/replay.md for what a replay can judge.

        Raises:
            UsageError: no invocation named and not ``every``; ``into`` already holds
                an invocation being replayed; a malformed ``match`` or ``where``.
            InvocationNotFoundError: a named invocation is not in this store.

        Cancellation: a checkpoint; the replay store is closed (a ``memory://`` one is gone).
        """
        if not isinstance(agent, Agent):
            raise UsageError(f"replay() needs an Agent, got {type(agent).__name__}")
        try:
            matching = ReplayMatch(match)
        except ValueError:
            raise UsageError(f"match must be strict or lenient, got {match!r}") from None
        if not every and not invocation_ids:
            raise UsageError("name the invocations to replay, or replay every one")
        if where is not None:
            if not isinstance(where, ReplayFilter):
                raise UsageError(f"where must be a ReplayFilter, got {type(where).__name__}")
            try:  # validated again: one built with model_construct may hold any reason
                where = revalidated(ReplayFilter, where)
            except MalformedValueError as error:
                raise UsageError(f"where is {error}") from None
        ids = list(invocation_ids)
        if every:
            ids = await self.with_driver(
                lambda driver: driver.reads.call(driver.store.invocation_ids)
            )
        clock = ReplayClock(self._now)
        async with Runtime(into, now=clock, gc_policy=GcPolicy.UNCHANGED) as target:
            return await replay_all(
                self.history,
                ids,
                agent,
                target,
                where=where,
                match=matching,
                assume_approved=assume_approved,
                check=check,
                fresh_target=into == "memory://",
                clock=clock,
            )

    # ----------------------------------------------------------------- fork

    async def fork(
        self,
        source_id: str,
        *,
        at_step: ForkPoint,
        by: str,
        reason: str,
        agent: Agent | None = None,
        fork_id: str | None = None,
        writes: ForkWrites | str = ForkWrites.APPROVE,
        run: bool = True,
        take_over: bool = False,
        agent_ref: str | None = None,
    ) -> Forked:
        """Start an invocation as a copy of ``source_id``'s steps 1..``at_step``; go on from there.

        The fork's history is the source's committed events of those steps (decisions,
        batches, results, approvals: nothing is re-executed) after an
        ``InvocationStarted`` whose ``forked_from`` records the source, the step, the
        source's head hash, ``by``, ``reason`` and what changed. It goes on under
        ``agent`` (the source's agent, or a changed one), or, with ``run=False``, is
        queued for a worker serving its agent (or a ``resume``); without ``agent`` it is
        recorded with the source's agent, budget and settings (``run=False`` only).
        ``at_step``: a step number (0: only the goal is kept) or ``"last-failed"`` (the
        step before the last one that failed). The source is only read.

        ``writes``: what a write of the fork that repeats a write the source committed
        after ``at_step`` (the same tool, the same arguments) does: ``approve`` (it
        waits for a person, ``approval_required``, shown the source's step, effect key
        and receipt), ``deny`` (refused, with a result the model sees), ``dedupe``
        (dispatched with the source's effect key: the ledger's receipt is its result,
        the service sees nothing) or ``live`` (a new write under the fork's own key).

        Raises:
            UsageError: a malformed argument (nothing is read or written); ``run``
                without ``agent``.
            InvocationNotFoundError: no invocation ``source_id``.
            ForkRefusedError: the source cannot be forked there (a step past its end,
                nothing failed, a write not settled, a step that ended mid-turn, an
                agent whose budget refuses the copied steps); nothing is written.
            LeaseHeldError: a live process drives the source, unless ``take_over``
                (the fork then copies what was committed; the source is untouched).
            InvocationExistsError: ``fork_id`` is taken.
            InconsistentHistoryError: the source's stored history was cut or forged.
            StoreUnavailableError: the fork cannot be recorded.

        Cancellation: as :meth:`run` once the fork is recorded; before, nothing is written.
        """
        check_fork_arguments(
            source_id, at_step, fork_id=fork_id, by=by, reason=reason, agent=agent, run=run
        )
        chosen = parse_writes(writes)
        return await self.with_driver(
            partial(
                fork_invocation,
                source_id=source_id,
                at_step=at_step,
                agent=agent,
                fork_id=fork_id,
                writes=chosen,
                by=by,
                reason=reason,
                run=run,
                take_over=take_over,
                agent_ref=agent_ref,
            )
        )

    def fork_sync(
        self,
        source_id: str,
        *,
        at_step: ForkPoint,
        by: str,
        reason: str,
        agent: Agent | None = None,
        fork_id: str | None = None,
        writes: ForkWrites | str = ForkWrites.APPROVE,
        run: bool = True,
        take_over: bool = False,
    ) -> Forked:
        """Blocking :meth:`fork` for scripts (starts its own trio event loop)."""
        return trio.run(
            partial(
                self.fork,
                source_id,
                at_step=at_step,
                by=by,
                reason=reason,
                agent=agent,
                fork_id=fork_id,
                writes=writes,
                run=run,
                take_over=take_over,
            ),
            restrict_keyboard_interrupt_to_checkpoints=True,
        )

    # ----------------------------------------------------------------- submission

    async def submit(
        self,
        agent: Agent,
        goal: str,
        *,
        invocation_id: str | None = None,
        task_class: str | None = None,
        actor: str | None = None,
        tenant: str | None = None,
        agent_ref: str | None = None,
    ) -> str:
        """Record a new invocation of ``agent`` as runnable, without running it; return its id.

        Its ``InvocationStarted`` is recorded with the agent's settings, as :meth:`run`
        records it, and the work queue gets a runnable row, which a worker serving
        the agent claims (:class:`loop_actors.Worker`). ``agent_ref`` is the
        ``MODULE:ATTR`` the agent is loaded from, kept with the row for operators.
        Submitting an id that exists for the same goal and agent returns that id and
        records nothing new (a row missing after a crash is added).

        Raises:
            UsageError: a malformed argument (nothing is written).
            InvocationExistsError: the id is taken by another goal or agent.
            StoreUnavailableError: the store cannot be written; submitting again is safe.

        Cancellation: a checkpoint until the start is handed to the Journal; after
        that the commit is waited for. Cancelled, the invocation is recorded or not;
        submitting again with the same id is safe.
        """
        request = StartRequest(
            agent=agent,
            goal=goal,
            invocation_id=invocation_id,
            task_class=task_class,
            actor=actor,
            tenant=tenant,
            agent_ref=agent_ref,
            trace_parent=current_trace_parent(),
        )
        request.check("submit")
        return await self.with_driver(partial(Driver.submit, request=request))

    async def submit_many(
        self,
        agent: Agent,
        goals: Iterable[str | Submission],
        *,
        agent_ref: str | None = None,
        chunk_size: int = DEFAULT_SUBMIT_CHUNK,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> list[str]:
        """Record many invocations of ``agent`` as runnable; return their ids, in order.

        Each goal is a string or a :class:`Submission` (with its id, task class, actor,
        tenant). Every goal is checked, and every id given looked up, before anything is
        written; then each chunk of ``chunk_size`` goals is one transaction (all of its
        new invocations are recorded, or none). A goal whose id names an invocation of
        the same goal and agent records nothing again (its id is returned): submitting
        the same goals again after a crash submits none of those with an id twice. A
        goal without an id gets a new random one each time. ``on_progress(done,
        total)`` is called after each chunk.

        Raises:
            UsageError: ``agent`` is not an Agent; ``chunk_size`` is not at least 1.
            SubmissionError: a goal is empty or not a goal, holds a value that cannot
                be stored, gives an id another goal gives, or an id that names an
                invocation of another goal or agent (``error.problem`` says which,
                ``error.index`` which goal). Nothing is written, unless the id was
                taken while the submission ran: the chunks before it are recorded.
            StoreUnavailableError: the store cannot be written; the error says how many
                goals were submitted before. Submitting again is safe for goals with ids.

        Cancellation: a checkpoint between chunks; a chunk handed to the Journal is
        waited for. Cancelled, the chunks before it are recorded.
        """
        check_chunk_size(chunk_size)
        requests = submission_requests(agent, goals, agent_ref=agent_ref)

        def progress(chunk: ChunkDone) -> None:
            if on_progress is not None:
                on_progress(chunk.done, chunk.total)

        submitted = await self.with_driver(
            partial(Driver.submit_many, requests=requests, chunk_size=chunk_size, on_chunk=progress)
        )
        return [goal.invocation_id for goal in submitted]

    # ----------------------------------------------------------------- schedules

    async def add_schedule(
        self,
        name: str,
        agent: Agent,
        goal: str,
        *,
        every: str | None = None,
        cron: str | None = None,
        tz: str | None = None,
        overlap: Overlap | str = Overlap.SKIP,
        catch_up: CatchUp | str = CatchUp.ONE,
        agent_ref: str | None = None,
    ) -> Schedule:
        """Add a schedule to the store: a worker serving ``agent`` submits a run at each due time.

        ``every`` (``"30s"``, ``"15m"``, ``"2h"``: the multiples of the interval since
        the epoch, UTC) or ``cron`` (five fields, read in the wall-clock time of ``tz``,
        default UTC); ``overlap`` and ``catch_up`` as ``loop-actors schedule add`` takes
        them (docs/how-to/schedule-an-agent.md). Each run is an invocation of ``goal``
        whose id is ``NAME@TIME`` (its due time, UTC).

        Raises:
            ScheduleError: a bad timing or name (``error.problem`` says which).
            ScheduleExistsError: the store has a schedule of that name.
            UsageError: neither or both of ``every`` and ``cron``; an unknown policy.
            SubmissionError: an empty goal, or one that cannot be stored.

        Cancellation: a checkpoint; cancelled, the schedule is added or not.
        """
        try:
            timing = parse_timing(every=every, cron=cron, tz=tz)
            check_schedule_name(name)
        except ScheduleSpecError as error:
            raise ScheduleError(str(error), error.problem) from None
        except ValueError as error:  # neither or both
            raise UsageError(f"{error}: give every (15m) or cron ('0 9 * * 1-5')") from None
        try:
            overlap, catch_up = Overlap(overlap), CatchUp(catch_up)
        except ValueError as error:
            raise UsageError(
                f"{error} (overlap: {', '.join(Overlap)}; catch_up: {', '.join(CatchUp)})"
            ) from None
        # The goal as each run's: every run is submitted with it.
        first = Submission(goal, invocation_id=scheduled_invocation_id(name, 0))
        submission_requests(
            agent, [first], agent_ref=agent_ref, where=lambda _: "goal", caller="add_schedule"
        )

        def make(now: float) -> Schedule:
            return new_schedule(
                name, agent_name=agent.name, agent_ref=agent_ref, goal=goal, timing=timing,
                now=now, overlap=overlap, catch_up=catch_up,
            )  # fmt: skip

        added = await self._on_queue(lambda queue: queue.add_schedule(make))
        if added is None:
            raise ScheduleExistsError(name)
        return added

    async def schedules(self) -> list[Schedule]:
        """The store's schedules, by name."""
        return await self._on_queue(lambda queue: queue.schedules()[0])

    async def pause_schedule(self, name: str) -> Schedule:
        """Pause a schedule: its due times pass unrun (one paused already stays so).

        Raises:
            ScheduleNotFoundError: the store has no schedule of that name.
        """
        return await self._change_schedule(name, paused)

    async def resume_schedule(self, name: str) -> Schedule:
        """Resume a paused schedule from its next due time on (the missed ones are not run).

        Raises:
            ScheduleNotFoundError: the store has no schedule of that name.
        """
        return await self._change_schedule(name, resumed)

    async def remove_schedule(self, name: str) -> None:
        """Remove a schedule; the invocations it submitted are left as they are.

        Raises:
            ScheduleNotFoundError: the store has no schedule of that name.
        """
        if not await self._on_queue(lambda queue: queue.remove_schedule(name)):
            raise ScheduleNotFoundError(name)

    async def _change_schedule(self, name: str, change: Callable[..., Schedule]) -> Schedule:
        changed = await self._on_queue(
            lambda queue: queue.change_schedule(name, lambda row, now: change(row, now=now))
        )
        if changed is None:
            raise ScheduleNotFoundError(name)
        return changed

    async def _on_queue(self, use: Callable[[WorkQueue], T]) -> T:
        """``use(queue)`` in the queue's thread, with the open (or opened) runtime's queue."""

        async def call(driver: Driver) -> T:
            return await driver.leases.call(use, driver.leases.queue)

        return await self.with_driver(call)

    # ----------------------------------------------------------------- the driver

    async def with_driver(self, use: Callable[[Driver], Awaitable[T]], /) -> T:
        """Await ``use(driver)`` with the open Driver; outside ``async with``, for the one call.

        A runtime not entered with ``async with`` opens its store at its first call and
        keeps it open for the next (see :meth:`close`); the parts bound to the event
        loop (the Journal, the heartbeat...) are started and stopped with each call.

        Raises:
            RuntimeBusyError: a call of this runtime runs in another thread.

        Cancellation: as ``use``; what the call started is stopped again either way.
        """
        if self._driver is None:
            await self._open_call()
            try:
                assert self._driver is not None
                result = await use(self._driver)
            except BaseException as error:
                await self._close_call(type(error), error, error.__traceback__, keep=True)
                raise
            await self._close_call(None, None, None, keep=True)
            return result
        if self._owner != threading.get_ident():
            raise RuntimeBusyError(self._busy_with)
        return await use(self._driver)

    @property
    def driver(self) -> Driver:
        """What the open runtime drives invocations with (the ``Worker`` drives through it).

        Raises:
            UsageError: the runtime is not open.
        """
        if self._driver is None:
            raise UsageError("the runtime is not open")
        return self._driver

    def _lease_keeper(self) -> LeaseKeeper:
        return self.driver.leases

    def _reads(self) -> StoreReader:
        return self.driver.reads

    @property
    def _cancels_seen_to(self) -> int:
        return self.driver.cancels_seen_to


__all__ = [
    "CancelResult",
    "NeedsPerson",
    "ReconcileReport",
    "ResolvedEffect",
    "Runtime",
    "check_invocation_id",
    "unaskable_reason",
]
