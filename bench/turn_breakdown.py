"""Where the time of a sequential turn goes: the trio thread's CPU, the commits, the scheduler.

The workload of bench/turn_overhead.py (N invocations one after another, 5 turns,
3 parallel instant reads in turns 1-4), run three ways in one process:

- on ``memory://``: no disk, so the wall time is the trio thread's work plus the
  hand-offs to the Journal's thread; prints the trio thread's CPU per turn
  (``time.thread_time``), and the scheduler passes and task steps per turn
  (counted with a trio instrument);
- on a SQLite file: the same (and the process's CPU, every thread), plus the
  median time of one Journal transaction (``loop_actors.store.journal.commit_group``
  timed from this script; the wrapper only times) and the share of the
  transactions written on the trio thread (the Journal commits there while
  nothing else is runnable);
- a raw ``sqlite3`` commit of one row into a table of the same shape (WAL,
  ``synchronous=FULL``), for comparison with one Journal transaction.

With ``--checkpoints`` each runtime also writes checkpoints of its store to a
directory of its own (after each invocation, as ``--checkpoint-dir`` does).

    python bench/turn_breakdown.py [--n 200] [--reps 5] [--dir /tmp] [--checkpoints]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import trio
from turn_overhead import AGENT, T

import loop_actors.store.journal as journal_module
from loop_actors import Runtime
from loop_actors._messages import CommitOutcome


class SchedulerCounter(trio.abc.Instrument):
    """Counts scheduler passes (one I/O wait each) and task steps."""

    def __init__(self) -> None:
        self.passes = 0
        self.steps = 0

    def before_io_wait(self, timeout: float) -> None:
        self.passes += 1

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1


class TransactionTimer:
    """Times each Journal transaction (wraps ``commit_group``; the library is not changed)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.inline = 0
        """Transactions written on the trio thread (the main thread, here)."""
        self._original = journal_module.commit_group

    def __enter__(self) -> TransactionTimer:
        def timed(
            store: journal_module.Appender, group: list[journal_module.Commit], **options: Any
        ) -> list[CommitOutcome]:
            started = time.perf_counter()
            results = self._original(store, group, **options)  # timed once written
            self.seconds.append(time.perf_counter() - started)
            if threading.current_thread() is threading.main_thread():
                self.inline += 1
            return results

        journal_module.commit_group = timed
        return self

    def __exit__(self, *exc_info: object) -> None:
        journal_module.commit_group = self._original


async def run_sequence(
    url: str, n: int, counter: SchedulerCounter | None, checkpoints: Path | None = None
) -> tuple[float, float, float]:
    """Run n invocations one after another; return (wall, trio-thread CPU, process CPU) in s.

    With ``checkpoints``, the runtime writes its checkpoints there (after each run).
    """
    async with Runtime(url, checkpoint_dir=checkpoints) as runtime:
        await runtime.run(AGENT, "warm-up")
        if counter is not None:
            trio.lowlevel.add_instrument(counter)
        wall, cpu, process = time.perf_counter(), time.thread_time(), time.process_time()
        for i in range(n):
            outcome = await runtime.run(AGENT, f"g-{i:05d}")
            assert outcome.reason == "completed", outcome
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        process = time.process_time() - process
        if counter is not None:
            trio.lowlevel.remove_instrument(counter)
        return wall, cpu, process


def raw_commit_us(path: Path, n: int, payload_bytes: int) -> float:
    """Median µs of one BEGIN; INSERT; COMMIT of one row (WAL, synchronous=FULL)."""
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=FULL")
    connection.execute(
        "CREATE TABLE stored_events (originator_id TEXT, originator_version INTEGER, "
        "topic TEXT, state BLOB, PRIMARY KEY (originator_id, originator_version))"
    )
    payload = b"x" * payload_bytes
    times: list[float] = []
    for i in range(n):
        started = time.perf_counter()
        connection.execute("BEGIN")
        connection.execute(
            "INSERT INTO stored_events VALUES (?,?,?,?)",
            (f"inv-{i // 10:05d}", i % 10, "aggregates.invocation:ResultsCommitted", payload),
        )
        connection.execute("COMMIT")
        times.append(time.perf_counter() - started)
    connection.close()
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the database files go")
    parser.add_argument(
        "--checkpoints",
        action="store_true",
        help="let the runtime write checkpoints (a fresh directory for each store)",
    )
    args = parser.parse_args()
    turns = args.n * T

    rows: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        rows.setdefault(name, []).append(value)

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for rep in range(args.reps):
            counter = SchedulerCounter()
            folder = Path(tmp) / f"memory-{rep}.checkpoints" if args.checkpoints else None
            wall, cpu, _ = trio.run(run_sequence, "memory://", args.n, counter, folder)
            add("memory://  wall per turn (us)", wall / turns * 1e6)
            add("memory://  trio-thread CPU per turn (us)", cpu / turns * 1e6)
            add("memory://  scheduler passes per turn", counter.passes / turns)
            add("memory://  task steps per turn", counter.steps / turns)
            path = Path(tmp) / f"file-{rep}.db"
            counter = SchedulerCounter()
            with TransactionTimer() as timer:
                folder = path.with_suffix(".checkpoints") if args.checkpoints else None
                wall, cpu, process = trio.run(
                    run_sequence, f"sqlite:///{path}", args.n, counter, folder
                )
            add("sqlite file wall per turn (us)", wall / turns * 1e6)
            add("sqlite file trio-thread CPU per turn (us)", cpu / turns * 1e6)
            add("sqlite file process CPU per turn (us)", process / turns * 1e6)
            add("sqlite file scheduler passes per turn", counter.passes / turns)
            add("sqlite file task steps per turn", counter.steps / turns)
            add(
                "sqlite file Journal transaction, median (us)",
                statistics.median(timer.seconds) * 1e6,
            )
            add(
                "sqlite file transactions written inline (%)",
                100 * timer.inline / max(1, len(timer.seconds)),
            )
            add(
                "raw sqlite3 commit of one row, median (us)",
                raw_commit_us(Path(tmp) / f"raw-{rep}.db", 2 * turns, 500),
            )

    print(f"workload: {args.n} invocations x {T} turns, one after another; {args.reps} repetitions")
    width = max(len(name) for name in rows)
    for name, values in rows.items():
        low, high = min(values), max(values)
        print(f"{name:<{width}} : median {statistics.median(values):8.1f}  [{low:.1f}-{high:.1f}]")


if __name__ == "__main__":
    main()
