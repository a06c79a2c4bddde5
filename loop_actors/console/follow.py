"""Following an invocation's committed events as they come (the SSE stream and ``watch``).

The store is the one source: the follower reads the events after the last one it
gave, every ``poll_s`` (another process may be the one committing), and stops after
``Terminated``. A paused invocation is followed on: it may be resumed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import trio

POLL_S = 0.2
"""How often a follower looks for new events."""
TERMINAL_EVENT = "Terminated"

ReadAfter = Callable[[int], Awaitable[list[dict[str, Any]]]]
"""Reads an invocation's ``history --json`` records after a position."""


async def follow_history(
    read_after: ReadAfter, *, after: int = 0, poll_s: float = POLL_S
) -> AsyncIterator[dict[str, Any]]:
    """The records after position ``after``, then each new one as it is committed, until the end.

    Ends after the ``Terminated`` record, or at once when the invocation had ended at
    or before ``after`` (a client that saw the end reconnects).

    Raises:
        InvocationNotFoundError: no such invocation (raised by ``read_after``, before
            anything is given).

    Cancellation: a checkpoint between reads; nothing changes.
    """
    records = await read_after(after)
    if not records and after > 0:
        # Nothing after it: at (or past) the end of an invocation that ended? Asked once.
        everything = await read_after(0)
        if everything and everything[-1]["type"] == TERMINAL_EVENT:
            return
    while True:
        for record in records:
            yield record
            after = record["position"]
            if record["type"] == TERMINAL_EVENT:
                return
        await trio.sleep(poll_s)
        records = await read_after(after)


__all__ = ["POLL_S", "TERMINAL_EVENT", "ReadAfter", "follow_history"]
