"""The cost of a shared rate limit's quota check per model call, on SQLite and PostgreSQL.

Two figures per store, with a limit so generous that no call waits (the check's own
cost, not a wait):

- ``take_quota``: one check (``WorkQueue.take_quota``: one transaction on the limit's
  row) on the queue's connection, N times in a row;
- per model call: N runs one after another of an agent whose instant model goes through
  ``call_with_retries`` under the limit, against the same runs without a limit (the
  difference is the check, through the runtime's one queue thread, plus the usage's
  correction when a token limit is set).

Each repetition uses a fresh SQLite file and a fresh PostgreSQL database (created
through the admin URL, dropped afterwards).

    python bench/quota_check.py [--pg ADMIN_URL] [--n 300] [--runs 100] [--reps 3]

``--pg`` defaults to $LOOP_ACTORS_TEST_PG (``bash .ci/pg.sh url``); without either,
only SQLite runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import trio

from aggregates.decisions import Usage
from aggregates.rate_limits import RateLimit
from loop_actors import Agent, ModelReply, ModelRequest, RetryPolicy, Runtime
from loop_actors.agent.adapters import call_with_retries
from loop_actors.store.store import EventStore

LIMIT = RateLimit(provider="bench", model="m", requests_per_minute=10**9, tokens_per_minute=10**12)


class InstantModel:
    """Answers at once, through ``call_with_retries`` with the bench limit's quota."""

    provider, model = LIMIT.key

    async def decide(self, request: ModelRequest) -> ModelReply:
        async def send() -> dict[str, Any]:
            return {"kind": "final", "answer": "ok"}

        reply, attempts = await call_with_retries(
            send, RetryPolicy(), quota=LIMIT.key, tokens=100, used_tokens=lambda _: 120
        )
        return ModelReply(proposal=reply, usage=Usage(input_tokens=100, attempts=attempts))


AGENT = Agent("bench-quota", InstantModel(), [])


@contextmanager
def fresh_store(kind: str, pg: str | None) -> Iterator[str]:
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            yield f"sqlite:///{Path(folder) / 'bench.db'}"
        return
    import psycopg

    assert pg is not None
    name = f"la_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(pg)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(pg, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def checks_alone(url: str, n: int) -> float:
    """Seconds per ``take_quota``."""
    store = EventStore(url)
    queue = store.open_queue()
    try:
        queue.take_quota(LIMIT, tokens=100)  # the row exists from here on
        started = time.perf_counter()
        for _ in range(n):
            queue.take_quota(LIMIT, tokens=100)
        return (time.perf_counter() - started) / n
    finally:
        queue.close()
        store.close()


def runs(url: str, count: int, *, limited: bool) -> float:
    """Seconds per run (one model call each), one run after another."""

    async def main() -> float:
        async with Runtime(url, rate_limits=[LIMIT] if limited else []) as runtime:
            await runtime.run(AGENT, "warm up")
            started = time.perf_counter()
            for _ in range(count):
                await runtime.run(AGENT, "go")
            return (time.perf_counter() - started) / count

    return trio.run(main)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", default=os.environ.get("LOOP_ACTORS_TEST_PG"))
    parser.add_argument("--n", type=int, default=300, help="quota checks in a row")
    parser.add_argument("--runs", type=int, default=100, help="runs with and without")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    kinds = ["sqlite", *(["postgresql"] if args.pg else [])]
    print(f"{args.n} checks, {args.runs} runs of one model call, median of {args.reps}")
    for kind in kinds:
        alone, without, with_limit = [], [], []
        for _ in range(args.reps):
            with fresh_store(kind, args.pg) as url:
                alone.append(checks_alone(url, args.n))
            with fresh_store(kind, args.pg) as url:
                without.append(runs(url, args.runs, limited=False))
            with fresh_store(kind, args.pg) as url:
                with_limit.append(runs(url, args.runs, limited=True))
        check = statistics.median(alone) * 1e6
        plain = statistics.median(without) * 1e3
        limited = statistics.median(with_limit) * 1e3
        print(
            f"{kind:<10} take_quota {check:8.0f} us   run without a limit {plain:6.2f} ms   "
            f"with {limited:6.2f} ms   per model call +{(limited - plain) * 1e3:6.0f} us"
        )


if __name__ == "__main__":
    main()
