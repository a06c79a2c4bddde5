"""Put an agent on schedules, and let a worker in this process run them for a few seconds.

``python schedule_an_agent.py`` adds two schedules to the store (``$LOOP_ACTORS_DB``,
else ``loop-actors.db``): ``tick``, every 2 seconds, and ``weekday-report``, weekdays
at 9:00 in Paris, which it pauses; runs a worker for five seconds, pauses ``tick``, and
checks what was submitted. ``loop-actors worker --agent schedule_an_agent:agent`` runs
the same agent in a worker process; ``loop-actors schedule add`` adds schedules from the
command line.
"""

from datetime import datetime
from zoneinfo import ZoneInfo

import trio

from loop_actors import Agent, ModelRequest, Runtime, ScriptedModel, TerminalReason, Worker


def report(request: ModelRequest) -> dict[str, str]:
    return {"kind": "final", "answer": f"done: {request.goal}"}


agent = Agent("reporter", ScriptedModel(report))


async def main() -> None:
    async with Runtime() as runtime:
        tick = await runtime.add_schedule(
            "tick", agent, "count the new tickets", every="2s", overlap="allow", catch_up="all"
        )
        weekly = await runtime.add_schedule(
            "weekday-report", agent, "write the report", cron="0 9 * * 1-5", tz="Europe/Paris"
        )
        await runtime.pause_schedule("weekday-report")
    first_due = tick.next_due
    print(f"added {tick.name}: every {tick.timing.text}, overlap {tick.overlap}, {tick.state}")
    at = datetime.fromtimestamp(weekly.next_due, ZoneInfo("Europe/Paris"))
    print(f"added {weekly.name}: {weekly.timing.text}, next at {at:%H:%M} in Paris, paused")

    worker = Worker(agent, poll_s=0.05)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(5)
        async with Runtime() as runtime:
            await runtime.pause_schedule("tick")  # no due time is run after this
        worker.stop()  # its runs stop at their next commit

    async with Runtime() as runtime:
        tick = next(s for s in await runtime.schedules() if s.name == "tick")
        # Each due time from the first to the next has one run, named by it: tick@<UTC time>.
        ids = [tick.invocation_id(due) for due in range(first_due, tick.next_due, 2)]
        # An ended run returns its outcome; one the worker had no time to drive runs now.
        outcomes = [await runtime.resume(run, agent) for run in ids]
    print(f"one run a due time: {len(ids) == tick.runs >= 2}")
    print(f"the worker submitted each: {worker.statistics().schedules.submitted == len(ids)}")
    print(f"all completed: {all(o.reason is TerminalReason.COMPLETED for o in outcomes)}")


if __name__ == "__main__":
    trio.run(main)
