"""The agent the audit tests run: a read, then a write with an effect key, then an answer."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from aggregates.audit import PACKED_DEFLATE, chain_hash_of, is_packed, pack_state, unpack_state
from loop_actors import (
    Agent,
    EventStore,
    ModelRequest,
    Reconciled,
    ScriptedModel,
    ToolContext,
    tool,
)

RUNS: list[str] = []
"""The keys ``lookup`` was called with (a test clears it to see whether anything ran)."""


@tool
async def lookup(key: str) -> dict[str, str]:
    """Look up a value."""
    RUNS.append(key)
    return {"key": key, "value": "refund-under-100"}


@tool(effect="write", reconcile=lambda key: Reconciled(status="not_found"))
async def refund(amount: int, context: ToolContext) -> dict[str, Any]:
    """Refund an amount."""
    return {"receipt": f"r-{context.effect_key}", "amount": amount}


def decide(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return {
            "kind": "tool_calls",
            "calls": [{"id": "c1", "name": "lookup", "arguments": {"key": "policy"}}],
        }
    if request.step == 2:
        return {
            "kind": "tool_calls",
            "calls": [{"id": "c2", "name": "refund", "arguments": {"amount": 40}}],
        }
    return {"kind": "final", "answer": "refunded 40 under refund-under-100"}


AGENT = Agent("auditor", ScriptedModel(decide), [lookup, refund])


def tamperable(path: Path) -> sqlite3.Connection:
    """A connection to a store's file where SQL can edit a row as its JSON.

    Most rows are stored packed (docs/reference/audit-format.md): ``plain(state)`` gives
    a row's JSON state, ``repacked(state, plain)`` packs an edited JSON state the way
    ``state`` was packed, so a test edits what a tamperer who knows the layout would.
    """
    connection = sqlite3.connect(path)
    connection.create_function("plain", 1, unpack_state, deterministic=True)
    connection.create_function("repacked", 2, _repacked, deterministic=True)
    return connection


def _repacked(old: bytes, plain: bytes) -> bytes:
    if not is_packed(old):
        return plain
    return pack_state(plain, deflate=old[0] == PACKED_DEFLATE)


EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "verify_checkpoint.py"


def rows(db: Path) -> int:
    connection = sqlite3.connect(db)
    (count,) = connection.execute("SELECT COUNT(*) FROM stored_events").fetchone()
    connection.close()
    return int(count)


def rewrite_chain(db: Path, aggregate_id: str, position: int, **changes: Any) -> None:
    """Change one stored event's fields and recompute its chain from there to its head.

    What someone who can write the store and knows the format would do: the
    aggregate's chain verifies on its own afterwards (only what outside it committed to
    its hashes can tell: a checkpoint, a fork's record of its source).
    """
    store = EventStore(f"sqlite:///{db}")
    try:
        events = store.events(aggregate_id)
        previous = events[position - 2].chain_hash if position > 1 else "0" * 64
        states: dict[int, bytes] = {}
        for stored in events[position - 1 :]:
            edited = stored.model_copy(
                update=changes if stored.originator_version == position else {}
            )
            chained = edited.model_copy(update={"chain_hash": chain_hash_of(previous, edited)})
            previous = chained.chain_hash
            states[chained.originator_version] = store.app.mapper.to_stored_event(chained).state
    finally:
        store.close()
    connection = sqlite3.connect(db)
    with connection:
        for version, state in states.items():
            connection.execute(
                "UPDATE stored_events SET state = ? "
                "WHERE originator_id = ? AND originator_version = ?",
                (state, aggregate_id, version),
            )
    connection.close()
