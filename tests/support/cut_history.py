"""A payer that charges twice, and a store's history cut by hand behind the effect ledger's back."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import trio

from loop_actors import (
    Agent,
    ModelRequest,
    Reconciled,
    Runtime,
    ScriptedModel,
    TerminalReason,
    ToolContext,
    tool,
)

CHARGES: list[str | None] = []


@tool(effect="write", reconcile=lambda amount: Reconciled(status="not_found"))
async def charge(amount: int, context: ToolContext) -> dict[str, Any]:
    """Charge an amount (counted: a second charge is what the refusal prevents)."""
    CHARGES.append(context.effect_key)
    return {"receipt": f"r-{context.effect_key}", "amount": amount}


def scripted(prefix: str) -> ScriptedModel:
    """A model that charges at step 2; its call ids start with ``prefix``."""

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step <= 2:
            return {
                "kind": "tool_calls",
                "calls": [
                    {
                        "id": f"{prefix}{request.step}",
                        "name": "charge",
                        "arguments": {"amount": 30 + 10 * request.step},
                    }
                ],
            }
        return {"kind": "final", "answer": "charged"}

    return ScriptedModel(decide)


def first_position(db: Path, invocation_id: str, type_name: str, nth: int) -> int:
    connection = sqlite3.connect(db)
    rows = connection.execute(
        "SELECT originator_version FROM stored_events WHERE originator_id = ? AND topic LIKE ? "
        "ORDER BY originator_version",
        (invocation_id, f"%:{type_name}"),
    ).fetchall()
    connection.close()
    return int(rows[nth - 1][0])


def cut_from(db: Path, invocation_id: str, version: int) -> int:
    """Delete the invocation's rows from ``version`` on, as the sqlite3 shell would."""
    connection = sqlite3.connect(db)
    with connection:
        deleted = connection.execute(
            "DELETE FROM stored_events WHERE originator_id = ? AND originator_version >= ?",
            (invocation_id, version),
        ).rowcount
    connection.close()
    assert deleted >= 1
    return deleted


def run_once(db: Path) -> None:
    async def go() -> None:
        async with Runtime(f"sqlite:///{db}") as runtime:
            outcome = await runtime.run(
                Agent("payer", scripted("c"), [charge]), "pay", invocation_id="p"
            )
            assert outcome.reason is TerminalReason.COMPLETED

    trio.run(go)
