"""Cancel a run from outside: a recorded request that the worker running it honours."""

import trio

from loop_actors import (
    Agent,
    Clarification,
    ModelRequest,
    Runtime,
    ScriptedModel,
    ToolCall,
    ToolCalls,
    tool,
)

started = trio.Event()


@tool(timeout_s=60)
async def export_report(month: str) -> str:
    """Export a month's report (slow)."""
    started.set()
    await trio.sleep(30)
    return f"exported {month}"


def export_all(request: ModelRequest) -> ToolCalls:
    return ToolCalls(
        calls=[
            ToolCall(id=f"e{request.step}", name="export_report", arguments={"month": "2026-01"})
        ]
    )


exporter = Agent("exporter", ScriptedModel(export_all), tools=[export_report])
asker = Agent("asker", ScriptedModel([Clarification(question="Which month?")]))


async def main() -> None:
    worker, operator = Runtime(), Runtime()  # two runtimes on one database, like two processes
    async with worker, trio.open_nursery() as nursery:

        async def run_export() -> None:
            outcome = await worker.run(exporter, "Export January.", invocation_id="export-1")
            print(f"export-1: {outcome.reason} - {outcome.detail}")

        nursery.start_soon(run_export)
        await started.wait()
        asked = trio.current_time()
        result = await operator.request_cancel("export-1", by="ops", reason="wrong month")
        print("request_cancel:", result)
    print("stopped within a second:", trio.current_time() - asked < 1.5)

    # A paused invocation is ended by the request itself; an ended one stays as it was.
    await operator.run(asker, "Export a report.", invocation_id="ask-1")
    print("paused:", await operator.request_cancel("ask-1", by="ops"))
    print("again:", await operator.request_cancel("ask-1", by="ops"))
    invocation = await operator.load("ask-1")
    assert invocation.terminated is not None
    print("ask-1:", invocation.terminated.reason, "-", invocation.terminated.detail)


if __name__ == "__main__":
    trio.run(main)
