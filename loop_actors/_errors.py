"""The errors of the runtime. Each is raised for one situation and says what it was."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING

from aggregates.vocabulary import ErrorClass

if TYPE_CHECKING:
    from aggregates.fork import ForkRefusal
    from aggregates.schedules import ScheduleProblem
    from aggregates.standing import ApprovalRefusal


class LoopActorsError(Exception):
    """Raised when the runtime cannot do what was asked; the root of this package's errors."""


class UsageError(LoopActorsError):
    """Raised when the caller's input is wrong (bad argument, agent, URL); nothing was written."""


class StoreUrlError(UsageError):
    """Raised when a database URL is malformed or names an unsupported store."""


class StoreUnavailableError(UsageError):
    """Raised when the database cannot be opened, created or written."""


class StoreCipherError(StoreUnavailableError):
    """Raised when a store's events cannot be read with this process's cipher settings.

    The store is encrypted and ``CIPHER_KEY`` is missing or wrong, or it is encrypted
    and no cipher is configured, or ``CIPHER_TOPIC`` names a cipher whose package is
    not installed (``pip install 'loop-actors[crypto]'``). Nothing was written.
    """


class StoreReadOnlyError(StoreUnavailableError):
    """Raised when a command that writes meets a store this process must only read."""


class RuntimeBusyError(UsageError):
    """Raised when a call is made on a Runtime that a call in another thread is using.

    A ``Runtime`` runs one call at a time (a ``run_sync``, a ``resume_sync``, an
    ``async with`` block): its open store, lease holder and event loop belong to that
    call. The second call is refused, nothing was run or recorded; give each thread a
    ``Runtime`` of its own, or run the calls concurrently inside one
    ``async with Runtime(...)``.
    """

    def __init__(self, thread: str) -> None:
        super().__init__(
            f"this runtime is in use by a call in thread {thread!r}: a Runtime runs one "
            "call at a time (give each thread its own Runtime, or run the calls "
            "concurrently inside one `async with Runtime(...)`); nothing was run"
        )
        self.thread = thread


class AgentLoadError(UsageError):
    """Raised when ``MODULE:ATTR`` does not name an importable ``Agent``."""


class ToolDefinitionError(UsageError):
    """Raised when a function cannot be made into a tool (bad signature, duplicate name)."""


class InvocationNotFoundError(UsageError):
    """Raised when no invocation has the given id."""

    def __init__(self, invocation_id: str) -> None:
        super().__init__(f"no invocation with id {invocation_id!r}")
        self.invocation_id = invocation_id


class InvocationExistsError(UsageError):
    """Raised when an invocation id is already taken by an invocation that cannot be reused."""

    def __init__(self, invocation_id: str, why: str = "already exists") -> None:
        super().__init__(f"invocation {invocation_id!r} {why}")
        self.invocation_id = invocation_id


class SubmissionProblem(StrEnum):
    """What is wrong with a goal of a bulk submission (``submit_many``, ``submit --goals``)."""

    UNREADABLE_FILE = "unreadable_file"
    """The goals file does not exist, is not a file, cannot be read, or is not UTF-8 text."""
    BLANK_LINE = "blank_line"
    """A line of the goals file holds nothing (a goal a line: a blank line is a mistake)."""
    MALFORMED_LINE = "malformed_line"
    """A line that starts like a JSON object but is not one with the known fields and types."""
    MISSING_GOAL = "missing_goal"
    """No goal, or an empty one."""
    INVALID_VALUE = "invalid_value"
    """A value the runtime refuses: an id in its own namespaces, a control character, a
    lone surrogate, something that is not a goal at all."""
    DUPLICATE_ID = "duplicate_id"
    """An id that two goals of the same submission give."""
    ID_TAKEN = "id_taken"
    """An id that names an invocation of another goal or agent in the store."""


class SubmissionError(UsageError):
    """Raised when a goal of a bulk submission cannot be submitted.

    ``where`` names the goal (``goals[3]``, ``goals.jsonl:4``); ``problem`` says what
    is wrong with it (:class:`SubmissionProblem`). A goal found wrong before anything
    is written (every problem but a race) stops the submission with nothing written;
    an id taken by another process while the submission runs stops it at that goal's
    chunk, nothing of which is written (the chunks before it are).
    """

    def __init__(
        self,
        where: str,
        problem: SubmissionProblem,
        detail: str,
        *,
        index: int | None,
        invocation_id: str | None = None,
    ) -> None:
        super().__init__(f"{where}: {detail}")
        self.where = where
        self.problem = problem
        self.index = index
        """The goal's place in the submission, from 0 (None: the goals file itself)."""
        self.invocation_id = invocation_id


class LeaseHeldError(InvocationExistsError):
    """Raised when another process holds a live lease on the invocation: it is driving it now.

    Nothing was run or recorded. Wait for the lease to be released or to run out,
    or take it over deliberately (``take_over=True``, ``resume --take-over``): the
    holder's next append is then refused and it stops with ``lease_lost``.
    """

    def __init__(
        self,
        invocation_id: str,
        holder: str,
        expires_at: datetime,
        seconds_left: float,
        *,
        instead: str = "resume with --take-over (take_over=True) to fence it off",
    ):
        LoopActorsError.__init__(
            self,
            f"invocation {invocation_id!r} is being driven by {holder}; its lease runs until "
            f"{expires_at:%Y-%m-%d %H:%M:%S} UTC (in {max(0.0, seconds_left):.0f} s): wait for "
            f"it to stop, or {instead}",
        )
        self.invocation_id = invocation_id
        self.holder = holder
        self.expires_at = expires_at
        self.seconds_left = seconds_left


class ForkRefusedError(UsageError):
    """Raised when an invocation cannot be forked where asked; nothing was written.

    ``refusal`` says why (:class:`aggregates.fork.ForkRefusal`); the message says what
    to do instead (settle a write first, fork at another step).
    """

    def __init__(self, refusal: ForkRefusal, message: str) -> None:
        super().__init__(message)
        self.refusal = refusal


class ScriptExhaustedError(LoopActorsError):
    """Raised when a ScriptedModel is asked for a step its script does not have."""


class ToolError(Exception):
    """Raised by a tool to return a structured error (class, retryable, message) to the model."""

    def __init__(
        self,
        message: str,
        *,
        error_class: ErrorClass = ErrorClass.TOOL_FAILED,
        retryable: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.error_class = error_class
        self.retryable = retryable


class ApprovalRefusedError(UsageError):
    """Raised when an approval or denial does not apply: wrong digest, or nothing waits for one."""

    def __init__(self, message: str, refusal: ApprovalRefusal | None = None) -> None:
        super().__init__(message)
        self.refusal = refusal
        """Why (``not_waiting``: already decided, or never asked; ``other_digest``)."""


class NotWaitingError(UsageError):
    """Raised when an answer or a decision is given to an invocation that is not waiting for it."""


class SleepTimeError(UsageError):
    """Raised when ``ctx.sleep_until`` is given something other than a datetime with a time zone.

    A naive datetime names no moment (which zone?): it is refused rather than guessed.
    """


class ScheduleError(UsageError):
    """Raised when a schedule's definition is malformed; ``problem`` says how. Nothing is written.

    A bad ``every`` (``0m``, ``5x``), a malformed or never-due cron expression, an unknown
    time zone, a time zone with ``every``, a bad name, an empty goal.
    """

    def __init__(self, message: str, problem: ScheduleProblem) -> None:
        super().__init__(message)
        self.problem = problem


class ScheduleExistsError(UsageError):
    """Raised when a schedule is added under a name another schedule of the store has."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"a schedule named {name!r} exists already: remove it first "
            f"(loop-actors schedule remove {name})"
        )
        self.name = name


class ScheduleNotFoundError(UsageError):
    """Raised when no schedule of the store has the given name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no schedule named {name!r} (loop-actors schedule list shows them)")
        self.name = name


class EffectNotFoundError(UsageError):
    """Raised when no effect has the given effect key."""

    def __init__(self, effect_key: str) -> None:
        super().__init__(f"no effect with key {effect_key!r} (keys look like eff-...)")
        self.effect_key = effect_key


class EffectResolutionError(UsageError):
    """Raised when an effect cannot be settled by hand as asked; nothing is recorded.

    The effect is already settled, its invocation may still be running, or the
    resolution is malformed (both or neither of committed and rejected, no name,
    a rejection without a reason or with a receipt, a receipt that is not JSON).
    """


class InconsistentHistoryError(LoopActorsError):
    """Raised when a resume finds a history that disagrees with itself; nothing ran.

    The ledger holds effects (writes) of the invocation that none of its stored
    dispatched batches names: its history was cut (events deleted from the
    store). Resuming would ask the model again for steps already taken, and a
    write could run twice. Or a write of the batch that waits for its results has no
    ledger entry (deleted by hand): whether it ran is unknown. Or its history ends
    with a decision that is always stored with what follows it (its ``Terminated``
    deleted, say), or its stored events cannot be replayed at all (a row deleted from
    the middle, or its first; an event its transitions refuse): no run can go on from
    it. Or a stored
    snapshot of the invocation differs from the replay of its events (forged), and
    the invocation would be read from it. ``loop-actors audit verify`` checks the
    store; the CLI exits 4, as that command does when it finds a break.
    ``invocation_id`` is the invocation's id (the effect key, for a write's ledger
    entry whose rows cannot be replayed).
    """

    def __init__(self, invocation_id: str, problem: str) -> None:
        super().__init__(problem)
        self.invocation_id = invocation_id
        self.problem = problem


class UnreadableEventError(InconsistentHistoryError):
    """Raised when a stored event cannot be read; nothing was run or written because of it.

    Its stored topic names no loop-actors event class, or its first event names an
    aggregate class that is not loop-actors' (neither is imported: a topic is a module
    path, and importing it runs that module), or its state does not decode into its
    class: the store was edited by hand or damaged. ``loop-actors audit verify``
    reports the row; the CLI exits 4, as that command does when it finds a break.
    ``invocation_id`` is the id of the aggregate whose row it is (an invocation, or
    an effect key or a cancel request's id); ``position`` the row's place in it.
    """

    def __init__(self, aggregate_id: str, position: int, topic: str, problem: str) -> None:
        super().__init__(
            aggregate_id,
            f"the stored event at position {position} of {aggregate_id} cannot be read: "
            f"{problem} (the store was changed by hand or damaged; check it with: "
            "loop-actors audit verify)",
        )
        self.position = position
        self.topic = topic
        self.why = problem


def single_exception(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception a nursery wrapped, or the group itself when there are several.

    A controller's actors only fail by bugs; what the caller should see is the
    error itself, not trio's wrapper around it.
    """
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error
