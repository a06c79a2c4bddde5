"""Running an agent through the public API, and reading back what it stored."""

from __future__ import annotations

from typing import Any

import trio

from aggregates.invocation import ResultsCommitted
from loop_actors import Agent, Runtime
from loop_actors.audit.verify import verify_invocation
from loop_actors.store.store import EventStore


def assert_readable(db_url: str, invocation_id: str = "inv") -> list[Any]:
    """The invocation loads, its history reads, and its chains (and its writes') verify."""
    store = EventStore(db_url, create=False)
    try:
        events = store.events(invocation_id)
        reports = verify_invocation(store, invocation_id)
    finally:
        store.close()
    assert all(report.intact for report in reports), reports
    return events


async def drive(agent: Agent, db_url: str, goal: str = "g") -> tuple[Any, list[Any]]:
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            outcome = await runtime.run(agent, goal, invocation_id="inv")
            await runtime.load("inv")
            events = await runtime.history("inv")
    assert_readable(db_url)
    return outcome, events


async def run(agent: Agent, url: str = "memory://", invocation_id: str = "inv") -> Any:
    async with Runtime(url) as runtime:
        outcome = await runtime.run(agent, "g", invocation_id=invocation_id)
        events = await runtime.history(invocation_id)
    return outcome, events


def results_of(events: list[Any]) -> list[Any]:
    return [r for e in events if isinstance(e, ResultsCommitted) for r in e.results]
