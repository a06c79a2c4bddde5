"""A batch of jobs run many at once on one Runtime, safe to run again after a crash.

Each job has its own invocation id. Running the batch again resumes every job
the store already knows (a finished one just returns its outcome) and starts
the others, so no job is started twice and none is lost.
"""

from typing import Any

import trio

from loop_actors import (
    Agent,
    Budget,
    InvocationNotFoundError,
    ModelRequest,
    Outcome,
    Runtime,
    ScriptedModel,
    tool,
)

JOBS = {f"job-{n:03d}": f"Summarise ticket {n}" for n in range(50)}
IN_FLIGHT = 10  # at most this many invocations at once


@tool
async def fetch_ticket(number: int) -> dict[str, Any]:
    """Fetch one support ticket."""
    return {"number": number, "status": "closed" if number % 3 == 0 else "open"}


def decide(request: ModelRequest) -> dict[str, Any]:
    number = int(request.goal.rsplit(" ", 1)[1])
    if not request.results:
        call = {"id": "t1", "name": "fetch_ticket", "arguments": {"number": number}}
        return {"kind": "tool_calls", "calls": [call]}
    ticket = request.results[0].output
    assert isinstance(ticket, dict)
    return {"kind": "final", "answer": f"ticket {number} is {ticket['status']}"}


# A model that takes 20 ms per decision, like a (very fast) hosted one.
agent = Agent(
    "ticket-summariser", ScriptedModel(decide, delay_s=0.02), [fetch_ticket], Budget(max_steps=4)
)


async def run_job(runtime: Runtime, job_id: str, goal: str) -> tuple[Outcome, bool]:
    """The job's outcome, and whether it was started by this run."""
    try:
        return await runtime.resume(job_id, agent), False
    except InvocationNotFoundError:
        return await runtime.run(agent, goal, invocation_id=job_id), True


async def main() -> None:
    limiter = trio.CapacityLimiter(IN_FLIGHT)
    outcomes: dict[str, Outcome] = {}
    started = 0
    most_in_flight = 0

    # One Runtime for the whole batch: one store and one Journal, so the commits of
    # the jobs in flight share transactions (group commit).
    async with Runtime() as runtime:

        async def one_job(job_id: str, goal: str) -> None:
            nonlocal started, most_in_flight
            async with limiter:
                most_in_flight = max(most_in_flight, limiter.borrowed_tokens)
                outcome, new = await run_job(runtime, job_id, goal)
            outcomes[job_id] = outcome
            started += new

        async with trio.open_nursery() as nursery:
            for job_id, goal in JOBS.items():
                nursery.start_soon(one_job, job_id, goal)

    reasons = sorted({outcome.reason for outcome in outcomes.values()})
    print(f"jobs: {len(outcomes)}, at most {most_in_flight} in flight")
    print(f"started by this run: {started}, found in the store: {len(outcomes) - started}")
    print(f"reasons: {', '.join(reasons)}")
    print(f"job-003: {outcomes['job-003'].answer}")


trio.run(main)
