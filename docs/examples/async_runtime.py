"""Three invocations of one agent, run concurrently under trio on one Runtime."""

import trio
from first_agent import agent

from loop_actors import Outcome, Runtime


async def main() -> None:
    outcomes: list[Outcome] = []
    # One store and one Journal for every run inside the block: their commits
    # are grouped into shared transactions.
    async with Runtime() as runtime:

        async def run_one(order_id: str) -> None:
            goal = f"Where is order {order_id}?"
            outcomes.append(await runtime.run(agent, goal, invocation_id=f"ask-{order_id}"))

        async with trio.open_nursery() as nursery:
            for order_id in ["A-1001", "A-1002", "A-9999"]:
                nursery.start_soon(run_one, order_id)

    for outcome in sorted(outcomes, key=lambda o: o.invocation_id):
        print(outcome.invocation_id, outcome.reason, outcome.answer or outcome.detail)


trio.run(main)
