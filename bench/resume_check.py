"""Resume's cut-history check against the size of the store: the index keeps it flat.

Before resuming, the runtime compares an invocation's dispatched batches with the
effect ledger's entries for it (``EventStore.effects_of``). Builds one invocation of
W writes, paused before its end (it waits for a clarification), then grows the store
with M other invocations of one write each, and times, for each M: the check with
the index of ``EffectPrepared`` rows by invocation (``effects_of``, what resume does),
and the same answer read from every ``EffectPrepared`` since the invocation started
(``effects_of_by_scan``, what resume did before the index), REPS times each.

    python bench/resume_check.py [--writes 50] [--others 0,500,2000] [--reps 5] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import trio

from aggregates.ledger_check import cut_history_problem
from loop_actors import (
    Agent,
    Budget,
    ModelRequest,
    Reconciled,
    Runtime,
    ScriptedModel,
    ToolContext,
    tool,
)
from loop_actors.store.store import EventStore


@tool(effect="write", reconcile=lambda key: Reconciled(status="not_found"))
async def pay(amount: int, context: ToolContext) -> dict[str, Any]:
    """A write with an effect key."""
    return {"receipt": f"r-{context.effect_key}", "amount": amount}


def agent(writes: int) -> Agent:
    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step <= writes:
            call = {"id": f"c{request.step}", "name": "pay", "arguments": {"amount": request.step}}
            return {"kind": "tool_calls", "calls": [call]}
        return {"kind": "clarification", "question": "and now?"}

    budget = Budget(max_steps=writes + 1, max_tool_calls=writes)
    return Agent(f"payer-{writes}", ScriptedModel(decide), [pay], budget=budget)


async def grow(url: str, writes: int, first: int, count: int) -> None:
    async with Runtime(url) as runtime, trio.open_nursery() as nursery:
        if first == 0:
            await runtime.run(agent(writes), "pay", invocation_id="long")
        limit = trio.CapacityLimiter(50)

        async def one(n: int) -> None:
            async with limit:
                await runtime.run(agent(1), "pay", invocation_id=f"other-{n}")

        for n in range(first, first + count):
            nursery.start_soon(partial(one, n))


def timed(work: Any, reps: int) -> float:
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=50)
    parser.add_argument("--others", default="0,500,2000")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the database file goes")
    args = parser.parse_args()
    sizes = sorted(int(n) for n in args.others.split(","))

    print(f"one invocation of {args.writes} writes, paused; then M invocations of one write")
    print(f"{'M':>6} {'rows':>8} {'indexed ms':>11} {'scan ms':>9} {'scan/indexed':>13}")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        url = f"sqlite:///{Path(tmp) / 'events.db'}"
        built = 0
        trio.run(grow, url, args.writes, 0, 0)
        for others in sizes:
            trio.run(grow, url, args.writes, built, others - built)
            built = others
            store = EventStore(url)
            try:
                events = store.events("long")
                indexed = store.effects_of("long")
                scanned = store.effects_of_by_scan("long")
                assert [e.key for e in indexed] == [e.key for e in scanned]
                assert len(indexed) == args.writes
                assert cut_history_problem("long", events, indexed) is None
                index_ms = timed(partial(store.effects_of, "long"), args.reps)
                scan_ms = timed(partial(store.effects_of_by_scan, "long"), args.reps)
                rows = store.head()
            finally:
                store.close()
            print(
                f"{others:>6} {rows:>8,} {index_ms:>11.2f} {scan_ms:>9.2f} "
                f"{scan_ms / index_ms:>12.1f}x"
            )


if __name__ == "__main__":
    main()
