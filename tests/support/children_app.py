"""A parent agent that delegates payments to child agents, and a service that does not deduplicate.

The service (``$CHARGES_FILE``, one line per charge: ``effect-key amount``) charges
every request it gets: a payment sent twice is charged twice. Its ``lookup`` answers
by effect key, which is what the payer's ``reconcile`` asks.

``BOSS`` asks, in one batch, two ``payer`` children to pay 10 and 20, then answers.
``payer`` (a child) makes one ``charge`` and answers with its receipt.
``ORCHESTRATOR`` calls ``fan_out``, whose body runs three ``payer`` children at once
(``ctx.run_agent`` with a key each) to pay 1, 2 and 3.

``MEETING_BOSS`` asks two ``meeter`` children to pay 10 and 20; each charges, then
``meet``s the other: it waits until both have arrived (only with the ``.meet`` switch).

Switches, as files next to ``$CHARGES_FILE`` (so a test can flip them between processes):
- ``.hang``: after charging, ``charge`` waits (up to a minute) until the file is gone:
  the test SIGKILLs the process while both children wait there, charged and unrecorded.
- ``.meet``: ``meet`` writes ``.met-GOAL`` and waits (up to 20 s) until two are there,
  so it succeeds only if both children run at the same time.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import trio

from loop_actors import (
    Agent,
    Budget,
    ChildOutcome,
    ModelRequest,
    Reconciled,
    ScriptedModel,
    ToolContext,
    tool,
)


def charges_file() -> Path:
    return Path(os.environ["CHARGES_FILE"])


def charges() -> list[tuple[str, int]]:
    """Every charge the service made: (effect key, amount), in order."""
    path = charges_file()
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        key, amount = line.split()
        found.append((key, int(amount)))
    return found


def _lookup(effect_key: str) -> Reconciled:
    for key, amount in charges():
        if key == effect_key:
            return Reconciled(status="committed", receipt={"charged": amount, "key": key})
    return Reconciled(status="not_found")


@tool(effect="write", reconcile=_lookup, timeout_s=120)
def charge(amount: int, context: ToolContext) -> dict[str, Any]:
    """Charge an amount (every request is charged: the service keeps no idempotency keys)."""
    assert context.effect_key is not None
    with charges_file().open("a") as out:
        out.write(f"{context.effect_key} {amount}\n")
    hang = Path(f"{charges_file()}.hang")
    deadline = time.monotonic() + 60
    while hang.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"charged": amount, "key": context.effect_key}


def _pays(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        found = re.search(r"\d+", request.goal)
        amount = int(found.group()) if found else 1
        return {
            "kind": "tool_calls",
            "calls": [{"id": "c1", "name": "charge", "arguments": {"amount": amount}}],
        }
    return {"kind": "final", "answer": f"paid: {request.goal}"}


PAYER = Agent("payer", ScriptedModel(_pays), [charge], budget=Budget(max_steps=4, max_tool_calls=2))


def _delegates(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return {
            "kind": "tool_calls",
            "calls": [
                {"id": "p10", "name": "payer", "arguments": {"goal": "pay 10"}},
                {"id": "p20", "name": "payer", "arguments": {"goal": "pay 20"}},
            ],
        }
    return {"kind": "final", "answer": "both paid"}


BOSS = Agent(
    "boss",
    ScriptedModel(_delegates),
    [PAYER.as_tool()],
    budget=Budget(max_steps=10, max_tool_calls=10),
)


@tool(timeout_s=60)
async def meet(goal: str) -> str:
    """Wait until the other child is here too (with the ``.meet`` switch)."""
    switch = charges_file().with_name(charges_file().name + ".meet")
    if not switch.exists():
        return "alone"
    charges_file().with_name(f"{charges_file().name}.met-{goal.replace(' ', '-')}").touch()
    with trio.fail_after(20):
        # Another process may arrive: files, not a trio.Event.
        while len(list(charges_file().parent.glob(charges_file().name + ".met-*"))) < 2:  # noqa: ASYNC110
            await trio.sleep(0.05)
    return "met"


def _meets(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return _pays(request)
    if request.step == 2:
        call = {"id": "m1", "name": "meet", "arguments": {"goal": request.goal}}
        return {"kind": "tool_calls", "calls": [call]}
    return {"kind": "final", "answer": str(request.turns[-1].results[0].output)}


MEETER = Agent("meeter", ScriptedModel(_meets), [charge, meet], budget=Budget(max_steps=4))


def _meetings(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return {
            "kind": "tool_calls",
            "calls": [
                {"id": "m10", "name": "meeter", "arguments": {"goal": "pay 10"}},
                {"id": "m20", "name": "meeter", "arguments": {"goal": "pay 20"}},
            ],
        }
    outcomes = [ChildOutcome.read(r.output) for r in request.turns[-1].results]
    return {"kind": "final", "answer": " ".join(str(o.answer) for o in outcomes if o)}


MEETING_BOSS = Agent("meeting_boss", ScriptedModel(_meetings), [MEETER.as_tool()])


def _dispatch_again(effect_key: str) -> Reconciled:
    """Its body is safe to run again: each child is found by its key, none starts twice."""
    del effect_key
    return Reconciled(status="not_found")


@tool(effect="write", reconcile=_dispatch_again, timeout_s=120)
async def fan_out(context: ToolContext) -> list[str | None]:
    """Pay 1, 2 and 3 at once, each by a child."""
    answers: dict[int, str | None] = {}

    async def one(amount: int) -> None:
        outcome = await context.run_agent(PAYER, f"pay {amount}", key=f"pay-{amount}")
        answers[amount] = outcome.answer

    async with trio.open_nursery() as nursery:
        for amount in (1, 2, 3):
            nursery.start_soon(one, amount)
    return [answers[amount] for amount in (1, 2, 3)]


def _orchestrates(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return {"kind": "tool_calls", "calls": [{"id": "f", "name": "fan_out", "arguments": {}}]}
    return {"kind": "final", "answer": "fanned out"}


ORCHESTRATOR = Agent("orchestrator", ScriptedModel(_orchestrates), [fan_out])


def _bills(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return {
            "kind": "tool_calls",
            "calls": [{"id": "r", "name": "charge", "arguments": {"amount": -40}}],
        }
    return {"kind": "final", "answer": "refunded 40"}


BILLING = Agent("billing", ScriptedModel(_bills), [charge])


def _triages(request: ModelRequest) -> dict[str, Any]:
    return {"kind": "handoff", "to": "billing", "reason": "a refund", "summary": "refund 40"}


TRIAGE = Agent("triage", ScriptedModel(_triages), [], handoffs=[BILLING])
"""Hands every goal to ``BILLING``, which refunds 40 (a charge of -40) and answers."""
