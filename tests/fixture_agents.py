"""The agent that wrote ``tests/fixtures/store-0.1.0*.sql``, and the refund desk it writes to.

It imports only the public API (``loop_actors``), so that ``loop-actors resume ID
--agent tests.fixture_agents:agent`` keeps working on those stores whatever happens
to the runtime's private modules. Its name, tools, schemas, budget and approval rule
are recorded in every invocation of the fixtures: changing any of them makes resuming
those invocations a catalogue or settings change. Change nothing here but comments.
That includes where this module is: the approval rule is recorded by its module path
(``rule tests.fixture_agents.refund_needs_approval``), so this module stays at
``tests/fixture_agents.py`` and does not move into ``tests/support/`` with the rest.

One agent plays every invocation of the fixture, its script chosen by the goal
(``GOALS``). The refund desk is a small service with its own SQLite file
(``$FIXTURE_DESK_DB``): refunds by idempotency key, and every request it received in
``attempts``, so that a test can count how often a write reached it.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from loop_actors import (
    Agent,
    Budget,
    ErrorClass,
    ModelRequest,
    Reconciled,
    ScriptedModel,
    ToolContext,
    ToolError,
    Usage,
    tool,
)

DESK_ENV = "FIXTURE_DESK_DB"
"""The refund desk's SQLite file (required by the ``refund`` tool and its reconcile)."""

LONG_STEPS = 34
"""Lookups of the long invocation: with its start, final step and end, 105 events (a snapshot at 100)."""

APPROVAL_LIMIT = 100
"""Refunds above this many euros wait for a person's approval."""


class RefundDesk:
    """The service a refund is written to: one refund per idempotency key."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self.path, isolation_level=None, timeout=10)
        connection.execute(
            "CREATE TABLE IF NOT EXISTS refunds (key TEXT PRIMARY KEY, order_id TEXT, "
            "amount INTEGER, receipt TEXT)"
        )
        connection.execute(
            "CREATE TABLE IF NOT EXISTS attempts (key TEXT, order_id TEXT, attempt INTEGER)"
        )
        return connection

    def refund(self, key: str, order_id: str, amount: int, attempt: int) -> dict[str, Any]:
        """Refund ``amount`` on ``order_id`` once per ``key``; the first receipt every time."""
        with closing(self._connect()) as connection:
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("INSERT INTO attempts VALUES (?, ?, ?)", (key, order_id, attempt))
            connection.execute(
                "INSERT OR IGNORE INTO refunds VALUES (?, ?, ?, ?)",
                (key, order_id, amount, f"rf-{order_id}-{amount}"),
            )
            connection.execute("COMMIT")
            row = connection.execute(
                "SELECT order_id, amount, receipt FROM refunds WHERE key = ?", (key,)
            ).fetchone()
        return {"receipt": row[2], "order_id": row[0], "amount": row[1]}

    def lookup(self, key: str) -> dict[str, Any] | None:
        """The refund recorded under ``key``, or None when the desk never saw it."""
        with closing(self._connect()) as connection:
            row = connection.execute(
                "SELECT order_id, amount, receipt FROM refunds WHERE key = ?", (key,)
            ).fetchone()
        if row is None:
            return None
        return {"receipt": row[2], "order_id": row[0], "amount": row[1]}

    def refunds(self) -> list[tuple[str, str, int]]:
        """(key, order, amount) of every refund made."""
        with closing(self._connect()) as connection:
            return connection.execute(
                "SELECT key, order_id, amount FROM refunds ORDER BY order_id"
            ).fetchall()

    def attempts(self) -> list[tuple[str, str, int]]:
        """(key, order, attempt) of every request received, in order."""
        with closing(self._connect()) as connection:
            return connection.execute(
                "SELECT key, order_id, attempt FROM attempts ORDER BY rowid"
            ).fetchall()


def desk() -> RefundDesk:
    """The refund desk named by ``$FIXTURE_DESK_DB``."""
    return RefundDesk(os.environ[DESK_ENV])


ORDERS: dict[str, dict[str, Any]] = {
    "A-1": {"order_id": "A-1", "status": "delivered", "total": 40},
    "A-2": {"order_id": "A-2", "status": "delivered", "total": 250},
    "A-3": {"order_id": "A-3", "status": "lost in transit", "total": 60},
}


@tool
def lookup_order(order_id: str) -> dict[str, Any]:
    """Look an order up: its status and total in euros."""
    if order_id in ORDERS:
        return ORDERS[order_id]
    if order_id.startswith("L-"):
        return {"order_id": order_id, "status": "archived", "total": 1}
    raise ToolError(f"no order {order_id}", error_class=ErrorClass.TOOL_FAILED)


def reconcile_refund(effect_key: str) -> Reconciled:
    """Ask the refund desk what became of a refund key."""
    receipt = desk().lookup(effect_key)
    if receipt is None:
        return Reconciled(status="not_found")
    return Reconciled(status="committed", receipt=receipt)


def refund_needs_approval(arguments: dict[str, Any]) -> bool:
    """A refund above ``APPROVAL_LIMIT`` euros waits for a person."""
    return int(arguments["amount"]) > APPROVAL_LIMIT


@tool(effect="write", reconcile=reconcile_refund, requires_approval=refund_needs_approval)
def refund(order_id: str, amount: int, context: ToolContext) -> dict[str, Any]:
    """Refund an amount of euros on an order (above 100 a person must approve it)."""
    assert context.effect_key is not None
    return desk().refund(context.effect_key, order_id, amount, context.attempt)


def _receipts(request: ModelRequest) -> str:
    receipts = sorted(
        str(result.output["receipt"])
        for result in request.results
        if result.name == "refund" and isinstance(result.output, dict)
    )
    return ", ".join(receipts)


def _refund_a1(request: ModelRequest) -> dict[str, Any]:
    """A read, a small refund (a write), an answer."""
    if request.step == 1:
        return _calls(("l1", "lookup_order", {"order_id": "A-1"}))
    if request.step == 2:
        return _calls(("r1", "refund", {"order_id": "A-1", "amount": 40}))
    return {"kind": "final", "answer": f"refunded A-1: {_receipts(request)}"}


def _refund_a2(request: ModelRequest) -> dict[str, Any]:
    """A refund of 250 (it waits for approval), then an answer."""
    if request.step == 1:
        return _calls(("r1", "refund", {"order_id": "A-2", "amount": 250}))
    return {"kind": "final", "answer": f"refunded A-2: {_receipts(request)}"}


def _which_order(request: ModelRequest) -> dict[str, Any]:
    """A question; then a lookup of the order named in the answer; then an answer."""
    reply = next((turn.reply for turn in request.turns if turn.reply), None)
    if reply is None:
        return {"kind": "clarification", "question": "which order?"}
    if not request.results:
        return _calls(("l1", "lookup_order", {"order_id": reply}))
    status = request.results[-1].output
    assert isinstance(status, dict)
    return {"kind": "final", "answer": f"order {reply} is {status['status']}"}


def _refund_a3(request: ModelRequest) -> dict[str, Any]:
    """A refund of 60 (no approval needed), then an answer: the run killed after dispatching it."""
    if request.step == 1:
        return _calls(("r1", "refund", {"order_id": "A-3", "amount": 60}))
    return {"kind": "final", "answer": f"refunded A-3: {_receipts(request)}"}


def _unknown_order(request: ModelRequest) -> dict[str, Any]:
    """A lookup that fails, then giving up."""
    if request.step == 1:
        return _calls(("l1", "lookup_order", {"order_id": "B-7"}))
    return {"kind": "cannot_continue", "reason": "no order B-7"}


def _archive(request: ModelRequest) -> dict[str, Any]:
    """``LONG_STEPS`` lookups of distinct orders, one a step, then an answer."""
    if request.step <= LONG_STEPS:
        return _calls((f"l{request.step}", "lookup_order", {"order_id": f"L-{request.step}"}))
    return {"kind": "final", "answer": f"{len(request.results)} archived orders checked"}


def _calls(*calls: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "kind": "tool_calls",
        "calls": [{"id": i, "name": name, "arguments": arguments} for i, name, arguments in calls],
    }


GOALS: dict[str, Callable[[ModelRequest], dict[str, Any]]] = {
    "refund order A-1": _refund_a1,
    "refund order A-2 in full": _refund_a2,
    "where is my order?": _which_order,
    "refund order A-3": _refund_a3,
    "look up order B-7": _unknown_order,
    "check the archived orders": _archive,
}
"""Each goal of the fixture's invocations, and the script the model follows for it."""


def _decide(request: ModelRequest) -> dict[str, Any]:
    return GOALS[request.goal](request)


agent = Agent(
    "fixture-desk",
    ScriptedModel(_decide, usage=Usage(input_tokens=10, output_tokens=5, cost=0.001)),
    [lookup_order, refund],
    Budget(max_steps=40, max_tool_calls=60),
    task_class="support",
)
"""The fixture's agent: ``--agent tests.fixture_agents:agent``."""
