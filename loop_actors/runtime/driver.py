"""The Driver: what an open runtime drives invocations with, and how.

A :class:`~loop_actors.runtime.runtime.Runtime` opens the store, the Journal, the
work queue and the rest, and hands them to one ``Driver`` for as long as it stays
open. The Driver takes leases, drives an invocation under its lease to an end or a
pause (a run, a resume, a claim of a worker), and leaves the queue row as the run
ended. The Runtime's public methods and the ``Worker`` go through these methods,
never through the Runtime's private members.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from functools import partial
from typing import Any, Protocol, TypeVar, assert_never

import trio

from aggregates.children import ParentEnd, parent_cancelled
from aggregates.decisions import TerminalReason
from aggregates.invocation import Invocation, Phase
from aggregates.lease import (
    DRAINED,
    RETRY_LATER,
    QueueRow,
    QueueStatus,
    Refuse,
    Release,
    lease_is_live,
    release_after,
    retry_reconciliation,
)
from aggregates.ledger_check import cut_decision_problem
from aggregates.requests import CancelRequest
from aggregates.standing import (
    Standing,
    Stop,
    standing,
    stopped,
    waits_for_person,
    wake_due,
)
from aggregates.turn import cancel_paused
from aggregates.vocabulary import ToolEffect
from loop_actors._errors import (
    InconsistentHistoryError,
    InvocationExistsError,
    InvocationNotFoundError,
    LeaseHeldError,
    StoreUnavailableError,
    SubmissionError,
    SubmissionProblem,
    UsageError,
)
from loop_actors._faults import CrashPoint, fault_point
from loop_actors._logs import BackgroundLoop, fields, package_logger
from loop_actors._messages import CommitFailed, Committed
from loop_actors._statistics import RunCounters
from loop_actors.agent.agent import Agent, SettingsChangedError, check_catalogue
from loop_actors.agent.mcp import McpSessions, using_mcp_sessions
from loop_actors.agent.quota import QuotaGate, using_quota_gate
from loop_actors.agent.tools import using_child_runs
from loop_actors.runtime.arguments import StartRequest, new_invocation, requested_by
from loop_actors.runtime.children import ChildRunner, OfferedChildren
from loop_actors.runtime.controller import Controller, no_children
from loop_actors.runtime.leases import HeldLease, LeaseDrained, LeaseKeeper, is_gone
from loop_actors.runtime.outage import is_outage, one_line
from loop_actors.runtime.outcome import Outcome
from loop_actors.runtime.slots import Slot, WorkSlots
from loop_actors.runtime.submission import (
    AddRows,
    ChunkDone,
    CommitStarts,
    ReadInvocations,
    Stepper,
    SubmissionStep,
    Submitted,
    goal_at,
    submission_steps,
)
from loop_actors.store.journal import Journal
from loop_actors.store.queue import Claimed, NewRow
from loop_actors.store.reader import DriveReads, StoreReader
from loop_actors.store.secrets import SecretStore
from loop_actors.store.store import EventStore
from loop_actors.telemetry import telemetry_on
from loop_actors.telemetry.live import report_drive

log = package_logger(__name__)

T = TypeVar("T")

CANCEL_POLL_S = 0.5
"""How often a runtime looks for cancel requests made by other processes."""

LEASE_RECORD_TRIES = 20
"""How often a takeover tries to record ``LeaseAcquired`` while the previous holder appends."""

LEASE_RECORD_BACKOFF_S = 0.05


class CancelResult(StrEnum):
    """What a cancel request did."""

    SIGNALLED = "signalled"
    """A run in this runtime was told to stop."""
    ENDED = "ended"
    """The invocation was paused: it is now terminated (``cancelled``)."""
    REQUESTED = "requested"
    """Recorded: the worker running it stops within about a second, or a resume ends it."""
    ALREADY_ENDED = "already_ended"
    """It had terminated before: nothing changed."""


class Driver:
    """Drives invocations against one open store: leases, controllers, queue rows.

    Made by ``Runtime.__aenter__`` and dropped when the runtime closes; every
    attribute is open for as long as the Driver exists.
    """

    def __init__(
        self,
        *,
        store: EventStore,
        journal: Journal,
        reads: StoreReader,
        leases: LeaseKeeper,
        mcp: McpSessions,
        secrets: SecretStore,
        now: Callable[[], datetime],
        work_slots: WorkSlots | None,
        runs: RunCounters | None = None,
        quota: QuotaGate | None = None,
    ) -> None:
        """Hold what the runtime opened; count drives in ``runs`` (the Runtime's).

        ``quota``: its shared rate limits, if any.
        """
        self.quota = quota
        self.store = store
        self.journal = journal
        self.reads = reads
        """The reader of the open store."""
        self.leases = leases
        """The lease keeper (and, through it, the work queue)."""
        self.mcp = mcp
        self.secrets = secrets
        """Real values of redacted data that paused runs still need (kept by the Runtime)."""
        self.now = now
        self.work_slots = work_slots
        self.running: dict[str, Controller] = {}
        """The controllers of the invocations driven now, by id."""
        self.cancels_seen_to = 0
        """The store position up to which the cancel watcher has looked for requests."""
        self.runs = runs if runs is not None else RunCounters()
        """How many drives began and how they stopped (``Runtime.statistics()``)."""
        self.offer_children: OfferedChildren | None = None
        """Set by a worker: a child of an agent the workers serve is submitted (runnable,
        for any worker of the store to claim), and driven here only if no worker claimed
        it in time. None: a child is driven by the run that starts it, at once."""
        self.after_handoff: Callable[[Invocation, Agent], Awaitable[None]] | None = None
        """Set by a worker: called with an invocation that ended ``handed_off`` (and its
        agent) before its queue row is left ended, to submit the target (once)."""

    def new_invocation(self, request: StartRequest) -> Invocation:
        """A new invocation as ``request`` asks, its ``InvocationStarted`` pending."""
        return new_invocation(request, at=self.now())

    async def start(self, *, request: StartRequest) -> Outcome:
        """Record a new invocation and drive it under a new lease (``Runtime.run``, checked).

        Raises:
            InvocationExistsError: the id is taken by another goal or a run that has not stopped.
            LeaseHeldError: the id is taken by a run another process drives.
            StoreUnavailableError: the start cannot be recorded.

        Cancellation: as ``Runtime.run``.
        """
        invocation = self.new_invocation(request)
        agent = request.agent
        lease = await self.commit_held_start(invocation, agent.name)
        if isinstance(lease, CommitFailed):
            return await self.existing_outcome(invocation, lease)
        fault_point(CrashPoint.AFTER_START_COMMIT)
        # A new invocation has no earlier cancel request; a later one reaches it through
        # this runtime's watcher.
        return await self.drive_leased(invocation, agent, lease, fresh=True)

    async def commit_held_start(
        self, invocation: Invocation, agent_name: str
    ) -> HeldLease | CommitFailed:
        """Commit a new invocation with its queue row, claimed by this runtime; hold its lease.

        The row (and this process's registration as a holder, if it has none yet) is in
        the transaction of ``InvocationStarted``: a process that dies at any moment after
        leaves a row a worker takes over (``LeaseKeeper.new_row``).

        Cancellation: as ``Journal.commit``: once handed over, the commit is waited for.
        """
        leases = self.leases
        row = leases.new_row(invocation.id, agent_name)
        sent = time.monotonic()
        created = await self.journal.commit(invocation.take_events(), queue_rows=[row])
        if isinstance(created, CommitFailed):
            return created
        return leases.hold_new(row, sent=sent)

    async def resume(
        self,
        *,
        invocation_id: str,
        agent: Agent,
        allow_catalogue_change: bool,
        allow_settings_change: bool,
        take_over: bool,
    ) -> Outcome:
        """Take the lease of a recorded invocation and drive it on (``Runtime.resume``, checked).

        Raises:
            As ``Runtime.resume``.

        Cancellation: as ``Runtime.run``.
        """
        if invocation_id in self.running:
            raise InvocationExistsError(invocation_id, "is already running in this runtime")
        invocation = await self.reads.invocation_to_resume(invocation_id)
        if invocation.agent_name != agent.name:
            raise UsageError(
                f"invocation {invocation_id} was started by agent {invocation.agent_name!r}, "
                f"not {agent.name!r}"
            )
        if await self.standing(invocation) not in (Standing.DRIVABLE, Standing.SLEEPING):
            return Outcome.of(invocation)
        if not allow_catalogue_change:
            check_catalogue(invocation.tools, agent.toolbox)
        invocation, lease = await self.take_lease(invocation, take_over=take_over)
        try:
            self.follow_settings(invocation, agent, allow_change=allow_settings_change)
        except BaseException:
            await self.leases.release(lease, DRAINED)
            raise
        return await self.drive_leased(invocation, agent, lease)

    async def request_cancel(
        self, *, invocation_id: str, by: str | None, reason: str | None
    ) -> CancelResult:
        """Record a cancel request and act on it here (``Runtime.request_cancel``, checked).

        Raises:
            As ``Runtime.request_cancel``.

        Cancellation: as ``Runtime.request_cancel``.
        """
        invocation = await self.reads.invocation(invocation_id)
        stop = stopped(invocation.phase)
        if stop is Stop.ENDED:
            return CancelResult.ALREADY_ENDED
        existing = await self.reads.cancel_request(invocation_id)
        if existing is None:
            request = CancelRequest.record(invocation_id, by=by, reason=reason, at=self.now())
            recorded = await self.journal.commit(request.take_events())
            # A conflict means another process recorded a request first: that one stands.
            if isinstance(recorded, CommitFailed) and not recorded.conflict:
                raise StoreUnavailableError(
                    f"cannot record the cancel request of {invocation_id}: "
                    f"{recorded.error_type}: {recorded.message}; nothing was recorded, ask again"
                )
        if self.cancel(invocation_id, detail=requested_by(by, reason)):
            return CancelResult.SIGNALLED
        if stop is Stop.PAUSED:
            children = children_waited_for(invocation)
            who = f" by {by}" if by else ""
            version_at_start = invocation.version
            cancel_paused(
                invocation,
                f"cancelled{who} while paused" + (f": {reason}" if reason else ""),
                at=self.now(),
            )
            ended = await self.journal.commit(invocation.take_events())
            if isinstance(ended, Committed):
                await self.forget_secrets(invocation_id)
                await self.queue_status(
                    invocation_id,
                    QueueStatus.ENDED,
                    [QueueStatus.PAUSED, QueueStatus.RUNNABLE],
                    invocation.agent_name,
                )
                await self.cancel_children(invocation_id, children, by=by, reason=reason)
                if telemetry_on():  # the end this process committed: a drive of one event
                    await report_drive(self.reads, invocation_id, version_at_start)
                return CancelResult.ENDED
            if not ended.conflict:
                raise StoreUnavailableError(
                    f"the cancel request of {invocation_id} is recorded, but ending it failed: "
                    f"{ended.error_type}: {ended.message}; a resume ends it, or ask again"
                )
            # A conflict: it was resumed meanwhile; that run honours the recorded request.
        return CancelResult.REQUESTED

    async def submit(self, *, request: StartRequest) -> str:
        """Record a new invocation as runnable and queue it (``Runtime.submit``, checked).

        The one goal of a bulk submission (:meth:`submit_many`).

        Raises:
            As ``Runtime.submit``.

        Cancellation: as ``Runtime.submit``.
        """
        try:
            [submitted] = await self.submit_many([request], chunk_size=1, where=lambda _: "submit")
        except SubmissionError as error:
            if error.problem is not SubmissionProblem.ID_TAKEN:
                raise
            raise InvocationExistsError(
                str(request.invocation_id), "already exists for another goal or agent"
            ) from None
        return submitted.invocation_id

    async def submit_many(
        self,
        requests: Sequence[StartRequest],
        *,
        chunk_size: int,
        where: Callable[[int], str] = goal_at,
        on_chunk: Callable[[ChunkDone], None] | None = None,
    ) -> list[Submitted]:
        """Record checked ``requests`` as runnable, a chunk a transaction (``Runtime.submit_many``).

        The plan is :func:`~loop_actors.runtime.submission.submission_steps`; its reads go
        to the reader, its commits (with their queue rows) to the Journal, a row of a goal
        submitted before to the queue.

        Raises:
            As :func:`~loop_actors.runtime.submission.submission_steps`.

        Cancellation: a checkpoint between steps; a chunk handed to the Journal is waited
        for. Cancelled, the chunks before are recorded, the one in hand is recorded or
        not; submitting the same goals again records none of those with an id twice.
        """
        stepper = Stepper(
            submission_steps(requests, chunk_size=chunk_size, now=self.now, where=where)
        )
        while (step := stepper.next()) is not None:
            try:
                stepper.answered(await self._answer_submission(step, on_chunk))
            except StoreUnavailableError as error:
                stepper.failed(error)
        return stepper.result

    async def _answer_submission(
        self, step: SubmissionStep, on_chunk: Callable[[ChunkDone], None] | None
    ) -> Any:
        """Do what a submission's ``step`` asks, with the open runtime's reader, Journal, queue."""
        match step:
            case ReadInvocations(invocation_ids=ids):
                return await self.reads.call(partial(self.store.invocations_of, ids))
            case CommitStarts(events=events, rows=rows):
                created = await self.journal.commit(events, queue_rows=rows)
                if isinstance(created, CommitFailed):
                    if created.conflict:
                        return False
                    raise StoreUnavailableError(
                        f"cannot record the invocations: {created.error_type}: {created.message}"
                    )
                fault_point(CrashPoint.AFTER_SUBMIT_CHUNK_COMMIT)
                return True
            case AddRows(rows=rows):
                await self._add_rows(rows)
                return None
            case ChunkDone():
                if on_chunk is not None:
                    on_chunk(step)
                return None
            case _:
                assert_never(step)

    async def _add_rows(self, rows: list[NewRow]) -> None:
        leases = self.leases
        try:
            await leases.call(leases.queue.enqueue_many, rows)
        except StoreUnavailableError as error:
            raise StoreUnavailableError(
                f"the queue rows of goals submitted before cannot be added ({error}); "
                "submitting them again adds them"
            ) from error

    def cancel(self, invocation_id: str, *, detail: str | None = None) -> bool:
        """Ask a run driven here to stop (``Runtime.cancel``); False when none of that id is."""
        controller = self.running.get(invocation_id)
        if controller is None:
            return False
        controller.request_cancel(detail)
        # Its children driven here end with it (those whose edge says so), and theirs.
        for child in list(self.running.values()):
            link = child.invocation.parent
            if (
                link is not None
                and link.parent_id == invocation_id
                and link.on_parent_end is ParentEnd.CANCEL
            ):
                self.cancel(child.invocation.id, detail=parent_cancelled(invocation_id, detail))
        return True

    async def cancel_children(
        self, parent_id: str, children: list[str], *, by: str | None, reason: str | None
    ) -> None:
        """Cancel the children a paused parent that just ended waited for (and theirs).

        Those whose edge says ``cancel``; a child that ended, or that is not there
        (never started), is left as it is.
        """
        for child_id in children:
            try:
                child = await self.reads.invocation(child_id)
            except InvocationNotFoundError:
                continue
            link = child.parent
            if link is None or link.on_parent_end is not ParentEnd.CANCEL:
                continue
            await self.request_cancel(
                invocation_id=child_id,
                by=by,
                reason=parent_cancelled(parent_id, reason),
            )

    async def standing(self, invocation: Invocation) -> Standing:
        """What can happen next to ``invocation``, looking at the child it waits for.

        An invocation paused for a child (``awaiting_child``) waits for a person while
        the invocation at the end of its path does; once that one was settled (approved,
        denied, answered), a run drives the tree on from the top.
        """
        found = standing(invocation)
        paused = invocation.paused
        if invocation.phase is not Phase.AWAITING_CHILD or paused is None:
            return found
        path = paused.child_path or []
        try:
            waiting = await self.reads.invocation(path[-1])
        except InvocationNotFoundError:
            return Standing.DRIVABLE  # its reconciliation says what became of it
        return Standing.WAITS_FOR_PERSON if waits_for_person(waiting) else Standing.DRIVABLE

    def inherit_cancel(self, controller: Controller) -> None:
        """A child registered after its parent's cancel request starts cancelled.

        Called as the child's run is registered, with no checkpoint between: a cancel
        of the parent either finds the child in ``running`` or is seen here.
        """
        link = controller.invocation.parent
        if link is None or link.on_parent_end is not ParentEnd.CANCEL:
            return
        parent = self.running.get(link.parent_id)
        if parent is not None and parent.cancel_requested:
            controller.request_cancel(parent_cancelled(link.parent_id, parent.cancel_detail))

    async def run_cancel_watcher(
        self,
        *,
        start: int | None = None,
        task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Signal runs driven here whose cancel was requested from another process.

        ``start``: the store position to look from (where the runtime's previous call's
        watcher stood); the store's head when None.

        Cancellation: returns when the scope it hands to ``task_status`` is cancelled.
        """
        reads = self.reads
        failures = 0
        with trio.CancelScope() as scope:
            position = self.cancels_seen_to = await reads.head() if start is None else start
            task_status.started(scope)
            while True:
                await trio.sleep(CANCEL_POLL_S)
                if not self.running:
                    continue
                try:
                    ids, position = await reads.cancel_requests_after(position)
                except Exception as error:
                    failures += 1
                    outages = self.leases.outages
                    if not outages.failed("looking for cancel requests", error):
                        outages.throttle.caught(
                            log,
                            BackgroundLoop.CANCEL_WATCHER,
                            error,
                            "cannot look for cancel requests (%d failed polls); retrying",
                            failures,
                        )
                    continue
                failures = 0
                self.cancels_seen_to = position
                for invocation_id in ids:
                    if invocation_id not in self.running:
                        continue
                    request = await reads.cancel_request(invocation_id)
                    detail = requested_by(request.by, request.reason) if request else None
                    self.cancel(invocation_id, detail=detail)

    def follow_settings(self, invocation: Invocation, agent: Agent, *, allow_change: bool) -> None:
        """Check the agent against the recorded settings; record a change if it is allowed.

        Raises:
            SettingsChangedError: the approval rules changed and no change is allowed.
        """
        recorded = invocation.settings
        if allow_change:
            if recorded != agent.settings or invocation.budget != agent.budget:
                invocation.change_settings(agent.budget, agent.settings, at=self.now())
            return
        changed = recorded.changed_approval_rules(agent.settings) if recorded else []
        if changed:
            raise SettingsChangedError(
                f"the approval rules of tool(s) {', '.join(changed)} changed since invocation "
                f"{invocation.id} started (allow_settings_change / --allow-settings-change "
                "resumes with the new ones, and records it)"
            )

    async def _drive(
        self,
        invocation: Invocation,
        agent: Agent,
        *,
        fresh: bool = False,
        lease: HeldLease | None = None,
        before: DriveReads | None = None,
    ) -> Outcome:
        """Drive an invocation to its end or pause (``before``: what it read already)."""
        if not fresh:
            # A cut history would ask the model again for steps already taken: refuse.
            if before is not None:
                problem = before.history_problem
            else:
                problem = await self.reads.history_problem(invocation.id, invocation)
            # So would one cut right after a decision, which no run ever leaves alone.
            problem = problem or cut_decision_problem(invocation)
            if problem is not None:
                raise InconsistentHistoryError(invocation.id, problem)
        # Invocations recorded before settings were recorded follow the agent's.
        settings = invocation.settings or agent.settings
        version_at_start = invocation.version
        if self.secrets.sealed and not fresh:  # a new invocation has none yet
            await trio.to_thread.run_sync(self.secrets.load, invocation.id)
        controller = Controller(
            invocation,
            agent,
            settings=settings,
            journal=self.journal,
            reads=self.reads,
            secrets=self.secrets,
            now=self.now,
            lease=lease,
            slot=Slot(self.work_slots),
            outages=self.leases.outages,
        )
        if invocation.id in self.running:
            raise InvocationExistsError(invocation.id, "is already running in this runtime")
        request = None
        if not fresh and before is None:
            request = await self.reads.cancel_request(invocation.id)
        self.running[invocation.id] = controller
        self.inherit_cancel(controller)
        self.runs.began(fresh=fresh)
        log.info(
            "invocation %s %s (agent %s, step %d)",
            invocation.id,
            "started" if fresh else "resumed",
            invocation.agent_name,
            invocation.step,
            extra=fields(
                invocation_id=invocation.id, agent=invocation.agent_name, step=invocation.step
            ),
        )
        try:
            if before is not None:
                request = before.cancel_request
                if request is None and self.cancels_seen_to > before.position:
                    # The watcher looked past what was read before this run was
                    # registered: a request it found then was not this run's yet.
                    request = await self.reads.cancel_request(invocation.id)
            if request is not None:
                controller.request_cancel(requested_by(request.by, request.reason))
            assert self.mcp is not None
            children = ChildRunner(self, controller)
            controller.take_children_run_from_code = children.take_run_from_code
            with (
                using_mcp_sessions(self.mcp),
                using_child_runs(children),
                using_quota_gate(self.quota),
            ):
                outcome = await controller.run()
        except BaseException as error:  # noted, and raised on to the caller
            log.info(
                "the run of invocation %s stopped with %s (raised to its caller)",
                invocation.id,
                type(error).__name__,
                extra=fields(invocation_id=invocation.id, error_type=type(error).__name__),
            )
            raise
        finally:
            del self.running[invocation.id]
            controller.take_children_run_from_code = no_children  # no cycle through the runner
        self.runs.stopped(outcome.reason)
        log.info(
            "invocation %s %s: %s (step %d, %d tool call(s))",
            invocation.id,
            "paused" if outcome.paused else "ended",
            outcome.reason.value,
            outcome.steps,
            outcome.tool_calls,
            extra=fields(
                invocation_id=invocation.id,
                agent=invocation.agent_name,
                step=outcome.steps,
                outcome="paused" if outcome.paused else "ended",
                reason=outcome.reason,
            ),
        )
        if telemetry_on():  # the one check per drive; the spans come from what was committed
            await report_drive(self.reads, invocation.id, version_at_start)
        # A failed checkpoint recorded nothing: the invocation goes on at its next
        # resume, which still needs what is kept.
        if not outcome.paused and outcome.reason is not TerminalReason.CHECKPOINT_FAILED:
            await self.forget_secrets(invocation.id)
        return outcome

    async def forget_secrets(self, invocation_id: str) -> None:
        """An invocation ended: its kept secrets are deleted (sealed ones in a thread)."""
        if self.secrets.sealed:
            await trio.to_thread.run_sync(self.secrets.forget, invocation_id)
        else:
            self.secrets.forget(invocation_id)

    async def queue_status(
        self,
        invocation_id: str,
        status: QueueStatus,
        only_from: list[QueueStatus],
        agent_name: str,
    ) -> None:
        """Move the queue row of an invocation nobody drives (after an approval, a cancel).

        An invocation with no row yet (copied from another store, or recorded before the
        queue) gets one, unheld: nobody drives a paused invocation, so a later resume or
        worker has nobody to fence off.
        """
        leases = self.leases
        queue = leases.queue
        # A run of it here that just paused gives its lease back in the background; that
        # release comes first, or it would leave the row as the run left it (paused).
        await leases.wait_released(invocation_id)
        try:
            if await leases.call(queue.set_status, invocation_id, status, only_from=only_from):
                return
            if leases.rest_unreleased_as(invocation_id, status, only_from=only_from):
                return  # its release failed: the next heartbeat writes it, as ``status``
            await leases.call(queue.enqueue, invocation_id, agent_name, status=status)
        except StoreUnavailableError:
            log.warning(
                "invocation %s is recorded, but its queue row could not be made %s; "
                "submit it again with its id to queue it",
                invocation_id,
                status.value,
                exc_info=True,
                extra=fields(invocation_id=invocation_id),
            )

    async def take_lease(
        self, invocation: Invocation, *, take_over: bool
    ) -> tuple[Invocation, HeldLease]:
        """Take the lease of an invocation to drive it; record ``LeaseAcquired`` when it fences.

        Raises:
            LeaseHeldError: another process holds a live lease on it, or took it over
                after this one took its lease (a race of take-overs).
            StoreUnavailableError: the lease cannot be taken or recorded.
        """
        leases = self.leases
        taken = await leases.acquire(invocation.id, invocation.agent_name, take_over=take_over)
        if isinstance(taken, Refuse):
            raise LeaseHeldError(
                invocation.id,
                taken.holder,
                datetime.fromtimestamp(taken.expires_at, UTC),
                taken.seconds_left,
            )
        lease, verdict = taken
        if not verdict.record:
            return invocation, lease
        try:
            recorded = await self.record_lease(invocation, lease, verdict.taken_from)
        except BaseException:
            await leases.release(lease, DRAINED)
            raise
        if recorded is None:  # another take-over recorded a newer lease after this one
            leases.forget(lease)
            row = await leases.call(leases.queue.row, invocation.id)
            now = await leases.call(leases.queue.now)
            holder = row.holder if row is not None and row.holder else "another process"
            expires_at = row.due_at if row is not None else now
            raise LeaseHeldError(
                invocation.id,
                holder,
                datetime.fromtimestamp(expires_at, UTC),
                expires_at - now,
                instead="leave it: it took the invocation over after this process did",
            )
        return recorded, lease

    async def record_lease(
        self, invocation: Invocation, lease: HeldLease, taken_from: str | None
    ) -> Invocation | None:
        """Append ``LeaseAcquired``, reloading while the previous holder still appends.

        Returns the invocation with it (or terminated meanwhile: nothing is recorded
        then), or None when the stream already holds a newer lease (this one is lost).
        """
        for attempt in range(LEASE_RECORD_TRIES):
            if invocation.phase is Phase.TERMINATED:
                return invocation
            if invocation.lease_epoch >= lease.epoch:
                return None
            invocation.acquire_lease(
                lease.holder, lease.epoch, at=self.now(), taken_from=taken_from
            )
            outcome = await self.journal.commit(invocation.take_events())
            if isinstance(outcome, Committed):
                return invocation
            if not outcome.conflict:
                raise StoreUnavailableError(
                    f"cannot record the lease of {invocation.id}: {outcome.error_type}: "
                    f"{outcome.message}"
                )
            # The previous holder appended meanwhile; it stops at its next step.
            await trio.sleep(LEASE_RECORD_BACKOFF_S * (attempt + 1))
            invocation = await self.reads.invocation(invocation.id)
        raise StoreUnavailableError(
            f"cannot record the lease of {invocation.id}: its previous holder keeps appending"
        )

    async def drive_leased(
        self,
        invocation: Invocation,
        agent: Agent,
        lease: HeldLease,
        *,
        fresh: bool = False,
        before: DriveReads | None = None,
    ) -> Outcome:
        """Drive an invocation under a held lease, and leave the queue row as the run ended."""
        leases = self.leases
        while True:
            match await self.standing(invocation):
                case Standing.ENDED:
                    # A worker that died between a handoff's end and its target's submission
                    # left the row claimed: whoever claims it again submits the target.
                    await self._hand_off(invocation, agent, lease)
                    leases.release_soon(lease, Release(status=QueueStatus.ENDED))
                    return Outcome.of(invocation)
                case Standing.WAITS_FOR_PERSON:
                    leases.release_soon(lease, Release(status=QueueStatus.PAUSED))
                    return Outcome.of(invocation)
                case Standing.SLEEPING:
                    try:
                        woken = await self.wake_if_due(invocation)
                    except BaseException:
                        leases.release_soon(lease, RETRY_LATER)
                        raise
                    if woken is None:  # not due: a worker claims it when it is
                        outcome = Outcome.of(invocation)
                        leases.release_soon(lease, _release(outcome) or DRAINED)
                        return outcome
                    invocation = woken
                    continue
                case Standing.DRIVABLE:
                    break
                case unreachable:
                    assert_never(unreachable)
        try:
            outcome = await self._drive(invocation, agent, fresh=fresh, lease=lease, before=before)
        except LeaseDrained:
            leases.release_soon(lease, DRAINED)
            raise
        except trio.Cancelled:
            # Cancelled by the caller, the run recorded ``cancelled``; abandoned, nothing.
            ended = Release(status=QueueStatus.ENDED)
            leases.release_soon(lease, DRAINED if lease.abandoned else ended)
            raise
        except Exception as error:
            if is_outage(error):  # the store failed before the run began: tried again later
                leases.release_soon(lease, RETRY_LATER, note=one_line(error))
                raise
            # A person must look (a cut history, a bug): no worker takes it again by itself.
            note = f"{type(error).__name__}: {error}"
            leases.release_soon(lease, Release(status=QueueStatus.PAUSED), note=note)
            raise
        except BaseException:
            leases.release_soon(lease, DRAINED)
            raise
        if outcome.reason is TerminalReason.CHECKPOINT_FAILED:
            leases.outages.commit_failed(outcome.detail or "a commit failed")
        else:  # its commits were answered: the store works (again)
            leases.outages.answered()
        if outcome.reason is TerminalReason.HANDED_OFF and self.after_handoff is not None:
            # The aggregate the run drove holds its end (a read could lag behind it).
            source = invocation
            if source.terminated is None:
                source = await self.reads.invocation(outcome.invocation_id)
            if not await self._hand_off(source, agent, lease):
                leases.release_soon(lease, RETRY_LATER)
                return outcome
        release = _release(outcome)
        if outcome.reason is TerminalReason.RECONCILIATION_REQUIRED:
            release = await self._reconciliation_retry(outcome.invocation_id, agent) or release
        if release is None:
            leases.forget(lease)
        else:
            detail = outcome.detail if release.status is QueueStatus.RUNNABLE else None
            leases.release_soon(lease, release, note=detail)
        return outcome

    async def _hand_off(self, invocation: Invocation, agent: Agent, lease: HeldLease) -> bool:
        """Submit the target of an invocation that ended ``handed_off`` (a worker's drive).

        Returns False (logged) when ``invocation`` does not show its end yet: its row is
        to be left runnable, so that the next claim of it submits the target.

        Raises:
            Exception: the target cannot be submitted (the store failed): the row is
                left runnable, so that a later claim submits it.
        """
        ended = invocation.terminated
        if self.after_handoff is None:
            return True
        if ended is None:
            log.warning(
                "invocation %s ended handed_off, but its end is not read yet: the next claim "
                "of its row submits the target",
                invocation.id,
                extra=fields(invocation_id=invocation.id),
            )
            return False
        if ended.reason is not TerminalReason.HANDED_OFF:
            return True
        fault_point(CrashPoint.BEFORE_HANDOFF_SUBMIT)
        try:
            await self.after_handoff(invocation, agent)
        except BaseException:
            self.leases.release_soon(lease, RETRY_LATER)
            raise
        return True

    async def wake_if_due(self, invocation: Invocation) -> Invocation | None:
        """Record the wake of a sleeping invocation whose time has come (None: not due).

        ``SleepEnded`` is committed on its own, guarded by the aggregate's version: of
        several holders (or a ``wake`` of a person) that try at once, one records it; the
        others reload and find it awake (returned as it is then: awake, or ended).

        Raises:
            StoreUnavailableError: the wake cannot be recorded.
        """
        for attempt in range(LEASE_RECORD_TRIES):
            if invocation.phase is not Phase.SLEEPING:
                return invocation
            at = self.now()
            if not wake_due(invocation, at):
                return None
            invocation.wake(at=at)
            recorded = await self.journal.commit(invocation.take_events())
            if isinstance(recorded, Committed):
                return invocation
            if not recorded.conflict:
                raise StoreUnavailableError(
                    f"cannot record the wake of {invocation.id}: {recorded.error_type}: "
                    f"{recorded.message}"
                )
            await trio.sleep(LEASE_RECORD_BACKOFF_S * attempt)
            invocation = await self.reads.invocation(invocation.id)
        raise StoreUnavailableError(f"cannot record the wake of {invocation.id}: it keeps changing")

    async def _reconciliation_retry(self, invocation_id: str, agent: Agent) -> Release | None:
        """For a run paused for a service that can be asked again: runnable again later.

        So a worker asks the service again (``retry_reconciliation``) when every write
        of its waiting batch has a tool with ``reconcile``; None when one has none (a
        person settles it: ``effects resolve``), for a child (its parent asks the store
        for it) and for a parent waiting for a child.
        """
        invocation = await self.reads.invocation(invocation_id)
        paused, batch = invocation.paused, invocation.pending_batch
        if paused is None or batch is None or invocation.parent is not None or paused.child_path:
            return None
        tools = agent.toolbox.tools
        for call in batch.calls:
            if call.effect is ToolEffect.WRITE and call.denied is None:
                known = tools.get(call.name)
                if known is None or known.reconcile is None or call.child_id is not None:
                    return None
        return retry_reconciliation((self.now() - paused.timestamp).total_seconds())

    async def drive_claim(
        self, lease: HeldLease, claim: Claimed, agent: Agent, before: DriveReads | Exception | None
    ) -> Outcome | None:
        """Drive an invocation a worker claimed (None: it could not be driven; its row says why).

        ``before``: what the worker read for it with the other claims of its batch (or
        the exception that read raised for it); None, or a claim whose lease must be
        recorded first, reads it here.

        Raises:
            Exception: the store failed (``is_outage``) before or while it drove: the row
                is left runnable for a later try (``RETRY_LATER``), not paused for a person.
        """
        leases = self.leases
        if claim.record:
            before = None  # read after its lease is recorded, as a resume reads it
        try:
            if isinstance(before, Exception):
                raise before
            if before is not None:
                invocation = before.invocation
            else:
                invocation = await self.reads.invocation_to_resume(claim.invocation_id)
            if claim.record:
                recorded = await self.record_lease(invocation, lease, claim.taken_from)
                if recorded is None:
                    leases.forget(lease)
                    return None
                invocation = recorded
            if invocation.agent_name != agent.name:
                raise UsageError(
                    f"invocation {invocation.id} was started by agent {invocation.agent_name!r}"
                )
            if invocation.phase is not Phase.TERMINATED:
                check_catalogue(invocation.tools, agent.toolbox)
                self.follow_settings(invocation, agent, allow_change=False)
        except Exception as error:
            if is_outage(error):
                # The store failed right after the claim: nothing ran; tried again later.
                await leases.release(lease, RETRY_LATER, note=one_line(error))
                raise
            # The class only: the message (its row's note) may name an effect key.
            log.warning(
                "cannot drive %s (%s); its row is left paused, its note says why",
                claim.invocation_id,
                type(error).__name__,
                extra=fields(invocation_id=claim.invocation_id, error_type=type(error).__name__),
            )
            note = f"{type(error).__name__}: {error}"
            await leases.release(lease, Release(status=QueueStatus.PAUSED), note=note)
            return None
        return await self.drive_leased(invocation, agent, lease, before=before)

    async def live_lease(self, invocation_id: str) -> tuple[QueueRow, float] | None:
        """The queue row of an invocation whose lease a live process holds, and the queue's time.

        None when nobody holds it, its lease ran out, or its holder is gone (its process
        died on this machine, or it stopped beating): a resume would take it at once.

        Raises:
            StoreUnavailableError: the queue cannot be read.

        Cancellation: a checkpoint; nothing is written.
        """
        leases = self.leases
        queue = leases.queue
        row = await leases.call(queue.row, invocation_id)
        now = await leases.call(queue.now)
        if row is None or row.holder is None or not lease_is_live(row, now):
            return None
        if is_gone(await leases.call(queue.holder, row.holder), now):
            return None
        return row, now

    async def existing_outcome(self, requested: Invocation, failure: CommitFailed) -> Outcome:
        """The outcome of an invocation whose start was refused (``failure``): it exists.

        Raises:
            StoreUnavailableError: the start failed for another reason than a conflict.
            InvocationExistsError: it exists for another goal or agent, or has not stopped.
            LeaseHeldError: it has not stopped and another process drives it.
        """
        if not failure.conflict:
            raise StoreUnavailableError(
                f"cannot record the invocation: {failure.error_type}: {failure.message}"
            )
        existing = await self.reads.invocation(requested.id)
        if existing.goal != requested.goal or existing.agent_name != requested.agent_name:
            raise InvocationExistsError(requested.id, "already exists for another goal or agent")
        try:
            return Outcome.of(existing)
        except ValueError:
            pass
        held = await self.live_lease(requested.id)
        if held is not None:
            row, now = held
            assert row.holder is not None
            raise LeaseHeldError(
                requested.id, row.holder, datetime.fromtimestamp(row.due_at, UTC), row.due_at - now
            )
        raise InvocationExistsError(
            requested.id,
            "exists and has not stopped, and no process holds its lease: resume it "
            "(loop-actors resume ID --agent MODULE:ATTR)",
        )


def _release(outcome: Outcome) -> Release | None:
    """How a holder leaves the row of a run that stopped with ``outcome`` (a sleep: its time)."""
    wake_at = outcome.wake_at.timestamp() if outcome.wake_at is not None else None
    return release_after(outcome.reason, wake_at=wake_at)


def children_waited_for(invocation: Invocation) -> list[str]:
    """The children an invocation's pending batch started (and the one its pause names)."""
    batch = invocation.pending_batch
    found = [c.child_id for c in batch.calls if c.child_id] if batch is not None else []
    paused = invocation.paused
    if paused is not None and paused.child_path and paused.child_path[0] not in found:
        found.append(paused.child_path[0])
    return found


class DriverSource(Protocol):
    """Whatever hands out an open Driver: the Runtime (opening itself for one call if closed)."""

    async def with_driver(self, use: Callable[[Driver], Awaitable[T]], /) -> T:
        """Await ``use(driver)`` with the open Driver and return what it returns."""
        ...
