"""How long it takes to load an invocation with a long history, with and without snapshots.

Builds one invocation of N turns (3 events a turn) on a SQLite file through the
runtime, then times, in one run: loading it the way ``resume`` does (from the
newest snapshot), replaying every event from the start, the check ``resume``
makes before it runs anything for an invocation that has not ended
(``StoreReader.history_problem`` given the loaded invocation: from a snapshot the
store vouches for, its tail and its effect ledger; issue 32), the load and the check
together, as resume reads them (``StoreReader.invocation_to_resume``, whose snapshot
the check then does not read again), and the whole check that every resume made before
issue 32 and that a resume still makes when the store cannot vouch for the snapshot
(its snapshot against the replay of every event, and its effect ledger against every
batch: ``history_problem_of``).

Each load and each replay starts from the same heap: the objects of the repetition
before are dropped and the collector run first, untimed, so that a step does not pay
for collecting what an earlier one left. (Until issue 17's fifth session the previous
repetition's replayed aggregate was still alive, and its garbage not yet collected,
when the next load was timed: under the interpreter's default thresholds the load then
paid for collecting what that repetition left: docs/performance.md, section 5.)

    python bench/resume_long_history.py [--turns 1000] [--reps 20] [--check-reps 5]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio

from aggregates.events import fold
from loop_actors import Agent, Budget, ModelRequest, Runtime, ScriptedModel, tool
from loop_actors.store.reader import StoreReader, history_problem_of
from loop_actors.store.store import EventStore


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


@contextlib.contextmanager
def timed(into: list[tuple[float, float]]) -> Iterator[None]:
    """Append (wall s, process CPU s) of the block to ``into``."""
    wall, cpu = time.perf_counter(), time.process_time()
    yield
    into.append((time.perf_counter() - wall, time.process_time() - cpu))


def medians(times: list[tuple[float, float]]) -> tuple[float, float]:
    """Median wall and CPU time, in ms."""
    return (
        statistics.median(wall for wall, _ in times) * 1000,
        statistics.median(cpu for _, cpu in times) * 1000,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--check-reps", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "long.db"
        started = time.perf_counter()
        events = build(path, args.turns)
        built_s = time.perf_counter() - started
        store = EventStore(f"sqlite:///{path}")
        with_snapshot: list[tuple[float, float]] = []
        full_replay: list[tuple[float, float]] = []
        for _ in range(args.reps):
            gc.collect()
            with timed(with_snapshot):
                invocation = store.get("long")
            gc.collect()
            with timed(full_replay):
                replayed = fold(None, store.events("long"))
            assert vars(replayed) == vars(invocation)
            del invocation, replayed
        checks: list[tuple[float, float]] = []
        loads_and_checks: list[tuple[float, float]] = []
        whole_checks: list[tuple[float, float]] = []
        reader = StoreReader(store)
        loaded = store.get("long")

        async def load_and_check() -> str | None:
            invocation = await reader.invocation_to_resume("long")
            return await reader.history_problem("long", invocation)

        def whole_check() -> str | None:
            return history_problem_of(
                "long",
                store.events("long"),
                store.newest_snapshot("long"),
                lambda: store.effects_of("long"),
            )

        for _ in range(args.check_reps):
            gc.collect()
            with timed(checks):
                problem = trio.run(reader.history_problem, "long", loaded)
            assert problem is None, problem
            gc.collect()
            with timed(loads_and_checks):
                problem = trio.run(load_and_check)
            assert problem is None, problem
            gc.collect()
            with timed(whole_checks):
                problem = whole_check()
            assert problem is None, problem
        store.close()
    snap_ms, snap_cpu = medians(with_snapshot)
    full_ms, full_cpu = medians(full_replay)
    check_ms, check_cpu = medians(checks)
    both_ms, both_cpu = medians(loads_and_checks)
    whole_ms, whole_cpu = medians(whole_checks)
    print(f"history: {events} events ({args.turns} turns), built in {built_s:.1f} s")
    for name, (wall, cpu), reps in (
        ("load from newest snapshot", (snap_ms, snap_cpu), args.reps),
        ("replay every event", (full_ms, full_cpu), args.reps),
    ):
        print(f"{name:26}: {wall:8.2f} ms, CPU {cpu:8.2f} ms (median of {reps})")
    print(
        f"ratio replay/snapshot     : {full_ms / snap_ms:8.1f}      CPU {full_cpu / snap_cpu:8.1f}"
    )
    for name, (wall, cpu) in (
        ("resume's history check", (check_ms, check_cpu)),
        ("resume's load + check", (both_ms, both_cpu)),
        ("whole check (replay)", (whole_ms, whole_cpu)),
    ):
        print(f"{name:26}: {wall:8.2f} ms, CPU {cpu:8.2f} ms (median of {args.check_reps})")
    ratio, cpu_ratio = whole_ms / check_ms, whole_cpu / check_cpu
    print(f"ratio whole/vouched check : {ratio:8.1f}      CPU {cpu_ratio:8.1f}")


if __name__ == "__main__":
    main()
