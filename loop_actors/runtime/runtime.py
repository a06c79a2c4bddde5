"""The Runtime: opens the store, runs the Journal, and drives controllers."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from enum import StrEnum
from functools import partial
from types import TracebackType
from uuid import uuid4

import trio
from pydantic import JsonValue

from aggregates.decisions import Frozen, TerminalReason
from aggregates.effect import (
    Effect,
    Resolution,
    Settler,
    check_hand_resolution,
    hand_resolution,
    who_settles,
)
from aggregates.errors import AggregateError
from aggregates.ids import invocation_id_problem
from aggregates.invocation import Invocation, InvocationEvent, Phase
from aggregates.lease import (
    DEFAULT_LEASE_S,
    DRAINED,
    HolderKind,
    QueueStatus,
    Refuse,
    Release,
    check_lease_s,
    lease_is_live,
    release_after,
)
from aggregates.requests import CancelRequest
from aggregates.turn import EffectAnswered, KeptSecret, cancel_paused, settle_ended_effect
from aggregates.values import check_text
from loop_actors._errors import (
    ApprovalRefusedError,
    EffectNotFoundError,
    EffectResolutionError,
    InconsistentHistoryError,
    InvocationExistsError,
    LeaseHeldError,
    NotWaitingError,
    StoreUnavailableError,
    UsageError,
)
from loop_actors._faults import CrashPoint, fault_point
from loop_actors._messages import (
    CommitFailed,
    Committed,
    ReconcileEffect,
)
from loop_actors.agent.agent import (
    Agent,
    SettingsChangedError,
    check_catalogue,
)
from loop_actors.agent.mcp import McpSessions, open_mcp_sessions, using_mcp_sessions
from loop_actors.audit.checkpointer import Checkpointer, CheckpointSettings, open_checkpointer
from loop_actors.runtime.controller import Controller, single_exception
from loop_actors.runtime.gc_policy import GcHold, GcPolicy
from loop_actors.runtime.leases import HeldLease, LeaseDrained, LeaseKeeper, new_holder_id
from loop_actors.runtime.outcome import Outcome
from loop_actors.runtime.reconciler import reconcile_effect
from loop_actors.runtime.slots import DEFAULT_WORK_SLOTS, Slot, WorkSlots
from loop_actors.store.journal import Journal
from loop_actors.store.queue import Claimed, open_queue
from loop_actors.store.reader import DriveReads, StoreReader
from loop_actors.store.secrets import SecretStore
from loop_actors.store.store import EventStore, StoreUrl, resolve_db_url
from loop_actors.store.views import (
    FOLLOW_RETRY_FIRST_S,
    FOLLOW_RETRY_MAX_S,
    FollowerHealth,
    ReadModelsStatus,
    open_runner,
    run_projection_follower,
)
from projections import ProjectionRunner


def _check_waiting_for_approval(invocation: Invocation, digest: str | None) -> None:
    paused = invocation.paused
    if paused is None or paused.reason is not TerminalReason.APPROVAL_REQUIRED:
        raise ApprovalRefusedError(f"invocation {invocation.id} does not wait for an approval")
    if digest != paused.proposal_digest:
        raise ApprovalRefusedError(
            f"refused: digest {digest} is not the digest of the batch waiting in "
            f"{invocation.id}; look at the waiting calls again"
        )


def check_invocation_id(invocation_id: object) -> None:
    """Refuse an id that cannot name an invocation (before anything is written).

    Raises:
        UsageError: not a non-empty string, in the runtime's own namespaces
            (``cancel:…``, ``eff-…``), or with a control character.
    """
    if not isinstance(invocation_id, str):
        raise UsageError(f"an invocation id must be a string, got {type(invocation_id).__name__}")
    problem = invocation_id_problem(invocation_id)
    if problem is not None:
        raise UsageError(problem)


def _check_texts(**texts: str | None) -> None:
    """Refuse text a caller gives that cannot be stored (a lone surrogate, e.g. from argv).

    Raises:
        UsageError: naming the argument and the problem.
    """
    for name, text in texts.items():
        if text is None:
            continue
        if not isinstance(text, str):
            raise UsageError(f"{name} must be a string, got {type(text).__name__}")
        problem = check_text(text)
        if problem is not None:
            raise UsageError(f"{name} cannot be stored: it holds {problem}")


def _check_start(
    caller: str,
    agent: object,
    goal: object,
    *,
    invocation_id: str | None,
    task_class: str | None,
    actor: str | None,
    tenant: str | None,
    agent_ref: str | None = None,
) -> None:
    """Refuse malformed arguments of ``run`` / ``submit`` before anything is written.

    Raises:
        UsageError: what is wrong with them.
    """
    if not isinstance(agent, Agent):
        raise UsageError(f"{caller}() needs an Agent, got {type(agent).__name__}")
    if not isinstance(goal, str) or not goal.strip():
        raise UsageError("the goal must be a non-empty string")
    if invocation_id is not None:
        check_invocation_id(invocation_id)
    _check_texts(
        goal=goal,
        invocation_id=invocation_id,
        task_class=task_class,
        actor=actor,
        tenant=tenant,
        agent_ref=agent_ref,
    )


def _requested_by(by: str | None, reason: str | None) -> str:
    return "requested" + (f" by {by}" if by else "") + (f" ({reason})" if reason else "")


log = logging.getLogger(__name__)

CANCEL_POLL_S = 0.5
"""How often a runtime looks for cancel requests made by other processes."""


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


class NeedsPerson(Frozen):
    """An open effect that no sweep can settle: only a person can (``resolve_effect``)."""

    effect_key: str
    invocation_id: str
    tool: str
    why: str
    """Why no service can be asked (the tool has no ``reconcile``, or the agent no such tool)."""


class ReconcileReport(Frozen):
    """What a sweep of the effect ledger did."""

    resumed: list[Outcome]
    """Invocations that were paused for reconciliation and were resumed, with their outcomes."""
    effects_settled: int
    effects_open: int
    """Effects still open after the sweep (all agents)."""
    left_running: list[str]
    """Invocations with open effects that may still be running; resume them to settle."""
    needs_person: list[NeedsPerson] = []
    """Open effects of this agent's invocations that only a person can settle."""
    effects_waiting: int = 0
    """Open effects of this agent's invocations that a later sweep or resume may settle
    (the service was unreachable, or the invocation may still be running)."""


class ResolvedEffect(Frozen):
    """What :meth:`Runtime.resolve_effect` recorded."""

    effect_key: str
    invocation_id: str
    tool: str
    resolution: Resolution
    by: str
    receipt: JsonValue = None
    """The receipt as stored (redacted as the tool says when the agent was given)."""
    reason: str | None = None
    redacted: bool | None = None
    """True when the tool's ``sensitive_output`` changed the receipt; None without an agent
    (the receipt is stored as given)."""
    resumable: bool
    """True when its invocation waits for reconciliation: resume it to continue."""


def unaskable_reason(agent: Agent, tool_name: str) -> str | None:
    """Why no sweep can ask the service of a write of this tool (None: it can be asked)."""
    tool_ = agent.toolbox.tools.get(tool_name)
    if tool_ is None:
        return f"agent {agent.name!r} has no tool {tool_name!r} now"
    if tool_.reconcile is None:
        return f"tool {tool_name} has no reconcile function"
    return None


def _utc_now() -> datetime:
    return datetime.now(UTC)


async def _close_checkpointer(checkpointer: Checkpointer) -> None:
    """Write the last checkpoint and stop its thread (shielded: it always finishes)."""
    with trio.CancelScope(shield=True):
        await trio.to_thread.run_sync(checkpointer.close)


LEASE_RECORD_TRIES = 20
"""How often a takeover tries to record ``LeaseAcquired`` while the previous holder appends."""

LEASE_RECORD_BACKOFF_S = 0.05


def _queue_target(store: EventStore) -> str:
    """Where a store's work queue lives: its SQLite file, a private in-memory database, its URL."""
    if store.url.kind == "sqlite":
        assert store.url.path is not None
        return str(store.url.path)
    if store.url.kind == "memory":
        return ":memory:"  # only this process sees a memory:// store, and its queue
    return store.url.url


class Runtime:
    """Runs agents against an event store.

    ``Runtime(url)`` is cheap and does no I/O. Use ``async with runtime:`` to
    share one store and one Journal (group commit) between many concurrent
    runs; ``await runtime.run(...)`` outside that block opens them for the one
    call. ``run_sync`` is the blocking form for scripts.
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

        Raises:
            StoreUrlError: the URL is malformed.
            UsageError: ``checkpoint_every`` is not a whole number of at least 1, or a
                checkpoint key or interval is given without a directory; ``lease_s``
                is not a number of seconds, at least 1; ``gc_policy`` (or
                ``$LOOP_ACTORS_GC``) names no policy; ``work_slots`` is not a whole
                number of at least 1 (or None).
        """
        self.db_url = resolve_db_url(db_url)
        StoreUrl.parse(self.db_url)
        self.checkpoints = CheckpointSettings.resolve(
            checkpoint_dir, checkpoint_key, checkpoint_every
        )
        """Where checkpoints are written (None: nowhere)."""
        self.checkpointer: Checkpointer | None = None
        """The checkpoint writer, while the runtime is open with checkpoints."""
        problem = check_lease_s(lease_s)
        if problem is not None:
            raise UsageError(problem)
        self.lease_s = float(lease_s)
        self.gc_policy = GcPolicy.resolve(gc_policy)
        """How the garbage collector runs while the runtime is open."""
        self.work_slots = None if work_slots is None else WorkSlots(work_slots)
        """The runs' work slots (None: no limit)."""
        self._holder_kind = HolderKind.RUN
        self._holder_agents: list[str] = []
        self._holder_concurrency = 1
        self._reap = False
        self.holder_id = new_holder_id(HolderKind.RUN)
        """This runtime's name as a lease holder (``kind:host:pid:random``)."""
        self._leases: LeaseKeeper | None = None
        self._now = now
        self._store: EventStore | None = None
        self._journal: Journal | None = None
        self._exit_stack: AsyncExitStack | None = None
        self._running: dict[str, Controller] = {}
        self._cancels_seen_to = 0
        """The store position up to which the cancel watcher has looked for requests."""
        self._reader: StoreReader | None = None
        self._mcp: McpSessions | None = None
        """The MCP sessions of the runs of this runtime, closed when it closes."""
        self._secrets = SecretStore()
        """Real values of redacted data that paused runs still need (see ``_secrets``)."""
        self.follow_projections = follow_projections
        self.views = views
        self.projections: ProjectionRunner | None = None
        """The read models, while the runtime is open with ``follow_projections=True``."""
        self._read_models: FollowerHealth | None = None
        """What the read models' follower last saw, while it runs."""

    # ----------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Runtime:
        """Open the store and start the Journal.

        Raises:
            StoreUnavailableError: the database cannot be opened.

        Cancellation: a checkpoint; cancelled while opening, whatever was opened
        is closed again and nothing is recorded.
        """
        if self._exit_stack is not None:
            raise UsageError("this runtime is already open")
        store = await trio.to_thread.run_sync(EventStore, self.db_url)
        stack = AsyncExitStack()
        try:
            gc_hold = GcHold(self.gc_policy)
            gc_hold.take()
            stack.callback(gc_hold.give_back)  # last: after everything else has closed
            stack.callback(store.close)
            cipher = store.app.mapper.cipher
            self._secrets.open(store.sealed_table() if cipher else None, cipher)
            stack.callback(self._secrets.close)
            runner = None
            if self.follow_projections:
                runner = await trio.to_thread.run_sync(open_runner, store, self.views)
                stack.callback(runner.close)  # after the nursery: the follower has stopped
            queue = await trio.to_thread.run_sync(
                partial(
                    open_queue,
                    store.url.kind,
                    _queue_target(store),
                    lock_wait_s=store.url.lock_wait_s,
                )
            )
            stack.callback(queue.close)  # after the nursery: the heartbeat has stopped
            nursery = await stack.enter_async_context(trio.open_nursery())
            leases = LeaseKeeper(
                queue,
                holder=self.holder_id,
                kind=self._holder_kind,
                lease_s=self.lease_s,
                agents=self._holder_agents,
                concurrency=self._holder_concurrency,
                reap=self._reap,
                nursery=nursery,
            )
            heartbeat: trio.CancelScope = await nursery.start(leases.run_heartbeat)
            stack.callback(heartbeat.cancel)
            stack.push_async_callback(leases.aclose)  # deregistered before the heartbeat stops
            committed: trio.MemorySendChannel[None] | None = None
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
            watcher: trio.CancelScope = await nursery.start(self._watch_cancel_requests, reads)
            stack.callback(watcher.cancel)  # the watcher ends with the runtime
            # MCP server sessions (stdio server processes) live as long as the runtime.
            mcp_sessions = await stack.enter_async_context(open_mcp_sessions())
            checkpointer: Checkpointer | None = None
            if self.checkpoints is not None:
                checkpointer = await trio.to_thread.run_sync(
                    open_checkpointer, store, self.checkpoints
                )
                # Closed after the Journal (its last commits are counted): a last checkpoint.
                stack.push_async_callback(_close_checkpointer, checkpointer)
            # Closed first on exit: it answers every commit it took, then stops (and
            # closes ``committed``, which ends the follower).
            journal = await stack.enter_async_context(
                Journal(
                    store,
                    committed=committed,
                    after_commit=checkpointer.note_commits if checkpointer else None,
                )
            )
        except BaseException:
            await stack.aclose()
            raise
        self._store, self._journal, self._exit_stack = store, journal, stack
        self.checkpointer = checkpointer
        self._reader = reads
        self._leases = leases
        self._mcp = mcp_sessions
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
        stack, self._exit_stack = self._exit_stack, None
        self._store = self._journal = None
        self._mcp = None
        self._leases = None
        self.projections = None
        self._read_models = None
        self.checkpointer = None
        if stack is None:
            return
        try:
            await stack.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:
            # The Journal's nursery wraps whatever the body raised; give the caller
            # the body's own exception rather than a group of one.
            raise single_exception(group) from None

    def read_models_status(self) -> ReadModelsStatus | None:
        """Where the followed read models stand; None unless open with ``follow_projections``.

        A read model that fails (raises on an event; its database is full) never ends
        a run: the follower logs it, keeps the read models at their last good
        position, reports them ``stale`` here, and tries again with a bounded backoff
        until they catch up (docs/how-to/supervise-read-models.md).
        """
        return None if self._read_models is None else self._read_models.status

    # ----------------------------------------------------------------- runs

    def _started(
        self,
        agent: Agent,
        goal: str,
        *,
        invocation_id: str | None,
        task_class: str | None,
        actor: str | None,
        tenant: str | None,
    ) -> Invocation:
        """A new invocation of ``agent`` on ``goal``, its ``InvocationStarted`` pending."""
        return Invocation.start(
            invocation_id=invocation_id or uuid4().hex,
            goal=goal,
            agent_name=agent.name,
            agent_version=agent.version,
            catalogue_digest=agent.toolbox.catalogue_digest,
            tools=agent.toolbox.specs,
            budget=agent.budget,
            settings=agent.settings,
            task_class=task_class if task_class is not None else agent.task_class,
            actor=actor,
            tenant=tenant,
            at=self._now(),
        )

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
        _check_start(
            "run",
            agent,
            goal,
            invocation_id=invocation_id,
            task_class=task_class,
            actor=actor,
            tenant=tenant,
        )
        if self._exit_stack is None:
            async with self:
                return await self.run(
                    agent,
                    goal,
                    invocation_id=invocation_id,
                    task_class=task_class,
                    actor=actor,
                    tenant=tenant,
                )
        journal = self._journal
        assert journal is not None

        invocation = self._started(
            agent,
            goal,
            invocation_id=invocation_id,
            task_class=task_class,
            actor=actor,
            tenant=tenant,
        )
        created = await journal.commit(invocation.take_events())
        if isinstance(created, CommitFailed):
            return await self._existing_outcome(invocation, created)

        fault_point(CrashPoint.AFTER_START_COMMIT)
        lease = self._lease_keeper().hold_new(invocation.id, agent.name)
        # A new invocation has no earlier cancel request; a later one reaches it through
        # this runtime's watcher.
        return await self._drive_leased(invocation, agent, journal, lease, fresh=True)

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
                dispatched batch of the invocation names (its history was cut), or
                a stored snapshot of it differs from the replay of its events
                (forged); nothing runs.

        The budget (its deadline included) and the settings recorded when the
        invocation started are followed, whatever ``agent`` says now: the agent
        gives the model, the tools, the verifier and the policy. With
        ``allow_settings_change`` the agent's current budget and settings are
        used from now on, and ``SettingsChanged`` records it.

        Cancellation: as :meth:`run`.
        """
        if not isinstance(agent, Agent):
            raise UsageError(f"resume() needs an Agent, got {type(agent).__name__}")
        if self._exit_stack is None:
            async with self:
                return await self.resume(
                    invocation_id,
                    agent,
                    allow_catalogue_change=allow_catalogue_change,
                    allow_settings_change=allow_settings_change,
                    take_over=take_over,
                )
        journal = self._journal
        assert journal is not None
        if invocation_id in self._running:
            raise InvocationExistsError(invocation_id, "is already running in this runtime")
        invocation = await self._reads().invocation(invocation_id)
        if invocation.agent_name != agent.name:
            raise UsageError(
                f"invocation {invocation_id} was started by agent {invocation.agent_name!r}, "
                f"not {agent.name!r}"
            )
        if invocation.phase is Phase.TERMINATED:
            return Outcome.of(invocation)
        if invocation.phase.paused and not invocation.paused_for_reconciliation:
            return Outcome.of(invocation)
        if not allow_catalogue_change:
            check_catalogue(invocation.tools, agent.toolbox)
        invocation, lease = await self._take_lease(invocation, journal, take_over=take_over)
        try:
            self._follow_settings(invocation, agent, allow_change=allow_settings_change)
        except BaseException:
            await self._lease_keeper().release(lease, DRAINED)
            raise
        return await self._drive_leased(invocation, agent, journal, lease)

    def _follow_settings(self, invocation: Invocation, agent: Agent, *, allow_change: bool) -> None:
        """Check the agent against the recorded settings; record a change if it is allowed.

        Raises:
            SettingsChangedError: the approval rules changed and no change is allowed.
        """
        recorded = invocation.settings
        if allow_change:
            if recorded != agent.settings or invocation.budget != agent.budget:
                invocation.change_settings(agent.budget, agent.settings, at=self._now())
            return
        changed = recorded.changed_approval_rules(agent.settings) if recorded else []
        if changed:
            raise SettingsChangedError(
                f"the approval rules of tool(s) {', '.join(changed)} changed since invocation "
                f"{invocation.id} started (allow_settings_change / --allow-settings-change "
                "resumes with the new ones, and records it)"
            )

    async def approve(
        self, invocation_id: str, *, digest: str, by: str, note: str | None = None
    ) -> None:
        """Approve the batch an invocation paused for; ``resume`` then runs exactly that batch.

        Raises:
            ApprovalRefusedError: nothing waits for approval, or the digest is not
                the one of the waiting batch (a stale or mismatched approval).
            InvocationNotFoundError: no such invocation.

        Cancellation: a checkpoint until the approval is handed to the Journal, then
        waited for: cancelled, either nothing was recorded or the approval is
        durable; approving again is refused only if it is (retry safely after
        ``load``).
        """
        if not by.strip():
            raise UsageError("an approval needs the approver's name (by)")
        _check_texts(by=by, note=note, digest=digest)

        def apply(invocation: Invocation) -> None:
            _check_waiting_for_approval(invocation, digest)
            invocation.grant_approval(digest, by=by, note=note, at=self._now())

        await self._record(invocation_id, apply)

    async def deny(self, invocation_id: str, *, by: str, reason: str) -> None:
        """Deny the batch an invocation paused for; its calls that needed approval will not run.

        The model gets a ``denied`` result for each of them on ``resume``.

        Raises:
            ApprovalRefusedError: nothing waits for approval.
            InvocationNotFoundError: no such invocation.

        Cancellation: as :meth:`approve`.
        """
        if not by.strip() or not reason.strip():
            raise UsageError("a denial needs the approver's name (by) and a reason")
        _check_texts(by=by, reason=reason)

        def apply(invocation: Invocation) -> None:
            paused = invocation.paused
            digest = paused.proposal_digest if paused is not None else None
            _check_waiting_for_approval(invocation, digest)
            assert digest is not None
            invocation.deny_approval(digest, by=by, reason=reason, at=self._now())

        await self._record(invocation_id, apply)

    async def clarify(self, invocation_id: str, *, answer: str, by: str | None = None) -> None:
        """Answer the question an invocation paused with; ``resume`` then asks the model again.

        Raises:
            NotWaitingError: the invocation does not wait for an answer.
            InvocationNotFoundError: no such invocation.

        Cancellation: as :meth:`approve`.
        """
        if not answer.strip():
            raise UsageError("the answer must not be empty")
        _check_texts(answer=answer, by=by)

        def apply(invocation: Invocation) -> None:
            paused = invocation.paused
            if paused is None or paused.reason is not TerminalReason.CLARIFICATION_REQUIRED:
                raise NotWaitingError(f"invocation {invocation.id} does not wait for an answer")
            invocation.provide_clarification(answer, by=by, at=self._now())

        await self._record(invocation_id, apply)

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
        """Settle an open effect by hand: the write happened (``committed``) or not (``rejected``).

        For an effect that no service can settle (a write tool without
        ``reconcile`` whose outcome is unknown). Records ``EffectResolvedByHand``
        in the effect ledger with ``by`` and ``reason``. An invocation paused
        ``reconciliation_required`` can then be resumed: the call's result is
        ``receipt`` (committed) or a ``rejected`` error with ``reason``. An
        effect of an invocation that ended (cancelled, say) is only recorded.

        With ``agent`` (the agent that started the invocation) the receipt is
        stored as its tool redacts outputs (``sensitive_output``), and the real
        value is kept for the resumed run like every redacted output; without
        it the receipt is stored as given.

        Raises:
            EffectNotFoundError: no effect has this key.
            EffectResolutionError: both or neither of ``committed`` and
                ``rejected``; no ``by``; ``rejected`` without a ``reason`` or with a
                ``receipt``; a receipt that is not JSON or not stored faithfully
                (NaN, Infinity); the effect is not open; its invocation may still
                be running; ``agent`` is not its agent or has no such tool; it
                changed meanwhile. Nothing is recorded.
            StoreUnavailableError: the store cannot be written.

        Cancellation: as :meth:`approve`.
        """
        try:
            resolution = hand_resolution(committed=committed, rejected=rejected)
            # Checked again by the aggregate; here before anything is opened or read.
            check_hand_resolution(resolution, by=by, receipt=receipt, reason=reason)
        except AggregateError as error:
            raise EffectResolutionError(str(error)) from None
        if agent is not None and not isinstance(agent, Agent):
            raise UsageError(f"resolve_effect() needs an Agent, got {type(agent).__name__}")
        if self._exit_stack is None:
            async with self:
                return await self.resolve_effect(
                    effect_key,
                    committed=committed,
                    rejected=rejected,
                    receipt=receipt,
                    reason=reason,
                    by=by,
                    agent=agent,
                )
        journal = self._journal
        assert journal is not None
        effect = (await self._reads().effects([effect_key])).get(effect_key)
        if effect is None:
            raise EffectNotFoundError(effect_key)
        invocation = await self._reads().invocation(effect.invocation_id)
        stored, redacted = receipt, None
        if agent is not None:
            if agent.name != invocation.agent_name:
                raise EffectResolutionError(
                    f"effect {effect_key} belongs to invocation {invocation.id} of agent "
                    f"{invocation.agent_name!r}, not {agent.name!r}"
                )
            if effect.tool not in agent.toolbox.tools:
                raise EffectResolutionError(
                    f"agent {agent.name!r} has no tool {effect.tool!r} now, so its receipt "
                    "cannot be redacted as the tool says; resolve without the agent to store "
                    "it as given"
                )
            # A receipt is an output of the write: stored as the tool redacts it.
            stored = agent.toolbox.redact_output(effect.tool, receipt)
            redacted = stored is not receipt
        try:
            effect.resolve_by_hand(
                resolution,
                by=by,
                invocation_phase=invocation.phase,
                receipt=stored,
                reason=reason,
                at=self._now(),
            )
        except AggregateError as error:
            raise EffectResolutionError(str(error)) from None
        if redacted and invocation.phase is not Phase.TERMINATED:
            # The resumed run shows the model the real receipt (sealed when a cipher is set).
            secret = KeptSecret(effect.step, effect.call_id, "output", receipt)
            await trio.to_thread.run_sync(self._secrets.load, invocation.id)
            self._secrets.keep(invocation.id, [secret])
            await trio.to_thread.run_sync(self._secrets.save, invocation.id)
        outcome = await journal.commit(effect.take_events())
        if isinstance(outcome, CommitFailed):
            if outcome.conflict:
                raise EffectResolutionError(
                    f"effect {effect_key} changed meanwhile; look at it again "
                    f"(loop-actors history {effect_key})"
                )
            raise StoreUnavailableError(f"{outcome.error_type}: {outcome.message}")
        return ResolvedEffect(
            effect_key=effect_key,
            invocation_id=invocation.id,
            tool=effect.tool,
            resolution=resolution,
            by=by,
            receipt=stored,
            reason=reason,
            redacted=redacted,
            resumable=invocation.paused_for_reconciliation,
        )

    async def _record(self, invocation_id: str, apply: Callable[[Invocation], None]) -> None:
        if self._exit_stack is None:
            async with self:
                await self._record(invocation_id, apply)
                return
        journal = self._journal
        assert journal is not None
        invocation = await self._reads().invocation(invocation_id)
        apply(invocation)
        outcome = await journal.commit(invocation.take_events())
        if isinstance(outcome, CommitFailed):
            if outcome.conflict:
                raise ApprovalRefusedError(
                    f"invocation {invocation_id} changed meanwhile; look at it again"
                )
            raise StoreUnavailableError(f"{outcome.error_type}: {outcome.message}")
        # A worker may take it now.
        await self._queue_status(
            invocation_id, QueueStatus.RUNNABLE, [QueueStatus.PAUSED], invocation.agent_name
        )

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

    async def reconcile(self, agent: Agent) -> ReconcileReport:
        """Sweep the effect ledger: settle the open effects of ``agent``'s invocations.

        Invocations paused with ``reconciliation_required`` are resumed (their
        effects are reconciled, then the loop continues). Open effects of
        invocations that already ended are reconciled and recorded. Effects of an
        invocation that may still be running elsewhere (dispatched, not paused)
        are left alone: resume that invocation to settle them.

        Cancellation: as :meth:`resume`, for the invocation being resumed.
        """
        if self._exit_stack is None:
            async with self:
                return await self.reconcile(agent)
        journal = self._journal
        assert journal is not None
        open_effects = await self._reads().open_effects()
        by_invocation: dict[str, list[Effect]] = {}
        for effect in open_effects:
            by_invocation.setdefault(effect.invocation_id, []).append(effect)
        outcomes: list[Outcome] = []
        settled = 0
        left_alone: list[str] = []
        swept: set[str] = set()
        ended: set[str] = set()
        for invocation_id, effects in by_invocation.items():
            invocation = await self._reads().invocation(invocation_id)
            if invocation.agent_name != agent.name:
                continue
            swept.add(invocation_id)
            if invocation.phase is Phase.TERMINATED:
                ended.add(invocation_id)
            if invocation.paused_for_reconciliation:
                try:
                    invocation, lease = await self._take_lease(invocation, journal, take_over=False)
                except LeaseHeldError:
                    left_alone.append(invocation_id)  # another process is resuming it
                    continue
                outcome = await self._drive_leased(invocation, agent, journal, lease)
                outcomes.append(outcome)
                if not outcome.paused:
                    settled += len(effects)
            elif invocation.phase is Phase.TERMINATED:
                settled += await self._settle_ended(invocation, effects, agent, journal)
            else:
                left_alone.append(invocation_id)
        still_open = await self._reads().open_effects()
        needs_person: list[NeedsPerson] = []
        waiting = 0
        for effect in still_open:
            if effect.invocation_id not in swept:
                continue  # another agent's: its own sweep reports it
            if effect.invocation_id in left_alone:
                waiting += 1  # it may still be running: resume it to settle
                continue
            why = unaskable_reason(agent, effect.tool)
            settler = who_settles(
                invocation_ended=effect.invocation_id in ended, service_can_be_asked=why is None
            )
            if settler is Settler.SWEEPER or why is None:
                waiting += 1
                continue
            needs_person.append(
                NeedsPerson(
                    effect_key=effect.key,
                    invocation_id=effect.invocation_id,
                    tool=effect.tool,
                    why=why,
                )
            )
        return ReconcileReport(
            resumed=outcomes,
            effects_settled=settled,
            effects_open=len(still_open),
            left_running=left_alone,
            needs_person=needs_person,
            effects_waiting=waiting,
        )

    async def _settle_ended(
        self, invocation: Invocation, effects: list[Effect], agent: Agent, journal: Journal
    ) -> int:
        settled = 0
        for effect in effects:
            answer = await reconcile_effect(
                agent.toolbox, ReconcileEffect(effect_key=effect.key, tool=effect.tool)
            )
            if not isinstance(answer, EffectAnswered):
                continue
            # Redacted, scrubbed and size-limited like every receipt and reason (the core's rule).
            problem = settle_ended_effect(
                invocation,
                effect,
                answer,
                agent.toolbox,
                max_bytes=agent.settings.output_limit,
                at=self._now(),
            )
            if problem is not None:
                log.warning("effect %s left open: %s", effect.key, problem)
                continue
            outcome = await journal.commit(effect.take_events())
            if isinstance(outcome, Committed):
                settled += 1
        return settled

    async def _drive(
        self,
        invocation: Invocation,
        agent: Agent,
        journal: Journal,
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
                problem = await self._reads().history_problem(invocation.id)
            if problem is not None:
                raise InconsistentHistoryError(invocation.id, problem)
        # Invocations recorded before settings were recorded follow the agent's.
        settings = invocation.settings or agent.settings
        if self._secrets.sealed and not fresh:  # a new invocation has none yet
            await trio.to_thread.run_sync(self._secrets.load, invocation.id)
        controller = Controller(
            invocation,
            agent,
            settings=settings,
            journal=journal,
            reads=self._reads(),
            secrets=self._secrets,
            now=self._now,
            lease=lease,
            slot=Slot(self.work_slots),
        )
        if invocation.id in self._running:
            raise InvocationExistsError(invocation.id, "is already running in this runtime")
        request = None
        if not fresh and before is None:
            request = await self._reads().cancel_request(invocation.id)
        self._running[invocation.id] = controller
        try:
            if before is not None:
                request = before.cancel_request
                if request is None and self._cancels_seen_to > before.position:
                    # The watcher looked past what was read before this run was
                    # registered: a request it found then was not this run's yet.
                    request = await self._reads().cancel_request(invocation.id)
            if request is not None:
                controller.request_cancel(_requested_by(request.by, request.reason))
            assert self._mcp is not None
            with using_mcp_sessions(self._mcp):
                outcome = await controller.run()
        finally:
            del self._running[invocation.id]
        # A failed checkpoint recorded nothing: the invocation goes on at its next
        # resume, which still needs what is kept.
        if not outcome.paused and outcome.reason is not TerminalReason.CHECKPOINT_FAILED:
            await self._forget_secrets(invocation.id)
        return outcome

    async def _forget_secrets(self, invocation_id: str) -> None:
        """An invocation ended: its kept secrets are deleted (sealed ones in a thread)."""
        if self._secrets.sealed:
            await trio.to_thread.run_sync(self._secrets.forget, invocation_id)
        else:
            self._secrets.forget(invocation_id)

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

    def cancel(self, invocation_id: str, *, detail: str | None = None) -> bool:
        """Ask a run of this runtime to stop; it ends ``cancelled`` and starts no new call.

        In-process only and not recorded; :meth:`request_cancel` records the request
        so that a run in any process (or a later resume) honours it.
        Returns False when no run of that id is in progress here.
        """
        controller = self._running.get(invocation_id)
        if controller is None:
            return False
        controller.request_cancel(detail)
        return True

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
        _check_texts(by=by, reason=reason)
        if self._exit_stack is None:
            async with self:
                return await self.request_cancel(invocation_id, by=by, reason=reason)
        journal = self._journal
        assert journal is not None
        invocation = await self._reads().invocation(invocation_id)
        if invocation.phase is Phase.TERMINATED:
            return CancelResult.ALREADY_ENDED
        existing = await self._reads().cancel_request(invocation_id)
        if existing is None:
            request = CancelRequest.record(invocation_id, by=by, reason=reason, at=self._now())
            recorded = await journal.commit(request.take_events())
            # A conflict means another process recorded a request first: that one stands.
            if isinstance(recorded, CommitFailed) and not recorded.conflict:
                raise StoreUnavailableError(
                    f"cannot record the cancel request of {invocation_id}: "
                    f"{recorded.error_type}: {recorded.message}; nothing was recorded, ask again"
                )
        if self.cancel(invocation_id, detail=_requested_by(by, reason)):
            return CancelResult.SIGNALLED
        if invocation.phase.paused:
            who = f" by {by}" if by else ""
            cancel_paused(
                invocation,
                f"cancelled{who} while paused" + (f": {reason}" if reason else ""),
                at=self._now(),
            )
            ended = await journal.commit(invocation.take_events())
            if isinstance(ended, Committed):
                await self._forget_secrets(invocation_id)
                await self._queue_status(
                    invocation_id,
                    QueueStatus.ENDED,
                    [QueueStatus.PAUSED, QueueStatus.RUNNABLE],
                    invocation.agent_name,
                )
                return CancelResult.ENDED
            if not ended.conflict:
                raise StoreUnavailableError(
                    f"the cancel request of {invocation_id} is recorded, but ending it failed: "
                    f"{ended.error_type}: {ended.message}; a resume ends it, or ask again"
                )
            # A conflict: it was resumed meanwhile; that run honours the recorded request.
        return CancelResult.REQUESTED

    async def _watch_cancel_requests(
        self,
        reads: StoreReader,
        *,
        task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Signal runs of this runtime whose cancel was requested from another process."""
        failures = 0
        with trio.CancelScope() as scope:
            position = self._cancels_seen_to = await reads.head()
            task_status.started(scope)
            while True:
                await trio.sleep(CANCEL_POLL_S)
                if not self._running:
                    continue
                try:
                    ids, position = await reads.cancel_requests_after(position)
                except Exception:
                    failures += 1
                    if failures == 1 or failures % 120 == 0:  # at most once a minute
                        log.warning(
                            "cannot look for cancel requests (%d failed polls); retrying",
                            failures,
                            exc_info=True,
                        )
                    continue
                failures = 0
                self._cancels_seen_to = position
                for invocation_id in ids:
                    if invocation_id not in self._running:
                        continue
                    request = await reads.cancel_request(invocation_id)
                    detail = _requested_by(request.by, request.reason) if request else None
                    self.cancel(invocation_id, detail=detail)

    @property
    def store_id(self) -> str | None:
        """The identity of the open store (a UUID created with it); None while closed."""
        return self._store.store_id if self._store is not None else None

    @property
    def running(self) -> Sequence[str]:
        """The ids of invocations this runtime is driving now."""
        return list(self._running)

    # ----------------------------------------------------------------- reads

    async def history(self, invocation_id: str) -> list[InvocationEvent]:
        """Every committed event of an invocation, in order.

        Raises:
            InvocationNotFoundError: no such invocation.

        Cancellation: a checkpoint; the read's thread is abandoned (nothing changes).
        """
        if self._store is None:
            async with self:
                return await self.history(invocation_id)
        return await self._reads().events(invocation_id)

    async def load(self, invocation_id: str) -> Invocation:
        """The invocation as its committed events make it.

        Raises:
            InvocationNotFoundError: no such invocation.

        Cancellation: a checkpoint; the read's thread is abandoned (nothing changes).
        """
        if self._store is None:
            async with self:
                return await self.load(invocation_id)
        return await self._reads().invocation(invocation_id)

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
        _check_start(
            "submit",
            agent,
            goal,
            invocation_id=invocation_id,
            task_class=task_class,
            actor=actor,
            tenant=tenant,
            agent_ref=agent_ref,
        )
        if self._exit_stack is None:
            async with self:
                return await self.submit(
                    agent,
                    goal,
                    invocation_id=invocation_id,
                    task_class=task_class,
                    actor=actor,
                    tenant=tenant,
                    agent_ref=agent_ref,
                )
        journal = self._journal
        assert journal is not None
        invocation = self._started(
            agent,
            goal,
            invocation_id=invocation_id,
            task_class=task_class,
            actor=actor,
            tenant=tenant,
        )
        status = QueueStatus.RUNNABLE
        created = await journal.commit(invocation.take_events())
        if isinstance(created, CommitFailed):
            if not created.conflict:
                raise StoreUnavailableError(
                    f"cannot record the invocation: {created.error_type}: {created.message}; "
                    "nothing was recorded, submit again"
                )
            existing = await self._reads().invocation(invocation.id)
            if existing.goal != goal or existing.agent_name != agent.name:
                raise InvocationExistsError(
                    invocation.id, "already exists for another goal or agent"
                )
            if existing.phase is Phase.TERMINATED:
                status = QueueStatus.ENDED
            elif existing.phase.paused:
                status = QueueStatus.PAUSED
        leases = self._lease_keeper()
        try:
            await leases.enqueue(invocation.id, agent.name, agent_ref=agent_ref, status=status)
        except StoreUnavailableError as error:
            raise StoreUnavailableError(
                f"invocation {invocation.id} is recorded but not queued ({error}); submit it "
                "again with the same id"
            ) from error
        return invocation.id

    # ----------------------------------------------------------------- leases

    def _lease_keeper(self) -> LeaseKeeper:
        assert self._leases is not None, "the runtime is not open"
        return self._leases

    async def _queue_status(
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
        leases = self._lease_keeper()
        queue = leases.queue
        try:
            if not await leases.call(queue.set_status, invocation_id, status, only_from=only_from):
                await leases.call(queue.enqueue, invocation_id, agent_name, status=status)
        except StoreUnavailableError:
            log.warning(
                "invocation %s is recorded, but its queue row could not be made %s; "
                "submit it again with its id to queue it",
                invocation_id,
                status.value,
                exc_info=True,
            )

    async def _take_lease(
        self, invocation: Invocation, journal: Journal, *, take_over: bool
    ) -> tuple[Invocation, HeldLease]:
        """Take the lease of an invocation to drive it; record ``LeaseAcquired`` when it fences.

        Raises:
            LeaseHeldError: another process holds a live lease on it.
            InvocationExistsError: another process took it over meanwhile.
            StoreUnavailableError: the lease cannot be taken or recorded.
        """
        leases = self._lease_keeper()
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
            recorded = await self._record_lease(invocation, journal, lease, verdict.taken_from)
        except BaseException:
            await leases.release(lease, DRAINED)
            raise
        if recorded is None:
            leases.forget(lease)
            raise InvocationExistsError(
                invocation.id, "was taken over by another process meanwhile"
            )
        return recorded, lease

    async def _record_lease(
        self, invocation: Invocation, journal: Journal, lease: HeldLease, taken_from: str | None
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
                lease.holder, lease.epoch, at=self._now(), taken_from=taken_from
            )
            outcome = await journal.commit(invocation.take_events())
            if isinstance(outcome, Committed):
                return invocation
            if not outcome.conflict:
                raise StoreUnavailableError(
                    f"cannot record the lease of {invocation.id}: {outcome.error_type}: "
                    f"{outcome.message}"
                )
            # The previous holder appended meanwhile; it stops at its next step.
            await trio.sleep(LEASE_RECORD_BACKOFF_S * (attempt + 1))
            invocation = await self._reads().invocation(invocation.id)
        raise StoreUnavailableError(
            f"cannot record the lease of {invocation.id}: its previous holder keeps appending"
        )

    async def _drive_leased(
        self,
        invocation: Invocation,
        agent: Agent,
        journal: Journal,
        lease: HeldLease,
        *,
        fresh: bool = False,
        before: DriveReads | None = None,
    ) -> Outcome:
        """Drive an invocation under a held lease, and leave the queue row as the run ended."""
        leases = self._lease_keeper()
        if invocation.phase is Phase.TERMINATED:
            leases.release_soon(lease, Release(status=QueueStatus.ENDED))
            return Outcome.of(invocation)
        if invocation.phase.paused and not invocation.paused_for_reconciliation:
            leases.release_soon(lease, Release(status=QueueStatus.PAUSED))
            return Outcome.of(invocation)
        try:
            outcome = await self._drive(
                invocation, agent, journal, fresh=fresh, lease=lease, before=before
            )
        except LeaseDrained:
            leases.release_soon(lease, DRAINED)
            raise
        except trio.Cancelled:
            # Cancelled by the caller, the run recorded ``cancelled``; abandoned, nothing.
            ended = Release(status=QueueStatus.ENDED)
            leases.release_soon(lease, DRAINED if lease.abandoned else ended)
            raise
        except Exception as error:
            # A person must look (a cut history, a bug): no worker takes it again by itself.
            note = f"{type(error).__name__}: {error}"
            leases.release_soon(lease, Release(status=QueueStatus.PAUSED), note=note)
            raise
        except BaseException:
            leases.release_soon(lease, DRAINED)
            raise
        release = release_after(outcome.reason)
        if release is None:
            leases.forget(lease)
        else:
            detail = outcome.detail if release.status is QueueStatus.RUNNABLE else None
            leases.release_soon(lease, release, note=detail)
        return outcome

    async def _drive_claim(
        self, lease: HeldLease, claim: Claimed, agent: Agent, before: DriveReads | Exception | None
    ) -> Outcome | None:
        """Drive an invocation a worker claimed (None: it could not be driven; its row says why).

        ``before``: what the worker read for it with the other claims of its batch (or
        the exception that read raised for it); None, or a claim whose lease must be
        recorded first, reads it here.
        """
        journal = self._journal
        assert journal is not None
        leases = self._lease_keeper()
        if claim.record:
            before = None  # read after its lease is recorded, as a resume reads it
        try:
            if isinstance(before, Exception):
                raise before
            if before is not None:
                invocation = before.invocation
            else:
                invocation = await self._reads().invocation(claim.invocation_id)
            if claim.record:
                recorded = await self._record_lease(invocation, journal, lease, claim.taken_from)
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
                self._follow_settings(invocation, agent, allow_change=False)
        except Exception as error:
            log.warning("cannot drive %s: %s", claim.invocation_id, error)
            note = f"{type(error).__name__}: {error}"
            await leases.release(lease, Release(status=QueueStatus.PAUSED), note=note)
            return None
        return await self._drive_leased(invocation, agent, journal, lease, before=before)

    # ----------------------------------------------------------------- helpers

    def _reads(self) -> StoreReader:
        """The reader of the open store."""
        assert self._reader is not None, "the runtime is not open"
        return self._reader

    async def _existing_outcome(self, requested: Invocation, failure: CommitFailed) -> Outcome:
        if not failure.conflict:
            raise StoreUnavailableError(
                f"cannot record the invocation: {failure.error_type}: {failure.message}"
            )
        existing = await self._reads().invocation(requested.id)
        if existing.goal != requested.goal or existing.agent_name != requested.agent_name:
            raise InvocationExistsError(requested.id, "already exists for another goal or agent")
        try:
            return Outcome.of(existing)
        except ValueError:
            pass
        queue = self._lease_keeper().queue
        row = await self._lease_keeper().call(queue.row, requested.id)
        now = await self._lease_keeper().call(queue.now)
        if row is not None and row.holder is not None and lease_is_live(row, now):
            raise LeaseHeldError(
                requested.id, row.holder, datetime.fromtimestamp(row.due_at, UTC), row.due_at - now
            )
        raise InvocationExistsError(
            requested.id,
            "exists and has not stopped, and no process holds its lease: resume it "
            "(loop-actors resume ID --agent MODULE:ATTR)",
        )
