"""A payment agent whose one payment waits while the test takes its store away.

``pay`` pays through ``payments_app``'s service (``$PAYMENTS_DB``, outside the store),
touches ``$OUTAGE_GATE/paid``, and waits for ``$OUTAGE_GATE/go`` (at most 60 s): in
between the test stops the PostgreSQL server or fills the store's disk, so that the
payment's results cannot be committed. Whoever continues the invocation (a resume, a
worker's claim) settles the payment with the service's ``reconcile_payment``, by its
effect key, so that the service counts one request however the story goes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from payments_app import reconcile_payment, service  # type: ignore[import-not-found]

from loop_actors import Agent, ModelRequest, ScriptedModel, ToolContext, tool

GATE_WAIT_S = 60.0


@tool(effect="write", reconcile=reconcile_payment)
def pay(recipient: str, amount: int, context: ToolContext) -> dict[str, Any]:
    """Pay an amount to a recipient, then wait until the test has taken the store away."""
    assert context.effect_key is not None
    receipt: dict[str, Any] = service().pay(context.effect_key, recipient, amount)
    gate = Path(os.environ["OUTAGE_GATE"])
    (gate / "paid").touch()
    deadline = time.monotonic() + GATE_WAIT_S
    while not (gate / "go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the test never said go")
        time.sleep(0.02)
    return receipt


def _decide(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        call = {"id": "p1", "name": "pay", "arguments": {"recipient": "bob", "amount": 30}}
        return {"kind": "tool_calls", "calls": [call]}
    output = request.turns[-1].results[0].output
    receipt = output["receipt"] if isinstance(output, dict) else output
    return {"kind": "final", "answer": f"paid bob 30 ({receipt})"}


agent = Agent("outage-payer", ScriptedModel(_decide), [pay])
