"""A store that fails as told, and a clock that moves only when waited on.

With them the Journal's commit loop runs without a database (its lock waits and retries).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eventsourcing.persistence import OperationalError

from aggregates.events import DomainEvent
from loop_actors.store.journal import Commit, is_lock_failure
from loop_actors.store.queue import NewRow


class FakeClock:
    """Time that moves only when the store waits for a lock or the Journal sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class FakeStore:
    """An ``append`` that fails as told; every attempt is recorded with its lock wait.

    ``fail(events)`` returns the exception an attempt raises (None: it succeeds).
    A lock failure with ``busy`` costs the whole lock wait, as SQLite's busy
    timeout does; without it, it fails at once (as ``SQLITE_LOCKED`` does).
    """

    def __init__(
        self,
        clock: FakeClock,
        fail: Any,
        *,
        busy: bool = False,
        lock_timeout_s: float = 1.0,
    ) -> None:
        self.clock = clock
        self.fail = fail
        self.busy = busy
        self.lock_timeout_s = lock_timeout_s
        self.attempts: list[tuple[list[str], float | None]] = []
        self.written: list[str] = []

    def append(
        self,
        events: Sequence[DomainEvent],
        *,
        lock_wait_s: float | None = None,
        queue_rows: Sequence[NewRow] = (),
    ) -> int:
        ids = [str(event) for event in events]
        self.attempts.append((ids, lock_wait_s))
        error = self.fail(ids)
        if error is not None:
            if self.busy and is_lock_failure(error):
                self.clock.now += self.lock_timeout_s if lock_wait_s is None else lock_wait_s
            raise error
        self.written += ids
        return len(self.written)


def commits(*names: str) -> list[Commit]:
    """Commits of one stand-in event each (the fake store only looks at their text)."""
    return [Commit([name]) for name in names]  # type: ignore[list-item]


def locked() -> OperationalError:
    return OperationalError("database is locked")
