"""Many invocations at once in one process: throughput and the effect of group commit.

The workload of bench/turn_overhead.py (T=5 turns; turns 1-4 ask for K=3
parallel calls of an instant read-only ``lookup``; turn 5 answers), but every
model decision takes DELAY seconds of simulated latency (``ScriptedModel(...,
delay_s=DELAY)``, a ``trio.sleep``), and N invocations run at the same time in
one trio nursery inside one ``async with Runtime(url)``, on one SQLite file.

Commits are counted by wrapping ``loop_actors._journal.commit_group`` from this
script (the wrapper only counts; the library is not changed): each call is one
transaction, and the commits it carries are the commit requests of the
controllers (10 per invocation: start, dispatch + results in turns 1-4, final).

    python bench/concurrency.py [--n 2000] [--delay 1.0] [--dir /tmp]
    python bench/concurrency.py --quick          # --n 200 --delay 0.2
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path

import trio
from turn_overhead import K, T, db_bytes, decide, lookup

import loop_actors._journal as journal_module
from loop_actors import Agent, Budget, Runtime, ScriptedModel
from loop_actors._messages import Commit, CommitOutcome
from loop_actors._store import EventStore

COMMITS_PER_INVOCATION = 1 + 2 * (T - 1) + 1


class CommitCounter:
    """Counts the Journal's transactions and the commit requests they carry."""

    def __init__(self) -> None:
        self.transactions = 0
        self.requests = 0
        self.largest = 0
        self._original = journal_module.commit_group

    def install(self) -> None:
        def counting(store: EventStore, group: list[Commit]) -> list[CommitOutcome]:
            self.transactions += 1
            self.requests += len(group)
            self.largest = max(self.largest, len(group))
            return self._original(store, group)

        journal_module.commit_group = counting

    def reset(self) -> None:
        self.transactions = self.requests = self.largest = 0


def make_agent(delay_s: float) -> Agent:
    return Agent(
        "bench-concurrency",
        ScriptedModel(decide, delay_s=delay_s),
        [lookup],
        Budget(max_steps=T, max_tool_calls=K * (T - 1)),
    )


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def warm_up(path: Path) -> None:
    async with Runtime(f"sqlite:///{path}") as runtime:
        for i in range(2):
            outcome = await runtime.run(make_agent(0.0), f"warm-{i:05d}")
            assert outcome.reason == "completed", outcome


async def run_all(
    path: Path, n: int, delay_s: float, counter: CommitCounter
) -> tuple[float, list[float], list[str]]:
    """Run n invocations at once; return the wall time, each one's latency and the failures."""
    agent = make_agent(delay_s)
    latencies: list[float] = []
    failures: list[str] = []

    async with Runtime(f"sqlite:///{path}") as runtime:

        async def one(goal: str) -> None:
            started = time.perf_counter()
            outcome = await runtime.run(agent, goal)
            latencies.append(time.perf_counter() - started)
            expected = f"{goal}: n={K * (T - 1)}"
            if outcome.reason != "completed" or outcome.answer != expected:
                failures.append(f"{goal}: {outcome.reason} {outcome.answer!r}")

        counter.reset()
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(one, f"g-{i:05d}")
        wall = time.perf_counter() - started
    return wall, latencies, failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=None, help="invocations at once (2000)")
    parser.add_argument("--delay", type=float, default=None, help="model latency, s (1.0)")
    parser.add_argument("--quick", action="store_true", help="--n 200 --delay 0.2 unless given")
    parser.add_argument("--dir", default=None, help="where the database file goes")
    args = parser.parse_args()
    n: int = args.n if args.n is not None else (200 if args.quick else 2000)
    delay: float = args.delay if args.delay is not None else (0.2 if args.quick else 1.0)

    counter = CommitCounter()
    counter.install()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        trio.run(warm_up, Path(tmp) / "warmup.db")
        rss_before = rss_mb()
        path = Path(tmp) / "concurrency.db"
        wall, latencies, failures = trio.run(run_all, path, n, delay, counter)
        size = db_bytes(path)

    floor = T * delay
    turns = n * T
    expected_requests = n * COMMITS_PER_INVOCATION
    latencies.sort()
    print(
        f"workload: {n} invocations at once x {T} turns, {K} parallel instant reads in "
        f"turns 1-{T - 1}, model latency {delay:g} s per decision (floor {floor:g} s)"
    )
    print(f"wall time: {wall:.2f} s ({wall - floor:+.2f} s over the floor)")
    print(
        f"latency per invocation: median {statistics.median(latencies):.2f} s, "
        f"max {latencies[-1]:.2f} s"
    )
    print(f"turns per second: {turns / wall:,.0f}")
    print(
        f"commit requests: {counter.requests:,} ({expected_requests:,} expected), "
        f"{counter.requests / wall:,.0f} per second"
    )
    print(
        f"durable transactions: {counter.transactions:,}, {counter.transactions / wall:,.0f} "
        f"per second"
    )
    print(
        f"group size: average {counter.requests / max(counter.transactions, 1):.1f} commits "
        f"per transaction, largest {counter.largest} (cap {journal_module.MAX_GROUP})"
    )
    print(f"bytes stored per invocation: {size / n:,.0f}")
    print(f"peak RSS: {rss_mb():.0f} MB ({rss_before:.0f} MB after warm-up)")
    ok = n - len(failures)
    print(f"outcomes: {ok}/{n} completed with the right answer")
    if failures or len(latencies) != n or counter.requests != expected_requests:
        for line in failures[:10]:
            print(f"  {line}")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
