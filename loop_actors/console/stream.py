"""``GET /api/invocations/{id}/events``: an invocation's committed events as server-sent events.

One event per committed event: ``id:`` its position in the invocation's history (1
for ``InvocationStarted``), ``event:`` its type, ``data:`` the record exactly as
``loop-actors history --json`` prints it. A client that reconnects with
``Last-Event-ID: N`` (or asks ``?after=N``) gets the events after N, each once. The
stream stays open while the run goes on (paused included) and closes after
``Terminated``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import trio
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request

from aggregates.invocation import Phase
from loop_actors._errors import UsageError
from loop_actors.console.follow import POLL_S, follow_history
from loop_actors.console.reads import read_history
from loop_actors.console.tree import open_tree, tree_records
from loop_actors.runtime.runtime import Runtime

PING_S = 15
"""A comment line this often keeps proxies from closing a quiet stream."""
RETRY_MS = 1000
"""How long a browser's ``EventSource`` waits before it reconnects."""


class BadResumePointError(UsageError):
    """Raised when ``Last-Event-ID`` (or ``after``) is not a whole number of at least 0."""


def resume_point(request: Request) -> int:
    """Where the client is: ``Last-Event-ID``, else ``?after=N``, else 0 (from the start).

    Raises:
        BadResumePointError: not a whole number of at least 0.
    """
    text = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
    try:
        after = int(text)
    except ValueError:
        raise BadResumePointError(
            f"Last-Event-ID (or after) must be an event position, got {text!r}"
        ) from None
    if after < 0:
        raise BadResumePointError(f"Last-Event-ID (or after) must be at least 0, got {after}")
    return after


def as_server_sent(record: dict[str, Any]) -> ServerSentEvent:
    """One record as a server-sent event (its ``data`` is one line of JSON)."""
    return ServerSentEvent(
        data=json.dumps(record, ensure_ascii=False),
        event=record["type"],
        id=str(record["position"]),
        retry=RETRY_MS,
    )


async def event_stream(runtime: Runtime, request: Request) -> EventSourceResponse:
    """The stream of one invocation (404 before it starts, when there is no such invocation).

    Raises:
        InvocationNotFoundError: no such invocation.
        BadResumePointError: a malformed ``Last-Event-ID``.
    """
    invocation_id = request.path_params["invocation_id"]
    after = resume_point(request)
    await read_history(runtime, invocation_id, after=after)  # 404 now, not inside the stream

    async def events() -> AsyncIterator[ServerSentEvent]:
        read_after = partial(_read_after, runtime, invocation_id)
        async for record in follow_history(read_after, after=after):
            yield as_server_sent(record)

    return EventSourceResponse(
        events(), ping=PING_S, headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )


async def _read_after(runtime: Runtime, invocation_id: str, after: int) -> list[dict[str, Any]]:
    return await read_history(runtime, invocation_id, after=after)


async def tree_stream(runtime: Runtime, request: Request) -> EventSourceResponse:
    """The stream of an invocation and every one below it, in commit order (``tree``).

    Each event's ``id`` is its row in the store's log, one number across the tree;
    ``Last-Event-ID`` resumes after it. Closes after the root's ``Terminated``.

    Raises:
        InvocationNotFoundError: no such invocation.
        BadResumePointError: a malformed ``Last-Event-ID``.
    """
    root_id = request.path_params["invocation_id"]
    after = resume_point(request)
    driver = runtime.driver
    cursor = await driver.reads.call(partial(open_tree, driver.store, root_id, after=after))

    async def events() -> AsyncIterator[ServerSentEvent]:
        first = True
        while True:
            found, full = await driver.reads.call(partial(tree_records, driver.store, cursor))
            for notification_id, record in found:
                yield ServerSentEvent(
                    data=json.dumps(record, ensure_ascii=False),
                    event=record["type"],
                    id=str(notification_id),
                    retry=RETRY_MS,
                )
            if cursor.ended:
                return
            if first and not found and not full:
                root = await runtime.load(root_id)
                if root.phase is Phase.TERMINATED:  # it ended at or before Last-Event-ID
                    return
            first = False
            if not full:
                await trio.sleep(POLL_S)

    return EventSourceResponse(
        events(), ping=PING_S, headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )
