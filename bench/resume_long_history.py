"""How long it takes to load an invocation with a long history, with and without snapshots.

Builds one invocation of N turns (3 events a turn) on a SQLite file through the
runtime, then times, in one run: loading it the way ``resume`` does (from the
newest snapshot), and replaying every event from the start.

    python bench/resume_long_history.py [--turns 1000] [--reps 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from aggregates.events import fold
from loop_actors import Agent, Budget, ModelRequest, Runtime, ScriptedModel, tool
from loop_actors._store import EventStore


@tool
async def step(n: int) -> int:
    """Count one step."""
    return n


def build(path: Path, turns: int) -> int:
    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step <= turns:
            return {
                "kind": "tool_calls",
                "calls": [{"id": "c", "name": "step", "arguments": {"n": request.step}}],
            }
        return {"kind": "final", "answer": "done"}

    agent = Agent(
        "long", ScriptedModel(decide), [step], Budget(max_steps=turns + 1, max_tool_calls=turns)
    )

    async def go() -> int:
        async with Runtime(f"sqlite:///{path}") as runtime:
            await runtime.run(agent, "count", invocation_id="long")
            return len(await runtime.history("long"))

    return trio.run(go)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "long.db"
        started = time.perf_counter()
        events = build(path, args.turns)
        built_s = time.perf_counter() - started
        store = EventStore(f"sqlite:///{path}")
        with_snapshot: list[float] = []
        full_replay: list[float] = []
        for _ in range(args.reps):
            started = time.perf_counter()
            invocation = store.get("long")
            with_snapshot.append(time.perf_counter() - started)
            started = time.perf_counter()
            replayed = fold(None, store.events("long"))
            full_replay.append(time.perf_counter() - started)
            assert vars(replayed) == vars(invocation)
        store.close()
    snap_ms = statistics.median(with_snapshot) * 1000
    full_ms = statistics.median(full_replay) * 1000
    print(f"history: {events} events ({args.turns} turns), built in {built_s:.1f} s")
    print(f"load from newest snapshot : {snap_ms:8.2f} ms (median of {args.reps})")
    print(f"replay every event        : {full_ms:8.2f} ms (median of {args.reps})")
    print(f"ratio replay/snapshot     : {full_ms / snap_ms:8.1f}")


if __name__ == "__main__":
    main()
