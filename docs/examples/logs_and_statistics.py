"""Read what a runtime does: its log records as JSON lines, its statistics while a run goes.

Run it: ``python docs/examples/logs_and_statistics.py``. The library logs nothing
until the application configures logging; this script sends the ``loop_actors``
records of level INFO and above to stdout, one JSON object a line.
"""

import logging
import sys
from functools import partial

import trio

from loop_actors import Agent, JsonLogFormatter, Runtime, ScriptedModel, tool


@tool
def order_status(order_id: str) -> str:
    """Look up where an order is."""
    return f"order {order_id} left the warehouse"


agent = Agent(
    "orders",
    ScriptedModel(
        [
            {
                "kind": "tool_calls",
                "calls": [{"id": "c1", "name": "order_status", "arguments": {"order_id": "7"}}],
            },
            {"kind": "final", "answer": "order 7 is on its way"},
        ],
        delay_s=0.5,  # each answer takes half a second: time to look while it runs
    ),
    [order_status],
)


def log_as_json() -> None:
    """The application's logging: loop-actors' records, INFO and above, as JSON lines."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonLogFormatter())
    logger = logging.getLogger("loop_actors")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


async def main() -> None:
    log_as_json()
    runtime = Runtime()
    async with runtime:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(runtime.run, agent, "where?", invocation_id="order-7"))
            await trio.sleep(0.75)  # the first answer came; the second has not
            during = runtime.statistics()
            print(f"in flight: {during.runs_in_flight}, leases held: {during.leases_held}")
        after = runtime.statistics()
    journal = after.journal
    assert journal is not None
    reasons = ", ".join(f"{reason} {count}" for reason, count in after.stops_by_reason.items())
    print(f"ended: {after.runs_ended} ({reasons})")
    print(
        f"journal: {journal.commits_written} commits, {journal.events_written} events, "
        f"{journal.mean_events_per_transaction:.2f} events per transaction"
    )
    print(f"last error: {after.last_error}")


if __name__ == "__main__":
    trio.run(main)
