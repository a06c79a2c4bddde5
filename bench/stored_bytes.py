"""Bytes stored per invocation on the peer workload, and where every byte goes.

The workload of bench/turn_overhead.py (shared/bench-peers: T=5 turns; turns 1-4 ask
for K=3 parallel calls of an instant read-only ``lookup``; turn 5 answers), N
invocations one after another on a fresh SQLite file. The size is measured as the
peers measure it (shared/bench-peers/common.py ``db_bytes``): the file after
``PRAGMA wal_checkpoint(TRUNCATE)``, over N. Then it accounts for it:

- by table and index (SQLite's ``dbstat``: the pages, the payload in them, the unused
  space);
- the columns of ``stored_events`` summed over its rows, and what SQLite adds per row;
- each row's state: packed (one byte, the 32-byte hash, the body, compressed) or JSON,
  against the JSON state it encodes (what the store wrote before rows were packed);
- by event type;
- the CPU (process time) per event of laying a state out as JSON and of packing it,
  and of unpacking it, over every row, REPS times (the best).

    python bench/stored_bytes.py [--n 200] [--reps 5] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from unittest.mock import patch

import trio
from turn_overhead import AGENT, K, T, db_bytes

from aggregates.audit import is_packed, pack_body, split_stored, stored_state, unpack_state
from loop_actors import Runtime


async def run(path: Path, n: int) -> None:
    async with Runtime(f"sqlite:///{path}") as runtime:
        for i in range(n):
            outcome = await runtime.run(AGENT, f"g-{i:05d}")
            assert outcome.reason == "completed", outcome


def best_cpu_us(work: Callable[[], object], count: int, reps: int) -> float:
    """The best process CPU time of ``work`` over ``reps`` runs, per item, in µs."""
    best = float("inf")
    for _ in range(reps):
        started = time.process_time()
        work()
        best = min(best, time.process_time() - started)
    return best / count * 1e6


@dataclass
class Accounting:
    """Where the bytes of one store go, summed over the store (divide by N)."""

    file: int
    tables: dict[str, tuple[int, int, int, int]]
    """name → (pages, bytes, payload, unused), from ``dbstat``."""
    rows: list[tuple[str, int, str, bytes]]


def measure(path: Path, n: int, *, packed: bool) -> Accounting:
    """Run the workload on a fresh file, rows packed (as the store writes them) or JSON.

    JSON rows are what the store wrote before rows were packed, byte for byte (packing
    is a lossless encoding of them): the script turns packing off for that run.
    """
    with contextlib.ExitStack() as patches:
        if not packed:
            patches.enter_context(
                patch("loop_actors.store.mapper.pack_body", lambda *_, **__: None)
            )
        trio.run(run, path, n)
    size = db_bytes(path)
    connection = sqlite3.connect(path)
    try:
        tables = {
            str(name): (int(pages), int(pgsize), int(payload), int(unused))
            for name, pages, pgsize, payload, unused in connection.execute(
                "SELECT name, count(*), sum(pgsize), sum(payload), sum(unused) FROM dbstat "
                "GROUP BY name ORDER BY sum(pgsize) DESC"
            )
        }
        rows = [
            (str(i), int(v), str(t), bytes(s))
            for i, v, t, s in connection.execute(
                "SELECT originator_id, originator_version, topic, state FROM stored_events"
            )
        ]
    finally:
        connection.close()
    return Accounting(size, tables, rows)


def line(label: str, before: float, after: float) -> str:
    return f"  {label:<56} {before:>9,.0f} {after:>9,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the database files go")
    args = parser.parse_args()
    n: int = args.n

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        json_rows = measure(Path(tmp) / "json.db", n, packed=False)
        packed_rows = measure(Path(tmp) / "packed.db", n, packed=True)
    stores = (json_rows, packed_rows)

    print(
        f"workload: {n} invocations one after another x {T} turns, {K} parallel instant "
        f"reads in turns 1-{T - 1} (the peer workload), one fresh SQLite file each way"
    )
    print(f"  {'per invocation (bytes)':<56} {'JSON rows':>9} {'packed':>9}")
    print(
        line(
            "the file after a WAL checkpoint (as the peers measure)", *(s.file / n for s in stores)
        )
    )
    names = list(dict.fromkeys([*packed_rows.tables, *json_rows.tables]))
    for name in names:
        sizes = [s.tables.get(name, (0, 0, 0, 0)) for s in stores]
        print(line(f"{name}: pages", *(b / n for _, b, _, _ in sizes)))
        if name in ("stored_events", "sqlite_autoindex_stored_events_1"):
            print(line("    of which payload", *(p / n for _, _, p, _ in sizes)))
            print(line("    of which unused", *(u / n for _, _, _, u in sizes)))
            print(
                line(
                    "    of which page and cell headers", *((b - p - u) / n for _, b, p, u in sizes)
                )
            )
    for label, measure_row in (
        ("stored_events.originator_id", lambda r: len(r[0].encode())),
        ("stored_events.topic", lambda r: len(r[2].encode())),
        ("stored_events.state", lambda r: len(r[3])),
    ):
        print(line(label, *(sum(map(measure_row, s.rows)) / n for s in stores)))
    print(
        line(
            "  record headers, versions (in the payload)",
            *(
                (
                    s.tables["stored_events"][2]
                    - sum(len(i.encode()) + len(t.encode()) + len(st) for i, _, t, st in s.rows)
                )
                / n
                for s in stores
            ),
        )
    )
    states = [st for *_, st in packed_rows.rows]
    packed = [st for st in states if is_packed(st)]
    print(f"packed rows: {len(packed):,} of {len(states):,}; their states, per invocation:")
    bodies = sum(len(p) - 33 for p in packed)
    print(
        f"  first byte {len(packed) / n:,.0f}, hash {32 * len(packed) / n:,.0f}, "
        f"body {bodies / n:,.0f}"
    )
    plain = [unpack_state(st) for st in states]
    print(f"  the JSON states they encode: {sum(map(len, plain)) / n:,.0f}")
    print("by event type: rows per invocation, mean state bytes as JSON and packed:")
    counts: Counter[str] = Counter()
    json_by: Counter[str] = Counter()
    packed_by: Counter[str] = Counter()
    for (_, _, topic, state), json_state in zip(packed_rows.rows, plain, strict=True):
        kind = topic.rsplit(":", 1)[-1]
        counts[kind] += 1
        packed_by[kind] += len(state)
        json_by[kind] += len(json_state)
    for kind, count in counts.most_common():
        print(
            f"  {kind:<20} {count / n:>4.0f} {json_by[kind] / count:>7,.0f} "
            f"{packed_by[kind] / count:>7,.0f}"
        )

    parts = [split for split in (split_stored(p) for p in plain) if split is not None]
    again = [pack_body(h, b, deflate=True) for h, b in parts]
    reps = args.reps
    count = max(len(parts), 1)
    as_json = best_cpu_us(lambda: [stored_state(h, b) for h, b in parts], count, reps)
    as_packed = best_cpu_us(lambda: [pack_body(h, b, deflate=True) for h, b in parts], count, reps)
    unpack = best_cpu_us(lambda: [unpack_state(p) for p in again if p is not None], count, reps)
    print(f"CPU per event (process time, best of {reps}, {len(parts):,} events):")
    print(f"  lay out as JSON {as_json:.2f} us; pack {as_packed:.2f} us; unpack {unpack:.2f} us")
    print(
        f"ratio JSON/packed bytes per invocation: {json_rows.file / packed_rows.file:.2f} "
        f"(target: packed <= 5,000: {packed_rows.file / n:,.0f})"
    )


if __name__ == "__main__":
    main()
