"""The agent the audit tests run: a read, then a write with an effect key, then an answer."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from aggregates.audit import PACKED_DEFLATE, is_packed, pack_state, unpack_state
from loop_actors import Agent, ModelRequest, Reconciled, ScriptedModel, ToolContext, tool

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
