"""Events to append to a store, made with the aggregates (no Runtime)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from aggregates.invocation import Invocation
from loop_actors import Budget


def started(invocation_id: str) -> list[Any]:
    """The events of a new invocation: its ``InvocationStarted``."""
    invocation = Invocation.start(
        invocation_id=invocation_id,
        goal="g",
        agent_name="a",
        agent_version="1",
        catalogue_digest="d",
        tools=[],
        budget=Budget(),
        at=datetime(2026, 11, 30, tzinfo=UTC),
    )
    return invocation.take_events()
