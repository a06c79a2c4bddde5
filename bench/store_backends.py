"""The same turns on a SQLite file and on PostgreSQL: time per turn, and group commit under load.

The workload of bench/turn_overhead.py: T=5 turns per invocation, turns 1-4 ask
for K=3 parallel instant reads, turn 5 answers. Two figures per store:

- sequential: N invocations one after another (every commit waits alone);
- concurrent: C invocations at once on one Runtime (the Journal puts the commits
  that arrive together into one transaction): turns per second, and commits and
  rows per transaction.

Each repetition uses a fresh SQLite file and a fresh PostgreSQL database (created
through the admin URL, dropped afterwards); the stores alternate.

    python bench/store_backends.py [--pg ADMIN_URL] [--n 100] [--concurrent 50] [--reps 3]

``--pg`` defaults to $LOOP_ACTORS_TEST_PG (``bash .ci/pg.sh url``); without either,
only SQLite runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from turn_overhead import AGENT, T

import loop_actors.store.journal as journal_module
from loop_actors import Runtime


@contextmanager
def counting_transactions() -> Iterator[list[tuple[int, int]]]:
    """(commits, rows) of every transaction the Journal writes while inside."""
    seen: list[tuple[int, int]] = []
    original = journal_module.commit_group

    def counting(store: Any, group: list[journal_module.Commit], **options: Any) -> list[Any]:
        results = original(store, group, **options)  # counted once written
        seen.append((len(group), sum(len(commit.events) for commit in group)))
        return results

    journal_module.commit_group = counting
    try:
        yield seen
    finally:
        journal_module.commit_group = original


async def sequential(url: str, n: int) -> float:
    async with Runtime(url) as runtime:
        started = time.perf_counter()
        for i in range(n):
            outcome = await runtime.run(AGENT, f"g-{i:05d}")
            assert outcome.reason == "completed", outcome
        return time.perf_counter() - started


def raw_postgres(url: str, n: int) -> float:
    """The floor on PostgreSQL: the same two durable commits per turn with plain psycopg."""
    import json

    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(
            "CREATE TABLE raw_events (inv TEXT NOT NULL, seq INTEGER NOT NULL, "
            "payload BYTEA NOT NULL, id BIGSERIAL, PRIMARY KEY (inv, seq))"
        )
        started = time.perf_counter()
        for i in range(n):
            for seq in range(2 * T):
                with connection.transaction():
                    connection.execute(
                        "INSERT INTO raw_events VALUES (%s, %s, %s) RETURNING id",
                        (
                            f"g-{i:05d}",
                            seq,
                            json.dumps({"turn": seq // 2, "k": [1, 2, 3]}).encode(),
                        ),
                    )
        return time.perf_counter() - started


async def concurrent(url: str, c: int) -> float:
    async with Runtime(url) as runtime:
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(c):
                nursery.start_soon(runtime.run, AGENT, f"c-{i:05d}")
        return time.perf_counter() - started


@contextmanager
def fresh_store(kind: str, folder: Path, admin: str | None) -> Iterator[str]:
    if kind == "sqlite":
        path = folder / f"{uuid.uuid4().hex}.db"
        yield f"sqlite:///{path}"
        for leftover in folder.glob(path.name + "*"):
            leftover.unlink()
        return
    import psycopg

    assert admin is not None
    name = f"la_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    try:
        yield admin.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", default=os.environ.get("LOOP_ACTORS_TEST_PG"))
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--concurrent", type=int, default=50)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the SQLite files go")
    args = parser.parse_args()
    kinds = ["sqlite", "postgresql"] if args.pg else ["sqlite"]
    seq: dict[str, list[float]] = {kind: [] for kind in kinds}
    con: dict[str, list[float]] = {kind: [] for kind in kinds}
    groups: dict[str, list[tuple[int, int]]] = {kind: [] for kind in kinds}
    raw: list[float] = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp)
        for kind in kinds:  # warm up both
            with fresh_store(kind, folder, args.pg) as url:
                trio.run(sequential, url, 2)
        for rep in range(args.reps):
            for kind in kinds if rep % 2 == 0 else reversed(kinds):
                with fresh_store(kind, folder, args.pg) as url:
                    seq[kind].append(trio.run(sequential, url, args.n))
                if kind == "postgresql":
                    with fresh_store(kind, folder, args.pg) as url:
                        raw.append(raw_postgres(url, args.n))
                with fresh_store(kind, folder, args.pg) as url, counting_transactions() as seen:
                    con[kind].append(trio.run(concurrent, url, args.concurrent))
                    groups[kind].extend(seen)
    print(
        f"workload: {T} turns per invocation, 3 parallel instant reads in turns 1-{T - 1}; "
        f"{args.reps} repetition(s), fresh store each"
    )
    if not args.pg:
        print("postgresql: not run (no --pg and no $LOOP_ACTORS_TEST_PG)")
    for kind in kinds:
        per_turn = statistics.median(seq[kind]) / (args.n * T) * 1e6
        turns_per_s = args.concurrent * T / statistics.median(con[kind])
        commits = statistics.mean(g for g, _ in groups[kind])
        rows = statistics.mean(r for _, r in groups[kind])
        print(
            f"{kind:<10} sequential {args.n} invocations: {per_turn:7.0f} us/turn (median); "
            f"concurrent {args.concurrent}: {turns_per_s:7.0f} turns/s, "
            f"{len(groups[kind]) / args.reps:.0f} transactions a run, "
            f"{commits:.1f} commits and {rows:.1f} rows per transaction"
        )
    if args.pg:
        floor = statistics.median(raw) / (args.n * T) * 1e6
        print(f"raw psycopg loop (two durable commits a turn): {floor:7.0f} us/turn (median)")
        ratio = statistics.median(seq["postgresql"]) / statistics.median(seq["sqlite"])
        print(f"ratio postgresql/sqlite, sequential: {ratio:.2f}")
        ratio = statistics.median(seq["postgresql"]) / statistics.median(raw)
        print(f"ratio loop-actors/raw on postgresql, sequential: {ratio:.2f}")


if __name__ == "__main__":
    main()
