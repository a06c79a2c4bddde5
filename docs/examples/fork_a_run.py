"""Fork an invocation: go on from a past step under a changed agent, without paying twice.

Run it from this folder: ``python fork_a_run.py``. It records a refund run (look the
order up, refund 40, answer), then forks it at step 1 under a changed agent that
proposes the same refund again, once with each ``writes`` choice. The refund service
records every refund with the effect key it was sent.
"""

from __future__ import annotations

from typing import Any

import trio

from loop_actors import Agent, Budget, Runtime, ScriptedModel, ToolContext, tool

REFUNDS: list[tuple[int, str | None]] = []

LOOKUP = {
    "kind": "tool_calls",
    "calls": [{"id": "c1", "name": "lookup", "arguments": {"order": "A-1"}}],
}
REFUND = {
    "kind": "tool_calls",
    "calls": [{"id": "c2", "name": "refund", "arguments": {"amount": 40}}],
}
RECORDED: list[dict[str, Any]] = [LOOKUP, REFUND, {"kind": "final", "answer": "refunded 40"}]
CHANGED: list[dict[str, Any]] = [LOOKUP, REFUND, {"kind": "final", "answer": "refunded 40 (v2)"}]


@tool
def lookup(order: str) -> dict[str, object]:
    """Look an order up."""
    return {"order": order, "paid": 40}


@tool(effect="write")
def refund(amount: int, ctx: ToolContext) -> dict[str, str]:
    """Refund the customer (the effect key is the service's idempotency key)."""
    REFUNDS.append((amount, ctx.effect_key))
    return {"receipt": f"rf-{len(REFUNDS)}"}


def desk(script: list[dict[str, Any]], steps: int = 10) -> Agent:
    return Agent("refund-desk", ScriptedModel(script), [lookup, refund], Budget(max_steps=steps))


async def main() -> None:
    async with Runtime("memory://") as runtime:
        source = await runtime.run(desk(RECORDED), "refund order A-1", invocation_id="source")
        print(f"source: {source.reason}, refunds {len(REFUNDS)}")
        for writes in ("approve", "deny", "dedupe", "live"):
            forked = await runtime.fork(
                "source",
                at_step=1,
                agent=desk(CHANGED, steps=12),
                writes=writes,
                fork_id=f"fork-{writes}",
                by="ops",
                reason="try the v2 prompt",
            )
            assert forked.outcome is not None
            print(
                f"writes={writes}: {forked.outcome.reason}, changed {forked.changed}, "
                f"refunds {len(REFUNDS)}"
            )
        keys = {key for _, key in REFUNDS}
        print(f"refunds sent: {len(REFUNDS)}, under {len(keys)} different keys")


if __name__ == "__main__":
    trio.run(main)
