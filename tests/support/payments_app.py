"""A payment agent and the small payment service it writes to, for crash and reconciliation tests.

The service owns its receipts in its own SQLite file (``$PAYMENTS_DB``) and
honours idempotency keys: paying twice with one key records one payment and
returns the first receipt. Every request it receives is logged in ``attempts``,
so tests can count how often a write reached it.

``$PAYMENTS_INLINE=1`` makes both tools inline (run in the batch's own task on the
event loop) instead of plain functions run in a worker thread. The service's SQLite
writes then block the event loop for a moment, which a real inline tool must not do:
harmless here, where one invocation runs at a time.

Switches, as files (so a test can flip them between processes):
- ``$PAYMENTS_DB.down``: the service cannot be reached (pay and lookup raise).
- ``$PAYMENTS_DB.lose-reply``: the next payment is committed, then the reply
  is lost (the tool raises ``TimeoutError``); the file is removed.
- ``$PAYMENTS_DB.lose-request``: while it exists, every payment is lost on its way
  (the tool raises ``TimeoutError``; the service never sees it, and does not know its key).
- ``$PAYMENTS_DB.slow``: while it exists, each payment waits as many seconds as the
  file says after the service committed it, before it replies: a worker killed
  meanwhile leaves a write that the service knows and its store does not.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from loop_actors import Agent, Budget, ModelRequest, Reconciled, ScriptedModel, ToolContext, tool


class PaymentService:
    """The owning service: receipts by idempotency key."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def _connect(self) -> sqlite3.Connection:
        if Path(f"{self.path}.down").exists():
            raise ConnectionError("payment service unreachable")
        connection = sqlite3.connect(self.path, isolation_level=None, timeout=10)
        connection.execute(
            "CREATE TABLE IF NOT EXISTS payments (key TEXT PRIMARY KEY, recipient TEXT, "
            "amount INTEGER, receipt TEXT)"
        )
        connection.execute("CREATE TABLE IF NOT EXISTS attempts (key TEXT, recipient TEXT)")
        return connection

    def pay(self, key: str, recipient: str, amount: int) -> dict[str, Any]:
        if Path(f"{self.path}.lose-request").exists():
            raise TimeoutError("the payment request was lost before it reached the service")
        connection = self._connect()
        try:
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("INSERT INTO attempts VALUES (?, ?)", (key, recipient))
            connection.execute(
                "INSERT OR IGNORE INTO payments VALUES (?, ?, ?, ?)",
                (key, recipient, amount, f"rcpt-{key[-8:]}"),
            )
            connection.execute("COMMIT")
            row = connection.execute(
                "SELECT recipient, amount, receipt FROM payments WHERE key = ?", (key,)
            ).fetchone()
        finally:
            connection.close()
        slow = Path(f"{self.path}.slow")
        if slow.exists():
            time.sleep(float(slow.read_text() or "0"))
        lose = Path(f"{self.path}.lose-reply")
        if lose.exists():
            lose.unlink()
            raise TimeoutError("the reply was lost after the payment was committed")
        return {"receipt": row[2], "recipient": row[0], "amount": row[1]}

    def lookup(self, key: str) -> dict[str, Any] | None:
        connection = self._connect()
        try:
            row = connection.execute(
                "SELECT recipient, amount, receipt FROM payments WHERE key = ?", (key,)
            ).fetchone()
        finally:
            connection.close()
        if row is None:
            return None
        return {"receipt": row[2], "recipient": row[0], "amount": row[1]}

    def payments(self) -> list[tuple[str, str, int]]:
        connection = sqlite3.connect(self.path)
        try:
            return connection.execute(
                "SELECT key, recipient, amount FROM payments ORDER BY recipient"
            ).fetchall()
        finally:
            connection.close()

    def attempts(self) -> list[tuple[str, str]]:
        connection = sqlite3.connect(self.path)
        try:
            return connection.execute("SELECT key, recipient FROM attempts").fetchall()
        finally:
            connection.close()


def service() -> PaymentService:
    return PaymentService(os.environ["PAYMENTS_DB"])


BALANCES = {"alice": 100, "bob": 5, "carol": 7}

INLINE = os.environ.get("PAYMENTS_INLINE") == "1"


def _check_thread() -> None:
    """Inline tools run on the event loop's thread; the others in worker threads."""
    on_main = threading.current_thread() is threading.main_thread()
    if on_main is not INLINE:
        raise RuntimeError(f"inline={INLINE} but the tool runs on {threading.current_thread()}")


@tool(inline=INLINE)
def read_balance(account: str) -> dict[str, Any]:
    """Read an account's balance."""
    _check_thread()
    return {"account": account, "balance": BALANCES[account]}


def reconcile_payment(effect_key: str) -> Reconciled:
    """Ask the payment service what became of a payment key."""
    receipt = service().lookup(effect_key)
    if receipt is None:
        return Reconciled(status="not_found")
    return Reconciled(status="committed", receipt=receipt)


@tool(effect="write", reconcile=reconcile_payment, inline=INLINE)
def pay(recipient: str, amount: int, context: ToolContext) -> dict[str, Any]:
    """Pay an amount to a recipient."""
    _check_thread()
    assert context.effect_key is not None
    return service().pay(context.effect_key, recipient, amount)


def _decide(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return {
            "kind": "tool_calls",
            "calls": [
                {"id": "b1", "name": "read_balance", "arguments": {"account": "alice"}},
                {"id": "b2", "name": "read_balance", "arguments": {"account": "bob"}},
            ],
        }
    if request.step == 2:
        return {
            "kind": "tool_calls",
            "calls": [
                {"id": "p1", "name": "pay", "arguments": {"recipient": "bob", "amount": 30}},
                {"id": "p2", "name": "pay", "arguments": {"recipient": "carol", "amount": 20}},
            ],
        }
    if request.step == 3:
        return {
            "kind": "tool_calls",
            "calls": [{"id": "b3", "name": "read_balance", "arguments": {"account": "alice"}}],
        }
    receipts = sorted(
        str(r.output["receipt"])
        for turn in request.turns
        for r in turn.results
        if r.name == "pay" and isinstance(r.output, dict)
    )
    return {"kind": "final", "answer": "paid: " + ", ".join(receipts)}


agent = Agent("payments", ScriptedModel(_decide), [read_balance, pay], Budget(max_steps=6))
