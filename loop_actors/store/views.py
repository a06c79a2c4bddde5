"""Following the store live from trio: the read models' follower and its health.

Where the read models live, and opening them, is ``loop_actors.store.read_models``.
"""

from __future__ import annotations

from collections.abc import Sequence

import trio

from aggregates.decisions import Frozen
from loop_actors._logs import BackgroundLoop, package_logger
from loop_actors._logs import fields as log_fields
from projections import ProjectionRunner
from projections.runner import CatchUpReport

FOLLOW_POLL_S = 1.0
"""A follower also catches up this often, for commits made by other processes."""

FOLLOW_RETRY_FIRST_S = 1.0
"""After a failed catch-up the follower waits this long before it tries again..."""

FOLLOW_RETRY_MAX_S = 60.0
"""...twice as long after each further failure, at most this long."""

FOLLOW_LOG_EVERY_S = 300.0
"""While the read models stay stale, a failure is logged again at most this often."""

log = package_logger(__name__)


def follow_retry_s(failures: int, *, first_s: float, max_s: float) -> float:
    """How long the follower waits after ``failures`` catch-ups failed in a row (at least 1).

    ``first_s``, then doubled for each further failure, never more than ``max_s``.
    """
    if failures < 1:
        raise ValueError("a retry follows at least one failure")
    return float(min(max_s, first_s * 2.0 ** min(failures - 1, 62)))


class ReadModelsStatus(Frozen):
    """Where a runtime's followed read models stand (``Runtime.read_models_status()``)."""

    stale: bool
    """True while the last catch-up failed: the read models are not kept up to date."""
    position: int
    """The last event every read model has applied, at the last catch-up that succeeded."""
    failures: int
    """Catch-ups failed in a row since the last one that succeeded (0 while not stale)."""
    last_error: str | None
    """While stale, the last failure (its type and message); None otherwise."""
    retry_in_s: float | None
    """While stale, the wait before the next try, as last chosen; None otherwise."""
    skipped: int = 0
    """Stored rows the read models went past in this runtime's catch-ups: they cannot be
    decoded (``loop-actors projections status`` lists every one). Not stale for that."""


class FollowerHealth:
    """What the projection follower last saw, kept for whoever asks (the runtime).

    The follower writes it and the runtime reads it, both in the one trio thread.
    """

    def __init__(self, *, first_retry_s: float, max_retry_s: float) -> None:
        """A follower that has not caught up yet: not stale, at position 0."""
        self.first_retry_s = first_retry_s
        self.max_retry_s = max_retry_s
        self.status = ReadModelsStatus(
            stale=False, position=0, failures=0, last_error=None, retry_in_s=None
        )
        """The last status (replaced, never changed in place)."""
        self._logged_at: float | None = None

    def caught_up(self, reports: Sequence[CatchUpReport]) -> None:
        """A catch-up succeeded: not stale, at the position every read model reached.

        Rows it went past (they cannot be decoded; the runner logged each) are counted.
        """
        failures = self.status.failures
        position = min((r.position for r in reports), default=self.status.position)
        skipped = self.status.skipped + max((r.skipped for r in reports), default=0)
        self.status = ReadModelsStatus(
            stale=False,
            position=position,
            failures=0,
            last_error=None,
            retry_in_s=None,
            skipped=skipped,
        )
        if failures:
            self._logged_at = None
            log.info(
                "read models caught up again after %d failed catch-ups, at position %d",
                failures,
                position,
                extra={
                    **log_fields(loop=BackgroundLoop.READ_MODELS),
                    "failures": failures,
                    "position": position,
                },
            )

    def failed(self, error: Exception, now: float) -> float:
        """A catch-up failed at trio time ``now``: stale; log it (rate-limited).

        Returns:
            How long to wait before the next try.
        """
        failures = self.status.failures + 1
        retry_s = follow_retry_s(failures, first_s=self.first_retry_s, max_s=self.max_retry_s)
        self.status = ReadModelsStatus(
            stale=True,
            position=self.status.position,
            failures=failures,
            last_error=f"{type(error).__name__}: {error}",
            retry_in_s=retry_s,
            skipped=self.status.skipped,
        )
        fields = {
            **log_fields(loop=BackgroundLoop.READ_MODELS, error_type=type(error).__name__),
            "failures": failures,
            "position": self.status.position,
            "retry_in_s": retry_s,
        }
        if self._logged_at is None:
            self._logged_at = now
            log.error(
                "read models could not catch up; runs go on, the read models stay at "
                "position %d (stale) and are tried again in %.3g s",
                self.status.position,
                retry_s,
                exc_info=error,
                extra=fields,
            )
        elif now - self._logged_at >= FOLLOW_LOG_EVERY_S:
            self._logged_at = now
            log.error(
                "read models still stale after %d failed catch-ups (%s); tried again in %.3g s",
                failures,
                self.status.last_error,
                retry_s,
                extra=fields,
            )
        return retry_s


async def _catch_up(runner: ProjectionRunner, health: FollowerHealth) -> float | None:
    """One catch-up in a worker thread; its failure goes to ``health``, never up.

    Returns:
        None when it succeeded, else how long to wait before the next try.
    """
    try:
        reports = await trio.to_thread.run_sync(runner.catch_up)
    except Exception as error:  # a read model's failure must never end a run: kept, logged
        return health.failed(error, trio.current_time())
    health.caught_up(reports)
    return None


async def _wait_for_commits(
    wake: trio.MemoryReceiveChannel[None], seconds: float, *, until_woken: bool
) -> tuple[bool, bool]:
    """Wait ``seconds`` (or, with ``until_woken``, until a wake-up); wake-ups coalesce.

    Returns:
        Whether a wake-up came, and whether the channel is still open.
    """
    woken = False
    with trio.move_on_after(seconds):
        while True:
            try:
                await wake.receive()
            except trio.EndOfChannel:
                return woken, False
            woken = True
            if until_woken:
                break
    while True:  # coalesce the wake-ups that piled up
        try:
            wake.receive_nowait()
        except trio.WouldBlock:
            return woken, True
        except trio.EndOfChannel:
            return woken, False
        woken = True


async def run_projection_follower(
    runner: ProjectionRunner,
    wake: trio.MemoryReceiveChannel[None],
    *,
    health: FollowerHealth | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Keep read models caught up: after each commit the Journal reports, and every second.

    Catch-up runs in a worker thread (it is blocking database work); commits that
    arrive meanwhile coalesce into the next round. A catch-up that fails (a read
    model raising on an event, a full disk) never ends the follower: the read models
    keep their last good position, ``health`` records them stale and logs it
    (rate-limited), and the follower tries again after a bounded backoff
    (``FOLLOW_RETRY_FIRST_S`` doubling up to ``FOLLOW_RETRY_MAX_S``; commits meanwhile
    do not shorten it), until one succeeds. When ``wake`` closes, it catches up one
    last time if a commit came (or the read models are stale) and returns.

    Cancellation: returns when cancelled, backing off included; a catch-up in flight
    finishes in its thread (its transaction is atomic either way).
    """
    if health is None:
        health = FollowerHealth(first_retry_s=FOLLOW_RETRY_FIRST_S, max_retry_s=FOLLOW_RETRY_MAX_S)
    async with wake:
        task_status.started()
        while True:
            retry_s = await _catch_up(runner, health)
            woken, still_open = await _wait_for_commits(
                wake,
                FOLLOW_POLL_S if retry_s is None else retry_s,
                until_woken=retry_s is None,
            )
            if not still_open:
                if woken or health.status.stale:
                    await _catch_up(runner, health)
                return


__all__ = [
    "FollowerHealth",
    "ReadModelsStatus",
    "follow_retry_s",
    "run_projection_follower",
]
