"""The providers' rate limits, shared through the store by every run and worker.

A :class:`SharedQuota` is what an open runtime hands its model calls
(:func:`loop_actors.agent.adapters.using_quota_gate`): before each attempt a call asks
the store's row of its ``(provider, model)`` limit when it may start
(``WorkQueue.take_quota``, the rules of :mod:`aggregates.rate_limits`), and sleeps
until then; a reply's usage corrects the tokens it reserved; a ``rate_limited`` answer
blocks the limit for everyone.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import trio

from aggregates.rate_limits import Granted, RateLimit, TooLong
from loop_actors._errors import UsageError
from loop_actors._statistics import QuotaStatistics
from loop_actors.agent.quota import QuotaReservation, QuotaWaitError
from loop_actors.runtime.leases import LeaseKeeper

BUSY_RETRY_S = (0.001, 0.005)
"""How long a call waits before it asks again when another process held the limit's row."""


@dataclass(frozen=True, slots=True)
class Reservation:
    """One request's place under a limit: when it started and the tokens it reserved."""

    limit: RateLimit
    start: float
    tokens: int


def check_rate_limits(limits: Sequence[RateLimit]) -> dict[tuple[str, str], RateLimit]:
    """The limits by ``(provider, model)``.

    Raises:
        UsageError: something that is not a ``RateLimit``, or two for one model.
    """
    found: dict[tuple[str, str], RateLimit] = {}
    for limit in limits:
        if not isinstance(limit, RateLimit):
            raise UsageError(f"rate_limits takes RateLimit values, got {type(limit).__name__}")
        if limit.key in found:
            raise UsageError(f"two rate limits for {limit.provider}:{limit.model}")
        found[limit.key] = limit
    return found


class SharedQuota:
    """The shared rate limits of one open runtime (its model calls' ``QuotaGate``)."""

    def __init__(self, limits: dict[tuple[str, str], RateLimit], leases: LeaseKeeper) -> None:
        """Limits by ``(provider, model)``, kept in the store that ``leases``' queue uses."""
        self.limits = limits
        self.leases = leases
        self._counts: dict[str, float] = dict.fromkeys(QuotaStatistics.model_fields, 0)
        self._corrections: dict[tuple[str, str], int] = {}
        """Tokens used beyond (or short of) what was reserved, not yet written, by limit."""
        self._blocked: dict[tuple[str, str], float] = {}
        """Until when a ``rate_limited`` answer seen here blocked each limit (queue clock)."""
        self._asking = trio.CapacityLimiter(1)
        """One request of quota at a time goes to the queue's thread: the thread is
        shared with the heartbeat, which must not wait behind a thousand of them (its
        leases would run out, and another worker would take the runs over)."""

    def _count(self, **more: float) -> None:
        for name, value in more.items():
            self._counts[name] += value

    def statistics(self) -> QuotaStatistics:
        """What its model calls waited for quota so far."""
        counts = self._counts
        return QuotaStatistics(
            granted=int(counts["granted"]),
            waited=int(counts["waited"]),
            waited_s=counts["waited_s"],
            paused=int(counts["paused"]),
            throttled=int(counts["throttled"]),
        )

    async def acquire(self, provider: str, model: str, tokens: int) -> Reservation | None:
        """Wait until the store schedules this request under its limit (None: no limit).

        Raises:
            QuotaWaitError: its start would be more than the limit's ``max_wait_s`` away.

        Cancellation: a checkpoint; cancelled while it waits, the request's place is not
        used (it stays taken: the limit errs on the side of fewer requests).
        """
        limit = self.limits.get((provider, model))
        if limit is None:
            return None
        queue = self.leases.queue
        while True:
            correction = self._corrections.pop(limit.key, 0)
            try:
                async with self._asking:
                    verdict = await self.leases.call(
                        queue.take_quota, limit, tokens=tokens, correction=correction
                    )
            except BaseException:
                self._keep_correction(limit.key, correction)
                raise
            if verdict is None or isinstance(verdict, TooLong):
                self._keep_correction(limit.key, correction)  # nothing was written
            match verdict:
                case None:  # another process holds the row this instant
                    await trio.sleep(random.uniform(*BUSY_RETRY_S))  # noqa: S311 - jitter
                case TooLong(until=until):
                    self._count(paused=1)
                    raise QuotaWaitError(f"{provider}:{model}", datetime.fromtimestamp(until, UTC))
                case Granted(start=start, wait_s=wait_s, tokens=reserved):
                    self._count(waited=1 if wait_s > 0 else 0, waited_s=wait_s)
                    if wait_s > 0:
                        await trio.sleep(wait_s)
                    if self._blocked.get(limit.key, 0.0) > start:
                        continue  # refused meanwhile: its place is void, ask again
                    self._count(granted=1)
                    return Reservation(limit, start, reserved)

    def _keep_correction(self, key: tuple[str, str], tokens: int) -> None:
        if tokens:
            self._corrections[key] = self._corrections.get(key, 0) + tokens

    async def settle(self, reservation: QuotaReservation, used_tokens: int) -> None:
        """Correct the tokens a request reserved by its reply's usage.

        Kept here and written with this process's next request of the limit (one
        transaction a request, not two): until then the estimate stands.
        """
        assert isinstance(reservation, Reservation)
        if reservation.limit.tokens_per_minute is not None:
            self._keep_correction(reservation.limit.key, used_tokens - reservation.tokens)
        await trio.lowlevel.checkpoint()

    async def throttled(self, reservation: QuotaReservation, retry_after_s: float | None) -> None:
        """Block the limit for everyone after a ``rate_limited`` answer."""
        assert isinstance(reservation, Reservation)
        self._count(throttled=1)
        limit = reservation.limit
        until = await self.leases.call(
            self.leases.queue.throttle_quota, limit, retry_after_s=retry_after_s
        )
        self._blocked[limit.key] = max(self._blocked.get(limit.key, 0.0), until)
