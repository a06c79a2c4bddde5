"""Runtime overhead per turn on the SQLite file, as a ratio to a raw sqlite3 loop.

The scripted workload of the peer benchmark (shared/bench-peers): N invocations
run one after another, T=5 turns each; turns 1-4 ask for K=3 parallel calls of
an instant read-only ``lookup``; turn 5 answers. The raw loop does the same two
durable commits per turn (WAL, synchronous=FULL) with plain ``sqlite3``. The two
run interleaved, REPS times, each on a fresh file in the same process, and the
ratio is taken pair by pair.

Then what a call costs when nothing is open around it (``--calls C``, 0 to skip): a
two-step invocation (one ``lookup``, then the answer) on an existing store, C times
each way, the ways taken in turn, call by call: inside one open ``async with
Runtime(url)`` (``await runtime.run``), by one ``Runtime(url)`` object's ``run_sync``
(it keeps its store open between calls), and by ``Runtime(url).run_sync`` on a new
object each time (it opens and closes everything for its one call, as a script that
makes a runtime per call does). It prints each way's median and its difference to
the open runtime's.

    python bench/turn_overhead.py [--n 200] [--reps 5] [--calls 200] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from loop_actors import Agent, Budget, ModelRequest, Runtime, ScriptedModel, tool

T = 5
K = 3


def lookup_value(key: str) -> dict[str, Any]:
    return {"key": key, "value": sum(key.encode()) % 997, "ok": True}


def script_step(goal: str, seen: int) -> tuple[str, Any]:
    turn = seen // K + 1
    if turn < T:
        return "calls", [(f"call_{goal}_t{turn}_{j}", f"{goal}/t{turn}/k{j}") for j in range(K)]
    return "final", f"{goal}: n={seen}"


# --------------------------------------------------------------------------- raw loop


def raw_loop(path: Path, n: int) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS events (inv TEXT NOT NULL, seq INTEGER NOT NULL, "
        "kind TEXT NOT NULL, payload TEXT NOT NULL, PRIMARY KEY (inv, seq))"
    )

    def commit(inv: str, seq: int, kind: str, payload: Any) -> None:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO events VALUES (?,?,?,?)", (inv, seq, kind, json.dumps(payload)))
        conn.execute("COMMIT")

    started = time.perf_counter()
    for i in range(n):
        goal = f"g-{i:05d}"
        results: list[Any] = []
        seq = 0
        while True:
            kind, payload = script_step(goal, len(results))
            if kind == "final":
                commit(goal, seq, "model_final", payload)
                commit(goal, seq + 1, "answer", payload)
                break
            commit(
                goal, seq, "dispatch", [{"id": c, "tool": "lookup", "key": k} for c, k in payload]
            )
            outs = [lookup_value(k) for _, k in payload]
            commit(goal, seq + 1, "results", outs)
            results.extend(outs)
            seq += 2
    elapsed = time.perf_counter() - started
    conn.close()
    return elapsed


# --------------------------------------------------------------------------- loop-actors


@tool
async def lookup(key: str) -> dict[str, Any]:
    """Return a small record at once."""
    return lookup_value(key)


def decide(request: ModelRequest) -> dict[str, Any]:
    kind, payload = script_step(request.goal, len(request.results))
    if kind == "final":
        return {"kind": "final", "answer": payload}
    return {
        "kind": "tool_calls",
        "calls": [{"id": c, "name": "lookup", "arguments": {"key": k}} for c, k in payload],
    }


AGENT = Agent(
    "bench",
    ScriptedModel(decide),
    [lookup],
    Budget(max_steps=T, max_tool_calls=K * (T - 1)),
)


async def ours(path: Path, n: int) -> float:
    async with Runtime(f"sqlite:///{path}") as runtime:
        started = time.perf_counter()
        for i in range(n):
            outcome = await runtime.run(AGENT, f"g-{i:05d}")
            assert outcome.reason == "completed", outcome
        return time.perf_counter() - started


@tool
async def note(key: str) -> dict[str, Any]:
    """Return a small record at once (the two-step run's one call)."""
    return lookup_value(key)


def two_steps(request: ModelRequest) -> dict[str, Any]:
    if not request.results:
        return {
            "kind": "tool_calls",
            "calls": [{"id": "c1", "name": "note", "arguments": {"key": "k"}}],
        }
    return {"kind": "final", "answer": "done"}


TWO_STEP = Agent(
    "two-step", ScriptedModel(two_steps), [note], Budget(max_steps=2, max_tool_calls=1)
)


def per_call(path: Path, calls: int) -> dict[str, list[float]]:
    """Seconds a two-step run takes each way (see the module's docstring), taken in turn."""
    url = f"sqlite:///{path}"
    Runtime(url).run_sync(TWO_STEP, "make the store")
    times: dict[str, list[float]] = {"open": [], "kept": [], "fresh": []}
    kept = Runtime(url)
    opened = Runtime(url)

    async def enter() -> None:
        await opened.__aenter__()

    async def in_open(goal: str) -> float:
        started = time.perf_counter()
        await opened.run(TWO_STEP, goal, invocation_id=goal)
        took = time.perf_counter() - started
        # Untimed: its lease is given back in the background; wait for that here, so
        # that the next way's call does not share the store with it.
        await opened.driver.leases.wait_released(goal)
        return took

    async def leave() -> None:
        await opened.__aexit__(None, None, None)

    # The open runtime keeps its event loop between calls: one trio.run for all of them,
    # driven call by call through a memory channel, so that the three ways interleave.
    async def open_runtime(
        asks: trio.MemoryReceiveChannel[str], answers: trio.MemorySendChannel[float]
    ) -> None:
        await enter()
        try:
            async for goal in asks:
                await answers.send(await in_open(goal))
        finally:
            await leave()

    ask_send, ask_receive = trio.open_memory_channel[str](0)
    answer_send, answer_receive = trio.open_memory_channel[float](0)
    token: list[trio.lowlevel.TrioToken] = []
    ready = __import__("threading").Event()

    def loop() -> None:
        async def main() -> None:
            token.append(trio.lowlevel.current_trio_token())
            ready.set()
            await open_runtime(ask_receive, answer_send)

        trio.run(main)

    thread = __import__("threading").Thread(target=loop)
    thread.start()
    ready.wait()
    try:
        for i in range(calls):
            trio.from_thread.run(ask_send.send, f"open-{i}", trio_token=token[0])
            times["open"].append(trio.from_thread.run(answer_receive.receive, trio_token=token[0]))
            started = time.perf_counter()
            kept.run_sync(TWO_STEP, f"kept-{i}")
            times["kept"].append(time.perf_counter() - started)
            started = time.perf_counter()
            Runtime(url).run_sync(TWO_STEP, f"fresh-{i}")
            times["fresh"].append(time.perf_counter() - started)
    finally:
        trio.from_thread.run(ask_send.aclose, trio_token=token[0])
        thread.join()
        # A build from before issue 32 keeps nothing open (and has no close()): its "kept"
        # way is then a new opening per call too; measured so, for the figure before.
        getattr(kept, "close", lambda: None)()
    return times


def db_bytes(path: Path) -> int:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200, help="two-step calls each way")
    parser.add_argument("--dir", default=None, help="where the database files go")
    args = parser.parse_args()

    raw_s: list[float] = []
    ours_s: list[float] = []
    sizes: list[int] = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        trio.run(ours, Path(tmp) / "warmup.db", 2)
        for rep in range(args.reps):
            order = ["raw", "ours"] if rep % 2 == 0 else ["ours", "raw"]
            for which in order:
                path = Path(tmp) / f"{which}-{rep}.db"
                if which == "raw":
                    raw_s.append(raw_loop(path, args.n))
                else:
                    ours_s.append(trio.run(ours, path, args.n))
                    sizes.append(db_bytes(path))
                for leftover in Path(tmp).glob(path.name + "*"):
                    os.remove(leftover)
    turns = args.n * T
    ratios = [o / r for o, r in zip(ours_s, raw_s, strict=True)]
    print(
        f"workload: {args.n} invocations x {T} turns, {K} parallel instant reads in turns 1-{T - 1}"
    )
    print(f"repetitions: {args.reps} (interleaved, fresh SQLite file each)")
    print(f"raw sqlite3 loop  : {statistics.median(raw_s) / turns * 1e6:8.0f} us/turn (median)")
    print(f"loop-actors       : {statistics.median(ours_s) / turns * 1e6:8.0f} us/turn (median)")
    print(
        f"ratio loop-actors/raw: median {statistics.median(ratios):.2f} "
        f"(pairs {min(ratios):.2f}-{max(ratios):.2f}); target <= 2.00"
    )
    print(f"bytes stored per invocation: {statistics.median(sizes) / args.n:,.0f}")
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    if args.calls:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            times = per_call(Path(tmp) / "calls.db", args.calls)
        base = statistics.median(times["open"]) * 1000
        print(f"a two-step run on an existing store, {args.calls} calls each way, in turn:")
        for name, label in (
            ("open", "inside an open runtime (await run)"),
            ("kept", "run_sync of one Runtime, kept open"),
            ("fresh", "Runtime(url).run_sync, a new one each"),
        ):
            ms = statistics.median(times[name]) * 1000
            print(f"  {label:40}: {ms:6.2f} ms (median), {ms - base:+6.2f} ms")


if __name__ == "__main__":
    main()
