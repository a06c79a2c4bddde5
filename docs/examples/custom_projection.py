"""Read models: the built-in ones, followed live by a runtime, and one of your own.

A shop clerk agent answers three stock questions. The runtime keeps the built-in
read models (trajectory, metrics, open effects) up to date as it commits; then a
read model of our own, calls per tool, is built by a ReadModelRunner over the same
events, kept up to date incrementally, rebuilt, and reset by a version bump.

Everything happens in a new temporary folder, so every run starts afresh.
"""

import os
import tempfile
from pathlib import Path
from typing import Any

import trio

from aggregates.events import DomainEvent
from aggregates.invocation import BatchDispatched, ResultsCommitted
from loop_actors import (
    Agent,
    EventStore,
    ModelRequest,
    Reconciled,
    Runtime,
    ScriptedModel,
    ToolContext,
    ToolError,
    tool,
)
from projections import (
    ReadModel,
    ReadModelRunner,
    ViewCursor,
    list_invocations,
    list_open_effects,
    load_trajectory,
    metrics,
)

DB = "sqlite:///shop.db"  # its read models go to shop.views.db, next to it
STOCK = {"apple": 3, "pear": 0}
VISITS = Path("visits.log")  # the visit log: a service of its own, one line per effect key


@tool
def stock(item: str) -> int:
    """How many of an item are in stock."""
    if item not in STOCK:
        raise ToolError(f"no item named {item!r}")
    return STOCK[item]


def find_visit(effect_key: str) -> Reconciled:
    """Ask the visit log what became of a key (after a crash, nothing is guessed)."""
    lines = VISITS.read_text().splitlines() if VISITS.exists() else []
    for line in lines:
        key, item = line.split(" ", 1)
        if key == effect_key:
            return Reconciled(status="committed", receipt=f"noted {item}")
    return Reconciled(status="not_found")


@tool(effect="write", commutes=True, reconcile=find_visit)
def note_visit(item: str, context: ToolContext) -> str:
    """Note that a customer asked about an item (it changes nothing a read looks at)."""
    assert context.effect_key is not None  # the idempotency key: the same after a crash
    if find_visit(context.effect_key).status == "not_found":
        with VISITS.open("a") as log:
            log.write(f"{context.effect_key} {item}\n")
    return f"noted {item}"


def clerk(request: ModelRequest) -> dict[str, Any]:
    item = request.goal.split()[-1]
    if request.step == 1:  # a read and a commuting write: they run together
        return {
            "kind": "tool_calls",
            "calls": [
                {"id": "s1", "name": "stock", "arguments": {"item": item}},
                {"id": "n1", "name": "note_visit", "arguments": {"item": item}},
            ],
        }
    counted = request.results[0]
    told = counted.output if counted.error is None else counted.error.message
    return {"kind": "final", "answer": f"{item}: {told}"}


shop = Agent("clerk", ScriptedModel(clerk), tools=[stock, note_visit])


class ToolCallCounts(ReadModel):
    """A read model of our own: calls per tool, and how many of them failed."""

    name = "tool_calls"
    version = 1

    def create(self) -> list[str]:
        return [
            "CREATE TABLE IF NOT EXISTS tool_call_counts ("
            "tool TEXT PRIMARY KEY, calls INTEGER NOT NULL, failed INTEGER NOT NULL)"
        ]

    def tables(self) -> list[str]:
        return ["tool_call_counts"]

    def apply(self, cursor: ViewCursor, event: DomainEvent, position: int) -> None:
        # Called once per event, in order, inside the batch's transaction. Only the
        # event decides what changes: a rebuild from position 0 gives the same rows.
        if isinstance(event, BatchDispatched):
            for call in event.calls:
                cursor.execute(
                    "INSERT INTO tool_call_counts VALUES (?, 1, 0) ON CONFLICT (tool) "
                    "DO UPDATE SET calls = tool_call_counts.calls + 1",  # qualified: portable
                    (call.name,),
                )
        elif isinstance(event, ResultsCommitted):
            for result in event.results:
                if result.error is not None:
                    cursor.execute(
                        "UPDATE tool_call_counts SET failed = failed + 1 WHERE tool = ?",
                        (result.name,),
                    )


def counts(runner: ReadModelRunner) -> list[str]:
    rows = runner.query("SELECT tool, calls, failed FROM tool_call_counts ORDER BY tool")
    return [f"{row['tool']}: {row['calls']} calls, {row['failed']} failed" for row in rows]


async def run_and_query() -> None:
    async with Runtime(DB, follow_projections=True) as runtime:
        for item in ("apple", "pear", "kiwi"):
            await runtime.run(shop, f"Stock of {item}", invocation_id=f"ask-{item}")
        (batch,) = [e for e in await runtime.history("ask-apple") if isinstance(e, BatchDispatched)]
        print("plan of ask-apple:", batch.plan)  # one group: the write commutes with the read
        views = runtime.projections
        assert views is not None  # set while the runtime is open with follow_projections
        # The follower catches up after each commit; to read your own writes at once,
        # catch up yourself (in a thread: it is blocking SQLite work).
        await trio.to_thread.run_sync(views.catch_up)

        for row in list_invocations(views, reason="completed"):
            print(f"{row['invocation_id']}: {row['status']}, {row['tool_calls']} tool calls")
        for group in metrics(views, by="agent"):
            print(
                f"metrics {group.group}: invocations={group.invocations} "
                f"tool_calls={group.tool_calls} failed={group.failed_calls} "
                f"effects={group.effects}"
            )
        trajectory = load_trajectory(views, "ask-kiwi")
        assert trajectory is not None
        for call in trajectory.steps[0].calls:
            print(
                f"ask-kiwi {call.call_id} {call.name}: {call.status}, effect {call.effect_status}"
            )
        print(f"open effects: {len(list_open_effects(views))}")


def count_tool_calls() -> None:
    store = EventStore(DB)
    runner = ReadModelRunner(store.app, "tool_calls.db", [ToolCallCounts()])
    try:
        (report,) = runner.catch_up()  # from position 0: the three runs so far
        print(f"{report.name}: applied {report.events} events, now at {report.position}")
        print(*counts(runner), sep="\n")

        Runtime(DB).run_sync(shop, "Stock of apple", invocation_id="ask-apple-again")
        (status,) = runner.status()
        print(f"behind by {status.lag} events")
        (report,) = runner.catch_up()  # only the new events
        print(f"{report.name}: applied {report.events} events, now at {report.position}")
        incremental = counts(runner)

        runner.rebuild()  # drop the table and replay every event from position 0
        print("rebuilt equals incremental:", counts(runner) == incremental)
    finally:
        runner.close()

    class ToolCallCountsV2(ToolCallCounts):
        version = 2  # the tables changed shape: the runner starts it again from 0

    runner = ReadModelRunner(store.app, "tool_calls.db", [ToolCallCountsV2()])
    try:
        print("version 2 starts at", runner.position("tool_calls"))
        (report,) = runner.catch_up()
        print(f"{report.name}: applied {report.events} events, now at {report.position}")
    finally:
        runner.close()
        store.close()


start = Path.cwd()
with tempfile.TemporaryDirectory() as folder:
    os.chdir(folder)
    try:
        trio.run(run_and_query)
        count_tool_calls()
        print("files:", *sorted(path.name for path in Path().iterdir()))
    finally:
        os.chdir(start)
