"""The floor under the turn: what the durable, audited part costs with no controller at all.

The workload of bench/turn_overhead.py (N invocations one after another, 5 turns,
3 parallel instant reads in turns 1-4), run four ways on fresh SQLite files,
interleaved, REPS times:

- ``raw``: the raw sqlite3 loop of bench/turn_overhead.py (two one-row commits a turn);
- ``floor, Journal thread``: the leanest loop that still writes what loop-actors
  writes: the ``Invocation`` aggregate's events (hash chain included), mapped by
  the store's mapper into eventsourcing's table, committed through the
  ``Journal`` with every commit handed to its thread (``inline=False``). No
  controller, no actors, no validation, no budget or repeated-plan checks, tools
  called inline;
- ``floor, Journal inline``: the same through the ``Journal`` as the runtime opens
  it, which commits on the trio thread while nothing else is runnable (here:
  every commit it can write at once);
- ``floor, on the trio thread``: the same, appending on the trio thread itself
  with no Journal at all (what handing each commit to another thread costs);
- ``loop-actors``: the whole runtime (``Runtime.run``), for reference;

and, separately, the round trip of one commit handed to a thread and answered
through trio (``queue.put`` + ``run_sync_soon``), with and without a one-row
durable commit in the thread, beside the same commit made inline; and the whole
runtime with its Journal's inline commits off and on, alternating invocation by
invocation in one runtime (so that both see the same disk and the same
neighbours; medians of the per-invocation time and process CPU).

    python bench/turn_floor.py [--n 200] [--reps 5] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import queue
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import outcome
import trio
from turn_overhead import AGENT, K, T, lookup_value, ours, raw_loop, script_step

from aggregates.decisions import (
    TerminalReason,
    ToolCalls,
    ToolEffect,
    ToolResult,
    Usage,
    parse_decision,
)
from aggregates.events import DomainEvent
from aggregates.invocation import DispatchedCall, Invocation
from loop_actors import Runtime
from loop_actors._messages import CommitOutcome
from loop_actors.store.journal import Journal
from loop_actors.store.store import EventStore


class Committer(Protocol):
    async def commit(self, events: Sequence[DomainEvent]) -> CommitOutcome | None: ...


class OnTheTrioThread:
    """Appends on the calling (trio) thread: no hand-off, the event loop blocks meanwhile."""

    def __init__(self, store: EventStore) -> None:
        self.store = store

    async def commit(self, events: Sequence[DomainEvent]) -> None:
        self.store.append(events)


def _now() -> datetime:
    return datetime.now(UTC)


async def one_invocation(committer: Committer, goal: str) -> None:
    """The workload's invocation with nothing but the aggregate and the commits."""
    toolbox = AGENT.toolbox
    invocation = Invocation.start(
        invocation_id=goal,
        goal=goal,
        agent_name=AGENT.name,
        agent_version=AGENT.version,
        catalogue_digest=toolbox.catalogue_digest,
        tools=toolbox.specs,
        budget=AGENT.budget,
        at=_now(),
    )
    await committer.commit(invocation.take_events())
    seen = 0
    while True:
        kind, payload = script_step(goal, seen)
        if kind == "final":
            final = parse_decision({"kind": "final", "answer": payload})
            invocation.propose(final, usage=Usage(), at=_now())
            invocation.terminate(TerminalReason.COMPLETED, answer=payload, at=_now())
            await committer.commit(invocation.take_events())
            return
        decision = parse_decision(
            {
                "kind": "tool_calls",
                "calls": [{"id": c, "name": "lookup", "arguments": {"key": k}} for c, k in payload],
            }
        )
        assert isinstance(decision, ToolCalls)
        invocation.propose(decision, usage=Usage(), at=_now())
        calls = [
            DispatchedCall(call_id=c.id, name=c.name, arguments=c.arguments, effect=ToolEffect.READ)
            for c in decision.calls
        ]
        invocation.dispatch(calls, [[c.call_id for c in calls]], at=_now())
        await committer.commit(invocation.take_events())
        results = [
            ToolResult(call_id=c.call_id, name=c.name, output=lookup_value(str(c.arguments["key"])))
            for c in calls
        ]
        invocation.commit_results(results, at=_now())
        await committer.commit(invocation.take_events())
        seen += len(results)


async def floor(path: Path, n: int, through_journal: bool, inline: bool = False) -> float:
    store = await trio.to_thread.run_sync(EventStore, f"sqlite:///{path}")
    try:
        async with Journal(store, inline=inline) as journal:
            committer: Committer = journal if through_journal else OnTheTrioThread(store)
            started = time.perf_counter()
            for i in range(n):
                await one_invocation(committer, f"g-{i:05d}")
            return time.perf_counter() - started
    finally:
        store.close()


async def alternating(path: Path, n: int) -> dict[bool, tuple[list[float], list[float]]]:
    """n invocations in one runtime, inline commits off and on in turn: (wall, CPU) of each."""
    seen: dict[bool, tuple[list[float], list[float]]] = {False: ([], []), True: ([], [])}
    async with Runtime(f"sqlite:///{path}") as runtime:
        await runtime.run(AGENT, "warm-up")
        journal = runtime.driver.journal
        assert journal is not None
        for i in range(2 * n):
            inline = i % 2 == 1
            journal._inline = inline  # what Journal(..., inline=...) sets
            wall, cpu = time.perf_counter(), time.process_time()
            outcome = await runtime.run(AGENT, f"g-{i:05d}")
            assert outcome.reason == "completed", outcome
            seen[inline][0].append(time.perf_counter() - wall)
            seen[inline][1].append(time.process_time() - cpu)
    return seen


# --------------------------------------------------------------------------- hand-off


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, payload TEXT NOT NULL)")
    return conn


async def hand_off(path: Path | None, count: int) -> tuple[float, float]:
    """Median round trip through a thread, and of the same work inline (seconds)."""
    conn = _connect(path) if path is not None else None

    def work(k: int) -> None:
        if conn is not None:
            conn.execute("BEGIN")
            conn.execute("INSERT INTO t VALUES (?, ?)", (k, "x" * 300))
            conn.execute("COMMIT")

    inbox: queue.SimpleQueue[tuple[int, trio.lowlevel.Task] | None] = queue.SimpleQueue()
    token = trio.lowlevel.current_trio_token()

    def worker() -> None:
        while (item := inbox.get()) is not None:
            k, task = item
            work(k)
            token.run_sync_soon(trio.lowlevel.reschedule, task, outcome.Value(None))

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    handed: list[float] = []
    for k in range(count):
        started = time.perf_counter()
        inbox.put((k, trio.lowlevel.current_task()))
        await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
        handed.append(time.perf_counter() - started)
    inbox.put(None)
    thread.join()
    inline: list[float] = []
    for k in range(count, 2 * count):
        started = time.perf_counter()
        work(k)
        inline.append(time.perf_counter() - started)
    if conn is not None:
        conn.close()
    return statistics.median(handed), statistics.median(inline)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the database files go")
    args = parser.parse_args()

    runners: dict[str, Callable[[Path], float]] = {
        "raw": lambda p: raw_loop(p, args.n),
        "journal": lambda p: trio.run(floor, p, args.n, True),
        "journal-inline": lambda p: trio.run(floor, p, args.n, True, True),
        "inline": lambda p: trio.run(floor, p, args.n, False),
        "runtime": lambda p: trio.run(ours, p, args.n),
    }
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for name in ("journal", "journal-inline", "inline", "runtime"):  # warm-up
            runners[name](Path(tmp) / f"warmup-{name}.db")
        names = list(runners)
        for rep in range(args.reps):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                path = Path(tmp) / f"{name}-{rep}.db"
                seconds[name].append(runners[name](path))
                for leftover in Path(tmp).glob(path.name + "*"):
                    os.remove(leftover)
        count = max(50, min(2000, args.n * 10))
        bare = trio.run(hand_off, None, count)
        durable = trio.run(hand_off, Path(tmp) / "hand-off.db", count)
        paired = trio.run(alternating, Path(tmp) / "alternating.db", args.n)

    turns = args.n * T

    def per_turn(name: str) -> str:
        return f"{statistics.median(seconds[name]) / turns * 1e6:8.0f} us/turn"

    def ratio(name: str) -> str:
        pairs = [s / r for s, r in zip(seconds[name], seconds["raw"], strict=True)]
        spread = f"{min(pairs):.2f}-{max(pairs):.2f}"
        return f"x raw: median {statistics.median(pairs):.2f} (pairs {spread})"

    print(
        f"workload: {args.n} invocations x {T} turns, {K} parallel instant reads in turns 1-{T - 1}"
    )
    print(f"repetitions: {args.reps} (interleaved, fresh SQLite file each)")
    print(f"raw sqlite3 loop            : {per_turn('raw')}")
    print(f"floor, Journal thread       : {per_turn('journal')}  {ratio('journal')}")
    print(f"floor, Journal inline       : {per_turn('journal-inline')}  {ratio('journal-inline')}")
    print(f"floor, on the trio thread   : {per_turn('inline')}  {ratio('inline')}")
    print(f"loop-actors (Runtime.run)   : {per_turn('runtime')}  {ratio('runtime')}")
    print(f"hand-off round trip, no work: {bare[0] * 1e6:8.0f} us (median of {count})")
    print(
        f"one-row durable commit      : {durable[1] * 1e6:8.0f} us inline, "
        f"{durable[0] * 1e6:.0f} us handed to a thread"
    )
    # The raw loop makes two such commits a turn inline; a runtime that hands both to a
    # thread and does nothing else costs the raw loop plus twice the difference.
    raw_turn = statistics.median(seconds["raw"]) / turns
    only_hand_offs = (raw_turn + 2 * (durable[0] - durable[1])) / raw_turn
    print(f"raw loop + 2 hand-offs a turn: {only_hand_offs:.2f} x raw (nothing else done)")
    wall = {mode: statistics.median(paired[mode][0]) / T * 1e6 for mode in paired}
    cpu = {mode: statistics.median(paired[mode][1]) / T * 1e6 for mode in paired}
    print(
        f"loop-actors, alternating    : thread {wall[False]:.0f}, inline {wall[True]:.0f} us/turn"
        f" (inline/thread {wall[True] / wall[False]:.2f}); process CPU thread "
        f"{cpu[False]:.0f}, inline {cpu[True]:.0f} us/turn ({args.n} invocations each)"
    )


if __name__ == "__main__":
    main()
