"""How a model call waits for the runtime's shared rate limits: the gate it is handed.

The runtime sets the gate for the runs it drives (:func:`using_quota_gate`); a model
adapter's :func:`~loop_actors.agent.adapters.call_with_retries` asks it before each
attempt. No trio, no store here: the gate is the runtime's
(``loop_actors.runtime.quota.SharedQuota``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import Protocol

from loop_actors._errors import LoopActorsError


class QuotaWaitError(LoopActorsError):
    """Raised when a shared rate limit has no quota for a model call within its ``max_wait_s``.

    Nothing was sent. The run pauses ``rate_limited`` until ``until``.
    """

    def __init__(self, limit: str, until: datetime) -> None:
        super().__init__(f"no quota of {limit} before {until.isoformat()}")
        self.limit = limit
        self.until = until


class QuotaReservation(Protocol):
    """What a :class:`QuotaGate` handed out for one request."""

    @property
    def tokens(self) -> int:
        """The tokens reserved for it."""


class QuotaGate(Protocol):
    """The runtime's shared rate limits, as a model call sees them."""

    async def acquire(self, provider: str, model: str, tokens: int) -> QuotaReservation | None:
        """Wait for the quota of one request (None: no limit applies).

        Raises:
            QuotaWaitError: the quota would come past the limit's ``max_wait_s``.
        """

    async def settle(self, reservation: QuotaReservation, used_tokens: int) -> None:
        """Correct the reserved tokens by the reply's usage."""

    async def throttled(self, reservation: QuotaReservation, retry_after_s: float | None) -> None:
        """The provider answered ``rate_limited``: block the limit for every run and worker."""


_QUOTA_GATE: ContextVar[QuotaGate | None] = ContextVar("loop_actors_quota_gate", default=None)


@contextmanager
def using_quota_gate(gate: QuotaGate | None) -> Iterator[None]:
    """Model calls made inside (in this task and the ones it starts) wait for ``gate``."""
    token = _QUOTA_GATE.set(gate)
    try:
        yield
    finally:
        _QUOTA_GATE.reset(token)


def quota_gate() -> QuotaGate | None:
    """The shared rate limits model calls made here wait for (None: none)."""
    return _QUOTA_GATE.get()
