"""Whether a runtime's store can be used, as its own tasks find it: one warning per outage.

While a database is gone (a PostgreSQL server stopped, a full disk, a lost network),
every task of a runtime meets it: the heartbeat renewing leases, the cancel watcher,
a run reloading after its failed commit, a worker's claims, the releases at close.
Each logging its own traceback, at every attempt, buried the one fact under hundreds
of lines. They report to the runtime's :class:`StoreOutages` instead, which logs the
first failure of an outage as one line that says what happens meanwhile, and the
store's return as another; a failure's traceback is logged at DEBUG (through the
runtime's :class:`~loop_actors._logs.Throttle`: once a minute per error class, the
others counted), so nothing is swallowed. Failures that are not outages (a bug of
ours) are left to the caller, which logs them with their traceback through the same
throttle (``StoreOutages.throttle``).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable

from eventsourcing.persistence import InterfaceError, OperationalError

from aggregates.values import describe_error, safe_text
from loop_actors._errors import LoopActorsError, StoreUnavailableError
from loop_actors._logs import BackgroundLoop, Throttle, fields, package_logger
from loop_actors.store.url import redacted_url

log = package_logger(__name__)

OUTAGE_LOG_EVERY_S = 60.0
"""A store that keeps failing and answering again is warned about at most this often."""


def is_outage(error: BaseException) -> bool:
    """Whether ``error`` says that the store cannot be used now, rather than a bug of ours.

    The store's own translation of a driver failure (``StoreUnavailableError`` from the
    work queue, eventsourcing's ``OperationalError`` or ``InterfaceError`` from the
    recorders), or SQLite's ``OperationalError`` raised directly: a server that is
    gone or refuses connections, a disk that is full or read-only, a database locked
    for longer than the store waits.
    """
    return isinstance(
        error, StoreUnavailableError | OperationalError | InterfaceError | sqlite3.OperationalError
    )


def one_line(error: BaseException) -> str:
    """The error on one line (libpq's messages have several), any password hidden.

    ``Type: message`` for a driver's error; our own errors' messages say what they are.
    """
    text = safe_text(error) if isinstance(error, LoopActorsError) else describe_error(error)
    return redacted_url(" ".join(text.split()))


class StoreOutages:
    """What a runtime's tasks found of its store: whether it works, and since when not.

    One per open runtime, shared by its tasks, all in the one trio thread.
    """

    def __init__(self, *, lease_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        """No outage yet; ``lease_s`` is how soon the leases not given back run out."""
        self.lease_s = lease_s
        self._clock = clock
        self._down_since: float | None = None
        self._warned = False
        """Whether the outage going on now was warned about (its end is, then, too)."""
        self._warned_at: float | None = None
        self.throttle = Throttle(clock=clock)
        """How the runtime's loops log what they catch (one per runtime)."""

    @property
    def down(self) -> bool:
        """Whether the last thing tried on the store failed with an outage."""
        return self._down_since is not None

    def failed(self, doing: str, error: BaseException) -> bool:
        """Note that ``doing`` (``"renewing leases"``) failed with ``error``.

        Returns:
            True when ``error`` is an outage: noted, and warned about if it is the first
            failure of one (at most once every :data:`OUTAGE_LOG_EVERY_S`). False for
            any other error: the caller logs it, with its traceback.
        """
        if not is_outage(error):
            return False
        self.throttle.caught(
            log,
            BackgroundLoop.STORE,
            error,
            "the store failed while %s",
            doing,
            level=logging.DEBUG,
        )
        self._went_down(doing, one_line(error), type(error).__name__)
        return True

    def commit_failed(self, detail: str) -> None:
        """Note that a run's commit failed (its outcome ``checkpoint_failed``, ``detail``).

        Warned about as any outage (once); from now on the runtime's other writes
        (leases given back, a holder deregistered) are not each made to wait the
        store's whole lock or connect timeout before the run's outcome is answered.
        """
        self._went_down("committing a step", " ".join(detail.split()), None)

    def _went_down(self, doing: str, why: str, error_type: str | None) -> None:
        now = self._clock()
        if self._down_since is not None:
            return
        self._down_since = now
        self._warned = self._warned_at is None or now - self._warned_at >= OUTAGE_LOG_EVERY_S
        if self._warned:
            self._warned_at = now
            log.warning(
                "the store cannot be used (%s: %s); runs stop at their next commit "
                "(checkpoint_failed: resume continues each from its last one), leases not "
                "given back run out within %g s; trying again until it works",
                doing,
                why,
                self.lease_s,
                extra=fields(loop=BackgroundLoop.STORE, error_type=error_type),
            )

    def answered(self) -> None:
        """A write to the store succeeded: an outage going on is over (and said so)."""
        if self._down_since is None:
            return
        lasted = self._clock() - self._down_since
        self._down_since = None
        if self._warned:
            log.warning(
                "the store works again (it could not be used for %.0f s)",
                lasted,
                extra=fields(loop=BackgroundLoop.STORE),
            )


__all__ = ["OUTAGE_LOG_EVERY_S", "StoreOutages", "is_outage", "one_line"]
