"""``statistics()`` of the Runtime, the Journal and the Worker: frozen snapshots, cheap to take.

Like trio's ``MemorySendChannel.statistics()``: counters kept as the work happens (a
few integer additions per commit or run), copied into a frozen model when asked. No
message text of an error is kept: a driver's message may quote the values of a row
(a key, an argument), so ``last_error`` says only its class, where and when.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime

from aggregates.decisions import Frozen, TerminalReason
from loop_actors._logs import BackgroundLoop


class ErrorSeen(Frozen):
    """The last error caught: its class, the loop (or ``journal``) that caught it, and when.

    Never its message: a store's or a tool's message may quote what it was given.
    """

    error_type: str
    """The exception's class name (``OperationalError``)."""
    loop: BackgroundLoop
    """Which loop caught it (``heartbeat``, ``journal``...)."""
    at: datetime
    """When, in UTC."""


def later(*errors: ErrorSeen | None) -> ErrorSeen | None:
    """The most recent of ``errors`` (None when there is none)."""
    seen = [error for error in errors if error is not None]
    return max(seen, key=lambda error: error.at) if seen else None


def error_seen(noted: tuple[str, BackgroundLoop, datetime] | None) -> ErrorSeen | None:
    """A ``Throttle.last_error`` as an :class:`ErrorSeen`."""
    if noted is None:
        return None
    error_type, loop, at = noted
    return ErrorSeen(error_type=error_type, loop=loop, at=at)


class JournalStatistics(Frozen):
    """What a Journal has written since it opened, and what waits (``Journal.statistics()``)."""

    commits_queued: int
    """Commits handed to its thread and not answered yet."""
    transactions: int
    """Groups of commits it wrote, each in one transaction (a group that a conflict
    split into single commits counts once); failed ones included."""
    inline_transactions: int
    """Of those, written on the trio thread (an idle SQLite runtime's commits)."""
    commits_written: int
    """Commits made durable."""
    commits_failed: int
    """Commits refused: a conflict, a locked or failed store."""
    events_written: int
    """Events (rows of the events table) made durable."""
    last_commits_per_transaction: int
    """Commits in the last transaction (0 before the first)."""
    mean_commits_per_transaction: float
    """Commits per transaction, on average (0.0 before the first)."""
    last_events_per_transaction: int
    """Events made durable by the last transaction."""
    mean_events_per_transaction: float
    """Events made durable per transaction, on average."""
    last_error: ErrorSeen | None
    """The last commit refused for another reason than a conflict (None: none yet)."""


@dataclass(frozen=True, slots=True)
class TransactionWritten:
    """One transaction of the Journal, as its ``on_transaction`` hook is told of it."""

    commits: int
    """Commits in it (a group that a conflict split into single commits counts once)."""
    events: int
    """Events it made durable."""
    failed: int
    """Commits it refused."""
    duration_s: float
    """From its start to its end (the lock waits included), on a monotonic clock."""
    inline: bool
    """Written on the trio thread (an idle SQLite runtime's commit)."""


class JournalCounters:
    """The Journal's counters, noted from either thread that writes (locked)."""

    def __init__(self) -> None:
        """All zero."""
        self._lock = threading.Lock()
        self._transactions = 0
        self._inline = 0
        self._written = 0
        self._failed = 0
        self._events = 0
        self._last_commits = 0
        self._last_events = 0
        self._commits_in_all = 0
        self._last_error: ErrorSeen | None = None

    def note(
        self, *, commits: int, events: int, failed: int, error_type: str | None, inline: bool
    ) -> None:
        """A transaction of ``commits`` made ``events`` durable and refused ``failed`` commits.

        ``error_type``: the class of the last refusal that was not a conflict, if any.
        """
        at = datetime.now(UTC) if error_type is not None else None
        with self._lock:
            self._transactions += 1
            self._inline += inline
            self._commits_in_all += commits
            self._failed += failed
            self._written += commits - failed
            self._events += events
            self._last_commits, self._last_events = commits, events
            if error_type is not None and at is not None:
                self._last_error = ErrorSeen(
                    error_type=error_type, loop=BackgroundLoop.JOURNAL, at=at
                )

    def snapshot(self, *, queued: int) -> JournalStatistics:
        """The counters now, with ``queued`` commits waiting."""
        with self._lock:
            transactions = self._transactions
            return JournalStatistics(
                commits_queued=queued,
                transactions=transactions,
                inline_transactions=self._inline,
                commits_written=self._written,
                commits_failed=self._failed,
                events_written=self._events,
                last_commits_per_transaction=self._last_commits,
                mean_commits_per_transaction=(
                    self._commits_in_all / transactions if transactions else 0.0
                ),
                last_events_per_transaction=self._last_events,
                mean_events_per_transaction=self._events / transactions if transactions else 0.0,
                last_error=self._last_error,
            )


class QuotaStatistics(Frozen):
    """What the runtime's model calls waited for quota, since it opened."""

    granted: int = 0
    """Requests given quota."""
    waited: int = 0
    """Of them, those that had to wait."""
    waited_s: float = 0.0
    """The time they waited, in all."""
    paused: int = 0
    """Calls whose wait would have passed ``max_wait_s`` (their runs paused ``rate_limited``)."""
    throttled: int = 0
    """``rate_limited`` answers that blocked a limit for everyone."""


class ScheduleDue(Frozen):
    """A schedule and its next due time."""

    name: str
    due_at: datetime
    """In UTC."""


class ScheduleStatistics(Frozen):
    """What a worker's checks of the schedules did, since it started (``WorkerStatistics``)."""

    checks: int = 0
    """Checks of the schedules of its agents it made."""
    submitted: int = 0
    """Runs of schedules it recorded."""
    already_submitted: int = 0
    """Runs it submitted that were in the store already (another worker's, or its own again)."""
    skipped: int = 0
    """Due times its checks did not run because the previous run had not ended."""
    next_due: list[ScheduleDue] = []
    """The next due active schedules of its agents, soonest first, as of its last check."""


class RuntimeStatistics(Frozen):
    """What a Runtime does now and has done since it was made (``Runtime.statistics()``)."""

    open: bool
    """Whether it is open (``async with runtime``)."""
    runs_in_flight: int
    """Invocations it drives now."""
    runs_started: int
    """Drives of new invocations it began (``run``, ``submit_many`` runs, children...)."""
    runs_resumed: int
    """Drives of recorded invocations it began (``resume``, a worker's claims)."""
    runs_paused: int
    """Drives that stopped at a pause (approval, clarification, reconciliation)."""
    runs_ended: int
    """Drives that stopped otherwise: for good, or recording nothing (``lease_lost``)."""
    runs_sleeping: int = 0
    """Invocations :meth:`Runtime.resume_when_due` waits for in this process now (until
    their ``wake_at``)."""
    stops_by_reason: dict[TerminalReason, int]
    """Paused and ended drives, by reason."""
    leases_held: int
    """Leases it renews now."""
    store_down: bool
    """Whether the last thing its tasks tried on the store failed with an outage."""
    journal: JournalStatistics | None
    """Its Journal's, while it is open."""
    quota: QuotaStatistics | None = None
    """What its model calls waited for its shared rate limits, while it is open with some."""
    last_error: ErrorSeen | None
    """The last error its Journal or one of its store tasks caught (None: none yet).

    The heartbeat, lease releases, the cancel watcher, a worker's claims and drives,
    a store outage met by any task. The read models' follower reports its own
    (``read_models_status()``); the checkpointer's are in the log only.
    """


class RunCounters:
    """A Runtime's counts of drives, kept across its opens (on the trio thread)."""

    def __init__(self) -> None:
        """All zero."""
        self.started = 0
        self.resumed = 0
        self.stops: Counter[TerminalReason] = Counter()

    def began(self, *, fresh: bool) -> None:
        """A drive began, of a new invocation (``fresh``) or a recorded one."""
        if fresh:
            self.started += 1
        else:
            self.resumed += 1

    def stopped(self, reason: TerminalReason) -> None:
        """A drive stopped with ``reason``."""
        self.stops[reason] += 1

    @property
    def paused(self) -> int:
        """Drives that stopped at a pause."""
        return sum(count for reason, count in self.stops.items() if reason.pauses)

    @property
    def ended(self) -> int:
        """Drives that stopped otherwise."""
        return sum(count for reason, count in self.stops.items() if not reason.pauses)


class WorkerStatistics(Frozen):
    """What a Worker does now and has done since it started (``Worker.statistics()``)."""

    worker_id: str
    running: int
    """Invocations it drives now (claimed and not stopped)."""
    concurrency: int
    """The most it drives at once."""
    stopping: bool
    """Whether it was asked to stop (it claims nothing more)."""
    claimed: int
    """Invocations it claimed (one claimed twice counts twice)."""
    outcomes: dict[TerminalReason, int]
    """How the runs it drove stopped, by reason."""
    drained: int
    """Runs stopped at a commit because it was stopping."""
    abandoned: int
    """Runs stopped mid-step (the grace period ran out)."""
    failed: int
    """Claims it could not drive (left paused with a note, for a person)."""
    claim_failures: int
    """Claims that failed in a row just now (0 once one works)."""
    schedules: ScheduleStatistics = ScheduleStatistics()
    """What its checks of the schedules of its agents did, and their next due times."""
    runtime: RuntimeStatistics
    """Its runtime's: the Journal, the leases, the runs in flight."""


__all__ = [
    "ErrorSeen",
    "JournalCounters",
    "JournalStatistics",
    "RunCounters",
    "RuntimeStatistics",
    "ScheduleDue",
    "ScheduleStatistics",
    "TransactionWritten",
    "WorkerStatistics",
    "error_seen",
    "later",
]
