"""Submit invocations, then let two workers drive them, each under a lease.

``python ticket_workers.py`` submits 20 jobs to the store (``$LOOP_ACTORS_DB``,
else ``loop-actors.db``), runs two workers in this process until nothing is left
to run, and prints what they did. ``loop-actors worker --agent
ticket_workers:agent`` runs the same agent as a worker process; submit with
``loop-actors submit ticket_workers:agent``.
"""

from typing import Any

import trio

from loop_actors import Agent, ModelRequest, Runtime, ScriptedModel, Worker, tool


@tool
async def fetch_ticket(number: int) -> dict[str, Any]:
    """Fetch one support ticket."""
    await trio.sleep(0.01)  # the ticket service takes its time
    return {"number": number, "status": "closed" if number % 3 == 0 else "open"}


def decide(request: ModelRequest) -> dict[str, Any]:
    number = int(request.goal.rsplit(" ", 1)[1])
    if not request.results:
        call = {"id": "t1", "name": "fetch_ticket", "arguments": {"number": number}}
        return {"kind": "tool_calls", "calls": [call]}
    ticket = request.results[0].output
    assert isinstance(ticket, dict)
    return {"kind": "final", "answer": f"ticket {number} is {ticket['status']}"}


agent = Agent("tickets", ScriptedModel(decide), [fetch_ticket])


async def main() -> None:
    async with Runtime() as runtime:
        for n in range(20):
            # The same id twice records nothing new: submitting again after a crash is safe.
            await runtime.submit(agent, f"Summarise ticket {n}", invocation_id=f"ticket-{n:02d}")
    workers = [Worker(agent, concurrency=4, poll_s=0.05) for _ in range(2)]
    reports = []
    async with trio.open_nursery() as nursery:
        for worker in workers:

            async def work(worker: Worker = worker) -> None:
                reports.append(await worker.run(until_idle=True))

            nursery.start_soon(work)
    print(f"claimed by both workers: {sum(report.claimed for report in reports)}")
    completed = sum(report.outcomes.get("completed", 0) for report in reports)
    print(f"completed: {completed}")
    async with Runtime() as runtime:
        outcome = await runtime.resume("ticket-03", agent)  # ended: nothing runs again
    print(f"ticket-03: {outcome.answer}")


if __name__ == "__main__":
    trio.run(main)
