"""Fork: copy an invocation's committed steps into a new invocation, and go on from there.

The rules (where a fork may be made, what is copied, what a repeated write does) are
the core's (:mod:`aggregates.fork`, :mod:`aggregates.turn`); this module reads the
source and its writes' ledger entries, records the fork in one commit, and drives it
(or queues it for a worker, ``run=False``). The source is only read.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import partial
from typing import Any
from uuid import uuid4

from aggregates.decisions import Frozen
from aggregates.effect import Effect
from aggregates.fork import (
    LAST_FAILED,
    ForkOrigin,
    ForkPoint,
    ForkRefused,
    ForkWrites,
    fork_invocation,
    plan_fork,
    start_changes,
    write_keys,
)
from aggregates.invocation_events import InvocationEvent, InvocationStarted
from aggregates.settings import RunSettings
from aggregates.standing import resting_status
from loop_actors._errors import (
    ForkRefusedError,
    InconsistentHistoryError,
    InvocationExistsError,
    LeaseHeldError,
    StoreUnavailableError,
    UsageError,
)
from loop_actors._messages import CommitFailed, CommitOutcome
from loop_actors.agent.agent import Agent
from loop_actors.runtime.arguments import check_invocation_id, check_texts
from loop_actors.runtime.driver import Driver
from loop_actors.runtime.leases import HeldLease
from loop_actors.runtime.outcome import Outcome
from loop_actors.store.queue import NewRow
from loop_actors.store.reader import history_problem_of


class Forked(Frozen):
    """What ``Runtime.fork`` made: the fork, where from, and how it stopped (if it ran)."""

    fork_id: str
    source_id: str
    at_step: int
    writes: ForkWrites
    changed: list[str]
    """What the fork's start differs in from the source's (see ``ForkOrigin.changed``)."""
    source_writes: int
    """How many writes the source committed after ``at_step`` (what repeats are checked against)."""
    outcome: Outcome | None = None
    """How the fork stopped; None with ``run=False`` (queued, for a worker or a resume)."""

    def as_json(self) -> dict[str, Any]:
        """The JSON ``loop-actors fork --json`` prints."""
        return self.model_dump(mode="json")


def parse_fork_point(text: str) -> ForkPoint:
    """``--at-step``: a step number (0 or more) or ``last-failed``.

    Raises:
        UsageError: anything else.
    """
    if text == LAST_FAILED:
        return LAST_FAILED
    try:
        step = int(text)
    except ValueError:
        raise UsageError(
            f"--at-step must be a step number or {LAST_FAILED}, got {text!r}"
        ) from None
    if step < 0:
        raise UsageError(f"--at-step must be 0 or more, got {step}")
    return step


def parse_writes(value: ForkWrites | str) -> ForkWrites:
    """A ``writes`` choice: ``approve``, ``deny``, ``live`` or ``dedupe``.

    Raises:
        UsageError: anything else.
    """
    try:
        return ForkWrites(value)
    except ValueError:
        choices = ", ".join(w.value for w in ForkWrites)
        raise UsageError(f"writes must be one of {choices}, got {value!r}") from None


def check_fork_arguments(
    source_id: object,
    at_step: object,
    *,
    fork_id: object,
    by: object,
    reason: object,
    agent: object,
    run: bool,
) -> None:
    """Refuse malformed arguments of ``Runtime.fork`` before anything is read or written.

    Raises:
        UsageError: what is wrong.
    """
    check_invocation_id(source_id)
    if not (at_step == LAST_FAILED or (type(at_step) is int and at_step >= 0)):
        raise UsageError(f"at_step must be a step number (0 or more) or {LAST_FAILED!r}")
    if fork_id is not None:
        check_invocation_id(fork_id)
    for name, text in (("by", by), ("reason", reason)):
        if not isinstance(text, str) or not text.strip():
            raise UsageError(f"say {name} (a non-empty text): it is recorded with the fork")
    check_texts(by=str(by), reason=str(reason))
    if agent is not None and not isinstance(agent, Agent):
        raise UsageError(f"fork() needs an Agent, got {type(agent).__name__}")
    if run and agent is None:
        raise UsageError(
            "a fork that runs needs the agent to go on with (agent=..., --agent MODULE:ATTR); "
            "without one, record it with run=False (--no-run) for a worker to claim"
        )


async def fork(
    driver: Driver,
    *,
    source_id: str,
    at_step: ForkPoint,
    agent: Agent | None,
    fork_id: str | None,
    writes: ForkWrites,
    by: str,
    reason: str,
    run: bool,
    take_over: bool,
    agent_ref: str | None,
) -> Forked:
    """Record a fork of ``source_id`` and drive it (``Runtime.fork``, checked).

    Raises:
        As ``Runtime.fork``.
    """
    await _refuse_live_lease(driver, source_id, take_over=take_over)
    events, problem, effects = await driver.reads.call(partial(_read_source, driver, source_id))
    if problem is not None:
        raise InconsistentHistoryError(source_id, problem)
    cut = plan_fork(events, effects, at_step)
    if isinstance(cut, ForkRefused):
        raise ForkRefusedError(cut.refusal, cut.message)
    started = events[0]
    assert isinstance(started, InvocationStarted)  # a stored history starts so (checked above)
    settings: RunSettings | None
    if agent is not None:
        name, version = agent.name, agent.version
        catalogue, tools = agent.toolbox.catalogue_digest, agent.toolbox.specs
        budget, settings = agent.budget, agent.settings
    else:
        name, version = started.agent_name, started.agent_version
        catalogue, tools = started.catalogue_digest, list(started.tools)
        budget, settings = started.budget, started.settings
    origin = ForkOrigin(
        source_id=source_id,
        at_step=cut.step,
        source_version=cut.source_version,
        source_head_hash=cut.source_head_hash,
        by=by,
        reason=reason,
        writes=writes,
        source_agent_name=started.agent_name,
        source_catalogue_digest=started.catalogue_digest,
        changed=start_changes(
            started,
            agent_name=name,
            agent_version=version,
            catalogue_digest=catalogue,
            budget=budget,
            settings=settings,
        ),
        source_writes=cut.source_writes,
    )
    made = fork_invocation(
        cut,
        origin,
        fork_id=fork_id or uuid4().hex,
        goal=started.goal,
        agent_name=name,
        agent_version=version,
        catalogue_digest=catalogue,
        tools=tools,
        budget=budget,
        settings=settings,
        task_class=started.task_class,
        actor=started.actor,
        tenant=started.tenant,
        at=driver.now(),
    )
    if isinstance(made, ForkRefused):
        raise ForkRefusedError(made.refusal, made.message)
    invocation = made
    # Its queue row is committed with it: runnable (or as it rests) for a worker, or
    # claimed by this runtime, which drives it now.
    recorded: HeldLease | CommitOutcome
    if run:
        assert agent is not None  # checked by check_fork_arguments
        recorded = await driver.commit_held_start(invocation, agent.name)
    else:
        row = NewRow(invocation.id, name, agent_ref, resting_status(invocation.phase))
        recorded = await driver.journal.commit(invocation.take_events(), queue_rows=[row])
    if isinstance(recorded, CommitFailed):
        if recorded.conflict:
            raise InvocationExistsError(invocation.id, "already exists: choose another fork id")
        raise StoreUnavailableError(
            f"cannot record the fork: {recorded.error_type}: {recorded.message}; nothing was "
            "recorded, fork again"
        )
    forked = Forked(
        fork_id=invocation.id,
        source_id=source_id,
        at_step=cut.step,
        writes=writes,
        changed=origin.changed,
        source_writes=len(origin.source_writes),
    )
    if not isinstance(recorded, HeldLease):
        return forked  # queued
    assert agent is not None
    outcome = await driver.drive_leased(invocation, agent, recorded, fresh=True)
    return forked.model_copy(update={"outcome": outcome})


def _read_source(
    driver: Driver, source_id: str
) -> tuple[list[InvocationEvent], str | None, dict[str, Effect | None]]:
    """The source's events (read once), what is wrong with its history, its writes' entries."""
    store = driver.store
    events = store.events(source_id)
    problem = history_problem_of(
        source_id, events, store.newest_snapshot(source_id), lambda: store.effects_of(source_id)
    )
    return events, problem, {key: store.get_effect(key) for key in write_keys(events)}


async def _refuse_live_lease(driver: Driver, source_id: str, *, take_over: bool) -> None:
    """Refuse a source that a live process drives now (unless ``take_over``)."""
    if take_over:
        return
    leases = driver.leases
    # A run of this runtime that just ended gives its lease back in the background.
    await leases.wait_released(source_id)
    held = await driver.live_lease(source_id)
    if held is not None and held[0].holder != leases.holder:
        row, now = held
        holder, due = row.holder, row.due_at
    elif source_id in driver.running:
        now = await leases.call(leases.queue.now)
        holder, due = leases.holder, now
    else:
        return
    raise LeaseHeldError(
        source_id,
        holder or "this runtime",
        datetime.fromtimestamp(due, UTC),
        due - now,
        instead="fork with --take-over (take_over=True) to copy what it committed so far "
        "(its holder goes on, untouched)",
    )
