"""Submitting invocations for workers: one or many, a chunk a transaction, idempotent on ids.

A submission is planned here once, for every caller: ``Runtime.submit`` and
``Runtime.submit_many`` (through the Driver: its reader, its Journal, its queue) and
``loop-actors submit`` (on the store itself, in its one thread, without trio). The plan
(:func:`submission_steps`) does no I/O: it asks for what it needs (the invocations that
the given ids name already, a chunk's starts committed with their queue rows, a row
added) and each caller answers from its own store, as h11 leaves the socket to its caller.

Every goal is checked before anything is written (:func:`submission_requests`: a
malformed goal, an id the runtime refuses, an id given twice); then every given id is
looked up, and an id that names an invocation of another goal or agent stops the
submission before anything is written. Each chunk of at most ``chunk_size`` goals is
one transaction: all of its new invocations are recorded with their runnable queue
rows, or none. A goal whose id names an invocation of the same goal and agent is not
recorded again (:attr:`SubmittedStatus.ALREADY_SUBMITTED`); its queue row is added if
it has none (a store written before rows were committed with their starts may have lost
one in a crash). A goal without an id gets a new random one: submitted again, it is a
new invocation.

Its records are named tuples, not dataclasses: ``loop-actors submit`` builds each class
when it starts, and a dataclass costs some five times as much to build.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Generator, Iterable, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any, NamedTuple, assert_never

from eventsourcing.persistence import IntegrityError, PersistenceError

from aggregates.events import DomainEvent
from aggregates.invocation import Invocation
from aggregates.standing import resting_status
from loop_actors._errors import (
    StoreUnavailableError,
    SubmissionError,
    SubmissionProblem,
    UsageError,
)
from loop_actors._faults import CrashPoint, fault_point
from loop_actors.agent.agent import Agent
from loop_actors.runtime.arguments import StartRequest, new_invocation
from loop_actors.store.queue import NewRow, WorkQueue
from loop_actors.store.store import EventStore
from loop_actors.store.url import StoreUrl
from loop_actors.telemetry import current_trace_parent

DEFAULT_SUBMIT_CHUNK = 500
"""Goals a transaction: large enough that a chunk's commit costs little a goal, small
enough that a transaction stays short (about a megabyte of starts)."""


class Submission(NamedTuple):
    """A goal for :meth:`Runtime.submit_many`, with what :meth:`Runtime.submit` takes beside it."""

    goal: str
    invocation_id: str | None = None
    """The id to record it under (None: a new random one, and no idempotence)."""
    task_class: str | None = None
    """Recorded for metrics (None: the agent's)."""
    actor: str | None = None
    tenant: str | None = None


class SubmittedStatus(StrEnum):
    """What a bulk submission did with one goal."""

    SUBMITTED = "submitted"
    """Recorded now, runnable."""
    ALREADY_SUBMITTED = "already_submitted"
    """Its id names an invocation of the same goal and agent: nothing recorded again."""


class Submitted(NamedTuple):
    """One goal of a bulk submission, as it went."""

    position: int
    """Its place in the submission, from 0."""
    invocation_id: str
    status: SubmittedStatus


# --------------------------------------------------------------------------- the steps


class ReadInvocations(NamedTuple):
    """Answer with ``EventStore.invocations_of(invocation_ids)``."""

    invocation_ids: list[str]


class CommitStarts(NamedTuple):
    """Commit these events and these queue rows in one transaction; answer True.

    Answer False when the store refused them as a conflict (an id taken meanwhile):
    nothing of them was written. Raise ``StoreUnavailableError`` for any other failure.
    """

    events: list[DomainEvent]
    rows: list[NewRow]


class AddRows(NamedTuple):
    """Add these queue rows (a row whose invocation has one is left as it is); answer None."""

    rows: list[NewRow]


class ChunkDone(NamedTuple):
    """A chunk is recorded: ``submitted`` says how each of its goals went; answer None."""

    submitted: list[Submitted]
    done: int
    """Goals done so far, this chunk's included."""
    total: int


SubmissionStep = ReadInvocations | CommitStarts | AddRows | ChunkDone


def goal_at(index: int) -> str:
    """How a goal of ``Runtime.submit_many`` is named in an error."""
    return f"goals[{index}]"


def submission_requests(
    agent: Agent,
    goals: Iterable[str | Submission],
    *,
    agent_ref: str | None = None,
    where: Callable[[int], str] = goal_at,
    caller: str = "submit_many",
) -> list[StartRequest]:
    """The checked start of every goal; nothing is read or written.

    Raises:
        UsageError: ``agent`` is not an Agent.
        SubmissionError: a goal is empty or missing, not a goal (a string or a
            :class:`Submission`), holds a value the runtime refuses, or gives an id
            an earlier goal gave.
    """
    if not isinstance(agent, Agent):
        raise UsageError(f"{caller}() needs an Agent, got {type(agent).__name__}")
    requests: list[StartRequest] = []
    first_at: dict[str, int] = {}
    trace_parent = current_trace_parent()  # the caller's span, for every goal it submits
    for index, item in enumerate(goals):
        goal = Submission(item) if isinstance(item, str) else item
        if not isinstance(goal, Submission):
            raise SubmissionError(
                where(index),
                SubmissionProblem.INVALID_VALUE,
                f"a goal is a string or a Submission, not a {type(goal).__name__}",
                index=index,
            )
        if not isinstance(goal.goal, str) or not goal.goal.strip():
            raise SubmissionError(
                where(index), SubmissionProblem.MISSING_GOAL, "the goal is empty", index=index
            )
        request = StartRequest(
            agent=agent,
            goal=goal.goal,
            invocation_id=goal.invocation_id,
            task_class=goal.task_class,
            actor=goal.actor,
            tenant=goal.tenant,
            agent_ref=agent_ref,
            trace_parent=trace_parent,
        )
        try:
            request.check(caller)
        except UsageError as error:
            raise SubmissionError(
                where(index), SubmissionProblem.INVALID_VALUE, str(error), index=index
            ) from None
        invocation_id = request.invocation_id
        if invocation_id is not None:
            earlier = first_at.setdefault(invocation_id, index)
            if earlier != index:
                raise SubmissionError(
                    where(index),
                    SubmissionProblem.DUPLICATE_ID,
                    f"id {invocation_id!r} is given twice: {where(earlier)} gives it too",
                    index=index,
                    invocation_id=invocation_id,
                )
        requests.append(request)
    return requests


def check_chunk_size(chunk_size: object) -> None:
    """Refuse a chunk size that is not a whole number of at least 1.

    Raises:
        UsageError: it is not.
    """
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise UsageError(f"chunk_size must be a whole number of at least 1, got {chunk_size!r}")


def submission_steps(
    requests: Sequence[StartRequest],
    *,
    chunk_size: int = DEFAULT_SUBMIT_CHUNK,
    now: Callable[[], datetime],
    where: Callable[[int], str] = goal_at,
) -> Generator[SubmissionStep, Any, list[Submitted]]:
    """Submit ``requests`` (checked: :func:`submission_requests`), asking for each I/O step.

    Returns how each goal went, in order. See the module's docstring.

    Raises:
        UsageError: ``chunk_size`` is not at least 1.
        SubmissionError: an id names an invocation of another goal or agent (found
            before anything is written, or, taken meanwhile, at its chunk: nothing of
            that chunk is written).
        StoreUnavailableError: a step failed; the chunks before it are recorded, its
            own is not (the error says how far the submission got).
        Exception: an invocation an id names cannot be read (its rows do not decode,
            its history was cut): as ``EventStore.invocations_of`` gives it.
    """
    check_chunk_size(chunk_size)
    return (yield from _Plan(requests, now, where).steps(chunk_size))


class _Plan:
    """One submission's state between its steps: the goals, and the invocations found."""

    def __init__(
        self,
        requests: Sequence[StartRequest],
        now: Callable[[], datetime],
        where: Callable[[int], str],
    ) -> None:
        self.requests = requests
        self.now = now
        self.where = where
        self.index_of = {r.invocation_id: i for i, r in enumerate(requests) if r.invocation_id}
        """The goal that gives each id."""
        self.existing: dict[str, Invocation] = {}
        """The invocations that given ids name already (of the same goal and agent)."""
        self.done: list[Submitted] = []

    def steps(self, chunk_size: int) -> Generator[SubmissionStep, Any, list[Submitted]]:
        """Look every given id up, then submit a chunk at a time."""
        total = len(self.requests)
        given = list(self.index_of)
        try:
            for start in range(0, len(given), chunk_size):  # all, before anything is written
                self.note_found((yield ReadInvocations(given[start : start + chunk_size])))
            for start in range(0, total, chunk_size):
                chunk = list(enumerate(self.requests))[start : start + chunk_size]
                made = yield from self.commit_chunk(chunk)
                again = [  # submitted before: its row, added if it has none
                    NewRow(
                        found.id, found.agent_name, request.agent_ref, resting_status(found.phase)
                    )
                    for _, request in chunk
                    if (found := self.existing.get(request.invocation_id or "")) is not None
                ]
                if again:  # a store of an earlier version may have lost one in a crash
                    yield AddRows(again)
                submitted = [self.went(index, request, made) for index, request in chunk]
                self.done += submitted
                yield ChunkDone(submitted, len(self.done), total)
        except StoreUnavailableError as error:
            raise StoreUnavailableError(self.stopped_at(str(error))) from error
        except SubmissionError as error:
            if not self.done:
                raise
            raise SubmissionError(
                error.where,
                error.problem,
                self.stopped_at(str(error).removeprefix(f"{error.where}: ")),
                index=error.index,
                invocation_id=error.invocation_id,
            ) from None
        return self.done

    def commit_chunk(
        self, chunk: list[tuple[int, StartRequest]]
    ) -> Generator[SubmissionStep, Any, dict[int, str]]:
        """Commit the chunk's new invocations in one transaction; their ids by goal index.

        A conflict (another process started one of its ids since they were looked up)
        is looked into, and the chunk tried again without the ids now taken.
        """
        while True:
            fresh = [
                (index, new_invocation(request, at=self.now()))
                for index, request in chunk
                if request.invocation_id not in self.existing
            ]
            if not fresh:
                return {}
            events: list[DomainEvent] = [e for _, new in fresh for e in new.take_events()]
            rows = [
                NewRow(new.id, new.agent_name, self.requests[index].agent_ref)
                for index, new in fresh
            ]
            if (yield CommitStarts(events, rows)):
                return {index: new.id for index, new in fresh}
            ids = [r.invocation_id for _, r in chunk if r.invocation_id not in self.existing]
            if not self.note_found((yield ReadInvocations([i for i in ids if i is not None]))):
                raise StoreUnavailableError(
                    "the store refused a chunk as a conflict, yet none of its ids was taken; "
                    "nothing of it was recorded"
                )

    def note_found(self, found: dict[str, Invocation | Exception]) -> int:
        """Keep the invocations found, each of its request's goal and agent; how many.

        Raises:
            SubmissionError: one is another goal's or agent's (``id_taken``).
            Exception: one cannot be read (as found).
        """
        for invocation_id, invocation in found.items():
            if isinstance(invocation, Exception):
                raise invocation
            index = self.index_of[invocation_id]
            request = self.requests[index]
            if invocation.goal != request.goal or invocation.agent_name != request.agent.name:
                raise SubmissionError(
                    self.where(index),
                    SubmissionProblem.ID_TAKEN,
                    f"id {invocation_id!r} names an invocation of another goal or agent "
                    f"({invocation.agent_name}: {invocation.goal[:60]!r})",
                    index=index,
                    invocation_id=invocation_id,
                )
            self.existing[invocation_id] = invocation
        return len(found)

    @staticmethod
    def went(index: int, request: StartRequest, made: dict[int, str]) -> Submitted:
        """How the goal at ``index`` went: recorded now (``made``) or before (under its id)."""
        if index in made:
            return Submitted(index, made[index], SubmittedStatus.SUBMITTED)
        assert request.invocation_id is not None  # only a goal with an id was there before
        return Submitted(index, request.invocation_id, SubmittedStatus.ALREADY_SUBMITTED)

    def stopped_at(self, problem: str) -> str:
        """``problem``, and how far the submission got before it."""
        if not self.done:
            return f"{problem}; nothing was submitted"
        return (
            f"{problem}; {len(self.done)} of {len(self.requests)} goals were submitted, from "
            f"{self.where(len(self.done))} on none was: submit again (a goal with an id is "
            "not submitted twice, one without an id is)"
        )


# --------------------------------------------------------------------------- the callers


class Stepper:
    """Walks a submission's steps for a caller that answers them (in a thread, or awaiting).

    ``next()`` gives the next step, or None once the plan is done (:attr:`result`);
    the caller hands back each step's answer (:meth:`answered`) or its failure
    (:meth:`failed`: a ``StoreUnavailableError``, which the plan rewords with how far
    the submission got).
    """

    def __init__(self, steps: Generator[SubmissionStep, Any, list[Submitted]]) -> None:
        """Walk ``steps`` (from :func:`submission_steps`)."""
        self._steps = steps
        self._reply: Any = None
        self._failure: StoreUnavailableError | None = None
        self.result: list[Submitted] = []
        """How each goal went, once ``next()`` gave None."""

    def next(self) -> SubmissionStep | None:
        """The next step, or None when the plan is done."""
        failure, self._failure = self._failure, None
        try:
            return self._steps.send(self._reply) if failure is None else self._steps.throw(failure)
        except StopIteration as finished:
            self.result = finished.value
            return None

    def answered(self, reply: Any) -> None:
        """The answer of the step ``next()`` gave."""
        self._reply = reply

    def failed(self, error: StoreUnavailableError) -> None:
        """The step ``next()`` gave failed with ``error``."""
        self._reply, self._failure = None, error


def run_steps(
    steps: Generator[SubmissionStep, Any, list[Submitted]],
    answer: Callable[[SubmissionStep], Any],
) -> list[Submitted]:
    """Walk a submission's steps answering each with ``answer``, in this thread."""
    stepper = Stepper(steps)
    while (step := stepper.next()) is not None:
        try:
            stepper.answered(answer(step))
        except StoreUnavailableError as error:
            stepper.failed(error)
    return stepper.result


class StoreSubmitter:
    """Answers a submission's steps on a store and its queue, in this thread (no trio).

    For ``loop-actors submit``: nothing else of this process writes the store, so its
    chunks are appended directly (with their queue rows), as the Journal would append them.
    """

    def __init__(
        self,
        store: EventStore,
        queue: WorkQueue,
        *,
        on_chunk: Callable[[ChunkDone], None] | None = None,
    ) -> None:
        """Answer on ``store`` and ``queue`` (both open; the caller closes them)."""
        self.store = store
        self.queue = queue
        self.on_chunk = on_chunk

    def answer(self, step: SubmissionStep) -> Any:
        """Do what ``step`` asks (see each step's docstring)."""
        match step:
            case ReadInvocations(invocation_ids=ids):
                return self.store.invocations_of(ids)
            case CommitStarts(events=events, rows=rows):
                try:
                    self.store.append(events, queue_rows=rows)
                except IntegrityError:
                    return False
                except (PersistenceError, sqlite3.Error) as error:
                    raise StoreUnavailableError(
                        f"cannot record the chunk: {type(error).__name__}: {error}"
                    ) from error
                fault_point(CrashPoint.AFTER_SUBMIT_CHUNK_COMMIT)
                return True
            case AddRows(rows=rows):
                self._add(rows)
                return None
            case ChunkDone():
                if self.on_chunk is not None:
                    self.on_chunk(step)
                return None
            case _:
                assert_never(step)

    def _add(self, rows: list[NewRow]) -> None:
        try:
            self.queue.enqueue_many(rows)
        except StoreUnavailableError as error:
            raise StoreUnavailableError(
                f"the queue rows of goals submitted before cannot be added ({error}); "
                "submitting them again adds them"
            ) from error


def submit_to_store(
    db_url: str,
    requests: Sequence[StartRequest],
    *,
    chunk_size: int = DEFAULT_SUBMIT_CHUNK,
    now: Callable[[], datetime],
    where: Callable[[int], str] = goal_at,
    on_chunk: Callable[[ChunkDone], None] | None = None,
) -> list[Submitted]:
    """Submit checked ``requests`` to the store at ``db_url`` (created if missing), in this thread.

    Raises:
        As :func:`submission_steps`; StoreUnavailableError: the store cannot be opened.
    """
    if StoreUrl.parse(db_url).kind == "memory":
        raise UsageError(
            "a memory:// store ends with this process: nothing would run what is submitted "
            "to it (submit to a SQLite file or PostgreSQL)"
        )
    store = EventStore(db_url)
    try:
        queue = store.open_queue()
        try:
            submitter = StoreSubmitter(store, queue, on_chunk=on_chunk)
            steps = submission_steps(requests, chunk_size=chunk_size, now=now, where=where)
            return run_steps(steps, submitter.answer)
        finally:
            queue.close()
    finally:
        store.close()
