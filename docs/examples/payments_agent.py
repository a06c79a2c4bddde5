"""An agent that pays people, and the payment service it writes to.

Run it:    python payments_agent.py run ID "Pay bob 30 and carol 20"
Resume it: python payments_agent.py resume ID
or with the CLI: loop-actors run payments_agent:agent ... / loop-actors resume ID --agent ...
"""

import os
import re
import sqlite3
import sys
from contextlib import closing
from typing import Any

from loop_actors import (
    Agent,
    CannotContinue,
    ErrorClass,
    Final,
    ModelRequest,
    Reconciled,
    Runtime,
    ScriptedModel,
    ToolCall,
    ToolCalls,
    ToolContext,
    ToolError,
    tool,
)

LIMIT = 1000


class PaymentService:
    """A stand-in for a payment provider: at most one payment per idempotency key.

    Its receipts live in its own SQLite file: $PAYMENTS_DB, else payments.db in the
    current directory. It logs every request, to show how often a key reached it.
    Set $PAYMENTS_DOWN to make it unreachable.
    """

    def __init__(self) -> None:
        self.path = os.environ.get("PAYMENTS_DB", "payments.db")

    def _connect(self) -> sqlite3.Connection:
        if os.environ.get("PAYMENTS_DOWN"):
            raise ConnectionError("the payment service is down")
        db = sqlite3.connect(self.path, isolation_level=None, timeout=10)
        db.execute(
            "CREATE TABLE IF NOT EXISTS payments"
            " (receipt INTEGER PRIMARY KEY, key TEXT UNIQUE, recipient TEXT, amount INTEGER)"
        )
        db.execute("CREATE TABLE IF NOT EXISTS requests (key TEXT)")
        return db

    def pay(self, key: str, recipient: str, amount: int) -> dict[str, Any]:
        """Pay once per key: a key seen before returns the first payment's receipt."""
        with closing(self._connect()) as db:
            db.execute("INSERT INTO requests VALUES (?)", (key,))
            db.execute(
                "INSERT OR IGNORE INTO payments (key, recipient, amount) VALUES (?, ?, ?)",
                (key, recipient, amount),
            )
        receipt = self.lookup(key)
        assert receipt is not None
        return receipt

    def lookup(self, key: str) -> dict[str, Any] | None:
        """The receipt of the payment made with this key, or None if there is none."""
        with closing(self._connect()) as db:
            row = db.execute(
                "SELECT receipt, recipient, amount FROM payments WHERE key = ?", (key,)
            ).fetchone()
        if row is None:
            return None
        return {"receipt": f"R-{row[0]:04d}", "recipient": row[1], "amount": row[2]}

    def payments(self) -> list[tuple[str, int, int]]:
        """Every payment: recipient, amount and how many requests carried its key."""
        with closing(self._connect()) as db:
            return db.execute(
                "SELECT recipient, amount, (SELECT COUNT(*) FROM requests r WHERE r.key = p.key)"
                " FROM payments p ORDER BY receipt"
            ).fetchall()


def reconcile_payment(effect_key: str) -> Reconciled:
    """Ask the service what became of a payment, by its key (raises if it is down)."""
    receipt = PaymentService().lookup(effect_key)
    if receipt is None:
        return Reconciled(status="not_found")
    return Reconciled(status="committed", receipt=receipt)


@tool(effect="write", reconcile=reconcile_payment)
def pay(recipient: str, amount: int, context: ToolContext) -> dict[str, Any]:
    """Pay an amount of euros to a recipient."""
    assert context.effect_key is not None  # always set for a write
    if amount > LIMIT:
        # A refusal: the payment certainly did not happen. Class REJECTED says so.
        raise ToolError(f"over the limit of {LIMIT}", error_class=ErrorClass.REJECTED)
    # The effect key is the idempotency key: the same on every attempt and after a crash.
    return PaymentService().pay(context.effect_key, recipient, amount)


def decide(request: ModelRequest) -> ToolCalls | Final | CannotContinue:
    """Stand in for a real model: pay each "name amount" of the goal, then report."""
    if request.step == 1:
        pairs = re.findall(r"([a-z]+) (\d+)", request.goal.lower())
        if not pairs:
            return CannotContinue(reason="the goal names nobody to pay")
        return ToolCalls(
            calls=[
                ToolCall(id=f"p{n}", name="pay", arguments={"recipient": who, "amount": int(euros)})
                for n, (who, euros) in enumerate(pairs, start=1)
            ]
        )
    turn = request.turns[-1]
    assert isinstance(turn.decision, ToolCalls)
    lines = []
    for call, result in zip(turn.decision.calls, turn.results, strict=True):
        what = f"{call.arguments['recipient']} {call.arguments['amount']}"
        if result.error is None:
            assert isinstance(result.output, dict)
            lines.append(f"{what} paid ({result.output['receipt']})")
        else:
            lines.append(f"{what} not paid ({result.error.message})")
    return Final(answer="; ".join(lines))


agent = Agent("payments", ScriptedModel(decide), tools=[pay])

if __name__ == "__main__":
    command, invocation_id = sys.argv[1], sys.argv[2]
    runtime = Runtime()  # $LOOP_ACTORS_DB, else sqlite:///loop-actors.db
    if command == "run":
        outcome = runtime.run_sync(agent, sys.argv[3], invocation_id=invocation_id)
    else:
        outcome = runtime.resume_sync(invocation_id, agent)
    print(outcome.reason, "-", outcome.answer or outcome.detail)
    sys.exit(outcome.exit_code)
