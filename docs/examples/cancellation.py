"""Two ways to stop a run: Runtime.cancel(id), or cancelling the caller's trio scope."""

import trio

from loop_actors import Agent, ModelRequest, Runtime, ScriptedModel, ToolCall, ToolCalls, tool

waiting = trio.Event()


@tool
async def wait_for_courier() -> str:
    """Wait until the courier answers (here: practically forever)."""
    waiting.set()
    await trio.sleep(3600)
    return "answered"


def always_wait(request: ModelRequest) -> ToolCalls:
    return ToolCalls(calls=[ToolCall(id=f"wait-{request.step}", name="wait_for_courier")])


agent = Agent("courier", ScriptedModel(always_wait), tools=[wait_for_courier], tool_timeout_s=7200)
GOAL = "Wait for the courier."


async def main() -> None:
    async with Runtime() as runtime:
        # 1. Ask the runtime to stop one run: the run itself returns a cancelled outcome.
        async with trio.open_nursery() as nursery:

            async def run_and_print() -> None:
                outcome = await runtime.run(agent, GOAL, invocation_id="by-id")
                print("by-id:", outcome.reason, "-", outcome.detail)

            nursery.start_soon(run_and_print)
            await waiting.wait()  # the tool call is running
            print("running:", list(runtime.running))
            runtime.cancel("by-id")

        # 2. Cancel the caller's scope: the cancellation is recorded, then re-raised.
        with trio.move_on_after(0.2):
            await runtime.run(agent, GOAL, invocation_id="by-scope")
            print("not reached")

        # Starting a stopped id again with the same goal returns its recorded outcome.
        outcome = await runtime.run(agent, GOAL, invocation_id="by-scope")
        print("by-scope:", outcome.reason, "-", outcome.detail)


if __name__ == "__main__":
    trio.run(main)
